"""The progress bar of a run: pages done of the pages this run has to do, with an ETA.

The total counts the pages this run writes: a resumed document's committed pages are
in neither side (done nor total), so a rerun that has 45 pages left reads n/45.

The total is exact once it is known. A background pass over the plan or the listing
(names only) counts the documents to do; a single-image file (PNG, JPEG) is one page.
The same pass then counts the pages of every PDF and TIFF on local disk, ahead of the
readers, in a process of its own (`python -m batchocr.progress`): a hostile file
(a hang, a crash: why rendering is in worker processes) costs that process, killed
after COUNT_TIMEOUT_S, never the run's, and MuPDF is never called from two threads of
one process. A document's own render has the last word on its pages (as it opens).
Documents on a blob store are counted as they open (reading each blob twice to count
it would double the run's traffic). Until every document is counted, each one not yet
counted is taken at the mean pages of those counted so far, and the bar says "about":
the pages known are exact, so the estimate is off by no more than the documents
still uncounted are. The total never falls below the pages done.

The rate is pages a second, always, over the last WINDOW_S seconds up to now (where no
page came in that window, the last page's over the time since the one before it): a
scan that keeps the run waiting lowers it while it waits, and the ETA (the pages still
to do at that rate) grows within seconds. The closing line's rate is the run's mean.

tqdm draws the bar (its width, a part's line of its own on a terminal); Progress says
what it holds and when it is drawn: the first line once a page is done or an interval
has passed (never "0page ... ?page/s"), then once an interval, by a ticker thread when
no page comes (pages come in batches: a VLM's batch can take a minute). A terminal is
redrawn twice a second; a log (a pod's stderr is a pipe) gets a whole line, ended by a
newline, every 30 s: tqdm's redraw in place with a carriage return makes a whole run one
line of a log (tqdm/tqdm#750). A run with nothing to do draws nothing.
"""

from __future__ import annotations

import collections
import json
import os
import posixpath
import select
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterable, TextIO

from tqdm import tqdm

TERMINAL_INTERVAL_S = 0.5
LOG_INTERVAL_S = 30.0
WINDOW_S = 10.0  # the rate's window: long enough for a few pages, short enough to see a slow one
COUNT_TIMEOUT_S = 10.0  # a page count that takes longer is a hostile file's: that document is left to its render
ONE_PAGE = (".png", ".jpg", ".jpeg")  # one image, one row; a TIFF may hold many pages
KNOWN = "{l_bar}{bar}| {n_fmt}/{total_fmt} {right}"
ESTIMATED = "{l_bar}{bar}| {n_fmt}/about {total_fmt} {right}"
UNKNOWN = "{desc}: {n_fmt}/? {right}"


def listed_pages(uri: str) -> int | None:
    """The pages of a document known from its name alone."""
    return 1 if posixpath.splitext(uri)[1].lower() in ONE_PAGE else None


def _columns(file: TextIO) -> int:
    """The width of the terminal `file` is, 0 if it is none."""
    try:
        return os.get_terminal_size(file.fileno()).columns if file.isatty() else 0
    except (AttributeError, OSError, ValueError):  # no fileno (a StringIO), or not a terminal after all
        return 80 if file.isatty() else 0


def rate_text(rate: float) -> str:
    """Pages a second in three figures (0.0523, 1.27, 42.5), whatever the rate: one unit."""
    return f"{rate:.0f} page/s" if rate >= 100 else f"{rate:.3g} page/s"


class Bar(tqdm):
    """tqdm drawing what Progress says: `fields()` gives the elapsed time and the text right
    of the count, given the total. tqdm's own lock holds a multiprocessing RLock, a named semaphore that a
    process ending in os._exit (the console script, a part of `processes` N) never unlinks:
    every run with a bar in its parts ended in resource_tracker's warning of leaked semaphores.
    A bar is drawn by its own process; a thread lock is all it needs (tqdm.set_lock, here on
    this class alone). No monitor thread: Progress decides when to draw."""

    monitor_interval = 0

    def __init__(self, *args, fields: Callable[[int | None], dict], **kwargs):
        self.fields = fields
        super().__init__(*args, **kwargs)

    @property
    def format_dict(self):
        shown = super().format_dict
        return shown | self.fields(shown["total"])


Bar.set_lock(threading.RLock())


class LogLines(Bar):
    """A bar for a log: each display its own newline-terminated line, never a carriage return."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, leave=False, **kwargs)  # the closing line is close()'s own, below

    def display(self, msg=None, pos=None):
        msg = self.__str__() if msg is None else msg
        if msg:  # tqdm clears a bar by displaying "": a log keeps what it was told
            self.fp.write(msg + "\n")
            self.fp.flush()
        return bool(msg)

    def close(self):
        if not self.disable and hasattr(self, "last_print_t"):
            with self._lock:
                self.display()
        super().close()


class Rate:
    """Pages a second over the last `window` seconds up to now (not to the last page: the
    rate falls while no page comes); where no page came in that window, the last page's
    pages over the time since the page before it; a run younger than the window, its pages
    over its time."""

    def __init__(self, window: float, start: float):
        self.window = window
        self.samples: collections.deque[tuple[float, int]] = collections.deque([(start, 0)])

    def add(self, t: float, n: int) -> None:
        self.samples.append((t, n))
        self(t)  # drops what the window no longer needs

    def __call__(self, now: float) -> float | None:
        s, n, cutoff = self.samples, self.samples[-1][1], now - self.window
        while len(s) > 2 and s[1][0] <= cutoff:  # s[0]: the pages done at the cutoff
            s.popleft()
        t0, n0 = s[0]
        if n <= n0 or now <= t0:
            return None
        if t0 <= cutoff < s[-1][0]:
            return (n - n0) / self.window
        return (n - n0) / (now - t0)


@dataclass
class _Doc:
    committed: int = 0  # pages committed by earlier runs
    pages: int | None = None  # the rows the whole document gives, once known
    image: bool = False  # one page by its name
    opened: bool = False  # its render said its pages


@dataclass
class _Sums:
    """Sums over the documents whose pages are known, kept as they become known: the pages
    to do, and (documents that are not single images) their whole pages, the mean's basis."""
    docs: int = 0
    todo: int = 0
    basis_docs: int = 0
    basis_pages: int = 0

    def add(self, d: _Doc, sign: int) -> None:
        self.docs += sign
        self.todo += sign * max(d.pages - d.committed, 1)  # a document to do gives a row at least
        if not d.image:
            self.basis_docs += sign
            self.basis_pages += sign * d.pages


class Progress:
    def __init__(self, desc: str, enabled: bool, file: TextIO | None = None, interval: float | None = None,
                 position: int | None = None, clock: Callable[[], float] = time.monotonic):
        self.desc = desc
        self.position = position  # a terminal line of its own (a shard's parts, one process each)
        self.enabled = enabled
        self.file = file or sys.stderr
        self.terminal = _columns(self.file) > 0  # a terminal of no width (a pty never sized) shows no bar: a log then
        self.interval = interval or (TERMINAL_INTERVAL_S if self.terminal else LOG_INTERVAL_S)
        self.clock = clock
        self.bar: Bar | None = None  # drawn once there is something to say
        self._ticker: threading.Thread | None = None
        self.documents_total: int | None = None  # documents this run will work on, once counted
        self.documents_started = 0
        self.n = 0  # pages (rows) done
        self._docs: dict[str, _Doc] = {}
        self._known = _Sums()
        self._unknown_committed = 0  # pages committed of the documents whose pages are not known
        self._start: float | None = None
        self._drawn = 0.0  # when the bar was last drawn (clock)
        self._rate: Rate | None = None
        self._final = False
        self._lock = threading.RLock()
        self._closed = threading.Event()

    def count_documents(self, documents: Iterable, committed: Callable[[object], int | None]) -> threading.Thread | None:
        """Count, in a daemon thread, the documents of `documents` to do (committed(doc) is
        None for a document that is done, else how many of its pages are), then the pages of
        those on local disk whose names do not tell them."""
        if not self.enabled:
            return None

        def count() -> None:
            ahead, total = [], 0
            try:
                for doc in documents:
                    skip = committed(doc)
                    if skip is None:
                        continue
                    total += 1
                    if self._register(doc, skip).pages is None and _local(doc):
                        ahead.append(doc)
            except Exception:  # noqa: BLE001 - progress only: the run's own listing reports faults
                return
            with self._lock:
                self.documents_total = total
                self._update()
            self._count_pages(ahead)

        thread = threading.Thread(target=count, name="batchocr-progress-count", daemon=True)
        thread.start()
        return thread

    def _register(self, doc, committed: int) -> _Doc:
        with self._lock:
            d = self._docs.get(doc.doc_id)
            if d is None:
                d = self._docs[doc.doc_id] = _Doc(committed, image=listed_pages(doc.uri) is not None)
                if d.image:
                    self._set(d, 1)
                else:
                    self._unknown_committed += committed
            return d

    def _set(self, d: _Doc, pages: int) -> None:
        """A document's rows are `pages` (under the lock)."""
        if d.pages is None:
            self._unknown_committed -= 0 if d.image else d.committed
        else:
            self._known.add(d, -1)
        d.pages = pages
        self._known.add(d, +1)

    def _count_pages(self, docs: list) -> None:
        """Page counts of local documents from a counting process, one document at a time, in
        listing order: ahead of the render workers. Stops with the run or the process."""
        counter = Counter()
        try:
            for doc in docs:
                if self._closed.is_set():
                    return
                with self._lock:
                    if self._docs[doc.doc_id].opened:
                        continue
                pages = counter.count(doc)
                if pages is None:
                    continue
                with self._lock:
                    d = self._docs[doc.doc_id]
                    if not d.opened:
                        self._set(d, pages)
                        self._update()
        finally:
            counter.close()

    def started(self, doc, committed: int = 0) -> None:
        """A document is started; `committed` of its pages are done already."""
        if not self.enabled:
            return
        with self._lock:
            self._register(doc, committed)
            self.documents_started += 1
            if self._start is None:
                self._start = self._drawn = self.clock()
                self._rate = Rate(WINDOW_S, self._start)
                self._ticker = threading.Thread(target=self._tick, name="batchocr-progress", daemon=True)
                self._ticker.start()
            self._update()

    def opened(self, doc_id: str, page_count: int | None) -> None:
        """A started document's first pages came: it has page_count pages (None: it
        did not open, and gives one row)."""
        with self._lock:
            d = self._docs.get(doc_id)
            if d is None or d.opened:
                return
            d.opened = True
            self._set(d, page_count or 1)
            self._update()

    def done(self, rows: int) -> None:
        """`rows` more pages are written; the bar is drawn if it never was or an interval has passed."""
        if not self.enabled or not rows:
            return
        with self._lock:
            now = self.clock()
            if self._rate is None:  # pages of no started document: a caller's own use
                self._start = self._drawn = now
                self._rate = Rate(WINDOW_S, now)
            self.n += rows
            self._rate.add(now, self.n)
            if self.bar is None or now - self._drawn >= self.interval:
                self._draw(now)

    def estimated_pages(self) -> tuple[int, bool] | None:
        """(pages this run has to do, exact?), or None before the documents are counted and
        the pages of one that is not a single image are known."""
        with self._lock:
            if self.documents_total is None:
                return None
            known = self._known
            left = self.documents_total - known.docs
            if left <= 0:
                return known.todo, True
            if not known.basis_docs:
                return None
            # Pages a document, not pages a byte: a scan's page is 50 times a born-digital
            # one's bytes (the demo's estimate read 48 for 10 pages by bytes, 11 by documents).
            guess = round(left * known.basis_pages / known.basis_docs) - self._unknown_committed
            return known.todo + max(guess, left), False

    def line(self) -> str:
        """The bar as it is drawn now ('' before it is)."""
        with self._lock:
            if self.bar is None:
                return ""
            self._update()
            return str(self.bar)

    def _fields(self, total: int | None) -> dict:
        """What the bar shows besides its count (of `total`): elapsed time, ETA, rate, documents."""
        now = self.clock()
        elapsed = now - (self._start if self._start is not None else now)
        rate = (self.n / elapsed if elapsed else None) if self._final else (self._rate and self._rate(now))
        docs = f"docs {self.documents_started}" + (f"/{self.documents_total}" if self.documents_total is not None else "")
        if rate:
            eta = tqdm.format_interval((total - self.n) / rate) if total is not None else "?"
            right = f"[{tqdm.format_interval(elapsed)}<{eta}, {rate_text(rate)}, {docs}]"
        else:
            right = f"[{tqdm.format_interval(elapsed)}, {docs}]"
        return {"elapsed": elapsed, "right": right}

    def _shape(self) -> tuple[int | None, str]:
        """The bar's total and format."""
        estimate = self.estimated_pages()
        if estimate is None:
            return None, UNKNOWN
        total, exact = estimate
        return max(total, self.n), KNOWN if exact else ESTIMATED

    def _draw(self, now: float) -> None:
        """Draw the bar (under the lock), the first time by making it."""
        total, shape = self._shape()
        if self.bar is None:
            make = Bar if self.terminal else LogLines
            where = {"position": self.position} if self.terminal and self.position is not None else {}
            self.bar = make(total=total, initial=self.n, bar_format=shape, unit="page", file=self.file,
                            dynamic_ncols=self.terminal, desc=self.desc, fields=self._fields, **where)
        else:
            self._update()
            self.bar.refresh()
        self._drawn = now

    def _tick(self) -> None:
        """Draw the bar once an interval when no page has (pages come in batches)."""
        while not self._closed.wait(max(self._drawn + self.interval - self.clock(), 0.02)):
            with self._lock:  # not while close() draws the closing line
                now = self.clock()
                if not self._closed.is_set() and now - self._drawn >= self.interval:
                    self._draw(now)

    def _update(self) -> None:
        """The bar's count, total and format as they are now (under the lock); drawn later."""
        if self.bar is not None:
            self.bar.total, self.bar.bar_format = self._shape()
            self.bar.n = self.n

    def close(self) -> None:
        with self._lock:
            self._closed.set()
        if self._ticker is not None:
            self._ticker.join()  # woken by _closed: nothing is drawn after the closing line
        with self._lock:
            self._final = True
            if self.bar is not None:
                self._update()
                self.bar.close()


def _local(doc) -> bool:
    """A document read from local disk (its pages are counted ahead)."""
    return (getattr(doc, "location", None) or doc.uri).startswith("file://")


class Counter:
    """A page-counting process (`python -m batchocr.progress`): a document's URI and size on
    a line in, its rows (the page count; 1 where it gives one error row) or -1 on a line out."""

    def __init__(self):
        self.proc: subprocess.Popen | None = None

    def count(self, doc) -> int | None:
        """The document's rows, or None (it could not be counted in time: the process is
        replaced for the next one)."""
        try:
            if self.proc is None:
                self.proc = subprocess.Popen([sys.executable, "-m", "batchocr.progress", str(os.getpid())],
                                             stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                             stderr=subprocess.DEVNULL, text=True)
            self.proc.stdin.write(json.dumps([doc.uri, doc.size]) + "\n")
            self.proc.stdin.flush()
            ready, _, _ = select.select([self.proc.stdout], [], [], COUNT_TIMEOUT_S)
            answer = self.proc.stdout.readline() if ready else ""
            pages = int(answer)
        except (OSError, ValueError):  # no answer in time, or the process died on this document
            self.close()
            return None
        return pages if pages > 0 else None

    def close(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


def main() -> None:
    """The counting process: opens each document as a render worker does (batchocr.render) and
    answers its rows. Killed with the run (die_with_parent)."""
    from batchocr.renderworker import die_with_parent, own_process

    own_process()
    die_with_parent(int(sys.argv[1]))
    from batchocr.render import open_document
    from batchocr.sources import DocRef

    answers = os.fdopen(os.dup(1), "w")  # PyMuPDF's messages go to stdout: the answers keep a pipe of their own
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
    for line in sys.stdin:
        uri, size = json.loads(line)
        try:
            pdoc, _ = open_document(DocRef(uri=uri, size=size, etag=""), {})
            with pdoc:
                rows = 1 if pdoc.needs_pass else max(pdoc.page_count, 1)
        except Exception:  # noqa: BLE001 - the render gives it its error row: one
            rows = 1
        print(rows, file=answers, flush=True)


if __name__ == "__main__":
    main()

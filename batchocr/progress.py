"""The progress bar of a run: pages done of the shard's total, with an ETA.

The total is known where it can be. A second, background pass over the plan or
the listing (names only: a folder listing, or one page of blob names, at
a time) counts the documents to do; a single-image file (PNG, JPEG) is one page.
A PDF's or TIFF's page count is read when a render worker opens it: opening every
document a second time in the run's own process to count its pages would take a
hostile file (a hang, a crash: why rendering is in worker processes) out of the
render pool's care, and read each blob twice. Until every document has opened, the
pages still to come are estimated from the mean pages per document of those opened
so far, and the bar says "about". The total never falls below the pages done.

tqdm draws the bar, but redraws only inside update(), and pages come in batches
(a VLM's batch can take a minute): so a ticker thread refreshes it on time, twice
a second on a terminal. A log (a pod's stderr is a pipe) gets a whole line, ended
by a newline, every 30 s: tqdm's own redraw in place with a carriage return makes a
whole run one line of a log (tqdm/tqdm#750). No bar is drawn until there is a page
to do: a run with nothing to do draws none.
"""

from __future__ import annotations

import os
import posixpath
import sys
import threading
from dataclasses import dataclass
from typing import Callable, Iterable, TextIO

from tqdm import tqdm

TERMINAL_INTERVAL_S = 0.5
LOG_INTERVAL_S = 30.0
ONE_PAGE = (".png", ".jpg", ".jpeg")  # one image, one row; a TIFF may hold many pages
ESTIMATED = "{l_bar}{bar}| {n_fmt}/about {total_fmt} [{elapsed}<{remaining}, {rate_fmt}{postfix}]"


def listed_pages(uri: str) -> int | None:
    """The pages of a document known from its name alone."""
    return 1 if posixpath.splitext(uri)[1].lower() in ONE_PAGE else None


def _columns(file: TextIO) -> int:
    """The width of the terminal `file` is, 0 if it is none."""
    try:
        return os.get_terminal_size(file.fileno()).columns if file.isatty() else 0
    except (AttributeError, OSError, ValueError):  # no fileno (a StringIO), or not a terminal after all
        return 80 if file.isatty() else 0


class Bar(tqdm):
    """tqdm with a thread lock. tqdm's own lock holds a multiprocessing RLock, a named semaphore
    that a process ending in os._exit (the console script, a part of `processes` N) never
    unlinks: every run with a bar in its parts ended in resource_tracker's warning of leaked
    semaphores. A bar is drawn by its own process; a thread lock is all it needs (tqdm.set_lock,
    here on this class alone: tqdm's own stays as it was for anyone else in the process)."""


Bar.set_lock(threading.RLock())


class LogLines(Bar):
    """tqdm for a log: each display its own newline-terminated line, never a carriage return."""

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
                self._ema_dt = lambda: None  # the closing line's rate: the run's mean, as tqdm's own
                self.display()
        super().close()


@dataclass
class _Counts:
    """Sums over documents: how many, their pages (to do, and committed)."""
    docs: int = 0
    pages: int = 0  # to do
    committed: int = 0  # pages of these documents committed by earlier runs

    def add(self, pages: int = 0, committed: int = 0) -> None:
        self.docs += 1
        self.pages += pages
        self.committed += committed


class Progress:
    def __init__(self, desc: str, enabled: bool, file: TextIO | None = None, interval: float | None = None,
                 position: int | None = None):
        self.desc = desc
        self.position = position  # a terminal line of its own (a shard's parts, one process each)
        self.enabled = enabled
        self.file = file or sys.stderr
        self.terminal = _columns(self.file) > 0  # a terminal of no width (a pty never sized) shows no bar: a log then
        self.interval = interval or (TERMINAL_INTERVAL_S if self.terminal else LOG_INTERVAL_S)
        self.bar: tqdm | None = None  # drawn once there is a page to do
        self._ticker: threading.Thread | None = None
        self.documents_total: int | None = None  # documents this run will work on, once counted
        self.documents_started = 0
        self._listed_pages = 0  # pages of the documents to do known from the listing (ONE_PAGE)
        self._unlisted = _Counts()  # the other documents to do, from the count (pages unknown)
        self._opened = _Counts()  # those of them opened: pages to do now known
        self._waiting: dict[str, tuple[int, bool]] = {}  # started, not opened: pages committed, listed?
        self._lock = threading.Lock()
        self._closed = threading.Event()

    def count_documents(self, documents: Iterable, committed: Callable[[object], int | None]) -> threading.Thread | None:
        """Count, in a daemon thread, the documents of `documents` to do: committed(doc)
        is None for a document that is done, else how many of its pages are."""
        if not self.enabled:
            return None

        def count() -> None:
            listed, unlisted = _Counts(), _Counts()
            try:
                for doc in documents:
                    skip = committed(doc)
                    if skip is None:
                        continue
                    pages = listed_pages(doc.uri)
                    if pages is None:
                        unlisted.add(committed=skip)
                    else:
                        listed.add(pages - skip, skip)
            except Exception:  # noqa: BLE001 - progress only: the run's own listing reports faults
                return
            with self._lock:
                self.documents_total = unlisted.docs + listed.docs
                self._listed_pages, self._unlisted = listed.pages, unlisted
            self._update()

        thread = threading.Thread(target=count, name="batchocr-progress-count", daemon=True)
        thread.start()
        return thread

    def started(self, doc, committed: int = 0) -> None:
        """A document is started; `committed` of its pages are done already."""
        if not self.enabled:
            return
        with self._lock:
            self.documents_started += 1
            self._waiting[doc.doc_id] = (committed, listed_pages(doc.uri) is not None)
        if self.bar is None:
            self._draw()
        self._update()

    def opened(self, doc_id: str, page_count: int | None) -> None:
        """A started document's first pages came: it has page_count pages (None: it
        did not open, and gives one row)."""
        with self._lock:
            waiting = self._waiting.pop(doc_id, None)
            if waiting is None:
                return
            skip, listed = waiting
            if not listed:
                self._opened.add(1 if page_count is None else page_count - skip, skip)
        self._update()

    def done(self, rows: int) -> None:
        if self.bar is not None:
            with self._lock:  # an update's draw and the ticker's are one at a time: never both in an interval
                self.bar.update(rows)

    def estimated_pages(self) -> tuple[int, bool] | None:
        """(pages of the shard to do, exact?), or None before the documents are counted
        and one of unknown length has opened."""
        with self._lock:
            if self.documents_total is None:
                return None
            rest, opened = self._unlisted, self._opened
            known = self._listed_pages + opened.pages
            left = rest.docs - opened.docs
            if left <= 0:
                return known, True
            if not opened.docs:
                return None
            # Pages a document, not pages a byte: a scan's page is 50 times a born-digital
            # one's bytes (the demo's estimate read 48 for 10 pages by bytes, 11 by documents).
            seen = opened.pages + opened.committed  # whole documents
            guess = round(left * seen / opened.docs)
            return known + max(guess - (rest.committed - opened.committed), left), False

    def _draw(self) -> None:
        make = Bar if self.terminal else LogLines
        where = {"position": self.position} if self.terminal and self.position is not None else {}
        self.bar = make(unit="page", file=self.file, dynamic_ncols=self.terminal, desc=self.desc, smoothing=0.1,
                        mininterval=self.interval, miniters=1, **where)
        self._ticker = threading.Thread(target=self._tick, name="batchocr-progress", daemon=True)
        self._ticker.start()

    def _tick(self) -> None:
        """Refresh the bar once an interval when no update() has (pages came in batches)."""
        bar = self.bar
        while True:
            due = bar.last_print_t + self.interval - bar._time()
            if self._closed.wait(max(due, 0.02)):
                return
            with self._lock:  # not while close() draws the closing line
                if self._closed.is_set():
                    return
                now = bar._time()
                if now - bar.last_print_t >= self.interval:
                    bar.refresh()
                    bar.last_print_t, bar.last_print_n = now, bar.n  # as update() does when it draws

    def _update(self) -> None:
        bar = self.bar
        if bar is None:
            return
        estimate = self.estimated_pages()
        if estimate is not None:
            total, exact = estimate
            bar.bar_format = None if exact else ESTIMATED
            bar.total = max(total, bar.n)
        total = f"/{self.documents_total}" if self.documents_total is not None else ""
        bar.set_postfix_str(f"docs {self.documents_started}{total}", refresh=False)

    def close(self) -> None:
        with self._lock:
            self._closed.set()
        if self.bar is not None:
            self._ticker.join()  # woken by _closed: nothing is drawn after the closing line
            self._update()
            self.bar.close()

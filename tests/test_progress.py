"""Progress knows its end: documents counted by a background pass over the listing or
the plan (single-image files are a page each), the pages of the others as they open,
the rest estimated, and said to be; a log gets one whole line an interval, a terminal
a redraw twice a second; a run with nothing to do draws no bar."""

import io
import re
import shutil
import threading
import time

from batchocr import progress
from batchocr.engines.textlayer import TextLayerEngine, TextLayerOptions
from batchocr.pipeline import run_job
from batchocr.progress import Progress
from batchocr.sources import DocRef
from batchocr.spec import load_job
from conftest import SAMPLES, count_pages, run_cli
from corpus import text_corpus


def doc(name: str, size: int) -> DocRef:
    return DocRef(uri=f"file:///src/{name}", size=size, etag="e")


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_the_page_total_is_estimated_from_the_documents_opened_so_far():
    out = io.StringIO()
    p = Progress("t", enabled=True, file=out, interval=60)
    docs = [doc("a.pdf", 100), doc("b.pdf", 300), doc("c.pdf", 200), doc("d.pdf", 400), doc("e.png", 50),
            doc("done.pdf", 100)]
    committed = {"done.pdf": None, "b.pdf": 2}  # done.pdf is complete; 2 of b's pages are committed
    p.count_documents(iter(docs), lambda d: committed.get(d.name, 0)).join()
    assert p.documents_total == 5 and p.estimated_pages() is None  # no PDF opened yet: no basis
    for d in docs[:5]:
        p.started(d, committed.get(d.name, 0))
    p.opened(docs[0].doc_id, 4)  # 4 pages a PDF so far
    # a: 4; b, c, d: about 12, 2 of them committed; e.png: 1 (its name says)
    assert p.estimated_pages() == (4 + 10 + 1, False)
    p._update()
    assert re.search(r"\| 0/about 15 \[", str(p.bar)), str(p.bar)
    p.opened(docs[1].doc_id, 10)  # b: 10 pages, 2 committed
    p.opened(docs[1].doc_id, 10)  # its next batch changes nothing
    assert p.estimated_pages() == (4 + 8 + 1 + 2 * 7, False)  # 7 a PDF now, for c and d
    p.opened(docs[2].doc_id, 1)
    p.opened(docs[3].doc_id, 3)
    assert p.estimated_pages() == (4 + 8 + 1 + 3 + 1, True)  # all opened: the exact total, e.png still 1
    p.done(17)
    p.close()
    assert re.search(r"\| 17/17 \[", out.getvalue().splitlines()[-1]), out.getvalue()  # exact: no "about"


def test_the_total_never_falls_below_the_pages_done():
    p = Progress("t", enabled=True, file=io.StringIO(), interval=60)
    docs = [doc("a.pdf", 1000), doc("b.pdf", 10)]
    p.count_documents(iter(docs), lambda d: 0).join()
    for d in docs:
        p.started(d)
    p.opened(docs[0].doc_id, 1)
    p.done(5)  # more pages done than the estimate so far (a page count can lag its rows)
    p._update()
    assert p.bar.total == 5
    p.close()


def test_single_image_files_give_the_exact_total_before_any_opens():
    p = Progress("t", enabled=True, file=io.StringIO(), interval=60)
    p.count_documents(iter([doc("a.png", 10), doc("b.JPG", 10), doc("c.jpeg", 10)]), lambda d: 0).join()
    assert p.estimated_pages() == (3, True)
    p.close()


def _drive(p: Progress, bursts: int, gap: float) -> float:
    """Pages in bursts of 20 updates, `gap` s apart; returns how long it took."""
    p.count_documents(iter([doc("a.png", 1)] * 1000), lambda d: 0).join()
    start = time.monotonic()
    p.started(doc("a.png", 1))
    for _ in range(bursts):
        for _ in range(20):
            p.done(1)
        time.sleep(gap)
    p.close()
    return time.monotonic() - start


# Lines a run of 4 intervals or more gets, at the least: the first (when the bar starts),
# one from the ticker, the closing line. Measured with two CPU hogs beside the test:
# 5-6 lines a second at 0.25 s; 3 on the most loaded machine seen (load 12 on 2 cores:
# the ticker's wake-ups late). Without the ticker a quiet second gets 2.
AT_LEAST = 3


def test_a_log_gets_a_whole_line_once_an_interval_whenever_pages_come():
    """Pages in bursts (20 updates together) every 0.05 s, then a quiet gap longer
    than the interval: a line per interval at most, each ended by a newline, none
    by a carriage return. Delays (a loaded machine) can only make lines fewer."""
    out = io.StringIO()
    took = _drive(Progress("shard 0/1", enabled=True, file=out, interval=0.25), 20, 0.05)
    text = out.getvalue()
    assert "\r" not in text and text.endswith("\n")
    lines = text.splitlines()
    assert all(line.startswith("shard 0/1:") for line in lines), lines
    assert AT_LEAST <= len(lines) <= 2 + took / 0.25 + 1, (took, lines)  # +1: an update and a tick at once
    assert re.search(r"\b400/1000 \[", lines[-1]), lines[-1]
    assert not [t for t in threading.enumerate() if t.name == "batchocr-progress"]  # the ticker ended with it

    out = io.StringIO()
    took = _drive(Progress("shard 0/1", enabled=True, file=out, interval=0.25), 1, 1.0)  # then nothing for 1 s
    assert AT_LEAST <= len(out.getvalue().splitlines()) <= 2 + took / 0.25 + 1, (took, out.getvalue())


def test_a_terminal_is_redrawn_twice_a_second_in_place():
    out = Terminal()
    p = Progress("shard 0/1", enabled=True, file=out)
    assert p.interval == progress.TERMINAL_INTERVAL_S == 0.5
    took = _drive(p, 32, 0.05)
    draws = out.getvalue().count("\r")
    assert AT_LEAST <= draws <= 2 + took / 0.5 + 1, (took, draws)
    assert "\n" not in out.getvalue().rstrip("\n")  # in place: one line


class SlowTextLayer(TextLayerEngine):
    def __init__(self, seconds_per_page: float):
        super().__init__(TextLayerOptions())
        self.delay = seconds_per_page

    def run(self, pages, stop=None):
        for results in super().run(pages, stop):
            time.sleep(self.delay * results.num_rows)
            yield results


def test_a_run_not_on_a_terminal_logs_a_line_an_interval(tmp_path, monkeypatch, capsys):
    """The pipeline drives it: 60 pages at 25 ms, a line every 0.3 s (30 s in a real
    run: docs/progress-log.txt holds one), pages and documents of their totals."""
    text_corpus(tmp_path / "src", documents=6, pages=10)
    monkeypatch.setattr(progress, "LOG_INTERVAL_S", 0.3)
    spec = load_job(None, source=str(tmp_path / "src"), out=str(tmp_path / "out"), engine="textlayer",
                    route="model", render={"workers": 1})
    summary = run_job(spec, progress=True, engine=SlowTextLayer(0.025))
    err = capsys.readouterr().err
    assert "\r" not in err
    lines = err.splitlines()
    assert AT_LEAST <= len(lines) <= 2 + summary.seconds / 0.3 + 1, (summary.seconds, lines)
    assert re.search(r"\| 60/60 \[\d\d:\d\d<00:00, .*docs 6/6\]$", lines[-1]), lines[-1]
    assert all(re.search(r"page", line) for line in lines), lines
    # while documents were still to open (about 0.9 s, 3 intervals), the total was an estimate and said so
    assert any(re.search(r"\| \d+/about 60 \[", line) for line in lines[1:-1]), lines


def test_a_run_logs_pages_and_documents_of_their_totals_with_an_eta_and_a_rerun_no_bar(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for p in SAMPLES.glob("*.pdf"):
        shutil.copy(p, src / p.name)
    pages = sum(count_pages(p) for p in src.iterdir())
    proc = run_cli("run", str(src), str(tmp_path / "out"), "--engine", "textlayer", check=True)
    last = proc.stderr.strip().splitlines()[-1]  # not a terminal: the closing line of the bar
    assert re.search(rf"\b{pages}/{pages} \[", last), last
    assert f"docs {len(list(src.iterdir()))}/{len(list(src.iterdir()))}" in last, last
    assert re.search(r"\[\d\d:\d\d<\d\d:\d\d", last), last  # elapsed<remaining: an ETA
    again = run_cli("run", str(src), str(tmp_path / "out"), "--engine", "textlayer", check=True)
    assert "nothing to do" in again.stdout
    assert "page" not in again.stderr, again.stderr  # no bar at all


def test_a_quiet_progress_draws_nothing():
    out = io.StringIO()
    p = Progress("t", enabled=False, file=out, interval=0.01)
    p.count_documents(iter([doc("a.pdf", 1)]), lambda d: 0)
    p.started(doc("a.pdf", 1))
    p.opened(doc("a.pdf", 1).doc_id, 3)
    p.done(3)
    p.close()
    assert out.getvalue() == ""


def test_a_terminal_of_no_width_gets_log_lines():
    """A pty nobody sized (0 columns) would show tqdm's bar as nothing at all."""
    import fcntl
    import os
    import pty
    import struct
    import termios

    leader, follower = pty.openpty()
    try:
        with open(follower, "w", closefd=False) as tty:
            assert Progress("t", enabled=True, file=tty).terminal is False
            fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 100, 0, 0))
            assert Progress("t", enabled=True, file=tty).terminal is True
    finally:
        os.close(leader)
        os.close(follower)

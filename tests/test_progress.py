"""Progress knows its end: documents counted by a background pass over the listing or
the plan, pages as documents open; the log line of a real run shows pages done of the
total, documents done of the total, and an ETA."""

import re
import shutil

from batchocr.progress import Progress
from conftest import SAMPLES, count_pages, run_cli


def test_the_page_total_is_estimated_from_the_documents_opened_so_far():
    p = Progress("t", enabled=True)
    assert p.estimated_pages() is None  # nothing counted yet
    p.count_documents(iter(range(10)), lambda d: d % 2 == 0).join()  # 5 documents to do
    assert p.documents_total == 5 and p.estimated_pages() is None  # none opened yet
    p.opened(4)
    p.opened(2)  # 6 pages from 2 documents: 3 a document for the 3 not yet opened
    assert p.estimated_pages() == 6 + 9 and p.bar.total == 15
    for pages in (1, 1, 1):
        p.opened(pages)
    assert p.estimated_pages() == 9 and p.bar.total == 9  # all opened: the exact total
    p.done(9)
    p.close()


def test_a_run_logs_pages_and_documents_of_their_totals_with_an_eta(tmp_path):
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

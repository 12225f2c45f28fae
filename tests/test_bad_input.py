"""Bad input becomes error rows, the rest of the shard goes on, the run ends in bounded time."""

import os
import signal
import threading
import time

import pymupdf
import pytest

from batchocr import read_pages, renderprogress, schema
from batchocr.render import RenderTask
from batchocr.schema import Needs
from batchocr.renderpool import RenderPool
from batchocr.sources import list_documents
from batchocr.spec import RenderSpec
from batchocr.storage import Store
from conftest import SAMPLES, run_cli
from corpus import bad_corpus, hang_pdf, text_corpus, text_pdf

EXPECTED = {  # file -> (rows, page_index of the error row, error_type)
    "empty.pdf": (1, -1, "empty_file"),
    "notes.pdf": (1, -1, "open_failed"),
    "header-only.pdf": (1, -1, "open_failed"),
    "encrypted.pdf": (1, -1, "encrypted"),
    "random.png": (1, -1, "open_failed"),
    "huge.png": (1, 0, "too_large"),
    "bomb.png": (1, 0, "too_large"),
}


def test_every_kind_of_bad_input_in_one_shard(tmp_path):
    src = tmp_path / "src"
    kinds = bad_corpus(src)
    good = text_corpus(src / "good", documents=3, pages=2)
    thousands = text_pdf(src / "thousands.pdf", 2000)
    out = tmp_path / "out"
    proc = run_cli("run", str(src), str(out), "--engine", "textlayer", "-q", check=True)
    pages = read_pages(str(out)).collect()
    by_doc = {name: pages.filter(pages["source_uri"].str.ends_with("/" + name)) for name in kinds}

    for name, (rows, index, error_type) in EXPECTED.items():
        rows_of = by_doc[name]
        assert rows_of.height == rows, name
        assert rows_of["page_index"].to_list() == [index], name
        assert rows_of["finish_reason"].to_list() == ["error"], name
        assert rows_of["error_type"].to_list() == [error_type], name
        assert name in rows_of["error_message"][0], "the message names the document"
    # Repairable damage: every page has a row, and MuPDF's report is kept.
    for name in ("garbled.pdf", "truncated.pdf"):
        rows_of = by_doc[name]
        assert sorted(rows_of["page_index"]) == [0, 1, 2], name
        assert rows_of["warning"].null_count() == 0 and "repair" in rows_of["warning"][0], name
    assert "bomb" in kinds["bomb.png"]
    assert "20000x20000" in by_doc["bomb.png"]["error_message"][0]

    # Every good page is there, with its text.
    for name, texts in good.items():
        rows_of = pages.filter(pages["source_uri"].str.ends_with("/good/" + name)).sort("page_index")
        assert rows_of["text"].to_list() == [t.strip() for t in texts]
    big = pages.filter(pages["source_uri"].str.ends_with("/thousands.pdf")).sort("page_index")
    assert big["page_index"].to_list() == list(range(2000))
    assert big["text"][1999] == thousands[1999].strip()
    # One row per page, no duplicates, and only declared error types.
    assert pages.select("doc_id", "page_index").is_unique().all()
    assert set(pages["error_type"].drop_nulls()) <= schema.ERROR_TYPES
    # The summary's counts mean one thing each: pages are page rows; a document's error row
    # (page_index -1) is a document that failed, not a page ("32 pages (2 errors)" for 30 pages).
    failed = pages.filter(pages["page_index"] < 0)
    assert failed.height == sum(index == -1 for _, index, _ in EXPECTED.values()) == 5
    page_rows = pages.filter(pages["page_index"] >= 0)
    errors = page_rows.filter(page_rows["finish_reason"] == "error").height
    assert errors == 2  # huge.png and bomb.png: a page each, too large to read
    documents = pages["doc_id"].n_unique()
    assert (f"batchocr: done: {documents} documents (5 failed), {page_rows.height:,} pages (2 errors"
            in proc.stdout), proc.stdout


def _collect(pool, tasks):
    return [row for batch in pool.run(tasks) for row in batch.to_pylist()]


def test_a_hung_renderer_is_killed_and_the_document_recorded(tmp_path):
    texts = hang_pdf(tmp_path / "hang.pdf", pages=4, hang_at=(0, 2))
    docs = {d.name: d for d in list_documents(Store(str(tmp_path)))}
    for sample in ("receipt.png", "fax.tiff"):
        docs[sample] = next(d for d in list_documents(Store(str(SAMPLES / sample))))
    spec = RenderSpec(workers=1, timeout_s=1.5, batch_pages=4)
    with RenderPool(spec, Needs(text_layer=True, image=False)) as pool:
        rows = _collect(pool, [RenderTask(docs["hang.pdf"]), RenderTask(docs["receipt.png"]), RenderTask(docs["fax.tiff"])])
        assert pool.replaced == 2
    hung = sorted((r["page_index"], r["error_type"], r["text_layer"] and r["text_layer"].strip()) for r in rows if r["source_uri"].endswith("hang.pdf"))
    # A hang costs its page only, the first page too: a fresh worker goes on from the next page.
    assert hung == [(0, "timeout", None), (1, None, texts[1]), (2, "timeout", None), (3, None, texts[3])]
    assert all("rendering made no progress" in r["error_message"] and r["attempts"] == 1
               for r in rows if r["error_type"])
    assert [r["page_index"] for r in rows if r["source_uri"].endswith("fax.tiff")] == [0, 1, 2]
    assert [r["error_type"] for r in rows if r["source_uri"].endswith("receipt.png")] == [None]


def _schedstat(pid: int) -> tuple[float, float]:
    """Seconds the process's main thread has run, and has waited for a CPU (Linux's schedstat)."""
    with open(f"/proc/{pid}/schedstat") as f:
        run, wait = f.read().split()[:2]
    return int(run) / 1e9, int(wait) / 1e9


@pytest.mark.skipif(not os.path.exists("/proc/self/schedstat"), reason="needs Linux's schedstat")
def test_a_worker_kept_waiting_for_a_cpu_is_not_timed_out(tmp_path):
    """The timeout is on the worker's own time. The test holds the worker off its CPU for
    1.5 timeouts: pinned to one CPU beside a busy process, at nice 15 (a share of 36/1060 of
    that CPU, in turns well under a second apart even beside other work). The test, not the
    machine's load, decides how long the worker waits: until the kernel says it has waited
    1.5 timeouts (its run delay); then the worker gets its CPU back and reads the rest of the
    document. It is read, not timed out: on a busy or CPU-throttled node a sound page is not
    a `timeout` row. (A page that hangs still is: the test above.) The timeout is 3 s and
    twice the CPU the document takes, measured first in the same test; it was 2.5 times that
    CPU before (0.15 s here), and a loaded machine's stray 0.1 s off the CPU that is neither
    run time nor run delay (another VM's turn, a page fault) went past it. Not nice 19 nor
    SCHED_IDLE: the kernel adds a wait to the run delay only when it ends, and their turns
    came seconds apart beside other work, each wait longer than the timeout."""
    import subprocess
    import sys

    # 2**16 draws: finite, and more CPU than the worker gets while it waits 1.5 timeouts
    texts = hang_pdf(tmp_path / "slow.pdf", pages=3, hang_at=(1,), depth=16)
    (doc,) = list_documents(Store(str(tmp_path)))
    cpu = min(os.sched_getaffinity(0))
    with RenderPool(RenderSpec(workers=1, timeout_s=600, batch_pages=1), Needs(text_layer=True, image=False)) as pool:
        pid = pool.workers[0].process.pid
        while not pool.workers[0].progress[renderprogress.STARTED]:
            time.sleep(0.01)
        ran, _ = _schedstat(pid)
        _collect(pool, [RenderTask(doc)])
        cpu_s = _schedstat(pid)[0] - ran
    timeout = 3.0 + 2 * cpu_s
    with RenderPool(RenderSpec(workers=1, timeout_s=timeout, batch_pages=1), Needs(text_layer=True, image=False)) as pool:
        pid = pool.workers[0].process.pid
        while not pool.workers[0].progress[renderprogress.STARTED]:  # its imports done at full speed
            time.sleep(0.01)
        os.sched_setaffinity(pid, {cpu})
        hog = subprocess.Popen([sys.executable, "-c", f"import os; os.sched_setaffinity(0, {{{cpu}}})\nwhile True: pass"])
        try:
            os.setpriority(os.PRIO_PROCESS, pid, 15)
            rows: list = []
            reader = threading.Thread(target=lambda: rows.extend(_collect(pool, [RenderTask(doc)])))
            _, before = _schedstat(pid)
            reader.start()
            waited = 0.0
            while waited < 1.5 * timeout and reader.is_alive() and not pool.replaced:
                time.sleep(0.05)
                try:
                    waited = _schedstat(pid)[1] - before
                except OSError:  # replaced meanwhile: the assertion below says so
                    break
            if not pool.replaced:
                os.setpriority(os.PRIO_PROCESS, pid, 0)
        finally:
            hog.kill()
            hog.wait()
        reader.join()
        replaced = pool.replaced
    assert replaced == 0, f"timed out while it waited for a CPU ({waited:.1f} s waited, timeout {timeout:.1f} s)"
    assert waited >= 1.5 * timeout, f"the worker was not kept waiting ({waited:.1f} s, timeout {timeout:.1f} s)"
    assert sorted((r["page_index"], r["error_type"], r["text_layer"].strip()) for r in rows) == [
        (i, None, texts[i]) for i in range(3)]


def _kill_when_on_a_page(pool, page: int, sig=signal.SIGKILL) -> threading.Thread:
    """Kill worker 0 once it has started rendering `page` (its shared progress record)."""
    def watch():
        w = pool.workers[0]
        while w.progress[renderprogress.PAGE] != page:
            time.sleep(0.01)
        os.kill(w.process.pid, sig)
    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def test_a_renderer_that_dies_on_a_page_costs_that_page_only(tmp_path):
    hang_pdf(tmp_path / "hang.pdf", pages=4, hang_at=(2,))
    (doc,) = list_documents(Store(str(tmp_path)))
    (receipt,) = list_documents(Store(str(SAMPLES / "receipt.png")))
    with RenderPool(RenderSpec(workers=1, timeout_s=120, batch_pages=4), Needs(image=True)) as pool:
        # The OOM killer, or a segfault in MuPDF, as seen from the pool: the worker vanishes.
        victim = pool.workers[0].process.pid
        _kill_when_on_a_page(pool, 2)
        rows = _collect(pool, [RenderTask(doc), RenderTask(receipt)])
        assert pool.replaced == 1 and pool.workers[0].process.pid != victim
    pages = sorted((r["page_index"], r["error_type"]) for r in rows if r["source_uri"].endswith("hang.pdf"))
    # Pages 0 and 1 were rendered but still in the worker's batch: the fresh worker renders them again.
    assert pages == [(0, None), (1, None), (2, "renderer_crashed"), (3, None)]
    assert "page 2: the render worker died" in next(r["error_message"] for r in rows if r["error_type"])
    assert [r["error_type"] for r in rows if r["source_uri"].endswith("receipt.png")] == [None]


def test_a_renderer_that_dies_while_idle_is_replaced(tmp_path):
    (receipt,) = list_documents(Store(str(SAMPLES / "receipt.png")))
    with RenderPool(RenderSpec(workers=1, timeout_s=120), Needs(image=True)) as pool:
        assert [r["error_type"] for r in _collect(pool, [RenderTask(receipt)])] == [None]
        victim = pool.workers[0].process
        victim.kill()
        victim.join()
        assert [r["error_type"] for r in _collect(pool, [RenderTask(receipt)])] == [None]
        assert pool.replaced == 1


@pytest.mark.parametrize("engine", ["rapidocr"])
def test_a_hanging_document_does_not_stall_the_run(tmp_path, engine):
    """End to end with the real OCR engine: the slow document times out, the
    others are read, the run exits 0 (its page hangs for good: the run ending at all is
    the timeout at work, on a machine however loaded)."""
    src = tmp_path / "src"
    src.mkdir()
    hang_pdf(src / "slow.pdf", pages=2, hang_at=(0,))
    (src / "receipt.png").write_bytes((SAMPLES / "receipt.png").read_bytes())
    job = tmp_path / "job.yaml"
    job.write_text(f"source: {src}\nout: {tmp_path / 'out'}\nengine: {engine}\nrender: {{timeout_s: 1.5, workers: 1}}\n")
    run_cli("run", "--job", str(job), "-q", check=True)  # it ends: the hung page does not hold it
    pages = read_pages(str(tmp_path / "out")).collect()
    slow = pages.filter(pages["source_uri"].str.ends_with("slow.pdf"))
    # The hang costs its page: the page after it is read by a fresh worker.
    assert slow.sort("page_index").select("page_index", "error_type").rows() == [(0, "timeout"), (1, None)]
    assert "section" in slow.sort("page_index")["text"][1]
    receipt = pages.filter(pages["source_uri"].str.ends_with("receipt.png"))
    assert receipt["finish_reason"].to_list() == ["stop"] and "TOTAL" in receipt["text"][0].upper()


def test_the_pool_starts_no_more_workers_than_documents_at_once(tmp_path):
    """render.workers is an upper bound: 1,000 asked for one document started 1,000 processes
    (7 GB). Workers start as documents come to them; every page is still read."""
    text_corpus(tmp_path / "src", documents=2, pages=2)
    docs = list(list_documents(Store(str(tmp_path / "src"))))
    with RenderPool(RenderSpec(workers=64, timeout_s=120), Needs(text_layer=True, image=False)) as pool:
        assert len(pool.workers) == 1
        rows = _collect(pool, [RenderTask(d) for d in docs])
        assert len(pool.workers) == 2 and pool.replaced == 0
    assert sorted((r["source_uri"].rsplit("/", 1)[1], r["page_index"], r["error_type"]) for r in rows) == [
        (name, i, None) for name in ("doc00000.pdf", "doc00001.pdf") for i in range(2)]


def test_a_document_rewritten_after_it_was_listed_is_not_read_under_its_old_etag(tmp_path):
    """Listed (or planned) as one version, read as another: its row held the new content under
    the listed etag and size, as if it were the version listed. Now an `unreadable` row,
    superseded once a run lists the new version."""
    texts = text_corpus(tmp_path / "src", documents=2, pages=1)
    docs = {d.name: d for d in list_documents(Store(str(tmp_path / "src")))}
    new = text_pdf(tmp_path / "src" / "doc00001.pdf", 2, seed=77)  # rewritten: two pages now
    with RenderPool(RenderSpec(workers=1, timeout_s=120), Needs(text_layer=True, image=False)) as pool:
        rows = _collect(pool, [RenderTask(d) for d in docs.values()])
    got = {(r["source_uri"].rsplit("/", 1)[1], r["page_index"]): r for r in rows}
    assert sorted(got) == [("doc00000.pdf", 0), ("doc00001.pdf", -1)]
    assert got[("doc00000.pdf", 0)]["text_layer"].split() == texts["doc00000.pdf"][0].split()
    changed = got[("doc00001.pdf", -1)]
    assert changed["error_type"] == "unreadable" and changed["source_etag"] == docs["doc00001.pdf"].etag
    assert "changed after it was listed (" in changed["error_message"]
    # listed again, it is the new version (another etag): read whole
    (again,) = [d for d in list_documents(Store(str(tmp_path / "src"))) if d.name == "doc00001.pdf"]
    assert again.etag != docs["doc00001.pdf"].etag
    with RenderPool(RenderSpec(workers=1, timeout_s=120), Needs(text_layer=True, image=False)) as pool:
        rows = _collect(pool, [RenderTask(again)])
    assert [r["text_layer"].split() for r in sorted(rows, key=lambda r: r["page_index"])] == [t.split() for t in new]


def test_a_pdf_whose_page_tree_miscounts_its_pages_is_one_open_failed_row(tmp_path):
    """MuPDF raises "Invalid number of pages" when it first counts the pages of a page tree
    whose /Count it cannot believe: that was a traceback on stderr, the worker died, and the
    row said `renderer_crashed` (tried again by every rerun)."""
    for count in ("7", "-1", "99999999999"):
        pdf = pymupdf.open()
        pdf.new_page().insert_text((72, 72), "Hello page")
        pages = int(pdf.xref_get_key(pdf.pdf_catalog(), "Pages")[1].split()[0])
        pdf.xref_set_key(pages, "Count", count)
        # Document.save counts the pages first, and raises as the worker did
        pymupdf.mupdf.pdf_save_document(pymupdf._as_pdf_document(pdf), str(tmp_path / f"count{count}.pdf"),
                                        pymupdf.mupdf.PdfWriteOptions())
    text_pdf(tmp_path / "sound.pdf", 1)
    docs = sorted(list_documents(Store(str(tmp_path))), key=lambda d: d.name)
    with RenderPool(RenderSpec(workers=1, timeout_s=120), Needs(text_layer=True, image=False)) as pool:
        rows = _collect(pool, [RenderTask(d) for d in docs])
        assert pool.replaced == 0
    got = {r["source_uri"].rsplit("/", 1)[1]: r for r in rows}
    assert sorted((name, r["page_index"], r["error_type"]) for name, r in got.items()) == [
        ("count-1.pdf", -1, "open_failed"), ("count7.pdf", -1, "open_failed"),
        ("count99999999999.pdf", -1, "open_failed"), ("sound.pdf", 0, None)]
    assert got["count7.pdf"]["error_message"] == (
        f"file://{tmp_path}/count7.pdf: cannot open as pdf: RuntimeError: code=7: Invalid number of pages")

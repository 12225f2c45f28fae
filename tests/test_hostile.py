"""A hostile corpus through the real CLI and the real render pool: odd file
names, files that are not files, folders that cannot be listed, pages that hang
the renderer, workers that die, runs killed at random instants. Every page gets
exactly one row, computed here from what each file is."""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time

import polars as pl
import pytest
from hypothesis import given, strategies as st

from batchocr import procstat, read_pages
from batchocr.compact import compact
from batchocr.sharding import shard_of
from batchocr.sources import doc_id, native, spell
from batchocr.storage import Store
from chaos import (assert_same_as_clean, descendants, finish, render_workers, start, still_running_after, table,
                   wait_until_running, write_job)
from conftest import HANG_S, run_cli
from corpus import bad_corpus, hang_pdf, text_corpus, text_pdf

# Every byte a POSIX name may hold (all but NUL and "/"), non-UTF-8 sequences included.
names = st.binary(min_size=1, max_size=40).filter(lambda b: b"\0" not in b and b"/" not in b)


@given(names, names)
def test_a_file_name_is_spelled_losslessly_as_utf8(a, b):
    uri = "file:///data/" + os.fsdecode(a)
    spelled = spell(uri)
    spelled.encode("utf-8")  # storable in Parquet, hashable
    assert native(spelled) == uri
    assert (spell("file:///data/" + os.fsdecode(b)) == spelled) == (a == b)
    assert 0 <= shard_of(spelled, 7) < 7 and len(doc_id(spelled)) == 16


ODD_NAMES = [b"b-\xff.pdf", b"a::b.pdf", b"hash#1.pdf", b"50%.pdf", b"pct%41.pdf", b"new\nline.pdf",
             b"-leading-dash.pdf", b"sp ace.pdf", "\u00e9t\u00e9.pdf".encode()]


def _read(out) -> list[dict]:
    return read_pages(str(out)).collect().sort("source_uri", "page_index").to_dicts()


def test_any_file_name_is_listed_sharded_opened_and_written(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    texts = {}
    for i, name in enumerate(ODD_NAMES):
        path = os.path.join(os.fsencode(src), name)
        text_pdf(tmp_path / "tmp.pdf", 2, seed=i)
        shutil.move(tmp_path / "tmp.pdf", os.fsdecode(path))
        texts[spell(f"file://{src}/{os.fsdecode(name)}")] = i
    out = tmp_path / "out"
    for shard in ("0/2", "1/2"):
        run_cli("run", str(src), str(out), "--engine", "textlayer", "-q", "--shard", shard, check=True)
    rows = _read(out)
    assert {r["source_uri"] for r in rows} == set(texts)
    assert all(r["finish_reason"] == "stop" for r in rows), [r for r in rows if r["error_type"]]
    for r in rows:
        assert f" {texts[r['source_uri']] * 100_000 + r['page_index']}-0" in r["text"]
        assert r["shard"] == shard_of(r["source_uri"], 2)
    assert len(rows) == 2 * len(ODD_NAMES)
    assert "file://" + str(src) + "/b-%FF.pdf" in texts and "50%25.pdf" in " ".join(texts)


def test_a_source_and_out_whose_names_are_not_utf8_work(tmp_path):
    """They were exit 2 with a garbled JSON error (the configuration's JSON round trip
    cannot hold os.fsdecode's escapes); then pyarrow and polars could not read such
    an OUT back (resume, status, read_pages)."""
    src = os.fsdecode(os.path.join(os.fsencode(tmp_path), b"src-\xff"))
    os.mkdir(src)
    texts = text_pdf(tmp_path / "tmp.pdf", 2)
    one = os.path.join(src, os.fsdecode(b"odd-\xfe.pdf"))
    shutil.move(tmp_path / "tmp.pdf", one)
    def cli(*args):  # the console script, its output strict UTF-8 (as under en_US.UTF-8)
        return subprocess.run([sys.executable, "-m", "batchocr.cli", *args], capture_output=True, timeout=300,
                              env={**os.environ, "PYTHONIOENCODING": "utf-8:strict"}, text=True, errors="surrogateescape")

    for source, out in [(one, str(tmp_path / "out")), (src, os.fsdecode(os.path.join(os.fsencode(tmp_path), b"out-\xff")))]:
        proc = cli("run", source, out, "--engine", "textlayer", "-q")
        assert proc.returncode == 0 and "done: 1 document, 2 pages (0 errors)" in proc.stdout, proc.stderr
        assert f"-> {out}/pages" in proc.stdout  # printed as given
        assert "nothing to do" in cli("run", source, out, "--engine", "textlayer", "-q").stdout
        assert "1/1 shards done" in cli("status", out).stdout
        rows = _read(out)
        assert [r["source_uri"] for r in rows] == [spell("file://" + one)] * 2
        assert [r["text"] for r in rows] == [t.strip() for t in texts]


def _without_dac(*args: str) -> subprocess.CompletedProcess:
    """The CLI as a process without CAP_DAC_OVERRIDE: root here, yet mode 000 holds."""
    return subprocess.run(["setpriv", "--bounding-set=-dac_override,-dac_read_search", sys.executable, "-m",
                           "batchocr.cli", *args], capture_output=True, text=True, timeout=300)


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs setpriv (util-linux)")
def test_a_folder_that_cannot_be_listed_stops_the_run(tmp_path):
    src = tmp_path / "src"
    text_pdf((src / "ok").mkdir(parents=True) or src / "ok" / "a.pdf", 1)
    text_pdf((src / "locked").mkdir() or src / "locked" / "b.pdf", 1)
    (src / "locked").chmod(0)
    out = tmp_path / "out"
    try:
        proc = _without_dac("run", str(src), str(out), "--engine", "textlayer", "-q")
    finally:
        (src / "locked").chmod(0o755)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.count("\n") == 1 and "locked" in proc.stderr and "Permission denied" in proc.stderr
    assert not (out / "_done").exists()


def test_a_symbolic_link_to_a_folder_is_walked_and_a_loop_is_not(tmp_path):
    """fsspec lists a link to a folder as type "other": its documents were skipped
    without a word."""
    text_pdf((tmp_path / "real" / "deep").mkdir(parents=True) or tmp_path / "real" / "deep" / "a.pdf", 2)
    src = tmp_path / "src"
    text_pdf(src.mkdir() or src / "b.pdf", 1)
    os.symlink("../real", src / "linked")
    os.symlink(".", src / "self")  # loops: a folder above the link
    os.symlink("..", src / "up")  # up/real is outside; up/src is the root again
    os.symlink("nowhere", src / "dangling.pdf")  # still a document: its row says why
    out = tmp_path / "out"
    run_cli("run", str(src), str(out), "--engine", "textlayer", "-q", check=True)
    rows = read_pages(str(out)).collect()
    got = sorted(zip(rows["source_uri"].str.strip_prefix(f"file://{src}/"), rows["page_index"], rows["error_type"]))
    assert got == [("b.pdf", 0, None), ("dangling.pdf", -1, "unreadable"),
                   ("linked/deep/a.pdf", 0, None), ("linked/deep/a.pdf", 1, None),
                   ("up/real/deep/a.pdf", 0, None), ("up/real/deep/a.pdf", 1, None)]


def _keys(rows: list[dict]):
    import pyarrow as pa

    from batchocr import schema
    from batchocr.sink import KEY_COLUMNS

    full = [{"doc_id": "d", "source_etag": "e", "run_id": "r", "finish_reason": "error" if r.get("error_type") else "stop"}
            | r for r in rows]
    return pa.Table.from_pylist(full, schema=schema.PAGE_TABLE).select(KEY_COLUMNS)


def test_a_document_is_complete_only_when_every_page_has_a_final_row():
    from batchocr.sink import Resume, completed

    def state(*rows):
        return completed(_keys(list(rows)))[("d", "e")]

    page = lambda i, **kw: {"page_index": i, "page_count": 3} | kw  # noqa: E731
    doc = lambda **kw: {"page_index": -1, "page_count": None} | kw  # noqa: E731
    assert state(page(0), page(1), page(2)) is None
    # A document-level row stands in for no page once the page count is known (#11's loss).
    assert state(page(0), page(1), doc(error_type="timeout")) == Resume(frozenset({0, 1}))
    # A timed-out page is tried once more; failing again, its row is final.
    assert state(page(0), page(1, error_type="timeout", attempts=1), page(2)) == Resume(frozenset({0, 2}), frozenset({1}))
    assert state(page(0), page(1, error_type="renderer_crashed"), page(2)) == Resume(frozenset({0, 2}), frozenset({1}))
    assert state(page(0), page(1, error_type="timeout", attempts=1), page(1, error_type="timeout", attempts=2),
                 page(2)) is None
    assert state(page(0), page(1, error_type="render_failed"), page(2)) is None
    # A document that never opened: a timeout is retried, anything else is its answer.
    assert state(doc(error_type="timeout", attempts=1)) == Resume(frozenset(), frozenset({-1}))
    assert state(doc(error_type="timeout", attempts=2)) is None
    assert state(doc(error_type="open_failed")) is None
    assert state({"page_index": -1, "page_count": 0, "error_type": "no_pages"}) is None


def test_sigkill_during_a_hang_and_a_long_document_then_resume_equals_a_clean_run(tmp_path):
    """kill -9 of the run's own process (not its group) at random instants, while a
    page hangs the renderer and while a 200-page document is read: no worker outlives
    its run, and after the reruns and compaction the table is the clean run's."""
    src = tmp_path / "src"
    src.mkdir()
    hang_pdf(src / "hang-late.pdf", pages=6, hang_at=(4,))
    hang_pdf(src / "hang-first.pdf", pages=3, hang_at=(0,), seed=1)
    text_pdf(src / "long.pdf", 80, seed=2, lines=2)
    text_corpus(src / "small", documents=4, pages=2)
    # A commit every 0.2 s: kills land between commits and mid-document. (200 pages committed
    # one a part made this CI's longest test, 130 s under the loaded suite, reading 200 parts
    # at every rerun.)
    sections = {"render": {"workers": 2, "batch_pages": 4, "timeout_s": 1.5},
                "commit": {"every_pages": 4, "every_seconds": 0.2}}

    def until_nothing_to_do(job) -> None:
        for _ in range(4):
            done = finish(job, ms_per_page=2)
            assert done.returncode == 0, done.stderr
            if "nothing to do" in done.stdout:
                return
        raise AssertionError(f"still work after 4 reruns: {done.stdout}")

    clean = tmp_path / "clean"
    job = write_job(tmp_path, src, clean, **sections)
    for _ in range(2):  # the second run retries each timed-out page once
        assert finish(job, ms_per_page=2).returncode == 0
    compact(Store(str(clean)))
    expected = table(clean)
    # Every page of every document has its row: the hung pages are timeout rows, the rest text.
    errors = expected.filter(pl.col("finish_reason") == "error")
    assert sorted(errors["page_index"]) == [0, 4] and expected.height == 6 + 3 + 80 + 8

    out = tmp_path / "killed"
    job = write_job(tmp_path, src, out, **sections)
    rnd = random.Random(11)
    kills = 0
    for runs in range(5):
        proc = start(job, ms_per_page=2)
        if wait_until_running(job, proc, runs):  # timed from the run's start, not the interpreter's
            time.sleep(rnd.uniform(0.0, 2.5))
        workers = descendants(proc.pid)  # the render workers' fork server, the workers, the resource tracker
        render = render_workers(proc.pid)
        if proc.poll() is not None:
            assert proc.returncode == 0, proc.stderr.read()
            continue
        proc.kill()  # the main process only: its workers must follow on their own
        proc.wait(timeout=30)
        kills += 1
        assert render and set(render) <= workers, "the run had no workers to check"
        assert not still_running_after(workers, 10), "a render worker outlived its run"
    assert kills >= 3
    until_nothing_to_do(job)
    assert_same_as_clean(out, expected)


def _setpriv(*args: str, **kwargs) -> subprocess.CompletedProcess:
    """`batchocr ARGS` without CAP_DAC_OVERRIDE: root here, yet file modes hold."""
    return subprocess.run(["setpriv", "--bounding-set=-dac_override,-dac_read_search", sys.executable, "-m",
                           "batchocr.cli", *args], capture_output=True, text=True, timeout=300, **kwargs)


BAD = {  # bad_corpus's files -> (page_index, error_type) of each row (README's Errors table)
    "empty.pdf": [(-1, "empty_file")], "notes.pdf": [(-1, "open_failed")], "header-only.pdf": [(-1, "open_failed")],
    "encrypted.pdf": [(-1, "encrypted")], "random.png": [(-1, "open_failed")], "huge.png": [(0, "too_large")],
    "bomb.png": [(0, "too_large")], "garbled.pdf": [(0, None), (1, None), (2, None)],
    "truncated.pdf": [(0, None), (1, None), (2, None)],
}
UNREADABLE = {  # file -> what its message says
    "dangling.pdf": "symbolic link to a file that does not exist", "loop-a.pdf": "loop of symbolic links",
    "fifo.pdf": "FIFO", "zero.pdf": "character device", "secret.pdf": "permission denied",
}


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs setpriv (util-linux)")
def test_a_hostile_corpus_gives_every_page_one_row(tmp_path):
    src = tmp_path / "src"
    bad_corpus(src / "bad")
    good = text_corpus(src / "good", documents=3, pages=2)
    late = hang_pdf(src / "hang-late.pdf", pages=5, hang_at=(3,))
    first = hang_pdf(src / "hang-first.pdf", pages=3, hang_at=(0,), seed=1)
    odd = src / "odd"
    odd.mkdir()
    os.symlink("nowhere.pdf", odd / "dangling.pdf")
    os.symlink("loop-b.pdf", odd / "loop-a.pdf")
    os.symlink("loop-a.pdf", odd / "loop-b.pdf")
    os.mkfifo(odd / "fifo.pdf")
    os.symlink("/dev/zero", odd / "zero.pdf")
    text_pdf(odd / "secret.pdf", 1)
    (odd / "secret.pdf").chmod(0)
    expected: dict[str, list] = {f"bad/{n}": rows for n, rows in BAD.items()}
    expected |= {f"good/{n}": [(i, None) for i in range(len(t))] for n, t in good.items()}
    expected["hang-late.pdf"] = [(i, "timeout" if i == 3 else None) for i in range(len(late))]
    expected["hang-first.pdf"] = [(i, "timeout" if i == 0 else None) for i in range(len(first))]
    expected |= {f"odd/{n}": [(-1, "unreadable")] for n in [*UNREADABLE, "loop-b.pdf"]}

    out = tmp_path / "out"
    job = tmp_path / "job.yaml"
    job.write_text(f"source: {src}\nout: {out}\nengine: textlayer\nrender: {{timeout_s: 1.5, workers: 2}}\n")
    proc = _setpriv("run", "--job", str(job), "-q")
    assert proc.returncode == 0, proc.stderr
    rows = read_pages(str(out)).collect()
    prefix = f"file://{src}/"
    got = {}
    for r in rows.sort("page_index").iter_rows(named=True):
        error = r["error_type"] if r["finish_reason"] == "error" else None  # not a page without a text layer
        got.setdefault(r["source_uri"].removeprefix(prefix), []).append((r["page_index"], error))
        if error is not None:
            assert r["source_uri"] in r["error_message"], "the message names the document"
    assert got == expected
    messages = dict(rows.filter(pl.col("error_type") == "unreadable").select("source_uri", "error_message").rows())
    for name, says in UNREADABLE.items():
        assert says in messages[prefix + "odd/" + name], messages[prefix + "odd/" + name]
    texts = dict(rows.filter(pl.col("source_uri") == prefix + "hang-late.pdf").select("page_index", "text").rows())
    assert texts[4] == late[4].strip() and texts[3] is None  # the page after the hang was read

    # The rerun tries each timed-out page once more (attempts 2: final); then nothing is left.
    proc = _setpriv("run", "--job", str(job), "-q")
    assert proc.returncode == 0 and "done: 2 documents, 2 pages (2 errors)" in proc.stdout, proc.stdout
    proc = _setpriv("run", "--job", str(job), "-q")
    assert "nothing to do" in proc.stdout, proc.stdout
    compact(Store(str(out)))
    after = read_pages(str(out)).collect()
    assert after.height == sum(len(v) for v in expected.values())
    assert sorted(after.filter(pl.col("error_type") == "timeout")["attempts"]) == [2, 2]


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="needs setpriv (util-linux)")
def test_an_out_that_cannot_be_written_is_a_configuration_error(tmp_path):
    text_pdf(tmp_path / "a.pdf", 1)
    out = tmp_path / "out"
    out.mkdir(mode=0o555)
    proc = _setpriv("run", str(tmp_path / "a.pdf"), str(out), "--engine", "textlayer", "-q")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and "permission denied" in proc.stderr.lower() and "writable" in proc.stderr


def test_a_full_disk_stops_the_run_and_its_record_says_failed(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    mount = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48k", "tmpfs", str(out)], capture_output=True)
    if mount.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {mount.stderr.decode().strip()}")
    try:
        text_corpus(tmp_path / "src", documents=2, pages=600)  # parts of ~100 kB: above 48 kB
        proc = run_cli("run", str(tmp_path / "src"), str(out), "--engine", "textlayer", "-q")
        assert proc.returncode == 1, proc.stderr
        assert proc.stderr.count("\n") == 1 and "No space left" in proc.stderr, proc.stderr
        (record,) = (out / "_runs").glob("*.json")
        assert json.loads(record.read_text())["status"] == "failed"
        assert not list(out.glob("pages/**/.*.tmp")) and not (out / "_done").exists()
    finally:
        subprocess.run(["umount", str(out)], check=True)


def test_the_cpu_engines_warnings_reach_a_log_without_colour_codes(tmp_path):
    """rapidocr logs through colorlog; a batchocr command whose stderr is not a
    terminal (a pod's log) sets NO_COLOR, which colorlog honours. Without the
    command, the same warning is coloured: the check can fail."""
    out = tmp_path / "out"
    text_pdf(tmp_path / "a.pdf", 1)
    run_cli("run", str(tmp_path / "a.pdf"), str(out), "--engine", "textlayer", "-q", check=True)
    warn = "from rapidocr.utils.log import logger; logger.warning('the text detection result is empty')"
    env = {k: v for k, v in os.environ.items() if k != "NO_COLOR"}

    def stderr_of(code: str) -> str:
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                              timeout=120).stderr

    assert "\x1b[" in stderr_of(warn)
    logged = stderr_of(f"from batchocr.cli import main; main(['status', {str(out)!r}], standalone_mode=False); {warn}")
    assert "[WARNING]" in logged and "\x1b[" not in logged, repr(logged)


def _cpu_s(pid: int) -> float:
    """Seconds of CPU a process has used (user and system); 0 for one that is gone."""
    fields = procstat.fields(pid)  # utime and stime: the stat file's 14th and 15th fields
    return 0.0 if fields is None else (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_a_render_worker_killed_on_a_page_costs_that_page_through_the_cli(tmp_path):
    """The OOM killer takes the worker while it is on page 2 (which hangs: the worker
    reads the document's pages for its outline first, so it is surely there once it
    has spent a few seconds of CPU, where pages 0 and 1 take milliseconds): page 2 is
    a renderer_crashed row, a fresh worker reads pages 0, 1, 3 and 4, the run exits 0."""
    src = tmp_path / "src"
    src.mkdir()
    texts = hang_pdf(src / "doc.pdf", pages=5, hang_at=(2,))
    out = tmp_path / "out"
    job = write_job(tmp_path, src, out, render={"workers": 1, "batch_pages": 1, "timeout_s": 600},
                    commit={"every_pages": 1, "every_seconds": 0.1})
    proc = start(job, ms_per_page=0)
    deadline = time.monotonic() + HANG_S
    while not (workers := render_workers(proc.pid)) or _cpu_s(workers[0]) < 3:
        assert proc.poll() is None and time.monotonic() < deadline, "the worker never reached page 2"
        time.sleep(0.05)
    (worker,) = workers
    os.kill(worker, signal.SIGKILL)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 0, stderr
    rows = read_pages(str(out)).collect().sort("page_index")
    assert rows.select("page_index", "error_type").rows() == [
        (0, None), (1, None), (2, "renderer_crashed"), (3, None), (4, None)]
    assert "page 2: the render worker died (exit code -9)" in rows["error_message"][2]
    assert rows["text"][4] == texts[4].strip()

"""`batchocr compact` while runs and `status` use the same shard: compaction commits its
file, then deletes the parts it replaced; a reader that listed those parts reads the
compacted file instead, and a writer starting meanwhile leaves compaction's staged file alone."""

import json
import os
import time

import pyarrow as pa
import pytest

from batchocr import schema
from batchocr.compact import compact_shard
from batchocr.errors import StorageError
from batchocr.sink import PartWriter, committed_keys
from batchocr.spec import CommitSpec
from batchocr.storage import STALE_TEMP_S, Store
from conftest import run_cli
from corpus import text_corpus


def _rows(doc: str, n: int = 2) -> pa.Table:
    return pa.Table.from_pylist([
        {"doc_id": doc, "source_uri": f"file:///{doc}", "source_etag": "e", "page_index": i, "page_count": n,
         "text": f"page {i}", "finish_reason": "stop", "run_id": "r"} for i in range(n)
    ], schema=schema.PAGE_TABLE)


def _shard_of_three_parts(tmp_path) -> Store:
    store = Store(str(tmp_path))
    writer = PartWriter(store, 0, "r", CommitSpec(every_pages=1))
    for doc in ("a", "b", "c"):
        writer.add(_rows(doc))
    assert len(writer.parts) == 3
    return store


def _sorted(keys: pa.Table) -> list[tuple]:
    return sorted(zip(*keys.select(["doc_id", "page_index", "run_id"]).to_pydict().values()))


def test_a_reader_whose_listed_parts_compaction_deletes_reads_the_compacted_file(tmp_path):
    store = _shard_of_three_parts(tmp_path)
    before = _sorted(committed_keys(store, 0))
    listed, real_find, compacted = [], store.find, []

    def find(rel, suffix=""):  # the reader lists the 3 parts; compaction then replaces them, before any read
        parts = real_find(rel, suffix)
        listed.append(parts)
        if len(listed) == 1:
            compacted.append(compact_shard(store, 0))
        return parts

    store.find = find
    keys = committed_keys(store, 0)
    assert compacted[0].parts_before == 3 and len(listed[0]) == 3
    assert len(real_find("pages/shard-00000")) == 1  # the compacted file alone
    assert _sorted(keys) == before  # every row once: read from the compacted file


def test_parts_that_keep_vanishing_are_one_storage_error(tmp_path):
    store = _shard_of_three_parts(tmp_path)

    def gone(rel, columns):
        raise FileNotFoundError(rel)

    store.read_parquet = gone
    with pytest.raises(StorageError, match="kept disappearing"):
        committed_keys(store, 0)


def test_a_writer_starting_while_compaction_stages_its_file_leaves_that_file(tmp_path, monkeypatch):
    """A run's PartWriter clears the shard's stale temps: only stale ones (a killed writer's,
    STALE_TEMP_S old), not compaction's file being written (nor another live writer's)."""
    store = _shard_of_three_parts(tmp_path)
    staging = tmp_path / "_tmp"
    staging.mkdir()
    stale = staging / "pages__shard-00000__part-r-00009.parquet.0badc0de.tmp"  # left by a killed run
    stale.write_bytes(b"half")
    old = time.time() - STALE_TEMP_S - 60
    os.utime(stale, (old, old))
    real_fsync, seen = os.fsync, []

    def fsync(fd):  # compaction's temp is written: a run starts on the shard now
        seen.append(sorted(os.listdir(staging)))
        PartWriter(store, 0, "r2", CommitSpec())
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    done = compact_shard(store, 0)
    assert len(seen) == 1 and len(seen[0]) == 2  # the stale temp and compaction's
    assert done.parts_before == 3 and done.rows_after == 6
    assert [p.rsplit("/", 1)[1][:13] for p in store.find("pages/shard-00000")] == ["part-compact-"]
    assert not staging.exists()  # the stale temp went, then the folder with compaction's rename


def test_a_run_that_fails_reading_its_shard_says_failed_in_its_record(tmp_path, monkeypatch):
    """A failure after the run record is written (here: the shard's committed keys cannot be
    read) leaves the record "failed", not "running" for good."""
    from batchocr import shard

    src, out = tmp_path / "src", tmp_path / "out"
    text_corpus(src, documents=1, pages=1)

    def broken(*args):
        raise StorageError("out/pages/shard-00000: reading: OSError: broken")

    monkeypatch.setattr(shard, "committed_keys", broken)
    proc = run_cli("run", str(src), str(out), "--engine", "textlayer", "-q")
    assert proc.returncode == 1 and "broken; committed work is intact" in proc.stderr
    [record] = [json.loads(p.read_text()) for p in (out / "_runs").iterdir()]
    assert record["status"] == "failed" and record["finished_at"]


def test_a_run_whose_parts_compaction_replaced_before_its_end_writes_its_done_marker(tmp_path, monkeypatch):
    """`batchocr compact` beside a run (README: parts a run commits meanwhile are left alone,
    or compacted): a run that finished while compaction replaced its parts read them again for
    the done-marker and ended in a FileNotFoundError traceback, exit 1, no marker."""
    from batchocr import runner

    src = tmp_path / "src"
    text_corpus(src, documents=4, pages=2)
    out = tmp_path / "out"
    real_end = runner._end

    def end(failing, stop, pool, record, write, *args):  # every part committed, then a compaction before the marker
        real_end(failing, stop, pool, record, write, *args)
        assert len(write.parts) >= 2
        compact_shard(Store(str(out)), 0)

    monkeypatch.setattr(runner, "_end", end)
    spec = tmp_path / "job.yaml"
    spec.write_text(f"source: {src}\nout: {out}\nengine: textlayer\ncommit: {{every_pages: 2}}\n")
    proc = run_cli("run", "--job", str(spec), "-q")
    assert proc.returncode == 0, proc.stderr
    marker = json.loads((out / "_done" / "shard-00000.json").read_text())
    assert marker["pages"] == 8 and marker["error_pages"] == 0
    assert len(list((out / "pages" / "shard-00000").glob("*.parquet"))) == 1  # the compacted file


def test_a_part_file_that_is_not_parquet_stops_status_and_a_run_in_one_line(tmp_path):
    """Not batchocr's (a stray copy) or damaged: a systemic fault of OUT, named, exit 1, and
    what to do; not a pyarrow traceback. report, eval and export (polars reads their table,
    and does not say which file) named no part."""
    src = tmp_path / "src"
    text_corpus(src, documents=1, pages=2)
    out = tmp_path / "out"
    run_cli("run", str(src), str(out), "--engine", "textlayer", "-q", check=True)
    (bad,) = list((out / "pages" / "shard-00000").glob("*.parquet"))
    bad.write_bytes(b"garbage, not parquet" * 10)
    for args in (["status", str(out)], ["run", str(src), str(out), "--engine", "textlayer", "-q"],
                 ["report", str(out)], ["eval", str(out), "--truth", str(src)], ["export", str(out), str(tmp_path / "x")]):
        proc = run_cli(*args)
        assert proc.returncode == 1, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr, proc.stderr
        assert f"{bad.name}: not a readable part file" in proc.stderr and "move it out of OUT" in proc.stderr


@pytest.mark.parametrize("which, content, commands, hint", [
    ("_producer.json", b"[1,2", ["report", "compact", "run"], "takes OUT's settings from its latest run record"),
    ("_runs/*.json", b'{"run_id": "trunc', ["status", "report", "compact", "run"], "a past run's record"),
    ("_runs/*.json", b"null", ["status", "report", "run"], "a past run's record"),
    ("_done/*.json", b"\xff\xfe not json", ["status", "run"], "the next run checks the shard again"),
    ("_done/*.json", b"[]", ["status", "run"], "the next run checks the shard again"),
])
def test_a_state_file_of_out_that_is_not_batchocrs_json_stops_each_command_in_one_line(
        tmp_path, which, content, commands, hint):
    """OUT's JSON files (run records, done-markers, _producer.json) damaged or replaced: every
    command that reads them says which file, in one line, and what moving it out costs
    (exit 1, as for a part file that is not Parquet); a JSONDecodeError or AttributeError
    traceback before."""
    src = tmp_path / "src"
    text_corpus(src, documents=1, pages=2)
    out = tmp_path / "out"
    run_cli("run", str(src), str(out), "--engine", "textlayer", "-q", check=True)
    (bad,) = out.glob(which)
    bad.write_bytes(content)
    for command in commands:
        args = {"run": ["run", str(src), str(out), "--engine", "textlayer", "-q"]}.get(command, [command, str(out)])
        proc = run_cli(*args)
        assert proc.returncode == 1, (command, proc.stdout, proc.stderr)
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in proc.stderr, (command, proc.stderr)
        rel = bad.relative_to(out).as_posix()
        assert f"{rel}: not readable as batchocr writes it" in lines[0] and hint in lines[0], (command, lines)


def test_a_damaged_plan_stops_a_run_in_one_line(tmp_path):
    src = tmp_path / "src"
    text_corpus(src, documents=2, pages=1)
    out = tmp_path / "out"
    run_cli("plan", str(src), str(out), "--shards", "2", check=True)
    for rel, content in (("_plan/shard-00001.parquet", b"not parquet"), ("_plan/plan.json", b'{"shards": 2}')):
        (out / rel).write_bytes(content)
        proc = run_cli("run", str(src), str(out), "--engine", "textlayer", "--shard", "1/2", "-q")
        assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
        assert f"{rel}: not readable as batchocr writes it" in proc.stderr, proc.stderr
        assert "run `batchocr plan` again" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_a_plan_missing_a_shard_file_stops_each_command_in_one_line(tmp_path):
    """_plan/plan.json there, one of its shard files gone (deleted by hand, an OUT copied in
    part): status, run, plan and export were a FileNotFoundError traceback, exit 1, where a
    shard file that is not Parquet is one line naming it and what to do."""
    src = tmp_path / "src"
    text_corpus(src, documents=2, pages=1)
    out = tmp_path / "out"
    run_cli("plan", str(src), str(out), "--shards", "2", check=True)
    for i in range(2):
        run_cli("run", str(src), str(out), "--engine", "textlayer", "--shard", f"{i}/2", "-q", check=True)
    (out / "_plan" / "shard-00000.parquet").unlink()
    for args in (["status", str(out)], ["run", str(src), str(out), "--engine", "textlayer", "--shard", "0/2", "-q"],
                 ["plan", str(src), str(out), "--shards", "2"], ["export", str(out), str(tmp_path / "x")]):
        proc = run_cli(*args)
        assert proc.returncode == 1 and "Traceback" not in proc.stderr, (args, proc.stderr)
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and "_plan/shard-00000.parquet: not readable as batchocr writes it" in lines[0], lines
        assert "run `batchocr plan` again" in lines[0], lines
        assert "rerun to resume" not in lines[0], lines  # a rerun alone meets the same file
    assert not any((tmp_path / "x").iterdir())  # export stopped before its first file


def test_out_given_as_a_file_is_a_usage_error_for_every_reader(tmp_path):
    """status, report, eval and export said 'listing: NotADirectoryError', exit 1 ('retrying
    may help'), where run and compact said exit 2."""
    afile = tmp_path / "afile"
    afile.write_text("hi")
    truth = tmp_path / "truth"
    truth.mkdir()
    for args in (["status", str(afile)], ["report", str(afile)], ["eval", str(afile), "--truth", str(truth)],
                 ["export", str(afile), str(tmp_path / "dest")]):
        proc = run_cli(*args)
        assert proc.returncode == 2, (args, proc.stderr)
        assert "a file stands where a folder should be" in proc.stderr and "Traceback" not in proc.stderr


def test_the_page_table_of_an_out_named_like_a_pattern_reads_whole(tmp_path):
    """polars took the parts' paths as glob patterns: an OUT named `run[1]` matched nothing,
    and report and export said 0 pages with exit 0."""
    src = tmp_path / "src"
    text_corpus(src, documents=2, pages=2)
    out = tmp_path / "run[1]?"
    run_cli("run", str(src), str(out), "--engine", "textlayer", "-q", check=True)
    report = json.loads(run_cli("report", str(out), "--json", check=True).stdout)
    assert report["pages"] == 4
    assert "exported 2 documents, 4 pages" in run_cli("export", str(out), str(tmp_path / "docs"), check=True).stdout


def test_a_part_compacted_away_while_polars_reads_it_is_one_line(tmp_path):
    """read_pages lists the parts; polars reads them later, when a frame is collected."""
    from batchocr.table import read_pages, reading

    out = tmp_path / "out"
    for n in (1, 2):  # a second document, a second run: two parts
        text_corpus(tmp_path / "src", documents=n, pages=1)
        run_cli("run", str(tmp_path / "src"), str(out), "--engine", "textlayer", "-q", check=True)
    pages = read_pages(str(out))
    parts = sorted((out / "pages").rglob("*.parquet"))
    assert len(parts) == 2
    parts[0].unlink()
    with pytest.raises(StorageError, match="a part file went away while it was read"):
        with reading(str(out)):
            pages.collect()


def _many_parts(tmp_path, docs: int = 150) -> Store:
    store = Store(str(tmp_path))
    writer = PartWriter(store, 0, "r", CommitSpec(every_pages=1))
    for k in range(docs):
        writer.add(_rows(f"d{k:03d}", 4))
    return store


def test_two_compactions_at_once_leave_one_row_a_page(tmp_path):
    """Two `batchocr compact` of one OUT at once (a CronJob's overlapping with a person's):
    both exited 0 and every row was there twice, each having committed the whole shard and
    deleted the same parts. The one that finds the shard claimed leaves it to the other."""
    import polars as pl

    import subprocess
    import sys

    _many_parts(tmp_path)
    procs = [subprocess.Popen([sys.executable, "-m", "batchocr.cli", "compact", str(tmp_path)], text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for _ in range(2)]
    results = [p.communicate(timeout=120) + (p.returncode,) for p in procs]
    assert [r[2] for r in results] == [0, 0], results
    rows = pl.read_parquet(str(tmp_path / "pages" / "**" / "*.parquet"))
    assert rows.height == 600 and rows.select("doc_id", "page_index").n_unique() == 600, results
    said = "".join(r[0] + r[1] for r in results)
    assert said.count("-> 1 part") + said.count("left to another batchocr compact") == 2, said
    assert not (tmp_path / "_compact").exists()


def test_a_claimed_shard_is_left_to_its_compaction_until_that_is_over(tmp_path, monkeypatch):
    import datetime as dt
    import socket
    import subprocess
    import sys

    from batchocr import compact, procstat

    store = _shard_of_three_parts(tmp_path)
    claim = tmp_path / "_compact" / "shard-00000.json"
    claim.parent.mkdir()
    now = dt.datetime.now(dt.UTC)
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        for held, busy in [
            ({"host": socket.gethostname(), "pid": alive.pid, "started": procstat.started(alive.pid)}, True),
            ({"host": socket.gethostname(), "pid": alive.pid, "started": "1"}, False),  # its pid reused since
            ({"host": "another-pod", "pid": 1}, True),  # on another machine: its word stands
            ({"host": "another-pod", "pid": 1, "age": compact.CLAIM_STALE_S + 60}, False),  # but not for ever
        ]:
            since = now - dt.timedelta(seconds=held.pop("age", 0))
            claim.write_text(json.dumps(held | {"since": since.isoformat()}))
            parts = store.find("pages/shard-00000")
            done = compact.compact_shard(store, 0)
            if busy:
                assert isinstance(done, compact.Busy) and f"pid {held['pid']}" in done.holder, done
                assert store.find("pages/shard-00000") == parts and claim.exists()
            else:
                assert isinstance(done, compact.Compacted) and not claim.exists(), done
                claim.parent.mkdir(exist_ok=True)
        alive.kill()
        alive.wait()
        claim.parent.mkdir(exist_ok=True)  # a compaction here that died (kill -9): its pid is free
        claim.write_text(json.dumps({"host": socket.gethostname(), "pid": alive.pid, "since": now.isoformat()}))
        assert isinstance(compact.compact_shard(_many_parts(tmp_path, 1), 0), compact.Compacted)
        assert not claim.exists()
    finally:
        alive.kill()


def test_a_claim_made_as_another_compaction_removes_the_claims_folder_is_made_all_the_same(tmp_path, monkeypatch):
    """Two `batchocr compact` of one OUT, each on its shard: one releasing its claim removes the
    then empty OUT/_compact between the other's makedirs and its create of its own claim. That
    create failed (FileNotFoundError: a traceback, exit 1); it makes the folder again, as a part
    file's staging folder is made again (storage.local._create)."""
    store = _shard_of_three_parts(tmp_path)
    real, raced = os.makedirs, []

    def makedirs(path, *args, **kwargs):
        real(path, *args, **kwargs)
        if path.endswith("/_compact") and not raced:  # the other compaction's release: its folder, empty, goes
            raced.append(path)
            os.rmdir(path)

    monkeypatch.setattr(os, "makedirs", makedirs)
    done = compact_shard(store, 0)
    assert raced and done.parts_before == 3 and done.rows_after == 6
    assert not (tmp_path / "_compact").exists()


def test_a_claim_whose_write_fails_is_not_left_empty_to_hold_the_shard_for_ever(tmp_path, monkeypatch):
    """A full disk: the claim's O_EXCL create made the file, its write failed (ENOSPC). The empty
    file stayed, and an empty claim is one being written (compact._gone), so every later
    `batchocr compact` left the shard to a compaction that was not there, past the hour after
    which a claim is taken over (it has no `since`). The failed claim is removed."""
    import errno

    from batchocr import compact

    store = _shard_of_three_parts(tmp_path)
    real = os.fdopen

    class Full:
        def __init__(self, fd, mode):
            self.f = real(fd, mode)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def write(self, data):
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fdopen", Full)
    with pytest.raises(StorageError, match="No space left on device"):
        compact.compact_shard(store, 0)
    monkeypatch.setattr(os, "fdopen", real)
    assert not (tmp_path / "_compact" / "shard-00000.json").exists()
    done = compact.compact_shard(store, 0)  # space again: the shard is compacted, not left to no one
    assert isinstance(done, compact.Compacted) and done.parts_before == 3, done

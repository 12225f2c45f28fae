"""The plan: a partition of the container, balanced by size, stable when extended;
status and compact read back what runs left."""

import json
import random
import shutil

import numpy as np
import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batchocr import planner, read_pages
from batchocr.errors import ConfigError
from batchocr.plan import make_plan, planned_documents, read_plan
from batchocr.sources import DocRef
from batchocr.status import status
from batchocr.storage import Store
from conftest import SAMPLES, run_cli
from corpus import text_corpus, text_pdf

docs_strategy = st.lists(
    st.builds(DocRef, uri=st.text(min_size=1, max_size=20), size=st.integers(0, 10**9), etag=st.just("e")),
    unique_by=lambda d: d.uri, max_size=150,
)


def balance(docs: list[DocRef], shards: int, keep: dict[str, int] | None = None,
            batch: int = 1000) -> dict[int, list[DocRef]]:
    """The planning engine's placing (planner.assign) of `docs`, `batch` rows a frame, as
    {shard: its documents}."""
    frames = [pl.DataFrame({"rel": [d.uri for d in docs[i:i + batch]], "size": [d.size for d in docs[i:i + batch]],
                            "etag": [d.etag for d in docs[i:i + batch]], "mtime": [None] * len(docs[i:i + batch]),
                            "archived": [False] * len(docs[i:i + batch])}, schema=planner.ROWS)
              for i in range(0, len(docs), batch)]
    kept = [pl.DataFrame({"rel": list(keep), "shard": list(keep.values())}, schema=planner.KEPT)] if keep else []
    placed = planner.assign(frames, shards, kept)
    by_uri = {d.uri: d for d in docs}
    out: dict[int, list[DocRef]] = {i: [] for i in range(shards)}
    for rel, shard in zip(placed["rel"].to_list(), placed["shard"].to_list()):
        out[shard].append(by_uri[rel])
    return out


@settings(max_examples=200, deadline=None)
@given(docs_strategy, st.integers(1, 40))
def test_plan_shards_partition_any_list(docs, n):
    plan = balance(docs, n)
    assert sorted(plan) == list(range(n))
    assert sorted(d.uri for shard in plan.values() for d in shard) == sorted(d.uri for d in docs)


@settings(max_examples=100, deadline=None)
@given(docs_strategy, st.integers(1, 16))
def test_plan_is_balanced_by_size(docs, n):
    """LPT's bound: no shard exceeds the mean load by more than the largest document."""
    plan = balance(docs, n)
    loads = [sum(d.size for d in plan[i]) for i in range(n)]
    largest = max((d.size for d in docs), default=0)
    assert max(loads) <= sum(loads) / n + largest


@settings(deadline=None)
@given(docs_strategy, docs_strategy, st.integers(1, 16))
def test_extending_a_plan_keeps_every_planned_document_on_its_shard(old, new, n):
    first = balance(old, n)
    keep = {d.uri: i for i, shard in first.items() for d in shard}
    second = balance(old + [d for d in new if d.uri not in keep], n, keep)
    assert {d.uri: i for i, shard in second.items() for d in shard if d.uri in keep} == keep


@pytest.mark.parametrize("spill", [False, True])
def test_a_plan_that_spills_is_balanced_partitioned_and_independent_of_the_order(monkeypatch, spill):
    """Past STEP_ROWS rows the engine spills to hash buckets and deals a step at a time onto
    one load array: still every document once, two shards within the largest document, kept
    documents where they were, and the same plan whatever order the documents came in."""
    if spill:
        monkeypatch.setattr(planner, "STEP_ROWS", 300)
        monkeypatch.setattr(planner, "BUCKETS", 16)
    tmp_spills = []
    append = planner.Files.append
    monkeypatch.setattr(planner.Files, "append", lambda self, *a: tmp_spills.append(1) or append(self, *a))
    rng = np.random.default_rng(5)
    docs = [DocRef(uri=f"d/{i:05d}.pdf", size=int(s), etag="e") for i, s in enumerate(rng.lognormal(12, 1, 3000))]
    plan = balance(docs, 7, batch=250)
    assert sorted(d.uri for ds in plan.values() for d in ds) == sorted(d.uri for d in docs)
    loads = [sum(d.size for d in plan[i]) for i in range(7)]
    assert max(loads) - min(loads) <= max(d.size for d in docs)
    shuffled = docs[:]
    random.Random(1).shuffle(shuffled)
    twice = shuffled + shuffled[:500]  # names given twice: planned once
    assert {i: sorted(d.uri for d in ds) for i, ds in balance(twice, 7, batch=333).items()} == \
        {i: sorted(d.uri for d in ds) for i, ds in plan.items()}
    assert bool(list(tmp_spills)) == spill  # the rows went to disk, or stayed in memory
    keep = {d.uri: i for i, ds in plan.items() for d in ds[:50]}
    more = docs + [DocRef(uri=f"n/{i:05d}.pdf", size=int(s), etag="e") for i, s in enumerate(rng.lognormal(12, 1, 900))]
    again = balance(more, 7, keep, batch=400)
    assert {d.uri: i for i, ds in again.items() for d in ds if d.uri in keep} == keep
    assert sum(map(len, again.values())) == len(more)


def test_empty_documents_are_spread_not_piled_on_one_shard():
    """Of equal loads the shard of fewest documents: 1,000 empty files over 10 shards are 100 a
    shard (by load alone every one went to shard 0)."""
    plan = balance([DocRef(uri=f"{i:04d}.pdf", size=0, etag="e") for i in range(1000)], 10)
    assert [len(plan[i]) for i in range(10)] == [100] * 10


def test_a_run_of_other_shards_than_the_plan_is_refused_before_it_writes(tmp_path):
    """A plan of 2 shards and `run --shard 0/3`: exit 2 naming the plan's count, from
    the configuration alone: no _producer.json and no run record left in OUT."""
    src, out = tmp_path / "src", tmp_path / "out"
    text_corpus(src, documents=2, pages=1)
    run_cli("plan", str(src), str(out), "--shards", "2", check=True)
    proc = run_cli("run", str(src), str(out), "--engine", "textlayer", "--shard", "0/3", "-q")
    assert proc.returncode == 2 and "plan of 2 shards: run with --shard I/2" in proc.stderr
    assert sorted(p.name for p in out.iterdir()) == ["_plan"]


def test_plan_on_disk_then_run_each_shard_then_status_and_compact(tmp_path):
    src = tmp_path / "src"
    text_corpus(src, documents=12, pages=2)
    out = tmp_path / "out"
    proc = run_cli("plan", str(src), str(out), "--shards", "3", check=True)
    assert "planned 12 documents" in proc.stdout and "3 shards" in proc.stdout
    info = read_plan(Store(str(out)))
    assert info.shards == 3 and info.documents == 12
    planned = [[d.uri for d in planned_documents(Store(str(out)), i)] for i in range(3)]
    assert sorted(u for p in planned for u in p) == sorted(f"file://{src}/doc{i:05d}.pdf" for i in range(12))

    # A blob added after planning waits for the next plan.
    text_corpus(src / "late", documents=1, pages=1)
    run_cli("run", str(src), str(out), "--engine", "textlayer", "--shard", "0/3", "-q", check=True)
    proc = run_cli("status", str(out), check=True)
    assert "1/3 shards done, 0 partial, 2 not started; 8 pages" in proc.stdout
    for i in (1, 2):
        run_cli("run", str(src), str(out), "--engine", "textlayer", "--shard", f"{i}/3", "-q", check=True)
    pages = read_pages(str(out)).collect()
    assert pages.height == 24 and not pages["source_uri"].str.contains("/late/").any()
    assert [r.state for r in status(Store(str(out)))] == ["done"] * 3

    # The plan's shard count is the one to use.
    proc = run_cli("run", str(src), str(out), "--engine", "textlayer", "-q")
    assert proc.returncode == 2 and "plan of 3 shards" in proc.stderr
    # Planning again places the new blob and leaves the others where they were.
    run_cli("plan", str(src), str(out), "--shards", "3", check=True)
    replanned = [[d.uri for d in planned_documents(Store(str(out)), i)] for i in range(3)]
    assert all(set(p) <= set(r) for p, r in zip(planned, replanned))
    assert sum(map(len, replanned)) == 13
    with pytest.raises(ConfigError, match="cannot change"):
        make_plan(Store(str(src)), Store(str(out)), 4)


def test_status_of_a_partial_shard_and_compact_dedupes(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    shutil.copy(SAMPLES / "report.pdf", src / "report.pdf")
    out = tmp_path / "out"
    run_cli("run", str(src), str(out), "--engine", "textlayer", "-q", check=True)
    # A second run with a changed document (new etag) writes its pages again.
    (src / "report.pdf").write_bytes((SAMPLES / "report.pdf").read_bytes() + b"\n")
    run_cli("run", str(src), str(out), "--engine", "textlayer", "-q", check=True)
    assert read_pages(str(out)).collect().height == 6
    # The done-marker counts what compaction keeps: the latest version's pages, once each.
    marker = json.loads((out / "_done" / "shard-00000.json").read_text())
    assert (marker["pages"], marker["error_pages"]) == (3, 0)
    (out / "_done" / "shard-00000.json").unlink()
    proc = run_cli("status", str(out), check=True)
    assert "partial" in proc.stdout and "0/1 shards done, 1 partial" in proc.stdout
    # its pages as compaction keeps them: 3, not the 6 rows (the marker and report say 3 too)
    assert "; 3 pages, 0 error pages" in proc.stdout, proc.stdout

    proc = run_cli("compact", str(out), check=True)
    assert "shard 0: 2 parts, 6 rows -> 1 part, 3 rows" in proc.stdout
    pages = read_pages(str(out)).collect()
    assert pages.height == 3 and pages["source_etag"].n_unique() == 1
    assert len(list((out / "pages" / "shard-00000").glob("*.parquet"))) == 1
    proc = run_cli("compact", str(out), check=True)  # idempotent
    assert "1 part, 3 rows -> 1 part, 3 rows" in proc.stdout


def test_a_done_shard_that_a_new_plan_gives_documents_is_partial_until_it_has_their_rows(tmp_path):
    """Planning again over finished shards gave each new documents: `status` said "2/2 shards
    done" with 6 of 12 planned documents unread, from the done-markers alone (a pod that ran
    with the old plan writes its marker after `plan` all the same). Done is the marker and a
    row of every planned document's planned version."""
    src, out = tmp_path / "src", tmp_path / "out"
    text_corpus(src, documents=6, pages=1)
    run_cli("plan", str(src), str(out), "--shards", "2", check=True)

    def run_all():
        for i in range(2):
            run_cli("run", str(src), str(out), "--engine", "textlayer", "-q", "--shard", f"{i}/2", check=True)

    run_all()
    text_corpus(src / "new", documents=6, pages=1)
    run_cli("plan", str(src), str(out), "--shards", "2", check=True)
    assert len(list((out / "_done").iterdir())) == 2  # the markers of the old plan's runs
    proc = run_cli("status", str(out), check=True)
    assert "0/2 shards done, 2 partial, 0 not started; 6 pages" in proc.stdout, proc.stdout
    run_all()
    assert [r.state for r in status(Store(str(out)))] == ["done"] * 2
    # A changed document (a new etag in the new plan) is not done either: its shard's rows are of the old one.
    text_pdf(src / "doc00000.pdf", 1, seed=99)
    run_cli("plan", str(src), str(out), "--shards", "2", check=True)
    # the changed file, not new/doc00000.pdf, which the plan may give the other shard
    changed = next(i for i in range(2)
                   if any(d.uri.endswith("/src/doc00000.pdf") for d in planned_documents(Store(str(out)), i)))
    assert [r.state for r in status(Store(str(out)))] == ["partial" if i == changed else "done" for i in range(2)]


def test_planning_an_out_with_output_keeps_its_documents_on_their_shard(tmp_path):
    """Documents done by runs without a plan stay on the shard that holds their rows:
    compaction dedupes within a shard, so one redone on another shard would stay twice."""
    src, out = tmp_path / "src", tmp_path / "out"
    text_corpus(src, documents=6, pages=2)
    run_cli("run", str(src), str(out), "--engine", "textlayer", "-q", check=True)  # 0/1: all on shard 0
    text_corpus(src / "new", documents=2, pages=1)
    run_cli("plan", str(src), str(out), "--shards", "2", check=True)
    planned = [{d.uri for d in planned_documents(Store(str(out)), i)} for i in range(2)]
    assert planned[0] >= {f"file://{src}/doc{i:05d}.pdf" for i in range(6)}
    assert len(planned[0] | planned[1]) == 8
    proc = run_cli("run", str(src), str(out), "--engine", "textlayer", "-q", "--shard", "0/2", check=True)
    assert "nothing to do (6 documents already done)" in proc.stdout
    run_cli("run", str(src), str(out), "--engine", "textlayer", "-q", "--shard", "1/2", check=True)
    run_cli("compact", str(out), check=True)
    pages = read_pages(str(out)).collect()
    assert pages.height == 6 * 2 + 2 and pages.select("doc_id", "page_index").n_unique() == 14

    # Without that plan, a plan of fewer shards than OUT's output has would move documents off theirs.
    shutil.rmtree(out / "_plan")
    with pytest.raises(ConfigError, match=r"output in shard 1: a plan of 1 shards .* --shards 2"):
        make_plan(Store(str(src)), Store(str(out)), 1)


def test_status_of_a_folder_no_run_has_written_says_so(tmp_path):
    """A mistyped OUT (the container's root, a parent folder) read as a job not started yet:
    exit 0 and 'not started', nothing to say the path may be wrong."""
    src, out = tmp_path / "src", tmp_path / "out"
    text_corpus(src, documents=1, pages=1)
    proc = run_cli("status", str(tmp_path))
    assert proc.returncode == 0 and "1 not started" in proc.stdout
    assert f"nothing of batchocr's under {tmp_path} yet" in proc.stderr
    run_cli("plan", str(src), str(out), "--shards", "2", check=True)  # planned, no run yet: no such line
    proc = run_cli("status", str(out))
    assert proc.returncode == 0 and "2 not started" in proc.stdout and proc.stderr == ""


def test_an_out_planned_but_not_run_yet_reads_as_an_empty_table(tmp_path):
    """`batchocr plan` then, before any pod has committed a row (vLLM still loading, or the Job
    not started), compact, report and export were exit 2, 'no page table under OUT', as for a
    folder batchocr never wrote, while status read the plan. A planned OUT is batchocr's: a table
    of no rows, and export says how many planned documents have no rows yet."""
    from batchocr import read_pages

    src, out = tmp_path / "src", tmp_path / "out"
    text_corpus(src, documents=3, pages=1)
    run_cli("plan", str(src), str(out), "--shards", "2", check=True)
    assert read_pages(str(out)).collect().height == 0
    assert run_cli("compact", str(out), check=True).stdout == f"nothing to compact: no page rows in {out} yet\n"
    assert "documents" in run_cli("report", str(out), check=True).stdout
    proc = run_cli("export", str(out), str(tmp_path / "x"), "--format", "text", check=True)
    assert proc.stdout.startswith("exported 0 documents") and "3 documents of OUT's plan have no rows" in proc.stderr


@pytest.mark.parametrize("out, message", [
    ("/proc/batchocr-plan", "OUT /proc/batchocr-plan: cannot write there (No such file or directory)"),
    ("{tmp}/a-file/plan", "OUT {tmp}/a-file/plan: cannot write there (Not a directory)"),
], ids=["under-proc", "under-a-file"])
def test_plan_into_an_out_it_cannot_write_is_one_line_exit_2(tmp_path, out, message):
    """README, Exit codes: OUT not writable is exit 2, one line. `batchocr plan` into an OUT it
    could not make (under /proc) was a FileNotFoundError traceback at its first shard file, exit 1,
    after listing the whole SOURCE; now it is checked first, as `run` checks it."""
    (tmp_path / "a-file").write_text("not a folder")
    out, message = (x.replace("{tmp}", str(tmp_path)) for x in (out, message))
    proc = run_cli("plan", str(SAMPLES), out, "--shards", "2")
    assert (proc.returncode, proc.stderr) == (2, f"Error: {message}: OUT must be a writable folder\n")

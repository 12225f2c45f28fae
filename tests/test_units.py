"""Fast unit and property tests of the stages' small pieces."""

import os
import subprocess
import sys
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batchocr import schema
from batchocr.engines.rapidocr import join_lines
from batchocr.errors import ConfigError
from batchocr.evaluate import levenshtein, normalise
from batchocr.sharding import shard_of
from batchocr.sink import FIRST_COMMIT_S, PartWriter, Resume, completed, committed_keys, to_parquet
from batchocr.sources import list_documents
from batchocr.spec import CommitSpec, Shard, load_job
from batchocr.storage import STALE_TEMP_S, Store


def _dp_levenshtein(a: str, b: str) -> int:
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1]


@settings(max_examples=300)
@given(st.text(alphabet="abcde ", max_size=90), st.text(alphabet="abcdef ", max_size=90))
def test_levenshtein_matches_the_textbook_dp(a, b):
    assert levenshtein(a, b) == _dp_levenshtein(a, b)


def test_levenshtein_on_long_pages():
    a = "The quick brown fox. " * 200
    b = a.replace("quick", "quack", 3)
    assert levenshtein(a, b) == 3
    assert normalise(" a \n\n b\tc ") == "a b c"


@given(st.lists(st.text(min_size=1, max_size=30), unique=True, max_size=200), st.integers(1, 64))
def test_shards_partition_any_list_of_uris(uris, n):
    shards = [[u for u in uris if shard_of(u, n) == i] for i in range(n)]
    assert sorted(u for s in shards for u in s) == sorted(uris)
    assert all(0 <= shard_of(u, n) < n for u in uris)


def test_a_documents_shard_depends_only_on_its_uri():
    uris = [f"az://scans/{i}.pdf" for i in range(1000)]
    before = {u: shard_of(u, 16) for u in uris}
    more = uris + [f"az://scans/new-{i}.pdf" for i in range(500)]
    assert {u: shard_of(u, 16) for u in more if u in before} == before
    # Roughly balanced: no shard far from 1000/16.
    counts = [sum(1 for u in uris if before[u] == i) for i in range(16)]
    assert min(counts) > 30 and max(counts) < 100


def test_listing_filters_sorts_and_recurses(tmp_path):
    for name in ["b.PDF", "a.png", "sub/c.TIFF", "sub/d.jpeg", "notes.txt", "e.JPG", "sub/deeper/f.tif", "x.docx"]:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"x" * 3)
    docs = list(list_documents(Store(str(tmp_path))))
    names = [d.uri.removeprefix(f"file://{tmp_path}/") for d in docs]
    assert names == ["a.png", "b.PDF", "e.JPG", "sub/c.TIFF", "sub/d.jpeg", "sub/deeper/f.tif"]
    assert all(d.size == 3 and d.etag.startswith("3-") for d in docs)
    assert docs[1].filetype == "pdf"


def test_listing_a_memory_filesystem_and_a_single_file(tmp_path):
    store = Store("memory://scans")
    store.write_atomic("x.pdf", b"%PDF")
    store.write_atomic("y.txt", b"no")
    assert [d.uri for d in list_documents(store)] == ["memory:///scans/x.pdf"]
    (tmp_path / "one.pdf").write_bytes(b"%PDF")
    assert [d.name for d in list_documents(Store(str(tmp_path / "one.pdf")))] == ["one.pdf"]


def test_listing_a_missing_source_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        list(list_documents(Store(str(tmp_path / "nope"))))


def test_job_spec_yaml_with_flag_overrides(tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text(
        "source: s/\nout: o/\nengine: textlayer\nengines:\n  rapidocr: {threads: 2}\n"
        "render: {dpi: 150, workers: 2}\ncommit: {every_pages: 10}\nshard: 1/4\n"
    )
    spec = load_job(job)
    assert (spec.source, spec.engine, spec.render.dpi, spec.commit.every_pages) == ("s/", "textlayer", 150, 10)
    assert spec.shard == Shard(1, 4)
    spec = load_job(job, engine="rapidocr", **{"render.dpi": 300, "out": "o2/"}, shard=Shard(2, 4))
    assert (spec.engine, spec.engine_options, spec.render.dpi, spec.render.workers) == ("rapidocr", {"threads": 2}, 300, 2)
    assert (spec.out, spec.shard) == ("o2/", Shard(2, 4))


@pytest.mark.parametrize("text, match", [
    ("source: s\nout: o\nbogus: 1\n", "unknown key 'bogus'; known: source, out"),
    ("source: s\nout: o\nrender: {dpi: -1}\n", "render.dpi: got -1, expected greater than 0"),
    ("source: s\nout: o\nrender: {colour: 1}\n", "render: unknown key 'colour'"),
    ("source: s\nout: o\nengine: tesseract\n", "engine: got 'tesseract', expected 'rapidocr', 'textlayer' or 'vllm'"),
    ("source: [unclosed\n", "not valid YAML"),
    ("source: s\nout: o\nrender:\n  dpi: 150\n  dpi: 300\n", r"job.yaml:5:3: .*key 'dpi' given twice \(first at line 4\)"),
    ("source: s\nout: o\nshard: 2\n", r"shard: got 2, expected I/N \(e.g. shard: 0/4\)"),
    ("source: s\nout: o\nshard: 4/4\n", r"job.yaml: shard '4/4': shard must be I/N with 0 <= I < N, got 4/4$"),
    ("source: s\nout: o\nshard: '2'\n", r"job.yaml: shard must look like I/N \(e.g. 3/16\), got '2'$"),
    ("source: s\nout: o\nshard: 1/x\n", r"job.yaml: shard '1/x': count: got 'x', expected a valid integer"),
    ("source: s\nout: o\nengines: {textlayer: {min_chars: -3}}\n",
     "engines.textlayer.min_chars: got -3, expected greater than or equal to 0"),
    ("- a list\n", "mapping"),
    ("out: o\n", "no SOURCE"),
])
def test_job_spec_errors_are_clear(tmp_path, text, match):
    job = tmp_path / "job.yaml"
    job.write_text(text)
    with pytest.raises(ConfigError, match=match):
        load_job(job)


def test_vllm_flags_with_another_engine_name_the_flag(tmp_path):
    """--model with the default engine said `engines.rapidocr: unknown key 'model'`, a key the
    user never wrote."""
    with pytest.raises(ConfigError, match=r"^--model --mode: for --engine vllm; this run's engine is rapidocr$"):
        load_job(None, source="s", out="o", engine_options={"model": "m", "mode": "page", "preset": None})
    spec = load_job(None, source="s", out="o", engine="vllm", engine_options={"model": "m"})
    assert spec.engine_options["model"] == "m"
    # no flag given: no engines section made for the engine named (a misspelt one's line had "(and 1 more)")
    with pytest.raises(ConfigError, match=r"engine: got 'rapidocrx', expected 'rapidocr', 'textlayer' or 'vllm'$"):
        load_job(None, source="s", out="o", engine="rapidocrx", engine_options={})


def test_an_engines_section_the_run_does_not_use_needs_no_model(tmp_path):
    """Only the chosen engine's section is used (jobs/example.yaml): `engine: textlayer` with a
    vllm section kept without its model was exit 2, 'engine vllm needs a model'. The section's
    values are still checked; the model is needed where vllm is the run's engine (routing never
    runs vllm: its routed pages go to the textlayer engine)."""
    from batchocr import engines

    job = tmp_path / "job.yaml"
    section = "engines:\n  vllm: {preset: unlimited-ocr, mode: document}\n"
    job.write_text("source: s\nout: o\nengine: textlayer\n" + section)
    assert load_job(job).engines["vllm"] == {"preset": "unlimited-ocr", "mode": "document"}
    job.write_text("source: s\nout: o\nengine: vllm\n" + section)
    assert load_job(job, engine="rapidocr", route="auto").engine == "rapidocr"  # --engine over the file's
    with pytest.raises(ConfigError, match=r"^.*job.yaml: engine vllm needs a model: --model PATH"):
        load_job(job)
    with pytest.raises(ConfigError, match="needs a model"):  # --engine vllm with no section: at the run's start
        engines.settings("vllm", {})
    job.write_text("source: s\nout: o\nengine: textlayer\nengines:\n  vllm: {preset: unlimited-ocr, group_pages: 99}\n")
    with pytest.raises(ConfigError, match="engines.vllm.group_pages: got 99, expected less than or equal to 50"):
        load_job(job)


def test_job_spec_numbers_in_exponent_form_are_numbers(tmp_path):
    """YAML 1.1 (PyYAML) reads `1e3` as text: `every_seconds: 1e3` failed as not a number."""
    job = tmp_path / "job.yaml"
    job.write_text("source: s\nout: o\ncommit: {every_seconds: 1e3, every_pages: 2_000}\nrender: {max_pixels: 4E7}\n")
    with pytest.raises(ConfigError, match="render.max_pixels: got 40000000.0, expected a valid integer"):
        load_job(job)
    job.write_text("source: s\nout: o\ncommit: {every_seconds: 1e3}\nstorage_options: {x: 1e3x}\n")
    spec = load_job(job)
    assert spec.commit.every_seconds == 1000.0 and spec.storage_options == {"x": "1e3x"}


def test_job_spec_merge_keys_read_as_yaml_safe_load_reads_them(tmp_path):
    """A merge key (`<<: *defaults`, or a mapping as here) was exit 2, 'could not
    determine a constructor for the tag tag:yaml.org,2002:merge': the check for a key given twice
    built every key, and a merge key is no value. The keys written beside it win, as in
    yaml.safe_load; a key written twice beside it is still refused."""
    import yaml

    job = tmp_path / "job.yaml"
    text = "source: s\nout: o\ncommit: {every_pages: 10}\nrender:\n  <<: {dpi: 150, workers: 2}\n  dpi: 300\n"
    job.write_text(text)
    spec = load_job(job)
    assert (spec.render.dpi, spec.render.workers, spec.commit.every_pages) == (300, 2, 10)
    assert yaml.safe_load(text)["render"] == {"dpi": 300, "workers": 2}
    job.write_text("source: s\nout: o\nrender:\n  <<: {workers: 2}\n  dpi: 150\n  dpi: 300\n")
    with pytest.raises(ConfigError, match=r"job.yaml:6:3: .*key 'dpi' given twice \(first at line 5\)"):
        load_job(job)


def test_shard_from_env_and_parse():
    assert Shard.from_env({"JOB_COMPLETION_INDEX": "3", "BATCHOCR_SHARDS": "8"}) == Shard(3, 8)
    assert Shard.from_env({}) is None
    with pytest.raises(ConfigError):
        Shard.from_env({"JOB_COMPLETION_INDEX": "9", "BATCHOCR_SHARDS": "8"})
    with pytest.raises(ConfigError, match="I/N"):
        Shard.parse("3")
    with pytest.raises(ConfigError, match="environment: BATCHOCR_SHARDS: got 'eight', expected a valid integer"):
        Shard.from_env({"JOB_COMPLETION_INDEX": "3", "BATCHOCR_SHARDS": "eight"})
    with pytest.raises(ConfigError, match=r"environment: JOB_COMPLETION_INDEX=4 BATCHOCR_SHARDS=4: need 0 <= "):
        Shard.from_env({"JOB_COMPLETION_INDEX": "4", "BATCHOCR_SHARDS": "4"})
    # One variable alone is a mistake (the count alone would be 1: every pod takes every document).
    for have, lack in (("JOB_COMPLETION_INDEX", "BATCHOCR_SHARDS"), ("BATCHOCR_SHARDS", "JOB_COMPLETION_INDEX")):
        with pytest.raises(ConfigError, match=f"environment: {have} is set but {lack} is not"):
            Shard.from_env({have: "3"})


def _rows(n: int, doc: str = "d1", count: int | None = None) -> pa.Table:
    return pa.Table.from_pylist([
        {"doc_id": doc, "source_uri": f"file:///{doc}", "source_etag": "e", "page_index": i,
         "page_count": count if count is not None else n, "text": f"page {i}", "finish_reason": "stop"}
        for i in range(n)
    ], schema=schema.PAGE_TABLE)


def test_part_writer_commits_every_k_pages_and_on_flush(tmp_path):
    store = Store(str(tmp_path))
    writer = PartWriter(store, 3, "run1", CommitSpec(every_pages=5, every_seconds=1e9), clock=lambda: 0)
    writer.add(_rows(4))
    assert writer.parts == []
    writer.add(_rows(2, "d2"))
    assert writer.parts == ["pages/shard-00003/part-run1-00000.parquet"]
    writer.add(_rows(1, "d3"))
    writer.flush()
    assert len(writer.parts) == 2 and writer.rows_committed == 7
    # Nothing but the committed parts in the folder: no temp files left behind.
    assert sorted(os.listdir(tmp_path / "pages/shard-00003")) == ["part-run1-00000.parquet", "part-run1-00001.parquet"]


def test_part_writer_commits_after_t_seconds():
    now = [0.0]
    store = Store("memory://t-seconds")
    writer = PartWriter(store, 0, "r", CommitSpec(every_pages=1000, every_seconds=10), clock=lambda: now[0])
    writer.add(_rows(1))
    assert not writer.parts
    now[0] = 11
    writer.add(_rows(1, "d2"))
    assert len(writer.parts) == 1 and store.exists(writer.parts[0])


def test_part_writer_commits_its_first_part_early():
    now = [0.0]
    store = Store("memory://first-part")
    writer = PartWriter(store, 0, "r", CommitSpec(every_pages=1000, every_seconds=300), clock=lambda: now[0])
    writer.add(_rows(1))
    now[0] = FIRST_COMMIT_S - 1
    writer.add(_rows(1, "d2"))
    assert not writer.parts
    now[0] = FIRST_COMMIT_S + 1  # the first part: after FIRST_COMMIT_S, not every_seconds
    writer.add(_rows(1, "d3"))
    assert len(writer.parts) == 1 and writer.rows_committed == 3
    now[0] = 2 * FIRST_COMMIT_S + 2  # later parts: every_seconds again
    writer.add(_rows(1, "d4"))
    assert len(writer.parts) == 1
    now[0] = FIRST_COMMIT_S + 301
    writer.add(_rows(1, "d5"))
    assert len(writer.parts) == 2


def test_committed_keys_and_completion():
    store = Store("memory://resume")
    writer = PartWriter(store, 0, "r", CommitSpec(every_pages=1))
    writer.add(_rows(3, "whole"))
    writer.add(_rows(2, "half", count=4))
    writer.add(pa.Table.from_pylist([{"doc_id": "bad", "source_etag": "e", "page_index": -1}], schema=schema.PAGE_TABLE))
    done = completed(committed_keys(store, 0))
    assert done == {("whole", "e"): None, ("half", "e"): Resume(frozenset({0, 1})), ("bad", "e"): None}
    assert committed_keys(store, 7).num_rows == 0


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.text(max_size=200), st.sampled_from(["stop", "error", "skipped", "length"]),
                          st.one_of(st.none(), st.integers(0, 2**31 - 1))), max_size=20))
def test_page_rows_round_trip_through_parquet(rows):
    table = pa.Table.from_pylist([
        {"doc_id": "d", "page_index": i, "text": text, "finish_reason": reason, "output_tokens": tokens}
        for i, (text, reason, tokens) in enumerate(rows)
    ], schema=schema.PAGE_TABLE)
    back = pq.read_table(pa.BufferReader(to_parquet(table)))
    assert back.equals(table)


def _age(*paths) -> None:
    """A temp file as a killed writer leaves it: older than STALE_TEMP_S."""
    old = time.time() - STALE_TEMP_S - 60
    for path in paths:
        os.utime(path, (old, old))


def test_store_write_atomic_leaves_no_temp_and_replaces(tmp_path):
    store = Store(str(tmp_path))
    store.write_atomic("a/b.json", b"1")
    store.write_atomic("a/b.json", b"2")
    assert (tmp_path / "a/b.json").read_bytes() == b"2"
    assert os.listdir(tmp_path) == ["a"] and os.listdir(tmp_path / "a") == ["b.json"]
    (tmp_path / "a" / ".x.parquet.1234.tmp").write_bytes(b"half")
    store.remove_stale_temps("a")  # young: it may be a live writer's
    assert sorted(os.listdir(tmp_path / "a")) == [".x.parquet.1234.tmp", "b.json"]
    _age(tmp_path / "a" / ".x.parquet.1234.tmp")
    store.remove_stale_temps("a")
    assert os.listdir(tmp_path / "a") == ["b.json"]
    # Staged under a folder of its own (part files: readers list their folder whole).
    store.write_atomic("a/c.parquet", b"3", staging="_tmp")
    assert sorted(os.listdir(tmp_path / "a")) == ["b.json", "c.parquet"]
    assert not (tmp_path / "_tmp").exists()  # the staging folder goes with its last temp
    (tmp_path / "_tmp").mkdir()
    (tmp_path / "_tmp" / "a__x.parquet.1234abcd.tmp").write_bytes(b"half")  # left by a killed writer of a/
    (tmp_path / "_tmp" / "ab__y.parquet.1234abcd.tmp").write_bytes(b"live")  # another folder's writer
    _age(tmp_path / "_tmp" / "a__x.parquet.1234abcd.tmp", tmp_path / "_tmp" / "ab__y.parquet.1234abcd.tmp")
    store.write_atomic("a/d.parquet", b"4", staging="_tmp")  # a folder with other temps stays
    store.remove_stale_temps("a", staging="_tmp")
    assert os.listdir(tmp_path / "_tmp") == ["ab__y.parquet.1234abcd.tmp"]
    os.unlink(tmp_path / "_tmp" / "ab__y.parquet.1234abcd.tmp")
    store.remove_stale_temps("a", staging="_tmp")
    assert not (tmp_path / "_tmp").exists()


def test_a_writer_whose_staging_folder_another_removes_makes_it_again(tmp_path, monkeypatch):
    """Two pods' writers on one volume: one removes the empty staging folder between
    the other's makedirs and its open."""
    from batchocr.storage import local

    real = os.makedirs
    raced = []

    def makedirs(path, exist_ok=False):
        real(path, exist_ok=exist_ok)
        if path.endswith("_tmp") and not raced:
            raced.append(path)
            os.rmdir(path)  # the other writer's _remove_if_empty

    monkeypatch.setattr(local.os, "makedirs", makedirs)
    Store(str(tmp_path)).write_atomic("a/c.parquet", b"3", staging="_tmp")
    assert raced and (tmp_path / "a" / "c.parquet").read_bytes() == b"3" and not (tmp_path / "_tmp").exists()


def test_a_writer_whose_makedirs_loses_the_race_to_another_writer_tries_again(tmp_path, monkeypatch):
    """makedirs(exist_ok=True) raises FileExistsError when its mkdir finds the folder and
    another writer removes it before makedirs checks it is a folder (CI, three shards on one
    folder: 'FileExistsError: [Errno 17] File exists: .../out/_tmp' stopped a shard)."""
    from batchocr.storage import local

    real = os.makedirs
    raced = []

    def makedirs(path, exist_ok=False):
        if path.endswith("_tmp") and not raced:
            raced.append(path)
            raise FileExistsError(17, "File exists", path)  # as os.makedirs raises it then
        real(path, exist_ok=exist_ok)

    monkeypatch.setattr(local.os, "makedirs", makedirs)
    Store(str(tmp_path)).write_atomic("a/d.parquet", b"4", staging="_tmp")
    assert raced and (tmp_path / "a" / "d.parquet").read_bytes() == b"4"


def test_join_lines_groups_boxes_on_one_line():
    def box(x0, y0, x1, y1):
        return [[x0, y0], [x1, y0], [x1, y1], [x0, y1]]

    boxes = [box(400, 10, 500, 30), box(10, 12, 100, 31), box(10, 50, 200, 70)]
    assert join_lines(boxes, ["12.00", "Total", "Thank you"]) == "Total 12.00\nThank you"


def test_compaction_keeps_text_over_error_else_the_latest():
    import datetime as dt

    import polars as pl

    from batchocr.compact import dedupe

    t = [dt.datetime(2026, 1, 1, tzinfo=dt.UTC) + dt.timedelta(minutes=i) for i in range(6)]
    rows = pa.Table.from_pylist([
        {"doc_id": "a", "source_etag": "e", "page_index": 0, "finish_reason": "stop", "text": "old", "processed_at": t[0]},
        {"doc_id": "a", "source_etag": "e", "page_index": 0, "finish_reason": "error", "processed_at": t[1]},
        {"doc_id": "a", "source_etag": "e", "page_index": 1, "finish_reason": "stop", "text": "first", "processed_at": t[0]},
        {"doc_id": "a", "source_etag": "e", "page_index": 1, "finish_reason": "stop", "text": "second", "processed_at": t[2]},
        {"doc_id": "b", "source_etag": "v1", "page_index": 0, "finish_reason": "stop", "text": "v1", "processed_at": t[0]},
        {"doc_id": "b", "source_etag": "v2", "page_index": -1, "finish_reason": "error", "processed_at": t[3]},
        {"doc_id": "c", "source_etag": "e", "page_index": -1, "finish_reason": "error", "processed_at": t[0]},
        {"doc_id": "c", "source_etag": "e", "page_index": 0, "page_count": 1, "finish_reason": "stop", "text": "ok",
         "processed_at": t[4]},
        {"doc_id": "d", "source_etag": "e", "page_index": -1, "finish_reason": "error", "processed_at": t[0]},
        {"doc_id": "d", "source_etag": "e", "page_index": 0, "page_count": 2, "finish_reason": "stop", "text": "ok",
         "processed_at": t[4]},
        *[{"doc_id": "e", "source_etag": "v1", "page_index": i, "page_count": 2, "finish_reason": "stop",
           "text": f"v1 {i}", "processed_at": t[0]} for i in range(2)],
        {"doc_id": "e", "source_etag": "v2", "page_index": 0, "page_count": 2, "finish_reason": "stop", "text": "v2",
         "processed_at": t[5]},  # its rereading stopped after one page (and the file deleted since, say)
        *[{"doc_id": "f", "source_etag": v, "page_index": 0, "page_count": 1, "finish_reason": "stop", "text": v,
           "processed_at": t[k]} for k, v in ((0, "v1"), (1, "v2"), (2, "v3"))],
    ], schema=schema.PAGE_TABLE)
    kept = dedupe(pl.from_arrow(rows)).sort("doc_id", "page_index")
    assert kept.select("doc_id", "page_index", "text", "finish_reason").rows() == [
        ("a", 0, "old", "stop"),  # a text row beats a later error row
        ("a", 1, "second", "stop"),  # otherwise the latest
        ("b", -1, None, "error"),  # the document's latest version is what counts
        ("c", 0, "ok", "stop"),  # a document error row goes once every page has a row of its own
        ("d", -1, None, "error"),  # not before: it stands in for page 1, never read
        ("d", 0, "ok", "stop"),
        ("e", 0, "v1 0", "stop"),  # the last whole version, until the new one is whole
        ("e", 1, "v1 1", "stop"),
        ("f", 0, "v3", "stop"),  # of whole versions, the latest
    ]


def test_usable_cpus_follow_the_cgroup_quota_and_the_affinity(tmp_path):
    from batchocr.cpus import available_cpus, cgroup_quota

    affinity = len(os.sched_getaffinity(0))
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "cpu.max").write_text("max 100000\n")
    assert cgroup_quota(v2) is None and available_cpus(v2) == affinity
    (v2 / "cpu.max").write_text("150000 100000\n")  # limits.cpu: 1500m
    assert cgroup_quota(v2) == 1.5 and available_cpus(v2) == min(affinity, 2)
    (v2 / "cpu.max").write_text("50000 100000\n")
    assert available_cpus(v2) == 1
    v1 = tmp_path / "v1"
    (v1 / "cpu").mkdir(parents=True)
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    (v1 / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert cgroup_quota(v1) is None
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("100000\n")
    assert cgroup_quota(v1) == 1.0 and available_cpus(v1) == 1
    assert cgroup_quota(tmp_path / "none") is None


def test_usable_memory_is_the_cgroups_limit_else_the_hosts(tmp_path):
    from batchocr.cpus import available_memory_gib

    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24684984 kB\nMemFree:         1000 kB\n")
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "memory.max").write_text("max\n")  # no limit: the host's
    assert available_memory_gib(v2, meminfo) == 24684984 / 2**20
    (v2 / "memory.max").write_text(f"{96 * 2**30}\n")  # limits.memory: 96Gi
    assert available_memory_gib(v2, meminfo) == 96.0
    v1 = tmp_path / "v1"
    (v1 / "memory").mkdir(parents=True)
    (v1 / "memory" / "memory.limit_in_bytes").write_text("9223372036854771712\n")  # v1's "no limit"
    assert available_memory_gib(v1, meminfo) == 24684984 / 2**20
    (v1 / "memory" / "memory.limit_in_bytes").write_text(f"{40 * 2**30}\n")
    assert available_memory_gib(v1, meminfo) == 40.0
    assert available_memory_gib(tmp_path / "none", tmp_path / "no-meminfo") is None


def test_default_workers_and_threads_follow_the_process_affinity():
    # A process pinned to one CPU (as taskset or a cpuset cgroup would) gets one
    # render worker and one OCR thread by default, whatever the host has.
    code = ("import os; os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]}); "
            "from batchocr.spec import RenderSpec; from batchocr.cpus import available_cpus; "
            "print(RenderSpec().worker_count, available_cpus())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["1", "1"]


def test_run_records_and_markers_are_read_several_at_a_time(tmp_path, monkeypatch):
    """A CronJob's OUT holds a run record a run and a shard: `report`, `status` and every
    run's start read them, and an object store answers each in milliseconds. They were read
    one after the other; now up to storage.READ_THREADS at once, in their order."""
    import threading

    from batchocr import producer, status

    out = Store(str(tmp_path))
    settings = {"model": "m"}
    for i in range(40):
        out.write_json(f"_runs/r{i:03d}.json", {"run_id": f"r{i:03d}", "model": "m" if i % 2 else "other",
                                               "spec": {"shard": {"index": 0, "count": 3}}})
    for shard in range(3):
        out.write_json(f"_done/shard-{shard:05d}.json", {"shards": 3})
    lock, live, peak = threading.Lock(), [0], [0]
    read_json = Store.read_json

    def slow(self, rel):
        with lock:
            live[0] += 1
            peak[0] = max(peak[0], live[0])
        time.sleep(0.02)  # as a store's round trip: reads that overlap are seen to
        try:
            return read_json(self, rel)
        finally:
            with lock:
                live[0] -= 1

    monkeypatch.setattr(Store, "read_json", slow)
    monkeypatch.setattr(producer, "of_record", lambda record: {"model": record["model"]})
    records = out.read_jsons("_runs")
    assert [r["run_id"] for r in records] == [f"r{i:03d}" for i in range(40)] and peak[0] > 1
    peak[0] = 0
    assert producer.other_runs(out, [f"r{i:03d}" for i in range(40)] + ["gone"], settings) == \
        {f"r{i:03d}" for i in range(0, 40, 2)} and peak[0] > 1
    peak[0] = 0
    assert status.output_shard_counts(out) == {3} and peak[0] > 1

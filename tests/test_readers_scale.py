"""The readers of a large OUT (status, report, export) read it a few whole shards at a time
(batchocr.table.shard_groups) and merge what each group gives: their output is the same as
read whole, whatever the grouping."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

from batchocr import table
from batchocr.compact import kept_counts
from batchocr.export import export
from batchocr.report import build_report, load_report
from batchocr.sink import committed_keys
from batchocr.status import status
from batchocr.storage import Store
from synthetic import resumed_output

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import page_tables  # noqa: E402  (bench/page_tables.py: the synthetic OUT of the readers' benchmark)


@pytest.fixture(scope="module")
def big(tmp_path_factory) -> Path:
    """12 shards of the benchmark's synthetic OUT (4 parts a shard, a redone document each), and
    the resumed output's shards beside them (document rows, a changed document, a looping page)."""
    out = tmp_path_factory.mktemp("readers") / "out"
    page_tables.write_out(out, 2400, 12)
    resumed_output(out)  # shards 0 and 1: more parts there
    return out


@pytest.mark.parametrize("group_parts", [1, 5])
def test_the_report_a_group_of_shards_at_a_time_is_the_report_read_whole(big, monkeypatch, group_parts):
    monkeypatch.setattr(table, "GROUP_PARTS", group_parts)
    assert len(list(table.shard_groups(str(big)))) >= 12 // group_parts
    grouped = dataclasses.asdict(load_report(str(big), top=3, limit=2))
    runs = Store(str(big)).read_jsons("_runs")
    whole = dataclasses.asdict(build_report(table.read_pages(str(big)), out=str(big), runs=runs, top=3, limit=2))
    assert grouped == whole
    assert grouped["duplicates"] > 12 and grouped["flagged_total"] > 2 and grouped["route_saving"] is not None


def test_status_tallied_a_group_at_a_time_counts_each_shard_as_compaction_keeps_it(big, monkeypatch):
    import batchocr.status as status_module

    monkeypatch.setattr(status_module, "GROUP_SHARDS", 5)
    rows = status(Store(str(big)))
    assert [r.shard for r in rows] == list(range(12))
    for r in rows:
        keys = committed_keys(Store(str(big)), r.shard)
        assert (r.pages, r.error_pages) == kept_counts(keys)
        assert r.documents == len(set(keys.column("doc_id").to_pylist()))
    # every document the plan gives a shard has its rows: done (the resumed output's are not planned)
    assert all(r.state == "done" and r.planned_documents == 20 for r in rows)


def test_export_a_group_of_shards_at_a_time_writes_what_export_of_the_whole_writes(big, tmp_path, monkeypatch):
    monkeypatch.setattr(table, "GROUP_PARTS", 3)
    whole = export(table.read_pages(str(big)), Store(str(tmp_path / "whole")), "jsonl")
    grouped = export(table.read_pages(str(big)), Store(str(tmp_path / "grouped")), "jsonl",
                     groups=(g for _, g in table.shard_groups(str(big))))
    assert grouped == whole and whole.files == 12
    for f in sorted((tmp_path / "whole").iterdir()):
        assert (tmp_path / "grouped" / f.name).read_bytes() == f.read_bytes()

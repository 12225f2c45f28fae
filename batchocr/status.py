"""Where each shard of an OUT stands: done, partial or not started."""

from __future__ import annotations

from dataclasses import dataclass

from batchocr import layout
from batchocr.plan import PlanInfo, read_plan
from batchocr.layout import done_marker
from batchocr.sink import committed_keys, shards_present
from batchocr.storage import Store


@dataclass(frozen=True)
class ShardStatus:
    shard: int
    state: str  # done | partial | not started
    documents: int  # documents with at least one row
    pages: int  # rows committed (before compaction a redone page counts twice)
    error_pages: int
    planned_documents: int | None  # from the plan, if OUT has one


def shard_count(out: Store, plan: PlanInfo | None, markers: list[str]) -> int:
    """From the plan, else from the done-markers (their paths: `markers`) and run
    records written so far."""
    if plan is not None:
        return plan.shards
    counts = [1]
    for rel in markers:
        counts.append(int(out.read_json(rel).get("shards", 1)))
    for run in out.read_jsons(layout.RUNS):
        counts.append(int(run.get("spec", {}).get("shard", {}).get("count", 1)))
    return max(counts + [s + 1 for s in shards_present(out)])


def status(out: Store) -> list[ShardStatus]:
    plan = read_plan(out)
    markers = out.find(layout.DONE, suffix=".json")  # listed once: no request per shard
    rows = []
    for shard in range(shard_count(out, plan, markers)):
        keys = committed_keys(out, shard)
        reasons = keys.column("finish_reason").to_pylist()
        if done_marker(shard) in markers:
            state = "done"
        elif reasons:
            state = "partial"
        else:
            state = "not started"
        planned = plan.per_shard[shard]["documents"] if plan and plan.per_shard else None
        rows.append(ShardStatus(shard, state, len(set(keys.column("doc_id").to_pylist())), len(reasons),
                                reasons.count("error"), planned))
    return rows

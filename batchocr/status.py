"""Where each shard of an OUT stands: done, partial or not started."""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from batchocr import layout
from batchocr.compact import kept_counts_by_shard
from batchocr.errors import ConfigError
from batchocr.plan import PlanInfo, planned_documents, read_plan
from batchocr.layout import done_marker
from batchocr.sink import committed_keys, committed_runs, completed, shards_present
from batchocr.spec import Shard
from batchocr.storage import Store, each


GROUP_SHARDS = 64  # shards whose committed keys are held at once, and tallied in one pass


@dataclass(frozen=True)
class ShardStatus:
    shard: int
    state: str  # done | partial | not started
    documents: int  # documents with at least one row
    pages: int  # pages with a row, as compaction keeps them (a page redone counts once)
    error_pages: int
    planned_documents: int | None  # from the plan, if OUT has one


def shard_count(out: Store, plan: PlanInfo | None, markers: list[str]) -> int:
    """From the plan, else from the done-markers (their paths: `markers`) and run
    records written so far."""
    if plan is not None:
        return plan.shards
    counts = [1]
    for marker in out.read_each_json(markers):
        counts.append(int(marker.get("shards", 1)))
    for run in out.read_jsons(layout.RUNS):
        counts.append(_count(run))
    return max(counts + [s + 1 for s in shards_present(out)])


def output_shard_counts(out: Store) -> set[int]:
    """The shard counts (N of --shard I/N) that OUT's output was made with: from its
    done-markers, else (no shard done yet) from the records of runs that committed rows:
    one that ended lists its parts; one whose record says "running" (under way, or killed:
    its end never written) counts once its shard holds rows of it, so that a run killed
    before its first commit leaves no count behind. The markers first: a CronJob's OUT has
    many run records, and a marker per shard."""
    counts = {m["shards"] for m in out.read_jsons(layout.DONE) if "shards" in m}
    if counts:
        return counts
    unsure: dict[int, list[dict]] = {}  # shard index -> its "running" records
    for run in out.read_jsons(layout.RUNS):
        if run.get("parts"):
            counts.add(_count(run))
        elif run.get("status") == "running":
            unsure.setdefault(int(run.get("spec", {}).get("shard", {}).get("index", 0)), []).append(run)
    for index, runs in unsure.items():
        runs = [r for r in runs if _count(r) not in counts]  # a shard's parts are read only if it can tell
        if runs:
            committed = committed_runs(out, index)
            counts |= {_count(r) for r in runs if r.get("run_id") in committed}
    return counts


def _count(run: dict) -> int:
    """The shard count a run record's run had."""
    return int(run.get("spec", {}).get("shard", {}).get("count", 1))


def check_shard_count(out: Store, shard: Shard, url: str) -> None:
    """A run without a plan has the shard count of OUT's output: a document's shard
    depends on the count, and one that moves is redone on its new shard, where
    compaction (within a shard) never meets its old rows. Writes nothing; run before
    the engine loads (shard.prepare: with a plan, the plan's count is the
    one compared)."""
    counts = sorted(output_shard_counts(out))
    if counts and counts != [shard.count]:
        held = " and ".join(map(str, counts))
        same = f"Run with --shard I/{counts[0]}, or" if len(counts) == 1 else "Run"
        # A plan keeps output on the shard that holds it: one of fewer shards than that is refused.
        highest = max(shards_present(out), default=-1)
        plan = (f"`batchocr plan SOURCE OUT --shards {shard.count}`" if shard.count > highest else
                f"`batchocr plan SOURCE OUT --shards {highest + 1}` (or more: shard {highest} holds output)")
        raise ConfigError(f"OUT {url} holds output of {held} {'shard' if counts == [1] else 'shards'}, this run is "
                          f"shard {shard}: its documents would be redone on other shards. {same} {plan} "
                          f"first to change the count without redoing them")


def _has_planned(out: Store, shard: int, keys: pa.Table) -> bool:
    """Whether the shard has rows of every document the plan gives it, of the planned version
    (`keys`: its committed rows'). A done-marker says that a run finished the documents it was
    given; a plan made since gives the shard new (or changed) ones, and a pod that ran with
    the old plan writes its marker all the same, even after `batchocr plan` has finished."""
    have = completed(keys)  # (doc_id, etag) of each document's latest version with rows
    return all((doc.doc_id, doc.etag) in have for doc in planned_documents(out, shard))


def status(out: Store) -> list[ShardStatus]:
    plan = read_plan(out)
    markers = out.find(layout.DONE, suffix=".json")  # listed once: no request per shard
    done = set(markers)
    rows = []
    count = shard_count(out, plan, markers)
    for first in range(0, count, GROUP_SHARDS):  # a group's keys read, then tallied in one pass
        shards = range(first, min(count, first + GROUP_SHARDS))
        keys = dict(zip(shards, each(lambda shard: committed_keys(out, shard), list(shards))))
        # a page redone (a changed document, a compaction killed) once
        counts = kept_counts_by_shard(keys)
        for shard in shards:
            pages, errors, documents = counts[shard]
            if done_marker(shard) in done and (plan is None or _has_planned(out, shard, keys[shard])):
                state = "done"
            elif keys[shard].num_rows:
                state = "partial"
            else:
                state = "not started"
            planned = plan.per_shard[shard]["documents"] if plan and plan.per_shard else None
            rows.append(ShardStatus(shard, state, documents, pages, errors, planned))
    return rows

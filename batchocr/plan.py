"""A frozen plan: the container listed once, every document given a shard, balanced
by size, so that every pod agrees on its documents and blobs added mid-run wait
for the next plan.

    OUT/_plan/shard-NNNNN.parquet   uri, size, etag, mtime of that shard's documents
    OUT/_plan/plan.json             written last: source, shard count, totals
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import heapq
import io
from dataclasses import dataclass
from typing import Iterable, Iterator, Mapping, Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from batchocr.errors import ConfigError
from batchocr.layout import PLAN
from batchocr.layout import plan_shard as shard_file
from batchocr.sink import committed_keys, shards_present, to_parquet
from batchocr.sources import DocRef, check_stores, list_documents
from batchocr.storage import Store

DOCS = pa.schema([("uri", pa.string()), ("size", pa.int64()), ("etag", pa.string()), ("mtime", pa.float64())])


@dataclass(frozen=True)
class PlanInfo:
    source: str
    shards: int
    documents: int
    bytes: int
    created_at: str
    per_shard: tuple[dict, ...] = ()  # {"shard", "documents", "bytes"} of each shard


def balance(docs: Iterable[DocRef], shards: int, keep: Mapping[str, int] | None = None) -> dict[int, list[DocRef]]:
    """Largest documents first onto the lightest shard (LPT). Documents in `keep`
    (an earlier plan) stay on their shard; only new ones are placed."""
    keep = keep or {}
    out: dict[int, list[DocRef]] = {i: [] for i in range(shards)}
    load = [0] * shards
    new = []
    for doc in docs:
        if doc.uri in keep:
            out[keep[doc.uri]].append(doc)
            load[keep[doc.uri]] += doc.size
        else:
            new.append(doc)
    new.sort(key=lambda d: (-d.size, d.uri))
    for doc, i in zip(new, lightest(iter([d.size for d in new]), load)):
        out[i].append(doc)
    return out


def lightest(sizes: Iterator[int], load: Sequence[float]) -> Iterator[int]:
    """The shard for each of `sizes` in turn: the lightest so far (a heap of (load, shard);
    with sizes largest first, LPT). load: each shard's load before the first."""
    heap = [(load[i], i) for i in range(len(load))]
    heapq.heapify(heap)
    for size in sizes:
        least, i = heap[0]
        heapq.heapreplace(heap, (least + size, i))
        yield i


def read_plan(out: Store) -> PlanInfo | None:
    if not out.exists(PLAN):
        return None
    raw = out.read_json(PLAN)
    try:
        return PlanInfo(**raw | {"per_shard": tuple(raw.get("per_shard", ()))})
    except TypeError:  # an object, but not a plan's keys
        raise out.not_batchocrs(PLAN, f"its keys: {', '.join(sorted(map(str, raw))) or 'none'}") from None


def planned_documents(out: Store, shard: int) -> Iterator[DocRef]:
    try:
        table = pq.read_table(io.BytesIO(out.read_bytes(shard_file(shard))))
    except pa.ArrowException as exc:  # damaged, or not batchocr's: OUT's fault, named (as read_json's)
        raise out.not_batchocrs(shard_file(shard), type(exc).__name__) from None
    except FileNotFoundError:  # plan.json names the shard, its file is gone: as damaged
        raise out.not_batchocrs(shard_file(shard), "missing, though plan.json names the shard") from None
    for row in table.to_pylist():
        yield DocRef(uri=row["uri"], size=row["size"], etag=row["etag"], mtime=row["mtime"])


def output_shards(out: Store) -> dict[str, int]:
    """doc_id -> the shard whose folder holds committed rows of the document (the
    lowest, where an OUT from before this check has it in several)."""
    where: dict[str, int] = {}
    for shard in reversed(shards_present(out)):
        where.update((d, shard) for d in committed_keys(out, shard).column("doc_id").to_pylist())
    return where


def existing_shards(source: Store, out: Store, shards: int) -> tuple[PlanInfo | None, dict[str, int]]:
    """What a plan of `shards` over SOURCE into OUT must keep: the earlier plan (its shards'
    documents stay there), and doc_id -> the shard holding its rows (output_shards). One line each (exit
    2) where no such plan can be made: another shard count, another SOURCE, output beyond."""
    if shards < 1:
        raise ConfigError(f"--shards must be >= 1, got {shards}")
    check_stores(source, out)  # as run's: one line each (exit 2), before anything is listed or written
    old = read_plan(out)
    if old is not None:
        if old.shards != shards:
            raise ConfigError(
                f"{out.url} already has a plan of {old.shards} shards; a plan's shard count cannot change "
                f"(documents would move away from their output). Use --shards {old.shards} or a new OUT."
            )
        if old.source != source.canonical:
            raise ConfigError(f"{out.url} has a plan for {old.source}, not {source.canonical}")
    done = output_shards(out)
    if done and max(done.values()) >= shards:
        raise ConfigError(f"{out.url} has output in shard {max(done.values())}: a plan of {shards} shards would "
                          f"redo its documents on another shard. Use --shards {max(done.values()) + 1} or more, "
                          "or a new OUT.")
    return old, done


def make_plan(source: Store, out: Store, shards: int) -> PlanInfo:
    """List SOURCE once and write the plan. An existing plan is extended: its
    documents keep their shards (their output is there), new ones are balanced in.
    A document with rows in OUT already (runs without a plan, or by hash with
    another count) stays on the shard that holds them: compaction dedupes within a
    shard, so a page redone on another one would stay twice."""
    old, done = existing_shards(source, out, shards)
    keep = {d.uri: i for i in range(shards if old else 0) for d in planned_documents(out, i)}
    docs = list(list_documents(source))
    keep.update((d.uri, done[d.doc_id]) for d in docs if d.uri not in keep and d.doc_id in done)
    assignment = balance(docs, shards, keep)
    for i, docs in assignment.items():
        rows = [{"uri": d.uri, "size": d.size, "etag": d.etag, "mtime": d.mtime} for d in sorted(docs, key=lambda d: d.uri)]
        out.write_atomic(shard_file(i), to_parquet(pa.Table.from_pylist(rows, schema=DOCS)))
    info = PlanInfo(
        source=source.canonical,
        shards=shards,
        documents=sum(len(d) for d in assignment.values()),
        bytes=sum(d.size for docs in assignment.values() for d in docs),
        created_at=dt.datetime.now(dt.UTC).isoformat(),
        per_shard=tuple(
            {"shard": i, "documents": len(docs), "bytes": sum(d.size for d in docs)} for i, docs in assignment.items()
        ),
    )
    out.write_json(PLAN, dataclasses.asdict(info))
    return info

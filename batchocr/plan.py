"""A frozen plan: the container listed once, every document given a shard, balanced
by size, so that every pod agrees on its documents and blobs added mid-run wait
for the next plan.

    OUT/_plan/shard-NNNNN.parquet   uri, size, etag, mtime of that shard's documents
    OUT/_plan/plan.json             written last: source, shard count, totals
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import io
import itertools
from dataclasses import dataclass
from typing import Iterator

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from batchocr.errors import ConfigError
from batchocr.layout import PLAN
from batchocr.layout import plan_shard as shard_file
from batchocr.planner import BATCH_ROWS, ROWS, Planned, write_plan
from batchocr.sink import committed_keys, shards_present
from batchocr.sources import DocRef, check_stores, list_documents, spell
from batchocr.storage import Store
from batchocr.storage.store import READ_THREADS, each


@dataclass(frozen=True)
class PlanInfo:
    source: str
    shards: int
    documents: int
    bytes: int
    created_at: str
    per_shard: tuple[dict, ...] = ()  # {"shard", "documents", "bytes"} of each shard


def read_plan(out: Store) -> PlanInfo | None:
    if not out.exists(PLAN):
        return None
    raw = out.read_json(PLAN)
    try:
        return PlanInfo(**raw | {"per_shard": tuple(raw.get("per_shard", ()))})
    except TypeError:  # an object, but not a plan's keys
        raise out.not_batchocrs(PLAN, f"its keys: {', '.join(sorted(map(str, raw))) or 'none'}") from None


def planned_documents(out: Store, shard: int) -> Iterator[DocRef]:
    for row in planned_table(out, shard).to_pylist():
        yield DocRef(uri=row["uri"], size=row["size"], etag=row["etag"], mtime=row["mtime"])


def planned_table(out: Store, shard: int) -> pa.Table:
    try:
        return pq.read_table(io.BytesIO(out.read_bytes(shard_file(shard))))
    except pa.ArrowException as exc:  # damaged, or not batchocr's: OUT's fault, named (as read_json's)
        raise out.not_batchocrs(shard_file(shard), type(exc).__name__) from None
    except FileNotFoundError:  # plan.json names the shard, its file is gone: as damaged
        raise out.not_batchocrs(shard_file(shard), "missing, though plan.json names the shard") from None


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


def base_uri(source: Store) -> str:
    """What every planned uri starts with: SOURCE's canonical URI and `/` (a plan's rows
    are spelled as sources.list_documents spells them)."""
    return spell(source.canonical).rstrip("/") + "/"


def kept_rows(out: Store, shards: int, base: str) -> Iterator[pl.DataFrame]:
    """(rel, shard) of every document of OUT's plan of `shards` shards (none if it has
    no plan), READ_THREADS shard files at a time."""
    if read_plan(out) is None:
        return

    def read(i: int) -> pl.DataFrame:
        uris = planned_table(out, i).column("uri")
        return pl.DataFrame({"rel": pl.Series(uris).str.strip_prefix(base), "shard": pl.repeat(i, len(uris), eager=True,
                                                                                             dtype=pl.Int32)})

    for start in range(0, shards, 4 * READ_THREADS):
        yield pl.concat(each(read, list(range(start, min(shards, start + 4 * READ_THREADS)))))


def listed_rows(docs: Iterator[DocRef], base: str) -> Iterator[pl.DataFrame]:
    """A listing as planner rows, BATCH_ROWS documents a frame: never a list of them all."""
    while batch := list(itertools.islice(docs, BATCH_ROWS)):
        yield pl.DataFrame({"rel": [d.uri[len(base):] for d in batch], "size": [d.size for d in batch],
                            "etag": [d.etag for d in batch], "mtime": [d.mtime for d in batch],
                            "archived": [False] * len(batch)}, schema=ROWS)


def make_plan(source: Store, out: Store, shards: int) -> PlanInfo:
    """List SOURCE once and write the plan (planner.write_plan: memory bounded, whatever
    the number of documents). An existing plan is extended: its documents keep their
    shards (their output is there), new ones are balanced in. A document with rows in
    OUT already (runs without a plan, or by hash with another count) stays on the shard
    that holds them: compaction dedupes within a shard, so a page redone on another one
    would stay twice."""
    _, done = existing_shards(source, out, shards)
    docs = iter(list_documents(source))
    first = next(docs, None)
    base = base_uri(source)
    if first is not None and not first.uri.startswith(base):  # SOURCE is that one document
        base = ""
    listed = listed_rows(itertools.chain([first] if first else [], docs), base)
    planned = write_plan(out, shards, listed, kept_rows(out, shards, base), base, done)
    return write_info(out, source, shards, planned)


def write_info(out: Store, source: Store, shards: int, planned: Planned) -> PlanInfo:
    """plan.json, written last: a plan is there once its every shard file is."""
    info = PlanInfo(source=source.canonical, shards=shards, documents=planned.documents, bytes=planned.bytes,
                    created_at=dt.datetime.now(dt.UTC).isoformat(), per_shard=tuple(planned.per_shard))
    out.write_json(PLAN, dataclasses.asdict(info))
    return info

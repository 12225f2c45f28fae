"""Compaction: each shard's part files rewritten as one, one row per (doc_id, page_index).

Which row survives: rows of one version (etag) of a document only, its latest that
has a row for every page, else its latest (dedupe); then a text row beats an error
row; otherwise the latest. A document-level row (-1) survives
until every page of the document has a row of its own. The new file is committed
atomically before the parts it replaces are deleted, so a crash in between
leaves duplicates (which the next compaction removes), never a loss. Parts
committed by a run while compaction works are not touched. Two compactions of one
shard at once would each commit the whole shard and delete the same parts, leaving
every row twice: a compaction claims the shard first (OUT/_compact/shard-N.json,
created only if absent), and another finding it claimed leaves the shard to it.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import io
import json
import os
import socket
from dataclasses import dataclass
from typing import Iterator, Mapping

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from batchocr import layout, procstat, producer, schema
from batchocr.sink import read_parts, shards_present, to_parquet
from batchocr.storage import Store


@dataclass(frozen=True)
class Compacted:
    shard: int
    parts_before: int
    rows_before: int
    rows_after: int


def dedupe(rows: pl.DataFrame, stale: frozenset[str] | set[str] = frozenset()) -> pl.DataFrame:
    """One row a page, of one version of each document: its latest version that has a row
    for every page (or a document row), else its latest. A changed document whose rereading
    stopped part-way keeps its last whole version until the new one is whole: keeping the new
    version's few pages alone, a document deleted from SOURCE before a rerun finished it would
    lose every other page's row for good. `stale`: run ids that ran with
    settings OUT no longer has (batchocr.producer): their rows lose to any row of the current
    settings."""
    pages_of = pl.col("page_index").filter(pl.col("page_index") >= 0).n_unique()
    versions = rows.group_by("doc_id", "source_etag").agg(
        pl.col("processed_at").max().alias("_at"),
        ((pages_of >= pl.col("page_count").max()).fill_null(False) | (pl.col("page_index") < 0).any()).alias("_whole"))
    kept_etag = versions.sort("_whole", "_at", nulls_last=False).group_by("doc_id").agg(pl.col("source_etag").last())
    rows = rows.join(kept_etag, on=["doc_id", "source_etag"], how="semi")
    # A document-level row (-1) goes only once every page of the document has a row
    # of its own: it stands in for pages that were never read, so it stays until they are.
    pages = rows.filter(pl.col("page_index") >= 0)
    covered = (pages.group_by("doc_id")
               .agg(pl.col("page_index").n_unique().alias("_have"), pl.col("page_count").max().alias("_count"))
               .filter(pl.col("_have") >= pl.col("_count")))
    rows = rows.filter((pl.col("page_index") >= 0) | ~pl.col("doc_id").is_in(covered["doc_id"].implode()))
    return (
        rows.with_columns((pl.col("finish_reason") != "error").alias("_text"),
                          (~pl.col("run_id").is_in(sorted(stale)) if stale else pl.lit(True)).alias("_current"))
        .sort(["doc_id", "page_index", "_current", "_text", "processed_at"], nulls_last=False)
        .unique(subset=["doc_id", "page_index"], keep="last", maintain_order=True)
        .drop("_text", "_current")
    )


def kept_counts(keys: pa.Table) -> tuple[int, int]:
    """The rows and error rows compaction would keep of a shard whose committed rows'
    key columns (sink.KEY_COLUMNS) are `keys`: the done-marker's counts."""
    kept = dedupe(pl.from_arrow(keys))
    return kept.height, kept.filter(pl.col("finish_reason") == "error").height


def kept_counts_by_shard(keys: Mapping[int, pa.Table]) -> dict[int, tuple[int, int, int]]:
    """kept_counts of several shards' keys in one pass, and each shard's documents (doc_ids
    among its rows): shard -> (rows kept, error rows kept, documents). A document's rows are
    deduped within its shard only, as compaction does."""
    if not keys:
        return {}
    rows = pl.concat([pl.from_arrow(table).with_columns(pl.lit(shard, pl.Int64).alias("_shard"))
                      for shard, table in keys.items()], how="diagonal_relaxed")
    documents = dict(rows.group_by("_shard").agg(pl.col("doc_id").n_unique()).iter_rows())
    own = rows.with_columns(pl.format("{}/{}", pl.col("_shard"), pl.col("doc_id")).alias("doc_id"))
    kept = dict((s, (n, e)) for s, n, e in dedupe(own).group_by("_shard").agg(
        pl.len(), (pl.col("finish_reason") == "error").sum()).iter_rows())
    return {s: (*kept.get(s, (0, 0)), documents.get(s, 0)) for s in keys}


# A claim older than this is a dead compaction's (one on another machine: a pod gone): a
# live one compacts a shard of a million rows in about a minute.
CLAIM_STALE_S = 3600.0


@dataclass(frozen=True)
class Busy:
    """A shard another compaction has claimed: left to it."""
    shard: int
    holder: str


def _gone(held: dict) -> bool:
    """A claim whose compaction is over: too old, or its process on this machine is not running."""
    try:
        since = dt.datetime.fromisoformat(held["since"])
        if (dt.datetime.now(dt.UTC) - since).total_seconds() > CLAIM_STALE_S:
            return True
        if held["host"] != socket.gethostname():
            return False
        pid = int(held["pid"])
    except (KeyError, TypeError, ValueError):
        return False  # being written (a local file is created empty), or not ours to judge: held
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass
    return held.get("started") is not None and held.get("started") != procstat.started(pid)


@contextlib.contextmanager
def _claimed(out: Store, shard: int) -> Iterator[str | None]:
    """None while this process holds the shard's claim; else who does (the shard is theirs)."""
    rel = layout.compact_claim(shard)
    me = {"host": socket.gethostname(), "pid": os.getpid(), "started": procstat.started(os.getpid()),
          "since": dt.datetime.now(dt.UTC).isoformat()}
    held: dict = {}
    for _ in range(3):
        if out.create(rel, json.dumps(me).encode()):
            try:
                yield None
            finally:
                out.remove(rel)
                out.remove_empty_folder(layout.COMPACTING)  # no empty folder left in OUT
            return
        try:
            held = json.loads(out.read_bytes(rel) or b"{}")
        except FileNotFoundError:
            continue  # let go meanwhile
        except ValueError:
            held = {}
        held = held if isinstance(held, dict) else {}
        if not _gone(held):
            break
        out.remove(rel)  # a dead compaction's
    yield (f"pid {held.get('pid', '?')} on {held.get('host', '?')} since {held.get('since', '?')}; if it is not "
           f"running, delete {out.url.rstrip('/')}/{rel}")


def compact_shard(out: Store, shard: int) -> Compacted | Busy | None:
    with _claimed(out, shard) as holder:
        if holder is not None:
            return Busy(shard, holder)
        return _compact_shard(out, shard)


def _compact_shard(out: Store, shard: int) -> Compacted | None:
    parts, tables = read_parts(out, shard, lambda p: schema.conform(pq.read_table(io.BytesIO(out.read_bytes(p)))))
    if not parts:
        return None
    rows = pl.from_arrow(pa.concat_tables(tables))
    stale = producer.stale_runs(out, rows["run_id"].unique().to_list())
    kept = dedupe(rows, stale)  # sorted by (doc_id, page_index) already
    if len(parts) == 1 and kept.height == rows.height:
        return Compacted(shard, 1, rows.height, rows.height)  # already compact
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S%fZ")
    name = layout.compacted_part(shard, stamp)
    out.write_atomic(name, to_parquet(kept.to_arrow().cast(schema.PAGE_TABLE)), layout.STAGING)
    for p in parts:
        out.remove(p)
    return Compacted(shard, len(parts), rows.height, kept.height)


def compact(out: Store) -> list[Compacted | Busy]:
    return [c for s in shards_present(out) if (c := compact_shard(out, s)) is not None]

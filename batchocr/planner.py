"""The planning engine, in bounded memory: documents in batches of columns (a listing's or
an inventory's) to a plan's shard files, the same for both.

    rows     rel (the name after the plan's base URI), size, etag, mtime, archived
    kept     rel, shard: an earlier plan's documents, which stay on their shard

Rows stay in memory while they fit one step (STEP_ROWS); past that they spill to a temp
folder in hash buckets of the name (a name given twice lands in one bucket), kept rows
into the same buckets. Buckets are read back in a fixed order and gathered into steps
of at most STEP_ROWS distinct names; in each step repeated names are dropped (the first
row stays), kept documents take their shard, and new ones are dealt largest first (ties
by name) onto the lightest shard of one load array for the whole plan. A plan thus
depends on the set of documents, never on the order they came in: one step of a plan
that fits is one LPT over all of it. Dealt rows go to spool files of contiguous shard
ranges, each then sorted by (shard, name) and written as the shard files.
"""

from __future__ import annotations

import heapq
import itertools
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator, Mapping, Sequence

import numpy as np
import polars as pl
import pyarrow as pa

from batchocr.layout import plan_shard as shard_file
from batchocr.sink import to_parquet
from batchocr.sources import doc_id
from batchocr.storage import Store
from batchocr.storage.store import each

DOCS = pa.schema([("uri", pa.string()), ("size", pa.int64()), ("etag", pa.string()), ("mtime", pa.float64())])
ROWS = {"rel": pl.String, "size": pl.Int64, "etag": pl.String, "mtime": pl.Float64, "archived": pl.Boolean}
KEPT = {"rel": pl.String, "shard": pl.Int32}
STEP_ROWS = 250_000  # rows one in-memory step holds; past them rows spill to disk
BATCH_ROWS = 50_000  # rows a batch of a listing
BUCKETS = 256  # hash buckets of the name on disk
CHUNK = 100_000  # documents a step of dealing: Python ints for these only


@dataclass
class Planned:
    per_shard: list[dict]  # {"shard", "documents", "bytes"} of each shard
    archived: int  # documents in the Archive tier (planned: their run gives them an unreadable row)

    @property
    def documents(self) -> int:
        return sum(s["documents"] for s in self.per_shard)

    @property
    def bytes(self) -> int:
        return sum(s["bytes"] for s in self.per_shard)


def lightest(sizes: Iterator[int], load: Sequence[float]) -> Iterator[int]:
    """The shard for each of `sizes` in turn: the lightest so far (a heap of (load, shard);
    with sizes largest first, LPT). load: each shard's load before the first."""
    heap = [(load[i], i) for i in range(len(load))]
    heapq.heapify(heap)
    for size in sizes:
        least, i = heap[0]
        heapq.heapreplace(heap, (least + size, i))
        yield i


def deal(sizes: np.ndarray, load: np.ndarray) -> np.ndarray:
    """Shards for documents of `sizes`, given largest first: each onto the lightest shard
    (plan.lightest), `load` updated. Sizes come as Python ints CHUNK at a time. From equal
    loads two shards differ by at most the largest document, whatever order steps come in."""
    chunks = (sizes[start:start + CHUNK].tolist() for start in range(0, len(sizes), CHUNK))
    out = np.fromiter(lightest(itertools.chain.from_iterable(chunks), load.tolist()), np.int32, len(sizes))
    load += np.bincount(out, weights=sizes, minlength=len(load))
    return out


@dataclass
class Spool:
    """Rows and kept rows, in memory until they pass STEP_ROWS, then in hash buckets of
    the name under `folder`, one Arrow IPC file a bucket and kind, in the order they came."""
    folder: Path
    held: dict[str, list[pl.DataFrame]] = field(default_factory=lambda: {"rows": [], "kept": []})
    writers: dict[tuple[str, int], pa.ipc.RecordBatchFileWriter] = field(default_factory=dict)
    rows: int = 0
    kept: int = 0  # kept rows among them
    spilled: bool = False

    def add(self, kind: str, frame: pl.DataFrame) -> None:
        frame = frame.select(list(ROWS if kind == "rows" else KEPT)).cast(ROWS if kind == "rows" else KEPT)
        if kind == "rows":
            frame = frame.with_columns(pl.col("size").fill_null(0), pl.col("archived").fill_null(False))
        self.rows += frame.height
        self.kept += frame.height if kind == "kept" else 0
        if self.spilled:
            self._write(kind, frame)
            return
        self.held[kind].append(frame)
        if self.rows > STEP_ROWS:
            self.spilled = True
            for name, frames in self.held.items():
                for held in frames:
                    self._write(name, held)
            self.held = {"rows": [], "kept": []}

    def _write(self, kind: str, frame: pl.DataFrame) -> None:
        bucket = frame.select((pl.col("rel").hash(seed=0) % BUCKETS).cast(pl.Int32).alias("b"))["b"]
        for (b,), part in frame.with_columns(bucket).partition_by("b", as_dict=True, include_key=False).items():
            table = part.to_arrow()
            if (kind, b) not in self.writers:
                self.writers[kind, b] = pa.ipc.new_file(str(self.folder / f"{kind}-{b:03d}.arrow"), table.schema)
            self.writers[kind, b].write_table(table)

    def buckets(self) -> Iterator[tuple[pl.DataFrame, pl.DataFrame]]:
        """(rows, kept) of each bucket in bucket order; all of them as one where nothing spilled."""
        if not self.spilled:
            yield _concat(self.held["rows"], ROWS), _concat(self.held["kept"], KEPT)
            return
        for writer in self.writers.values():
            writer.close()
        self.writers = {}
        for b in range(BUCKETS):
            yield self._read("rows", b, ROWS), self._read("kept", b, KEPT)

    def _read(self, kind: str, b: int, schema: dict) -> pl.DataFrame:
        path = self.folder / f"{kind}-{b:03d}.arrow"
        if not path.exists():
            return pl.DataFrame(schema=schema)
        with pa.memory_map(str(path)) as source:
            return pl.from_arrow(pa.ipc.open_file(source).read_all()).cast(schema)


def _concat(frames: list[pl.DataFrame], schema: dict) -> pl.DataFrame:
    return pl.concat(frames) if frames else pl.DataFrame(schema=schema)


def steps(spool: Spool) -> Iterator[tuple[pl.DataFrame, pl.DataFrame]]:
    """(rows, kept) of consecutive buckets, repeated names dropped, at most STEP_ROWS rows
    a step (or one bucket): a step's bounds depend on the distinct names alone."""
    held: list[tuple[pl.DataFrame, pl.DataFrame]] = []
    count = 0
    for rows, kept in spool.buckets():
        rows = rows.unique("rel", keep="first", maintain_order=True)
        if held and count + rows.height > STEP_ROWS:
            yield pl.concat([r for r, _ in held]), pl.concat([k for _, k in held])
            held, count = [], 0
        held.append((rows, kept))
        count += rows.height
    if held:
        yield pl.concat([r for r, _ in held]), pl.concat([k for _, k in held])


def resolve(rows: pl.DataFrame, kept: pl.DataFrame, base: str, done: Mapping[str, int]) -> pl.DataFrame:
    """The step's rows with `shard`: the kept one (an earlier plan's, else the shard holding
    the document's rows in OUT), null for a new document."""
    kept = kept.unique("rel", keep="first")
    rows = rows.join(kept, on="rel", how="left", maintain_order="left")
    if done:
        new = rows["shard"].is_null().to_numpy()
        shard = rows["shard"].fill_null(-1).to_numpy().copy()
        shard[new] = [done.get(doc_id(base + rel), -1) for rel in rows["rel"].filter(new).to_list()]
        rows = rows.with_columns(shard=pl.Series(shard, dtype=pl.Int32))
        rows = rows.with_columns(pl.when(pl.col("shard") >= 0).then(pl.col("shard")).alias("shard"))
    return rows


@dataclass
class Sink:
    """Dealt rows, held (a plan that fits one step) or in spool files of contiguous shard
    ranges under `folder`, then written as shard files."""
    folder: Path
    shards: int
    groups: int
    held: list[pl.DataFrame] = field(default_factory=list)
    writers: dict[int, pa.ipc.RecordBatchFileWriter] = field(default_factory=dict)

    def add(self, rows: pl.DataFrame) -> None:
        if self.groups == 1:
            self.held.append(rows)
            return
        group = (pl.col("shard").cast(pl.Int64) * self.groups // self.shards).cast(pl.Int32).alias("g")
        for (g,), part in rows.with_columns(group).partition_by("g", as_dict=True, include_key=False).items():
            table = part.to_arrow()
            if g not in self.writers:
                self.writers[g] = pa.ipc.new_file(str(self.folder / f"out-{g:05d}.arrow"), table.schema)
            self.writers[g].write_table(table)

    def write(self, out: Store, base: str) -> list[dict]:
        """Each shard's plan file, sorted by name, a group at a time."""
        for writer in self.writers.values():
            writer.close()
        per_shard = []
        for g in range(self.groups):
            first, end = -(-g * self.shards // self.groups), -(-(g + 1) * self.shards // self.groups)
            per_shard += _write_group(out, base, self.group(g), first, end)
        return per_shard

    def group(self, g: int) -> pl.DataFrame:
        schema = ROWS | KEPT
        if self.groups == 1:
            return _concat(self.held, schema)
        path = self.folder / f"out-{g:05d}.arrow"
        if not path.exists():
            return pl.DataFrame(schema=schema)
        with pa.memory_map(str(path)) as source:
            return pl.from_arrow(pa.ipc.open_file(source).read_all()).cast(schema)


def _write_group(out: Store, base: str, rows: pl.DataFrame, first: int, end: int) -> list[dict]:
    """Shard files first..end-1 from their rows, READ_THREADS files at a time (each a
    request to an object store, an fsync on disk)."""
    rows = rows.sort("shard", "rel")
    counts = np.bincount(rows["shard"].to_numpy() - first, minlength=end - first)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])

    def write(i: int) -> dict:
        part = rows.slice(int(starts[i - first]), int(counts[i - first]))
        table = part.select((pl.lit(base) + pl.col("rel")).alias("uri"), "size", "etag", "mtime")
        out.write_atomic(shard_file(i), to_parquet(table.to_arrow().cast(DOCS)))
        return {"shard": i, "documents": part.height, "bytes": int(part["size"].sum() or 0)}

    return each(write, list(range(first, end)))


@contextmanager
def spooled(rows: Iterable[pl.DataFrame], kept: Iterable[pl.DataFrame]) -> Iterator[Spool]:
    """The rows and kept rows in a Spool over a temp folder, removed after."""
    with tempfile.TemporaryDirectory(prefix="batchocr-plan-") as tmp:
        spool = Spool(Path(tmp))
        for frame in kept:
            spool.add("kept", frame)
        for frame in rows:
            spool.add("rows", frame)
        yield spool


def write_plan(out: Store, shards: int, rows: Iterable[pl.DataFrame], kept: Iterable[pl.DataFrame], base: str,
               done: Mapping[str, int]) -> Planned:
    """Plan `rows` over `shards` into OUT's shard files (not plan.json: the caller writes it
    last). `kept`: an earlier plan's (rel, shard); `done`: doc_id -> the shard holding its
    rows in OUT. Both keep their documents where they are; only new ones are dealt."""
    with spooled(rows, kept) as spool:
        groups = min(shards, max(1, -(-spool.rows // STEP_ROWS))) if spool.spilled else 1
        sink = Sink(spool.folder, shards, groups)
        archived = sum(step.height for step in place(spool, shards, base, done, sink))
        return Planned(sink.write(out, base), archived)


def assign(rows: Iterable[pl.DataFrame], shards: int, kept: Iterable[pl.DataFrame] = (), base: str = "",
           done: Mapping[str, int] | None = None) -> pl.DataFrame:
    """write_plan's placing without the files: rel, size, etag, mtime, archived, shard of
    every planned document."""
    with spooled(rows, kept) as spool:
        sink = Sink(spool.folder, shards, 1)
        for _ in place(spool, shards, base, done or {}, sink):
            pass
        return sink.group(0)


def place(spool: Spool, shards: int, base: str, done: Mapping[str, int], sink: Sink) -> Iterator[pl.DataFrame]:
    """Every step's rows to `sink` with their shard; yields each step's archived rows. The
    kept documents' load is counted over all steps before the first new one is dealt."""
    load = np.zeros(shards, dtype=np.float64)
    if spool.spilled and (done or spool.kept):
        for rows, kept in steps(spool):
            if kept.height or done:
                stay = resolve(rows, kept, base, done).filter(pl.col("shard").is_not_null())
                load += np.bincount(stay["shard"].to_numpy(), weights=stay["size"].to_numpy(), minlength=shards)
    for rows, kept in steps(spool):
        rows = resolve(rows, kept, base, done)
        stay = rows.filter(pl.col("shard").is_not_null())
        if not spool.spilled:
            load += np.bincount(stay["shard"].to_numpy(), weights=stay["size"].to_numpy(), minlength=shards)
        new = rows.filter(pl.col("shard").is_null()).sort("size", "rel", descending=[True, False])
        new = new.with_columns(pl.Series("shard", deal(new["size"].to_numpy(), load), dtype=pl.Int32))
        sink.add(stay)
        sink.add(new)
        yield rows.filter(pl.col("archived"))

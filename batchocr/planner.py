"""The planning engine, in bounded memory: documents in batches of columns (a listing's or
an inventory's) to a plan's shard files, the same for both.

    rows     rel (the name after the plan's base URI), size, etag, mtime, archived
    kept     rel, shard: an earlier plan's documents, which stay on their shard

A plan that fits one step (STEP_ROWS rows) is made in memory: repeated names dropped (the
first row stays), kept documents on their shard, new ones dealt largest first (ties by
name) onto the lightest shard (LPT). Past that, rows spill to a temp folder in hash
buckets of the name (a name given twice lands in one bucket), kept rows into the same
buckets. Each bucket in turn: repeated names dropped, kept documents placed (their load
counted), new ones appended to size bands (a band an eighth of an octave, in the order
of the buckets and then of the name). The bands are then dealt from the largest down, a
step at a time, each step sorted by size and name, onto one load array: the LPT of a
plan that fits one step, the same order but for an eighth of an octave beyond. A plan
depends on the set of documents, never on the order they came in. Placed rows go to
spool files of contiguous shard ranges, each then sorted by (shard, name) and written as
the shard files.
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
PLACED = ROWS | KEPT
STEP_ROWS = 50_000  # rows one in-memory step holds; past them rows spill to disk
GROUPS = 256  # spool files of shard ranges at most: a dealt step appends to each, and each is open
BATCH_ROWS = 50_000  # rows a batch of a listing
BUCKETS = 256  # hash buckets of the name on disk
BANDS_AN_OCTAVE = 8  # size bands: documents of one band differ in size by at most 9%
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


def lightest(sizes: Iterator[int], load: Sequence[float], counts: Sequence[int] | None = None) -> Iterator[int]:
    """The shard for each of `sizes` in turn: the lightest so far, of equal loads the one of
    fewest documents (a heap of (load, documents, shard); with sizes largest first, LPT; empty
    documents spread, not piled on one shard). load, counts: each shard's before the first."""
    counts = counts if counts is not None else [0] * len(load)
    heap = [(load[i], counts[i], i) for i in range(len(load))]
    heapq.heapify(heap)
    for size in sizes:
        least, count, i = heap[0]
        heapq.heapreplace(heap, (least + size, count + 1, i))
        yield i


def deal(sizes: np.ndarray, load: np.ndarray, counts: np.ndarray | None = None) -> np.ndarray:
    """Shards for documents of `sizes`, given largest first: each onto the lightest shard
    (lightest()), `load` and `counts` updated. Sizes come as Python ints CHUNK at a time. From
    equal loads two shards differ by at most the largest document, in whatever steps they come."""
    counts = counts if counts is not None else np.zeros(len(load), dtype=np.int64)
    chunks = (sizes[start:start + CHUNK].tolist() for start in range(0, len(sizes), CHUNK))
    out = np.fromiter(lightest(itertools.chain.from_iterable(chunks), load.tolist(), counts.tolist()), np.int32,
                      len(sizes))
    load += np.bincount(out, weights=sizes, minlength=len(load))
    counts += np.bincount(out, minlength=len(load))
    return out


@dataclass
class Files:
    """Frames appended to Arrow IPC files under `folder`, one a key (`prefix-KEY.arrow`), in
    the order they came."""
    folder: Path
    prefix: str
    schema: dict
    writers: dict[int, pa.ipc.RecordBatchFileWriter] = field(default_factory=dict)

    def append(self, frame: pl.DataFrame, key: pl.Expr) -> None:
        """Each row to the file of its `key`: the frame sorted by key (keeping the rows' order
        within a key) and written as slices of one Arrow table."""
        frame = frame.with_columns(key.cast(pl.Int64).alias("_k")).sort("_k", maintain_order=True)
        keys = frame["_k"].to_numpy()
        table = frame.drop("_k").to_arrow()
        starts = np.flatnonzero(np.concatenate([[True], keys[1:] != keys[:-1]])) if len(keys) else []
        for start, end in zip(starts, [*starts[1:], len(keys)]):
            k = int(keys[start])
            if k not in self.writers:
                self.writers[k] = pa.ipc.new_file(str(self._path(k)), table.schema)
            self.writers[k].write_table(table.slice(start, end - start))

    def close(self) -> list[int]:
        """The keys written, in order; nothing can be appended after."""
        for writer in self.writers.values():
            writer.close()
        keys, self.writers = sorted(self.writers), {}
        return keys

    def read(self, k: int, rows: int | None = None) -> Iterator[pl.DataFrame]:
        """Key k's rows: all in one frame, or frames of about `rows` rows."""
        if not self._path(k).exists():
            yield pl.DataFrame(schema=self.schema)
            return
        with pa.OSFile(str(self._path(k))) as source:
            reader = pa.ipc.open_file(source)
            batches = (reader.get_batch(i) for i in range(reader.num_record_batches))
            while held := list(_up_to(batches, rows)):
                yield pl.from_arrow(pa.Table.from_batches(held, reader.schema)).cast(self.schema)

    def _path(self, k: int) -> Path:
        return self.folder / f"{self.prefix}-{k:05d}.arrow"


def _up_to(batches: Iterator[pa.RecordBatch], rows: int | None) -> Iterator[pa.RecordBatch]:
    count = 0
    for batch in batches:
        yield batch
        count += batch.num_rows
        if rows is not None and count >= rows:
            return


@dataclass
class Spool:
    """Rows and kept rows, in memory until they pass STEP_ROWS, then in hash buckets of
    the name under `folder`."""
    folder: Path
    held: dict[str, list[pl.DataFrame]] = field(default_factory=lambda: {"rows": [], "kept": []})
    rows: int = 0
    spilled: bool = False

    def __post_init__(self):
        self.files = {"rows": Files(self.folder, "rows", ROWS), "kept": Files(self.folder, "kept", KEPT)}

    def add(self, kind: str, frame: pl.DataFrame) -> None:
        frame = frame.select(list(self.files[kind].schema)).cast(self.files[kind].schema)
        if kind == "rows":
            frame = frame.with_columns(pl.col("size").fill_null(0), pl.col("archived").fill_null(False))
        self.rows += frame.height
        self.held[kind].append(frame)
        if self.spilled or self.rows > STEP_ROWS:
            self.spilled = True
            for name, frames in self.held.items():
                for held in frames:
                    self.files[name].append(held, pl.col("rel").hash(seed=0) % BUCKETS)
            self.held = {"rows": [], "kept": []}

    def buckets(self) -> Iterator[tuple[pl.DataFrame, pl.DataFrame]]:
        """(rows, kept) of each bucket in bucket order; all of them as one where nothing spilled."""
        if not self.spilled:
            yield _concat(self.held["rows"], ROWS), _concat(self.held["kept"], KEPT)
            return
        for files in self.files.values():
            files.close()
        for b in range(BUCKETS):
            yield next(self.files["rows"].read(b)), next(self.files["kept"].read(b))


def _concat(frames: list[pl.DataFrame], schema: dict) -> pl.DataFrame:
    return pl.concat(frames) if frames else pl.DataFrame(schema=schema)


def resolve(rows: pl.DataFrame, kept: pl.DataFrame, base: str, done: Mapping[str, int]) -> pl.DataFrame:
    """The rows, repeated names dropped (the first stays), with `shard`: the kept one (an
    earlier plan's, else the shard holding the document's rows in OUT), null for a new one."""
    rows = rows.unique("rel", keep="first", maintain_order=True)
    rows = rows.join(kept.unique("rel", keep="first"), on="rel", how="left", maintain_order="left")
    if done:
        new = rows["shard"].is_null().to_numpy()
        shard = rows["shard"].fill_null(-1).to_numpy().copy()
        shard[new] = [done.get(doc_id(base + rel), -1) for rel in rows["rel"].filter(new).to_list()]
        rows = rows.with_columns(shard=pl.Series(shard, dtype=pl.Int32))
        rows = rows.with_columns(pl.when(pl.col("shard") >= 0).then(pl.col("shard")).alias("shard"))
    return rows


@dataclass
class Sink:
    """Placed rows, held (a plan that fits one step) or in spool files of contiguous shard
    ranges, then written as shard files."""
    files: Files
    shards: int
    groups: int
    held: list[pl.DataFrame] = field(default_factory=list)

    def add(self, rows: pl.DataFrame) -> None:
        if self.groups == 1:
            self.held.append(rows)
        else:
            self.files.append(rows, (pl.col("shard").cast(pl.Int64) * self.groups // self.shards).cast(pl.Int32))

    def write(self, out: Store, base: str) -> list[dict]:
        """Each shard's plan file, sorted by name, a group at a time."""
        self.files.close()
        per_shard = []
        for g in range(self.groups):
            first, end = -(-g * self.shards // self.groups), -(-(g + 1) * self.shards // self.groups)
            per_shard += _write_group(out, base, self.group(g), first, end)
        return per_shard

    def group(self, g: int) -> pl.DataFrame:
        return _concat(self.held, PLACED) if self.groups == 1 else next(self.files.read(g))


def _write_group(out: Store, base: str, rows: pl.DataFrame, first: int, end: int) -> list[dict]:
    """Shard files first..end-1 from their rows: each file's bytes made here, one after the
    other, then written READ_THREADS at a time (each a request to an object store, an fsync
    on disk). Only the writes go to threads: a conversion a thread held memory in each
    thread's allocator (a plan of 1M documents peaked 1.7x one of 100k)."""
    rows = rows.sort("shard", "rel")
    shard = rows["shard"].to_numpy() - first
    counts = np.bincount(shard, minlength=end - first)
    sizes = np.bincount(shard, weights=rows["size"].to_numpy(), minlength=end - first)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    table = rows.select((pl.lit(base) + pl.col("rel")).alias("uri"), "size", "etag", "mtime").to_arrow().cast(DOCS)
    del rows, shard
    files = [(i, to_parquet(table.slice(int(starts[i - first]), int(counts[i - first])))) for i in range(first, end)]

    def write(item: tuple[int, bytes]) -> dict:
        i, data = item
        out.write_atomic(shard_file(i), data)
        return {"shard": i, "documents": int(counts[i - first]), "bytes": int(sizes[i - first])}

    return each(write, files)


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
        groups = min(shards, GROUPS, max(1, -(-spool.rows // STEP_ROWS))) if spool.spilled else 1
        sink = Sink(Files(spool.folder, "out", PLACED), shards, groups)
        archived = place(spool, shards, base, done, sink)
        return Planned(sink.write(out, base), archived)


def assign(rows: Iterable[pl.DataFrame], shards: int, kept: Iterable[pl.DataFrame] = (), base: str = "",
           done: Mapping[str, int] | None = None) -> pl.DataFrame:
    """write_plan's placing without the files: rel, size, etag, mtime, archived, shard of
    every planned document."""
    with spooled(rows, kept) as spool:
        sink = Sink(Files(spool.folder, "out", PLACED), shards, 1)
        place(spool, shards, base, done or {}, sink)
        return sink.group(0)


def place(spool: Spool, shards: int, base: str, done: Mapping[str, int], sink: Sink) -> int:
    """Every document to `sink` with its shard: kept ones first (all their load counted),
    then new ones largest first, by size band where the rows spilled. Returns how many
    are archived."""
    load, counts = np.zeros(shards, dtype=np.float64), np.zeros(shards, dtype=np.int64)
    bands = Files(spool.folder, "band", ROWS | KEPT)
    archived = 0
    for rows, kept in spool.buckets():
        rows = resolve(rows, kept, base, done)
        archived += int(rows["archived"].sum())
        stay = rows.filter(pl.col("shard").is_not_null())
        load += np.bincount(stay["shard"].to_numpy(), weights=stay["size"].to_numpy(), minlength=shards)
        counts += np.bincount(stay["shard"].to_numpy(), minlength=shards)
        sink.add(stay)
        new = rows.filter(pl.col("shard").is_null())
        if not spool.spilled:
            sink.add(_dealt(new, load, counts))
            return archived
        band = (pl.col("size").clip(1).cast(pl.Float64).log(2) * BANDS_AN_OCTAVE).floor().cast(pl.Int32)
        bands.append(new.sort("rel"), band)
    for k in reversed(bands.close()):
        for step in bands.read(k, STEP_ROWS):
            sink.add(_dealt(step, load, counts))
    return archived


def _dealt(rows: pl.DataFrame, load: np.ndarray, counts: np.ndarray) -> pl.DataFrame:
    """New documents with their shards: largest first (ties by name) onto the lightest."""
    rows = rows.sort("size", "rel", descending=[True, False])
    return rows.with_columns(pl.Series("shard", deal(rows["size"].to_numpy(), load, counts), dtype=pl.Int32))

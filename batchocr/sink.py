"""Part files: buffered page rows, committed atomically every K pages or T seconds;
and what a shard has already committed (resume)."""

from __future__ import annotations

import io
import time
from dataclasses import dataclass
from typing import Callable

import pyarrow as pa
import pyarrow.parquet as pq

from batchocr import layout, schema
from batchocr.errors import ConfigError, StorageError
from batchocr.layout import shard_dir
from batchocr.spec import CommitSpec
from batchocr.storage import Store, each

FIRST_COMMIT_S = 15.0
KEY_COLUMNS = ["doc_id", "source_etag", "page_index", "page_count", "finish_reason", "error_type", "attempts",
               "run_id", "processed_at"]
# A page (or document) that hung or killed its renderer once is tried again by the
# next run; a row of these with attempts >= 2 is final.
RETRIED_ERRORS = ("timeout", "renderer_crashed")
# Listings of a shard a reader makes before it gives up on parts that vanish as it reads them (read_parts).
PART_READS = 10


def shards_present(store: Store) -> list[int]:
    """Shards that have a folder under OUT/pages."""
    names = store.subfolders(layout.PAGES)
    if layout.is_old_layout(names):
        raise ConfigError(f"{store.url} has the layout of batchocr 0.1 (pages/shard=NNNNN): rename each "
                          f"pages/shard=N, _done/shard=N.json and _plan/shard=N.parquet to shard-N")
    return sorted(s for n in names if (s := layout.shard_of_folder(n)) is not None)


def to_parquet(table: pa.Table) -> bytes:
    buf = io.BytesIO()
    pq.write_table(table, buf, compression="zstd")
    return buf.getvalue()


class PartWriter:
    """Collects finished page rows of one shard and commits them as immutable part
    files. A SIGKILL loses at most the rows not yet committed."""

    def __init__(self, store: Store, shard: int, run_id: str, commit: CommitSpec,
                 clock: Callable[[], float] = time.monotonic):
        self.store = store
        self.shard = shard
        self.run_id = run_id
        self.commit = commit
        self.clock = clock
        self._pending: list[pa.Table] = []
        self._pending_rows = 0
        self._last_commit = clock()
        self.parts: list[str] = []
        self.rows_committed = 0
        store.remove_stale_temps(shard_dir(shard), layout.STAGING)

    def add(self, rows: pa.Table) -> None:
        if rows.num_rows:
            self._pending.append(rows)
            self._pending_rows += rows.num_rows
        # The first part comes early (FIRST_COMMIT_S), so that a new run shows output
        # in its first minute; then every every_pages pages or every_seconds.
        wait = self.commit.every_seconds if self.parts else min(self.commit.every_seconds, FIRST_COMMIT_S)
        if self._pending_rows >= self.commit.every_pages or (
            self._pending_rows and self.clock() - self._last_commit >= wait
        ):
            self.flush()

    def flush(self) -> None:
        if not self._pending_rows:
            return
        table = pa.concat_tables(self._pending).cast(schema.PAGE_TABLE)
        name = layout.part_file(self.shard, self.run_id, len(self.parts))
        self.store.write_atomic(name, to_parquet(table), layout.STAGING)
        self.parts.append(name)
        self.rows_committed += table.num_rows
        self._pending, self._pending_rows = [], 0
        self._last_commit = self.clock()


def unreadable_part(store: Store, rel: str, exc: BaseException) -> StorageError:
    """A part file that is not Parquet (written by something else, or damaged): named, with
    what to do; a fault of OUT (exit 1), not a traceback."""
    return StorageError(f"{store.url.rstrip('/')}/{rel}: not a readable part file "
                        f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); move it out "
                        "of OUT and rerun: its pages are redone")


def find_unreadable_part(store: Store) -> StorageError | None:
    """The first of OUT's part files whose Parquet footer cannot be read, as unreadable_part's
    error; None if every one reads (then what failed was something else)."""
    for rel in store.find(layout.PAGES, suffix=".parquet"):
        try:
            store.read_parquet_metadata(rel)
        except FileNotFoundError:
            continue
        except (pa.ArrowException, OSError) as exc:
            return unreadable_part(store, rel, exc)
    return None


def read_parts(store: Store, shard: int, read: Callable[[str], pa.Table]) -> tuple[list[str], list[pa.Table]]:
    """A shard's part files (paths, in name order) and each one `read`. Compaction
    (batchocr compact) may delete a part between the listing and its read: it
    commits the compacted file first, so the shard is listed again and the parts
    new to that listing are read (each part is immutable: one read stays good
    while the part is listed). A few small requests a part: in parallel, so a
    shard of a thousand parts does not wait on them one after another."""
    tables: dict[str, pa.Table] = {}

    def attempt(rel: str) -> pa.Table | None:
        try:
            return read(rel)
        except FileNotFoundError:
            return None
        except pa.ArrowException as exc:  # not Parquet: written by something else, or damaged
            raise unreadable_part(store, rel, exc) from None

    for _ in range(PART_READS):
        parts = store.find(shard_dir(shard), suffix=".parquet")
        tables = {p: t for p, t in tables.items() if p in parts}  # gone: compacted into a part listed now
        new = [p for p in parts if p not in tables]
        tables.update((p, t) for p, t in zip(new, each(attempt, new)) if t is not None)
        if len(tables) == len(parts):
            return parts, [tables[p] for p in parts]
    raise StorageError(f"{store.url.rstrip('/')}/{shard_dir(shard)}: its part files kept disappearing while "
                       f"read ({PART_READS} listings): is something other than batchocr compact deleting them?")


def committed_keys(store: Store, shard: int) -> pa.Table:
    """The key columns (KEY_COLUMNS) of every row committed in a shard: only those
    columns' bytes are read (resume and status never download the text)."""
    _, tables = read_parts(store, shard, lambda rel: store.read_parquet(rel, KEY_COLUMNS))
    if not tables:
        return pa.table({c: pa.array([], schema.PAGE_TABLE.field(c).type) for c in KEY_COLUMNS})
    return pa.concat_tables(tables)


def committed_runs(store: Store, shard: int) -> set[str]:
    """The ids of the runs with rows committed in a shard: a run's part file names it; a
    compacted part holds many runs' rows, whose run_id column alone is read."""
    def read(rel: str) -> pa.Table:
        run = layout.part_run(rel)
        return pa.table({"run_id": [run]}) if run is not None else store.read_parquet(rel, ["run_id"])

    _, tables = read_parts(store, shard, read)
    return {run for table in tables for run in table.column("run_id").unique().to_pylist()}


@dataclass(frozen=True)
class Resume:
    """What a run still has to do for a document: render every page but `skip`;
    `retry` (pages, or -1 for the document) failed once and are tried again."""

    skip: frozenset[int]
    retry: frozenset[int] = frozenset()


def is_final(error_type: str | None, attempts: int | None) -> bool:
    return error_type not in RETRIED_ERRORS or (attempts or 1) >= 2


def completed(keys: pa.Table) -> dict[tuple[str, str], Resume | None]:
    """For each (doc_id, etag) seen: None if the document is complete, else what
    is left. Complete means every page has a final row: once its page count is
    known, a document-level row (-1) stands in for no page.

    Only a document's latest version counts (the etag of its latest row; compaction,
    batchocr.compact.dedupe, keeps it once it is whole). A document whose file went back to an
    earlier version (restored from a backup with its mtime, `cp -p`; an ETag that is the
    content's hash) lists that version's etag, which is not complete then: it is read
    again, or compaction would keep the newer version's rows for a file that holds the
    older one."""
    final: dict[tuple[str, str], set[int]] = {}
    tried: dict[tuple[str, str], set[int]] = {}
    counts: dict[tuple[str, str], int] = {}
    latest: dict[str, tuple[int, str]] = {}  # doc_id -> (processed_at, etag) of its latest row
    cols = keys.select(["doc_id", "source_etag", "page_index", "page_count", "error_type", "attempts"]).to_pydict()
    written = keys.column("processed_at").cast(pa.int64()).to_pylist()  # microseconds, as dedupe orders them
    for doc, etag, index, count, error, attempts, at in zip(*cols.values(), written):
        key = (doc, etag)
        (final if is_final(error, attempts) else tried).setdefault(key, set()).add(index)
        if count is not None:
            counts[key] = count
        at = -1 if at is None else at
        if doc not in latest or (at, etag) > latest[doc]:
            latest[doc] = (at, etag)
    out: dict[tuple[str, str], Resume | None] = {}
    for key in final.keys() | tried.keys():
        if latest[key[0]][1] != key[1]:  # an older version of the document: not done, whatever it holds
            continue
        done, failed = final.get(key, set()), tried.get(key, set()) - final.get(key, set())
        count = counts.get(key)
        if count is None:  # only document-level rows: it never opened
            out[key] = None if -1 in done else Resume(frozenset(), frozenset({-1}))
        elif done.issuperset(range(count)):
            out[key] = None
        else:
            out[key] = Resume(frozenset(i for i in done if i >= 0), frozenset(i for i in failed if i >= 0))
    return out

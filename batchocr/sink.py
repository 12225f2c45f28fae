"""Part files: buffered page rows, committed atomically every K pages or T seconds;
and what a shard has already committed (resume)."""

from __future__ import annotations

import io
import time
from typing import Callable

import pyarrow as pa
import pyarrow.parquet as pq

from batchocr import layout, schema
from batchocr.errors import ConfigError
from batchocr.layout import done_marker, shard_dir  # noqa: F401  (callers import them from here too)
from batchocr.spec import CommitSpec
from batchocr.storage import Store

KEY_COLUMNS = ["doc_id", "source_etag", "page_index", "page_count", "finish_reason", "run_id"]


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
        if self._pending_rows >= self.commit.every_pages or (
            self._pending_rows and self.clock() - self._last_commit >= self.commit.every_seconds
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


def committed_keys(store: Store, shard: int) -> pa.Table:
    """The key columns (KEY_COLUMNS) of every row committed in a shard."""
    tables = [
        pq.read_table(io.BytesIO(store.read_bytes(rel)), columns=KEY_COLUMNS)
        for rel in store.find(shard_dir(shard), suffix=".parquet")
    ]
    if not tables:
        return pa.table({c: pa.array([], schema.PAGE_TABLE.field(c).type) for c in KEY_COLUMNS})
    return pa.concat_tables(tables)


def completed(keys: pa.Table) -> dict[tuple[str, str], frozenset[int] | None]:
    """For each (doc_id, etag) seen: None if the document is complete, else the page
    indexes already done (a half-done document resumes at its first missing page)."""
    pages: dict[tuple[str, str], set[int]] = {}
    counts: dict[tuple[str, str], int | None] = {}
    cols = keys.to_pydict()
    for doc, etag, index, count in zip(cols["doc_id"], cols["source_etag"], cols["page_index"], cols["page_count"]):
        key = (doc, etag)
        pages.setdefault(key, set()).add(index)
        if count is not None:
            counts[key] = count
    out: dict[tuple[str, str], frozenset[int] | None] = {}
    for key, done in pages.items():
        count = counts.get(key)
        whole = -1 in done or (count is not None and done.issuperset(range(count)))
        out[key] = None if whole else frozenset(done)
    return out

"""Reading the page table back: a polars LazyFrame over OUT/pages, wherever OUT is."""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, Mapping

import polars as pl

from batchocr import layout, schema
from batchocr.errors import ConfigError, StorageError
from batchocr.storage import Store, environment_secrets, redact


def read_pages(out: str, storage_options: Mapping[str, Any] | None = None) -> pl.LazyFrame:
    """All committed page rows under OUT (before compaction a resumed page can
    appear in more than one part: `batchocr compact` keeps one row per page).

    OUT anywhere, with the same storage options as `batchocr run`: polars reads
    object stores through its own client, whose options the Store translates
    (for Azure: account_name/account_key/endpoint instead of a connection string)."""
    store = Store(out, storage_options)
    parts = store.find(layout.PAGES, suffix=".parquet")
    if not parts:
        if has_no_rows_yet(store):
            return pl.LazyFrame(schema=PAGE_SCHEMA)
        raise no_page_table(out)
    return _scan(store, parts)


def _scan(store: Store, parts: list[str]) -> pl.LazyFrame:
    options, credential_provider = store.polars_options()
    # The schema is this version's: a part written before a column existed (route,
    # skew_angle) reads with it null, so an OUT resumed across versions still opens.
    paths = [store.reader_uri(p) for p in parts]
    # glob off: the parts' names are listed already, and an OUT named `run[1]` or `batch?1` is
    # no pattern (as one, it would match nothing: an empty table, silently)
    return pl.scan_parquet(paths, hive_partitioning=False, glob=False,
                           schema=PAGE_SCHEMA, missing_columns="insert", extra_columns="ignore",
                           storage_options=options, credential_provider=credential_provider)


# Part files a group of shard_groups holds at most (more where one shard has more): a
# reader collects a group at a time, so its memory follows the group, not the table.
GROUP_PARTS = 64


def shard_groups(out: str, storage_options: Mapping[str, Any] | None = None,
                 group_parts: int | None = None) -> Iterator[tuple[list[int], pl.LazyFrame]]:
    """read_pages' rows a few whole shards at a time (a document's rows are all in its shard):
    (the shards, a scan of their parts), listed once. Readers that keep one row a page
    (compaction's rule) or whole documents work a group at a time and merge what each yields."""
    store = Store(out, storage_options)
    parts = store.find(layout.PAGES, suffix=".parquet")
    if not parts and not has_no_rows_yet(store):
        raise no_page_table(out)
    by_shard: dict[int, list[str]] = {}
    for rel in parts:
        shard = layout.shard_of_folder(rel.split("/")[-2]) if rel.count("/") >= 2 else None
        by_shard.setdefault(-1 if shard is None else shard, []).append(rel)
    shards: list[int] = []
    held: list[str] = []
    for shard in sorted(by_shard):
        shards.append(shard)
        held += by_shard[shard]
        if len(held) >= (group_parts or GROUP_PARTS):
            yield shards, _scan(store, held)
            shards, held = [], []
    if held:
        yield shards, _scan(store, held)


PAGE_SCHEMA = pl.from_arrow(schema.PAGE_TABLE.empty_table()).schema


def has_no_rows_yet(store: Store) -> bool:
    """An OUT with no page table is batchocr's output all the same when runs have written it
    (their runs found no document yet: an empty source; the parts of `processes` N that found
    none load no engine, so their shard's done-marker is all they write) or `batchocr plan`
    has (no run has committed a row yet): a table of no rows, not an error."""
    return (store.exists(layout.PRODUCER) or store.exists(layout.PLAN)
            or bool(store.find(layout.DONE, suffix=".json")))


def no_page_table(out: str) -> ConfigError:
    return ConfigError(f"no page table under {out} (expected {out}/{layout.PAGES}/shard-*/part-*.parquet)")


@contextlib.contextmanager
def reading(out: str, storage_options: Mapping[str, Any] | None = None) -> Iterator[None]:
    """polars reads read_pages' parts only when a frame is collected: a part compacted away
    since the listing, or a store that fails past its client's retries, is then one line
    (StorageError, exit 1; redacted), not polars' traceback."""
    try:
        yield
    except FileNotFoundError:
        raise StorageError(f"{out}: a part file went away while it was read (`batchocr compact` at work?): "
                           "run the command again") from None
    except (OSError, pl.exceptions.ComputeError) as exc:
        from batchocr.sink import find_unreadable_part

        bad = None
        with contextlib.suppress(Exception):  # which part, where one is not Parquet (polars does not say)
            bad = find_unreadable_part(Store(out, storage_options))
        if bad is not None:
            raise bad from None
        secrets = [str(v) for v in (storage_options or {}).values() if isinstance(v, str)]
        first = (str(exc).strip().splitlines() or [""])[0]
        raise StorageError(redact(f"{out}: reading the page table failed: {type(exc).__name__}: {first}",
                                  secrets + list(environment_secrets()))) from None

"""Reading the page table back: a polars LazyFrame over OUT/pages, wherever OUT is."""

from __future__ import annotations

from typing import Any, Mapping

import polars as pl

from batchocr import layout, schema
from batchocr.errors import ConfigError
from batchocr.storage import Store


def read_pages(out: str, storage_options: Mapping[str, Any] | None = None) -> pl.LazyFrame:
    """All committed page rows under OUT (before compaction a resumed page can
    appear in more than one part: `batchocr compact` keeps one row per page).

    OUT anywhere, with the same storage options as `batchocr run`: polars reads
    object stores through its own client, whose options the Store translates
    (for Azure: account_name/account_key/endpoint instead of a connection string)."""
    store = Store(out, storage_options)
    parts = store.find(layout.PAGES, suffix=".parquet")
    if not parts:
        raise ConfigError(f"no page table under {out} (expected {out}/{layout.PAGES}/shard-*/part-*.parquet)")
    options, credential_provider = store.polars_options()
    # The schema is this version's: a part written before a column existed (route,
    # skew_angle) reads with it null, so an OUT resumed across versions still opens.
    paths = [store.uri(store.local_path(p) if store.is_local else store.path(p)) for p in parts]
    return pl.scan_parquet(paths, hive_partitioning=False,
                           schema=PAGE_SCHEMA, missing_columns="insert", extra_columns="ignore",
                           storage_options=options, credential_provider=credential_provider)


PAGE_SCHEMA = pl.from_arrow(schema.PAGE_TABLE.empty_table()).schema

"""A plan from an inventory instead of a listing: Azure Storage's blob inventory (its
manifest JSON naming Parquet or CSV report files) or a plain manifest of SOURCE's files.

The inventory is scanned by polars (columns, not a Python object a document), filtered
to SOURCE and the document extensions, and streamed in batches into the planning engine
that `make_plan` feeds a listing into (batchocr/planner.py): the same files, rows and
plan.json, so runs, `status` and `compact` read it as any plan.

    Azure's manifest   <rule>-manifest.json: {"files": [{"blob": ".../<rule>_1.parquet"}, ...]}
                       beside its report files; a report's `Name` is `container/blob`
    plain manifest     a Parquet or CSV file (or a folder of them): `Name` relative to SOURCE

Columns: `Name`, `Content-Length`, and where present `Etag`, `Last-Modified` (or
`LastModified`) and `AccessTier`. A blob in the Archive tier cannot be read until it is
rehydrated: it is planned as any other (as a listing plans it), and counted; the run gives
it its `unreadable` row, naming the tier.
"""

from __future__ import annotations

import dataclasses
import json
import posixpath
from dataclasses import dataclass
from typing import Iterator

import polars as pl

from batchocr.errors import ConfigError
from batchocr.inventoryruns import REPORTS, newest_manifest
from batchocr.plan import PlanInfo, base_uri, existing_shards, kept_rows, write_info
from batchocr.planner import BATCH_ROWS, write_plan
from batchocr.sources import EXTENSIONS
from batchocr.storage import Store

LAST_MODIFIED = ("Last-Modified", "LastModified")


@dataclass(frozen=True)
class Inventory:
    url: str
    files: tuple[tuple[Store, str], ...]  # (folder, name) of each report file
    azure: bool  # names are `container/blob` (Azure's report), else relative to SOURCE


@dataclass(frozen=True)
class InventoryPlan:
    info: PlanInfo
    archived: int  # documents under SOURCE in the Archive tier (planned: a run gives each its unreadable row)


def open_inventory(url: str, options: dict | None = None) -> Inventory:
    """The report files URL names: a manifest JSON, a Parquet or CSV file, or a folder of
    them; a folder of Azure's manifests or dated runs is read through its newest Succeeded
    manifest (inventoryruns.newest_manifest)."""
    url = newest_manifest(url, options)
    if url.lower().endswith(".json"):
        return _from_manifest(url, options)
    if url.lower().endswith(REPORTS):
        return Inventory(url, ((Store(_folder(url), options), posixpath.basename(url)),), azure=False)
    folder = Store(url, options)
    reports = [n for n in _files(folder) if n.lower().endswith(REPORTS)]
    if not reports:
        raise ConfigError(f"--inventory {url}: no manifest JSON, Parquet or CSV file there")
    return Inventory(url, tuple((folder, n) for n in reports), azure=False)


def _files(folder: Store) -> list[str]:
    try:
        return folder.find("")
    except FileNotFoundError:
        return []


def _folder(url: str) -> str:
    return posixpath.dirname(url.rstrip("/")) or "."


def _from_manifest(url: str, options: dict | None) -> Inventory:
    """Azure's manifest: its report files lie beside it (`files[].blob` is their path in the
    destination container, whose last part is the file's name)."""
    folder = Store(_folder(url), options)
    name = posixpath.basename(url)
    try:
        raw = json.loads(folder.read_bytes(name))
        files = [posixpath.basename(f["blob"]) for f in raw["files"]]
    except FileNotFoundError:
        raise ConfigError(f"--inventory {url}: no such manifest") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"--inventory {url}: not an Azure inventory manifest ({type(exc).__name__}: "
                          f"{str(exc)[:100]}); expected {{\"files\": [{{\"blob\": ...}}]}}") from None
    if raw.get("status", "Succeeded") != "Succeeded":
        raise ConfigError(f"--inventory {url}: the inventory run's status is {raw['status']!r}, not 'Succeeded'")
    if not files:
        raise ConfigError(f"--inventory {url}: the manifest names no report file")
    return Inventory(url, tuple((folder, f) for f in files), azure=True)


def scan(inventory: Inventory) -> pl.LazyFrame:
    """Every report file's rows as Name, size, etag, mtime, tier (a column a file lacks is null)."""
    frames = []
    for folder, name in inventory.files:
        options, credentials = folder.polars_options()
        path = folder.reader_uri(name)
        if name.lower().endswith(".csv"):
            frame = pl.scan_csv(path, infer_schema=False, storage_options=options, credential_provider=credentials)
        else:
            frame = pl.scan_parquet(path, glob=False, storage_options=options, credential_provider=credentials)
        frames.append(_normal(frame, f"{inventory.url}: {name}"))
    return pl.concat(frames, how="vertical")


def _normal(frame: pl.LazyFrame, where: str) -> pl.LazyFrame:
    try:
        schema = frame.collect_schema()
    except (pl.exceptions.PolarsError, OSError) as exc:
        raise ConfigError(f"--inventory {where}: cannot read it ({_reason(exc)})") from None
    missing = [c for c in ("Name", "Content-Length") if c not in schema]
    if missing:
        raise ConfigError(f"--inventory {where}: no column {' or '.join(missing)} "
                          f"(its columns: {', '.join(list(schema)[:8])})")
    modified = next((c for c in LAST_MODIFIED if c in schema), None)
    keep = pl.lit(True)
    if "Snapshot" in schema:  # a snapshot's row: the blob itself has its own
        keep = keep & (pl.col("Snapshot").cast(pl.String).fill_null("") == "")
    if "IsCurrentVersion" in schema:  # an earlier version's row
        keep = keep & pl.col("IsCurrentVersion").cast(pl.String).str.to_lowercase().is_in(["true", "1"]).fill_null(True)
    return frame.filter(keep).select(
        pl.col("Name").cast(pl.String).alias("name"),
        pl.col("Content-Length").cast(pl.Int64).alias("size"),
        (pl.col("Etag").cast(pl.String).str.strip_chars('"') if "Etag" in schema else pl.lit(None, pl.String))
        .alias("etag"),
        (_seconds(pl.col(modified), schema[modified]) if modified else pl.lit(None, pl.Float64)).alias("mtime"),
        (pl.col("AccessTier").cast(pl.String) if "AccessTier" in schema else pl.lit(None, pl.String)).alias("tier"),
    )


def _seconds(col: pl.Expr, dtype: pl.DataType) -> pl.Expr:
    """Last-Modified as seconds since the epoch: a number as it is; a timestamp or ISO 8601
    text as os.stat's float of that time (whole seconds + nanoseconds * 1e-9, as CPython
    adds them), so that a listing's mtime of the file, and the etag made of it, agree."""
    if dtype.is_numeric():
        return col.cast(pl.Float64)
    if isinstance(dtype, pl.Datetime):
        return _stat_float(col.dt.epoch("us"))
    text = col.cast(pl.String)
    parsed = _stat_float(text.str.to_datetime(strict=False, time_unit="us", time_zone="UTC").dt.epoch("us"))
    return pl.coalesce(text.cast(pl.Float64, strict=False), parsed)


def _stat_float(us: pl.Expr) -> pl.Expr:
    return (us // 1_000_000).cast(pl.Float64) + ((us % 1_000_000) * 1000).cast(pl.Float64) * 1e-9


def _spelled(col: pl.Expr) -> pl.Expr:
    """spell() of every name: `%` and control characters as %XX (a name from a table is text)."""
    col = col.str.replace_all("%", "%25", literal=True)
    for code in [*range(0x20), 0x7F]:
        col = col.str.replace_all(chr(code), f"%{code:02X}", literal=True)
    return col


def documents(inventory: Inventory, source: Store) -> pl.LazyFrame:
    """SOURCE's documents in the inventory's order as plan rows, `rel` (the uri after
    base_uri(source): held once, not in every row), size, etag, mtime, and whether each is
    `archived` (in the Archive tier). A listed plan spells a document's uri as SOURCE's
    canonical URI, `/`, its name under SOURCE (sources.list_documents)."""
    under = source.root.rstrip("/") + "/" if inventory.azure else ""
    rows = scan(inventory).filter(pl.col("name").str.starts_with(under))
    rel = pl.col("name").str.slice(len(under))
    lower = rel.str.to_lowercase()
    rows = rows.filter(pl.any_horizontal([lower.str.ends_with(e) for e in EXTENSIONS]))
    if inventory.azure:  # Azure's listing has Last-Modified in whole seconds (an HTTP date); a report may have more
        rows = rows.with_columns(pl.col("mtime").floor())
    # a store without ETags: "<size>-<mtime in us>", as sources._etag
    etag = pl.coalesce(pl.col("etag"), pl.format("{}-{}", pl.col("size"),
                                                 (pl.col("mtime") * 1e6).cast(pl.Int64).fill_null(0)))
    archived = pl.col("tier").fill_null("").str.to_lowercase() == "archive"
    return rows.select(_spelled(rel).alias("rel"), "size", etag.alias("etag"), "mtime", archived.alias("archived"))


def _reason(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ''}"


def batches(inventory: Inventory, source: Store) -> Iterator[pl.DataFrame]:
    """SOURCE's documents in the inventory (documents()), streamed by polars BATCH_ROWS at a
    time, one report file after another: the streaming engine runs ahead of its reader, so a
    file at a time bounds what it holds by the largest report file, not by the inventory."""
    for file in inventory.files:
        try:
            yield from documents(dataclasses.replace(inventory, files=(file,)), source).collect_batches(
                chunk_size=BATCH_ROWS, engine="streaming")
        except (pl.exceptions.PolarsError, OSError) as exc:
            raise ConfigError(f"--inventory {inventory.url}: cannot read it ({_reason(exc)})") from None


def plan_from_inventory(source: Store, out: Store, shards: int, url: str,
                        options: dict | None = None) -> InventoryPlan:
    """make_plan's plan from the inventory at `url` instead of a listing, by the same engine
    (planner.write_plan): an earlier plan's documents keep their shards, as do documents
    with rows in OUT; plan.json is written last."""
    _, done = existing_shards(source, out, shards)
    inventory = open_inventory(url, options)
    base = base_uri(source)
    rows = batches(inventory, source)
    planned = write_plan(out, shards, rows, kept_rows(out, shards, base), base, done)
    return InventoryPlan(write_info(out, source, shards, planned), planned.archived)

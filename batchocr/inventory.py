"""A plan from an inventory instead of a listing: Azure Storage's blob inventory (its
manifest JSON naming Parquet or CSV report files) or a plain manifest of SOURCE's files.

The inventory is scanned by polars (columns, not a Python object a document), filtered
to SOURCE and the document extensions, balanced by size from numpy arrays (a heap over
the shards, no object a document), and each shard's
plan file is written from one slice of the sorted table: the same files, rows and
plan.json as `make_plan` writes for a listing, so runs, `status` and `compact` read it
as any plan.

    Azure's manifest   <rule>-manifest.json: {"files": [{"blob": ".../<rule>_1.parquet"}, ...]}
                       beside its report files; a report's `Name` is `container/blob`
    plain manifest     a Parquet or CSV file (or a folder of them): `Name` relative to SOURCE

Columns: `Name`, `Content-Length`, and where present `Etag`, `Last-Modified` (or
`LastModified`) and `AccessTier`. A blob in the Archive tier cannot be read until it is
rehydrated: it is left out of the plan and counted (a later plan takes it in).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import itertools
import json
import posixpath
from dataclasses import dataclass

import numpy as np
import polars as pl

from batchocr.errors import ConfigError
from batchocr.inventoryruns import REPORTS, newest_manifest
from batchocr.layout import PLAN
from batchocr.layout import plan_shard as shard_file
from batchocr.plan import DOCS, PlanInfo, existing_shards, lightest
from batchocr.sink import to_parquet
from batchocr.sources import EXTENSIONS, doc_id, spell
from batchocr.storage import Store
from batchocr.storage.store import each

LAST_MODIFIED = ("Last-Modified", "LastModified")


@dataclass(frozen=True)
class Inventory:
    url: str
    files: tuple[tuple[Store, str], ...]  # (folder, name) of each report file
    azure: bool  # names are `container/blob` (Azure's report), else relative to SOURCE


@dataclass(frozen=True)
class InventoryPlan:
    info: PlanInfo
    archived: int  # documents under SOURCE in the Archive tier, left out


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
    """Last-Modified as seconds since the epoch: a number, a timestamp, or ISO 8601 text."""
    if dtype.is_numeric():
        return col.cast(pl.Float64)
    if isinstance(dtype, pl.Datetime):
        return col.dt.epoch("us").cast(pl.Float64) / 1e6
    text = col.cast(pl.String)
    parsed = text.str.to_datetime(strict=False, time_unit="us", time_zone="UTC").dt.epoch("us").cast(pl.Float64) / 1e6
    return pl.coalesce(text.cast(pl.Float64, strict=False), parsed)


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
    # a store without ETags: "<size>-<mtime in us>", as sources._etag
    etag = pl.coalesce(pl.col("etag"), pl.format("{}-{}", pl.col("size"),
                                                 (pl.col("mtime") * 1e6).cast(pl.Int64).fill_null(0)))
    archived = pl.col("tier").fill_null("").str.to_lowercase() == "archive"
    return rows.select(_spelled(rel).alias("rel"), "size", etag.alias("etag"), "mtime", archived.alias("archived"))


def base_uri(source: Store) -> str:
    return spell(source.canonical).rstrip("/") + "/"


def repeated(rel: pl.Series) -> np.ndarray:
    """True for a name an earlier row has already (an inventory of several rules, a manifest
    written twice): by a 64-bit hash, and among the rows whose hash repeats, by the name."""
    hashes = rel.hash(seed=0).to_numpy()
    order = np.argsort(hashes, kind="stable")
    hashes = hashes[order]
    same = hashes[1:] == hashes[:-1]
    del hashes
    maybe = np.zeros(len(rel), dtype=bool)
    maybe[order[1:][same]] = True
    maybe[order[:-1][same]] = True
    del order, same
    rows = np.flatnonzero(maybe)
    out = np.zeros(len(rel), dtype=bool)
    if len(rows):
        out[rows] = ~rel.gather(rows).is_first_distinct().to_numpy()
    return out


def _reason(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ''}"


def _collect(frame: pl.LazyFrame, url: str) -> pl.DataFrame:
    try:
        return frame.collect(engine="streaming")
    except (pl.exceptions.PolarsError, OSError) as exc:
        raise ConfigError(f"--inventory {url}: cannot read it ({_reason(exc)})") from None


def kept_shards(out: Store, shards: int, docs: pl.DataFrame, base: str, done: dict[str, int]) -> np.ndarray:
    """Each document's shard where it must stay (an earlier plan's, or the one holding its
    rows), -1 where it is new."""
    shard = np.full(docs.height, -1, dtype=np.int32)
    if out.exists(PLAN):
        options, credentials = out.polars_options()
        old = pl.concat([pl.scan_parquet(out.reader_uri(shard_file(i)), glob=False, storage_options=options,
                                         credential_provider=credentials)
                         .select(pl.col("uri").str.strip_prefix(base).alias("rel"), shard=pl.lit(i, pl.Int32))
                         for i in range(shards)]).collect(engine="streaming")
        joined = docs.select("rel").join(old, on="rel", how="left", maintain_order="left")["shard"]
        shard = joined.fill_null(-1).cast(pl.Int32).to_numpy(writable=True)  # documents with rows are set below
    if done:
        new = np.flatnonzero(shard < 0)
        ids = [doc_id(base + rel) for rel in docs["rel"].gather(new).to_list()]
        shard[new] = [done.get(i, -1) for i in ids]
    return shard


CHUNK = 100_000  # documents a step of deal(): Python ints for these only


def deal(sizes: np.ndarray, shards: int, load: np.ndarray) -> np.ndarray:
    """Shards for documents of `sizes`: largest first onto the lightest shard (LPT,
    plan.lightest), ties in size in the inventory's order. A heap operation a document,
    ~1 s a million; the documents' sizes come as Python ints CHUNK at a time, never all
    at once. From equal loads two shards differ by at most the largest document."""
    order = np.argsort(np.negative(sizes), kind="stable")
    chunks = (sizes[order[start:start + CHUNK]].tolist() for start in range(0, len(order), CHUNK))
    out = np.empty(len(sizes), dtype=np.int32)
    out[order] = np.fromiter(lightest(itertools.chain.from_iterable(chunks), load.tolist()), np.int32, len(order))
    return out


def balance(sizes: np.ndarray, shards: int, kept: np.ndarray, planned: np.ndarray) -> np.ndarray:
    """A shard for every planned document (`shards` for the rest): kept ones where they
    are, new ones dealt by deal()."""
    stay = planned & (kept >= 0)
    load = np.bincount(kept[stay], weights=sizes[stay], minlength=shards)
    del stay
    new = np.flatnonzero(planned & (kept < 0))
    shard = np.where(planned, kept, np.int32(shards))
    shard[new] = deal(sizes[new], shards, load)
    return shard


def write_shards(out: Store, docs: pl.DataFrame, base: str, shard: np.ndarray, shards: int) -> list[dict]:
    """Each shard's plan file: its rows gathered, sorted by uri, READ_THREADS files at a
    time (each a request to an object store, an fsync on disk)."""
    order = np.argsort(shard, kind="stable")
    counts = np.bincount(shard, minlength=shards + 1)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])

    def write(i: int) -> dict:
        rows = docs[order[starts[i]:starts[i] + counts[i]]].sort("rel")
        rows = rows.select((pl.lit(base) + pl.col("rel")).alias("uri"), "size", "etag", "mtime")
        out.write_atomic(shard_file(i), to_parquet(rows.to_arrow().cast(DOCS)))
        return {"shard": i, "documents": int(counts[i]), "bytes": int(rows["size"].sum() or 0)}

    return each(write, list(range(shards)))


def assign(out: Store, shards: int, docs: pl.DataFrame, base: str, done: dict[str, int]) -> tuple[np.ndarray, int]:
    """(each row's shard, `shards` where it is not planned; how many archived documents are
    left out). Its arrays are gone once it returns, before the plan files are written."""
    first = ~repeated(docs["rel"])
    archived = first & docs["archived"].to_numpy()
    planned = first & ~archived
    del first
    sizes = docs["size"].fill_null(0).to_numpy()
    return balance(sizes, shards, kept_shards(out, shards, docs, base, done), planned), int(archived.sum())


def plan_from_inventory(source: Store, out: Store, shards: int, url: str,
                        options: dict | None = None) -> InventoryPlan:
    """make_plan's plan from the inventory at `url` instead of a listing: an earlier plan's
    documents keep their shards, as do documents with rows in OUT; plan.json is written last."""
    _, done = existing_shards(source, out, shards)
    inventory = open_inventory(url, options)
    docs = _collect(documents(inventory, source), url)
    base = base_uri(source)
    shard, archived = assign(out, shards, docs, base, done)
    per_shard = write_shards(out, docs.drop("archived"), base, shard, shards)
    info = PlanInfo(
        source=source.canonical, shards=shards, documents=sum(s["documents"] for s in per_shard),
        bytes=sum(s["bytes"] for s in per_shard), created_at=dt.datetime.now(dt.UTC).isoformat(),
        per_shard=tuple(per_shard),
    )
    out.write_json(PLAN, dataclasses.asdict(info))
    return InventoryPlan(info, archived)

"""`batchocr plan --inventory` over a synthetic inventory of N rows: wall time and the
child process's peak RSS.

The inventory is what Azure's blob inventory writes for a container of scans: report
files of 1,000,000 rows each with Azure's field names (Name, Content-Length, Etag,
Last-Modified as a timestamp, AccessTier: 1 in 10,000 Archive), names such as
`2019/07/batch-00412/scan-0004123456.pdf` (a few in 100 not documents: .xml, .json),
sizes log-normal around 300 KB. Read as a plain manifest (names relative to SOURCE,
an empty local folder), so only reading, balancing and writing the plan cost anything.

    python bench/inventory.py --rows 1000000 --shards 1000 --folder /tmp/inv
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

FILE_ROWS = 1_000_000


def write_inventory(folder: Path, rows: int, seed: int = 0) -> None:
    """Report files `inventory_<n>.parquet` of FILE_ROWS rows each under folder."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for n, start in enumerate(range(0, rows, FILE_ROWS)):
        count = min(FILE_ROWS, rows - start)
        ids = np.arange(start, start + count)
        years = 2015 + ids % 10
        months = 1 + (ids // 7) % 12
        ext = np.where(rng.random(count) < 0.03, ".xml", ".pdf")
        names = [f"{y}/{m:02d}/batch-{i // 10000:05d}/scan-{i:010d}{e}"
                 for y, m, i, e in zip(years.tolist(), months.tolist(), ids.tolist(), ext.tolist())]
        sizes = rng.lognormal(np.log(300_000), 1.0, count).astype(np.int64) + 1
        etags = [f"0x8DB{v:013X}" for v in rng.integers(0, 2**52, count).tolist()]
        modified = (1.6e15 + rng.integers(0, 10**14, count)).astype("datetime64[us]")
        tiers = np.where(rng.random(count) < 1e-4, "Archive", np.where(rng.random(count) < 0.2, "Cool", "Hot"))
        table = pa.table({"Name": names, "Content-Length": sizes, "Etag": etags,
                          "Last-Modified": pa.array(modified, pa.timestamp("us", "UTC")), "AccessTier": tiers})
        pq.write_table(table, folder / f"inventory_{n}.parquet", compression="snappy")


def time_plan(source: Path, out: Path, shards: int, *options: str) -> tuple[float, int, str]:
    """(wall seconds, peak RSS in bytes, stdout) of `batchocr plan SOURCE OUT --shards N OPTIONS`
    (bench/plan_listing.py's too): the child's own rusage (wait4), not the largest child's so far."""
    if out.exists():
        shutil.rmtree(out)
    started = time.perf_counter()
    with tempfile.TemporaryFile("w+") as said, tempfile.TemporaryFile("w+") as errors:
        proc = subprocess.Popen([sys.executable, "-m", "batchocr.cli", "plan", str(source), str(out), "--shards",
                                 str(shards), *options], stdout=said, stderr=errors, text=True)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - started
        said.seek(0)
        errors.seek(0)
        if os.waitstatus_to_exitcode(status):
            raise SystemExit(f"plan failed ({os.waitstatus_to_exitcode(status)}): {errors.read()[-2000:]}")
        return wall, usage.ru_maxrss * 1024, said.read().strip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1_000_000])
    parser.add_argument("--shards", type=int, default=1000)
    parser.add_argument("--folder", type=Path, default=Path("/tmp/batchocr-inventory-bench"))
    args = parser.parse_args()
    source = args.folder / "scans"
    source.mkdir(parents=True, exist_ok=True)
    for rows in args.rows:
        inventory = args.folder / f"inventory-{rows}"
        if not inventory.exists():  # written under a temp name: a killed generator leaves no partial one
            started = time.perf_counter()
            shutil.rmtree(inventory.with_suffix(".tmp"), ignore_errors=True)
            write_inventory(inventory.with_suffix(".tmp"), rows)
            inventory.with_suffix(".tmp").rename(inventory)
            print(f"wrote {rows:,} rows in {time.perf_counter() - started:.0f} s", flush=True)
        load = os.getloadavg()[0]
        wall, peak, said = time_plan(source, args.folder / "out", args.shards, "--inventory", str(inventory))
        size = sum(f.stat().st_size for f in inventory.iterdir())
        print(f"rows={rows:,} shards={args.shards} inventory={size / 1e6:.0f} MB wall={wall:.1f} s "
              f"peak_rss={peak / 1e6:.0f} MB cpus={os.cpu_count()} load={load:.1f}-{os.getloadavg()[0]:.1f} | "
              f"{said}", flush=True)


if __name__ == "__main__":
    main()

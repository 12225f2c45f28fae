"""Wall time and peak RSS of every reader of an OUT (`status`, `report` and its HTML,
`export`, `compact` of one shard and of all) over a synthetic page table
(bench/page_tables.py) of each size given, in 10,000 shards.

Each command runs in a process of its own, started by a fresh Python that waits for
it: the figure is that waiter's resource.getrusage(RUSAGE_CHILDREN).ru_maxrss, the
command's own peak, never an earlier one's. The OUT is deleted after each size
(unless --keep); compact runs last, as it rewrites the parts.

    python bench/readers.py --rows 1000000 5000000 20000000 [--shards 10000] [--work /tmp/readers]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

BATCHOCR = [sys.executable, "-m", "batchocr.cli"]
ONE_SHARD = ("import sys; from batchocr.compact import compact_shard; from batchocr.storage import Store; "
             "print(compact_shard(Store(sys.argv[1]), int(sys.argv[2])))")


def measure(command: list[str]) -> dict:
    """Run `command` in a waiter process of its own: its wall seconds and peak RSS (MB)."""
    waiter = ("import json, resource, subprocess, sys, time; t = time.perf_counter(); "
              "p = subprocess.run(sys.argv[1:], stdout=subprocess.PIPE, stderr=subprocess.PIPE); "
              "w = time.perf_counter() - t; "
              "print(json.dumps({'rc': p.returncode, 'seconds': w, "
              "'peak_mb': resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024, "
              "'tail': (p.stdout + p.stderr).decode(errors='replace')[-400:]}))")
    proc = subprocess.run([sys.executable, "-c", waiter, *command], capture_output=True, text=True, check=True)
    result = json.loads(proc.stdout)
    if result["rc"] != 0:
        raise RuntimeError(f"{' '.join(command)} exited {result['rc']}: {result['tail']}")
    return result


def readers(out: Path, work: Path, only: set[str] | None) -> dict[str, dict]:
    """Each reader's figures over OUT, in the order that leaves the parts as written until compact."""
    dest = work / "export"
    commands = {
        "status": BATCHOCR + ["status", str(out)],
        "report": BATCHOCR + ["report", str(out)],
        "report --html": BATCHOCR + ["report", str(out), "--html", str(work / "report.html")],
        "export --format jsonl": BATCHOCR + ["export", str(out), str(dest), "--format", "jsonl"],
        "compact (one shard)": [sys.executable, "-c", ONE_SHARD, str(out), "0"],
        "compact": BATCHOCR + ["compact", str(out)],
    }
    figures = {}
    for name, command in commands.items():
        if only and name not in only:
            continue
        figures[name] = measure(command)
        print(f"  {name:<22} {figures[name]['seconds']:>8.1f} s  {figures[name]['peak_mb']:>8.0f} MB", flush=True)
        shutil.rmtree(dest, ignore_errors=True)
    return figures


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[1_000_000, 5_000_000, 20_000_000])
    ap.add_argument("--shards", type=int, default=10_000)
    ap.add_argument("--work", type=Path, default=Path("/tmp/readers-bench"))
    ap.add_argument("--only", nargs="+", help="readers to measure (names as printed)")
    ap.add_argument("--keep", action="store_true", help="keep each OUT (under --work)")
    ap.add_argument("--json", type=Path, help="append each size's figures to this file as a JSON line")
    args = ap.parse_args()
    for rows in args.rows:
        out = args.work / f"out-{rows}"
        if not (out / "_plan" / "plan.json").exists():
            t0 = time.perf_counter()
            subprocess.run([sys.executable, str(Path(__file__).with_name("page_tables.py")), str(out),
                            "--rows", str(rows), "--shards", str(args.shards)], check=True)
            print(f"  generated in {time.perf_counter() - t0:.0f} s", flush=True)
        size = sum(p.stat().st_size for p in (out / "pages").rglob("*.parquet"))
        print(f"{rows:,} page rows, {args.shards:,} shards, {size / 1e9:.2f} GB of parts; load {os.getloadavg()}",
              flush=True)
        figures = readers(out, args.work, set(args.only) if args.only else None)
        if args.json:
            with args.json.open("a") as f:
                f.write(json.dumps({"rows": rows, "shards": args.shards, "parquet_bytes": size,
                                    "at": dt.datetime.now(dt.UTC).isoformat(), "load": os.getloadavg(),
                                    "figures": {k: {"seconds": v["seconds"], "peak_mb": v["peak_mb"]}
                                                for k, v in figures.items()}}) + "\n")
        if not args.keep:
            shutil.rmtree(out)


if __name__ == "__main__":
    main()

"""Peak memory and time of `batchocr report` over a synthetic page table of N rows.

The table has the real schema (batchocr.schema.PAGE_TABLE) and a small text column
(~40 characters a page); rows spread over 8 shards, one part file each, 2,000
pages a document, every 500th page an error, every 1,000th cut off (`length`),
processed over 3 hours. The report runs in a fresh process; its peak RSS comes
from getrusage (ru_maxrss of the child).

    python bench/report_memory.py [--rows 1000000] [--keep DIR]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from batchocr import schema

SHARDS = 8
PAGES_PER_DOC = 2000
START = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def synthetic_output(out: Path, rows: int) -> None:
    """OUT/pages/shard-NNNNN/part-bench-00000.parquet with `rows` page rows in all."""
    per_shard = -(-rows // SHARDS)
    for shard in range(SHARDS):
        lo, hi = shard * per_shard, min(rows, (shard + 1) * per_shard)
        if lo >= hi:
            break
        i = np.arange(lo, hi)
        doc = i // PAGES_PER_DOC
        error = i % 500 == 7
        length = i % 1000 == 3
        reason = np.where(error, "error", np.where(length, "length", "stop"))
        uri = np.char.add("az://scans/batch/doc-", doc.astype(str))
        doc_id = np.char.zfill(doc.astype(str), 16)
        text = np.char.add("page text of a synthetic document, row ", i.astype(str))
        n = hi - lo
        columns = {
            "doc_id": doc_id, "source_uri": np.char.add(uri, ".pdf"), "source_etag": np.full(n, "0x8DC0000000000"),
            "source_size": np.full(n, 1_000_000), "page_index": (i % PAGES_PER_DOC).astype(np.int32),
            "page_count": np.full(n, PAGES_PER_DOC, np.int32), "width": np.full(n, 1288, np.int32),
            "height": np.full(n, 1666, np.int32), "dpi": np.full(n, 200, np.float32),
            "engine": np.full(n, "vllm"), "model": np.full(n, "olmOCR-2-7B-1025"),
            "text": pa.array(np.where(error, None, text), pa.large_string()), "finish_reason": reason,
            "prompt_tokens": np.full(n, 1300, np.int32), "output_tokens": (200 + i % 800).astype(np.int32),
            "error_type": pa.array(np.where(error, "rejected", None), pa.string()),
            "error_message": pa.array(np.where(error, "prompt longer than max_model_len", None), pa.string()),
            "warning": pa.nulls(n, pa.string()), "attempts": np.ones(n, np.int32),
            "latency_ms": (50 + i % 97).astype(np.float32), "run_id": np.full(n, "bench"),
            "route": np.full(n, "model"), "route_score": np.zeros(n, np.float32),
            "shard": np.full(n, shard, np.int32),
            "processed_at": pa.array(START.timestamp() * 1e6 + i * (3 * 3600e6 / rows)).cast(pa.int64())
            .cast(pa.timestamp("us", tz="UTC")),
        }
        # A column this table does not set (one added to the schema later) is null.
        table = pa.table({f.name: pa.nulls(n, f.type) if f.name not in columns
                          else columns[f.name] if isinstance(columns[f.name], pa.Array) else pa.array(columns[f.name])
                          for f in schema.PAGE_TABLE}).cast(schema.PAGE_TABLE)
        folder = out / "pages" / f"shard-{shard:05d}"
        folder.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, folder / "part-bench-00000.parquet", compression="zstd")


def measure(out: Path, *args: str) -> dict:
    """`batchocr report OUT --json` in a fresh process: its summary, seconds and peak RSS (MB)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "batchocr.cli", "report", str(out), "--json", *args],
                          capture_output=True, text=True, timeout=900)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"report exited {proc.returncode}: {proc.stderr}")
    peak_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    if peak_kb <= before:
        raise RuntimeError("an earlier child had a larger peak RSS: measure in a process of its own")
    return {"summary": json.loads(proc.stdout), "seconds": seconds, "peak_mb": peak_kb / 1024}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--keep", type=Path, help="write the synthetic output here and keep it")
    ap.add_argument("--json", action="store_true", help="print rows, seconds, peak_mb and the summary as JSON")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = args.keep or Path(tmp) / "out"
        t0 = time.perf_counter()
        synthetic_output(out, args.rows)
        made = time.perf_counter() - t0
        size = sum(p.stat().st_size for p in out.rglob("*.parquet"))
        result = measure(out)
    s = result["summary"]
    if args.json:
        print(json.dumps({"rows": args.rows, "parquet_bytes": size, **result}))
        return
    print(f"{args.rows:,} rows ({size / 1e6:.1f} MB of Parquet, written in {made:.1f} s): report "
          f"{result['seconds']:.1f} s, peak RSS {result['peak_mb']:.0f} MB; pages {s['pages']:,}, "
          f"documents {s['documents']:,}, finish_reason {s['finish_reasons']}; "
          f"{platform.python_version()}, {platform.machine()}")


if __name__ == "__main__":
    main()

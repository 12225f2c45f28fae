"""A synthetic OUT of any size in the real layout, for measuring the readers
(`status`, `report`, `compact`, `export`) at tens of millions of page rows.

What it writes, through batchocr's own layout, schema and Parquet writer
(batchocr.layout, schema.PAGE_TABLE, sink.to_parquet, plan.DOCS):

    OUT/pages/shard-NNNNN/part-<run_id>-<seq>.parquet   PARTS part files a shard
    OUT/_runs/<run_id>.json                             one finished run a shard
    OUT/_done/shard-NNNNN.json                          every shard done
    OUT/_plan/shard-NNNNN.parquet, OUT/_plan/plan.json  the plan of those documents

Each shard holds rows/shards page rows of documents of PAGES_PER_DOC pages (doc_id
the real SHA-256 of its URI); its last part redoes its first document's pages (a
page with two rows, as a resumed run leaves them, so dedupe has work). Page text:
150-250 bytes (mean 200) cut from a random word list, so zstd compresses it about
as much as real text. Every 500th row an error (`rejected`, text null), every
1,000th cut off (`length`), every 4th read from the text layer (route
`textlayer`); processed_at spreads the rows over three days, one stamp a
document (a run stamps the rows it writes together with one time, steps.Write).

    python bench/page_tables.py OUT --rows 20000000 --shards 10000
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import pyarrow as pa

from batchocr import layout, schema
from batchocr.planner import DOCS
from batchocr.sink import to_parquet
from batchocr.sources import doc_id

PAGES_PER_DOC = 10
PARTS = 4
START = dt.datetime(2026, 11, 1, tzinfo=dt.UTC)
SPAN_US = 3 * 86400 * 10**6
WORDS = ("the of and to in is that for it as was with be by on not he this are or his from at which but have an "
         "they you were her she there been one all we their has would when if so no will can more other page table "
         "invoice total amount scan document figure section report letter account number date company year").split()


def _corpus(rng: np.random.Generator, size: int = 1 << 20) -> np.ndarray:
    words = rng.choice(WORDS, size // 4)
    return np.frombuffer(" ".join(words).encode()[:size], np.uint8)


def _texts(rng: np.random.Generator, corpus: np.ndarray, n: int) -> pa.Array:
    """n strings of 150-250 bytes, each a random slice of the corpus."""
    lengths = rng.integers(150, 251, n)
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    starts = rng.integers(0, len(corpus) - 251, n)
    index = np.arange(offsets[-1]) - np.repeat(offsets[:-1] - starts, lengths)
    data = corpus[index]
    return pa.LargeStringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(data.tobytes()))


def shard_rows(shard: int, shards: int, rows: int, rng: np.random.Generator, corpus: np.ndarray) -> tuple[pa.Table, list]:
    """The shard's page rows (its documents' pages, in order) and its documents (uri, size, etag)."""
    first = shard * rows // shards
    n = (shard + 1) * rows // shards - first
    i = np.arange(first, first + n)
    docs = -(-n // PAGES_PER_DOC)
    uris = [f"az://scans/batch/{shard:05d}/doc-{first // PAGES_PER_DOC + d:09d}.pdf" for d in range(docs)]
    etags = [f"0x8DC{shard:05X}{d:06X}" for d in range(docs)]
    sizes = [200_000 + (d * 7919) % 800_000 for d in range(docs)]
    local = np.arange(n) // PAGES_PER_DOC
    ids = pa.array([doc_id(u) for u in uris]).take(local)
    error, length = i % 500 == 7, i % 1000 == 3
    text = _texts(rng, corpus, n)
    text = pa.compute.if_else(pa.array(error), pa.scalar(None, pa.large_string()), text)
    columns = {
        "doc_id": ids, "source_uri": pa.array(uris).take(local), "source_etag": pa.array(etags).take(local),
        "source_size": pa.array(sizes, pa.int64()).take(local),
        "page_index": (np.arange(n) % PAGES_PER_DOC).astype(np.int32),
        "page_count": np.full(n, PAGES_PER_DOC, np.int32), "width": np.full(n, 1288, np.int32),
        "height": np.full(n, 1666, np.int32), "dpi": np.full(n, 200, np.float32),
        "engine": np.full(n, "vllm"), "model": np.full(n, "olmOCR-2-7B-1025"), "text": text,
        "finish_reason": np.where(error, "error", np.where(length, "length", "stop")),
        "prompt_tokens": np.full(n, 1300, np.int32), "output_tokens": (40 + i % 300).astype(np.int32),
        "error_type": pa.array(np.where(error, "rejected", None), pa.string()),
        "error_message": pa.array(np.where(error, "prompt longer than max_model_len", None), pa.string()),
        "attempts": np.ones(n, np.int32), "latency_ms": rng.gamma(4.0, 400.0, n).astype(np.float32),
        "route": np.where(i % 4 == 1, "textlayer", "model"), "route_score": rng.random(n).astype(np.float32),
        "run_id": np.full(n, f"bench-{shard:05d}"), "shard": np.full(n, shard, np.int32),
        "processed_at": pa.array(START.timestamp() * 1e6 + (i - i % PAGES_PER_DOC) * (SPAN_US / rows)).cast(pa.int64())
        .cast(pa.timestamp("us", tz="UTC")),
    }
    table = pa.table({f.name: pa.nulls(n, f.type) if f.name not in columns
                      else columns[f.name] if isinstance(columns[f.name], pa.Array) else pa.array(columns[f.name])
                      for f in schema.PAGE_TABLE}).cast(schema.PAGE_TABLE)
    return table, list(zip(uris, sizes, etags))


def write_shard(out: Path, shard: int, shards: int, rows: int, rng: np.random.Generator, corpus: np.ndarray) -> dict:
    table, docs = shard_rows(shard, shards, rows, rng, corpus)
    run_id = f"bench-{shard:05d}"
    folder = out / layout.shard_dir(shard)
    folder.mkdir(parents=True, exist_ok=True)
    n = table.num_rows
    cuts = [n * k // PARTS for k in range(PARTS + 1)]
    parts = []
    for seq in range(PARTS):
        part = table.slice(cuts[seq], cuts[seq + 1] - cuts[seq])
        if seq == PARTS - 1 and n:  # the first document's pages again, later: a resumed run's redo
            redo = table.slice(0, min(PAGES_PER_DOC, n))
            later = pa.compute.add(redo["processed_at"], pa.scalar(dt.timedelta(seconds=60)))
            part = pa.concat_tables([part, redo.set_column(redo.schema.get_field_index("processed_at"),
                                                           "processed_at", later)])
        rel = layout.part_file(shard, run_id, seq)
        (out / rel).write_bytes(to_parquet(part))
        parts.append(rel)
    plan = pa.table({"uri": [d[0] for d in docs], "size": [d[1] for d in docs], "etag": [d[2] for d in docs],
                     "mtime": [None] * len(docs)}, schema=DOCS)
    (out / layout.plan_shard(shard)).write_bytes(to_parquet(plan))
    at = (START + dt.timedelta(microseconds=SPAN_US * shard / shards)).isoformat()
    record = {"run_id": run_id, "status": "finished", "engine": "vllm", "model": "olmOCR-2-7B-1025",
              "started_at": at, "finished_at": at, "host": "bench", "parts": parts,
              "spec": {"shard": {"index": shard, "count": shards}},
              "accelerator": {"count": 1, "name": "bench", "kind": "gpu", "seconds": 3600.0}}
    (out / layout.run_record(run_id)).write_text(json.dumps(record))
    marker = {"shard": shard, "shards": shards, "documents": len(docs), "pages": n, "run_ids": [run_id],
              "finished_at": at}
    (out / layout.done_marker(shard)).write_text(json.dumps(marker))
    return {"shard": shard, "documents": len(docs), "bytes": sum(d[1] for d in docs)}


def _write_shards(out: Path, first: int, last: int, shards: int, rows: int, seed: int) -> list[dict]:
    corpus = _corpus(np.random.default_rng(seed))
    return [write_shard(out, s, shards, rows, np.random.default_rng([seed, s]), corpus) for s in range(first, last)]


def write_out(out: Path, rows: int, shards: int, seed: int = 51, jobs: int = 1) -> None:
    """The synthetic OUT; `jobs` processes write its shards (the same files whatever the count)."""
    for folder in (layout.RUNS, layout.DONE, layout.PLAN_DIR):
        (out / folder).mkdir(parents=True, exist_ok=True)
    cuts = [shards * k // jobs for k in range(jobs + 1)]
    with ProcessPoolExecutor(jobs) as pool:
        per_shard = [p for chunk in pool.map(_write_shards, [out] * jobs, cuts[:-1], cuts[1:], [shards] * jobs,
                                             [rows] * jobs, [seed] * jobs) for p in chunk]
    info = {"source": "az://scans/batch/", "shards": shards, "documents": sum(p["documents"] for p in per_shard),
            "bytes": sum(p["bytes"] for p in per_shard), "created_at": START.isoformat(), "per_shard": per_shard}
    (out / layout.PLAN).write_text(json.dumps(info))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--rows", type=int, default=1_000_000, help="page rows (the redone ones come on top)")
    ap.add_argument("--shards", type=int, default=10_000)
    ap.add_argument("--jobs", type=int, default=1, help="processes writing shards")
    args = ap.parse_args()
    t0 = time.perf_counter()
    write_out(args.out, args.rows, args.shards, jobs=args.jobs)
    size = sum(p.stat().st_size for p in (args.out / layout.PAGES).rglob("*.parquet"))
    print(f"wrote {args.rows:,} page rows in {args.shards:,} shards ({size / 1e9:.2f} GB of parts) to {args.out} "
          f"in {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()

"""Page tables written by hand with pyarrow (the real schema), for tests that need
rows no small real run produces: duplicates of a resumed run, older versions of a
document, VLM finish reasons and tokens."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from batchocr import schema
from batchocr.sources import doc_id

T0 = dt.datetime(2026, 3, 1, 12, 0, tzinfo=dt.UTC)


def row(uri: str, page_index: int, seconds: float, *, text: str | None = None, finish_reason: str = "stop",
        etag: str = "e1", page_count: int | None = 1, error_type: str | None = None, latency_ms: float = 100.0,
        output_tokens: int | None = None, prompt_tokens: int | None = None, shard: int = 0, **extra) -> dict:
    return {
        "doc_id": doc_id(uri), "source_uri": uri, "source_etag": etag, "source_size": 1000,
        "page_index": page_index, "page_count": page_count, "width": 100, "height": 100, "dpi": 200.0,
        "engine": "vllm", "model": "m", "text": text, "finish_reason": finish_reason,
        "prompt_tokens": prompt_tokens, "output_tokens": output_tokens, "error_type": error_type,
        "error_message": f"it failed ({error_type})" if error_type else None, "warning": None,
        "attempts": 1, "latency_ms": latency_ms, "run_id": "r", "shard": shard,
        "processed_at": T0 + dt.timedelta(seconds=seconds),
    } | extra


def write_part(out: Path, name: str, rows: list[dict]) -> None:
    """Rows into OUT/pages/shard-NNNNN/part-<name>.parquet, by each row's shard."""
    for shard in sorted({r["shard"] for r in rows}):
        folder = out / "pages" / f"shard-{shard:05d}"
        folder.mkdir(parents=True, exist_ok=True)
        table = pa.Table.from_pylist([r for r in rows if r["shard"] == shard], schema=schema.PAGE_TABLE)
        pq.write_table(table, folder / f"part-{name}.parquet")


def resumed_output(out: Path) -> None:
    """Four documents over two part files (a first run and its resume) and two shards:
    a.pdf: page 1 failed, then redone with text; page 2 hit max tokens
    b.pdf: could not be opened (a document row)
    c.pdf: rewritten between the runs (new etag): only its new version counts; it looped
    d.pdf: shard 1; page 0 has no text layer"""
    write_part(out, "run1-00000", [
        row("az://s/a.pdf", 0, 10, text="alpha", page_count=3, latency_ms=1000),
        row("az://s/a.pdf", 1, 20, finish_reason="error", error_type="render_failed", page_count=3),
        row("az://s/c.pdf", 0, 30, text="old c0", page_count=2, latency_ms=9000),
        row("az://s/c.pdf", 1, 31, text="old c1", page_count=2, latency_ms=9000),
    ])
    write_part(out, "run2-00000", [
        row("az://s/a.pdf", 1, 65, text="beta!", page_count=3, latency_ms=2000, output_tokens=7, prompt_tokens=900),
        row("az://s/a.pdf", 2, 70, text="gamma", finish_reason="length", page_count=3, latency_ms=3000,
            output_tokens=4096, prompt_tokens=900),
        row("az://s/b.pdf", -1, 90, finish_reason="error", error_type="open_failed", page_count=None,
            latency_ms=0),
        row("az://s/c.pdf", 0, 135, text="new c", finish_reason="repetition", etag="e2", latency_ms=500,
            output_tokens=8000, prompt_tokens=1000),
        row("az://s/d.pdf", 0, 160, finish_reason="skipped", error_type="no_text_layer", page_count=2,
            latency_ms=1, shard=1),
        row("az://s/d.pdf", 1, 161, text="delta delta", page_count=2, latency_ms=7000, shard=1),
    ])


def long_text_parts(documents: int, pages: int, parts: int, chars: int, seed: int = 0) -> list[pa.Table]:
    """`parts` part tables of `documents` x `pages` rows, each page `chars` characters of
    random words (zstd cannot shrink them much): an OUT whose bytes are mostly text."""
    import random

    rng = random.Random(seed)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9))) for _ in range(5000)]
    rows = []
    for d in range(documents):
        for i in range(pages):
            text = " ".join(rng.choice(words) for _ in range(chars // 6))[:chars]
            rows.append(row(f"az://s/doc-{d:05d}.pdf", i, d * pages + i, text=text, page_count=pages))
    per = -(-len(rows) // parts)
    return [pa.Table.from_pylist(rows[k:k + per], schema=schema.PAGE_TABLE) for k in range(0, len(rows), per)]

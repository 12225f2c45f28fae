"""Unlimited-OCR through `batchocr run --engine vllm` on one GPU, page and document mode on
the same pages (issue 20's first look; bench/gpu/throughput.py compares with vLLM alone).

    python bench/gpu/uocr_probe.py --model /tmp/models/unlimited-ocr --docs 64 --pages 16 \
        --tokens 1000 --run page --run document --json $OUT/probe.json [--arg KEY=JSON ...]

Each --run is one `batchocr run` process (its own engine) over the same corpus of A4 text
pages (route model: every page goes to the model), random weights (load_format dummy), every
page writing exactly --tokens tokens (ignore_eos; a document group --tokens times its pages),
the document split's fallback off (random weights never write <page>), so both modes do equal
work: pages and tokens are recorded per run. A run is NAME[:KEY=JSON,...]: `page`, `document`,
or e.g. `page:max_num_seqs=512,admit_pages=8`. Measured from the rows' processed_at: pages/s and
output tokens/s from the first row to the last, and between the 20th and 80th percentile row
(the steady state); from vLLM's log: the KV cache's size in tokens and its concurrency.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench" / "gpu"))


def job_yaml(path: Path, src: Path, out: Path, model: str, mode: str, tokens: int, options: dict) -> Path:
    vllm = {"model": model, "preset": "unlimited-ocr", "mode": mode, "load_format": "dummy", "ignore_eos": True,
            "max_tokens": tokens, "document_fallback": False, "max_attempts": 1,
            "repetition_span": 100000,  # random weights loop: the guard off, or modes differ in work
            "gpu_memory_utilization": 0.85} | options
    spec = {"source": str(src), "out": str(out), "engine": "vllm", "route": "model",
            "engines": {"vllm": vllm}, "render": {"workers": 8}, "commit": {"every_pages": 256, "every_seconds": 20}}
    path.write_text(json.dumps(spec))  # JSON is YAML
    return path


def measure(out: Path) -> dict:
    t = pq.read_table(out / "pages", partitioning=None,
                      columns=["processed_at", "output_tokens", "prompt_tokens", "finish_reason", "error_type", "mode",
                               "attempts"]).to_pylist()
    t.sort(key=lambda r: r["processed_at"])
    times = [r["processed_at"].timestamp() for r in t]
    n = len(t)
    tokens = sum(r["output_tokens"] or 0 for r in t)

    def window(lo: float, hi: float) -> dict:
        i, j = int(lo * (n - 1)), int(hi * (n - 1))
        span = times[j] - times[i]
        part = sum(r["output_tokens"] or 0 for r in t[i + 1:j + 1])
        return {"seconds": round(span, 2), "pages_per_s": round((j - i) / span, 3) if span else None,
                "tokens_per_s": round(part / span, 1) if span else None}

    count = lambda key: {k: sum(1 for r in t if r[key] == k) for k in sorted({str(r[key]) for r in t})}  # noqa: E731
    return {"pages": n, "output_tokens": tokens, "prompt_tokens": sum(r["prompt_tokens"] or 0 for r in t),
            "attempts": sum(r["attempts"] or 0 for r in t),
            "finish_reason": count("finish_reason"), "mode": count("mode"), "error_type": count("error_type"),
            "first_to_last": window(0.0, 1.0), "steady_20_80": window(0.2, 0.8)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--docs", type=int, default=64)
    ap.add_argument("--pages", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=1000)
    ap.add_argument("--run", action="append", default=[], help="NAME[:KEY=JSON,...]; NAME page or document")
    ap.add_argument("--arg", action="append", default=[], help="KEY=JSON for engines.vllm, every run")
    ap.add_argument("--work", type=Path, default=Path("/tmp/uocr"))
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--fake", action="store_true", help="dry run on the CPU with tests/fake_vllm.py")
    args = ap.parse_args()
    from e2e import a4_corpus

    common = {k: json.loads(v) for k, v in (a.split("=", 1) for a in args.arg)}
    src = args.work / "src"
    if not src.exists():
        a4_corpus(src, args.docs, args.pages)
    results = {"corpus": {"documents": args.docs, "pages_each": args.pages, "tokens_a_page": args.tokens},
               "common": common, "runs": {}}
    for run in args.run or ["page", "document"]:
        name, _, rest = run.partition(":")
        options = common | {k: json.loads(v) for k, v in (kv.split("=", 1) for kv in rest.split(",") if kv)}
        label = run.replace(":", "_").replace("=", "").replace(",", "_").replace('"', "")
        out = args.work / f"out-{label}"
        log = args.work / f"{label}.log"
        spec = job_yaml(args.work / f"{label}.json", src, out, args.model, name, args.tokens, options)
        start = time.monotonic()
        with open(log, "w") as f:
            boot = ("import sys; sys.path.insert(0, 'tests'); import fake_vllm; fake_vllm.install_modules(); "
                    if args.fake else "") + "from batchocr.cli import entry; entry()"
            proc = subprocess.run([sys.executable, "-c", boot, "run", "--job", str(spec), "-q"],
                                  stdout=f, stderr=subprocess.STDOUT, timeout=args.timeout, cwd=ROOT)
        wall = time.monotonic() - start
        text = log.read_text(errors="replace")
        r = {"rc": proc.returncode, "wall_s": round(wall, 1), "options": options, "mode": name}
        for key, pattern in [("kv_cache_tokens", r"GPU KV cache size: ([\d,]+) tokens"),
                             ("max_concurrency", r"Maximum concurrency for [\d,]+ tokens per request: ([\d.]+)x"),
                             ("attention_backend", r"Using (\w+) (?:attention )?backend"),
                             ("summary", r"(batchocr: done: .*)")]:
            m = re.findall(pattern, text)
            r[key] = m[-1] if m else None
        if proc.returncode == 0:
            r |= measure(out)
        else:
            r["log_tail"] = text[-3000:]
        results["runs"][label] = r
        print(label, json.dumps({k: v for k, v in r.items() if k != "log_tail"}), flush=True)
        if "log_tail" in r:
            print(r["log_tail"][-1500:], flush=True)
        if args.json:
            args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()

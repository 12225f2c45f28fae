"""Pages/s on one GPU, three ways, on the same pages and one vllm.LLM instance:

  (a) vLLM alone: one `llm.generate` call over every page (images rendered beforehand);
  (b) batchocr's pipeline: list -> render workers -> continuous feeding -> Parquet;
  (c) a batch-at-a-time loop: `llm.generate` per chunk of --chunk pages.

Output lengths are fixed per page (random weights make text meaningless):
A = --tokens for every page, B = lognormal(sigma 1) clipped to [50, 4000], mean ~1000,
drawn from a hash of (document, page) so all three modes generate the same lengths.
GPU busy is sampled with NVML every 100 ms.

    python bench/gpu/throughput.py --model /tmp/models/qwen2.5-vl-7b --pages 256 --lengths B \
        --json $OUT/tp.json [--quantization fp8] [--modes a,b,c]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench" / "gpu"))


def length_of(key: str, lengths: str, fixed: int) -> int:
    if lengths == "A":
        return fixed
    u1, u2 = (int.from_bytes(hashlib.sha256(f"{key}/{i}".encode()).digest()[:8], "big") / 2**64 for i in (1, 2))
    z = math.sqrt(-2 * math.log(max(u1, 1e-12))) * math.cos(2 * math.pi * u2)
    # lognormal with sigma 1 and mean ~1000: mu = ln(1000) - 1/2
    return int(min(4000, max(50, math.exp(math.log(1000) - 0.5 + z))))


class GpuSampler(threading.Thread):
    def __init__(self):
        super().__init__(daemon=True)
        import pynvml

        pynvml.nvmlInit()
        self.nvml = pynvml
        self.handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        self.samples: list[tuple[float, int]] = []
        self.running = True

    def run(self):
        while self.running:
            self.samples.append((time.monotonic(), self.nvml.nvmlDeviceGetUtilizationRates(self.handle).gpu))
            time.sleep(0.1)

    def between(self, t0: float, t1: float) -> float | None:
        xs = [u for t, u in self.samples if t0 <= t <= t1]
        return sum(xs) / len(xs) if xs else None


def steady(finish_times: list[float], start: float) -> float | None:
    """pages/s between the 10th and 90th percentile finishes (no ramp-up, no drain)."""
    ts = sorted(finish_times)
    if len(ts) < 20:
        return None
    a, b = ts[len(ts) // 10], ts[len(ts) * 9 // 10]
    return (len(ts) * 8 // 10) / (b - a) if b > a else None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--pages", type=int, default=256)
    ap.add_argument("--lengths", choices=["A", "B"], default="B")
    ap.add_argument("--tokens", type=int, default=1000)
    ap.add_argument("--chunk", type=int, default=256)
    ap.add_argument("--modes", default="a,b,c")
    ap.add_argument("--quantization", default=None)
    ap.add_argument("--max-num-seqs", type=int, default=256)
    ap.add_argument("--max-num-batched-tokens", type=int, default=16384)
    ap.add_argument("--prepare-threads", type=int, default=4)
    ap.add_argument("--queue-pages", type=int, default=0)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    from e2e import a4_corpus
    from PIL import Image
    from vllm import LLM, SamplingParams

    from batchocr.engines.presets import get_preset
    from batchocr.engines.vllm import VLLMEngine, VLLMOptions
    from batchocr.pipeline import run_job
    from batchocr.render import RenderTask, render_document
    from batchocr.schema import Needs
    from batchocr.sources import list_documents
    from batchocr.spec import RenderSpec, load_job
    from batchocr.storage import Store

    work = Path(tempfile.mkdtemp(prefix="tp-"))
    per_doc = 8
    a4_corpus(work / "src", math.ceil(args.pages / per_doc), per_doc)
    options = VLLMOptions(model=args.model, preset="qwen2.5-vl", load_format="dummy", ignore_eos=True,
                          detokenize=False, max_model_len=8192, quantization=args.quantization,
                          max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
                          prepare_threads=args.prepare_threads, queue_pages=args.queue_pages)
    preset = get_preset(options.preset)
    report: dict = {"args": vars(args) | {"json": str(args.json)}, "llm_args": options.llm_args(preset)}
    t0 = time.monotonic()
    llm = LLM(**options.llm_args(preset))
    report["llm_init_s"] = round(time.monotonic() - t0, 1)
    sampler = GpuSampler()
    sampler.start()

    # The same pages for every mode, rendered as batchocr renders them.
    spec = RenderSpec(max_side=preset.max_side, size_multiple=preset.size_multiple)
    pages, names = [], {}
    for doc in list_documents(Store(str(work / "src"))):
        names[doc.doc_id] = doc.name  # lengths keyed by file name: the same in every run
        for batch in render_document(RenderTask(doc), spec, Needs(image=True), {}):
            for r in batch.to_pylist():
                pages.append((f"{doc.name}/{r['page_index']}", r["width"], r["height"], r["image"]))
    pages = pages[: args.pages]
    lengths = {key: length_of(key, args.lengths, args.tokens) for key, *_ in pages}
    report["pages"] = len(pages)
    report["output_tokens_total"] = sum(lengths.values())
    prompt = preset.prompt()

    def requests(chunk):
        return [{"prompt": prompt, "multi_modal_data": {"image": Image.frombuffer("RGB", (w, h), img, "raw", "RGB", 0, 1)}}
                for _, w, h, img in chunk]

    def params(chunk):
        return [SamplingParams(max_tokens=lengths[key], ignore_eos=True, detokenize=False, temperature=0.0)
                for key, *_ in chunk]

    def record(name, start, end, finishes=None, extra=None):
        wall = end - start
        out_tok = report["output_tokens_total"]
        report[name] = {"wall_s": round(wall, 2), "pages_per_s": round(len(pages) / wall, 3),
                        "start_abs": start, "end_abs": end,
                        "output_tokens_per_s": round(out_tok / wall, 1),
                        "gpu_busy_pct": sampler.between(start, end)} | (extra or {})
        if finishes:
            report[name]["steady_pages_per_s"] = steady(finishes, start)
            ts = sorted(finishes)
            report[name]["steady_gpu_busy_pct"] = sampler.between(ts[len(ts) // 10], ts[len(ts) * 9 // 10])
            report[name]["timeline"] = [round(t - start, 2) for t in ts]
        print(name, json.dumps({k: v for k, v in report[name].items() if k != "timeline"}), flush=True)
        if args.json:
            args.json.write_text(json.dumps(report | {"gpu_samples": sampler.samples}, indent=1))

    modes = args.modes.split(",")
    if "a" in modes:  # vLLM alone, one call
        start = time.monotonic()
        llm.generate(requests(pages), params(pages), use_tqdm=False)
        record("a_vllm_alone", start, time.monotonic())

    if "c" in modes:  # batch at a time
        start, finishes = time.monotonic(), []
        for i in range(0, len(pages), args.chunk):
            chunk = pages[i:i + args.chunk]
            llm.generate(requests(chunk), params(chunk), use_tqdm=False)
            finishes += [time.monotonic()] * len(chunk)
        record("c_batch_at_a_time", start, time.monotonic(), finishes)

    if "b" in modes:  # batchocr, the whole pipeline, the same lengths
        finishes: list[float] = []

        class Bench(VLLMEngine):
            def sampling(self, page):
                sp = super().sampling(page)
                sp.max_tokens = lengths[f"{names[page.doc_id]}/{page.page_index}"]
                return sp

            def _row(self, page, finish_reason):
                finishes.append(time.monotonic())
                return super()._row(page, finish_reason)

            def close(self):
                self._pool.shutdown(wait=False)

        engine = Bench(options, llm=llm)
        job = load_job(None, source=str(work / "src"), out=str(work / "out"), engine="vllm",
                       engine_options={"model": args.model}, **{"render.workers": 8})
        start = time.monotonic()
        summary = run_job(job, progress=False, engine=engine)
        end = time.monotonic()
        # The corpus may hold a few more pages than --pages: count what b did.
        record("b_batchocr", start, end, finishes, {"rows": summary.pages, "timings": summary.timings})

    sampler.running = False
    for x, y in (("b_batchocr", "a_vllm_alone"), ("b_batchocr", "c_batch_at_a_time")):
        if x in report and y in report:
            report[f"ratio_{x[0]}_{y[0]}"] = round(report[x]["pages_per_s"] / report[y]["pages_per_s"], 3)
    print({k: v for k, v in report.items() if k.startswith("ratio")}, flush=True)
    if args.json:
        args.json.write_text(json.dumps(report | {"gpu_samples": sampler.samples}, indent=1))
    llm.llm_engine.engine_core.shutdown()
    os._exit(0)  # never hang at exit on vLLM's threads


if __name__ == "__main__":
    main()

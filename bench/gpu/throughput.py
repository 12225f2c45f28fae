"""Pages/s on one GPU, three ways, on the same pages and one vllm.LLM instance:

  (a) vLLM alone: one `llm.generate` call over every page (images rendered beforehand);
  (b) batchocr's pipeline: list -> render workers -> continuous feeding -> Parquet;
  (c) a batch-at-a-time loop: `llm.generate` per chunk of --chunk pages.

Output lengths are fixed per page (random weights make text meaningless):
A = --tokens for every page, B = lognormal(sigma 1) clipped to [50, 4000], mean ~1000,
drawn from a hash of (file name, page) so all three modes generate the same lengths.

Measured per mode: wall time, pages/s and output tokens/s end to end; the engine
core's own timeline (every step: running and waiting requests, KV use, tokens,
pages finished; from vLLM's scheduler stats, timestamped in the core process) and
from it the steady state: the window from the first to the last step with the
engine full (running >= 95% of max_num_seqs), excluding ramp-up and final drain;
GPU busy (NVML, every 100 ms) overall and in that window; host CPU (cores used by
this process, vLLM's engine core, the others: render workers; every second); and where this
process's main thread spends its time (stack samples every 10 ms). The compute
ceiling (pages/s at the GPU's peak dense FLOP/s) is computed from the model's config.

    python bench/gpu/throughput.py --model /tmp/models/qwen2.5-vl-7b --pages 1024 --lengths B \
        --json $OUT/tp.json [--quantization fp8] [--modes a,c,b] [--b-variants 'prepare_threads=8']
    python bench/gpu/throughput.py --fake --pages 64   # dry run on the CPU: checks the script only
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import math
import os
import sys
import tempfile
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench" / "gpu"))
sys.path.insert(0, str(ROOT))

PEAK_TFLOPS = {"bf16": 773.0, "fp8": 1546.0}  # dense, measured bf16 matmul on the H200 (issue #5); fp8 = 2x


def length_of(key: str, lengths: str, fixed: int) -> int:
    if lengths == "A":
        return fixed
    u1, u2 = (int.from_bytes(hashlib.sha256(f"{key}/{i}".encode()).digest()[:8], "big") / 2**64 for i in (1, 2))
    z = math.sqrt(-2 * math.log(max(u1, 1e-12))) * math.cos(2 * math.pi * u2)
    # lognormal with sigma 1 and mean ~1000: mu = ln(1000) - 1/2
    return int(min(4000, max(50, math.exp(math.log(1000) - 0.5 + z))))


class Sampler(threading.Thread):
    """GPU busy (NVML) every 100 ms; host CPU by process group every second."""

    def __init__(self):
        super().__init__(daemon=True)
        try:
            import psutil
        except ImportError:  # no host CPU figures then
            psutil = None
        self.psutil = psutil
        self.me = psutil.Process() if psutil else None
        try:
            import pynvml

            pynvml.nvmlInit()
            # NVML counts GPUs in PCI order: run with CUDA_DEVICE_ORDER=PCI_BUS_ID so that
            # CUDA_VISIBLE_DEVICES=N names the same GPU for both.
            index = int((os.environ.get("CUDA_VISIBLE_DEVICES") or "0").split(",")[0])
            self.nvml, self.handle = pynvml, pynvml.nvmlDeviceGetHandleByIndex(index)
        except Exception:  # noqa: BLE001 - no GPU (dry run)
            self.nvml = None
        self.gpu: list[tuple[float, int]] = []
        self.cpu: list[tuple[float, dict[str, float]]] = []
        self.running = True

    def _cpu_times(self) -> dict[int, tuple[str, float]]:
        out = {}
        if self.me is None:
            return out
        for p in [self.me] + self.me.children(recursive=True):
            try:
                t = p.cpu_times()
                name = "main" if p.pid == self.me.pid else ("engine_core" if "Engine" in p.name() else "others")
                out[p.pid] = (name, t.user + t.system)
            except self.psutil.Error:
                pass
        return out

    def run(self):
        last_t, last = time.monotonic(), self._cpu_times()
        while self.running:
            now = time.monotonic()
            if self.nvml:
                self.gpu.append((now, self.nvml.nvmlDeviceGetUtilizationRates(self.handle).gpu))
            if now - last_t >= 1.0:
                cur = self._cpu_times()
                cores: dict[str, float] = collections.defaultdict(float)
                for pid, (name, t) in cur.items():
                    cores[name] += max(0.0, t - last.get(pid, (name, t))[1]) / (now - last_t)
                if self.psutil:
                    cores["system"] = self.psutil.cpu_percent(None) / 100 * os.cpu_count()
                    self.cpu.append((now, dict(cores)))
                last_t, last = now, cur
            time.sleep(0.1)

    def gpu_between(self, t0: float, t1: float) -> float | None:
        xs = [u for t, u in self.gpu if t0 <= t <= t1]
        return round(sum(xs) / len(xs), 1) if xs else None

    def cpu_between(self, t0: float, t1: float) -> dict[str, float]:
        rows = [c for t, c in self.cpu if t0 <= t <= t1]
        keys = {k for r in rows for k in r}
        return {k: round(sum(r.get(k, 0.0) for r in rows) / len(rows), 2) for k in sorted(keys)} if rows else {}


class Timeline:
    """The engine core's steps as it reports them (needs disable_log_stats=False)."""

    def __init__(self, llm):
        self.steps: list[tuple[float, int, int, float, int, int]] = []  # t, running, waiting, kv, tokens, finished
        core = llm.llm_engine.engine_core
        if not hasattr(core, "get_output"):
            return  # the dry run's stand-in
        original = core.get_output

        def get_output():
            out = original()
            st = out.scheduler_stats
            if out.outputs or st is not None:
                self.steps.append((out.timestamp, st.num_running_reqs if st else -1, st.num_waiting_reqs if st else -1,
                                   round(st.kv_cache_usage, 3) if st else -1,
                                   sum(len(o.new_token_ids) for o in out.outputs),
                                   sum(o.finish_reason is not None for o in out.outputs)))
            return out

        core.get_output = get_output

    def between(self, t0: float, t1: float):
        return [s for s in self.steps if t0 <= s[0] <= t1]

    def steady(self, t0: float, t1: float, max_num_seqs: int) -> tuple[dict, tuple[float, float]] | None:
        """The steady-state figures and the window (absolute times) they cover."""
        steps = self.between(t0, t1)
        if not steps:
            return None
        full = 0.95 * min(max_num_seqs, max(s[1] for s in steps))
        idx = [i for i, s in enumerate(steps) if s[1] >= full]
        if len(idx) < 2:
            return None
        window = steps[idx[0]: idx[-1] + 1]
        w0, w1 = window[0][0], window[-1][0]
        pages, tokens = sum(s[5] for s in window[1:]), sum(s[4] for s in window[1:])
        return {"window_s": round(w1 - w0, 1), "window_start_s": round(w0 - t0, 1), "window_end_s": round(w1 - t0, 1),
                "pages": pages, "pages_per_s": round(pages / (w1 - w0), 3) if w1 > w0 else None,
                "output_tokens_per_s": round(tokens / (w1 - w0), 1) if w1 > w0 else None,
                "mean_running": round(sum(s[1] for s in window) / len(window), 1),
                "mean_waiting": round(sum(s[2] for s in window) / len(window), 1),
                "max_kv_usage": max(s[3] for s in window), "steps": len(window),
                "mean_step_ms": round((w1 - w0) / max(1, len(window) - 1) * 1000, 2)}, (w0, w1)


class StackSampler(threading.Thread):
    """Where the main thread is, every 10 ms: the innermost frame in batchocr or vllm code."""

    def __init__(self):
        super().__init__(daemon=True)
        self.main = threading.main_thread().ident
        self.counts: collections.Counter[str] = collections.Counter()
        self.running = False

    def run(self):
        while True:
            time.sleep(0.01)
            if not self.running:
                continue
            frame = sys._current_frames().get(self.main)
            where, inner = None, None
            while frame is not None:
                code = frame.f_code
                if inner is None:
                    inner = f"{Path(code.co_filename).name}:{code.co_name}"
                if where is None and ("batchocr" in code.co_filename or "/vllm/" in code.co_filename
                                      or "throughput" in code.co_filename):
                    where = f"{code.co_filename.rsplit('/', 2)[-2]}/{Path(code.co_filename).name}:{code.co_name}"
                frame = frame.f_back
            self.counts[f"{where} <- {inner}" if where != inner else str(where)] += 1

    def take(self) -> dict[str, float]:
        total = sum(self.counts.values()) or 1
        top = {k: round(v / total * 100, 1) for k, v in self.counts.most_common(15)}
        self.counts.clear()
        return top


def compute_ceiling(model: str, prompt_tokens: float, output_tokens: float, patches: int, peak_tflops: float) -> dict:
    """Dense FLOPs of one page (matmuls + attention), text and vision, from config.json."""
    cfg = json.load(open(Path(model) / "config.json"))
    t, v = cfg.get("text_config", cfg), cfg["vision_config"]
    h, inter, layers = t["hidden_size"], t["intermediate_size"], t["num_hidden_layers"]
    heads, kv = t["num_attention_heads"], t["num_key_value_heads"]
    hd = h // heads
    per_token = 2 * layers * (h * h * 2 + 2 * h * kv * hd + 3 * h * inter)  # q, o, k, v, gated MLP
    ctx_prefill = prompt_tokens / 2  # mean causal context
    ctx_decode = prompt_tokens + output_tokens / 2
    attn = lambda ctx: 4 * layers * heads * hd * ctx  # noqa: E731 - QK^T and PV
    head = 2 * h * t["vocab_size"]  # only for the prompt's last token and each output token
    text = prompt_tokens * (per_token + attn(ctx_prefill)) + output_tokens * (per_token + attn(ctx_decode) + head) + head
    e = v.get("embed_dim") or v["hidden_size"]
    vinter = v.get("intermediate_size") if "fullatt_block_indexes" in v else None
    mlp = 3 * e * vinter if vinter else 2 * e * (v.get("mlp_ratio", 4) * e)
    vlayer = 2 * (4 * e * e + mlp)  # qkv + proj + MLP, per patch
    if "fullatt_block_indexes" in v:  # Qwen2.5-VL: window attention (112 px = 8x8 patches) but 4 full blocks
        full = len(v["fullatt_block_indexes"])
        vattn = 4 * e * (full * patches + (v["depth"] - full) * 64)
    else:
        vattn = 4 * e * v["depth"] * patches
    merge = 4 * e
    out_h = v.get("out_hidden_size") or v.get("hidden_size") or h
    vision = patches * (v["depth"] * vlayer + vattn) + (patches / 4) * 2 * (merge * merge + merge * out_h)
    total = text + vision
    return {"tflop_per_page": round(total / 1e12, 2), "text_share": round(text / total, 3),
            "peak_tflops": peak_tflops, "ceiling_pages_per_s": round(peak_tflops * 1e12 / total, 1)}


def _render_doc(args):
    doc, max_side, multiple = args
    from batchocr.render import RenderTask, render_document
    from batchocr.schema import Needs
    from batchocr.spec import RenderSpec

    spec = RenderSpec(max_side=max_side, size_multiple=multiple)
    return [(f"{doc.name}/{r['page_index']}", r["width"], r["height"], r["image"])
            for batch in render_document(RenderTask(doc), spec, Needs(image=True), {}) for r in batch.to_pylist()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="")
    ap.add_argument("--pages", type=int, default=1024)
    ap.add_argument("--lengths", choices=["A", "B"], default="B")
    ap.add_argument("--tokens", type=int, default=1000)
    ap.add_argument("--chunk", type=int, default=256)
    ap.add_argument("--modes", default="a,c,b")
    ap.add_argument("--quantization", default=None)
    ap.add_argument("--max-num-seqs", type=int, default=256)
    ap.add_argument("--max-num-batched-tokens", type=int, default=16384)
    ap.add_argument("--prepare-threads", type=int, default=4)
    ap.add_argument("--queue-pages", type=int, default=0)
    ap.add_argument("--render-workers", type=int, default=8)
    ap.add_argument("--b-variants", default="", help="more b runs on the same LLM: 'prepare_threads=8;queue_pages=512'")
    ap.add_argument("--fake", action="store_true", help="dry run on the CPU with tests/fake_vllm.py")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    if args.fake:
        import fake_vllm

        fake_vllm.install_modules()
    from e2e import a4_corpus
    from PIL import Image
    from vllm import LLM, SamplingParams

    from batchocr.engines.presets import get_preset
    from batchocr.engines.vllm import VLLMEngine, VLLMOptions
    from batchocr.pipeline import run_job
    from batchocr.sources import list_documents
    from batchocr.spec import load_job
    from batchocr.storage import Store

    work = Path(tempfile.mkdtemp(prefix="tp-"))
    per_doc = 8
    a4_corpus(work / "src", math.ceil(args.pages / per_doc), per_doc)
    docs = list(list_documents(Store(str(work / "src"))))
    names = {d.doc_id: d.name for d in docs}  # lengths are keyed by file name: the same in every run
    options = VLLMOptions(model=args.model or "fake", preset="qwen2.5-vl", load_format="dummy", ignore_eos=True,
                          detokenize=False, max_model_len=8192, quantization=args.quantization,
                          max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
                          prepare_threads=args.prepare_threads, queue_pages=args.queue_pages,
                          engine_args={"disable_log_stats": False})
    preset = get_preset(options.preset)
    report: dict = {"args": vars(args) | {"json": str(args.json)}, "llm_args": options.llm_args(preset),
                    "host_cpus": os.cpu_count()}
    sampler = Sampler()
    sampler.start()
    stacks = StackSampler()
    stacks.start()

    # The same pages for every mode, rendered as batchocr renders them (in processes, while the LLM loads).
    t0 = time.monotonic()
    with ProcessPoolExecutor(8) as ex:
        futures = ex.map(_render_doc, [(d, preset.max_side, preset.size_multiple) for d in docs])
        llm = LLM(**options.llm_args(preset))
        report["llm_init_s"] = round(time.monotonic() - t0, 1)
        pages = [row for rows in futures for row in rows][: args.pages]
    timeline = Timeline(llm)
    lengths = {key: length_of(key, args.lengths, args.tokens) for key, *_ in pages}
    report["pages"] = len(pages)
    report["output_tokens_total"] = sum(lengths.values())
    w, h = pages[0][1], pages[0][2]
    patches = (w // 14) * (h // 14)
    report["page_size"] = [w, h]
    prompt = preset.prompt()

    def requests(chunk):
        return [{"prompt": prompt, "multi_modal_data": {"image": Image.frombuffer("RGB", (w, h), img, "raw", "RGB", 0, 1)}}
                for _, w, h, img in chunk]

    def params(chunk):
        return [SamplingParams(max_tokens=lengths[key], ignore_eos=True, detokenize=False, temperature=0.0)
                for key, *_ in chunk]

    def save():
        if args.json:
            args.json.write_text(json.dumps(report | {"gpu_samples": sampler.gpu, "cpu_samples": sampler.cpu,
                                                      "engine_steps": timeline.steps}, indent=None))

    def record(name, start, end, finishes=None, extra=None):
        wall = end - start
        out_tok = report["output_tokens_total"]
        r = report[name] = {"wall_s": round(wall, 2), "pages_per_s": round(len(pages) / wall, 3),
                            "start_abs": start, "end_abs": end,
                            "output_tokens_per_s": round(out_tok / wall, 1),
                            "gpu_busy_pct": sampler.gpu_between(start, end),
                            "host_cores": sampler.cpu_between(start, end),
                            "main_thread": stacks.take()} | (extra or {})
        steady = timeline.steady(start, end, args.max_num_seqs)
        if steady:
            st, (w0, w1) = steady
            st["gpu_busy_pct"] = sampler.gpu_between(w0, w1)
            st["host_cores"] = sampler.cpu_between(w0, w1)
            r["steady"] = st
        if finishes:
            r["timeline"] = [round(t - start, 2) for t in sorted(finishes)]
        print(name, json.dumps({k: v for k, v in r.items() if k not in ("timeline", "main_thread")}), flush=True)
        save()

    class Bench(VLLMEngine):
        """batchocr's engine with the benchmark's output lengths; notes when each page finishes."""

        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            self.finishes: list[float] = []

        def sampling(self, page):
            sp = super().sampling(page)
            sp.max_tokens = lengths[f"{names[page.doc_id]}/{page.page_index}"]
            return sp

        def _row(self, page, finish_reason):
            self.finishes.append(time.monotonic())
            return super()._row(page, finish_reason)

        def close(self):  # the LLM serves the next mode
            self._pool.shutdown(wait=False)

    prompt_tokens = None
    modes = args.modes.split(",")
    for mode in modes:
        stacks.running = True
        if mode == "a":  # vLLM alone, one call
            start = time.monotonic()
            outs = llm.generate(requests(pages), params(pages), use_tqdm=False)
            record("a_vllm_alone", start, time.monotonic())
            prompt_tokens = len(outs[0].prompt_token_ids)
        elif mode == "c":  # batch at a time
            start, finishes = time.monotonic(), []
            for i in range(0, len(pages), args.chunk):
                chunk = pages[i:i + args.chunk]
                llm.generate(requests(chunk), params(chunk), use_tqdm=False)
                finishes += [time.monotonic()] * len(chunk)
            record("c_batch_at_a_time", start, time.monotonic(), finishes)
        elif mode == "b":  # batchocr, the whole pipeline, the same lengths
            variants = [("b_batchocr", {})] + [
                (f"b_{v.strip().replace('=', '_')}", {k: int(x) for k, x in (kv.split("=") for kv in v.split(","))})
                for v in args.b_variants.split(";") if v.strip()]
            for name, overrides in variants:
                engine = Bench(VLLMOptions(**{**options.__dict__, **overrides}), llm=llm)
                job = load_job(None, source=str(work / "src"), out=str(work / f"out-{name}"), engine="vllm",
                               engine_options={"model": options.model}, **{"render.workers": args.render_workers})
                start = time.monotonic()
                summary = run_job(job, progress=False, engine=engine)
                end = time.monotonic()
                record(name, start, end, engine.finishes, {"rows": summary.pages, "timings": summary.timings,
                                                           "overrides": overrides, "queue_pages": engine.queue_pages})
        stacks.running = False

    sampler.running = False
    for x, y in (("b_batchocr", "a_vllm_alone"), ("b_batchocr", "c_batch_at_a_time")):
        if x in report and y in report:
            report[f"ratio_{x[0]}_{y[0]}"] = round(report[x]["pages_per_s"] / report[y]["pages_per_s"], 3)
            sx, sy = report[x].get("steady"), report[y].get("steady")
            if sx and sy and sx["pages_per_s"] and sy["pages_per_s"]:
                report[f"steady_ratio_{x[0]}_{y[0]}"] = round(sx["pages_per_s"] / sy["pages_per_s"], 3)
    mean_out = report["output_tokens_total"] / len(pages)
    if args.model and not args.fake:
        peak = PEAK_TFLOPS["fp8" if args.quantization == "fp8" else "bf16"]
        report["compute_ceiling"] = compute_ceiling(args.model, prompt_tokens or (patches / 4 + 84), mean_out,
                                                    patches, peak)
    print({k: v for k, v in report.items() if k.startswith(("ratio", "steady_ratio", "compute"))}, flush=True)
    save()
    core = getattr(llm.llm_engine, "engine_core", None)
    if hasattr(core, "shutdown"):
        core.shutdown()
    os._exit(0)  # never hang at exit on vLLM's threads


if __name__ == "__main__":
    main()

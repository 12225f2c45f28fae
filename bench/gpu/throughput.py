"""Pages/s on one GPU at equal work, on the same pages and output lengths:

  (a)  vLLM alone: one `llm.generate` call over every page (images rendered beforehand),
       batchocr's engine arguments;
  (a') vLLM's own defaults (`LLM(model=...)` on this GPU), `generate` per chunk of --chunk pages:
       what ten lines of user code get (mode a0, in its own process: its own engine);
  (c)  batchocr's engine arguments, `generate` per chunk of --chunk pages;
  (b)  batchocr's pipeline: list -> render workers -> continuous feeding -> Parquet; the
       repetition guard off (--guard off, the default), since random weights loop and a guard
       that aborts and retries pages would make b do other work than a and c;
  (b_NAME) b again with other engine arguments (--variant NAME=ARGS), each in its own process
       after this one's engine is gone (a_NAME too where ARGS has `--modes a,b`: that engine's a,
       so another mode's b/a is in the same run); `--engines N`: N engine processes on the one GPU.
       `--variant same=` (no ARGS) is a control, b's own arguments in a child process as every
       variant runs: each other variant's ratio to it is reported too.

Every mode's record holds its work: pages, attempts, finish reasons, the tokens of the rows and
every token handed out (aborted attempts too), and the engine core's own count; `equal_work`
says whether all modes did the same.

Output lengths are fixed per page (random weights make text meaningless):
A = --tokens for every page, B = lognormal(sigma 1) clipped to [50, 4000], mean ~1000,
drawn from a hash of (file name, page) so all three modes generate the same lengths.

KV: the engine's KV capacity (blocks x block size, the figure of vLLM's "GPU KV cache size"
line), the KV a request holds in steady state (its prefix, image and prompt tokens, plus the
generated tokens it keeps: all of them, or R-SWA's window), the max_num_seqs that fills it, and
per mode the KV use vLLM reports every step (kv_usage_max, kv_usage_mean). --ngram off runs
every mode without the preset's no-repeat n-gram logits processor (its cost: bench/gpu/ngram_cost.py).

Measured per mode: wall time, pages/s and output tokens/s end to end; the engine
core's own timeline (every step: running and waiting requests, KV use, tokens,
pages finished; from vLLM's scheduler stats, timestamped in the core process) and
from it the steady state: the window from the first to the last step with the
engine full (running >= 95% of max_num_seqs), excluding ramp-up and final drain;
GPU busy (NVML, every 100 ms) overall and in that window; host CPU (cores used by
this process, vLLM's engine core, the others: render workers; every second); and where this
process's main thread spends its time (stack samples every 10 ms). The compute
ceiling (pages/s at the GPU's peak dense FLOP/s) is computed from the model's config.

    python bench/gpu/throughput.py --model /tmp/models/qwen2.5-vl-7b --pages 512 --lengths B \
        --modes a,c,b,a0 --variant 'seqs512=--max-num-seqs 512' --json $OUT/tp.json
        [--quantization fp8] [--engine-arg kv_cache_dtype=fp8] [--b-variants 'prepare_threads=8']
    python bench/gpu/throughput.py --fake --pages 64   # dry run on the CPU: checks the script only
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import math
import os
import re
import shutil
import subprocess
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

    def _cpu_times(self) -> dict[int, tuple[str, float, int]]:
        out = {}
        if self.me is None:
            return out
        for p in [self.me] + self.me.children(recursive=True):
            try:
                t = p.cpu_times()
                name = "main" if p.pid == self.me.pid else ("engine_core" if "Engine" in p.name() else "others")
                out[p.pid] = (name, t.user + t.system, p.memory_info().rss)
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
                for pid, (name, t, rss) in cur.items():
                    cores[name] += max(0.0, t - last.get(pid, (name, t, 0))[1]) / (now - last_t)
                    cores[f"rss_gb_{name}"] += rss / 1e9  # host memory, summed over the group's processes
                if self.psutil:
                    cores["system"] = self.psutil.cpu_percent(None) / 100 * os.cpu_count()
                    cores["rss_gb_all"] = sum(rss for _, _, rss in cur.values()) / 1e9
                    self.cpu.append((now, dict(cores)))
                last_t, last = now, cur
            time.sleep(0.1)

    def gpu_memory_used_gb(self) -> float | None:
        return self.nvml.nvmlDeviceGetMemoryInfo(self.handle).used / 1e9 if self.nvml else None

    def rss_peak(self, t0: float, t1: float) -> dict[str, float]:
        rows = [c for t, c in self.cpu if t0 <= t <= t1]
        keys = {k for r in rows for k in r if k.startswith("rss_gb_")}
        return {k[7:]: round(max(r.get(k, 0.0) for r in rows), 2) for k in sorted(keys)} if rows else {}

    def gpu_between(self, t0: float, t1: float) -> float | None:
        xs = [u for t, u in self.gpu if t0 <= t <= t1]
        return round(sum(xs) / len(xs), 1) if xs else None

    def cpu_between(self, t0: float, t1: float) -> dict[str, float]:
        rows = [c for t, c in self.cpu if t0 <= t <= t1]
        keys = {k for r in rows for k in r if not k.startswith("rss_gb_")}
        return {k: round(sum(r.get(k, 0.0) for r in rows) / len(rows), 2) for k in sorted(keys)} if rows else {}


class Timeline:
    """The engine core's steps as it reports them (needs disable_log_stats=False)."""

    def __init__(self, llm):
        self.steps: list[tuple[float, int, int, float, int, int]] = []  # t, running, waiting, kv, tokens, finished
        core = llm.llm_engine.engine_core if llm is not None else None
        if not hasattr(core, "get_output"):
            return  # no engine in this process, or the dry run's stand-in
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
        requests, tokens = sum(s[5] for s in window[1:]), sum(s[4] for s in window[1:])
        return {"window_s": round(w1 - w0, 1), "window_start_s": round(w0 - t0, 1), "window_end_s": round(w1 - t0, 1),
                "requests": requests,  # finished; record() counts the pages
                "output_tokens_per_s": round(tokens / (w1 - w0), 1) if w1 > w0 else None,
                "mean_running": round(sum(s[1] for s in window) / len(window), 1),
                "mean_waiting": round(sum(s[2] for s in window) / len(window), 1),
                "max_kv_usage": max(s[3] for s in window), "steps": len(window),
                "mean_step_ms": round((w1 - w0) / max(1, len(window) - 1) * 1000, 2)}, (w0, w1)


class StackSampler(threading.Thread):
    """Where the main thread is, every 10 ms: the innermost frame in batchocr or vllm code.
    take() may run while it samples (mode c records before it stops), so the counts are
    touched under a lock."""

    def __init__(self):
        super().__init__(daemon=True)
        self.main = threading.main_thread().ident
        self.counts: collections.Counter[str] = collections.Counter()
        self.lock = threading.Lock()
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
            key = f"{where} <- {inner}" if where != inner else str(where)
            with self.lock:
                self.counts[key] += 1

    def take(self) -> dict[str, float]:
        with self.lock:
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


def doc_counts(pages: int, sizes: list[int]) -> list[int]:
    """Pages of each document: sizes cycled, the last one cut so that they add up to pages."""
    counts: list[int] = []
    while sum(counts) < pages:
        counts.append(min(sizes[len(counts) % len(sizes)], pages - sum(counts)))
    return counts


def kv_accounting(llm, model: str, prompt_tokens: list[int], output_tokens: list[int], max_num_seqs: int) -> dict:
    """The engine's KV capacity and what a request holds of it in steady state.

    R-SWA (a config with rswa_window): a request keeps its prefix (prompt: image and text
    tokens) and the last rswa_window generated tokens, in whole blocks plus the block being
    filled; otherwise it keeps every token. max_num_seqs_by_kv: the requests of mean size that
    fill the cache."""
    cfg = json.load(open(Path(model) / "config.json")) if model and (Path(model) / "config.json").exists() else {}
    t = cfg.get("language_config") or cfg.get("text_config") or cfg
    cache = getattr(getattr(getattr(llm, "llm_engine", None), "vllm_config", None), "cache_config", None)
    blocks, block = (cache.num_gpu_blocks, cache.block_size) if cache is not None else (None, 16)
    window = cfg.get("rswa_window")
    heads, layers = t.get("num_key_value_heads"), t.get("num_hidden_layers")
    head = t.get("head_dim") or (t["hidden_size"] // t["num_attention_heads"] if "hidden_size" in t else None)
    per_token = layers * heads * head * 2 * 2 if heads and layers and head else None  # K and V, bf16

    def held(prompt: int, out: int) -> int:
        kept = min(out, window) if window else out
        return math.ceil(prompt / block) * block + math.ceil(kept / block) * block + block

    mean = sum(held(p, o) for p, o in zip(prompt_tokens, output_tokens)) / max(1, len(prompt_tokens))
    capacity = blocks * block if blocks else None
    return {"num_gpu_blocks": blocks, "block_size": block, "kv_tokens": capacity, "kv_bytes_per_token": per_token,
            "kv_gb": round(capacity * per_token / 1e9, 2) if capacity and per_token else None,
            "rswa_window": window, "mean_prompt_tokens": round(sum(prompt_tokens) / max(1, len(prompt_tokens)), 1),
            "mean_tokens_held_per_request": round(mean, 1),
            "mean_mb_held_per_request": round(mean * per_token / 1e6, 2) if per_token else None,
            "max_num_seqs_by_kv": int(capacity // mean) if capacity else None, "max_num_seqs": max_num_seqs}


def _render_doc(args):
    doc, max_side, multiple = args
    from batchocr.render import RenderTask, render_document
    from batchocr.schema import Needs
    from batchocr.spec import RenderSpec

    spec = RenderSpec(max_side=max_side, size_multiple=multiple)
    return [(f"{doc.name}/{r['page_index']}", r["width"], r["height"], r["image"])
            for batch in render_document(RenderTask(doc), spec, Needs(image=True), {}) for r in batch.to_pylist()]


def vllm_defaults(args) -> dict:
    """(a'): what a user writing ten lines gets, `LLM(model=...)` and nothing else, except the
    random weights (no checkpoint here), the scheduler stats (the engine timeline needs them;
    `LLM` turns them off by default) and the quantization or engine arguments under test."""
    return {"model": args.model or "fake", "load_format": "dummy", "disable_log_stats": False, "seed": 0,
            **({"quantization": args.quantization} if args.quantization else {}), **engine_args(args)}


def engine_args(args) -> dict:
    """--engine-arg KEY=VALUE (VALUE as JSON where it parses, else a string)."""
    out = {}
    for item in args.engine_arg:
        key, _, value = item.partition("=")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value
    return out


def trace_summary(path: Path, top: int = 40) -> dict:
    """A torch profiler trace (chrome JSON, gzipped or not) summed by category and name: where the
    profiled steps' host time (cpu_op, cuda_runtime: launches, syncs, copies) and GPU time
    (kernel, gpu_memcpy) went, and the span they cover."""
    import gzip

    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt") as f:
        events = json.load(f).get("traceEvents", [])
    spans = [e for e in events if e.get("ph") == "X" and "dur" in e]
    if not spans:
        return {"file": path.name, "events": 0}
    sums: dict = collections.defaultdict(lambda: [0.0, 0])
    for e in spans:
        key = (e.get("cat", ""), e.get("name", ""))
        sums[key][0] += e["dur"]
        sums[key][1] += 1
    by_cat: dict = collections.defaultdict(float)
    for (cat, _), (dur, _) in sums.items():
        by_cat[cat] += dur
    t0 = min(e["ts"] for e in spans)
    t1 = max(e["ts"] + e["dur"] for e in spans)
    rows = sorted(((cat, name[:120], round(dur / 1000, 2), n) for (cat, name), (dur, n) in sums.items()
                   if cat in ("cpu_op", "cuda_runtime", "kernel", "gpu_memcpy", "gpu_memset", "user_annotation")),
                  key=lambda r: -r[2])
    out = {"file": path.name, "events": len(spans), "span_ms": round((t1 - t0) / 1000, 1),
           "ms_by_category": {k: round(v / 1000, 1) for k, v in sorted(by_cat.items(), key=lambda kv: -kv[1])},
           "top_ms": rows[:top]}
    out["steps"] = step_breakdown(spans)
    if by_cat.get("python_function"):  # --profile-stack: the host's time by Python function
        own = self_times(spans)
        python = collections.defaultdict(lambda: [0.0, 0.0, 0])  # name -> [self us, total us, calls]
        for e in spans:
            if e.get("cat") == "python_function":
                row = python[re.sub(r" at 0x[0-9a-f]+", "", e.get("name", ""))[:160]]  # one row a method, not an object
                row[0] += own[id(e)]
                row[1] += e["dur"]
                row[2] += 1
        ranked = lambda i: [(name, round(v[0] / 1000, 2), round(v[1] / 1000, 2), v[2])  # noqa: E731
                            for name, v in sorted(python.items(), key=lambda kv: -kv[1][i])[:top]]
        out["python_by_self_ms"] = ranked(0)  # (function, self ms, total ms, calls)
        out["python_by_total_ms"] = ranked(1)
    return out


STEP = re.compile(r"execute_context_(\d+)\((\d+)\)_generation_(\d+)\((\d+)\)")
# the functions a kernel's launch is attributed to (--profile-stack; vLLM 0.26's V2 runner): the first phase
# among those whose functions hold the launch (the encoder's own `forward`s are the encoder's)
PHASES = (("encoder", ("execute_mm_encoder", "embed_multimodal", "get_multimodal_embeddings")),
          ("embeddings", ("gather_mm_embeddings", "get_inputs_embeds", "get_mm_embeddings")),
          ("sample", ("sample_tokens",)),
          ("forward", ("run_fullgraph", "run_pw_graph", "forward")))


def kernel_class(name: str) -> str:
    low = name.lower()
    if any(k in low for k in ("flash", "fmha", "attn", "attention")):
        return "attention"
    if any(k in low for k in ("gemm", "nvjet", "cutlass", "xmma", "cublas", "matmul", "s1681")):
        return "gemm"
    if "triton" in low:
        return "triton"
    return "other"


def step_breakdown(spans: list[dict]) -> dict:
    """The profiled engine steps one by one (vLLM annotates each `execute_context_N(T)_generation_
    M(G)`: N requests prefilling T tokens beside M decoding), each kernel counted in the step whose
    span holds its launch (or the last step begun before it: the sampler runs after the annotation),
    then summed by the number of prefilling requests: step wall (one step's start to the next's, on
    the host), kernel time and its share of the wall, kernels by class (attention, gemm, triton,
    other) and, with Python calls traced (--profile-stack), by phase (the encoder, embeddings,
    forward, sample). And the kernels a one-page prefill step adds to a decode step, by name: where
    the prefill's cost goes on the GPU."""
    import bisect
    import statistics

    steps = sorted((e for e in spans if e.get("cat") == "user_annotation" and STEP.fullmatch(e.get("name", ""))),
                   key=lambda e: e["ts"])
    if not steps:
        return {}
    starts = [e["ts"] for e in steps]
    # correlation id -> (ts, pid, tid) of the call that launched the kernel: a runtime call
    # (cudaLaunchKernel, cudaGraphLaunch) or a driver one (cuLaunchKernelEx: cuBLAS's nvjet, Triton)
    launches = {}
    for e in spans:
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {}):
            launches[e["args"]["correlation"]] = (e["ts"], e.get("pid"), e.get("tid"))
    # (pid, tid, phase) -> the traced functions' spans of that phase, merged into disjoint [start, end]
    # intervals (nested forwards are one), so that a launch finds its phases by bisection
    raw = collections.defaultdict(list)
    for e in spans:
        if e.get("cat") == "python_function":
            name = e.get("name", "")
            for phase, keys in PHASES:
                if any(k in name for k in keys):
                    raw[(e.get("pid"), e.get("tid"), phase)].append((e["ts"], e["ts"] + e["dur"]))
                    break
    phase_spans = {}
    for key, intervals in raw.items():
        merged: list[list[float]] = []
        for a, b in sorted(intervals):
            if merged and a <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], b)
            else:
                merged.append([a, b])
        phase_spans[key] = ([m[0] for m in merged], [m[1] for m in merged])

    def phase_of(at: float, pid, tid) -> str:  # the first of PHASES whose functions hold the launch
        for phase, _ in PHASES:
            got = phase_spans.get((pid, tid, phase))
            if got:
                j = bisect.bisect_right(got[0], at) - 1
                if j >= 0 and got[1][j] >= at:
                    return phase
        return "other"
    per = [{"kernel_us": 0.0, "kernels": 0, "class": collections.Counter(), "phase": collections.Counter(),
            "names": collections.Counter()} for _ in steps]
    for e in spans:
        if e.get("cat") != "kernel":
            continue
        launch = launches.get(e.get("args", {}).get("correlation"))
        at = launch[0] if launch else e["ts"]
        i = bisect.bisect_right(starts, at) - 1
        if i < 0:
            continue
        row = per[i]
        row["kernel_us"] += e["dur"]
        row["kernels"] += 1
        row["class"][kernel_class(e.get("name", ""))] += e["dur"]
        row["names"][e.get("name", "")[:100]] += e["dur"]
        if phase_spans and launch:
            row["phase"][phase_of(at, launch[1], launch[2])] += e["dur"]
    groups = collections.defaultdict(list)
    for k, (e, row) in enumerate(zip(steps, per)):
        if k + 1 == len(steps):
            break  # its wall is unknown (no next step)
        n, tokens, gen, _ = (int(x) for x in STEP.fullmatch(e["name"]).groups())
        groups[n].append(row | {"wall_us": starts[k + 1] - e["ts"], "tokens": tokens, "gen": gen})
    med = lambda key: statistics.median(r[key] for r in rows)  # noqa: E731 - over the group in hand
    out = {}
    for n, rows in sorted(groups.items()):
        out[str(n)] = {
            "steps": len(rows), "prefill_tokens": med("tokens"), "decoding": med("gen"),
            "wall_ms": round(med("wall_us") / 1000, 2), "kernel_ms": round(med("kernel_us") / 1000, 2),
            "kernels": med("kernels"),
            "gpu_share_of_wall": round(sum(r["kernel_us"] for r in rows) / max(1, sum(r["wall_us"] for r in rows)), 3),
            "class_ms": {c: round(sum(r["class"][c] for r in rows) / len(rows) / 1000, 2)
                         for c in ("attention", "gemm", "triton", "other")},
        }
        if phase_spans:
            out[str(n)]["phase_ms"] = {p: round(sum(r["phase"][p] for r in rows) / len(rows) / 1000, 2)
                                       for p in [p for p, _ in PHASES] + ["other"]}
    if groups.get(0) and groups.get(1):  # what one page's prefill adds to a step, kernel by kernel (mean ms)
        mean = lambda rows: {k: v / len(rows) for k, v in sum((r["names"] for r in rows), collections.Counter()).items()}  # noqa: E731
        one, none = mean(groups[1]), mean(groups[0])
        extra = sorted(([name, round((one.get(name, 0) - none.get(name, 0)) / 1000, 2)] for name in one),
                       key=lambda kv: -kv[1])
        out["one_page_adds_ms"] = [kv for kv in extra[:25] if kv[1] > 0.05]
    return out


def self_times(spans: list[dict]) -> dict[int, float]:
    """Each span's own time (us): its duration less that of the spans nested in it on its
    thread (a Python function's less the functions and ops it called), by id(span)."""
    own: dict[int, float] = {}
    threads: dict = collections.defaultdict(list)
    for e in spans:
        threads[(e.get("pid"), e.get("tid"))].append(e)
    for events in threads.values():
        events.sort(key=lambda e: (e["ts"], -e["dur"]))
        stack: list[dict] = []  # the spans open at this instant, outermost first
        for e in events:
            while stack and stack[-1]["ts"] + stack[-1]["dur"] <= e["ts"]:
                stack.pop()
            own[id(e)] = e["dur"]
            if stack and e["ts"] + e["dur"] <= stack[-1]["ts"] + stack[-1]["dur"]:
                own[id(stack[-1])] -= e["dur"]  # a direct child: its parent's own time excludes it
            stack.append(e)
    return own


def work_of_outputs(outs, units: list) -> dict:
    """What one finite generate call did: one attempt per page, by construction (a request a page, or
    a group of pages in document mode: its finish reason counts for each of its pages, as b's rows)."""
    reasons: collections.Counter = collections.Counter()
    for o, unit in zip(outs, units):
        reasons[str(o.outputs[0].finish_reason)] += len(unit)
    tokens = sum(len(o.outputs[0].token_ids) for o in outs)
    pages = sum(len(u) for u in units)
    return {"requests": len(outs), "pages": pages, "attempts": {"1": pages}, "finish_reasons": dict(reasons),
            "prompt_tokens_rows": sum(len(o.prompt_token_ids or []) for o in outs),
            "output_tokens_rows": tokens, "client_tokens": tokens}


def work_of_table(out: Path, client_tokens: int, requests: int) -> dict:
    """What batchocr did, from its own Parquet rows (attempts, finish reasons, tokens of the kept
    attempt) and from the engine's outputs (tokens of every attempt, aborted ones too)."""
    import pyarrow.parquet as pq

    t = pq.read_table(out / "pages", columns=["finish_reason", "attempts", "prompt_tokens", "output_tokens",
                                              "error_type", "error_message"], partitioning=None)
    rows = t.to_pydict()
    errors = collections.Counter(e for e in rows["error_type"] if e)
    if errors:  # a benchmark of error rows measures nothing: say so where the figures are
        first = next(m for m in rows["error_message"] if m)
        print(f"b: {sum(errors.values())} error rows {dict(errors)}; first: {first}", flush=True)
    return {"requests": requests, "pages": t.num_rows, "errors": dict(errors),
            "first_error": next((m for m in rows["error_message"] if m), None),
            "attempts": {str(k): v for k, v in sorted(collections.Counter(rows["attempts"]).items())},
            "finish_reasons": dict(collections.Counter(rows["finish_reason"])),
            "prompt_tokens_rows": sum(x or 0 for x in rows["prompt_tokens"]),
            "output_tokens_rows": sum(x or 0 for x in rows["output_tokens"]), "client_tokens": client_tokens}


def wait_gpu_free(sampler, below_gb: float = 4.0, timeout: float = 120.0) -> float | None:
    """After an engine shut down: wait until its memory is back (the next engine sizes its KV cache from it)."""
    end = time.monotonic() + timeout
    used = sampler.gpu_memory_used_gb()
    while used is not None and used > below_gb and time.monotonic() < end:
        time.sleep(1)
        used = sampler.gpu_memory_used_gb()
    return used


def child_argv(args, extra: list[str], json_path: Path) -> list[str]:
    """This script again, in its own process (its own engine), with the same work and `extra` on top."""
    argv = [sys.executable, str(Path(__file__).resolve()), "--model", args.model, "--pages", str(args.pages),
            "--preset", args.preset, "--mode", args.mode, "--per-doc", args.per_doc, "--ngram", args.ngram,
            "--ngram-bans", args.ngram_bans,
            "--max-model-len", str(args.max_model_len), "--group-pages", str(args.group_pages),
            "--lengths", args.lengths, "--tokens", str(args.tokens), "--chunk", str(args.chunk),
            "--max-num-seqs", str(args.max_num_seqs), "--max-num-batched-tokens", str(args.max_num_batched_tokens),
            "--prepare-threads", str(args.prepare_threads), "--queue-pages", str(args.queue_pages),
            *(["--admit-pages", str(args.admit_pages)] if args.admit_pages is not None else []),
            "--render-workers", str(args.render_workers), "--guard", args.guard,
            "--gpu-memory-utilization", str(args.gpu_memory_utilization), "--warmup", str(args.warmup),
            "--json", str(json_path)]
    if args.quantization:
        argv += ["--quantization", args.quantization]
    if args.rswa_tiles is not None:
        argv += ["--rswa-tiles" if args.rswa_tiles else "--no-rswa-tiles"]
    if args.instances > 1:
        argv += ["--instances", str(args.instances)]
    if args.batch_encoder is not None:
        argv += ["--batch-encoder" if args.batch_encoder else "--no-batch-encoder"]
    if args.vit_pad is not None:
        argv += ["--vit-pad" if args.vit_pad else "--no-vit-pad"]
    for item in args.engine_arg:
        argv += ["--engine-arg", item]
    if args.fake:
        argv.append("--fake")
    return argv + extra


def run_child(argv: list[str], log: Path, timeout: float) -> dict | None:
    json_path = Path(argv[argv.index("--json") + 1])
    with open(log, "w") as f:
        try:
            rc = subprocess.run(argv, stdout=f, stderr=subprocess.STDOUT, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    if not json_path.exists():
        print(f"child failed (rc {rc}), see {log}", flush=True)
        return None
    return json.loads(json_path.read_text()) | {"child_rc": rc, "child_log": str(log)}


def merge_steady(records: list[dict], steps: list[tuple], finishes: list[float] = ()) -> dict | None:
    """Several engines at once: the window where every one of them is in its steady state;
    its requests from the steps, its pages from `finishes` (every page's, absolute times) where
    they are given."""
    windows = [(r["steady"]["window_start_abs"], r["steady"]["window_end_abs"]) for r in records if r.get("steady")]
    if len(windows) < len(records):
        return None
    w0, w1 = max(w[0] for w in windows), min(w[1] for w in windows)
    if w1 <= w0:
        return None
    inside = [s for s in steps if w0 < s[0] <= w1]
    out = {"window_s": round(w1 - w0, 1), "window_start_abs": w0, "window_end_abs": w1,
           "requests": sum(s[5] for s in inside), "output_tokens_per_s": round(sum(s[4] for s in inside) / (w1 - w0), 1)}
    if finishes:  # else the caller counts the pages (record())
        pages = sum(w0 < t <= w1 for t in finishes)
        out |= {"pages": pages, "pages_per_s": round(pages / (w1 - w0), 3)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="")
    ap.add_argument("--preset", default="qwen2.5-vl", help="the model's preset (unlimited-ocr: its dummy layout)")
    ap.add_argument("--mode", choices=["page", "document"], default="page",
                    help="document: each document's pages in groups (batchocr's grouping), a group a request, in "
                         "a and c too (<image> a page, the preset's document prompt); the split's fallback off")
    ap.add_argument("--per-doc", default="8", help="pages a document of the corpus; several cycle: 8,12,16")
    ap.add_argument("--ngram", choices=["on", "off"], default="on",
                    help="the preset's no-repeat n-gram logits processor (its extra_args); off: its cost measured")
    ap.add_argument("--ngram-bans", choices=["processor", "sampler"], default="processor",
                    help="engines.vllm.ngram_bans: the bans in a logits processor (V1 runner) or in the V2 sampler")
    ap.add_argument("--batch-encoder", action="store_const", const=True, default=None,
                    help="engines.vllm.batch_encoder on: DeepSeek-OCR's encoder over a step's pages at once "
                         "(neither flag: the preset's, on for unlimited-ocr)")
    ap.add_argument("--no-batch-encoder", dest="batch_encoder", action="store_const", const=False,
                    help="engines.vllm.batch_encoder off: vLLM's encoder, a page at a time")
    ap.add_argument("--vit-pad", action="store_const", const=True, default=None,
                    help="engines.vllm.vit_pad on: Qwen2.5-VL's vision MLPs padded to an aligned size "
                         "(batchocr.engines.vllm.patches.vitpad; default: the preset's)")
    ap.add_argument("--no-vit-pad", dest="vit_pad", action="store_const", const=False,
                    help="engines.vllm.vit_pad off")
    ap.add_argument("--no-pixel-bytes", dest="pixel_bytes", action="store_const", const=False, default=None,
                    help="engines.vllm.pixel_bytes off: the image views as vLLM's floats (default: the preset's, "
                         "on for unlimited-ocr)")
    ap.add_argument("--no-sam-fold", dest="sam_fold", action="store_const", const=False, default=None,
                    help="engines.vllm.sam_fold off: vLLM's SAM attention with its bias made in full (default: "
                         "the preset's, on for unlimited-ocr)")
    ap.add_argument("--rswa-tiles", action="store_const", const=True, default=None,
                    help="engines.vllm.rswa_tiles on: R-SWA's attention reads only the KV tiles it can see "
                         "(default: the preset's, on for unlimited-ocr in page mode)")
    ap.add_argument("--no-rswa-tiles", dest="rswa_tiles", action="store_const", const=False,
                    help="engines.vllm.rswa_tiles off: vLLM's kernel reads every tile")
    ap.add_argument("--group-pages", type=int, default=0,
                    help="document mode: pages a group holds at most (engines.vllm.group_pages; 0: as many as fit)")
    ap.add_argument("--max-model-len", type=int, default=0,
                    help="0: 8192 in page mode, the preset's in document mode (a group fills the context)")
    ap.add_argument("--pages", type=int, default=1024)
    ap.add_argument("--lengths", choices=["A", "B"], default="B")
    ap.add_argument("--tokens", type=int, default=1000)
    ap.add_argument("--chunk", type=int, default=256)
    ap.add_argument("--modes", default="a,c,b", help="a, a0 (a': vLLM's defaults, chunks of --chunk), c, b")
    ap.add_argument("--quantization", default=None)
    ap.add_argument("--max-num-seqs", type=int, default=256)
    ap.add_argument("--max-num-batched-tokens", type=int, default=16384)
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    ap.add_argument("--prepare-threads", type=int, default=4)
    ap.add_argument("--queue-pages", type=int, default=0)
    ap.add_argument("--admit-pages", type=int, default=None,
                    help="engines.vllm.admit_pages for b (unset: the preset's; a variant's own: --variant N='--admit-pages 16')")
    ap.add_argument("--render-workers", type=int, default=8)
    ap.add_argument("--guard", choices=["off", "on"], default="off",
                    help="b's repetition guard; off by default: random weights loop, and a guard that aborts and "
                         "retries pages makes b do other work than a and c (issue 12)")
    ap.add_argument("--engine-arg", action="append", default=[], help="KEY=JSON for vllm.LLM, e.g. stream_interval=8")
    ap.add_argument("--b-variants", default="", help="more b runs on the same LLM: 'prepare_threads=8;queue_pages=512'")
    ap.add_argument("--variant", action="append", default=[],
                    help="NAME=ARGS: b again in its own process with its own engine, ARGS on top of this run's "
                         "(e.g. 'seqs512=--max-num-seqs 512'); recorded as b_NAME")
    ap.add_argument("--engines", type=int, default=1, help="b with N engine processes on the one GPU, pages split")
    ap.add_argument("--instances", type=int, default=1,
                    help="b with engines.vllm.instances N: N vLLM engines in batchocr's one process (mode b only)")
    ap.add_argument("--llm", choices=["batchocr", "defaults"], default="batchocr", help=argparse.SUPPRESS)
    ap.add_argument("--part", default="", help=argparse.SUPPRESS)  # I/N: this process's share of the documents
    ap.add_argument("--barrier", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--fake", action="store_true", help="dry run on the CPU with tests/fake_vllm.py")
    ap.add_argument("--env", action="append", default=[],
                    help="KEY=VALUE set before vLLM loads, e.g. VLLM_USE_V2_MODEL_RUNNER=0 (a variant's own)")
    ap.add_argument("--profile", default="",
                    help="DELAY,STEPS: torch-profile STEPS engine steps of b from its DELAY-th (vLLM's profiler_config); "
                         "its tables (self CUDA and CPU time by op) go into the JSON. Perturbs b: a run of its own")
    ap.add_argument("--py-spy", default="",
                    help="DELAY,SECONDS: sample b's engine core(s) with py-spy for SECONDS from DELAY s into b "
                         "(bench/gpu/pyspy.py): where its host time goes, by thread and function, in the JSON "
                         "(b_batchocr.py_spy) and the raw samples beside it; a sampler, so b's pace barely moves")
    ap.add_argument("--profile-stack", action="store_true",
                    help="with --profile: trace Python calls too (torch_profiler_with_stack), so that the JSON says "
                         "which functions the engine core's host time went to (python_by_self_ms); slows the host, "
                         "so profile few steps (30)")
    ap.add_argument("--warmup", type=int, default=0,
                    help="N: before any mode, off the clock, the first N pages at 32 tokens each: one `generate` "
                         "where a or c rendered pages, else (b alone, one engine) batchocr's pipeline on the "
                         "first documents that hold N pages; so that the first mode does not pay the first "
                         "steps' compiles that the later ones skip. Each --variant's process warms up the same")
    ap.add_argument("--src", type=Path,
                    help="the documents' folder, made where absent as bench/gpu/processes.py makes it, read in place "
                         "of a temporary one; --lengths B then keys a page's length as processes.py does (the "
                         "document's doc_id, the page), so a run here does the same work as a processes.py run "
                         "over the same folder (--src there too)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if args.src and (args.part or args.engines > 1 or args.variant):
        ap.error("--src: one engine and no --variant (their processes cut and re-make the folder)")
    for item in args.env:  # before vLLM is imported; a variant's process inherits the parent's
        key, _, value = item.partition("=")
        os.environ[key] = value

    # this process runs batchocr's pipeline as a run's own process does: without PyMuPDF's unused
    # extras (onnxruntime) and without the pandas pyarrow would import to probe for pandas objects
    from batchocr.renderworker import own_process

    own_process()
    if args.fake:
        import fake_vllm

        fake_vllm.install_modules()
    from e2e import a4_documents
    from PIL import Image

    from batchocr.engines.vllm import VLLMEngine, VLLMInstances, VLLMOptions
    from batchocr.engines.vllm.presets import get_preset
    from batchocr.grouping import balanced_size
    from batchocr.pipeline import run_job
    from batchocr.sources import list_documents
    from batchocr.spec import load_job
    from batchocr.storage import Store

    work = Path(tempfile.mkdtemp(prefix="tp-"))
    counts = doc_counts(args.pages, [int(x) for x in args.per_doc.split(",")])
    if args.engines > len(counts):  # a process would get no document, and no table
        raise SystemExit(f"--engines {args.engines}: {args.pages} pages make {len(counts)} documents "
                         "(--per-doc); give each engine one at least")
    src = args.src if args.src is not None else work / "src"  # every mode's documents
    if not src.exists():
        a4_documents(src, counts)
    if args.part:  # one of several engines: every N-th document
        i, n = map(int, args.part.split("/"))
        for k, f in enumerate(sorted((work / "src").iterdir())):
            if k % n != i:
                f.unlink()
    docs = list(list_documents(Store(str(src))))
    names = {d.doc_id: d.name for d in docs}  # lengths are keyed by file name: the same in every run
    counts = [counts[int(d.name[3:7])] for d in docs]  # docNNNN.pdf: its pages (--part keeps some)
    guard = {} if args.guard == "on" else {"repetition_span": 10**6}  # never reached: max_tokens <= 4000
    context = args.max_model_len or (get_preset(args.preset).max_model_len if args.mode == "document" else 8192)
    # --profile: every engine b builds (one, or each of --instances') writes its trace into profile_dir
    profile_dir, profiler = None, {}
    if args.profile:
        delay, steps = (int(x) for x in args.profile.split(","))
        profile_dir = Path(tempfile.mkdtemp(prefix="tp-profile-"))
        profiler = {"profiler_config": {"profiler": "torch", "torch_profiler_dir": str(profile_dir),
                                        "torch_profiler_with_stack": args.profile_stack, "ignore_frontend": True,
                                        "delay_iterations": delay, "max_iterations": steps}}
    # document_fallback off: random weights never write <page> (and every group ends at its length):
    # with it on, b would read every page again alone, other work than a's
    options = VLLMOptions(model=args.model or "fake", preset=args.preset, mode=args.mode, document_fallback=False,
                          group_pages=args.group_pages, rswa_tiles=args.rswa_tiles,
                          ngram_bans=args.ngram_bans, batch_encoder=args.batch_encoder, vit_pad=args.vit_pad,
                          pixel_bytes=args.pixel_bytes, sam_fold=args.sam_fold,
                          load_format="dummy", ignore_eos=True,
                          detokenize=False, max_model_len=context, quantization=args.quantization,
                          max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
                          gpu_memory_utilization=args.gpu_memory_utilization,
                          prepare_threads=args.prepare_threads, queue_pages=args.queue_pages,
                          admit_pages=args.admit_pages, instances=args.instances,
                          engine_args={"disable_log_stats": False, **engine_args(args), **profiler}, **guard)
    preset = get_preset(options.preset)
    # (vLLM's defaults are built from args, not options: the profiler goes there too)
    llm_args = vllm_defaults(args) | profiler if args.llm == "defaults" else options.llm_args(preset)
    report: dict = {"args": vars(args) | {"json": str(args.json), "barrier": str(args.barrier), "src": str(args.src)},
                    "llm_args": llm_args, "host_cpus": os.cpu_count()}
    # a page's length, drawn from its file name and page; with --src as processes.py draws it, from the
    # document's doc_id (its URI in that folder)
    lengths = {f"{d.name}/{i}": length_of(f"{d.doc_id if args.src is not None else d.name}/{i}", args.lengths,
                                          args.tokens) for d, count in zip(docs, counts) for i in range(count)}
    keys = list(lengths)  # every page, "docNNNN.pdf/I", in the documents' order
    report["pages"] = len(keys)
    report["output_tokens_total"] = sum(lengths.values())
    sampler = Sampler()
    sampler.start()
    stacks = StackSampler()
    stacks.start()
    modes = [m for m in args.modes.split(",") if m]
    children = (["a0"] if "a0" in modes and args.llm == "batchocr" else []) + args.variant
    here = [m for m in modes if not (m == "a0" and args.llm == "batchocr")]
    timeline = Timeline(None)

    def save():
        if args.json:
            args.json.write_text(json.dumps(report | {"gpu_samples": sampler.gpu, "cpu_samples": sampler.cpu,
                                                      "engine_steps": timeline.steps}, indent=None))

    if args.instances > 1 and modes != ["b"]:
        raise SystemExit("--instances > 1 runs mode b only (--modes b)")
    if args.engines > 1:  # several engine processes on the one GPU, each b over its share of the documents
        assert modes == ["b"], "--engines > 1 runs mode b only"
        barrier = work / "barrier"
        barrier.mkdir()
        argv = lambda i: child_argv(args, ["--modes", "b", "--part", f"{i}/{args.engines}",  # noqa: E731
                                           "--barrier", str(barrier)], work / f"w{i}.json")
        procs = [subprocess.Popen(argv(i), stdout=open(work / f"w{i}.log", "w"), stderr=subprocess.STDOUT)
                 for i in range(args.engines)]
        for i, p in enumerate(procs):  # one engine at a time sizes its KV cache from the memory left
            (barrier / f"build-{i}").touch()
            while not (barrier / f"ready-{i}").exists() and p.poll() is None:
                time.sleep(0.5)
        t_go = time.monotonic()
        (barrier / "go").touch()
        for p in procs:
            p.wait()
        recs = [json.loads((work / f"w{i}.json").read_text()) for i in range(args.engines)
                if (work / f"w{i}.json").exists()]
        if len(recs) < args.engines or not all("b_batchocr" in r for r in recs):
            print("an engine process failed:", [(work / f"w{i}.log").read_text()[-2000:] for i in range(args.engines)])
            sys.exit(1)
        for r in recs:
            timeline.steps += r["engine_steps"]
        timeline.steps.sort()
        bs = [r["b_batchocr"] for r in recs]
        start, end = min(b["start_abs"] for b in bs), max(b["end_abs"] for b in bs)
        rec = {"engines": args.engines, "wall_s": round(end - start, 2), "start_abs": start, "end_abs": end,
               "go_abs": t_go, "rows": sum(b["rows"] for b in bs),
               "pages_per_s": round(sum(b["rows"] for b in bs) / (end - start), 3),
               "output_tokens_per_s": round(sum(b["work"]["client_tokens"] for b in bs) / (end - start), 1),
               "gpu_busy_pct": sampler.gpu_between(start, end), "host_cores": sampler.cpu_between(start, end),
               "host_rss_peak_gb": sampler.rss_peak(start, end),
               "work": {k: sum(b["work"][k] for b in bs) for k in ("requests", "pages", "prompt_tokens_rows",
                                                                   "output_tokens_rows", "client_tokens")}
               | {"engine_tokens": sum(b["work"]["engine_tokens"] for b in bs)
                  if all(b["work"].get("engine_tokens") is not None for b in bs) else None},
               "per_engine": [{k: b.get(k) for k in ("wall_s", "pages_per_s", "rows", "steady", "work")} for b in bs],
               "timeline": sorted(round(b["start_abs"] + t - start, 2) for b in bs for t in b.get("timeline", []))}
        for k in ("attempts", "finish_reasons"):
            rec["work"][k] = dict(sum((collections.Counter(b["work"][k]) for b in bs), collections.Counter()))
        steady = merge_steady(bs, timeline.steps, [b["start_abs"] + t for b in bs for t in b.get("timeline", [])])
        if steady:
            steady["gpu_busy_pct"] = sampler.gpu_between(steady["window_start_abs"], steady["window_end_abs"])
            steady["window_start_s"] = round(steady["window_start_abs"] - start, 1)
            steady["window_end_s"] = round(steady["window_end_abs"] - start, 1)
            rec["steady"] = steady
        report["llm_args"] = recs[0]["llm_args"]
        report["b_batchocr"] = rec
        print("b_batchocr", json.dumps({k: v for k, v in rec.items() if k not in ("timeline", "per_engine")}),
              flush=True)
        sampler.running = False
        save()
        os._exit(0)

    # The same pages for every mode, rendered as batchocr renders them (in processes, while the LLM loads).
    need_images = any(m in ("a", "a0", "c") for m in here)
    pages: list = []
    llm = None
    if here:
        from vllm import LLM, SamplingParams

        if args.barrier:  # one of several engines: build when told, say when ready, start together
            i = args.part.split("/")[0]
            while not (args.barrier / f"build-{i}").exists():
                time.sleep(0.2)
        t0 = time.monotonic()
        with ProcessPoolExecutor(8 if need_images else 1) as ex:
            futures = ex.map(_render_doc, [(d, preset.max_side, preset.size_multiple) for d in docs]
                             if need_images else [])
            options.set_runner_env()  # as VLLMEngine does (ngram_bans: sampler asks for V2)
            llm = LLM(**llm_args) if args.instances == 1 else None  # --instances: b builds its own
            report["llm_init_s"] = round(time.monotonic() - t0, 1)
            pages = [row for rows in futures for row in rows][: args.pages]
        report["gpu_memory_used_gb_after_init"] = sampler.gpu_memory_used_gb()
        timeline = Timeline(llm)
        if args.barrier:
            (args.barrier / f"ready-{i}").touch()
            while not (args.barrier / "go").exists():
                time.sleep(0.05)
    if pages:
        w, h = pages[0][1], pages[0][2]
        report["page_size"] = [w, h]
    patches = (report.get("page_size", [896, 1288])[0] // 14) * (report.get("page_size", [896, 1288])[1] // 14)
    prompt = preset.prompt()
    # What a request of a and c holds: a page, or in document mode a group of a document's pages, cut
    # as batchocr cuts them (grouping.py: balanced groups of at most group_pages consecutive pages).
    units = [[p] for p in pages]
    if args.mode == "document":
        by_doc = collections.defaultdict(list)
        for page in pages:
            by_doc[page[0].rsplit("/", 1)[0]].append(page)
        size, units = options.group_size(preset), []
        for doc_pages in by_doc.values():
            target = balanced_size(len(doc_pages), size)
            units += [doc_pages[i:i + target] for i in range(0, len(doc_pages), target)]
    report["requests"] = len(units)

    def image(w, h, img):
        return Image.frombuffer("RGB", (w, h), img, "raw", "RGB", 0, 1)

    def requests(chunk):  # a group as batchocr sends it: its images, the preset's document prompt and view size
        return [{"prompt": preset.document_prompt(len(unit)), "multi_modal_data": {"image": [image(*p[1:]) for p in unit]}}
                | ({"mm_processor_kwargs": dict(preset.document_mm_processor_kwargs)}
                   if preset.document_mm_processor_kwargs else {})
                if len(unit) > 1 else {"prompt": prompt, "multi_modal_data": {"image": image(*unit[0][1:])}}
                for unit in chunk]

    def without_ngram(sampling: dict) -> dict:  # --ngram off: the n-gram processor skips a request without them
        if args.ngram == "on" or "extra_args" not in sampling:
            return sampling
        extra = {k: v for k, v in (sampling["extra_args"] or {}).items()
                 if k not in ("ngram_size", "window_size", "whitelist_token_ids")}
        return sampling | {"extra_args": extra or None}

    def params(chunk):  # the preset's sampling (n-gram processor arguments too): the same work as b's
        def extra(unit):
            return without_ngram(dict(preset.sampling_args) | (dict(preset.document_sampling_args)
                                                                if len(unit) > 1 else {}))
        return [SamplingParams(max_tokens=sum(lengths[p[0]] for p in unit), ignore_eos=True, detokenize=False,
                               temperature=0.0, **extra(unit)) for unit in chunk]

    instance_timelines: list[Timeline] = []  # --instances: one a b engine

    def record(name, start, end, finishes=None, extra=None):
        wall = end - start
        r = report[name] = {"wall_s": round(wall, 2), "pages_per_s": round(len(keys) / wall, 3),
                            "start_abs": start, "end_abs": end, "mode": args.mode,
                            "output_tokens_per_s": round(report["output_tokens_total"] / wall, 1),
                            "gpu_busy_pct": sampler.gpu_between(start, end),
                            "host_cores": sampler.cpu_between(start, end),
                            "host_rss_peak_gb": sampler.rss_peak(start, end),
                            "main_thread": stacks.take()} | (extra or {})
        if "work" in r:  # every token the engine core generated in this mode, aborted requests' too
            r["work"]["engine_tokens"] = sum(s[4] for s in timeline.between(start, end)) if timeline.steps else None
        kv = [s[3] for s in timeline.between(start, end) if s[3] >= 0]
        r["kv_usage_max"] = max(kv) if kv else None  # vLLM's kv_cache_usage, 0..1, every step
        r["kv_usage_mean"] = round(sum(kv) / len(kv), 3) if kv else None
        if instance_timelines:  # several engines in one process: where every one is in its steady state
            parts = []
            for tl in instance_timelines:
                got = tl.steady(start, end, llm_args.get("max_num_seqs") or 1024)
                parts.append({"steady": got[0] | {"window_start_abs": got[1][0], "window_end_abs": got[1][1]}}
                             if got else {})
            merged = merge_steady(parts, timeline.between(start, end))  # its pages: counted below
            steady = (merged, (merged["window_start_abs"], merged["window_end_abs"])) if merged else None
        else:  # a b variant's own max_num_seqs (batchocr admits no more on this engine) sets its "full"
            seqs = (extra or {}).get("overrides", {}).get("max_num_seqs") or llm_args.get("max_num_seqs") or 1024
            steady = timeline.steady(start, end, seqs)
        if steady:
            st, (w0, w1) = steady
            st["window_start_abs"], st["window_end_abs"] = w0, w1
            # Pages, not the engine's finished requests (document mode: a group a request): b's
            # rows as they finished; a mode without them, its requests times the mean group.
            if finishes and name.startswith("b"):
                st["pages"] = sum(w0 < t <= w1 for t in finishes)
            else:
                st["pages"] = round(st["requests"] * len(keys) / max(1, len(units)))
            st["pages_per_s"] = round(st["pages"] / (w1 - w0), 3) if w1 > w0 else None
            st["gpu_busy_pct"] = sampler.gpu_between(w0, w1)
            st["host_cores"] = sampler.cpu_between(w0, w1)
            r["steady"] = st
        if finishes:
            r["timeline"] = [round(t - start, 2) for t in sorted(finishes)]
        print(name, json.dumps({k: v for k, v in r.items() if k not in ("timeline", "main_thread")}), flush=True)
        save()

    class Counting:
        """The engine as batchocr sees it, counting every token it hands out (aborted attempts too)."""

        def __init__(self, engine):
            self._engine, self.tokens, self.requests = engine, 0, 0
            self.sizes: list[tuple[int, int]] = []  # (prompt tokens, max_tokens) a request: its KV

        def __getattr__(self, name):
            return getattr(self._engine, name)

        def add_request(self, request_id, engine_input, params, *a, **kw):
            self.requests += 1
            ids = engine_input.get("prompt_token_ids") if hasattr(engine_input, "get") else None
            self.sizes.append((len(ids or ()), params.max_tokens))
            return self._engine.add_request(request_id, engine_input, params, *a, **kw)

        def step(self):
            outs = self._engine.step()
            self.tokens += sum(len(o.outputs[0].token_ids) for o in outs if o.outputs)
            return outs

    class Together:
        """Several instances' counts as one engine's (--instances)."""

        def __init__(self, parts):
            self.parts = parts

        tokens = property(lambda self: sum(p.tokens for p in self.parts))
        requests = property(lambda self: sum(p.requests for p in self.parts))
        sizes = property(lambda self: [s for p in self.parts for s in p.sizes])

    class Bench(VLLMEngine):
        """batchocr's engine with the benchmark's output lengths; notes when each page finishes."""

        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            self.engine = Counting(self.engine)
            self.finishes: list[float] = []

        warm = False  # the warm-up's engine: 32 tokens a page, as a and c warm up

        def sampling(self, request):
            sp = super().sampling(request)
            sp.max_tokens = (32 * len(request.pages) if self.warm else
                             sum(lengths[f"{names[p.doc_id]}/{p.page_index}"] for p in request.pages))
            if args.ngram == "off":
                sp.extra_args = without_ngram({"extra_args": sp.extra_args})["extra_args"]
            self.extra_args = sp.extra_args  # recorded: what the n-gram processor was given
            return sp

        def _common(self, request, page, output_tokens):  # every row, text or error
            self.finishes.append(time.monotonic())
            return super()._common(request, page, output_tokens)

        def close(self):  # the LLM serves the next mode
            if hasattr(self, "_pool"):
                self._pool.shutdown(wait=False)

    class BenchInstances(VLLMInstances):
        """--instances: b's own engines, each a Bench that counts and notes its own pages."""

        def __init__(self, options):
            super().__init__(options, member=Bench)
            self.engine = Together([e.engine for e in self.instances])

        def close(self):  # b's own engines: shut down
            for e in self.instances:
                VLLMEngine.close(e)

    def chunks():
        start, finishes, outs = time.monotonic(), [], []
        for i in range(0, len(units), args.chunk):
            chunk = units[i:i + args.chunk]
            outs += llm.generate(requests(chunk), params(chunk), use_tqdm=False)
            finishes += [time.monotonic()] * sum(len(u) for u in chunk)
        return start, finishes, outs

    def b_job(folder: str, out: str):
        """b's job over WORK/FOLDER ("src": the documents, --src's where given) into WORK/out; route
        model: the corpus is born-digital, and every page must reach the model."""
        source = src if folder == "src" else work / folder
        return load_job(None, source=str(source), out=str(work / out), engine="vllm", route="model",
                        engine_options={"model": options.model}, **{"render.workers": args.render_workers})

    if args.warmup and llm is not None and pages:  # off the clock, before every mode's start
        t0 = time.monotonic()
        warm = units[: args.warmup]
        llm.generate(requests(warm), [SamplingParams(max_tokens=32, ignore_eos=True, detokenize=False, temperature=0.0)
                                      for _ in warm], use_tqdm=False)
        report["warmup"] = {"requests": len(warm), "s": round(time.monotonic() - t0, 1)}
        print("warmup", json.dumps(report["warmup"]), flush=True)
    elif args.warmup and llm is not None and here == ["b"]:  # b alone: its pipeline on the first documents
        t0, chosen, held = time.monotonic(), [], 0
        for d, n in zip(docs, counts):
            if held >= args.warmup:
                break
            chosen.append(d)
            held += n
        (work / "warm-src").mkdir(exist_ok=True)
        for d in chosen:
            shutil.copy(src / d.name, work / "warm-src" / d.name)
        warm_engine = Bench(options, llm=llm)
        warm_engine.warm = True
        summary = run_job(b_job("warm-src", "out-warmup"), progress=False, engine=warm_engine)
        report["warmup"] = {"requests": warm_engine.engine.requests, "pages": summary.pages,
                            "s": round(time.monotonic() - t0, 1)}
        print("warmup", json.dumps(report["warmup"]), flush=True)

    prompt_tokens = None
    for mode in here:
        stacks.running = True
        if mode == "a":  # vLLM alone, one call
            start = time.monotonic()
            outs = llm.generate(requests(units), params(units), use_tqdm=False)
            record("a_vllm_alone", start, time.monotonic(), extra={"work": work_of_outputs(outs, units)})
            prompt_tokens = len(outs[0].prompt_token_ids)
            report["kv"] = kv_accounting(llm, args.model, [len(o.prompt_token_ids) for o in outs],
                                         [len(o.outputs[0].token_ids) for o in outs], args.max_num_seqs)
            print("kv", json.dumps(report["kv"]), flush=True)
        elif mode == "a0":  # vLLM's own defaults, a chunk at a time (needs --llm defaults: its own engine)
            start, finishes, outs = chunks()
            record("a0_vllm_defaults", start, time.monotonic(), finishes, {"work": work_of_outputs(outs, units)})
        elif mode == "c":  # batch at a time, batchocr's engine arguments
            start, finishes, outs = chunks()
            record("c_batch_at_a_time", start, time.monotonic(), finishes, {"work": work_of_outputs(outs, units)})
        elif mode == "b":  # batchocr, the whole pipeline, the same lengths
            variants = [("b_batchocr", {})] + [
                (f"b_{v.strip().replace('=', '_')}", {k: int(x) for k, x in (kv.split("=") for kv in v.split(","))})
                for v in args.b_variants.split(";") if v.strip()]
            for name, overrides in variants:
                b_options = VLLMOptions(**{**options.__dict__, **overrides})
                engine = BenchInstances(b_options) if b_options.instances > 1 else Bench(b_options, llm=llm)
                members = engine.instances if isinstance(engine, BenchInstances) else []
                if profile_dir is not None and name == "b_batchocr":  # each engine counts steps from here
                    for each in [e.llm for e in members] or [llm]:  # and stops after STEPS
                        each.start_profile()
                if members:  # each engine's steps on a timeline of its own, and all on the run's
                    instance_timelines[:] = [Timeline(e.llm) for e in members]
                job = b_job("src", f"out-{name}")
                spy = None
                if args.py_spy and name == "b_batchocr":
                    from pyspy import PySpy

                    delay, seconds = (float(x) for x in args.py_spy.split(","))
                    spy = PySpy(delay, seconds, args.json.parent if args.json else work, name=name)
                    spy.start()
                start = time.monotonic()
                summary = run_job(job, progress=False, engine=engine)
                end = time.monotonic()
                if members:
                    timeline.steps = sorted(timeline.steps + [s for tl in instance_timelines for s in tl.steps])
                finishes = sorted(t for e in members or [engine] for t in e.finishes)
                record(name, start, end, finishes, {
                    "rows": summary.pages, "timings": summary.timings, "overrides": overrides,
                    "queue_pages": engine.queue_pages, "admit_pages": engine.admit_pages, "guard": args.guard,
                    "instances": args.instances,
                    "extra_args": getattr((members or [engine])[0], "extra_args", None),
                    "work": work_of_table(work / f"out-{name}", engine.engine.tokens, engine.engine.requests)}
                    | ({"py_spy": spy.result()} if spy is not None else {}))
                if profile_dir is not None and "profile_tables" not in report:
                    report["profile_tables"] = {f.name: f.read_text()[-60000:]
                                                for f in sorted(profile_dir.glob("profiler_out_*.txt"))}
                    report["profile_summary"] = [trace_summary(f) for f in sorted(profile_dir.glob("*.json*"))]
                if "kv" not in report and engine.engine.sizes:  # no a in this run: b's requests
                    report["kv"] = kv_accounting(members[0].llm if members else llm, args.model,
                                                 *map(list, zip(*engine.engine.sizes)),
                                                 args.max_num_seqs)
                    print("kv", json.dumps(report["kv"]), flush=True)
        stacks.running = False

    if children:  # each in its own process with its own engine, after this one's is gone
        if llm is not None:
            core = getattr(llm.llm_engine, "engine_core", None)
            if hasattr(core, "shutdown"):
                core.shutdown()
            del llm
            llm = None
            import gc

            gc.collect()
        for child in children:
            name, _, extra = child.partition("=") if child != "a0" else ("a0", "", "")
            left = wait_gpu_free(sampler)
            argv = child_argv(args, ["--llm", "defaults", "--modes", "a0"] if child == "a0"
                              else ["--modes", "b", *extra.split()], work / f"child-{name}.json")
            print(f"{time.strftime('%T')} child {name}: {' '.join(argv[2:])} (GPU memory used before: {left} GB)",
                  flush=True)
            got = run_child(argv, work / f"child-{name}.log", timeout=900)
            if not got:
                report[f"failed_{name}"] = (work / f"child-{name}.log").read_text()[-3000:]
                save()
                continue
            key = "a0_vllm_defaults" if child == "a0" else "b_batchocr"
            if key in got:
                report[key if child == "a0" else f"b_{name}"] = got[key] | {
                    "llm_args": got["llm_args"], "llm_init_s": got.get("llm_init_s"), "child_args": extra,
                    "warmup": got.get("warmup")}
                if child != "a0" and "a_vllm_alone" in got:  # a variant that asked for --modes a,b: its a too
                    report[f"a_{name}"] = got["a_vllm_alone"] | {"child_args": extra}
            else:
                report[f"failed_{name}"] = (work / f"child-{name}.log").read_text()[-3000:]
            timeline.steps = sorted(timeline.steps + [tuple(s) for s in got.get("engine_steps", [])])
            save()

    sampler.running = False
    pairs = [("b_batchocr", "a_vllm_alone"), ("b_batchocr", "c_batch_at_a_time"), ("b_batchocr", "a0_vllm_defaults"),
             ("a0_vllm_defaults", "a_vllm_alone")]
    pairs += [(k, "b_batchocr") for k in report if k.startswith("b_") and k != "b_batchocr"]
    pairs += [(f"b_{k[2:]}", k) for k in report if k.startswith("a_") and k != "a_vllm_alone"]  # b/a in a variant
    # A control: --variant same= is b's own arguments in a child process, as every variant runs (a
    # child started 1.3 s sooner on a warm machine, seventeenth lease); each variant against it too.
    pairs += [(k, "b_same") for k in report if k.startswith("b_") and k not in ("b_batchocr", "b_same")]
    for x, y in pairs:
        if isinstance(report.get(x), dict) and isinstance(report.get(y), dict):
            report[f"ratio_{x}/{y}"] = round(report[x]["pages_per_s"] / report[y]["pages_per_s"], 3)
            sx, sy = report[x].get("steady"), report[y].get("steady")
            if sx and sy and sx.get("pages_per_s") and sy.get("pages_per_s"):
                report[f"steady_ratio_{x}/{y}"] = round(sx["pages_per_s"] / sy["pages_per_s"], 3)
    # Equal work: every mode generated the same tokens (the engine core's count where there is one).
    done = {k: v["work"] for k, v in report.items() if isinstance(v, dict) and "work" in v}
    report["equal_work"] = {"expected_tokens": report["output_tokens_total"],
                            "tokens": {k: w.get("engine_tokens") or w["client_tokens"] for k, w in done.items()},
                            "pages": {k: w["pages"] for k, w in done.items()},
                            "prompt_tokens": {k: w.get("prompt_tokens_rows") for k, w in done.items()},
                            "requests": {k: w.get("requests") for k, w in done.items()}}
    # The same pages and output tokens in every mode; the same prompts and requests among the
    # runs of one --mode (document mode's groups have a prompt of their own, base-mode images).
    by_mode: dict[str, list[str]] = {}
    for k in done:
        by_mode.setdefault(report[k].get("mode", args.mode), []).append(k)

    def alike(field: str, runs) -> bool:
        return len({report["equal_work"][field][k] for k in runs}) <= 1

    report["equal_work"]["equal"] = (alike("tokens", done) and alike("pages", done) and all(
        alike(f, runs) for runs in by_mode.values() for f in ("prompt_tokens", "requests")))
    mean_out = report["output_tokens_total"] / max(1, len(keys))
    if args.model and not args.fake and args.preset != "unlimited-ocr":  # the ceiling knows Qwen2.5-VL's layout
        peak = PEAK_TFLOPS["fp8" if args.quantization == "fp8" else "bf16"]
        report["compute_ceiling"] = compute_ceiling(args.model, prompt_tokens or (patches / 4 + 84), mean_out,
                                                    patches, peak)
    print({k: v for k, v in report.items() if k.startswith(("ratio", "steady_ratio", "compute", "equal"))},
          flush=True)
    save()
    if llm is not None:
        core = getattr(llm.llm_engine, "engine_core", None)
        if hasattr(core, "shutdown"):
            core.shutdown()
    os._exit(0)  # never hang at exit on vLLM's threads


if __name__ == "__main__":
    main()

"""Does Unlimited-OCR's MoE layer run faster with a tuned Triton config than with vLLM's default?
On the lent GPU, vLLM's own fused_experts alone:

    python3 bench/gpu/moe_tune.py --model /tmp/models/unlimited-ocr --json /tmp/res/moe-tune.json

vLLM 0.26 ships no fused-MoE config for this model's routed experts (E=64 experts, N=896, the
log says "Using default MoE config. Performance might be sub-optimal!"), so each call takes
get_default_config's tiles. This times fused_experts at the model's shapes (random weights and
routing, bf16; replayed from CUDA graphs, as an engine runs its steps) for the token counts an
engine step has (decode ~1-512, prefill chunks up to max_num_batched_tokens), under the
default config and under each config of a small grid, and writes the best per token count as
vLLM's config file (VLLM_TUNED_CONFIG_FOLDER reads it) beside the JSON. Equal work: each config computes the same M x top_k expert products of the same
inputs; the JSON records the shapes, the calls timed and each M's default and best time.

Triton compiles each config on first use (~1 s each, two kernels a config): a pool of processes
compiles them into one TRITON_CACHE_DIR first, then this process times them all from the cache,
alone on the GPU.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

MS = (1, 16, 64, 128, 256, 512, 1024, 4096, 8192, 16384)


def grid() -> list[dict]:
    out = []
    for bm, bn, bk, gm, w, s in itertools.product((16, 32, 64, 128), (64, 128), (64, 128), (1, 16), (4, 8), (3, 4)):
        if bm * bk * s * 2 + bn * bk * s * 2 > 200 * 1024:  # the tiles' shared memory, bf16
            continue
        out.append({"BLOCK_SIZE_M": bm, "BLOCK_SIZE_N": bn, "BLOCK_SIZE_K": bk, "GROUP_SIZE_M": gm,
                    "num_warps": w, "num_stages": s})
    return out


def fits(config: dict, m: int, topk: int, experts: int) -> bool:
    """The grid's configs worth timing at m tokens: an M tile near the tokens an expert gets."""
    per_expert = max(1, m * topk // experts)
    bm = config["BLOCK_SIZE_M"]
    return bm <= 32 if per_expert <= 32 else (bm >= 32 and bm <= 64) if per_expert <= 256 else bm >= 64


def shapes(model: Path | None) -> dict:
    """E, N (the experts' intermediate size), K (hidden) and top_k of the model's language model."""
    s = {"E": 64, "N": 896, "K": 1280, "topk": 6}
    if model and (model / "config.json").exists():
        cfg = json.loads((model / "config.json").read_text())
        lm = cfg.get("language_config") or cfg.get("text_config") or cfg
        s = {"E": lm.get("n_routed_experts", s["E"]), "N": lm.get("moe_intermediate_size", s["N"]),
             "K": lm.get("hidden_size", s["K"]), "topk": lm.get("num_experts_per_tok", s["topk"])}
    return s


class Case:
    """The inputs of one token count: hidden states, both expert weights, a routing."""

    def __init__(self, s: dict, m: int, seed: int = 0):
        import torch

        g = torch.Generator(device="cuda").manual_seed(seed)
        dev, dt = "cuda", torch.bfloat16
        self.x = torch.randn(m, s["K"], device=dev, dtype=dt, generator=g) / 10
        self.w1 = torch.randn(s["E"], 2 * s["N"], s["K"], device=dev, dtype=dt, generator=g) / 10
        self.w2 = torch.randn(s["E"], s["K"], s["N"], device=dev, dtype=dt, generator=g) / 10
        logits = torch.randn(m, s["E"], device=dev, dtype=torch.float32, generator=g)
        w, ids = torch.topk(torch.softmax(logits, dim=-1), s["topk"], dim=-1)
        self.topk_weights, self.topk_ids = w, ids.to(torch.int32)

    def call(self, config: dict | None):
        from vllm.model_executor.layers.fused_moe import override_config
        from vllm.model_executor.layers.fused_moe.fused_moe import fused_experts

        with override_config(config):
            return fused_experts(self.x, self.w1, self.w2, self.topk_weights, self.topk_ids)


def timed(case: Case, config: dict | None, calls: int) -> float:
    """Median microseconds a call over three rounds, the calls replayed from a CUDA graph of 10
    (as an engine's steps run them: launched one at a time from Python, fused_experts' host work
    outlasts a small step's kernels, and the timing would be the host's)."""
    import torch

    for _ in range(2):
        case.call(config)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(10):
            case.call(config)
    torch.cuda.synchronize()
    graph.replay()
    replays = max(1, calls // 10)
    rounds = []
    for _ in range(3):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(replays):
            graph.replay()
        b.record()
        b.synchronize()
        rounds.append(a.elapsed_time(b) * 1000 / (10 * replays))
    return statistics.median(rounds)


def compile_some(s: dict, configs: list[dict]) -> int:
    """A pool worker: every config run once at each token count it is timed at (Triton compiles
    it into the shared cache). The configs Triton cannot build are left out of the count."""
    import torch

    cases = {m: Case(s, m) for m in (1, 16, 256, 4096)}  # Triton specializes on ints' divisibility by 16
    ok = 0
    for c in configs:
        try:
            for case in cases.values():
                case.call(c)
            torch.cuda.synchronize()
            ok += 1
        except Exception:  # out of resources for this tile: timed as failing later, skipped there
            pass
    return ok


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, help="the model's folder (config.json gives E, N, K, top_k)")
    ap.add_argument("--json", type=Path, required=True)
    ap.add_argument("--compilers", type=int, default=max(1, min(14, (os.cpu_count() or 2) - 2)))
    ap.add_argument("--ms", default=",".join(map(str, MS)))
    args = ap.parse_args()
    os.environ.setdefault("TRITON_CACHE_DIR", str(Path("/tmp/moe-tune-triton")))
    import torch

    from vllm.model_executor.layers.fused_moe.fused_moe import get_config_file_name, get_default_config

    s = shapes(args.model)
    ms = [int(x) for x in args.ms.split(",")]
    configs = grid()
    report: dict = {"shapes": s, "device": torch.cuda.get_device_name(), "configs": len(configs), "ms": ms,
                    "triton_cache": os.environ["TRITON_CACHE_DIR"], "by_m": {}}
    t0 = time.monotonic()
    with ProcessPoolExecutor(args.compilers, mp_context=__import__("multiprocessing").get_context("spawn")) as pool:
        built = sum(pool.map(compile_some, [s] * args.compilers,
                             [configs[i::args.compilers] for i in range(args.compilers)]))
    report["compiled"] = built
    report["compile_s"] = round(time.monotonic() - t0, 1)
    print(f"compiled {built} of {len(configs)} configs in {report['compile_s']} s", flush=True)

    best_file = {}
    for m in ms:
        case = Case(s, m)
        calls = max(5, min(100, 200_000 // m))
        default = get_default_config(m, s["E"], s["N"], s["K"], s["topk"], None, None)
        ref = case.call(default).float()
        t_default = timed(case, default, calls)
        rows = []
        for c in configs:
            if not fits(c, m, s["topk"], s["E"]):
                continue
            try:
                out = case.call({**c, "SPLIT_K": 1}).float()
                if not torch.allclose(out, ref, rtol=2e-2, atol=2e-2):
                    continue  # a config must compute what the default does
                rows.append((timed(case, {**c, "SPLIT_K": 1}, calls), c))
            except Exception:
                continue
        rows.sort(key=lambda r: r[0])
        best_us, best = rows[0] if rows else (t_default, default)
        if best_us >= t_default:
            best_us, best = t_default, default
        best_file[str(m)] = {k: v for k, v in best.items() if k != "SPLIT_K"}
        report["by_m"][str(m)] = {"calls": calls, "default": default, "default_us": round(t_default, 2),
                                  "best": best, "best_us": round(best_us, 2),
                                  "speedup": round(t_default / best_us, 3), "timed": len(rows)}
        print(f"M={m:6d} default {t_default:9.1f} us  best {best_us:9.1f} us  x{t_default / best_us:.3f}  {best}",
              flush=True)
        args.json.write_text(json.dumps(report, indent=1))
    name = get_config_file_name(s["E"], s["N"], None)
    (args.json.parent / name).write_text(json.dumps(best_file, indent=1))
    report["config_file"] = name
    report["total_s"] = round(time.monotonic() - t0, 1)
    args.json.write_text(json.dumps(report, indent=1))
    print(f"wrote {args.json.parent / name} ({report['total_s']} s)", flush=True)


if __name__ == "__main__":
    sys.exit(main())

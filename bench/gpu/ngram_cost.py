"""What the no-repeat n-gram logits processor costs the engine a step: vLLM's against batchocr's.

Unlimited-OCR's (and DeepSeek-OCR's) recipe registers vLLM's `NGramPerReqLogitsProcessor`
(vllm.model_executor.models.deepseek_ocr): every decode step, for every running request, a Python
loop over the last `window_size` generated tokens, then (when something is banned) an indexed
write into that request's row of the logits. The engine core runs it between the forward pass
and sampling, so its time adds to every step. batchocr's `batchocr.engines.vllm.patches.ngram.NoRepeatNGramLogitsProcessor`
bans the same tokens, kept up to date as tokens arrive, with one indexed write a step for the batch.

Both are driven here as vLLM's engine core drives them (`update_state` with a BatchUpdate of the
requests, then `apply` on a [requests, vocab] logits tensor, a token appended to each request's
list a step), on the logits' device (`--device cuda` on the GPU: the indexed writes are GPU
writes there), for page mode (window 128) and whole documents (1024), with random token
histories (nothing banned: sound text) and looping ones (what random weights write: something
banned nearly every step). Each step, both ban the same tokens (checked on the logits).

A third column is batchocr.engines.vllm.patches.ngram_sampler, the bans inside vLLM's V2 sampler: `RequestBans.apply`
over the runner's request state (the token history a [requests, tokens] tensor on the device,
where vLLM keeps it in UVA memory: its reads cross PCIe there), timed with the device
synchronised, its bans checked equal to the others'.

    python bench/gpu/ngram_cost.py [--device cuda] [--requests 256] [--json FILE]   # needs vLLM and torch
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

VOCAB = 129280  # Unlimited-OCR's


def history(rng: random.Random, kind: str, length: int) -> list[int]:
    if kind == "random":
        return [rng.randrange(VOCAB) for _ in range(length)]
    cycle = [rng.randrange(VOCAB) for _ in range(rng.randrange(5, 60))]
    return [rng.randrange(VOCAB) for _ in range(40)] + [cycle[i % len(cycle)] for i in range(length - 40)]


def step_cost(cls, device, requests: int, ngram: int, window: int, kind: str, start: int, steps: int, seed: int):
    """Seconds a step of `cls` over `requests` requests, and the banned (row, token) pairs a step."""
    import torch
    from vllm import SamplingParams
    from vllm.v1.sample.logits_processor import BatchUpdate

    rng = random.Random(seed)
    full = [history(rng, kind, start + steps) for _ in range(requests)]
    ids = [h[:start] for h in full]
    proc = cls(None, device, False)
    params = SamplingParams(extra_args={"ngram_size": ngram, "window_size": window})
    proc.update_state(BatchUpdate(batch_size=requests, removed=[], moved=[],
                                  added=[(i, params, None, ids[i]) for i in range(requests)]))
    logits = torch.zeros(requests, VOCAB, device=device)
    proc.apply(logits)  # the first look at a request's history (batchocr's builds its index: a
    # request running from its first token builds it a token a step, which the steps below time)
    seconds, bans = 0.0, []
    for s in range(steps):
        for i in range(requests):
            ids[i].append(full[i][start + s])
        proc.update_state(None)
        seconds += timed_step(logits, lambda: proc.apply(logits), bans)
    return seconds / steps, bans


def timed_step(logits, apply, bans: list) -> float:
    """Seconds of apply() on zeroed logits, the device synchronised around it (its writes are
    part of the step); the (row, token) pairs it banned appended to bans."""
    import torch

    logits.zero_()
    if logits.device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    apply()
    if logits.device.type == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    bans.append(torch.nonzero(logits == -float("inf")).tolist())
    return seconds


class Staged:
    """vLLM's UvaBackedTensor, as RequestBans uses it: .np on the host, .gpu on the device."""

    def __init__(self, size, device=None):
        import numpy as np
        import torch

        self.device = device
        self.np = np.zeros(size, dtype=np.int32)
        self.gpu = torch.from_numpy(self.np.copy()).to(device)

    def copy_to_uva(self):
        import torch

        self.gpu = torch.from_numpy(self.np.copy()).to(self.device)


def sampler_step_cost(device, requests: int, ngram: int, window: int, kind: str, start: int, steps: int, seed: int):
    """As step_cost, for batchocr.engines.vllm.patches.ngram_sampler's bans over the V2 runner's request state."""
    from types import SimpleNamespace

    import numpy as np
    import torch

    from batchocr.engines.vllm.patches.ngram_sampler import RequestBans

    rng = random.Random(seed)
    full = torch.tensor([history(rng, kind, start + steps) for _ in range(requests)], dtype=torch.int32,
                        device=device)
    bans = RequestBans(requests, lambda size: Staged(size, device))
    params = SimpleNamespace(extra_args={"ngram_size": ngram, "window_size": window})
    for i in range(requests):
        bans.add_request(i, params)
    bans.apply_staged_writes()
    states = SimpleNamespace(all_token_ids=SimpleNamespace(gpu=full),
                             prompt_len=SimpleNamespace(gpu=torch.zeros(requests, dtype=torch.int32, device=device)),
                             total_len=SimpleNamespace(gpu=torch.zeros(requests, dtype=torch.int32, device=device)))
    order_np = np.arange(requests)
    order = torch.arange(requests, dtype=torch.int32, device=device)
    logits = torch.zeros(requests, VOCAB, device=device)
    seconds, banned = 0.0, []
    for s in range(steps):
        states.total_len.gpu.fill_(start + s + 1)  # the tokens step_cost's requests hold at step s
        seconds += timed_step(logits, lambda: bans.apply(logits, order, order_np, states), banned)
    return seconds / steps, banned


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    import torch
    from vllm.model_executor.models.deepseek_ocr import NGramPerReqLogitsProcessor

    from batchocr.engines.vllm.patches.ngram import NoRepeatNGramLogitsProcessor

    device = torch.device(args.device)
    rows = []
    for window, start in ((128, 1000), (1024, 8000)):
        for kind in ("random", "looping"):
            row = {"ngram_size": 35, "window_size": window, "generated": start, "history": kind,
                   "requests": args.requests, "steps": args.steps, "device": args.device}
            v, vb = step_cost(NGramPerReqLogitsProcessor, device, args.requests, 35, window, kind, start, args.steps, 7)
            b, bb = step_cost(NoRepeatNGramLogitsProcessor, device, args.requests, 35, window, kind, start, args.steps, 7)
            g, gb = sampler_step_cost(device, args.requests, 35, window, kind, start, args.steps, 7)
            row |= {"vllm_ms_a_step": round(v * 1e3, 2), "batchocr_ms_a_step": round(b * 1e3, 3),
                    "sampler_ms_a_step": round(g * 1e3, 3), "sampler_same_bans": gb == bb,
                    "vllm_us_a_request": round(v / args.requests * 1e6, 1),
                    "batchocr_us_a_request": round(b / args.requests * 1e6, 2),
                    "banned_a_step": round(sum(map(len, vb)) / args.steps, 1), "same_bans": vb == bb}
            rows.append(row)
            print(json.dumps(row), flush=True)
    if args.json:
        args.json.write_text(json.dumps({"rows": rows}, indent=1) + "\n")
    return 0 if all(r["same_bans"] and r["sampler_same_bans"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())

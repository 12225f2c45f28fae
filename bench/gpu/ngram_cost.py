"""What vLLM's no-repeat n-gram logits processor costs the engine a step, on this host's CPU.

Unlimited-OCR's (and DeepSeek-OCR's) recipe registers
`vllm.model_executor.models.deepseek_ocr:NGramPerReqLogitsProcessor`: every decode step, for
every running request, a Python loop over the last `window_size` generated tokens compares
(ngram_size - 1)-token tuples (NoRepeatNGramLogitsProcessor.__call__). The engine core runs it
between the forward pass and sampling, so its time adds to every step: a step of R requests
costs R calls. Measured here with random token histories (as random weights write: nothing
banned, the common case), per call, for page mode (window 128) and multi-page (1024).

Against it, IncrementalNGram: the same bans (checked step by step here on random and on looping
histories), kept up to date as tokens arrive instead of recomputed: a dict from each
(n-1)-token prefix in the window to the tokens that followed it, one n-gram added and one
dropped a step. IncrementalNGramLogitsProcessor wraps it as vLLM's processor does (same
arguments and validation), so that a run can register it in vLLM's place and measure it:

    --engine-arg 'logits_processors=["bench.gpu.ngram_cost:IncrementalNGramLogitsProcessor"]'

(the engine core imports it by name: the repository's root on PYTHONPATH, as device.sh sets).

    python bench/gpu/ngram_cost.py [--json FILE]      # needs vLLM and torch (CPU is enough)
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path


class IncrementalNGram:
    """NoRepeatNGramLogitsProcessor's bans, incrementally: the n-grams starting in
    [max(0, L - window), L - n] of the L tokens so far, indexed by their first n-1 tokens."""

    def __init__(self, ngram_size: int, window_size: int, whitelist_token_ids: set[int] | None = None):
        self.n, self.window = ngram_size, window_size
        self.whitelist = whitelist_token_ids or set()
        self.follow: dict[tuple, dict[int, int]] = {}
        self.lo = self.hi = 0  # n-grams starting in [lo, hi) are in self.follow

    def _add(self, ids: list[int], i: int) -> None:
        nxt = self.follow.setdefault(tuple(ids[i:i + self.n - 1]), {})
        nxt[ids[i + self.n - 1]] = nxt.get(ids[i + self.n - 1], 0) + 1

    def _drop(self, ids: list[int], i: int) -> None:
        key = tuple(ids[i:i + self.n - 1])
        nxt = self.follow[key]
        tok = ids[i + self.n - 1]
        nxt[tok] -= 1
        if not nxt[tok]:
            del nxt[tok]
            if not nxt:
                del self.follow[key]

    def banned(self, ids: list[int]) -> set[int]:
        length = len(ids)
        if length < self.n:
            return set()
        lo, hi = max(0, length - self.window), length - self.n + 1
        if hi < self.hi or lo < self.lo:  # the history shrank (not in vLLM): start over
            self.follow, self.lo, self.hi = {}, lo, lo
        for i in range(max(self.hi, lo), hi):
            self._add(ids, i)
        for i in range(self.lo, min(lo, self.hi)):
            self._drop(ids, i)
        self.lo, self.hi = lo, max(hi, lo)
        return set(self.follow.get(tuple(ids[length - self.n + 1:]), ())) - self.whitelist

    def __call__(self, output_ids: list[int], logits):
        banned = self.banned(output_ids)
        if banned:
            logits[list(banned)] = -float("inf")
        return logits


try:  # the engine core imports this module by name: vLLM is there
    from vllm.model_executor.models.deepseek_ocr import NGramPerReqLogitsProcessor as _VLLMNGram
except ImportError:  # no vLLM: the class below is not usable, the rest of the module is
    _VLLMNGram = object


class IncrementalNGramLogitsProcessor(_VLLMNGram):
    """vLLM's NGramPerReqLogitsProcessor (its extra_args: ngram_size, window_size,
    whitelist_token_ids; its validation) with IncrementalNGram for each request."""

    def new_req_logits_processor(self, params):
        extra = params.extra_args or {}
        if extra.get("ngram_size") is None:
            return None
        whitelist = extra.get("whitelist_token_ids")
        return IncrementalNGram(extra["ngram_size"], extra.get("window_size", 100), set(whitelist) if whitelist else None)


def same_bans(reference, fast, history: list[int]) -> bool:
    """Step by step over a history, the two ban the same tokens."""
    import torch

    for length in range(1, len(history) + 1):
        ids = history[:length]
        row = torch.zeros(129280)
        reference(ids, row)
        if set(torch.nonzero(row == -float("inf")).flatten().tolist()) != fast.banned(ids):
            return False
    return True


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    import torch
    from vllm.model_executor.models.deepseek_ocr import NoRepeatNGramLogitsProcessor

    rng = random.Random(0)
    logits = torch.zeros(129280)
    rows = []
    for ngram, window, generated in ((35, 128, 1000), (35, 128, 4000), (35, 1024, 8000), (35, 1024, 16000)):
        proc = NoRepeatNGramLogitsProcessor(ngram_size=ngram, window_size=window)
        history = [rng.randrange(129280) for _ in range(generated)]
        calls = 2000 if window <= 128 else 200
        t0 = time.perf_counter()
        for _ in range(calls):
            proc(history, logits)
        us = (time.perf_counter() - t0) / calls * 1e6
        row = {"ngram_size": ngram, "window_size": window, "generated": generated, "us_per_call": round(us, 1),
               "ms_per_step_256_requests": round(us * 256 / 1000, 1),
               "ms_per_step_512_requests": round(us * 512 / 1000, 1)}
        # a running request: its token list grows by one a step (vLLM hands the same list)
        steps = generated // 2  # the second half of the history, a token a call
        ids, fast = history[:generated - steps], IncrementalNGram(ngram, window)
        fast.banned(ids)
        t0 = time.perf_counter()
        for tok in history[generated - steps:]:
            ids.append(tok)
            fast.banned(ids)
        row["incremental_us_per_call"] = round((time.perf_counter() - t0) / steps * 1e6, 2)
        rows.append(row)
        print(json.dumps(row), flush=True)
    # the same bans: random histories (nothing to ban) and looping ones (bans every step once looping)
    loop = [rng.randrange(129280) for _ in range(40)] + [rng.randrange(50) for _ in range(7)] * 120
    checks = {f"{kind}, n {n}, window {w}": same_bans(NoRepeatNGramLogitsProcessor(ngram_size=n, window_size=w),
                                               IncrementalNGram(n, w), hist)
              for kind, hist in (("random", [rng.randrange(129280) for _ in range(600)]), ("looping", loop))
              for n, w in ((35, 128), (5, 128), (35, 1024))}
    print(json.dumps({"same_bans": checks}), flush=True)
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "same_bans": checks}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

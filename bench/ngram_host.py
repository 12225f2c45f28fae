"""The host time of batchocr's no-repeat n-gram bans a decode step: this checkout's against another's.

`batchocr.engines.vllm.patches.ngram.BatchBans.pairs()` is what `NoRepeatNGramLogitsProcessor.apply` runs on the
engine core's host every decode step, for every running request, before its one indexed
write; on the V1 runner that host time is part of the step (docs/history/GPU.md: its decode steps are
host-bound). This times `pairs()` of this checkout and of a baseline checkout (`--baseline
DIR`, e.g. a `git worktree` of an older commit) in the same process, over the same requests
and tokens: 256 requests holding `--start` tokens, then `--steps` steps of one token each (what
a decode step gives), page mode (ngram 35, window 128) and whole documents (window 1024), random
histories (sound text: nothing banned) and looping ones (random weights: something banned
nearly every step). Each step both must ban the same (row, token) pairs, and so must vLLM's
loop (its algorithm, as tests/test_ngram.py's reference has it) on the first rows. No vLLM or
torch needed.

    git worktree add /tmp/ngram-base 3f64885
    python bench/ngram_host.py --baseline /tmp/ngram-base [--requests 256] [--json FILE]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import platform
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

VOCAB = 129280  # Unlimited-OCR's


# Where a checkout keeps the bans: the vLLM engine's patches, or (older checkouts) batchocr/ngram.py.
PLACES = ("batchocr/engines/vllm/patches/ngram.py", "batchocr/ngram.py")


def load(tree: Path, name: str):
    path = next((tree / p for p in PLACES if (tree / p).exists()), tree / PLACES[0])
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def history(rng: random.Random, kind: str, length: int) -> list[int]:
    if kind == "random":
        return [rng.randrange(VOCAB) for _ in range(length)]
    cycle = [rng.randrange(VOCAB) for _ in range(rng.randrange(5, 60))]
    return [rng.randrange(VOCAB) for _ in range(40)] + [cycle[i % len(cycle)] for i in range(length - 40)]


def run(module, full: list[list[int]], start: int, steps: int, ngram: int, window: int):
    """Seconds a step of BatchBans.pairs() and each step's banned (row, token) pairs."""
    bans = module.BatchBans()
    ids = [h[:start] for h in full]
    for row, own in enumerate(ids):
        bans.rows[row] = (module.NGramBan(ngram, window), own)
    bans.pairs()  # the first look at each history (a request running from its first token builds it a token a step)
    seconds, banned = 0.0, []
    for s in range(steps):
        for row, own in enumerate(ids):
            own.append(full[row][start + s])
        t0 = time.perf_counter()
        rows, cols = bans.pairs()
        seconds += time.perf_counter() - t0
        banned.append(sorted(zip(rows, cols)))
    return seconds / steps, banned


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", type=Path, required=True, help="another checkout's root (its n-gram bans' module)")
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=5, help="each side timed this often, alternating; the median kept")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    from test_ngram import reference  # vLLM's loop

    this, base = load(ROOT, "ngram_this"), load(args.baseline, "ngram_base")
    rows = []
    for ngram, window, start in ((35, 128, 1000), (35, 1024, 8000)):
        for kind in ("random", "looping"):
            rng = random.Random(window * 7 + len(kind))
            full = [history(rng, kind, start + args.steps) for _ in range(args.requests)]
            times = {"this": [], "base": []}
            for _ in range(args.repeats):
                for side, module in (("base", base), ("this", this)):
                    seconds, banned = run(module, full, start, args.steps, ngram, window)
                    times[side].append(seconds)
                    if side == "base":
                        base_banned = banned
                    elif banned != base_banned:
                        raise SystemExit(f"different bans: ngram {ngram}, window {window}, {kind}")
            for row in range(min(4, args.requests)):  # and vLLM's loop, step by step
                for s in range(args.steps):
                    want = reference(full[row][:start + s + 1], ngram, window)
                    if {t for r, t in base_banned[s] if r == row} != want:
                        raise SystemExit(f"not vLLM's bans: row {row}, step {s}")
            med = {side: sorted(v)[len(v) // 2] for side, v in times.items()}
            rows.append({"ngram": ngram, "window": window, "tokens_so_far": start, "history": kind,
                         "banned_a_step": round(sum(len(b) for b in base_banned) / args.steps, 1),
                         "base_ms_a_step": round(med["base"] * 1e3, 3), "this_ms_a_step": round(med["this"] * 1e3, 3),
                         "base_us_a_request": round(med["base"] * 1e6 / args.requests, 2),
                         "this_us_a_request": round(med["this"] * 1e6 / args.requests, 2),
                         "this_over_base": round(med["this"] / med["base"], 3), "same_bans": True})
            print(json.dumps(rows[-1]), flush=True)
    print("\n| ngram, window | tokens so far | history | banned a step | baseline, ms a step (us a request) "
          "| this, ms a step (us a request) | this / baseline |\n| --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['ngram']}, {r['window']} | {r['tokens_so_far']:,} | {r['history']} | {r['banned_a_step']:g} "
              f"| {r['base_ms_a_step']:.2f} ({r['base_us_a_request']:.2f}) | {r['this_ms_a_step']:.2f} "
              f"({r['this_us_a_request']:.2f}) | {r['this_over_base']:.3f} |")
    if args.json:
        args.json.write_text(json.dumps({"requests": args.requests, "steps": args.steps, "repeats": args.repeats,
                                         "baseline": str(args.baseline), "python": platform.python_version(),
                                         "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""batchocr.engines.vllm.patches.ngram_sampler on the GPU: the no-repeat n-gram bans inside vLLM's V2 sampler, end to end.

Three engines on the same prompts and lengths (random weights, so the text loops and the bans
fire nearly every step; `ignore_eos`, so every mode generates the same tokens' count), each in a
process of its own:
- none: no bans (the power of the check: its outputs must repeat n-grams);
- processor: batchocr.engines.vllm.patches.ngram's logits processor (vLLM's V1 runner);
- sampler: `worker_extension_cls` batchocr.engines.vllm.patches.ngram_sampler (must be the V2 runner).
Each output is replayed through batchocr.engines.vllm.patches.ngram.NGramBan: a token that NGramBan bans at its step
is a violation. Passes when processor and sampler have none, none has some, and sampler ran on
V2. Also records each mode's generated tokens/s (equal work; one engine, no pipeline).

    python bench/gpu/make_models.py /tmp/models unlimited-ocr
    python bench/gpu/check_sampler_bans.py /tmp/models/unlimited-ocr [--prompts 256] [--tokens 1024] [--json F]

Needs vLLM and a GPU.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODES = ("none", "processor", "sampler")
NGRAM = {"ngram_size": 35, "window_size": 128}


def one(args) -> dict:
    """One mode's engine and run, in this process: the engine batchocr builds (VLLMOptions'
    arguments for the unlimited-ocr preset, ngram_bans as the mode says), page images with the
    preset's prompt, as batchocr sends them (on the H200, 2026-12-02, both V1 engines died inside
    `generate` on text-only prompts of random ids; what killed them was not kept)."""
    import random

    from PIL import Image
    from vllm import LLM, SamplingParams

    sys.path.insert(0, str(ROOT))
    from batchocr.engines.vllm.presets import get_preset
    from batchocr.engines.vllm import VLLMOptions
    from batchocr.engines.vllm.patches.ngram import NGramBan
    from throughput import engine_args

    preset = get_preset("unlimited-ocr")
    options = VLLMOptions(model=str(args.model), preset="unlimited-ocr", load_format="dummy",
                          ngram_bans="sampler" if args.one == "sampler" else "processor",
                          max_model_len=4096, max_num_seqs=args.prompts, gpu_memory_utilization=0.85,
                          # R-SWA's attention on the kit's backend: vLLM's choice, FA4, needs cutlass, which the
                          # kit lacks (the sampler's engine stopped on it: the H200, 2026-12-02; suite.sh's uocr())
                          engine_args={"attention_config": {"backend": "TRITON_ATTN"}}
                          | ({"logits_processors": []} if args.one == "none" else {}) | engine_args(args))
    options.set_runner_env()  # as batchocr's engine does (the sampler's bans ask for V2)
    llm_args = options.llm_args(preset)
    llm = LLM(**llm_args)
    v2 = bool(llm.llm_engine.vllm_config.use_v2_model_runner)
    rng = random.Random(7)
    side = 640  # one view a page: the check needs the decoding, not the crops

    def page():
        return Image.frombytes("L", (side, side), rng.randbytes(side * side)).convert("RGB")

    prompts = [{"prompt": preset.prompt(), "multi_modal_data": {"image": page()}} for _ in range(args.prompts)]
    params = SamplingParams(max_tokens=args.tokens, ignore_eos=True, temperature=0.0, detokenize=False,
                            extra_args=dict(NGRAM))
    llm.generate(prompts[:4], params, use_tqdm=False)  # warm-up
    t0 = time.perf_counter()
    outs = llm.generate(prompts, params, use_tqdm=False)
    wall = time.perf_counter() - t0
    tokens = [list(o.outputs[0].token_ids) for o in outs]
    violations = 0
    for ids in tokens:  # replayed a token a step, as the engine saw them
        ban, seen = NGramBan(NGRAM["ngram_size"], NGRAM["window_size"]), []
        for token in ids:
            violations += token in ban.banned(seen)
            seen.append(token)
    return {"mode": args.one, "v2_model_runner": v2, "logits_processors": llm_args.get("logits_processors"),
            "worker_extension_cls": llm_args.get("worker_extension_cls"), "prompts": len(tokens),
            "tokens": sum(map(len, tokens)),
            "wall_s": round(wall, 2), "tokens_per_s": round(sum(map(len, tokens)) / wall),
            "violations": violations}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", type=Path)
    ap.add_argument("--prompts", type=int, default=256)
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--engine-arg", action="append", default=[],
                    help='KEY=JSON on top of the engine arguments, e.g. compilation_config={"cudagraph_mode": "PIECEWISE"}')
    ap.add_argument("--json", type=Path)
    ap.add_argument("--one", choices=MODES, help=argparse.SUPPRESS)  # a child: one mode
    args = ap.parse_args()
    if args.one:
        print("RESULT " + json.dumps(one(args)), flush=True)
        return 0
    rows = []
    for mode in MODES:
        argv = [sys.executable, __file__, str(args.model), "--prompts", str(args.prompts), "--tokens",
                str(args.tokens), "--one", mode] + [f"--engine-arg={item}" for item in args.engine_arg]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=1200)
        if args.json:  # the child's whole output, for the engine's own trace when it fails
            args.json.with_name(f"{args.json.stem}-{mode}.log").write_text(proc.stdout + proc.stderr)
        got = [line[7:] for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
        errors = [line for line in proc.stderr.splitlines() if "Error" in line][-6:]
        row = json.loads(got[0]) if got else {"mode": mode, "error": errors}
        rows.append(row)
        print(json.dumps(row), flush=True)
    by = {r["mode"]: r for r in rows}
    ok = (all("error" not in r for r in rows) and by["none"]["violations"] > 0 and by["processor"]["violations"] == 0
          and by["sampler"]["violations"] == 0 and by["sampler"]["v2_model_runner"]
          and len({r["tokens"] for r in rows}) == 1)
    report = {"rows": rows, "ok": ok, "ngram": NGRAM}
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    print("ok" if ok else "FAILED", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

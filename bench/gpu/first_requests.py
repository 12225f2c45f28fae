"""What a process's first requests cost to prepare, before vLLM runs anything: vLLM's renderer
(the model's tokenizer and image processor) on its first calls, after the engine is built.

The fourteenth lease (docs/history/GPU.md) saw a process's first run wait ~15 s between its first rendered
pages and its first request to vLLM, where later runs in the same process waited none, and a
`generate` of 64 pages beforehand removed it. This times, in one fresh process each:

  1. with --pre-warm, the model's own processor from transformers (`AutoProcessor`) on one page,
     before vLLM is built: what a warm-up during the engine's build could do, since vLLM's
     renderer does not exist until the engine does;
  2. the engine's build (batchocr's engine arguments, the preset's);
  3. the renderer on one page, then on one more (first call, second call);
  4. --threads N pages at once in N threads, as batchocr's prepare threads do (with --fresh-threads,
     as the first calls instead of step 3: the first run's case).

    python3 bench/gpu/first_requests.py /tmp/models/qwen2-vl-2b --json first.json            # on the GPU
    python3 bench/gpu/first_requests.py /tmp/models/qwen2-vl-2b --pre-warm --json warm.json   # another process
    python3 bench/gpu/first_requests.py /m --fake                                              # dry run (CPU)

Pages of 896x1288 with random pixels, the preset's prompt; nothing is generated. Needs vLLM."""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def page(seed: int):
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (1288, 896, 3), dtype=np.uint8), "RGB")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", help="a model folder (make_models.py's)")
    ap.add_argument("--preset", default="qwen2.5-vl")
    ap.add_argument("--pre-warm", action="store_true", help="transformers' AutoProcessor on one page before the build")
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--fresh-threads", action="store_true", help="the threads' pages are the first calls")
    ap.add_argument("--fake", action="store_true", help="a dry run on the CPU with tests/fake_vllm.py")
    ap.add_argument("--json")
    args = ap.parse_args()
    if args.fake:
        sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
        import fake_vllm

        fake_vllm.install_modules()
    t_start = time.monotonic()
    report: dict = {"model": args.model, "preset": args.preset, "pre_warm": args.pre_warm, "threads": args.threads,
                    "fresh_threads": args.fresh_threads}

    from batchocr.engines.vllm.presets import get_preset
    from batchocr.engines.vllm import VLLMOptions

    preset = get_preset(args.preset)
    options = VLLMOptions(model=args.model, preset=args.preset, load_format="dummy")
    prompt = preset.prompt()
    if args.pre_warm:
        t = time.monotonic()
        from transformers import AutoProcessor

        processor = AutoProcessor.from_pretrained(args.model, **dict(preset.mm_processor_kwargs))
        report["pre_warm_load_s"] = round(time.monotonic() - t, 2)
        t = time.monotonic()
        try:  # the run goes on without it: the build and the renderer's calls are still timed
            processor(text=[prompt], images=[page(0)], return_tensors="pt")
        except Exception as exc:  # noqa: BLE001
            report["pre_warm_error"] = f"{type(exc).__name__}: {exc}"[:300]
        report["pre_warm_call_s"] = round(time.monotonic() - t, 2)
    t = time.monotonic()
    from vllm import LLM

    options.set_runner_env()
    llm = LLM(**options.llm_args(preset))
    report["build_s"] = round(time.monotonic() - t, 1)
    renderer = llm.llm_engine.renderer

    def prepare(seed: int) -> float:
        t0 = time.monotonic()
        renderer.render_cmpl([{"prompt": prompt, "multi_modal_data": {"image": page(seed)}}])
        return round(time.monotonic() - t0, 3)

    if not args.fresh_threads:
        report["first_call_s"] = prepare(1)
        report["second_call_s"] = prepare(2)
    t = time.monotonic()
    with ThreadPoolExecutor(args.threads) as pool:
        report["thread_calls_s"] = list(pool.map(prepare, range(10, 10 + args.threads)))
    report["threads_wall_s"] = round(time.monotonic() - t, 3)
    report["then_one_call_s"] = prepare(99)
    report["process_s"] = round(time.monotonic() - t_start, 1)
    print(json.dumps(report), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    core = getattr(llm.llm_engine, "engine_core", None)
    if hasattr(core, "shutdown"):
        core.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())

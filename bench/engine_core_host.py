"""The engine core's host work a decode step, on the CPU: vLLM's own scheduler (the class its engine
core builds: AsyncScheduler, as async scheduling is on) driven as its engine core drives it, with
the model's forward pass replaced by a sampled token a running request; then each step's outputs
encoded as its output thread encodes them for the front end.

Why: with Unlimited-OCR one engine keeps the GPU 49-65% busy; its engine core (one Python
process: the scheduler, the model runner's host side, the step's outputs) is the limit
(docs/PERFORMANCE.md). This times the part of a step that needs no GPU, at R running requests,
in the steady state (every request decoding), and where it goes by function (cProfile).

    python bench/engine_core_host.py --model DIR [--running 256] [--steps 400] [--profile 30]
    python bench/engine_core_host.py --model DIR --json docs/engine-core-host-DATE.json

DIR is a model folder of the layout (bench/gpu/make_models.py DIR unlimited-ocr). Needs vLLM
(the CUDA wheel imports on a machine without a GPU: the platform is given a device type here).
Equal work: every variant runs the same requests, prompt and output lengths and steps.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import platform
import pstats
import statistics
import sys
import time


def _vllm_config(model: str, running: int):
    from vllm.platforms import current_platform

    if not current_platform.device_type:  # no GPU here: vLLM's config wants a device
        type(current_platform).device_type = "cpu"
    from vllm.engine.arg_utils import EngineArgs

    # batchocr's engine arguments for the unlimited-ocr preset (options.llm_args)
    args = EngineArgs(model=model, load_format="dummy", max_num_seqs=running, max_num_batched_tokens=16384,
                      max_model_len=8192, enable_prefix_caching=False, mm_processor_cache_gb=0,
                      limit_mm_per_prompt={"image": 1, "video": 0}, stream_interval=32, seed=0)
    return args.create_engine_config()


def _scheduler(config, blocks: int, log_stats: bool = False):
    import torch
    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec, RSWASpec
    from vllm.v1.structured_output import StructuredOutputManager

    m = config.model_config
    layers = m.get_num_layers(config.parallel_config)
    hf = m.hf_config
    window = getattr(hf, "rswa_window", None) or getattr(getattr(hf, "language_config", None), "rswa_window", 128)
    spec = RSWASpec(block_size=16, num_kv_heads=m.get_num_kv_heads(config.parallel_config),
                    head_size=m.get_head_size(), dtype=torch.bfloat16, rswa_window=window)
    names = [f"model.layers.{i}.self_attn.attn" for i in range(layers)]
    kv = KVCacheConfig(num_blocks=blocks, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(names, spec)])
    config.cache_config.num_gpu_blocks = blocks  # as the engine core sets it once the KV is sized
    cls = config.scheduler_config.get_scheduler_cls()
    return cls(vllm_config=config, kv_cache_config=kv, structured_output_manager=StructuredOutputManager(config),
               block_size=16, log_stats=log_stats), cls.__name__, window


def _request(i: int, prompt: int, image: int, max_tokens: int):
    from vllm import SamplingParams
    from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange
    from vllm.v1.request import Request

    # the preset's sampling: greedy, special tokens kept, the n-gram processor's arguments
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True, skip_special_tokens=False,
                            extra_args={"ngram_size": 35, "window_size": 128})
    feature = MultiModalFeatureSpec(data=None, modality="image", identifier=f"img-{i}",
                                    mm_position=PlaceholderRange(offset=1, length=image))
    return Request(f"r{i}", [0] + [128815] * image + list(range(100, 100 + prompt - image - 1)), params, None,
                   mm_features=[feature], arrival_time=time.time())


def _runner_output(scheduler, scheduler_output, step: int):
    from vllm.v1.outputs import ModelRunnerOutput

    ids = list(scheduler_output.num_scheduled_tokens)
    # a prompt's chunk before its last samples nothing; a decode (or a prompt's last chunk) one token
    sampled = [[] if scheduler.requests[r].is_prefill_chunk else [1000 + (step * 7 + k) % 100000]
               for k, r in enumerate(ids)]
    return ModelRunnerOutput(req_ids=ids, req_id_to_index={r: k for k, r in enumerate(ids)},
                             sampled_token_ids=sampled)


def run(model: str, running: int, steps: int, warm: int, prompt: int, image: int, profile: int,
        log_stats: bool = False) -> dict:
    from vllm.v1.serial_utils import MsgpackEncoder

    config = _vllm_config(model, running)
    scheduler, name, window = _scheduler(config, blocks=125_332, log_stats=log_stats)  # the H200's KV blocks (uocr-docgroup)
    encoder = MsgpackEncoder()
    for i in range(running):
        scheduler.add_request(_request(i, prompt, image, max_tokens=warm + steps + profile + 64))
    # The engine core's step with a batch queue of 2 (async scheduling): schedule step N+1,
    # then take step N's output. Prefill first (not timed), then the decode steps.
    queue, step, parts, tokens = [], 0, [], 0  # parts: a timed step's (schedule, update, encode) seconds
    profiler = cProfile.Profile()

    def one(timed: bool, prof: bool):
        nonlocal step, tokens
        t0 = time.perf_counter()
        if prof:
            profiler.enable()
        out = scheduler.schedule()
        t1 = time.perf_counter()
        queue.append((out, _runner_output(scheduler, out, step)))
        step += 1
        if len(queue) < 2:
            return
        done, mro = queue.pop(0)
        t2 = time.perf_counter()
        outputs = scheduler.update_from_output(done, mro)
        t3 = time.perf_counter()
        for eco in outputs.values():
            encoder.encode(eco)
        t4 = time.perf_counter()
        if prof:
            profiler.disable()
        if timed:
            parts.append((t1 - t0, t3 - t2, t4 - t3))
            tokens += sum(map(len, mro.sampled_token_ids))

    while any(r.num_computed_tokens < r.num_prompt_tokens for r in scheduler.running) or scheduler.waiting:
        one(False, False)
    for _ in range(warm):
        one(False, False)
    running_now = len(scheduler.running)
    for _ in range(steps):
        one(True, False)
    for _ in range(profile):
        one(False, True)
    stats = io.StringIO()
    if profile:
        pstats.Stats(profiler, stream=stats).sort_stats("tottime").print_stats(25)
    schedule, update, encode = zip(*parts)
    ms = lambda xs: round(statistics.median(xs) * 1e3, 3)  # noqa: E731
    step_s = [sum(p) for p in parts]
    # equal work: the same requests, steps and tokens sampled in every run of one --running
    return {"scheduler": name, "log_stats": log_stats, "running": running_now, "rswa_window": window, "prompt_tokens": prompt,
            "steps": steps, "tokens_sampled": tokens, "ms_a_step": ms(step_s),
            "us_a_request": round(statistics.median(step_s) * 1e6 / running_now, 2),
            "ms_schedule": ms(schedule), "ms_update_from_output": ms(update), "ms_encode_outputs": ms(encode),
            "profile": stats.getvalue()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="a model folder of the layout (bench/gpu/make_models.py)")
    ap.add_argument("--running", type=int, default=256, help="requests running (max_num_seqs)")
    ap.add_argument("--steps", type=int, default=400, help="decode steps timed")
    ap.add_argument("--warm", type=int, default=50, help="decode steps run before the timed ones")
    ap.add_argument("--prompt", type=int, default=906, help="prompt tokens a request (a page in page mode: 906)")
    ap.add_argument("--image", type=int, default=903, help="of which image tokens")
    ap.add_argument("--profile", type=int, default=30, help="steps profiled after the timed ones (0: none)")
    ap.add_argument("--log-stats", action="store_true",
                    help="the scheduler's stats on (vLLM's LLM turns them off; throughput.py turns them on for its timeline)")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    import vllm

    result = run(args.model, args.running, args.steps, args.warm, args.prompt, args.image, args.profile, args.log_stats)
    result = {"vllm": vllm.__version__, "python": platform.python_version(), "cpu": platform.processor() or
              platform.machine(), "command": " ".join(sys.argv), "date": time.strftime("%Y-%m-%d")} | result
    print(result["profile"])
    print(json.dumps({k: v for k, v in result.items() if k != "profile"}, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()

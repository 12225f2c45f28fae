"""The production engine: a vision-language OCR model on vLLM's offline engine.

This module is the engine type (`ENGINE`: what the spec, the CLI and the pipeline know of it);
the package's modules each do one job:

- options.py: `VLLMOptions` (engines.vllm in a job spec), checked before anything loads, and
  the vllm.LLM arguments they make; presets.py: one small function per OCR model (its prompt,
  page size, sampling and engine arguments).
- scheduler.py: `VLLMEngine`, one vllm.LLM fed continuously (requests prepared off the loop,
  admitted as sequences free, runaway repetition stopped and retried: repetition.py).
- document.py: document mode's groups, split back a part a page, or read again page by page.
- instances.py: `VLLMInstances`, several engines on one GPU (engines.vllm.instances).
- processes.py: `processes: auto`, the parts a machine's GPU and host give the preset's model.
- failures.py: vLLM's failures in one line each, and the watch on its engine-core process.
- patches/: batchocr's rewrites of vLLM internals, installed in vLLM's worker process.

Importing it imports no vLLM: vLLM loads when an engine is built.
"""

from __future__ import annotations

from typing import Any, Mapping

from batchocr.engines import EngineType, parse_options
from batchocr.engines.vllm.document import split_pages
from batchocr.engines.vllm.instances import VLLMInstances
from batchocr.engines.vllm.options import CHECK_EVERY, VLLMOptions, prompt_setting, render_hints
from batchocr.engines.vllm.presets import get_preset
from batchocr.engines.vllm.processes import auto as auto_processes
from batchocr.engines.vllm.processes import card
from batchocr.engines.vllm.scheduler import VLLMEngine
from batchocr.errors import ConfigError

__all__ = ["CHECK_EVERY", "ENGINE", "VLLMEngine", "VLLMInstances", "VLLMOptions", "create", "preload", "settings",
           "shared", "split_pages", "starts_alone"]


def settings(options: Mapping[str, Any]) -> dict[str, Any]:
    """What OUT remembers of this engine (model, preset, prompt, page size), from its
    options alone: vLLM is not imported, no model loaded (engines.settings)."""
    o = _chosen(options)
    preset = get_preset(o.preset)
    return {"model": o.model, "preset": preset.name, "prompt": prompt_setting(o, preset),
            "render_hints": render_hints(preset)}


def shared(options: Mapping[str, Any], n: int) -> dict[str, Any]:
    """One of n processes on the GPU (a shard's parts): gpu_memory_utilization / n of it, less
    what each engine but one takes beyond vLLM's profile where the preset says (its
    `beyond_profile_gib`, on the card nvidia-smi names): the n together peak where one engine
    alone would. kv_cache_gib / n where it is set; else, where the preset knows what an engine
    holds besides its KV (`non_kv_gib`, in page mode at the default batch sizes), the KV that
    share leaves: the parts then build at once, each with the same KV. Asked before the parts start: this vLLM
    and the patches are checked here, once for all of them (their own checks then say nothing
    again)."""
    o = parse_options(VLLMOptions, options, "vllm")
    o.check_patches()
    preset = get_preset(o.preset)
    share = o.gpu_memory_utilization / n
    extra = preset.beyond_profile_gib
    gpu = card() if n > 1 and o.kv_cache_gib is None and (extra or preset.non_kv_gib) else None
    if gpu is not None and extra:
        share = (o.gpu_memory_utilization * gpu.gib - (n - 1) * extra) / n / gpu.gib
        if share * gpu.gib <= extra:
            raise ConfigError(f"processes: {n} {o.preset} engines do not fit {gpu.name} at gpu_memory_utilization "
                              f"{o.gpu_memory_utilization:g} (each takes {extra:g} GiB beyond its share); "
                              f"'auto' says how many do")
    out = {**options, "gpu_memory_utilization": round(share, 4)}
    if o.kv_cache_gib is not None:
        out["kv_cache_gib"] = o.kv_cache_gib / n
    elif gpu is not None and preset.non_kv_gib and _default_batches(o):
        kv = share * gpu.gib - preset.non_kv_gib
        if kv <= 0:
            raise ConfigError(f"processes: {n} {o.preset} engines do not fit {gpu.name} at gpu_memory_utilization "
                              f"{o.gpu_memory_utilization:g} (each holds {preset.non_kv_gib:g} GiB besides its KV); "
                              f"'auto' says how many do")
        out["kv_cache_gib"] = round(kv, 2)
    return out


def _default_batches(o: VLLMOptions) -> bool:
    """Whether the engine's batches are those a preset's non_kv_gib was measured at: page mode (a
    document's request holds several images, and vLLM's profile encodes as many as fit its
    budget), the default batch sizes or less (a larger max_num_batched_tokens makes a larger peak
    activation)."""
    defaults = VLLMOptions()
    keys = ("max_num_batched_tokens", "max_num_seqs", "kv_cache_memory_bytes", "gpu_memory_utilization",
            "limit_mm_per_prompt")
    return (o.mode == "page" and o.max_num_batched_tokens <= defaults.max_num_batched_tokens
            and o.max_num_seqs <= defaults.max_num_seqs and not set(keys) & set(o.engine_args))


def starts_alone(options: Mapping[str, Any]) -> bool:
    """Whether this engine must start while no other starts on its GPU: vLLM sizes the KV
    cache from the free memory it measures while it loads, and would count another engine's
    load as its own use, unless kv_cache_gib gives the KV's size. (engine_args go to vLLM as
    they are: a kv_cache_memory_bytes there is each part's, not shared, so the parts still
    take turns.)"""
    return parse_options(VLLMOptions, options, "vllm").kv_cache_gib is None


def preload() -> None:
    """vLLM's imports (torch's among them), made by a part while the part before it builds: its
    own build starts without them, and its engine core, forked, inherits them."""
    from vllm import LLM  # noqa: F401


def _chosen(options: Mapping[str, Any]) -> VLLMOptions:
    """The options of a run whose engine this is."""
    o = parse_options(VLLMOptions, options, "vllm")
    o.check_chosen()
    return o


def create(options: Mapping[str, Any]) -> VLLMEngine | VLLMInstances:
    """One engine, or with engines.vllm.instances N, N of them sharing the GPU."""
    o = _chosen(options)
    return VLLMInstances(o) if o.instances > 1 else VLLMEngine(o)


ENGINE = EngineType(name="vllm", options=VLLMOptions, create=create, settings=settings, shared=shared,
                    starts_alone=starts_alone, auto_processes=auto_processes, slow_to_build=True,
                    preload=preload)

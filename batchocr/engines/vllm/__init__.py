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
- processes.py: `processes: auto`, the parts a machine's GPU and host give the preset's model,
  and what each part takes of the card.
- failures.py: vLLM's failures in one line each, and the watch on its engine-core process;
  reaper.py: the engine-core processes killed once the process that built them has ended.
- patches/: batchocr's rewrites of vLLM internals, installed in vLLM's worker process.

Importing it imports no vLLM: vLLM loads when an engine is built.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Any, Mapping

from batchocr.engines import EngineType, parse_options
from batchocr.engines.vllm.document import split_pages
from batchocr.engines.vllm.instances import VLLMInstances
from batchocr.engines.vllm.options import CHECK_EVERY, VLLMOptions, prompt_setting, render_hints
from batchocr.engines.vllm.presets import get_preset
from batchocr.engines.vllm.processes import auto as auto_processes
from batchocr.engines.vllm.processes import share
from batchocr.engines.vllm.scheduler import VLLMEngine

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
    """One of n processes on the GPU (a shard's parts): its share of the card and, where known,
    of the KV (processes.share). Asked before the parts start: this vLLM and the patches are
    checked here, once for all of them (their own checks then say nothing again)."""
    o = parse_options(VLLMOptions, options, "vllm")
    o.check_patches()
    return {**options, **share(o, n)}


def starts_alone(options: Mapping[str, Any]) -> bool:
    """Whether this engine must start while no other starts on its GPU: vLLM sizes the KV
    cache from the free memory it measures while it loads, and would count another engine's
    load as its own use, unless kv_cache_gib gives the KV's size. (engine_args go to vLLM as
    they are: a kv_cache_memory_bytes there is each part's, not shared, so the parts still
    take turns.)"""
    return parse_options(VLLMOptions, options, "vllm").kv_cache_gib is None


def before_build(options: Mapping[str, Any]) -> None:
    """engines.vllm.compile_cache, where set, copied to the path it was compiled in and this
    process's caches pointed there (compilecache.seed; its parts' processes inherit where they are)."""
    if options.get("compile_cache"):
        from batchocr.engines.vllm.compilecache import seed

        seed(options["compile_cache"])


def beside(options: Mapping[str, Any], n: int) -> AbstractContextManager:
    """n parts' engines on one GPU: an MPS daemon of the run's own while they run, where
    engines.vllm.mps wants one (batchocr.engines.vllm.mps)."""
    from batchocr.engines.vllm import mps

    setting = parse_options(VLLMOptions, options, "vllm").mps
    return mps.daemon() if mps.wanted(setting, n) else nullcontext()


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
                    preload=preload, before_build=before_build, beside=beside)

"""`processes: auto` for vLLM: how many processes (a shard's parts, batchocr/parts.py) this machine's
GPU and host give the preset's model.

More than one pays only where one engine cannot keep the GPU busy: its engine core (vLLM's
scheduler and a step's outputs, one Python process) is the limit, so a second engine's host
work runs while the first's forward pass keeps the GPU busy. The preset says whether its model
is such a one, and how much GPU memory a process of it needs (`Preset.process_gib`: weights,
activations and graphs, and the KV of max_num_seqs pages, measured); a model whose engine fills
the GPU alone gets one. Then as many as the card holds at gpu_memory_utilization, at most
MOST, and no more than the host's CPUs and memory carry (CPUS_A_PROCESS, HOST_GIB_A_PROCESS:
what a process used at its peak). Measured figures: docs/PERFORMANCE.md, several engines on one GPU.

`share`: what each of those processes takes of the card (gpu_memory_utilization, and the KV
cache where the preset knows the rest of an engine's memory).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from typing import Any, Mapping

from batchocr.cpus import available_cpus, available_memory_gib
from batchocr.engines import parse_options
from batchocr.engines.vllm.options import VLLMOptions
from batchocr.engines.vllm.presets import get_preset
from batchocr.errors import ConfigError

MOST = 3  # the most measured to pay: 3 made more than 2, which made more than 1 (docs/PERFORMANCE.md)
CPUS_A_PROCESS = 4  # a part's engine core (~2.5 cores while full), its main thread and render share
HOST_GIB_A_PROCESS = 20  # a part's host memory at its peak (19 GB, 4,096 pages of Unlimited-OCR)


@dataclass(frozen=True)
class Card:
    name: str
    gib: float  # its memory


def card(environ: Mapping[str, str] = os.environ) -> Card | None:
    """The first GPU this process may use (CUDA_VISIBLE_DEVICES' first), as nvidia-smi names it;
    None where there is none, or no nvidia-smi to ask (asking CUDA would import torch, a start's
    seconds, in a process that builds no engine)."""
    smi = shutil.which("nvidia-smi", path=environ.get("PATH"))
    if smi is None:
        return None
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    first = visible.split(",")[0].strip() if visible else ""
    if visible is not None and not first:
        return None  # CUDA_VISIBLE_DEVICES="": no GPU for this process
    cmd = [smi, "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"] + (["--id=" + first] if first else [])
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=True).stdout
        name, mib = out.strip().splitlines()[0].rsplit(",", 1)
        return Card(name.strip(), int(mib) / 1024)
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def auto(options: Mapping[str, Any], environ: Mapping[str, str] = os.environ) -> tuple[int, str]:
    """How many processes, and why in a few words."""
    o = parse_options(VLLMOptions, options, "vllm")
    preset = get_preset(o.preset)
    if o.instances > 1:
        return 1, f"engines.vllm.instances {o.instances} shares the GPU in one process"
    if o.tensor_parallel_size > 1:
        return 1, f"engines.vllm.tensor_parallel_size {o.tensor_parallel_size} spreads one engine over several GPUs"
    if preset.process_gib is None:
        return 1, f"one {preset.name} engine keeps a GPU busy"
    gpu = card(environ)
    if gpu is None:
        return 1, "no GPU found (nvidia-smi)"
    by_gpu = int(gpu.gib * o.gpu_memory_utilization // preset.process_gib)
    cpus, memory = available_cpus(), available_memory_gib()
    by_cpus = cpus // CPUS_A_PROCESS
    by_memory = int(memory // HOST_GIB_A_PROCESS) if memory is not None else MOST
    n = max(1, min(MOST, by_gpu, by_cpus, by_memory))
    why = (f"{preset.name}'s engine core is its limit: {gpu.name} ({gpu.gib:.0f} GiB x {o.gpu_memory_utilization:g}) "
           f"holds {by_gpu} of {preset.process_gib:g} GiB; {cpus} CPUs carry {by_cpus}")
    if memory is not None:
        why += f", {memory:.0f} GiB of memory {by_memory}"
    return n, why + f"; at most {MOST}"


def share(o: VLLMOptions, n: int) -> dict[str, Any]:
    """One of n processes' gpu_memory_utilization and kv_cache_gib. gpu_memory_utilization / n,
    less what each engine but one takes beyond vLLM's profile where the preset says (its
    `beyond_profile_gib`, on the card nvidia-smi names): the n together peak where one engine
    alone would. kv_cache_gib / n where it is set; else, where the preset knows what an engine
    holds besides its KV (`non_kv_gib`, in page mode at the default batch sizes), the KV that
    share leaves: the parts then build at once, each with the same KV."""
    preset = get_preset(o.preset)
    fraction = o.gpu_memory_utilization / n
    extra = preset.beyond_profile_gib
    gpu = card() if n > 1 and o.kv_cache_gib is None and (extra or preset.non_kv_gib) else None

    def unfit(why: str) -> ConfigError:
        return ConfigError(f"processes: {n} {o.preset} engines do not fit {gpu.name} at gpu_memory_utilization "
                           f"{o.gpu_memory_utilization:g} ({why}); 'auto' says how many do")

    if gpu is not None and extra:
        fraction = (o.gpu_memory_utilization * gpu.gib - (n - 1) * extra) / n / gpu.gib
        if fraction * gpu.gib <= extra:
            raise unfit(f"each takes {extra:g} GiB beyond its share")
    out: dict[str, Any] = {"gpu_memory_utilization": round(fraction, 4)}
    if o.kv_cache_gib is not None:
        out["kv_cache_gib"] = o.kv_cache_gib / n
    elif gpu is not None and preset.non_kv_gib and _default_batches(o):
        kv = fraction * gpu.gib - preset.non_kv_gib
        if kv <= 0:
            raise unfit(f"each holds {preset.non_kv_gib:g} GiB besides its KV")
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

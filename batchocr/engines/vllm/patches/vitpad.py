"""vLLM 0.26.0: Qwen2.5-VL's vision MLP with its inner size padded to a multiple of 64, in vLLM's engine core.

The vision tower's 32 blocks each run an MLP of inner size 3,420 (`Qwen2_5_VisionMLP`,
model_executor/models/qwen2_5_vl.py:307-342: gate and up projections merged, SiLU-and-multiply,
down projection). 3,420 bf16 values are 6,840 bytes, not a multiple of 16, so the down
projection's operands are not 16-byte aligned and cuBLAS runs it with an Ampere kernel
(`cutlass_80_tensorop_bf16_s16816gemm_..._align2`) on a Hopper GPU, 32 calls a page.

Padding the inner size with zeros changes no product: the extra gate and up rows are zero (and
so is their bias), SiLU(0) x 0 = 0, and the down projection's extra columns are zero. Only the
order in which bf16 sums are accumulated may differ with the kernel, as between any two GEMM
kernels. The weights are padded once, in place, right after vLLM has loaded them (its
`BaseModelLoader.load_model`, whichever weights: a checkpoint's or `load_format="dummy"`'s),
so before the memory profile's run and before `compile_mm_encoder` traces the vision blocks:
a compiled block sees the padded sizes. 32 x 3 x 36 x 1,280 values more.

    engines: {vllm: {vit_pad: true}}     # a job spec (qwen2.5-vl, olmocr-2), or by hand:
    LLM(..., worker_extension_cls=EXTENSION,
        additional_config={"batchocr_worker_extension": workerext.fingerprint(EXTENSION)})

`bench/gpu/check_vit_pad.py` runs the real vision tower with random weights both ways: the same
output (bf16's rounding), faster, the Ampere GEMM gone. Not a default: over vLLM's compiled vision
blocks (`compile_mm_encoder`, the qwen2.5-vl preset's default) it gains under 1% in the steady
state (measured figures: docs/PERFORMANCE.md). The padded sizes must not meet a graph compiled
unpadded: vLLM's compile cache does not hash `worker_extension_cls`, so batchocr's engine
arguments add the extension's fingerprint to `additional_config` (workerext.keyed); `LLM(...)`
built by hand needs the same, or `VLLM_DISABLE_COMPILE_CACHE=1`. Importing this module patches
nothing and needs no torch.
"""

from __future__ import annotations

import logging

from batchocr.engines.vllm.patches import moved as _moved
from batchocr.engines.vllm.patches import workerext

EXTENSION = f"{__name__}.VisionMlpPadExtension"
PRESETS = ("qwen2.5-vl", "olmocr-2")  # Qwen2.5-VL's vision tower (Qwen2_5_VisionMLP)
MULTIPLE = 64
# The weights' dtypes padded (torch's or numpy's names): FP8 and integer weights are a quantized
# layer's, with scales and layouts of their own.
PLAIN = ("bfloat16", "float16", "float32", "float64")
# The vision MLP padded, and the loader's method that calls the hook wrapped (vLLM 0.26.0's).
TARGETS = {
    "model_executor/models/qwen2_5_vl.py:Qwen2_5_VisionMLP": "58d23ac2ee809d27",
    "model_executor/model_loader/base_loader.py:BaseModelLoader.load_model": "b9db7fb642baace4",
}


def moved() -> str | None:
    """Why this vLLM's vision MLP or loader is not what the padding rewrites (None: it is, or no vLLM here)."""
    return _moved("vitpad", TARGETS)


def padded(size: int, multiple: int = MULTIPLE) -> int:
    """size rounded up to a multiple."""
    return -(-size // multiple) * multiple


def _zeros(like, shape):
    """Zeros of like's dtype (and device), torch tensor or numpy array."""
    if hasattr(like, "new_zeros"):
        return like.new_zeros(shape)
    import numpy as np

    return np.zeros(shape, dtype=like.dtype)


def pad_mlp(mlp, multiple: int = MULTIPLE) -> bool:
    """Pad one MLP's inner size (gate_up_proj: [2h, in] and its bias [2h]; down_proj: [out, h])
    to a multiple, with zeros, in place; the layers' sizes follow. False where there is nothing
    to do: already a multiple, or weights that are not plain floats (a quantized layer keeps its
    own layout)."""
    gate_up, down = mlp.gate_up_proj, mlp.down_proj
    weight = gate_up.weight.data
    if str(weight.dtype).rsplit(".", 1)[-1] not in PLAIN or weight.shape[0] % 2:
        return False
    h = weight.shape[0] // 2
    hp = padded(h, multiple)
    if hp == h or down.weight.data.shape[-1] != h:
        return False
    new = _zeros(weight, (2 * hp, weight.shape[1]))
    new[:h], new[hp:hp + h] = weight[:h], weight[h:]
    gate_up.weight.data = new
    if getattr(gate_up, "bias", None) is not None:
        bias = gate_up.bias.data
        new_bias = _zeros(bias, (2 * hp,))
        new_bias[:h], new_bias[hp:hp + h] = bias[:h], bias[h:]
        gate_up.bias.data = new_bias
    w = down.weight.data
    new_down = _zeros(w, (w.shape[0], hp))
    new_down[:, :h] = w
    down.weight.data = new_down
    # vLLM's layers keep their sizes beside the weights
    for layer, names, value in ((gate_up, ("output_size_per_partition", "output_size"), 2 * hp),
                                (down, ("input_size_per_partition", "input_size"), hp)):
        for name in names:
            if hasattr(layer, name):
                setattr(layer, name, value)
    if hasattr(gate_up, "output_sizes"):
        gate_up.output_sizes = [hp, hp]
    return True


def pad_model(model, multiple: int = MULTIPLE) -> int:
    """Every Qwen2.5-VL vision MLP of a loaded model padded; how many were."""
    try:
        from vllm.model_executor.models.qwen2_5_vl import Qwen2_5_VisionMLP
    except ImportError:  # a vLLM without the model: nothing of it to pad
        return 0
    return sum(pad_mlp(module, multiple) for _, module in model.named_modules()
               if isinstance(module, Qwen2_5_VisionMLP))


def install() -> None:
    """After vLLM's loader has loaded and processed a model's weights, pad its vision MLPs
    (idempotent)."""
    from vllm.model_executor.model_loader import base_loader

    original = base_loader.process_weights_after_loading  # looked up there by load_model at each load
    if getattr(original, "_batchocr_vitpad", False):
        return

    def process_weights_after_loading(model, model_config, target_device):
        original(model, model_config, target_device)
        n = pad_model(model)
        if n:  # under vLLM's logger, so that the engine core's log says it
            logging.getLogger("vllm.batchocr.vitpad").info(
                "batchocr.engines.vllm.patches.vitpad: %d vision MLPs padded to an inner size multiple of %d", n, MULTIPLE)

    process_weights_after_loading._batchocr_vitpad = True
    base_loader.process_weights_after_loading = process_weights_after_loading
    if not _loader_calls_it(base_loader):  # a vLLM whose loader moved on: the same output, unpadded
        logging.getLogger("vllm.batchocr.vitpad").warning(
            "batchocr.engines.vllm.patches.vitpad: this vLLM's BaseModelLoader.load_model does not call "
            "process_weights_after_loading; the vision MLPs stay unpadded")


def _loader_calls_it(base_loader) -> bool:
    """vLLM's load_model calls process_weights_after_loading by its module's name (0.26's does)."""
    import inspect

    try:
        return "process_weights_after_loading(" in inspect.getsource(base_loader.BaseModelLoader.load_model)
    except (AttributeError, OSError, TypeError):
        return False


# The extension installs when vLLM asks for it, and only then (workerext.py).
__getattr__ = workerext.resolver(__name__, {EXTENSION.rsplit(".", 1)[1]: ("vitpad",)})

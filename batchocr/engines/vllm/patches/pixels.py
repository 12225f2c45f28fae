"""vLLM 0.26.0: DeepSeek-OCR's and Unlimited-OCR's image views handed to the engine as bytes
(uint8), made the model's input on the GPU.

vLLM's processor (transformers_utils/processors/deepseek_ocr.py, `ImageTransform`) turns each
view into float32 (torchvision's ToTensor and Normalize) and vLLM casts it to the model's dtype
on the host (`multimodal/processing/context.py`): 2 bytes a channel, ~21 MB a page of a base
view and six crops, which the client hands to the engine core, which stacks a step's views
into one batch (`_reduce_data`) and copies to the GPU. Here the processor hands each view as
the bytes its image holds (1 byte a channel: half of that) and the model's
`embed_multimodal` maps each byte on the GPU through a table of the 256 values the processor
makes of a byte (ToTensor and Normalize in float32 on this host, then the model's dtype): the
tensor vLLM's own path gives, value for value. Only for the processor's default transform
(normalized with mean and std 0.5 in each channel, the one these models use); any other keeps
vLLM's floats, which the model takes as they are.

engines.vllm.pixel_bytes (on in the unlimited-ocr preset) sets BATCHOCR_PIXELS_U8 in the
environment before vLLM builds (options.set_runner_env): with it 1, the engine installs the
processor's half in its process and the batched encoder the model's half in vLLM's engine core,
which inherits the environment (patches.deepencoder). `bench/gpu/check_pixels.py` compares the
two paths on vLLM's real processor. Importing this module needs no torch.
"""

from __future__ import annotations

import os

from batchocr.engines.vllm.patches import moved as _moved

# The vLLM code the methods wrap (as vLLM 0.26.0 writes it).
TARGETS = {
    "transformers_utils/processors/deepseek_ocr.py:ImageTransform": "aec20ef1dcf7de7e",
    "transformers_utils/processors/deepseek_ocr.py:DeepseekOCRProcessor.tokenize_with_images": "57adc338e0d91230",
    "model_executor/models/deepseek_ocr.py:DeepseekOCRForCausalLM.embed_multimodal": "955d325fd7f31ab4",
    "model_executor/models/deepseek_ocr.py:DeepseekOCRForCausalLM._parse_and_validate_image_input": "67cc7f7d38d72fbb",
}
ENV = "BATCHOCR_PIXELS_U8"
KEYS = ("pixel_values", "images_crop")  # the views embed_multimodal gets
CHUNK = 8  # views mapped at once: a 1024 view's int32 index is 12.6 MB

_originals: dict = {}  # what install_* put aside: (class name, name) -> (class, vLLM's method)
_tables: dict = {}  # (device, dtype): the 256 values a channel's byte becomes


def moved() -> str | None:
    """Why this vLLM's processor or model is not the one the methods wrap (None: it is, or no vLLM here)."""
    return _moved("pixels", TARGETS)


def switched_on() -> bool:
    """Whether this process's environment asks for the bytes (ENV=1; engines.vllm.pixel_bytes sets it)."""
    return os.environ.get(ENV) == "1"


def _default(transform) -> bool:
    """Whether an ImageTransform is the one the table is made for."""
    return (transform.normalize and tuple(transform.mean) == (0.5, 0.5, 0.5)
            and tuple(transform.std) == (0.5, 0.5, 0.5))


def view_bytes(transform, image):
    """ImageTransform.__call__ as bytes: the view's (3, height, width) uint8 channels, for the
    default transform; vLLM's floats for any other."""
    import numpy as np
    import torch

    if not _default(transform):
        return _vllms("ImageTransform", "__call__")(transform, image)
    rgb = np.asarray(image.convert("RGB") if image.mode != "RGB" else image, dtype=np.uint8)
    return torch.from_numpy(rgb.copy()).permute(2, 0, 1).contiguous()


def tokenize_with_images(self, *args, **kwargs):
    """vLLM's, with a request's empty views (a page without crops: torch.zeros in float32) as
    uint8 too, so that a step's views concatenate as bytes."""
    import torch

    out = list(_vllms("DeepseekOCRProcessor", "tokenize_with_images")(self, *args, **kwargs))
    if _default(self.image_transform):
        for i in (1, 2):  # pixel_values, images_crop
            if out[i].numel() == 0:
                out[i] = out[i].to(torch.uint8)
    return tuple(out)


def table(device, dtype):
    """The 256 values vLLM's processor makes of a byte in one channel, in the model's dtype, on
    `device`: its own ImageTransform over a gradient of every byte, cast as vLLM casts it."""
    from PIL import Image
    from vllm.transformers_utils.processors.deepseek_ocr import ImageTransform

    key = (str(device), dtype)
    if key not in _tables:  # the default transform treats each channel alike: the first's values
        gradient = Image.frombytes("RGB", (256, 1), bytes(v for v in range(256) for _ in range(3)))
        made = _vllms("ImageTransform", "__call__", ImageTransform.__call__)(ImageTransform(), gradient)
        _tables[key] = made.to(dtype)[0, 0].to(device)
    return _tables[key]


def model_input(views, dtype):
    """Views of uint8 as the model's input in `dtype`, on their device, CHUNK views at a time."""
    import torch

    values = table(views.device, dtype)
    out = torch.empty(views.shape, dtype=dtype, device=views.device)
    for at in range(0, views.shape[0], CHUNK):
        out[at:at + CHUNK] = values[views[at:at + CHUNK].int()]
    return out


def embed_multimodal(self, **kwargs):
    """vLLM's, its uint8 views made the model's input first (so its check for an absent image,
    a sum of 0, sees what it sees without this patch)."""
    import torch

    for key in KEYS:
        views = kwargs.get(key)
        if isinstance(views, torch.Tensor) and views.dtype == torch.uint8:
            kwargs[key] = model_input(views, self.vision_model.dtype)  # the model's dtype, as vLLM casts to
    return _vllms("DeepseekOCRForCausalLM", "embed_multimodal")(self, **kwargs)


def _check() -> None:
    why = moved()
    if why is not None:
        raise RuntimeError(f"{ENV}: {why}")


def _vllms(owner: str, name: str, default=None):
    """vLLM's method that install_* put aside (`default` where none is)."""
    held = _originals.get((owner, name))
    return held[1] if held else default


def _put(owner, name: str, method) -> None:
    if getattr(owner, name) is not method:
        _originals.setdefault((owner.__name__, name), (owner, getattr(owner, name)))
        setattr(owner, name, method)


def install_processor() -> None:
    """The processor's half, in the process that prepares requests (idempotent)."""
    from vllm.transformers_utils.processors import deepseek_ocr

    _check()
    _put(deepseek_ocr.ImageTransform, "__call__", view_bytes)
    _put(deepseek_ocr.DeepseekOCRProcessor, "tokenize_with_images", tokenize_with_images)


def install_model() -> None:
    """The model's half, in vLLM's worker process (idempotent)."""
    from vllm.model_executor.models import deepseek_ocr

    _check()
    _put(deepseek_ocr.DeepseekOCRForCausalLM, "embed_multimodal", embed_multimodal)


def uninstall() -> None:
    """vLLM's methods back (an engine with pixel_bytes off after one with it on in this process; a bench)."""
    for (_, name), (owner, method) in _originals.items():
        setattr(owner, name, method)
    _originals.clear()

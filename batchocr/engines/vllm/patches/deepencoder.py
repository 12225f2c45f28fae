"""vLLM 0.26.0: DeepSeek-OCR's vision encoder (Unlimited-OCR's too) over a step's images at once.

vLLM encodes the images of a step one at a time (`DeepseekOCRForCausalLM.
_pixel_values_to_embedding`, model_executor/models/deepseek_ocr.py:541-571): SAM, CLIP and the
projector over a page's global view, then again over its crops, with host reads of GPU values
in between (`torch.sum(patches).item()`, the tile counts' `.item()`), each of which waits for
the GPU: a page's prefill holds the engine core for tens of milliseconds while the GPU is mostly
idle. Here the global views of all the step's images go through the encoders together (in
chunks, to bound the attention's memory), then all their crops, after one host read of the tile
counts; each image's embedding is then assembled as vLLM assembles it (its own
`_assemble_patch_grid`, given the tile counts on the host). vLLM's batched forwards for its
encoder CUDA graphs (`_batched_encoder_forward_global_path` / `_local_path`, V1 runner only) are
not reused: the global one fixes the grid at the 1024 base view's 16 x 16 (`image_side`, from
BASE_SIZE), where this takes each view's size as it comes, as the per-image method does.

    LLM(..., worker_extension_cls="batchocr.engines.vllm.patches.deepencoder.BatchedEncoderExtension")

`engines.vllm.batch_encoder` names it (with the sampler's n-gram bans too, where asked:
`BatchedEncoderNGramSamplerExtension`): unlimited-ocr's default, faster end to end and in the
steady state at equal work (measured figures: docs/PERFORMANCE.md); deepseek-ocr's only where
asked (not measured). Importing this module patches nothing, and needs no torch;
`bench/gpu/check_encoder_batch.py` compares it with vLLM's own method on the real modules (equal
embeddings) and times both.
"""

from __future__ import annotations

from batchocr.engines.vllm.patches import moved as _moved
from batchocr.engines.vllm.patches import pixels, samattn, workerext

EXTENSION = f"{__name__}.BatchedEncoderExtension"
WITH_SAMPLER = f"{__name__}.BatchedEncoderNGramSamplerExtension"
# The presets whose models have this encoder.
PRESETS = ("unlimited-ocr", "deepseek-ocr")

# Views a SAM call takes: its global-attention blocks hold a bias of heads x tokens^2 a view
# (12 x 4096^2 in bf16, ~0.4 GB, for a 1024-pixel view; 12 x 1600^2, ~61 MB, for a 640 crop).
# No more than vLLM's start-up profile puts through the encoder at once, so that the memory it
# measures then (and sizes the KV cache after) holds a step's encoder: the profile encodes
# max_num_batched_tokens // 3,553 images of the most tokens (Unlimited-OCR's 4 x 8 crops): 4
# global views and 128 crops at the default 16,384, where a step of pages can bring 18 global
# views: a bigger global chunk takes GiBs the profile did not count, beyond gpu_memory_utilization
# (several engines on one GPU then run out of memory).
GLOBAL_CHUNK = 4
LOCAL_CHUNK = 48

# The vLLM code the batched method stands for (its steps, as vLLM 0.26.0 writes them).
TARGETS = {
    "model_executor/models/deepseek_ocr.py:DeepseekOCRForCausalLM._pixel_values_to_embedding": "2e5d195f9c7038fe",
    "model_executor/models/deepseek_ocr.py:DeepseekOCRForCausalLM._encode_global_features": "8ea44069de0aed98",
    "model_executor/models/deepseek_ocr.py:DeepseekOCRForCausalLM._encode_local_features": "a06d16ba2adbe83e",
    "model_executor/models/deepseek_ocr.py:DeepseekOCRForCausalLM._assemble_patch_grid": "710b73dcd646619a",
}


def moved() -> str | None:
    """Why this vLLM's encoder is not the one the batched method copies (None: it is, or no vLLM here)."""
    return _moved("deepencoder", TARGETS)


def chunks(n: int, size: int) -> list[tuple[int, int]]:
    """[start, end) ranges of at most `size` covering range(n)."""
    return [(a, min(a + size, n)) for a in range(0, n, size)]


def tile_counts(spatial: list[list[int]]) -> list[int]:
    """Crops each image has, from its (width tiles, height tiles): none where it was not tiled
    (1 x 1), as vLLM's is_tiled decides."""
    return [w * h if (w > 1 or h > 1) else 0 for w, h in spatial]


def _encode(model, views, chunk: int):
    """SAM, CLIP and the projector over same-size views, `chunk` at a time, as vLLM's
    `_encode_global_features` / `_encode_local_features` do for one image's."""
    import torch

    out = []
    for a, b in chunks(views.shape[0], chunk):
        x = views[a:b]
        sam = model.sam_model(x)
        clip = model.vision_model(x, sam)
        out.append(model.projector(torch.cat((clip[:, 1:], sam.flatten(2).permute(0, 2, 1)), dim=-1)))
    return out[0] if len(out) == 1 else torch.cat(out)


def pixel_values_to_embedding(self, pixel_values, images_crop, images_spatial_crop):
    """vLLM's `_pixel_values_to_embedding`, batched: the same list of per-image embeddings
    (crops' grid with newlines, then the global view's, then the view separator)."""
    import torch

    spatial_host = images_spatial_crop.cpu()  # the one wait for the GPU
    counts = tile_counts(spatial_host.tolist())
    total = sum(counts)
    global_features = _encode(self, pixel_values, GLOBAL_CHUNK)
    local_features = _encode(self, images_crop[:total], LOCAL_CHUNK) if total else None
    out, at = [], 0
    for j, n in enumerate(counts):
        g = global_features[j]
        side, dim = int(g.shape[0] ** 0.5), g.shape[-1]
        newline = self.image_newline[None, None, :].expand(side, 1, dim)
        parts = [torch.cat([g.view(side, side, dim), newline], dim=1).view(-1, dim), self.view_seperator[None, :]]
        if n:
            parts.insert(0, self._assemble_patch_grid(local_features[at:at + n], spatial_host[j]))
            at += n
        out.append(torch.cat(parts, dim=0))
    return out


def install() -> None:
    """Put the batched method in place of vLLM's (idempotent; Unlimited-OCR's class inherits it).
    With BATCHOCR_SAM_ATTN set in the engine's environment (engines.vllm.sam_fold: fold-pad, which
    the engine sets before vLLM builds), SAM's attention too, in that mode (patches.samattn);
    with BATCHOCR_PIXELS_U8=1 (engines.vllm.pixel_bytes,
    which the engine sets before vLLM builds), the model's half of patches.pixels (the engine
    installs the processor's)."""
    from vllm.model_executor.models import deepseek_ocr

    deepseek_ocr.DeepseekOCRForCausalLM._pixel_values_to_embedding = pixel_values_to_embedding
    mode = samattn.switched_to()
    if mode:
        samattn.install(mode)
    if pixels.switched_on():  # the model's half of patches.pixels
        pixels.install_model()


# The extensions install when vLLM asks for them, and only then (workerext.py).
__getattr__ = workerext.resolver(__name__, {EXTENSION.rsplit(".", 1)[1]: ("deepencoder",),
                                            WITH_SAMPLER.rsplit(".", 1)[1]: ("deepencoder", "ngram_sampler")})

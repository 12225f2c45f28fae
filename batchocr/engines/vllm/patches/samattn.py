"""vLLM 0.26.0: SAM's attention (the vision encoder of DeepSeek-OCR and Unlimited-OCR) with its
decomposed relative-position bias folded into the attention's dot products.

vLLM's `RelPosAttention.forward` (model_executor/models/deepencoder.py) makes the bias
`rel_h + rel_w` in full, heads x tokens^2 a view (12 x 4,096^2 in bf16, 0.4 GB, in a 1024
view's global blocks), and hands it to scaled_dot_product_attention, whose bias rules out the
flash kernels: PyTorch's memory-efficient kernel reads it back. The bias of query q at a key in
row r and column c of the token grid is `rel_h[q, r] + rel_w[q, c]`: the dot product of
`[rel_h[q], rel_w[q]]` with the key's row and column written one-hot. So each query gets its
`rel_h` and `rel_w` after its channels (scaled by 1/sqrt(d), the attention's own scale) and each
key its one-hot row and column after its own, and attention with scale 1 and no bias computes
vLLM's: `q'.k' = q.k / sqrt(d) + rel_h[q, r] + rel_w[q, c]`, accumulated in fp32 by the kernel
where vLLM rounds `rel_h + rel_w` to the model's dtype first. Queries and keys grow from d to
d + height + width channels (64 + 64 + 64 in a global block, padded to a multiple of 8); no
bias is made. Mode `fold` hands the values as they are; `fold-pad` pads them with zeros to the
keys' width (the flash kernels want one width; the extra output columns are zeros, dropped).

`engines.vllm.sam_fold` (on for unlimited-ocr) sets BATCHOCR_SAM_ATTN=fold-pad in the environment
of the process that builds vLLM, which its engine core inherits; the batched encoder's install
(patches.deepencoder) reads it there and installs this forward in that mode (empty: vLLM's).
`bench/gpu/check_encoder_batch.py --sam-attn fold,fold-pad` installs each mode over vLLM's real
modules and compares the embeddings and a page's encoder time with vLLM's. Importing this module
needs no torch.
"""

from __future__ import annotations

import os

from batchocr.engines.vllm.patches import moved as _moved

# The vLLM code the method replaces (as vLLM 0.26.0 writes it).
TARGETS = {
    "model_executor/models/deepencoder.py:RelPosAttention.forward": "93672960282c5298",
    "model_executor/models/deepencoder.py:add_decomposed_rel_pos": "2e1a8523cf06886a",
}
ENV = "BATCHOCR_SAM_ATTN"
MODES = ("fold", "fold-pad")
OPTION_MODE = "fold-pad"  # engines.vllm.sam_fold's: the faster of the two at equal work

_mode = "fold"  # install()'s
_original = None  # vLLM's RelPosAttention.forward, once installed over
_grids: dict = {}  # (tokens, height, width, device, dtype): the keys' one-hot rows and columns


def switched_to() -> str | None:
    """The mode this process's environment asks for (ENV), None where it asks for none."""
    return os.environ.get(ENV) or None


def moved() -> str | None:
    """Why this vLLM's SAM attention is not the one the method replaces (None: it is, or no vLLM here)."""
    return _moved("samattn", TARGETS)


def attention(q, k, v, rel_h, rel_w, pad_values: bool = False):
    """softmax(q k^T / sqrt(d) + rel_h[.., q, key // width] + rel_w[.., q, key % width]) v, for
    q, k, v of (batch, heads, tokens, d) over a height x width grid of tokens, rel_h of
    (batch, heads, tokens, height) and rel_w of (batch, heads, tokens, width): the bias folded
    into the dot products (the module's docstring)."""
    import torch
    import torch.nn.functional as F

    batch, heads, tokens, d = q.shape
    height, width = rel_h.shape[-1], rel_w.shape[-1]
    pad = -(d + height + width) % 8
    key = (tokens, height, width, q.device, q.dtype)
    grid = _grids.get(key)
    if grid is None:
        at = torch.arange(tokens, device=q.device)
        grid = torch.cat([F.one_hot(at // width, height), F.one_hot(at % width, width),
                          at.new_zeros(tokens, pad)], -1).to(q.dtype)
        _grids[key] = grid
    queries = torch.cat([q * d ** -0.5, rel_h, rel_w, q.new_zeros(batch, heads, tokens, pad)], -1)
    keys = torch.cat([k, grid.expand(batch, heads, tokens, grid.shape[-1])], -1)
    if pad_values:
        wide = F.pad(v, (0, queries.shape[-1] - d))
        return F.scaled_dot_product_attention(queries, keys, wide, scale=1.0)[..., :d]
    return F.scaled_dot_product_attention(queries, keys, v, scale=1.0)


def forward(self, x):
    """`RelPosAttention.forward` with the bias folded in (attention); without relative
    positions, vLLM's own computation."""
    from vllm.model_executor.models.deepencoder import add_decomposed_rel_pos

    if not self.use_rel_pos:
        return _original(self, x)
    B, H, W, _ = x.shape
    heads = self.num_heads
    qkv = self.qkv(x).reshape(B, H * W, 3, heads, -1).permute(2, 0, 3, 1, 4)
    q, k, v = qkv.reshape(3, B * heads, H * W, -1).unbind(0)
    rel_h, rel_w = add_decomposed_rel_pos(q, self.rel_pos_h, self.rel_pos_w, (H, W), (H, W))
    out = attention(q.view(B, heads, H * W, -1), k.view(B, heads, H * W, -1), v.view(B, heads, H * W, -1),
                    rel_h.view(B, heads, H * W, H), rel_w.view(B, heads, H * W, W), _mode == "fold-pad")
    out = out.view(B, heads, H, W, -1).permute(0, 2, 3, 1, 4).reshape(B, H, W, -1)
    return self.proj(out)


def install(mode: str = "fold") -> None:
    """Put the method in place of vLLM's (idempotent), values as MODE says; RuntimeError where
    this vLLM's is not the one it replaces (moved), ValueError for a mode not in MODES."""
    global _original, _mode
    from vllm.model_executor.models import deepencoder

    if mode not in MODES:
        raise ValueError(f"{ENV}={mode!r}: one of {', '.join(MODES)}")
    why = moved()
    if why is not None:
        raise RuntimeError(f"{ENV}: {why}")
    _mode = mode
    if deepencoder.RelPosAttention.forward is not forward:
        _original = deepencoder.RelPosAttention.forward
        deepencoder.RelPosAttention.forward = forward


def uninstall() -> None:
    """vLLM's method back (a bench that times both in one process)."""
    from vllm.model_executor.models import deepencoder

    if _original is not None:
        deepencoder.RelPosAttention.forward = _original

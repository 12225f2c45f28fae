"""vLLM 0.26.0: SAM's attention (the vision encoder of DeepSeek-OCR and Unlimited-OCR) with its
decomposed relative-position bias added inside the attention kernel.

vLLM's `RelPosAttention.forward` (model_executor/models/deepencoder.py) makes the bias
`rel_h + rel_w` in full, heads x tokens^2 a view (12 x 4,096^2 in bf16, 0.4 GB, in a 1024
view's global blocks), and hands it to scaled_dot_product_attention, whose bias rules out the
flash kernels: PyTorch's memory-efficient kernel reads it back. Here FlexAttention adds a
query's `rel_h` at the key's row and its `rel_w` at the key's column to each score as the
kernel computes it (a `score_mod`): the same sum, no bias in memory, the adds in fp32 where
vLLM's are in the model's dtype.

Not an engine option yet: `bench/gpu/check_encoder_batch.py --sam-flex` installs it over
vLLM's real modules and compares the embeddings and a page's encoder time with vLLM's; with
BATCHOCR_SAM_FLEX=1 in an engine's environment the batched encoder installs it too
(patches.deepencoder), for a throughput run's variant. Importing this module needs no torch.
"""

from __future__ import annotations

from batchocr.engines.vllm.patches import moved as _moved

# The vLLM code the method replaces (as vLLM 0.26.0 writes it).
TARGETS = {
    "model_executor/models/deepencoder.py:RelPosAttention.forward": "93672960282c5298",
    "model_executor/models/deepencoder.py:add_decomposed_rel_pos": "2e1a8523cf06886a",
}

_flex = None  # flex_attention, compiled where a GPU runs it (its first call for a shape compiles)
_original = None  # vLLM's RelPosAttention.forward, once installed over


def moved() -> str | None:
    """Why this vLLM's SAM attention is not the one the method replaces (None: it is, or no vLLM here)."""
    return _moved("samattn", TARGETS)


def attention(q, k, v, rel_h, rel_w):
    """softmax(q k^T / sqrt(d) + rel_h[.., q, key // width] + rel_w[.., q, key % width]) v, for
    q, k, v of (batch, heads, tokens, d) over a height x width grid of tokens, rel_h of
    (batch, heads, tokens, height) and rel_w of (batch, heads, tokens, width)."""
    global _flex
    from torch.nn.attention.flex_attention import flex_attention

    width = rel_w.shape[-1]

    def score_mod(score, b, h, q_idx, kv_idx):
        return score + rel_h[b, h, q_idx, kv_idx // width] + rel_w[b, h, q_idx, kv_idx % width]

    if q.device.type != "cuda":
        return flex_attention(q, k, v, score_mod=score_mod)  # eager: the reference computation
    if _flex is None:
        import torch

        _flex = torch.compile(flex_attention, dynamic=True)
    return _flex(q, k, v, score_mod=score_mod)


def forward(self, x):
    """`RelPosAttention.forward` with the bias in the kernel (attention); without relative
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
                    rel_h.view(B, heads, H * W, H), rel_w.view(B, heads, H * W, W))
    out = out.view(B, heads, H, W, -1).permute(0, 2, 3, 1, 4).reshape(B, H, W, -1)
    return self.proj(out)


def install() -> None:
    """Put the method in place of vLLM's (idempotent); RuntimeError where this vLLM's is not the
    one it replaces (moved)."""
    global _original
    from vllm.model_executor.models import deepencoder

    why = moved()
    if why is not None:
        raise RuntimeError(f"BATCHOCR_SAM_FLEX: {why}")

    if deepencoder.RelPosAttention.forward is not forward:
        _original = deepencoder.RelPosAttention.forward
        deepencoder.RelPosAttention.forward = forward


def uninstall() -> None:
    """vLLM's method back (a bench that times both in one process)."""
    from vllm.model_executor.models import deepencoder

    if _original is not None:
        deepencoder.RelPosAttention.forward = _original

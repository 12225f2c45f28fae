"""Model folders of real OCR VLM architectures, built locally (no hub reachable):
config + tokenizer + processor, no weights. vLLM's `load_format="dummy"` gives them
random weights at load: the cost of the real model, meaningless text.

    python bench/gpu/make_models.py DIR        # DIR/qwen2.5-vl-7b, DIR/qwen2-vl-2b

Layouts (from transformers' configs of the published models): Qwen2.5-VL-7B is
olmOCR-2's base; Qwen2-VL-2B a small VLM. The tokenizer is a word-level one
whose vocabulary fills every id of the model's vocabulary with a word, with the
Qwen special tokens at their real ids, so any generated id detokenizes.
"""

from __future__ import annotations

import sys
from pathlib import Path

SPECIALS = {  # Qwen2/2.5-VL's ids
    "<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645,
    "<|vision_start|>": 151652, "<|vision_end|>": 151653, "<|vision_pad|>": 151654,
    "<|image_pad|>": 151655, "<|video_pad|>": 151656,
}
VISION_IDS = dict(image_token_id=SPECIALS["<|image_pad|>"], video_token_id=SPECIALS["<|video_pad|>"],
                  vision_start_token_id=SPECIALS["<|vision_start|>"], vision_end_token_id=SPECIALS["<|vision_end|>"])
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for c in message['content'] %}"
    "{% if c['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif c['type'] == 'text' %}{{ c['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def tokenizer(vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    by_id = {i: tok for tok, i in SPECIALS.items()}
    vocab = {by_id.get(i, f"w{i}"): i for i in range(vocab_size)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    tok.add_special_tokens(list(SPECIALS))
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                 unk_token="w0")
    hf.chat_template = CHAT_TEMPLATE
    return hf


def processor(hf_tok, kind: str):
    from transformers import Qwen2VLImageProcessor

    # Pages arrive at most 1288 px on a side, multiples of 28: let them through whole.
    improc = Qwen2VLImageProcessor(min_pixels=56 * 56, max_pixels=1288 * 1288)
    video = None
    try:
        from transformers import Qwen2VLVideoProcessor

        video = Qwen2VLVideoProcessor()
    except Exception:  # noqa: BLE001 - needs torchvision; images only then
        pass
    if kind == "qwen2_5_vl":
        from transformers import Qwen2_5_VLProcessor as Processor
    else:
        from transformers import Qwen2VLProcessor as Processor
    return Processor(image_processor=improc, tokenizer=hf_tok, video_processor=video, chat_template=CHAT_TEMPLATE)


def _text(vocab_size: int, hidden: int, intermediate: int, heads: int, kv_heads: int, max_positions: int,
          tied: bool) -> dict:
    """A Qwen2 decoder of 28 layers, M-RoPE as in both VL models, Qwen's special ids."""
    return dict(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=28,
        num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=max_positions,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [16, 24, 24]},
        bos_token_id=SPECIALS["<|endoftext|>"], eos_token_id=SPECIALS["<|im_end|>"],
        tie_word_embeddings=tied, torch_dtype="bfloat16")


def qwen2_5_vl_7b(path: Path) -> Path:
    from transformers import Qwen2_5_VLConfig

    cfg = Qwen2_5_VLConfig(
        text_config=_text(152064, hidden=3584, intermediate=18944, heads=28, kv_heads=4, max_positions=128000,
                          tied=False),
        vision_config=dict(
            depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16, patch_size=14,
            spatial_merge_size=2, temporal_patch_size=2, window_size=112, fullatt_block_indexes=[7, 15, 23, 31],
            out_hidden_size=3584, hidden_act="silu", in_channels=3),
        tie_word_embeddings=False, torch_dtype="bfloat16", **VISION_IDS)
    # Without architectures vLLM takes the folder for a pooling (embedding) model.
    cfg.architectures = ["Qwen2_5_VLForConditionalGeneration"]
    return _save(path, cfg, 152064, "qwen2_5_vl")


def qwen2_vl_2b(path: Path) -> Path:
    from transformers import Qwen2VLConfig

    cfg = Qwen2VLConfig(
        text_config=_text(151936, hidden=1536, intermediate=8960, heads=12, kv_heads=2, max_positions=32768,
                          tied=True),
        vision_config=dict(depth=32, embed_dim=1280, hidden_size=1536, mlp_ratio=4, num_heads=16,
                           hidden_act="quick_gelu", patch_size=14, spatial_merge_size=2, temporal_patch_size=2,
                           in_channels=3),
        tie_word_embeddings=True, torch_dtype="bfloat16", **VISION_IDS)
    cfg.architectures = ["Qwen2VLForConditionalGeneration"]
    return _save(path, cfg, 151936, "qwen2_vl")


def _save(path: Path, cfg, vocab_size: int, kind: str) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    cfg.save_pretrained(path)
    hf_tok = tokenizer(vocab_size)
    hf_tok.save_pretrained(path)
    processor(hf_tok, kind).save_pretrained(path)
    return path


LAYOUTS = {"qwen2.5-vl-7b": qwen2_5_vl_7b, "qwen2-vl-2b": qwen2_vl_2b}

if __name__ == "__main__":
    root = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/models")
    for name, build in LAYOUTS.items():
        print("built", build(root / name))

"""Model folders of real OCR VLM architectures, built locally (no hub reachable):
config + tokenizer + processor, no weights. vLLM's `load_format="dummy"` gives them
random weights at load: the cost of the real model, meaningless text.

    python bench/gpu/make_models.py DIR                   # DIR/qwen2.5-vl-7b, DIR/qwen2-vl-2b, DIR/unlimited-ocr
    python bench/gpu/make_models.py DIR unlimited-ocr     # only the named layouts

Layouts (from transformers' configs of the published models): Qwen2.5-VL-7B is
olmOCR-2's base; Qwen2-VL-2B a small VLM. The tokenizer is a word-level one
whose vocabulary fills every id of the model's vocabulary with a word, with the
Qwen special tokens at their real ids, so any generated id detokenizes.

Unlimited-OCR (baidu/Unlimited-OCR, issue 20): the published config.json's values
(../shared/notes/unlimited-ocr.md) for vLLM's UnlimitedOCRConfig, UnlimitedOCRForCausalLM
and UnlimitedOCRProcessor (vLLM >= 0.26). Written as JSON, not through a config class:
vLLM's own class reads it at load. Its tokenizer follows DeepSeek-OCR's: bos 0
`<｜begin▁of▁sentence｜>`, eos 1 `<｜end▁of▁sentence｜>`, pad 2 `<｜▁pad▁｜>`, the image token
`<image>` and the grounding tokens as special tokens, a word in every other id of the
129,280; the ids of the tokens above 2 are this layout's (the real tokenizer.json is not
reachable here), `<page>` among them (the separator of multi-page outputs).
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


# Unlimited-OCR: DeepSeek-OCR's tokenizer layout (DeepSeek-V3's: 129,280 ids, bos 0, eos 1, pad 2).
UOCR_VOCAB = 129280
UOCR_BOS, UOCR_EOS, UOCR_PAD = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜▁pad▁｜>"
# DeepSeek-VL2/OCR add these as special tokens; ids from 128815 up are this layout's choice.
UOCR_ADDED = ["<image>", "<|ref|>", "<|/ref|>", "<|det|>", "<|/det|>", "<|grounding|>", "<|User|>",
              "<|Assistant|>", "<page>"]
UOCR_ADDED_FROM = 128815
# Words of the prompts at ids of their own, so that the prompts tokenize as words, not as unknowns.
UOCR_WORDS = ["document", "parsing", ".", "Multi", "page", "Free", "OCR"]

# The published config.json of baidu/Unlimited-OCR (values in ../shared/notes/unlimited-ocr.md).
# Not in the notes, set as DeepSeek-V2's: hidden_act silu, rms_norm_eps 1e-6, norm_topk_prob
# false, routed_scaling_factor 1.0, untied embeddings (none changes the cost of a step).
# rswa_window 128 (the config's window) at the top level, where vLLM reads it; not as
# language_config.sliding_window: vLLM would make every layer a plain 128-token sliding window
# (the prefix too), which R-SWA is not.
UNLIMITED_OCR_CONFIG = {
    "architectures": ["UnlimitedOCRForCausalLM"],
    "model_type": "unlimited-ocr",
    "candidate_resolutions": [[1024, 1024]],
    "global_view_pos": "head",
    "tile_tag": "2D",
    "rswa_window": 128,
    "torch_dtype": "bfloat16",
    "language_config": {
        "architectures": ["DeepseekOCRForCausalLM"],
        "model_type": "deepseek_v2",
        "vocab_size": UOCR_VOCAB, "hidden_size": 1280, "intermediate_size": 6848,
        "moe_intermediate_size": 896, "num_hidden_layers": 12, "num_attention_heads": 10,
        "num_key_value_heads": 10, "head_dim": 128, "v_head_dim": 128,
        "use_mla": False, "qk_nope_head_dim": 0, "qk_rope_head_dim": 0,
        "kv_lora_rank": None, "q_lora_rank": None,
        "first_k_dense_replace": 1, "n_routed_experts": 64, "n_shared_experts": 2,
        "num_experts_per_tok": 6, "topk_method": "greedy", "scoring_func": "softmax",
        "n_group": 1, "topk_group": 1, "norm_topk_prob": False, "routed_scaling_factor": 1.0,
        "hidden_act": "silu", "rms_norm_eps": 1e-06,
        "max_position_embeddings": 32768,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
        "bos_token_id": 0, "eos_token_id": 1, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    },
    "projector_config": {"input_dim": 2048, "n_embed": 1280, "projector_type": "linear",
                         "model_type": "mlp_projector"},
    "vision_config": {
        "image_size": 1024, "mlp_ratio": 3.7362, "model_name": "deeplip_b_l", "model_type": "vision",
        "width": {
            "clip-l-14-224": {"heads": 16, "image_size": 224, "layers": 24, "patch_size": 14, "width": 1024},
            "sam_vit_b": {"downsample_channels": [512, 1024], "global_attn_indexes": [2, 5, 8, 11],
                          "heads": 12, "layers": 12, "width": 768},
        },
    },
}

# DeepSeek-OCR's processor_config.json keys, as vLLM's DeepseekOCRProcessor takes them; vLLM
# passes the crop mode, sizes and max_crops (32) itself (UnlimitedOCRProcessingInfo).
UOCR_PROCESSOR = {"processor_class": "UnlimitedOCRProcessor", "image_token": "<image>", "pad_token": UOCR_PAD,
                  "patch_size": 16, "downsample_ratio": 4, "image_mean": [0.5, 0.5, 0.5],
                  "image_std": [0.5, 0.5, 0.5], "normalize": True, "add_special_token": False,
                  "sft_format": "deepseek", "mask_prompt": False, "ignore_id": -100}


def unlimited_ocr_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    fixed = {UOCR_BOS: 0, UOCR_EOS: 1, UOCR_PAD: 2}
    fixed |= {tok: UOCR_ADDED_FROM + i for i, tok in enumerate(UOCR_ADDED)}
    fixed |= {word: 3 + i for i, word in enumerate(UOCR_WORDS)}
    by_id = {i: tok for tok, i in fixed.items()}
    vocab = {by_id.get(i, f"w{i}"): i for i in range(UOCR_VOCAB)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="w100"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    tok.add_special_tokens([UOCR_BOS, UOCR_EOS, UOCR_PAD, *UOCR_ADDED])
    # A fast tokenizer of its own tokenizer.json: the processor asks for Llama's class, but any
    # fast tokenizer with bos/eos/pad and `<image>` in its vocab does (vLLM passes it in).
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=UOCR_BOS, eos_token=UOCR_EOS,
                                   pad_token=UOCR_PAD, unk_token="w100",
                                   additional_special_tokens=UOCR_ADDED[1:])


def unlimited_ocr(path: Path) -> Path:
    """The Unlimited-OCR layout: ~3B parameters (12-layer DeepSeek-V2 MoE, 64 routed experts,
    6 a token, plain MHA with R-SWA), SAM-ViT-B + CLIP-L encoder."""
    import json

    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(UNLIMITED_OCR_CONFIG, indent=2) + "\n")
    (path / "generation_config.json").write_text(json.dumps({"bos_token_id": 0, "eos_token_id": 1}) + "\n")
    unlimited_ocr_tokenizer().save_pretrained(path)
    (path / "processor_config.json").write_text(json.dumps(UOCR_PROCESSOR, indent=2) + "\n")
    return path


LAYOUTS = {"qwen2.5-vl-7b": qwen2_5_vl_7b, "qwen2-vl-2b": qwen2_vl_2b, "unlimited-ocr": unlimited_ocr}

if __name__ == "__main__":
    root = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/models")
    for name in sys.argv[2:] or list(LAYOUTS):
        print("built", LAYOUTS[name](root / name))

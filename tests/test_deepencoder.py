"""engines.vllm.batch_encoder: batchocr.engines.vllm.patches.deepencoder's plumbing, with vLLM replaced at its module
boundary (CI has no torch or vLLM). That the batched method gives vLLM's embeddings is shown on
vLLM's real modules by bench/gpu/check_encoder_batch.py (CPU with vLLM's source, and the H200)."""

from __future__ import annotations

import importlib

import pytest

import fake_vllm

from batchocr.engines.vllm.patches import deepencoder, ngram_sampler, workerext
from batchocr.engines.vllm.presets import get_preset
from batchocr.engines.vllm import VLLMOptions
from batchocr.errors import ConfigError
from batchocr.engines.vllm.patches.ngram import FQCN


def test_tiles_and_chunks():
    # (width tiles, height tiles): 1 x 1 is no crops at all, as vLLM's is_tiled decides
    assert deepencoder.tile_counts([[2, 3], [1, 1], [3, 2], [1, 2], [2, 1]]) == [6, 0, 6, 2, 2]
    assert deepencoder.chunks(17, 8) == [(0, 8), (8, 16), (16, 17)]
    assert deepencoder.chunks(8, 8) == [(0, 8)] and deepencoder.chunks(0, 8) == []


def test_batch_encoder_names_one_worker_extension_for_what_is_asked():
    p = get_preset("unlimited-ocr")
    # rswa_tiles off: with it, one extension of batchocr.engines.vllm.patches.rswa_tiles installs both (its own test)
    off = VLLMOptions(model="/m", preset="unlimited-ocr", batch_encoder=False, rswa_tiles=False).llm_args(p)
    assert "worker_extension_cls" not in off and off["logits_processors"] == [FQCN]
    on = VLLMOptions(model="/m", preset="unlimited-ocr", batch_encoder=True, rswa_tiles=False).llm_args(p)
    assert on["worker_extension_cls"] == deepencoder.EXTENSION and on["logits_processors"] == [FQCN]
    both = VLLMOptions(model="/m", preset="unlimited-ocr", batch_encoder=True, ngram_bans="sampler",
                       rswa_tiles=False).llm_args(p)
    assert both["worker_extension_cls"] == deepencoder.WITH_SAMPLER and "logits_processors" not in both
    sampler = VLLMOptions(model="/m", preset="unlimited-ocr", batch_encoder=False, ngram_bans="sampler",
                          rswa_tiles=False).llm_args(p)
    assert sampler["worker_extension_cls"] == ngram_sampler.EXTENSION
    # the extension and its mark for vLLM's compile cache (batchocr.engines.vllm.patches.workerext.keyed), nothing else
    assert on["additional_config"] == {workerext.KEY: workerext.fingerprint(deepencoder.EXTENSION)}
    assert {k: v for k, v in on.items() if k not in ("worker_extension_cls", "additional_config")} == off


def test_batch_encoder_unset_is_the_preset_s_on_only_where_measured():
    """Unset: on for unlimited-ocr (it won on the H200 at equal work, docs/history/GPU.md sixth lease),
    off for deepseek-ocr (not measured) and for every model without that encoder."""
    def extension(preset, **options):
        return VLLMOptions(model="/m", preset=preset, **options).llm_args(get_preset(preset)).get("worker_extension_cls")

    assert extension("unlimited-ocr", rswa_tiles=False) == deepencoder.EXTENSION
    assert extension("unlimited-ocr", mode="document", rswa_tiles=False) == deepencoder.EXTENSION
    assert extension("unlimited-ocr", ngram_bans="sampler", rswa_tiles=False) == deepencoder.WITH_SAMPLER
    assert extension("unlimited-ocr", batch_encoder=False, rswa_tiles=False) is None
    assert extension("deepseek-ocr") is None and extension("deepseek-ocr", batch_encoder=True) == deepencoder.EXTENSION
    assert extension("qwen2.5-vl") is None and extension("olmocr-2") is None


def test_batch_encoder_on_a_model_without_that_encoder_is_a_config_error_naming_the_key():
    with pytest.raises(ConfigError, match=r"^engines\.vllm\.batch_encoder: .*qwen2\.5-vl"):
        VLLMOptions(model="/m", preset="qwen2.5-vl", batch_encoder=True)
    VLLMOptions(model="/m", preset="deepseek-ocr", batch_encoder=True)  # the other model with it


def _fake_vllm_model(monkeypatch):
    """vllm.model_executor.models.deepseek_ocr with the class the patch replaces a method of."""
    def original(self, pixel_values, images_crop, images_spatial_crop):
        return "vllm's"

    cls = type("DeepseekOCRForCausalLM", (), {"_pixel_values_to_embedding": original})
    sub = type("UnlimitedOCRForCausalLM", (cls,), {})
    fake_vllm.model_module(monkeypatch, "deepseek_ocr", DeepseekOCRForCausalLM=cls)
    return cls, sub, original


def test_the_extension_installs_the_batched_method_when_vllm_resolves_its_name(monkeypatch):
    """Importing the module patches nothing; resolving the name as vLLM's resolve_obj_by_qualname
    does (split on the last dot) puts the batched method in vLLM's class, which Unlimited-OCR's
    inherits; asking twice is harmless."""
    cls, sub, original = _fake_vllm_model(monkeypatch)
    assert "BatchedEncoderExtension" not in vars(deepencoder)
    assert cls._pixel_values_to_embedding is original
    module, name = deepencoder.EXTENSION.rsplit(".", 1)
    ext = getattr(importlib.import_module(module), name)
    assert isinstance(ext, type) and not [a for a in vars(ext) if not a.startswith("__")]  # no Worker clashes
    assert cls._pixel_values_to_embedding is deepencoder.pixel_values_to_embedding
    assert sub._pixel_values_to_embedding is deepencoder.pixel_values_to_embedding
    getattr(importlib.import_module(module), name)
    assert cls._pixel_values_to_embedding is deepencoder.pixel_values_to_embedding
    with pytest.raises(AttributeError):
        deepencoder.NoSuchExtension  # noqa: B018


def test_sam_attention_installs_with_the_batched_encoder_only_where_its_switch_is_on(monkeypatch):
    """BATCHOCR_SAM_ATTN=fold (or fold-pad) in the engine's environment: the batched encoder's
    install puts SAM's attention with the bias folded into its dot products (patches.samattn) in
    place of vLLM's RelPosAttention forward too, in that mode; without it vLLM's stays; a mode it
    does not know fails the install, naming the switch. (Its arithmetic against vLLM's, on vLLM's
    real modules: bench/gpu/check_encoder_batch.py --sam-attn fold,fold-pad.)"""
    from batchocr.engines.vllm.patches import samattn

    def vllm_forward(self, x):
        return "vllm's"

    for switch, expected in ((None, vllm_forward), ("fold", samattn.forward), ("fold-pad", samattn.forward)):
        cls, _, _ = _fake_vllm_model(monkeypatch)
        attn = type("RelPosAttention", (), {"forward": vllm_forward})
        fake_vllm.model_module(monkeypatch, "deepencoder", RelPosAttention=attn)
        if switch is None:
            monkeypatch.delenv("BATCHOCR_SAM_ATTN", raising=False)
        else:
            monkeypatch.setenv("BATCHOCR_SAM_ATTN", switch)
        deepencoder.install()
        assert cls._pixel_values_to_embedding is deepencoder.pixel_values_to_embedding
        assert attn.forward is expected, switch
        assert samattn._mode == (switch or "fold")
        samattn.uninstall()
        assert attn.forward is vllm_forward
    monkeypatch.setenv("BATCHOCR_SAM_ATTN", "flex")
    with pytest.raises(ValueError, match="BATCHOCR_SAM_ATTN='flex': one of fold, fold-pad"):
        deepencoder.install()


def test_pixels_as_bytes_install_where_their_switch_is_on_and_come_out(monkeypatch):
    """BATCHOCR_PIXELS_U8=1: the batched encoder's install wraps the model's embed_multimodal
    (patches.pixels' half in vLLM's worker), the processor's install its ImageTransform and
    tokenize_with_images; without the switch vLLM's stay; uninstall puts each back. (That the
    bytes become vLLM's own input, value for value, on vLLM's real processor: bench/gpu/check_pixels.py.)"""
    from batchocr.engines.vllm.patches import pixels

    def embed(self, **kwargs):
        return "vllm's"

    def call(self, image):
        return "floats"

    def tokenize(self, *args, **kwargs):
        return "vllm's"

    for switch in (None, "1"):
        cls, _, _ = _fake_vllm_model(monkeypatch)
        cls.embed_multimodal = embed
        if switch is None:
            monkeypatch.delenv("BATCHOCR_PIXELS_U8", raising=False)
        else:
            monkeypatch.setenv("BATCHOCR_PIXELS_U8", switch)
        deepencoder.install()
        assert cls.embed_multimodal is (pixels.embed_multimodal if switch else embed), switch
    transform = type("ImageTransform", (), {"__call__": call})
    proc = type("DeepseekOCRProcessor", (), {"tokenize_with_images": tokenize})
    fake_vllm.vllm_module(monkeypatch, "transformers_utils.processors.deepseek_ocr", ImageTransform=transform,
                          DeepseekOCRProcessor=proc)
    pixels.install_processor()
    pixels.install_processor()  # idempotent: vLLM's methods are what uninstall puts back
    assert transform.__call__ is pixels.view_bytes and proc.tokenize_with_images is pixels.tokenize_with_images
    pixels.uninstall()
    assert (transform.__call__, proc.tokenize_with_images, cls.embed_multimodal) == (call, tokenize, embed)


def test_with_the_sampler_both_patches_install(monkeypatch):
    cls, _, _ = _fake_vllm_model(monkeypatch)
    installed = []
    monkeypatch.setattr(ngram_sampler, "install", lambda: installed.append("sampler"))
    module, name = deepencoder.WITH_SAMPLER.rsplit(".", 1)
    getattr(importlib.import_module(module), name)
    assert installed == ["sampler"] and cls._pixel_values_to_embedding is deepencoder.pixel_values_to_embedding

"""batchocr.engines.vllm.patches.vitpad: Qwen2.5-VL's vision MLP padded to an aligned inner size computes the same
thing. The padding runs on numpy arrays here (the same code pads torch tensors in vLLM's
worker); the kernels it is for are measured on the GPU (bench/gpu/check_vit_pad.py)."""

from types import SimpleNamespace

import numpy as np
import pytest

from batchocr.engines.vllm.patches import vitpad


def _param(array):
    return SimpleNamespace(data=array)


def _mlp(rng, inner=3420, hidden=1280 // 8, bias=True, dtype=np.float64):
    """A vision MLP's layers as vLLM keeps them: merged gate and up rows, then down."""
    return SimpleNamespace(
        gate_up_proj=SimpleNamespace(weight=_param(rng.normal(size=(2 * inner, hidden)).astype(dtype)),
                                     bias=_param(rng.normal(size=2 * inner).astype(dtype)) if bias else None,
                                     output_size_per_partition=2 * inner, output_sizes=[inner, inner]),
        down_proj=SimpleNamespace(weight=_param(rng.normal(size=(hidden, inner)).astype(dtype)),
                                  bias=_param(rng.normal(size=hidden).astype(dtype)),
                                  input_size_per_partition=inner, input_size=inner))


def _forward(mlp, x):
    """Qwen2_5_VisionMLP.forward: gate_up, SiLU(gate) x up (split at half the rows), down."""
    gu = x @ mlp.gate_up_proj.weight.data.T
    if mlp.gate_up_proj.bias is not None:
        gu = gu + mlp.gate_up_proj.bias.data
    d = gu.shape[-1] // 2
    gate, up = gu[:, :d], gu[:, d:]
    act = gate / (1 + np.exp(-gate)) * up
    return act @ mlp.down_proj.weight.data.T + mlp.down_proj.bias.data


@pytest.mark.parametrize("bias", [True, False])
def test_the_padded_mlp_computes_the_same_output(bias):
    rng = np.random.default_rng(0)
    mlp = _mlp(rng, bias=bias)
    x = rng.normal(size=(37, 1280 // 8))
    before = _forward(mlp, x)
    assert vitpad.pad_mlp(mlp)
    assert mlp.gate_up_proj.weight.data.shape == (2 * 3456, 160) and mlp.down_proj.weight.data.shape == (160, 3456)
    assert mlp.gate_up_proj.output_size_per_partition == 6912 and mlp.gate_up_proj.output_sizes == [3456, 3456]
    assert mlp.down_proj.input_size_per_partition == 3456 == mlp.down_proj.input_size
    after = _forward(mlp, x)
    np.testing.assert_allclose(after, before, rtol=0, atol=1e-12 * np.abs(before).max())  # summation order only
    # the gate's rows stay gate rows and the up's up rows: a shuffled split would differ
    assert np.array_equal(mlp.gate_up_proj.weight.data[3420:3456], np.zeros((36, 160)))
    assert not vitpad.pad_mlp(mlp)  # once is enough: a multiple of 64 now


def test_sizes_already_aligned_and_quantized_weights_are_left_alone():
    rng = np.random.default_rng(1)
    aligned = _mlp(rng, inner=3456)
    assert not vitpad.pad_mlp(aligned) and aligned.down_proj.weight.data.shape[1] == 3456
    int8 = _mlp(rng, dtype=np.int8)  # not plain floats: a quantized layer keeps its layout
    assert not vitpad.pad_mlp(int8) and int8.gate_up_proj.weight.data.shape[0] == 6840
    fp8 = _mlp(rng)  # torch's float8_e4m3fn is a "float" by name, and a quantized layer's all the same
    fp8.gate_up_proj.weight.data = SimpleNamespace(dtype="torch.float8_e4m3fn", shape=(6840, 160))
    assert not vitpad.pad_mlp(fp8)
    assert [vitpad.padded(n) for n in (3420, 3456, 1, 64)] == [3456, 3456, 64, 64]


def _base_loader(monkeypatch, process, calls_it: bool = True):
    """vLLM's model_loader.base_loader for the test's duration: `process` as its
    process_weights_after_loading, and a BaseModelLoader whose load_model calls it by the
    module's name, as vLLM 0.26's does (calls_it), or processes its weights some other way."""
    import sys
    import types

    loader = types.ModuleType("vllm.model_executor.model_loader")
    base = types.ModuleType("vllm.model_executor.model_loader.base_loader")
    base.process_weights_after_loading = process

    def calling(self, model, config, device):
        base.process_weights_after_loading(model, config, device)

    def other(self, model, config, device):
        return model

    base.BaseModelLoader = type("BaseModelLoader", (), {"load_model": calling if calls_it else other})
    loader.base_loader = base
    monkeypatch.setitem(sys.modules, loader.__name__, loader)
    monkeypatch.setitem(sys.modules, base.__name__, base)
    return base


def test_the_extension_pads_each_vision_mlp_once_vllms_loader_has_loaded_the_weights(monkeypatch):
    """Importing the module patches nothing; resolving the name as vLLM's resolve_obj_by_qualname
    does (split on the last dot; in the worker, before the model loads) wraps the loader's
    process_weights_after_loading, which load_model looks up in its module at each load: after
    the loader's own processing, each Qwen2.5-VL vision MLP is padded (and nothing else), so that
    what runs, or what compile_mm_encoder traces, has the padded sizes; the output is the same;
    asking twice wraps once."""
    import importlib

    import fake_vllm

    mlp_cls = type("Qwen2_5_VisionMLP", (), {"forward": lambda self, x: _forward(self, x)})
    fake_vllm.model_module(monkeypatch, "qwen2_5_vl", Qwen2_5_VisionMLP=mlp_cls)
    processed = []
    base = _base_loader(monkeypatch, lambda model, config, device: processed.append((model, config, device)))
    original = base.process_weights_after_loading
    assert "VisionMlpPadExtension" not in vars(vitpad) and base.process_weights_after_loading is original
    module_name, name = vitpad.EXTENSION.rsplit(".", 1)
    ext = getattr(importlib.import_module(module_name), name)
    assert isinstance(ext, type) and not [a for a in vars(ext) if not a.startswith("__")]  # no Worker clashes
    wrapped = base.process_weights_after_loading
    assert wrapped is not original
    getattr(importlib.import_module(module_name), name)
    assert base.process_weights_after_loading is wrapped  # once

    rng = np.random.default_rng(2)
    mlps = []
    for _ in range(3):  # vision blocks' MLPs, instances of vLLM's class with their layers
        mlp = mlp_cls()
        mlp.gate_up_proj, mlp.down_proj = (lambda m: (m.gate_up_proj, m.down_proj))(_mlp(rng))
        mlps.append(mlp)
    other = _mlp(rng)  # the language model's MLP: another class, left alone
    model = SimpleNamespace(named_modules=lambda: [("visual", None), ("lm.mlp", other)]
                            + [(f"visual.blocks.{i}.mlp", m) for i, m in enumerate(mlps)])
    x = rng.normal(size=(5, 160))
    before = [_forward(m, x) for m in mlps]
    base.process_weights_after_loading(model, "config", "cuda")
    assert processed == [(model, "config", "cuda")]  # vLLM's own processing first, once
    assert [m.down_proj.weight.data.shape[1] for m in mlps] == [3456] * 3
    assert other.down_proj.weight.data.shape[1] == 3420
    for m, b in zip(mlps, before):
        np.testing.assert_allclose(m.forward(x), b, rtol=0, atol=1e-12 * np.abs(b).max())
    base.process_weights_after_loading(model, "config", "cuda")  # a second load: nothing more to pad
    assert [m.down_proj.weight.data.shape[1] for m in mlps] == [3456] * 3
    with pytest.raises(AttributeError):
        vitpad.SomethingElse  # noqa: B018


def test_a_vllm_whose_loader_no_longer_calls_the_hook_is_a_warning(monkeypatch, caplog):
    """A later vLLM whose load_model stopped calling process_weights_after_loading would leave the
    MLPs unpadded (the same output, the old speed): the worker's log says so."""
    import importlib
    import logging

    import fake_vllm

    fake_vllm.model_module(monkeypatch, "qwen2_5_vl", Qwen2_5_VisionMLP=type("Qwen2_5_VisionMLP", (), {}))
    _base_loader(monkeypatch, lambda model, config, device: None, calls_it=False)
    with caplog.at_level(logging.WARNING, logger="vllm.batchocr.vitpad"):
        getattr(importlib.import_module("batchocr.engines.vllm.patches.vitpad"), "VisionMlpPadExtension")
    (said,) = [r.getMessage() for r in caplog.records]
    assert "does not call process_weights_after_loading" in said


def _llm_args(preset="qwen2.5-vl", **options):
    """vLLM's engine arguments as batchocr's engine builds them for a preset and options."""
    from batchocr.engines.vllm.presets import get_preset
    from batchocr.engines.vllm import VLLMOptions

    return VLLMOptions(model="/m", preset=preset, **options).llm_args(get_preset(preset))


def test_a_patched_model_keys_vllm_s_compile_cache_apart(monkeypatch, tmp_path):
    """vLLM 0.26 keys its torch.compile cache on a config hash that leaves worker_extension_cls out,
    so a graph compiled unpadded was reloaded for the padded weights and the engine core died
    (H200, 2026-12-04: 'expanded size 6840 must match 6912'). batchocr's engine arguments carry
    the extension's name and its source's hash in additional_config, which that hash covers: a
    patched and a plain engine differ there, and a change to the patch's code changes it again."""
    import importlib.util

    from batchocr.engines.vllm.patches import workerext

    def args(**engine_args):
        return _llm_args(engine_args=engine_args)

    assert "additional_config" not in args()
    padded = args(worker_extension_cls=vitpad.EXTENSION)
    mark = padded["additional_config"][workerext.KEY]
    assert mark.startswith(vitpad.EXTENSION + "@")
    # a user's own additional_config keeps its keys, and gains the mark
    mine = args(worker_extension_cls=vitpad.EXTENSION, additional_config={"x": 1})
    assert mine["additional_config"] == {"x": 1, workerext.KEY: mark}
    # another's extension, or a name batchocr's module does not have: as given
    assert "additional_config" not in args(worker_extension_cls="my.ext.X")
    assert "additional_config" not in args(worker_extension_cls="batchocr.engines.vllm.patches.vitpad.Nope")
    # the mark follows the patch's code: the same source, the same mark; an edit, another
    assert workerext.fingerprint(vitpad.EXTENSION) == mark
    edited = tmp_path / "vitpad.py"
    edited.write_text(open(vitpad.__file__).read().replace("MULTIPLE = 64", "MULTIPLE = 128"))
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: SimpleNamespace(origin=str(edited)) if name == "batchocr.engines.vllm.patches.vitpad" else real(name, *a))
    assert workerext.fingerprint(vitpad.EXTENSION) not in (None, mark)


def test_vit_pad_names_the_extension_for_qwen2_5_vl_s_presets_only():
    """engines.vllm.vit_pad: true names batchocr.engines.vllm.patches.vitpad's extension (and keys vLLM's compile cache
    with it); unset it is the preset's (off in every preset for now); false names none; a preset
    with another vision tower is a ConfigError naming the key."""
    from batchocr.engines.vllm.patches import workerext
    from batchocr.engines.vllm.presets import get_preset
    from batchocr.engines.vllm import VLLMOptions
    from batchocr.errors import ConfigError

    args = _llm_args

    for preset in vitpad.PRESETS:
        on = args(preset, vit_pad=True)
        assert on["worker_extension_cls"] == vitpad.EXTENSION
        assert on["additional_config"] == {workerext.KEY: workerext.fingerprint(vitpad.EXTENSION)}
        assert on["compilation_config"] == {"compile_mm_encoder": True}  # the preset's compile stays
        assert "worker_extension_cls" not in args(preset) and "worker_extension_cls" not in args(preset, vit_pad=False)
        assert get_preset(preset).vit_pad is False
    with pytest.raises(ConfigError, match="engines.vllm.vit_pad: .* preset unlimited-ocr has another"):
        VLLMOptions(model="/m", preset="unlimited-ocr", vit_pad=True)
    # unlimited-ocr's own extensions are untouched by vit_pad left unset or false
    assert args("unlimited-ocr", vit_pad=False)["worker_extension_cls"] == args("unlimited-ocr")["worker_extension_cls"]

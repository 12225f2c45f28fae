"""batchocr.vitpad: Qwen2.5-VL's vision MLP padded to an aligned inner size computes the same
thing. The padding runs on numpy arrays here (the same code pads torch tensors in vLLM's
worker); the kernels it is for are measured on the GPU (bench/gpu/check_vit_pad.py)."""

from types import SimpleNamespace

import numpy as np
import pytest

from batchocr import vitpad


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


def test_importing_it_patches_nothing_and_only_its_extension_resolves():
    assert vitpad.EXTENSION == "batchocr.vitpad.VisionMlpPadExtension"
    with pytest.raises(AttributeError):
        vitpad.SomethingElse  # noqa: B018

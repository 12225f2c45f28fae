"""The vLLM batchocr is tested with (0.26.0): the `vllm` extra and the image pin it, another version is
said once, and each patch checks the vLLM code it rewrites (batchocr/engines/vllm/patches/__init__.py):
where it moved, a speed patch left to the preset falls back to vLLM's own code with one warning, one
asked for stops the run naming its key, and missing n-gram bans (other output) stop the run.

vLLM is stood in for at its installation: a `vllm` package on the path whose API is tests/fake_vllm.py,
a `vllm-VERSION.dist-info` beside it, and vLLM 0.26.0's code that the patches rewrite, in its files
(fake_vllm.vllm_tree), changed where a test says."""

from __future__ import annotations

import json
import logging
import os
import re
import tomllib
from pathlib import Path

import pytest
from PIL import Image

import fake_vllm
from batchocr.engines.vllm import VLLMOptions, options, patches
from batchocr.engines.vllm.patches import (deepencoder, ngram, ngram_sampler, pixels, rswa_tiles, samattn, startup,
                                          vitpad, workerext)
from batchocr.engines.vllm.presets import get_preset
from batchocr.errors import ConfigError
from conftest import ROOT, read_table, run_cli

TESTS = Path(__file__).parent
PATCHES = (deepencoder, vitpad, ngram, ngram_sampler, workerext, samattn, pixels, startup)
UOCR = "batchocr.engines.vllm.patches.rswa_tiles.RswaTiles"


@pytest.fixture(autouse=True)
def _nothing_warned_yet(monkeypatch):
    """Each test starts as a run does: nothing said yet (warn_once marks the environment)."""
    monkeypatch.setenv(options.WARNED_ENV, "")


def test_the_extra_and_the_image_pin_the_version_the_patches_are_written_for():
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["vllm"]
    assert extra == [f"vllm=={patches.TESTED}"]
    (image,) = re.findall(r"^FROM vllm/vllm-openai:v([0-9.]+)\b", (ROOT / "Dockerfile").read_text(), re.M)
    assert image == patches.TESTED


def test_another_vllm_is_said_once_and_the_tested_one_not_at_all(monkeypatch, caplog):
    found = iter(["0.27.1", "0.27.1", "0.26.0", "0.26.0+cu130"])
    monkeypatch.setattr(patches, "version", lambda: next(found))
    with caplog.at_level(logging.WARNING, logger="batchocr.engines.vllm"):
        VLLMOptions(model="/m").check_patches()
        VLLMOptions(model="/m").check_patches()  # a second engine of the run (instances, a part)
    (said,) = [r.getMessage() for r in caplog.records]
    assert said.startswith("engine vllm: batchocr is tested with vLLM 0.26.0, this is vLLM 0.27.1") and "\n" not in said
    assert "version" in os.environ[options.WARNED_ENV].split(",")  # what a run's parts inherit
    caplog.clear()
    monkeypatch.setenv(options.WARNED_ENV, "")
    with caplog.at_level(logging.WARNING, logger="batchocr.engines.vllm"):
        VLLMOptions(model="/m").check_patches()  # 0.26.0
        VLLMOptions(model="/m").check_patches()  # 0.26.0 built for CUDA 13: the same code
    assert caplog.records == []


def test_each_patch_s_targets_are_vllm_0_26_0_s_code_and_a_change_is_named(tmp_path):
    root = fake_vllm.vllm_tree(tmp_path / "ok") / "vllm"
    for patch in PATCHES:
        assert patches.moved("x", patch.TARGETS, root) is None, patch.__name__
    rswa_tiles.check_source(root / "v1/attention/ops/triton_unified_attention.py")
    edited = fake_vllm.vllm_tree(tmp_path / "edited", edit={
        "v1/worker/gpu/sample/sampler.py": ("def add_request(", "def add_request_state(")}) / "vllm"
    assert patches.moved("ngram_sampler", ngram_sampler.TARGETS, edited) == (
        "this vLLM has no Sampler.add_request in vllm/v1/worker/gpu/sample/sampler.py, which batchocr's "
        "ngram_sampler patch rewrites (written for vLLM 0.26.0)")
    # formatting is no change; a changed expression is
    assert patches.digest(patches.source_of("def f(a,\n      b):\n    return a+b\n", "f")) == \
        patches.digest(patches.source_of("def f(a, b):    return a+b", "f"))
    assert patches.digest(patches.source_of("def f(a, b): return a + b", "f")) != \
        patches.digest(patches.source_of("def f(a, b): return a - b", "f"))


@pytest.mark.parametrize("key, patch, preset", [("rswa_tiles", rswa_tiles, "unlimited-ocr"),
                                                ("batch_encoder", deepencoder, "unlimited-ocr"),
                                                ("vit_pad", vitpad, "qwen2.5-vl"),
                                                ("pixel_bytes", pixels, "unlimited-ocr"),
                                                ("sam_fold", samattn, "unlimited-ocr")])
def test_a_speed_patch_asked_for_on_a_vllm_where_it_moved_stops_naming_the_key(monkeypatch, key, patch, preset):
    monkeypatch.setattr(patch, "moved", lambda: "this vLLM's X is not vLLM 0.26.0's")
    with pytest.raises(ConfigError, match=rf"^engines\.vllm\.{key}: this vLLM's X is not vLLM 0\.26\.0's; "
                                          r"set it false for this vLLM$"):
        VLLMOptions(model="/m", preset=preset, **{key: True}).check_patches()
    VLLMOptions(model="/m", preset=preset, **{key: False}).check_patches()  # off: nothing to check


def test_worker_extensions_that_moved_turn_every_default_patch_off_and_stop_the_sampler_s_bans(monkeypatch, caplog):
    monkeypatch.setattr(workerext, "moved", lambda: "this vLLM's WorkerWrapperBase.init_worker moved")
    o = VLLMOptions(model="/m", preset="unlimited-ocr")
    with caplog.at_level(logging.WARNING, logger="batchocr.engines.vllm"):
        o.check_patches()
    assert [r.getMessage().split(":")[0] for r in caplog.records] == ["engines.vllm.rswa_tiles",
                                                                     "engines.vllm.batch_encoder"]
    args = o.llm_args(get_preset("unlimited-ocr"))
    assert "worker_extension_cls" not in args and args["logits_processors"] == [ngram.FQCN]  # vLLM's own code
    with pytest.raises(ConfigError, match=r"^engines\.vllm\.ngram_bans: sampler: this vLLM's WorkerWrapperBase"):
        VLLMOptions(model="/m", preset="unlimited-ocr", ngram_bans="sampler").check_patches()


def _images(src: Path) -> Path:
    src.mkdir()
    for i, shade in enumerate((250, 200)):
        Image.new("RGB", (560, 700), (shade, shade, shade)).save(src / f"page{i}.png")
    return src


def _run(tmp_path: Path, tree: Path, *extra: str):
    out = tmp_path / "out"
    env = {"PYTHONPATH": os.pathsep.join([str(tree), str(TESTS), str(ROOT)])}
    proc = run_cli("run", str(_images(tmp_path / "src")), str(out), "--engine", "vllm", "--model", "fake-model",
                   "--preset", "unlimited-ocr", "--route", "model", "-q", *extra, env=env, subprocess=True)
    return proc, out


def _extensions(out: Path) -> set:
    return {json.loads(p.read_text())["engine_params"]["llm_args"].get("worker_extension_cls")
            for p in out.glob("_runs/*.json")}


def test_a_run_on_the_tested_vllm_says_nothing_and_installs_every_patch(tmp_path):
    proc, out = _run(tmp_path, fake_vllm.vllm_tree(tmp_path / "vllm"))
    assert proc.returncode == 0, proc.stderr
    assert not [line for line in proc.stderr.splitlines() if "vllm" in line.lower()], proc.stderr
    assert _extensions(out) == {UOCR + "EncoderExtension"}  # the R-SWA kernel and the batched encoder


def test_another_vllm_whose_encoder_moved_is_said_once_and_its_patch_falls_back_once(tmp_path):
    """vLLM 0.27.1 whose DeepSeek encoder changed, in a run of two processes: one line says which vLLM
    was tested and which is here, one that batch_encoder is off (naming the key), and no more from
    the parts; the run reads every page with vLLM's own encoder (the R-SWA kernel still patched)."""
    tree = fake_vllm.vllm_tree(tmp_path / "vllm", "0.27.1", edit={
        "model_executor/models/deepseek_ocr.py": ("images_in_this_batch = []", "images_in_this_batch = list()")})
    proc, out = _run(tmp_path, tree, "--processes", "2")
    assert proc.returncode == 0, proc.stderr
    said = [line for line in proc.stderr.splitlines() if "vllm" in line.lower()]
    assert len(said) == 2, proc.stderr
    assert said[0] == ("engine vllm: batchocr is tested with vLLM 0.26.0, this is vLLM 0.27.1: each of its patches "
                       "checks the vLLM code it rewrites (pip install '.[vllm]' from the clone installs 0.26.0)")
    assert said[1].startswith("engines.vllm.batch_encoder: the preset's default is off for this vLLM (this vLLM's "
                              "DeepseekOCRForCausalLM._pixel_values_to_embedding (vllm/model_executor/models/"
                              "deepseek_ocr.py) is not vLLM 0.26.0's") and "batch_encoder: false" in said[1]
    assert _extensions(out) == {UOCR + "Extension"}
    assert sorted(r["page_index"] for r in read_table(out).to_pylist() if r["error_type"] is None) == [0, 0]


def test_a_vllm_whose_logits_processor_interface_moved_stops_before_it_loads_in_one_line(tmp_path):
    """Without its no-repeat n-gram bans Unlimited-OCR's output would change: exit 2, the key named."""
    tree = fake_vllm.vllm_tree(tmp_path / "vllm", "0.27.1", edit={
        "v1/sample/logits_processor/interface.py": ("class LogitsProcessor(", "class LogitsProcessorBase(")})
    proc, out = _run(tmp_path, tree)
    assert proc.returncode == 2, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("Error")]
    assert errors == ["Error: engines.vllm.ngram_bans: processor: this vLLM has no LogitsProcessor in "
                      "vllm/v1/sample/logits_processor/interface.py, which batchocr's ngram patch rewrites (written "
                      "for vLLM 0.26.0); without these no-repeat n-gram bans unlimited-ocr's output would change: "
                      "install vLLM 0.26.0 (pip install '.[vllm]' from the clone)"], proc.stderr
    assert "Traceback" not in proc.stderr and not list(out.glob("pages/**/*.parquet"))


def test_the_sampler_s_bans_on_a_vllm_whose_v2_sampler_moved_stop_and_the_processor_s_run(monkeypatch):
    monkeypatch.setattr(ngram_sampler, "moved", lambda: "this vLLM's Sampler.add_request moved")
    with pytest.raises(ConfigError, match=r"^engines\.vllm\.ngram_bans: sampler: this vLLM's Sampler\.add_request "
                                          r"moved; without these no-repeat n-gram bans deepseek-ocr's output would"):
        VLLMOptions(model="/m", preset="deepseek-ocr", ngram_bans="sampler").check_patches()
    VLLMOptions(model="/m", preset="deepseek-ocr").check_patches()  # the processor's bans: their own code is here
    VLLMOptions(model="/m", preset="qwen2.5-vl", ngram_bans="sampler").check_patches()  # no bans in this preset

"""A pod's start: vLLM and torch are imported for the engine's build alone (by the build itself,
or by a part while it waits for its turn to build: engines.preload). Reading the job spec,
checking OUT's settings and planning (the parent of `--processes N`, and each part before its
build) import neither: on a GPU node each import is seconds of every start."""

from __future__ import annotations

import importlib
import subprocess
import sys
import types
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

PREPARE = """
import sys
from batchocr.spec import load_job
from batchocr.shard import prepare
from batchocr import engines

spec = load_job(sys.argv[1])
shard = prepare(spec, sharding=True, settings=True)
engines.shared(spec.engine, spec.engine_options, 2)
engines.starts_alone(spec.engine, spec.engine_options)
from batchocr.engines.vllm.patches import ngram  # the module vLLM's engine core loads the processor from
print(sorted(m for m in sys.modules if m.split('.')[0] in ('vllm', 'torch')))
"""


def test_reading_a_vllm_job_and_preparing_its_shard_imports_neither_vllm_nor_torch(tmp_path):
    trap = tmp_path / "trap"
    for name in ("vllm", "torch"):  # importable, so that a guarded import is seen too
        (trap / name).mkdir(parents=True)
        (trap / name / "__init__.py").write_text("")
    job = tmp_path / "job.yaml"
    job.write_text(f"source: {ROOT / 'samples'}\nout: {tmp_path / 'out'}\nengine: vllm\nprocesses: 2\n"
                   "engines:\n  vllm:\n    model: /models/unlimited-ocr\n    preset: unlimited-ocr\n")
    ran = subprocess.run([sys.executable, "-c", PREPARE, str(job)], capture_output=True, text=True, cwd=ROOT,
                         env={"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{trap}:{ROOT}", "HOME": str(tmp_path)})
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == "[]", ran.stdout


def test_the_ngram_processor_is_made_on_first_use_as_vllm_loads_it(monkeypatch):
    """vLLM's engine core loads logits processors by FQCN (module, then getattr): the class is
    built there, on vLLM's LogitsProcessor, once."""
    base = type("LogitsProcessor", (), {})
    updates = []
    lp = types.ModuleType("vllm.v1.sample.logits_processor")
    lp.LogitsProcessor = base
    builtin = types.ModuleType("vllm.v1.sample.logits_processor.builtin")
    builtin.process_dict_updates = lambda rows, update, new: updates.append(update)
    for name in ("vllm", "vllm.v1", "vllm.v1.sample"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, lp.__name__, lp)
    monkeypatch.setitem(sys.modules, builtin.__name__, builtin)
    from batchocr.engines.vllm.patches import ngram

    monkeypatch.delitem(ngram.__dict__, "NoRepeatNGramLogitsProcessor", raising=False)
    module_path, qualname = ngram.FQCN.split(":")
    cls = getattr(importlib.import_module(module_path), qualname)  # as vLLM 0.26's _load_logitsprocs_by_fqcns
    assert issubclass(cls, base) and cls.__module__ == module_path and cls.__name__ == qualname
    assert getattr(ngram, qualname) is cls  # made once
    processor = cls(None, "cpu", False)
    processor.update_state("an update")
    assert updates == ["an update"] and processor.is_argmax_invariant() is False
    with pytest.raises(AttributeError):
        ngram.NoSuchThing  # noqa: B018 - any other name is still an AttributeError

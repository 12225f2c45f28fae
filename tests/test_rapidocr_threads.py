"""rapidocr's onnxruntime threads wait for work without spinning (batchocr.engines.rapidocr.SPINNING):
a spinning thread polls a core between operators, CPU the render workers and whatever else runs
on the machine wait for (bench/cli_start.py --engine rapidocr: docs/BENCHMARKS.md)."""

import numpy as np

from conftest import SAMPLES


def _spinning(model) -> str | None:
    """The SPINNING entry of a rapidocr model's onnxruntime session; None where it is onnxruntime's default."""
    from batchocr.engines.rapidocr import SPINNING

    opts = model.session.session.get_session_options()
    try:
        return opts.get_session_config_entry(SPINNING)
    except RuntimeError:  # onnxruntime: no such entry set
        return None


def _page() -> np.ndarray:
    import pymupdf

    pix = pymupdf.open(SAMPLES / "scanned.pdf")[0].get_pixmap(dpi=100, colorspace=pymupdf.csRGB, alpha=False)
    return np.frombuffer(pix.samples, np.uint8).reshape(pix.height, pix.width, 3)


def test_the_models_load_on_first_use_with_spinning_off_and_rapidocr_is_left_as_it_was():
    from rapidocr import RapidOCR
    from rapidocr.inference_engine.onnxruntime.main import OrtInferSession

    from batchocr.engines import rapidocr

    builder = OrtInferSession.__dict__["_init_sess_opts"]
    engine = rapidocr.create({"threads": 1})
    try:
        ocr = engine._ocr
        # nothing loaded yet: a run whose pages all come from the text layer loads no model
        assert (ocr.text_det, ocr.text_cls, ocr.text_rec) == (None, None, None)
        text, _ = engine.recognise(_page())  # rapidocr's steps and batchocr's both load through the instance
        # the three loaded: the line classifier votes which way up the page is (orient)
        assert len(text) > 100 and None not in (ocr.text_det, ocr.text_cls, ocr.text_rec)
        assert [_spinning(m) for m in (ocr.text_det, ocr.text_cls, ocr.text_rec)] == ["0", "0", "0"]
        assert ocr._load_det_model() is ocr.text_det  # loaded once
    finally:
        engine.close()
    # rapidocr's own builder is back: a session it builds for another caller keeps the default
    assert OrtInferSession.__dict__["_init_sess_opts"] is builder
    assert _spinning(RapidOCR(params={"Global.log_level": "warning"})._load_det_model()) is None


def test_a_rapidocr_whose_builder_lives_elsewhere_still_loads(monkeypatch):
    """Another rapidocr's sessions, their options built where the engine does not look (here: the
    base class): the engine loads its models as rapidocr would, spinning left at the default."""
    from rapidocr.inference_engine.onnxruntime.main import OrtInferSession

    from batchocr.engines import rapidocr

    original = OrtInferSession.__dict__["_init_sess_opts"]
    base = OrtInferSession.__mro__[1]
    monkeypatch.delattr(OrtInferSession, "_init_sess_opts")
    monkeypatch.setattr(base, "_init_sess_opts", original, raising=False)
    engine = rapidocr.create({"threads": 1})
    try:
        assert len(engine.recognise(_page())[0]) > 100
        assert _spinning(engine._ocr.text_det) is None and _spinning(engine._ocr.text_rec) is None
    finally:
        engine.close()

"""rapidocr's onnxruntime threads wait for work without spinning (batchocr.engines.rapidocr.SPINNING):
a spinning thread polls a core between operators, CPU the render workers and whatever else runs
on the machine wait for (bench/cli_start.py --engine rapidocr: docs/BENCHMARKS.md)."""

import numpy as np


def _spinning(model) -> str | None:
    """The SPINNING entry of a rapidocr model's onnxruntime session; None where it is onnxruntime's default."""
    from batchocr.engines.rapidocr import SPINNING

    opts = model.session.session.get_session_options()
    try:
        return opts.get_session_config_entry(SPINNING)
    except RuntimeError:  # onnxruntime: no such entry set
        return None


def test_the_engine_loads_its_models_with_spinning_off_and_leaves_rapidocr_as_it_was():
    from rapidocr import RapidOCR
    from rapidocr.inference_engine.onnxruntime.main import OrtInferSession

    from batchocr.engines import rapidocr

    builder = OrtInferSession.__dict__["_init_sess_opts"]
    engine = rapidocr.create({"threads": 1, "use_cls": True})
    try:
        ocr = engine._ocr
        models = [ocr.text_det, ocr.text_rec, ocr.text_cls]  # loaded by create, not by the first page
        assert all(m is not None for m in models)
        assert [_spinning(m) for m in models] == ["0", "0", "0"]
    finally:
        engine.close()
    # rapidocr's own builder is back: a session it builds for another caller keeps the default
    assert OrtInferSession.__dict__["_init_sess_opts"] is builder
    assert _spinning(RapidOCR(params={"Global.log_level": "warning"})._load_det_model()) is None


def test_an_engine_without_the_classifier_does_not_load_it():
    from batchocr.engines import rapidocr

    engine = rapidocr.create({"threads": 1})
    try:
        assert engine._ocr.text_cls is None and _spinning(engine._ocr.text_det) == "0"
    finally:
        engine.close()


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
        assert _spinning(engine._ocr.text_det) is None and _spinning(engine._ocr.text_rec) is None
        assert engine.recognise(np.full((200, 300, 3), 255, np.uint8))[0] == ""
    finally:
        engine.close()

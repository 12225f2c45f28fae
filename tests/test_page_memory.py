"""The rapidocr engine's memory budget (`memory_mb`): the detector's input, the one
part of a page's work that grows with its pixels, is bounded by the pixel count
the budget allows. Sizes are asserted as computed and as the real detector
received them (its ONNX input tensors), not as RSS: bench/page_memory.py
measures the memory (docs/history/BENCHMARKS.md)."""

from __future__ import annotations

import logging
import threading
from collections import Counter

import numpy as np
import pytest

from batchocr import deskew, schema
from batchocr.engines import rapidocr as R
from batchocr.errors import ConfigError


def quad(cx: float, cy: float, w: float, h: float, angle: float) -> list[list[float]]:
    """A box of w x h centred at (cx, cy), turned counter-clockwise by angle degrees (tl, tr, br, bl)."""
    a = np.radians(angle)
    ux, uy = np.cos(a), -np.sin(a)  # along the line (image y runs down)
    vx, vy = np.sin(a), np.cos(a)  # down the line
    return [[cx + sx * w / 2 * ux + sy * h / 2 * vx, cy + sx * w / 2 * uy + sy * h / 2 * vy]
            for sx, sy in ((-1, -1), (1, -1), (1, 1), (-1, 1))]


def test_plan_keeps_the_warp_within_the_budget_pixels():
    # small text on a page rapidocr shrank 3.5x: unbounded, it is enlarged to MAX_SIDE (4000 x 3090)
    small = [quad(770, 100 + 20 * k, 600, 10, 0) for k in range(20)]
    shape = (2000, 1545)
    _, rotate, scale = deskew.plan(small, shape, most=3.5)
    assert deskew.canvas_pixels(shape, rotate, scale) > 12_000_000
    cap = R.max_detector_pixels(R.RapidOCROptions().memory_mb)
    _, rotate, scale = deskew.plan(small, shape, most=3.5, max_pixels=cap)
    assert 1.1 < scale < 2.0 and deskew.canvas_pixels(shape, rotate, scale) <= cap
    out = deskew.warp(np.full((7000, 5408, 3), 255, np.uint8), rotate, scale * shape[0] / 7000)
    assert out.shape[0] * out.shape[1] <= cap * 1.001  # the image warp makes, from the original pixels

    # a skewed page whose turned canvas is over the bound: shrunk to fit, below 1
    skewed = [quad(1000, 200 + 60 * k, 1200, 36, 4.0) for k in range(20)]
    _, rotate, scale = deskew.plan(skewed, (2000, 2000), max_pixels=3_000_000)
    assert rotate == pytest.approx(4.0, abs=0.01) and scale < 0.9
    out = deskew.warp(np.full((2000, 2000, 3), 255, np.uint8), rotate, scale)
    assert out.shape[0] * out.shape[1] <= 3_000_000 * 1.001

    # within the bound, nothing changes
    assert deskew.plan(small, shape, most=3.5, max_pixels=10**9) == deskew.plan(small, shape, most=3.5)
    assert deskew.plan(skewed, (2000, 2000), max_pixels=10**9) == deskew.plan(skewed, (2000, 2000))


def test_budget_to_pixels_and_its_range():
    assert R.max_detector_pixels(R.MIN_MEMORY_MB) >= 1545 * 2000  # a Letter page as rapidocr preprocesses it
    assert R.max_detector_pixels(2048) > 2 * R.max_detector_pixels(1024) - R.max_detector_pixels(R.MIN_MEMORY_MB)
    with pytest.raises(ConfigError, match="memory_mb"):
        R.create({"memory_mb": R.MIN_MEMORY_MB - 1})


@pytest.mark.parametrize("shape", [(2000, 1545), (1545, 2000), (1984, 1984), (2000, 1414), (1100, 850), (500, 400)])
def test_the_default_budget_leaves_pages_rapidocr_preprocessed_as_they_are(shape):
    # any page after rapidocr's 2000-px preprocessing, and turned for deskew by up to 5 degrees
    cap = R.max_detector_pixels(R.RapidOCROptions().memory_mb)
    assert R.detector_fit(shape, cap) == (1.0, R.DET_SIDE)
    skewed = [quad(shape[1] / 2, 50 + 40 * k, shape[1] * 0.6, 30, 5.0) for k in range(10)]
    assert deskew.plan(skewed, shape, max_pixels=cap * R.FIT_MARGIN)[2] == 1.0


@pytest.mark.parametrize("shape", [(2000, 1545), (8000, 6000), (200, 2000), (2000, 100), (50, 2000), (20, 900)])
@pytest.mark.parametrize("cap", [1_000_000, 2_500_000])
def test_detector_fit_bounds_the_detector_input(shape, cap):
    scale, limit = R.detector_fit(shape, cap)
    h, w = (max(1, round(s * scale)) for s in shape)
    dh, dw = R.detector_input(h, w, limit)
    assert dh * dw <= cap
    if R.detector_input(*shape) [0] * R.detector_input(*shape)[1] > cap:
        assert dh * dw > cap * 0.7  # the largest that fits, near enough: not needlessly small


@pytest.fixture(scope="module")
def engine():
    """The real engine, its detector's ONNX session watched: the tensors it is given."""
    eng = R.create({"memory_mb": R.MIN_MEMORY_MB})
    det = eng._ocr._load_det_model()
    seen: list[tuple[int, ...]] = []
    session = det.session

    class Watch:
        def __call__(self, x):
            seen.append(x.shape)
            return session(x)

        def __getattr__(self, name):
            return getattr(session, name)

    det.session = Watch()
    eng.seen = seen
    yield eng
    det.session = session


@pytest.mark.parametrize("shape", [(1000, 800), (200, 2000), (480, 120), (25, 600)])
def test_detector_input_is_what_rapidocr_makes(engine, shape):
    img = np.full((*shape, 3), 255, np.uint8)
    img[shape[0] // 2 - 4:shape[0] // 2 + 4, shape[1] // 4: 3 * shape[1] // 4] = 0  # a bar: something to find
    engine.seen.clear()
    try:
        engine._ocr.detect_and_crop(img, {})
    except Exception:  # noqa: BLE001 - nothing found is fine: the tensor was made
        pass
    assert engine.seen[0][2:] == R.detector_input(*shape)


def test_a_40_megapixel_page_under_a_small_budget_is_read_within_it(engine, caplog):
    import layouts

    poster = layouts.poster()  # small text on a large sheet: unbounded, detected again at 12.4 Mpx
    rgb = layouts.pixels(poster, 40)
    assert rgb.shape[0] * rgb.shape[1] > 39_000_000
    h, w = rgb.shape[:2]
    batch = schema.batch(schema.PAGES, [{"doc_id": "d", "page_index": 0, "width": w, "height": h,
                                         "image": rgb.tobytes()}])
    engine.seen.clear()
    with caplog.at_level(logging.WARNING, logger="batchocr.engines.rapidocr"):
        (out,) = list(engine.run(iter([batch]), threading.Event()))
    (row,) = out.to_pylist()
    assert row["finish_reason"] == "stop" and row["error_type"] is None
    assert engine.seen and all(s[2] * s[3] <= engine.max_detector_pixels for s in engine.seen)
    # unbounded, the small text of the first pass (rapidocr's 2000-px image) asks for a 12.4 Mpx second pass
    first = engine.seen[0]
    assert max(first[2:]) == 1984 and deskew.canvas_pixels(
        first[2:], 0, deskew.MAX_SIDE / 1984) > 3 * engine.max_detector_pixels
    truth = Counter(" ".join(poster.truth).split())
    found = Counter(row["text"].split())
    assert sum((truth & found).values()) / sum(truth.values()) > 0.5  # read, at a size that fits
    assert f"memory_mb {R.MIN_MEMORY_MB}" in caplog.text and "rather than" in caplog.text  # said, once
    assert engine.describe()["max_detector_pixels"] == engine.max_detector_pixels

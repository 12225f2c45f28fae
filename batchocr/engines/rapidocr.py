"""The embedded CPU engine: rapidocr (PP-OCR ONNX models shipped inside its wheel).

Nothing is downloaded and nothing is sent anywhere: onnxruntime's telemetry is
switched off before onnxruntime is imported.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass
from typing import Annotated, Any, Iterator, Mapping

import numpy as np
import pyarrow as pa
from annotated_types import Ge, Le

from batchocr import mdescape, readingorder, schema, upright
from batchocr.config import FORBID
from batchocr.cpus import available_cpus
from batchocr.engines import Engine, EngineType, parse_options, result, systemic
from batchocr.schema import Needs

log = logging.getLogger(__name__)

# A page's working memory, over the loaded engine holding the page. Detection grows
# with its input's pixels: BASE_MB + BYTES_PER_DETECTOR_PIXEL a pixel is at or above
# every measured page within the run-to-run spread of ~100 MB (Letter pages at 2-40
# Mpx, detected at 2-3 Mpx: 490-840 MB; a sheet of small text detected again at
# 4.8-12.4 Mpx: 0.98-2.2 GB); the detector alone fits 146-153 bytes a pixel + 173-246 MB. Recognition does
# not grow with the page: a batch of six full-width lines peaks at ~590 MB whatever
# the page's size, hence MIN_MEMORY_MB. Measured on the 2-core build machine
# (docs/BENCHMARKS.md, "A large page's memory"):
#     python bench/page_memory.py --baseline /tmp/oldtree
#     python bench/page_memory.py --kinds poster --pages 40 --budgets 960,1280,1536,2048,huge
#     python bench/page_memory.py --detector 1,2,4,8
BYTES_PER_DETECTOR_PIXEL = 150
BASE_MB = 500
# A page where the detector finds nothing is looked at again cut to its ink, this many
# pixels (of rapidocr's shrunk image) around it; not where the ink spans more than INK_MOST of it.
INK_MARGIN = 32
INK_MOST = 0.5
MIN_MEMORY_MB = 960  # a detector input of 3.2 Mpx: a Letter page after rapidocr's 2000-px preprocessing
# deskew.plan's warp aims this far below the bound: the detector rounds sides to 32 px
# (up to 4% more pixels), and a warped image over the bound would be resampled again.
FIT_MARGIN = 0.95
# rapidocr's detector (Det.limit_side_len, limit_type min) enlarges an image whose
# shorter side is below this; it pads one wider than 8:1 or at most 30 px high.
DET_SIDE = 736


@dataclass(frozen=True)
class RapidOCROptions:
    __pydantic_config__ = FORBID  # typed by batchocr.config, like all configuration
    # onnxruntime intra-op threads; 0 = one per CPU core.
    threads: Annotated[int, Ge(0)] = 0
    # Turn pages scanned sideways or upside down upright before reading them: the detected
    # boxes say whether the page lies sideways, rapidocr's line classifier on its longest
    # lines votes whether it is upside down (batchocr/deskew.py: quarter_turns).
    orient: bool = True
    # Recognised lines scoring below this are dropped.
    text_score: Annotated[float, Ge(0), Le(1)] = 0.5
    # Read the detected lines column by column, block by block (batchocr/readingorder.py);
    # off: rows across the whole page, left to right, as rapidocr returns them.
    reading_order: bool = True
    # Straighten pages skewed by 0.5 degree or more before recognition (batchocr/deskew.py).
    deskew: bool = True
    # Rescale pages whose text is too small or too large for the detector to its
    # preferred height (batchocr/deskew.py: TEXT_HEIGHT_RANGE).
    rescale: bool = True
    # Memory (MB) for one page's work, over the loaded engine and the page image itself.
    # It bounds the detector's input to (memory_mb - BASE_MB) / BYTES_PER_DETECTOR_PIXEL
    # pixels (1280: 5.45 Mpx, more than any page rapidocr's 2000-px preprocessing leaves,
    # turned for deskew by up to 8 degrees); a page that needs more (small text on a large
    # page, rescaled up; a narrow strip the detector enlarges) is detected at the largest
    # size that fits.
    memory_mb: Annotated[int, Ge(MIN_MEMORY_MB)] = 1280


class RapidOCREngine(Engine):
    name = "rapidocr"
    needs = Needs(image=True, text_layer=False)

    def __init__(self, options: RapidOCROptions):
        self.options = options
        import onnxruntime  # telemetry off: see batchocr/__init__.py
        from rapidocr import RapidOCR

        onnxruntime.disable_telemetry_events()

        self.threads = threads = options.threads or available_cpus()  # the record gives the count used
        self._ocr = RapidOCR(
            params={
                "Global.use_cls": False,  # its classifier votes per page here (orient), not per line
                "Global.text_score": options.text_score,
                "Global.log_level": "warning",
                "EngineConfig.onnxruntime.intra_op_num_threads": threads,
                "EngineConfig.onnxruntime.inter_op_num_threads": 1,
            }
        )
        _without_spinning(self._ocr)
        cfg = self._ocr.cfg
        self.max_detector_pixels = max_detector_pixels(options.memory_mb)
        self._capped = False
        self.model = _model(cfg)

    def run(self, pages: Iterator[pa.RecordBatch], stop: threading.Event | None = None) -> Iterator[pa.RecordBatch]:
        stop = stop or threading.Event()
        # rapidocr failing on every page alike (a version whose API batchocr does not know, an
        # onnxruntime that cannot run the models) is the run's failure, not a table of
        # engine_error rows: errors are held until a page is read (batchocr/engines/systemic.py)
        held = systemic.Held("engine rapidocr failed on every page alike ({n} pages, none read)")
        for batch in pages:
            cols = batch.select(["doc_id", "page_index", "width", "height"]).to_pydict()
            images = batch.column("image")  # each page's pixels read in place, not copied to bytes
            rows = []
            for i, row in enumerate(zip(cols["doc_id"], cols["page_index"], cols["width"], cols["height"])):
                if stop.is_set():  # seconds a page: a SIGTERM does not wait for the whole batch
                    break
                out, failure = self._page(*row, images[i].as_buffer())
                rows.extend(held.failed_on([out], failure) if failure else [*held.taken(), out])
            if rows:
                yield schema.batch(schema.RESULTS, rows)
            if stop.is_set():
                return  # what is held is redone by the next run
        rows = held.ended()
        if rows:
            yield schema.batch(schema.RESULTS, rows)

    def _page(self, doc_id: str, page_index: int, width: int, height: int, image) -> tuple[dict, str | None]:
        """The page's row, and why rapidocr failed on it (None where it read the page, or where
        the page itself is what it cannot take)."""
        start = time.perf_counter()
        try:
            pixels = np.frombuffer(image, dtype=np.uint8).reshape(height, width, 3)
            out = self.recognise(pixels)
        except TooNarrow as exc:
            return result(doc_id, page_index, finish_reason="error", error_type="engine_error",
                          error_message=f"page {page_index}: {exc}", latency_ms=_ms(start)), None
        except Exception as exc:  # noqa: BLE001 - one page's failure is that page's row
            failure = f"{type(exc).__name__}: {exc}"
            return result(doc_id, page_index, finish_reason="error", error_type="engine_error",
                          error_message=f"page {page_index}: rapidocr failed: {failure}",
                          latency_ms=_ms(start)), failure
        text, angle = out
        return result(doc_id, page_index, text=text, finish_reason="stop", skew_angle=angle,
                      latency_ms=_ms(start)), None

    def recognise(self, rgb: np.ndarray) -> tuple[str, float | None]:
        """OCR one RGB page image: its text (lines, blocks apart by a blank line) and
        its skew angle (None with deskew off).

        rapidocr's own steps (RapidOCR.__call__: preprocess, detect, recognise), with
        the page geometry between detection and recognition: a page lying sideways or
        upside down is turned and detected again; one that needs straightening or
        rescaling is warped once (the turn included) and detected again."""
        from rapidocr.main import RapidOCRError

        from batchocr import deskew  # OpenCV: imported by the engine, not by its options' check

        opts, ocr = self.options, self._ocr
        try:
            rgb, img, crops, det = self._detect_page(rgb)  # img: shrunk further if the budget asked for it
        except RapidOCRError:  # nothing detected
            return "", (0.0 if opts.deskew else None)
        turns = deskew.quarter_turns(det.boxes, self._upside_down(crops)) if opts.orient else 0
        if turns:  # detected again upright: reading order and the skew need the page's own boxes
            img = np.ascontiguousarray(np.rot90(img, turns))
            try:
                img, crops, det = self._detect(img)
            except RapidOCRError:
                return "", (upright.quarter_angle(turns) if opts.deskew else None)
        high = rgb.shape[turns % 2]  # the original's side that runs down the upright page
        angle, rotate, wanted = deskew.plan(det.boxes, img.shape, deskew=opts.deskew, rescale=opts.rescale,
                                            most=high / img.shape[0])
        scale = deskew.bound(wanted, rotate, img.shape, self.max_detector_pixels * FIT_MARGIN)
        angle_out = round(_half_turn(upright.quarter_angle(turns) + angle), 2) if opts.deskew else None
        if scale < wanted:
            self._bounded(f"rescaled by {scale:.2f}x rather than {wanted:.2f}x")
        if rotate or scale != 1.0:
            # from the original pixels (a page rapidocr shrank and we enlarge keeps its detail),
            # turned upright and straightened by one warp
            img = _bgr(deskew.warp(rgb, rotate - 90 * turns, scale * img.shape[0] / high))
            try:
                img, crops, det = self._detect(img)
            except RapidOCRError:
                return "", angle_out
            quads = det.boxes
        else:  # straight enough: only the boxes are turned, for reading order
            quads = deskew.turn(det.boxes, angle, img.shape)
        try:
            rec = ocr.recognize_txt(crops)
        except RapidOCRError:  # nothing recognised
            return "", angle_out
        kept = [(q, t) for q, t, s in zip(quads, rec.txts, rec.scores) if t.strip() and s >= opts.text_score]
        if not kept:
            return "", angle_out
        if opts.reading_order:
            return markdown(readingorder.read(readingorder.boxes_from_quads(*zip(*kept)))), angle_out
        return markdown(join_lines(*zip(*kept))), angle_out

    def _detect_page(self, rgb: np.ndarray) -> tuple[np.ndarray, np.ndarray, list[np.ndarray], Any]:
        """The first detection on a page: (the page, the image detected, the crops, rapidocr's
        result). rapidocr's detector misses short text alone on a large page (a heading, a
        page number: nothing found on the whole page, found on the same pixels cropped);
        where it finds nothing, it looks again at the page cut to its ink, and the page
        returned is that cut (a view of the original pixels). Raises RapidOCRError where
        nothing is found, at once where the page has no ink."""
        from rapidocr.main import RapidOCRError

        small = self._shrunk(rgb)
        try:
            return (rgb, *self._detect(small))
        except RapidOCRError:
            box = _inked(small)
            if box is None:
                raise
        (y0, y1, x0, x1), f = box, rgb.shape[0] / small.shape[0]
        rgb = rgb[int(y0 * f):math.ceil(y1 * f), int(x0 * f):math.ceil(x1 * f)]
        return (rgb, *self._detect(np.ascontiguousarray(small[y0:y1, x0:x1])))

    def _shrunk(self, rgb: np.ndarray) -> np.ndarray:
        """rapidocr's preprocessing (longest side at most 2000, Global.max_side_len) on the
        RGB page, then BGR (rapidocr's order, like OpenCV's) of the small image only: no
        full-size copy of a large page (resizing is per channel, so the pixels are the same)."""
        from rapidocr.utils.process_img import ResizeImgError, resize_image_within_bounds

        ocr = self._ocr
        try:
            return _bgr(resize_image_within_bounds(rgb, ocr.min_side_len, ocr.max_side_len)[0])
        except ResizeImgError:  # its shorter side rounded to 0 px (rapidocr raises it without a word)
            h, w = rgb.shape[:2]
            raise TooNarrow(f"the page ({w}x{h} px) is too narrow for rapidocr: its longest side is shrunk to "
                            f"{ocr.max_side_len:g} px, which leaves the shorter under 16 px (a ratio over about "
                            f"125:1); crop it, or split it into shorter pieces") from None

    def _upside_down(self, crops: list[np.ndarray]) -> list[bool | None]:
        """For each crop, whether rapidocr's line classifier reads it upside down: None for
        all but the deskew.ORIENT_LINES widest, and where the classifier is unsure (a score
        under its cls_thresh)."""
        from batchocr import deskew

        widest = sorted(range(len(crops)), key=lambda i: -crops[i].shape[1])[:deskew.ORIENT_LINES]
        classifier = self._ocr._load_cls_model()
        votes: list[bool | None] = [None] * len(crops)
        for i, (label, score) in zip(widest, classifier([crops[i] for i in widest]).cls_res):
            if score >= classifier.cls_thresh:
                votes[i] = "180" in label
        return votes

    def _detect(self, img: np.ndarray) -> tuple[np.ndarray, list[np.ndarray], Any]:
        """rapidocr's detect_and_crop, its input bounded to max_detector_pixels: an image
        too large is shrunk first, one the detector would enlarge past the bound (a
        narrow strip: the shorter side goes to 736 px) is enlarged less. Returns the
        image detected (boxes are in its pixels), the crops and rapidocr's result."""
        scale, limit = detector_fit(img.shape[:2], self.max_detector_pixels)
        if scale < 1.0 or limit < DET_SIDE:
            self._bounded(f"detected at {scale:.2f}x, shorter side enlarged to at most {limit} px")
        if scale < 1.0:
            import cv2

            img = cv2.resize(img, (max(1, round(img.shape[1] * scale)), max(1, round(img.shape[0] * scale))),
                             interpolation=cv2.INTER_AREA)
        det_model = self._ocr._load_det_model()  # per call, the detector reads its limit_side_len
        default, det_model.limit_side_len = det_model.limit_side_len, limit
        try:
            return (img, *self._ocr.detect_and_crop(img, {"preprocess": {"ratio_h": 1.0, "ratio_w": 1.0}}))
        finally:
            det_model.limit_side_len = default

    def _bounded(self, what: str) -> None:
        """Say once per engine that the memory budget made a page smaller than wanted."""
        if not self._capped:
            self._capped = True
            log.warning("rapidocr: a page needs more than memory_mb %d (detector input over %d pixels): %s; "
                        "such pages are read at the largest size that fits", self.options.memory_mb,
                        self.max_detector_pixels, what)

    def describe(self) -> dict[str, Any]:
        import onnxruntime
        import rapidocr

        return {
            "threads": self.threads,
            "orient": self.options.orient,
            "text_score": self.options.text_score,
            "reading_order": self.options.reading_order,
            "deskew": self.options.deskew,
            "rescale": self.options.rescale,
            "memory_mb": self.options.memory_mb,
            "max_detector_pixels": self.max_detector_pixels,
            "rapidocr": getattr(rapidocr, "__version__", None) or _dist_version("rapidocr"),
            "onnxruntime": onnxruntime.__version__,
        }

    def close(self) -> None:
        self._ocr = None


class TooNarrow(Exception):
    """A page rapidocr cannot take: the message says why and what to do."""


def max_detector_pixels(memory_mb: int) -> int:
    """The largest detector input (pixels) a page's work of `memory_mb` MB allows."""
    return int((memory_mb - BASE_MB) * 2**20 / BYTES_PER_DETECTOR_PIXEL)


def detector_input(h: int, w: int, limit: int = DET_SIDE) -> tuple[int, int]:
    """The (height, width) of the tensor rapidocr's detector makes of an h x w image
    (rapidocr 3: detect_and_crop's apply_vertical_padding, then DetPreProcess.resize
    with limit_type min): padded to a quarter of its width if wider than 8:1 or at
    most 30 px high, its shorter side enlarged to `limit`, sides rounded to 32."""
    h = _padded(h, w)
    ratio = limit / min(h, w) if min(h, w) < limit else 1.0
    return round(int(h * ratio) / 32) * 32, round(int(w * ratio) / 32) * 32


def detector_fit(shape: tuple[int, int], max_pixels: int) -> tuple[float, int]:
    """(scale for the image, the detector's limit_side_len) that keep the detector's
    input for an image of `shape` at most `max_pixels`: the image shrunk, or, where
    the detector would enlarge it, enlarged less. (1.0, DET_SIDE) when it fits."""
    h, w = shape
    scale, limit = 1.0, DET_SIDE
    for _ in range(50):
        sh, sw = max(1, round(h * scale)), max(1, round(w * scale))
        dh, dw = detector_input(sh, sw, limit)
        if dh * dw <= max_pixels or limit <= 32:
            return scale, limit
        shrink = min(0.99, math.sqrt(max_pixels / (dh * dw)))
        if min(_padded(sh, sw), sw) < limit:  # the detector enlarges it: enlarge less
            limit = max(32, int(limit * shrink))
        else:
            scale *= shrink
    return scale, limit


def _padded(h: int, w: int) -> int:
    """The image's height after rapidocr's apply_vertical_padding (width_height_ratio 8, min_height 30)."""
    if h <= 30 or w / h > 8:
        return h + 2 * int(abs(max(int(w / 8), 30) * 2 - h) / 2)
    return h


def _inked(img: np.ndarray) -> tuple[int, int, int, int] | None:
    """(top, bottom, left, right) of the pixels darker than mid-grey in `img`, with INK_MARGIN
    around, within the image; None where there are none, or where they span most of it (a
    dark or noisy page: the cut would be the page again)."""
    ink = img.min(axis=2) < 128
    rows, cols = np.flatnonzero(ink.any(axis=1)), np.flatnonzero(ink.any(axis=0))
    if not len(rows):
        return None
    h, w = img.shape[:2]
    y0, y1 = max(rows[0] - INK_MARGIN, 0), min(rows[-1] + 1 + INK_MARGIN, h)
    x0, x1 = max(cols[0] - INK_MARGIN, 0), min(cols[-1] + 1 + INK_MARGIN, w)
    if (y1 - y0) * (x1 - x0) > INK_MOST * h * w:
        return None
    return int(y0), int(y1), int(x0), int(x1)


def _half_turn(angle: float) -> float:
    """`angle` in degrees, brought into (-180, 180]."""
    return 180.0 - (180.0 - angle) % 360.0


def _bgr(rgb: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(rgb[:, :, ::-1])


def markdown(text: str) -> str:
    """The page's plain lines as Markdown (the text format of every engine): each line
    escaped so that it renders as it was read ("*fsolve" is no emphasis, "<lazy>" no tag);
    the blank lines between blocks stay."""
    return "\n".join(map(mdescape.escape, text.split("\n")))


def join_lines(boxes, texts) -> str:
    """Join recognised boxes into lines: boxes whose vertical extents overlap by more
    than half the smaller height are one line (a receipt's "Total ... 12.00"), read
    left to right; lines top to bottom."""
    items = []
    for box, text in zip(boxes, texts):
        ys = [p[1] for p in box]
        xs = [p[0] for p in box]
        items.append((min(ys), max(ys), min(xs), text))
    items.sort(key=lambda it: (it[0] + it[1]) / 2)
    lines: list[list[tuple]] = []
    for item in items:
        if lines:
            top, bottom = min(i[0] for i in lines[-1]), max(i[1] for i in lines[-1])
            overlap = min(bottom, item[1]) - max(top, item[0])
            if overlap > 0.5 * min(bottom - top, item[1] - item[0]):
                lines[-1].append(item)
                continue
        lines.append([item])
    return "\n".join(" ".join(i[3] for i in sorted(line, key=lambda i: i[2])) for line in lines)


def _ms(start: float) -> float:
    return (time.perf_counter() - start) * 1000


def _dist_version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


def create(options: Mapping[str, Any]) -> RapidOCREngine:
    return RapidOCREngine(parse_options(RapidOCROptions, options, "rapidocr"))


def settings(options: Mapping[str, Any]) -> dict[str, Any]:
    """What OUT remembers of this engine, without building it (engines.settings): the
    model named as RapidOCREngine names it, from rapidocr's default config (the
    options set none of its keys); no model is loaded."""
    from rapidocr.main import DEFAULT_CFG_PATH
    from rapidocr.utils.parse_parameters import ParseParams

    parse_options(RapidOCROptions, options, "rapidocr")
    return {"model": _model(ParseParams.load(DEFAULT_CFG_PATH))}


# onnxruntime's intra-op threads poll for work between operators by default, a core each.
# A page's OCR is many short operators, and the polling between them is CPU that the render
# workers, the other parts and whatever else shares the machine wait for.
SPINNING = "session.intra_op.allow_spinning"
_LOADING = threading.Lock()


# rapidocr's loaders (it loads each model on its first use) and what each sets on the instance.
LOADERS = {"_load_det_model": "text_det", "_load_cls_model": "text_cls", "_load_rec_model": "text_rec"}


def _without_spinning(ocr) -> None:
    """This RapidOCR's models, when it loads them, get onnxruntime sessions with SPINNING off:
    its loaders are wrapped on the instance (rapidocr and batchocr both call them through it).
    rapidocr passes no session config entries through its settings, so its own session-options
    builder is wrapped while a model loads (hand-written: nothing else reaches the entry short of
    building the sessions and rapidocr's model choice ourselves). A rapidocr without those
    loaders or that builder loads its models as it would. Loading stays lazy: a run whose pages
    all come from the text layer loads none."""
    from rapidocr.inference_engine.onnxruntime.main import OrtInferSession

    build = OrtInferSession.__dict__.get("_init_sess_opts")
    if not isinstance(build, staticmethod):
        return

    def without_spinning(cfg):
        opts = build.__func__(cfg)
        opts.add_session_config_entry(SPINNING, "0")
        return opts

    def wrapped(load, attr):
        def load_without_spinning():
            if (model := getattr(ocr, attr, None)) is not None:
                return model
            with _LOADING:
                OrtInferSession._init_sess_opts = staticmethod(without_spinning)
                try:
                    return load()
                finally:
                    OrtInferSession._init_sess_opts = build
        return load_without_spinning

    for name, attr in LOADERS.items():
        if (load := getattr(ocr, name, None)) is not None:
            setattr(ocr, name, wrapped(load, attr))


def _model(cfg) -> str:
    """The table's `model` for a rapidocr configuration (the engine's, or rapidocr's default)."""
    return "rapidocr {} det-{} rec-{}".format(
        *(getattr(v, "value", v) for v in (cfg.Det.ocr_version, cfg.Det.model_type, cfg.Rec.model_type)))


def shared(options: Mapping[str, Any], n: int) -> dict[str, Any]:
    """One of n processes on this machine (a shard's parts): 1/n of its onnxruntime threads
    (threads 0, one per core, is the machine's), so that n parts do not oversubscribe it."""
    o = parse_options(RapidOCROptions, options, "rapidocr")
    return {**options, "threads": max(1, (o.threads or available_cpus()) // n)}


ENGINE = EngineType(name="rapidocr", options=RapidOCROptions, create=create, settings=settings, shared=shared)

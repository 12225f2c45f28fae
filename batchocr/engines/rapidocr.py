"""The embedded CPU engine: rapidocr (PP-OCR ONNX models shipped inside its wheel).

Nothing is downloaded and nothing is sent anywhere: onnxruntime's telemetry is
switched off before onnxruntime is imported.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Annotated, Any, Iterator, Mapping

import numpy as np
import pyarrow as pa
from annotated_types import Ge, Le

from batchocr import deskew, readingorder, schema
from batchocr.config import FORBID
from batchocr.cpus import available_cpus
from batchocr.engines import parse_options, result
from batchocr.schema import Needs


@dataclass(frozen=True)
class RapidOCROptions:
    __pydantic_config__ = FORBID  # typed by batchocr.config, like all configuration
    # onnxruntime intra-op threads; 0 = one per CPU core.
    threads: Annotated[int, Ge(0)] = 0
    # The text-orientation classifier flips upright lines (CER 0.29 vs 0.0001
    # without it on an upright page); turn on only for rotated scans.
    use_cls: bool = False
    # Recognised lines scoring below this are dropped.
    text_score: Annotated[float, Ge(0), Le(1)] = 0.5
    # Read the detected lines column by column, block by block (batchocr/readingorder.py);
    # off: rows across the whole page, left to right, as rapidocr returns them.
    reading_order: bool = True
    # Straighten pages skewed by more than 0.5 degree before recognition (batchocr/deskew.py).
    deskew: bool = True
    # Rescale pages whose text is too small or too large for the detector to its
    # preferred height (batchocr/deskew.py: TEXT_HEIGHT_RANGE).
    rescale: bool = True


class RapidOCREngine:
    name = "rapidocr"
    needs = Needs(image=True, text_layer=False)

    def __init__(self, options: RapidOCROptions):
        self.options = options
        import onnxruntime  # telemetry off: see batchocr/__init__.py
        from rapidocr import RapidOCR

        onnxruntime.disable_telemetry_events()

        threads = options.threads or available_cpus()
        self._ocr = RapidOCR(
            params={
                "Global.use_cls": options.use_cls,
                "Global.text_score": options.text_score,
                "Global.log_level": "warning",
                "EngineConfig.onnxruntime.intra_op_num_threads": threads,
                "EngineConfig.onnxruntime.inter_op_num_threads": 1,
            }
        )
        cfg = self._ocr.cfg
        self.model = "rapidocr {} det-{} rec-{}".format(
            *(getattr(v, "value", v) for v in (cfg.Det.ocr_version, cfg.Det.model_type, cfg.Rec.model_type))
        )

    def run(self, pages: Iterator[pa.RecordBatch], stop: threading.Event | None = None) -> Iterator[pa.RecordBatch]:
        stop = stop or threading.Event()
        for batch in pages:
            cols = batch.select(["doc_id", "page_index", "width", "height", "image"]).to_pydict()
            rows = []
            for row in zip(cols["doc_id"], cols["page_index"], cols["width"], cols["height"], cols["image"]):
                if stop.is_set():  # seconds a page: a SIGTERM does not wait for the whole batch
                    break
                rows.append(self._page(*row))
            yield schema.batch(schema.RESULTS, rows)

    def _page(self, doc_id: str, page_index: int, width: int, height: int, image: bytes) -> dict:
        start = time.perf_counter()
        try:
            pixels = np.frombuffer(image, dtype=np.uint8).reshape(height, width, 3)
            out = self.recognise(pixels)
        except Exception as exc:  # noqa: BLE001 - one page's failure is that page's row
            return result(
                doc_id, page_index, finish_reason="error", error_type="engine_error",
                error_message=f"page {page_index}: rapidocr failed: {type(exc).__name__}: {exc}",
                latency_ms=_ms(start),
            )
        text, angle = out
        return result(doc_id, page_index, text=text, finish_reason="stop", skew_angle=angle, latency_ms=_ms(start))

    def recognise(self, rgb: np.ndarray) -> tuple[str, float | None]:
        """OCR one RGB page image: its text (lines, blocks apart by a blank line) and
        its skew angle (None with deskew off).

        rapidocr's own steps (RapidOCR.__call__: preprocess, detect, recognise), with
        the page geometry between detection and recognition: a page that needs
        straightening or rescaling is warped once and detected again."""
        from rapidocr.main import RapidOCRError

        opts, ocr = self.options, self._ocr
        bgr = np.ascontiguousarray(rgb[:, :, ::-1])  # rapidocr wants BGR, like OpenCV
        img, op = ocr.preprocess_img(bgr)  # longest side at most 2000 (Global.max_side_len)
        try:
            crops, det = ocr.detect_and_crop(img, op)
        except RapidOCRError:  # nothing detected
            return "", (0.0 if opts.deskew else None)
        angle, rotate, scale = deskew.plan(det.boxes, img.shape, deskew=opts.deskew, rescale=opts.rescale,
                                           most=bgr.shape[0] / img.shape[0])
        angle_out = round(angle, 2) if opts.deskew else None
        if rotate or scale != 1.0:
            # from the original pixels: a page rapidocr shrank and we enlarge keeps its detail
            img = deskew.warp(bgr, rotate, scale * img.shape[0] / bgr.shape[0])
            try:
                crops, det = ocr.detect_and_crop(img, {"preprocess": {"ratio_h": 1.0, "ratio_w": 1.0}})
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
            return readingorder.read(readingorder.boxes_from_quads(*zip(*kept))), angle_out
        return join_lines(*zip(*kept)), angle_out

    def describe(self) -> dict[str, Any]:
        import onnxruntime
        import rapidocr

        return {
            "threads": self.options.threads,
            "use_cls": self.options.use_cls,
            "text_score": self.options.text_score,
            "reading_order": self.options.reading_order,
            "deskew": self.options.deskew,
            "rescale": self.options.rescale,
            "rapidocr": getattr(rapidocr, "__version__", None) or _dist_version("rapidocr"),
            "onnxruntime": onnxruntime.__version__,
        }

    def close(self) -> None:
        self._ocr = None


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
    cfg = ParseParams.load(DEFAULT_CFG_PATH)
    return {"model": "rapidocr {} det-{} rec-{}".format(
        *(getattr(v, "value", v) for v in (cfg.Det.ocr_version, cfg.Det.model_type, cfg.Rec.model_type)))}

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

from batchocr import schema
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
        return result(doc_id, page_index, text=out, finish_reason="stop", latency_ms=_ms(start))

    def recognise(self, rgb: np.ndarray) -> str:
        """OCR one RGB page image into text, one visual line per line."""
        out = self._ocr(np.ascontiguousarray(rgb[:, :, ::-1]))  # rapidocr wants BGR, like OpenCV
        if out.boxes is None or not out.txts:
            return ""
        return join_lines(out.boxes, out.txts)

    def describe(self) -> dict[str, Any]:
        import onnxruntime
        import rapidocr

        return {
            "threads": self.options.threads,
            "use_cls": self.options.use_cls,
            "text_score": self.options.text_score,
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

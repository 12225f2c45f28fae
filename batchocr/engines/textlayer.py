"""The PDF's own text layer, read by the render workers through PyMuPDF: instant
for born-digital pages. A page without one is `skipped`, with the reason."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Annotated, Any, Iterator, Mapping

import pyarrow as pa
import pymupdf
from annotated_types import Ge

from batchocr import schema
from batchocr.config import FORBID
from batchocr.layertext import DocumentText, page_markdown
from batchocr.engines import Engine, EngineType, parse_options, result
from batchocr.schema import Needs


def page_text(page: pymupdf.Page, document: DocumentText | None = None) -> str:
    """A PDF page's text layer, as this engine reads it (the render workers call it):
    Markdown in reading order (batchocr.layertext); document: what its document's
    pages share (one outline), made once a document."""
    return page_markdown(page, document)


@dataclass(frozen=True)
class TextLayerOptions:
    __pydantic_config__ = FORBID  # typed by batchocr.config, like all configuration
    # Pages whose text layer has fewer non-space characters than this are skipped.
    min_chars: Annotated[int, Ge(0)] = 1


class TextLayerEngine(Engine):
    name = "textlayer"
    needs = Needs(image=False, text_layer=True)

    def __init__(self, options: TextLayerOptions):
        self.options = options
        self.model = _model()

    def run(self, pages: Iterator[pa.RecordBatch], stop: threading.Event | None = None) -> Iterator[pa.RecordBatch]:
        for batch in pages:
            rows = []
            cols = batch.select(["doc_id", "page_index", "text_layer"]).to_pydict()
            for doc_id, index, text in zip(cols["doc_id"], cols["page_index"], cols["text_layer"]):
                text = (text or "").strip()
                if sum(not c.isspace() for c in text) >= self.options.min_chars:
                    rows.append(result(doc_id, index, text=text, finish_reason="stop", latency_ms=0.0))
                else:
                    rows.append(result(
                        doc_id, index, finish_reason="skipped", error_type="no_text_layer",
                        error_message="the page has no text layer (a scan?): run it with --engine rapidocr or vllm",
                        latency_ms=0.0,
                    ))
            yield schema.batch(schema.RESULTS, rows)

    def describe(self) -> dict[str, Any]:
        return {"min_chars": self.options.min_chars, "pymupdf": pymupdf.__version__}

    def close(self) -> None:
        pass


def create(options: Mapping[str, Any]) -> TextLayerEngine:
    return TextLayerEngine(parse_options(TextLayerOptions, options, "textlayer"))


# The text's form (batchocr.layertext): an OUT made with an earlier form (plain text;
# Markdown with page-by-page headings, unescaped) is not resumed with this one (producer.py).
TEXT_FORM = "markdown2"


def _model() -> str:
    return f"pymupdf-{pymupdf.__version__}+{TEXT_FORM}"


def settings(options: Mapping[str, Any]) -> dict[str, Any]:
    """What OUT remembers of this engine, without building it (engines.settings)."""
    parse_options(TextLayerOptions, options, "textlayer")
    return {"model": _model()}


ENGINE = EngineType(name="textlayer", options=TextLayerOptions, create=create, settings=settings)

"""Arrow schemas where stages meet: rendered pages, engine results, the page table."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pyarrow as pa

# A page's layout blocks (batchocr.grounding), in reading order: the block's kind as the
# model named it, its box [x1, y1, x2, y2] in the page image's pixels and as fractions
# 0-1 of the page, and its Markdown.
BLOCK = pa.struct([("type", pa.string()), ("box", pa.list_(pa.int32())), ("box_norm", pa.list_(pa.float32())),
                   ("text", pa.string())])
BLOCKS = pa.list_(BLOCK)

# The page table (OUT/pages/**.parquet): one row per page. README documents the
# same columns; a test keeps the two in step.
PAGE_TABLE_COLUMNS: list[tuple[str, pa.DataType, str]] = [
    ("doc_id", pa.string(), "stable id of the document: first 16 hex digits of SHA-256 of `source_uri`"),
    ("source_uri", pa.string(), "full URI of the document (`file:///…`, `az://…`; a signed URL without its signature); `%`, control characters and bytes that are not UTF-8 written `%XX` (see File names)"),
    ("source_etag", pa.string(), "the store's ETag of the document; on local disk `<size>-<mtime µs>`"),
    ("source_size", pa.int64(), "document size in bytes"),
    ("page_index", pa.int32(), "0-based page (or TIFF frame) number; -1 for a row about a document that could not be opened"),
    ("page_count", pa.int32(), "pages in the document; null when it could not be opened"),
    ("width", pa.int32(), "width of the rendered page image in pixels"),
    ("height", pa.int32(), "height of the rendered page image in pixels"),
    ("dpi", pa.float32(), "resolution the page was rendered at (image files: their own, after any downscaling)"),
    ("skew_angle", pa.float32(), "the page's estimated skew in degrees, counter-clockwise positive, in (-180, 180]; the `rapidocr` engine turns pages lying sideways (-90, 90) or upside down (180) upright and straightens pages skewed by 0.5 or more before recognition; for the `vllm` engine (`orient`) the quarter turn the page was found at and turned from before the model read it (0, -90, 90 or 180; no skew estimate); null for the textlayer engine and pages read from their text layer"),
    ("engine", pa.string(), "engine that produced the row: `rapidocr`, `textlayer` or `vllm`"),
    ("model", pa.string(), "model (or library version) the engine used"),
    ("text", pa.large_string(), "the page text as Markdown, in reading order, lines separated by `\\n` (see Text format); null on error rows"),
    ("blocks", BLOCKS, "the page's layout blocks in reading order, for models that locate them (the `deepseek-ocr` preset with a grounding prompt, `unlimited-ocr`): each its `type` as the model named it (`title`, `text`, `table`, `image`, ...), `box` [x1, y1, x2, y2] in the rendered page's pixels, `box_norm` the same as fractions 0-1 of the page, and its Markdown `text` (see Layout blocks); null for engines and prompts without layout"),
    ("finish_reason", pa.string(), "`stop` (read), `error` (see `error_type`), `skipped` (nothing to read, e.g. no text layer); VLM engines add `length` (hit max tokens) and `repetition` (looping output cut off)"),
    ("prompt_tokens", pa.int32(), "tokens in the prompt, image included (VLM engines; null otherwise)"),
    ("output_tokens", pa.int32(), "tokens generated for this page (VLM engines; null otherwise): every "
                                  "attempt's (a looping output's stopped tries too), and for a page read again "
                                  "after its document group failed, its share of the group's"),
    ("error_type", pa.string(), "short machine-readable reason when `finish_reason` is `error` or `skipped` (see Errors)"),
    ("error_message", pa.string(), "a sentence a person can act on; null when there was no error"),
    ("warning", pa.string(), "why the page's text may be incomplete: a page read from its text layer whose PDF maps glyphs to no character (`text layer: 3 glyphs the PDF does not map to characters (U+FFFD)`), and what MuPDF reported while repairing a damaged (truncated, corrupt) file (`MuPDF: ...`: the page was read but may be incomplete or blank); null for sound files (the messages of the router's own glyph trace, e.g. `FT_Get_Advance(...): invalid glyph index` on sound pdfTeX files, are dropped)"),
    ("attempts", pa.int32(), "engine attempts at this page: VLM retries of a looping output count (null for CPU engines); on a `timeout` or `renderer_crashed` row, render attempts (a rerun retries a page once: 2 is final)"),
    ("latency_ms", pa.float32(), "engine time for this page in milliseconds (render time not included)"),
    ("mode", pa.string(), "how the `vllm` engine read the page: `page` (alone), `document` (in one request with its neighbouring pages, the output split back on `<page>`), `fallback` (its document group's output did not split a part a page, hit the token limit, looped or was refused, so it was read again alone); null for other engines"),
    ("route", pa.string(), "where the page's text came from (see Routing): `textlayer` (the PDF's own text layer passed) or `model` (the run's engine); null for the textlayer engine and for error rows of unrendered pages"),
    ("route_score", pa.float32(), "quality of the page's text layer, 0 (none, or not to be trusted) to 1; `route: auto` takes the layer from 0.5"),
    ("route_reason", pa.string(), "why the page went to the model (`route` model): `text layer scored 0.41 < 0.5`, `unmapped glyphs (U+FFFD) in the text layer: 3`, `no text in the layer`, `an image file has no text layer`, `route: model`; null for a page read from its text layer, for the textlayer engine and for rows of a version before the column"),
    ("run_id", pa.string(), "the run that wrote the row (`OUT/_runs/<run_id>.json` describes it)"),
    ("shard", pa.int32(), "shard number of the document"),
    ("processed_at", pa.timestamp("us", tz="UTC"), "when the row was written"),
]


def _pandas_metadata(columns: list[tuple[str, pa.DataType, str]]) -> bytes:
    """The `pandas` key pyarrow reads when it converts to pandas: with it, pandas'
    plain read_parquet keeps int32 columns with nulls as Int32 (not float64)."""
    def kinds(t: pa.DataType) -> tuple[str, str, dict | None]:
        if pa.types.is_timestamp(t):
            return "datetimetz", f"datetime64[{t.unit}]", {"timezone": t.tz}
        if pa.types.is_integer(t) or pa.types.is_floating(t):
            name = t.to_pandas_dtype().__name__  # int32, float32, ...
            return name, name.capitalize() if pa.types.is_integer(t) else name, None  # Int32: nullable
        if pa.types.is_list(t):
            return "list[object]", "object", None  # what pyarrow itself writes for it
        return "unicode", "object", None
    return json.dumps({
        "index_columns": [], "column_indexes": [], "creator": {"library": "batchocr"}, "pandas_version": "2.2.0",
        "columns": [{"name": n, "field_name": n, "pandas_type": k[0], "numpy_type": k[1], "metadata": k[2]}
                    for n, t, _ in columns for k in [kinds(t)]],
    }).encode()


PAGE_TABLE = pa.schema([pa.field(n, t) for n, t, _ in PAGE_TABLE_COLUMNS],
                       metadata={b"pandas": _pandas_metadata(PAGE_TABLE_COLUMNS)})

def conform(table: pa.Table) -> pa.Table:
    """A page table in this version's schema: a column a part was written without
    (one added later) comes in as nulls; the rest are cast to their types."""
    n = table.num_rows
    return pa.table({f.name: table[f.name] if f.name in table.column_names else pa.nulls(n, f.type)
                     for f in PAGE_TABLE}).cast(PAGE_TABLE)


# Every `error_type` a row can carry (README's Errors table lists the same).
ERROR_TYPES = {
    "empty_file", "unreadable", "open_failed", "encrypted", "no_pages", "render_failed", "too_large",
    "timeout", "renderer_crashed", "engine_error", "no_text_layer", "rejected", "repetition",
    "document_split",
}

# What a render worker sends: page metadata, the page image and the PDF's text layer.
PAGES = pa.schema(
    [
        ("doc_id", pa.string()),
        ("source_uri", pa.string()),
        ("source_etag", pa.string()),
        ("source_size", pa.int64()),
        ("page_index", pa.int32()),
        ("page_count", pa.int32()),
        ("width", pa.int32()),
        ("height", pa.int32()),
        ("dpi", pa.float32()),
        # Raw 8-bit RGB pixels, row-major (height * width * 3 bytes); null if the
        # engine needs no image. Raw, because encoding PNG costs 25x the render.
        ("image", pa.large_binary()),
        ("text_layer", pa.large_string()),  # the PDF's own text; null if not asked for
        ("error_type", pa.string()),  # set when the page (or document) failed to render
        ("error_message", pa.string()),
        ("warning", pa.string()),  # MuPDF repaired the file (see the page table)
        ("route", pa.string()),  # textlayer | model; null if the run does not route (batchocr.router)
        ("route_score", pa.float32()),
        ("route_reason", pa.string()),  # why the page went to the model; null if it did not
        ("attempts", pa.int32()),  # a timeout/renderer_crashed row: 2 once it failed again on a rerun
        ("skew_angle", pa.float32()),  # Needs.upright: the turn the page lay at (upright.quarter_angle); else null
    ]
)

# What an engine yields: one row per page it was given, keyed by (doc_id, page_index).
RESULTS = pa.schema(
    [
        ("doc_id", pa.string()),
        ("page_index", pa.int32()),
        ("text", pa.large_string()),
        ("blocks", BLOCKS),  # engines that read the page's layout (batchocr.grounding); null otherwise
        ("finish_reason", pa.string()),
        ("prompt_tokens", pa.int32()),
        ("output_tokens", pa.int32()),
        ("error_type", pa.string()),
        ("error_message", pa.string()),
        ("attempts", pa.int32()),
        ("latency_ms", pa.float32()),
        ("mode", pa.string()),  # the vllm engine: page | document | fallback
        ("skew_angle", pa.float32()),  # engines that estimate it (rapidocr); null otherwise
    ]
)

# Page metadata carried from render to the table, joined with each engine result.
CARRIED = [
    "doc_id",
    "source_uri",
    "source_etag",
    "source_size",
    "page_index",
    "page_count",
    "width",
    "height",
    "dpi",
    "warning",
    "route",
    "route_score",
    "route_reason",
]


def batch(schema: pa.Schema, rows: list[dict]) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist(rows, schema=schema)


@dataclass(frozen=True)
class Needs:
    """What the engine reads from a page; render only that."""

    image: bool = True
    text_layer: bool = False
    # auto | model | textlayer: score each page's text layer and send the good
    # ones to the text layer, not the engine (batchocr.router); None: no routing.
    route: str | None = None
    # Pages lying sideways or upside down turned upright before the engine sees them, for an
    # engine that reads the image as it is: the orientation model's file (batchocr.upright,
    # found by the run's process); "": pages as they are rendered.
    upright: str = ""

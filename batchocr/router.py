"""Per-page routing by the quality of a PDF's own text layer.

A born-digital page already holds its text exactly: reading it again with a model
costs seconds of CPU or a share of a GPU for nothing. A text layer can also be
wrong: a font whose ToUnicode map is missing or wrong (extraction yields other
characters), an earlier OCR's invisible layer over a scan, text hidden under a
full-page image, or a page whose text is only inside a picture. Each page's
layer gets a score in [0, 1] (`score_page`); with `route: auto` a page scoring
at least MIN_SCORE takes its text from the layer (the textlayer engine's rows,
no image render), the rest go to the run's engine. So does, with `route: auto`, a
page whose layer has glyphs the PDF does not map to characters (U+FFFD: a math
font's symbols without a ToUnicode map, such as CMEX's summation sign): however
well the rest scores, the layer is known to have lost characters there, which the
model can read from the image. A page's `route_reason` says why it went to the
model (null for a page read from its layer).

The score is computed in the render worker, which has the page open anyway
(`route_page`, called by batchocr.render), so a routed page never costs an
image render. Nothing here knows any engine: the pipeline sends routed pages to
batchocr.engines.textlayer and the rest to whichever engine the run has.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import re
import unicodedata
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
import pymupdf

from batchocr.engines.textlayer import page_text
from batchocr.layerlines import layer_words
from batchocr.schema import Needs
from batchocr.spec import ROUTES

# A page whose layer scores at least this takes its text from it (route: auto).
MIN_SCORE = 0.5
# What MuPDF gives for a glyph the PDF maps to no character.
UNMAPPED = "\ufffd"
# A page whose layer has at least this share of U+FFFD goes to the model in auto mode; fewer
# (a reference card's one sum sign among 7,000 characters) keep the layer, whose warning says so.
UNMAPPED_SHARE = 0.01
# Dictionary words: a page's Latin words (3+ letters) known to the word list.
# At least this share of them gives full marks; fewer than MIN_WORDS of them: no verdict.
GOOD_WORD_SHARE = 0.6
MIN_WORDS = 8
LANGUAGES = ("en",)
# Images covering at least this share of the page: the layer must carry at least
# DENSE characters per square inch of page, or the page's text is in its images.
IMAGE_COVER = 0.3
DENSE = 4.0
# Text drawn as outlines (print-ready PDFs, brochures) is filled paths of a glyph's size, one a
# glyph, and no text layer. From OUTLINES of them on a page, they count against the layer as
# characters it does not hold: outlines / (outlines + the layer's characters) off its score.
# Sent to the model by mistake, a page costs its reading; kept by mistake, its text is lost.
OUTLINES = 50
GLYPH_PT = (40.0, 60.0)  # a filled path at most this high and wide (points) is glyph-sized

_WORD = re.compile(r"[^\W\d_]{3,}")
_SUBSET = re.compile(r"^[A-Z]{6}\+")


@dataclass(frozen=True)
class LayerScore:
    """What was measured on one page's text layer, and the score made of it."""

    chars: int  # non-space characters of the extracted text
    density: float  # of them, per square inch of page
    bad: float  # share that are U+FFFD, private-use, control or unassigned characters
    unmapped: float  # share of drawn characters whose font has no Unicode map
    words: float | None  # share of Latin words in the word list; None: too few to judge
    hidden: float  # share of drawn characters invisible (render mode 3, opacity 0) or under a later image
    image_cover: float  # share of the page's area covered by images
    outlines: float = 0.0  # glyph-sized filled paths, as a share of them and the layer's characters

    @property
    def score(self) -> float:
        if self.chars == 0:
            return 0.0
        factors = [max(0.0, 1 - 10 * self.bad), 1 - self.unmapped, 1 - self.hidden, 1 - self.outlines]
        if self.words is not None:
            factors.append(min(1.0, self.words / GOOD_WORD_SHARE))
        if self.image_cover >= IMAGE_COVER:
            factors.append(min(1.0, self.density / DENSE))
        return round(math.prod(factors), 4)


def score_page(page, text: str) -> LayerScore:
    """Score `text`, the layer as extracted from `page` (a pymupdf.Page of a PDF)."""
    visible = [c for c in text if not c.isspace()]
    rect = page.rect
    area_in2 = max(rect.width * rect.height / (72 * 72), 1e-6)
    log = page.get_bboxlog()
    images = [(i, _clip(bbox, rect)) for i, (kind, bbox) in enumerate(log) if "image" in kind]
    cover = min(1.0, sum(_area(b) for _, b in images) / max(_area(tuple(rect)), 1e-6))
    if not visible:
        return LayerScore(0, 0.0, 0.0, 0.0, None, 0.0, round(cover, 4))
    glyphs = sum(kind == "fill-path" and b[3] - b[1] <= GLYPH_PT[0] and b[2] - b[0] <= GLYPH_PT[1] for kind, b in log)

    unmapped_fonts = _unmapped_fonts(page)
    drawn = hidden = unmapped = 0
    for span in page.get_texttrace():
        n = len(span["chars"])
        drawn += n
        font = _SUBSET.sub("", span.get("font") or "")
        if font in unmapped_fonts:
            unmapped += n
        else:
            unmapped += sum(c[0] == 0xFFFD for c in span["chars"])
        if span["type"] == 3 or span.get("opacity", 1) == 0 or _under_image(span, images):
            hidden += n
    # The trace measures every glyph's advance, which MuPDF reports for glyphs a
    # subset font lacks ("FT_Get_Advance(...): invalid glyph index": 89 of 655 pages
    # of sound pdfTeX manuals) though the page reads and renders right. Those messages
    # are the scoring's, not the file's: dropped, so that `warning` stays null
    # (render.py keeps what MuPDF said before the scoring).
    pymupdf.TOOLS.mupdf_warnings(reset=True)
    drawn = max(drawn, 1)
    return LayerScore(
        chars=len(visible),
        density=round(len(visible) / area_in2, 3),
        bad=round(sum(map(_bad_char, visible)) / len(visible), 4),
        unmapped=round(min(1.0, unmapped / drawn), 4),
        words=_word_share(text),
        hidden=round(min(1.0, hidden / drawn), 4),
        image_cover=round(cover, 4),
        outlines=round(glyphs / (glyphs + len(visible)), 4) if glyphs >= OUTLINES else 0.0,
    )


def route_page(page, is_pdf: bool, mode: str, document=None) -> dict:
    """The render worker's part: {route, route_score, route_reason}, and the page's
    text layer when it takes its text from there (then no image is rendered)."""
    if not is_pdf:  # image files have no text layer
        return {"route": "model", "route_score": 0.0, "route_reason": "an image file has no text layer"}
    # Scored on the layer in content order: the same characters as the reading
    # order the textlayer engine keeps (page_text), at ~1/50 of its cost, which
    # only a routed page then pays. Not get_text(): it keeps glyphs page_text drops
    # (font size 0 over a scan), and such a page was routed to an empty layer.
    words = layer_words(page)
    s = score_page(page, words)
    reason = why_model(s, words.count(UNMAPPED), mode)
    row = {"route": "model" if reason else "textlayer", "route_score": s.score, "route_reason": reason}
    if not reason:
        row["text_layer"] = page_text(page, document)
    return row


def why_model(s: LayerScore, unmapped: int, mode: str) -> str | None:
    """Why the page goes to the model, or None: it takes its text from its layer.
    unmapped: the layer's U+FFFD characters."""
    if mode == "model":
        return "route: model"
    if s.chars == 0:
        return "no text in the layer"
    if mode == "textlayer":
        return None
    if unmapped >= UNMAPPED_SHARE * s.chars:  # a formula's sign or two: the layer, with a warning
        return f"unmapped glyphs (U+FFFD) in the text layer: {unmapped}"
    if s.score < MIN_SCORE:
        return f"text layer scored {s.score:g} < {MIN_SCORE:g}"  # 0.4999 is not "0.50 < 0.5"
    return None


def unmapped_warning(text: str) -> str | None:
    """The row's warning for a page read from its layer where the PDF maps glyphs to no character."""
    n = text.count(UNMAPPED)
    if not n:
        return None
    return f"text layer: {n} glyph{'s' if n > 1 else ''} the PDF does not map to characters (U+FFFD)"


def needs(engine_needs: Needs, mode: str) -> Needs:
    """What the render workers produce for a run: routing only for an engine that
    reads images (the textlayer engine reads every page's layer anyway)."""
    if mode not in ROUTES:
        raise ValueError(f"route must be one of {', '.join(ROUTES)}, got {mode!r}")
    if not engine_needs.image or engine_needs.text_layer:
        return engine_needs
    return dataclasses.replace(engine_needs, route=mode)


def split(batch: pa.RecordBatch) -> tuple[pa.RecordBatch | None, pa.RecordBatch]:
    """(pages routed to the text layer or None, the other pages) of a rendered batch."""
    routed = pc.fill_null(pc.equal(batch.column("route"), "textlayer"), False)
    if not pc.any(routed).as_py():
        return None, batch
    return batch.filter(routed), batch.filter(pc.invert(routed))


@functools.cache
def _dictionary() -> frozenset[str]:
    from spellchecker import SpellChecker

    words: set[str] = set()
    for language in LANGUAGES:
        words |= set(SpellChecker(language=language, distance=1).word_frequency.dictionary)
    return frozenset(words)


def _word_share(text: str) -> float | None:
    tokens = _WORD.findall(text)
    latin = [t for t in tokens if all(ord(c) < 0x250 for c in t)]
    if len(latin) < MIN_WORDS or len(latin) < len(tokens) / 2:
        return None  # too little Latin text to judge with a Latin word list
    known = _dictionary()
    return round(sum(t.lower() in known for t in latin) / len(latin), 4)


def _bad_char(c: str) -> bool:
    return c == "\ufffd" or unicodedata.category(c) in ("Co", "Cc", "Cn", "Cs")


def _unmapped_fonts(page) -> set[str]:
    """Composite fonts with an Identity encoding and no ToUnicode: their character
    codes are glyph ids, and nothing says which characters those glyphs are."""
    doc = page.parent
    out = set()
    for xref, _ext, kind, basefont, _name, encoding, *_ in page.get_fonts():
        if kind == "Type0" and encoding.startswith("Identity") and doc.xref_get_key(xref, "ToUnicode")[0] == "null":
            out.add(_SUBSET.sub("", basefont))
    return out


def _under_image(span: dict, images: list[tuple[int, tuple]]) -> bool:
    """An image drawn after the span covers most of it."""
    box = span["bbox"]
    area = _area(box)
    if area <= 0:
        return False
    for seq, img in images:
        if seq > span["seqno"] and _area(_intersect(box, img)) >= 0.9 * area:
            return True
    return False


def _clip(bbox, rect) -> tuple:
    return _intersect(tuple(bbox), tuple(rect))


def _intersect(a, b) -> tuple:
    return (max(a[0], b[0]), max(a[1], b[1]), min(a[2], b[2]), min(a[3], b[3]))


def _area(b) -> float:
    return max(0.0, b[2] - b[0]) * max(0.0, b[3] - b[1])

"""A PDF page's text layer as lines: each with its box, text, size, weight and
whether its font is a typewriter's, in the layer's own (content) order. What
layertext.py orders and outline.py and layerrows.py read."""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from dataclasses import dataclass

import pymupdf

# No PRESERVE_LIGATURES: MuPDF expands ﬁ into fi; no PRESERVE_WHITESPACE: tabs and
# no-break spaces come out as spaces.
FLAGS = pymupdf.TEXT_MEDIABOX_CLIP
# Ligatures a font maps to one code point anyway (no decomposition in its ToUnicode).
LIGATURES = str.maketrans({"\ufb00": "ff", "\ufb01": "fi", "\ufb02": "fl", "\ufb03": "ffi", "\ufb04": "ffl",
                           "\ufb05": "st", "\ufb06": "st"})
BOLD = 16
# What opens a list item: a bullet glyph, a dash or a star (a typewriter's line may open
# with a dash or star; a glyph's does not).
BULLET_GLYPHS = "•◦▪▫●○■□‣∙·–—"
BULLET_MARKS = BULLET_GLYPHS + "*-"
MONOSPACED = 8
# Typewriter fonts by name: TeX's (CMTT, LMMono, txtt, SFTT), the common system ones.
# Subset fonts rarely set the descriptor's FixedPitch flag, so the name decides too.
MONO_NAME = re.compile(r"mono|courier|cmtt|sftt|txtt|typewriter|consol|menlo|inconsolata|code", re.I)


@dataclass(frozen=True)
class Line:
    x0: float
    y0: float
    x1: float
    y1: float
    text: str
    size: float
    bold: bool
    block: int
    mono: bool = False


def page_lines(page: pymupdf.Page) -> list[Line]:
    """The page's layer lines, their boxes as the page is shown (a page rotated by its
    /Rotate reads across its shown width: its layer's boxes are turned with it)."""
    lines = layer_lines(page.get_textpage(flags=FLAGS))
    if not page.rotation:
        return lines
    matrix = page.rotation_matrix
    out = []
    for ln in lines:
        box = pymupdf.Rect(ln.x0, ln.y0, ln.x1, ln.y1) * matrix
        out.append(dataclasses.replace(ln, x0=box.x0, y0=box.y0, x1=box.x1, y1=box.y1))
    return out


def page_words(page: pymupdf.Page) -> list[tuple]:
    """The layer's words (PyMuPDF's tuples), their boxes as the page is shown."""
    words = page.get_text("words", flags=FLAGS)
    if not page.rotation:
        return words
    matrix = page.rotation_matrix
    return [(*(pymupdf.Rect(w[:4]) * matrix), *w[4:]) for w in words]


def layer_lines(textpage: pymupdf.TextPage) -> list[Line]:
    """The layer's lines with text, in its own (content) order; a line's size, weight
    and font kind are those of most of its characters."""
    out = []
    for bno, block in enumerate(textpage.extractDICT()["blocks"]):
        for line in block.get("lines", ()):
            spans = [s for s in line["spans"] if s["text"].strip()]
            if not spans:
                continue
            text = " ".join("".join(s["text"] for s in line["spans"]).translate(LIGATURES).split())
            chars: Counter = Counter()
            mono = 0
            for s in spans:
                n = len(s["text"].strip())
                chars[(round(s["size"] * 2) / 2, bool(s["flags"] & BOLD))] += n
                if s["flags"] & MONOSPACED or MONO_NAME.search(s["font"]):
                    mono += n
            (size, bold), total = chars.most_common(1)[0]
            x0, y0, x1, y1 = line["bbox"]
            out.append(Line(x0, y0, x1, y1, text, size, bold and all(s["flags"] & BOLD for s in spans), bno,
                            mono * 2 > sum(chars.values())))
    return out


def layer_words(page: pymupdf.Page) -> str:
    """The characters page_markdown reads, in content order, at a fraction of its cost
    (what the router scores): PyMuPDF's words drop the glyphs its dict does, those
    whose box is empty or off the page (font size 0, a singular text matrix, a
    MediaBox too large for floats), which its plain text keeps."""
    return " ".join(w[4] for w in page.get_text("words", flags=FLAGS)).translate(LIGATURES)


def beside(a: Line, b: Line) -> bool:
    return b.x0 > a.x1 or a.x0 > b.x1


def level(a: Line, b: Line) -> bool:
    """On one row: more than half the lower line's height in common (the boxes of
    lines one below the other overlap a little, ascenders over descenders)."""
    return min(a.y1, b.y1) - max(a.y0, b.y0) > 0.5 * min(a.y1 - a.y0, b.y1 - b.y0)

"""A PDF page's text layer as Markdown, in reading order (the textlayer engine's
text, and the router's for the pages it routes to the layer).

Order. A PDF's content stream holds its text in the order the producer wrote it:
for TeX, word processors and most tools that is the reading order, column after
column, and the only order that reads a title page or a centred block right.
Some producers write a page row by row, or paragraph by paragraph, across its
columns; geometry alone gets other pages wrong (a title left and a subtitle right
are two "columns"; a key-value list's keys and values too). So the layer's own
order is kept unless it keeps going back across a gutter: readingorder.py (the
CPU engine's column finder) lays the layer's lines out in text columns, and when
the layer returns from a column to a line of prose in an earlier one, on another
row, more than a few times, the page is read in that geometric order. Measured
on pdfTeX manuals and reference cards and generated pages against pymupdf4llm's
own Markdown (its layout and legacy modes, shipped inside PyMuPDF 2): bench/textlayer.py,
docs/BENCHMARKS.md.

Markdown. Headings from font size (larger than the page's body text, bold or
much larger; a bold line opening a block at body size is the lowest level),
levels by size; bullets as list items; ruled tables (PyMuPDF's find_tables, only
on pages drawn with a grid of rules: it costs 0.2-1 s a page) as Markdown tables
whose cells hold the layer's lines; a blank line between the layer's blocks.
Ligatures are expanded and every run of spaces is one space.
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from dataclasses import dataclass

import pymupdf

from batchocr import readingorder

# No PRESERVE_LIGATURES: MuPDF expands ﬁ into fi; no PRESERVE_WHITESPACE: tabs and
# no-break spaces come out as spaces.
FLAGS = pymupdf.TEXT_MEDIABOX_CLIP
# Ligatures a font maps to one code point anyway (no decomposition in its ToUnicode).
LIGATURES = str.maketrans({"\ufb00": "ff", "\ufb01": "fi", "\ufb02": "fl", "\ufb03": "ffi", "\ufb04": "ffl",
                           "\ufb05": "st", "\ufb06": "st"})
# A heading's text is this many times the body's size, and bold, or HEADING_BIG times it.
HEADING = 1.15
HEADING_BIG = 1.3
HEADING_CHARS = 120
RUN_IN_CHARS = 60
MAX_LEVEL = 4
# The layer's order is kept unless it goes back across a gutter to an earlier block
# of the columns' order at least this many times, and for this share of the blocks
# (row by row across two columns: once a row; paragraph by paragraph: once a pair).
RETURNS = 2
RETURN_SHARE = 0.25
# A line this long is prose (a key-value list's keys are shorter).
PROSE = 25
BULLET = re.compile(r"^[•◦▪▫●○■□‣∙·–—*-]\s+")
BOLD = 16


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


def page_markdown(page: pymupdf.Page) -> str:
    """The page's text layer as Markdown in reading order ('' for a page without one)."""
    textpage = page.get_textpage(flags=FLAGS)
    lines = layer_lines(textpage)
    if not lines:
        return ""
    tables = _tables(page, lines)
    if tables:
        lines = [ln for ln in lines if not any(_inside(ln, box) for box, _ in tables)]
    ordered = reading_order(lines)
    return _markdown(ordered, tables)


def layer_words(page: pymupdf.Page) -> str:
    """The characters page_markdown reads, in content order, at a fraction of its cost
    (what the router scores): PyMuPDF's words drop the glyphs its dict does, those
    whose box is empty or off the page (font size 0, a singular text matrix, a
    MediaBox too large for floats), which its plain text keeps."""
    return " ".join(w[4] for w in page.get_text("words", flags=FLAGS)).translate(LIGATURES)


def layer_lines(textpage: pymupdf.TextPage) -> list[Line]:
    """The layer's lines with text, in its own (content) order; a line's size and
    weight are those of most of its characters."""
    out = []
    for bno, block in enumerate(textpage.extractDICT()["blocks"]):
        for line in block.get("lines", ()):
            spans = [s for s in line["spans"] if s["text"].strip()]
            if not spans:
                continue
            text = " ".join("".join(s["text"] for s in line["spans"]).translate(LIGATURES).split())
            chars = Counter()
            for s in spans:
                chars[(round(s["size"] * 2) / 2, bool(s["flags"] & BOLD))] += len(s["text"].strip())
            (size, bold), _ = chars.most_common(1)[0]
            x0, y0, x1, y1 = line["bbox"]
            out.append(Line(x0, y0, x1, y1, text, size, bold and all(s["flags"] & BOLD for s in spans), bno))
    return out


def reading_order(lines: list[Line]) -> list[Line]:
    """The layer's order, unless it reads across the page's columns (see the module's doc)."""
    if not _side_by_side(lines):  # one line after another down the page: nothing to interleave
        return lines
    boxes = [readingorder.Box(ln.x0, ln.y0, ln.x1, ln.y1, ln.text) for ln in lines]
    geometric, cuts = readingorder.layout(boxes)
    if not cuts:  # no text columns side by side (a table, a key-value list): as the layer reads
        return lines
    where = {id(b): k for k, block in enumerate(geometric) for row in block for b in row}
    block_of = [where[id(b)] for b in boxes]
    # returns: the layer goes back to an earlier block of the geometric order, to a line
    # of prose in a column beside the line it left, on another row (a key after its
    # value, a label right of a line: short lines, or the same row)
    returns = sum(b < a and len(lb.text) >= PROSE and _beside(la, lb) and not _level(la, lb)
                  for a, b, la, lb in zip(block_of, block_of[1:], lines, lines[1:]))
    if returns < max(RETURNS, len(geometric) * RETURN_SHARE):
        return lines
    line_of = {id(b): ln for b, ln in zip(boxes, lines)}
    return [dataclasses.replace(line_of[id(b)], block=k)
            for k, block in enumerate(geometric) for row in block for b in row]


def _side_by_side(lines: list[Line]) -> bool:
    """The layer's order jumps sideways between lines (not one line below another) more
    than once: it may read across columns (or a table, a key and its value)."""
    return sum(_beside(a, b) for a, b in zip(lines, lines[1:])) >= 2


def _beside(a: Line, b: Line) -> bool:
    return b.x0 > a.x1 or a.x0 > b.x1


def _level(a: Line, b: Line) -> bool:
    """On one row: more than half the lower line's height in common (the boxes of
    lines one below the other overlap a little, ascenders over descenders)."""
    return min(a.y1, b.y1) - max(a.y0, b.y0) > 0.5 * min(a.y1 - a.y0, b.y1 - b.y0)


def _inside(line: Line, box: pymupdf.Rect) -> bool:
    cx, cy = (line.x0 + line.x1) / 2, (line.y0 + line.y1) / 2
    return box.x0 <= cx <= box.x1 and box.y0 <= cy <= box.y1


def _tables(page: pymupdf.Page, lines: list[Line]) -> list[tuple[pymupdf.Rect, str]]:
    """Ruled tables as (box, Markdown); find_tables only where rules could make one.
    The rules are looked for only on a page with lines side by side on a few rows:
    walking a page's drawings costs time on pages drawn with many (a chart, a map)."""
    grouped = readingorder.rows([readingorder.Box(ln.x0, ln.y0, ln.x1, ln.y1, ln.text) for ln in lines])
    if sum(len(row) >= 2 for row in grouped) < 3:
        return []
    rows: set[int] = set()  # distinct heights of horizontal rules, distinct x of vertical ones
    cols: set[int] = set()
    for path in page.get_drawings():
        for item in path["items"]:
            if item[0] == "l":
                r = pymupdf.Rect(item[1], item[2]).normalize()
            elif item[0] == "re":
                r = pymupdf.Rect(item[1])
            else:
                continue
            if r.height < 2 and r.width > 10:
                rows.add(round(r.y0))
            elif r.width < 2 and r.height > 5:
                cols.add(round(r.x0))
            elif r.width > 10 and r.height > 5 and item[0] == "re":  # a cell's box
                rows |= {round(r.y0), round(r.y1)}
                cols |= {round(r.x0), round(r.x1)}
    if len(rows) < 3 or len(cols) < 3:  # a frame or a rule is no table
        return []
    out = []
    for table in page.find_tables(strategy="lines").tables:
        if table.row_count >= 2 and table.col_count >= 2:
            out.append((pymupdf.Rect(table.bbox), _table_markdown(table, lines)))
    return out


def _table_markdown(table, lines: list[Line]) -> str:
    """The table's cells filled with the layer's own lines (find_tables' cell text
    reorders characters of a cell now and then: "Part no." came out "Partno .")."""
    rows = []
    for row in table.rows:
        cells = []
        for cell in row.cells:
            box = pymupdf.Rect(cell) if cell else None
            text = " ".join(ln.text for ln in lines if box is not None and _inside(ln, box))
            cells.append(text.replace("|", "\\|"))
        rows.append("| " + " | ".join(cells) + " |")
    rows.insert(1, "|" + "---|" * len(table.rows[0].cells))
    return "\n".join(rows)


def _markdown(lines: list[Line], tables: list[tuple[pymupdf.Rect, str]]) -> str:
    body = _body_size(lines)
    levels = _heading_levels(lines, body)
    pending = sorted(tables, key=lambda t: (t[0].y0, t[0].x0))
    blocks: list[str] = []
    current: list[str] = []
    previous: Line | None = None
    heading: tuple[int, list[str], int] | None = None  # (level, texts, block)

    def flush() -> None:
        nonlocal current, heading
        if heading:
            blocks.append("#" * heading[0] + " " + " ".join(heading[1]))
            heading = None
        if current:
            blocks.append("\n".join(current))
            current = []

    lowest = min(max(levels.values(), default=0) + 1, MAX_LEVEL)
    for i, ln in enumerate(lines):
        while pending and pending[0][0].y1 <= ln.y0 and (previous is None or pending[0][0].y0 >= previous.y0):
            flush()
            blocks.append(pending.pop(0)[1])
        new_block = previous is None or ln.block != previous.block
        level = levels.get((ln.size, ln.bold)) if _heading_like(ln) else None
        if level is None and ln.bold and new_block and _run_in(ln) and _alone(lines, i):
            level = lowest  # a bold line of body size opening its block: a minor heading
        if level:
            if heading and heading[0] == level and heading[2] == ln.block:
                heading[1].append(ln.text)
            else:
                flush()
                heading = (level, [ln.text], ln.block)
        else:
            item = BULLET.match(ln.text)
            # list items stay one list, whatever blocks the layer put them in
            if heading or (new_block and not (item and current and current[0].startswith("- "))):
                flush()
            text = ln.text
            if item:
                text = BULLET.sub("- ", text)
            elif text.startswith("#"):
                text = "\\" + text  # not a heading of ours
            current.append(text)
        previous = ln
    flush()
    blocks += [markdown for _, markdown in pending]
    return "\n\n".join(blocks)


def _body_size(lines: list[Line]) -> float:
    sizes = Counter()
    for ln in lines:
        sizes[ln.size] += len(ln.text)
    return sizes.most_common(1)[0][0]


def _heading_like(ln: Line) -> bool:
    return len(ln.text) <= HEADING_CHARS and any(c.isalpha() for c in ln.text)


def _run_in(ln: Line) -> bool:
    return len(ln.text) <= RUN_IN_CHARS and any(c.isalpha() for c in ln.text) and ln.text[-1] not in ".,;"


def _alone(lines: list[Line], i: int) -> bool:
    """No line beside it on its row (a table's header cells are bold too)."""
    ln = lines[i]
    return not any(min(ln.y1, o.y1) - max(ln.y0, o.y0) > 0 for o in lines[max(0, i - 1): i + 2] if o is not ln)


def _heading_levels(lines: list[Line], body: float) -> dict[tuple[float, bool], int]:
    """(size, bold) of heading lines -> level: larger first, then bold before not."""
    styles = {(ln.size, ln.bold) for ln in lines if _heading_like(ln)
              and (ln.size >= HEADING_BIG * body or (ln.bold and ln.size >= HEADING * body))}
    ranked = sorted(styles, key=lambda s: (-s[0], not s[1]))
    return {style: min(k + 1, MAX_LEVEL) for k, style in enumerate(ranked)}

"""A PDF page's text layer as Markdown, in reading order (the textlayer engine's
text, and the router's for the pages it routes to the layer).

Order. A PDF's content stream holds its text in the order the producer wrote it:
for TeX, word processors and most tools that is the reading order, column after
column, and the only order that reads a title page, a centred block or a
reference card right (a card's command and its description sit side by side
in narrow columns: geometry reads such a page across its columns). So the
layer's own order is kept: always where the producer is one that writes the
reading order (TeX's engines and drivers, groff), and elsewhere unless it keeps
going back across a gutter between columns of prose: readingorder.py (the CPU
engine's column finder) lays the lines out in text columns, and when the layer
returns from a line of prose in one column to a line of prose in an earlier one,
on another row, more than a few times, the page is read in that geometric order.
Measured on real documents: docs/TEXTLAYER.md.

Markdown. Lines on one row become one row (layerrows.py: tables, code and
program output keep their rows); headings from the document's type styles
(outline.py: one outline per document); bullets as list items; ruled tables
(PyMuPDF's find_tables, only on pages drawn with a grid of rules: it costs
0.2-1 s a page) as Markdown tables whose cells hold the layer's lines; a blank
line between the layer's blocks. Ligatures are expanded and every run of spaces
is one space; text is escaped so that Markdown reads back its characters.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Callable

import pymupdf

from batchocr import layerrows, mdescape, readingorder
from batchocr.layerlines import BULLET_MARKS, LIGATURES, Line, beside, level, page_lines, page_words
from batchocr.layerrows import Block, Row
from batchocr.outline import Outline, sample

RUN_IN_CHARS = 60
# A ruled table's cell spanning down more rows than this is read row by row.
SPLIT_ROWS = 3
# The layer's order is kept unless it goes back across a gutter to an earlier block
# of the columns' order at least this many times, and for this share of the blocks
# (row by row across two columns: once a row; paragraph by paragraph: once a pair).
RETURNS = 2
RETURN_SHARE = 0.25
# A line this long is prose (a key-value list's keys, a card's commands are shorter).
PROSE = 25
BULLET = re.compile(f"^[{BULLET_MARKS}]\\s+")
# Producers (or creators) that write a page's text in its reading order.
READING_ORDER = re.compile(r"\b(la)?tex\b|pdftex|luatex|xetex|dvipdf|dvips|groff|\bptex|context", re.I)
# A heading that only numbers the next one ("Chapter 1", "2.3", "Part II"): one heading with it.
NUMBER = re.compile(r"^(?=.)(?i:chapter|part|appendix|section|lecture)?\s*(\d+|[IVXLC]+|[A-Z])?(\.\d+)*\.?$")


def writes_reading_order(metadata: dict | None) -> bool:
    """The document's producer writes its text in reading order (TeX and the like)."""
    meta = metadata or {}
    return bool(READING_ORDER.search(f"{meta.get('producer') or ''} {meta.get('creator') or ''}"))


class DocumentText:
    """What a document's pages share: whether its producer writes reading order, its
    outline, and the lines of the pages the outline sampled (read once)."""

    def __init__(self, pdoc: pymupdf.Document, skip: frozenset[int] = frozenset(),
                 at_page: Callable[[int], None] = lambda index: None):
        """skip: pages not to read (a run's pages already done); at_page(index) is called
        before a page is read (the render pool's watch: a page that hangs or crashes
        MuPDF while sampled costs that page, as when it is rendered)."""
        self.keeps_order = writes_reading_order(pdoc.metadata)
        self._lines: dict[int, list[Line]] = {}
        self.warnings: dict[int, str] = {}  # what MuPDF said reading a sampled page: that page's
        self._at_page = at_page
        sampled = sample(pdoc.page_count, lambda index: self._read(pdoc, index), skip)
        try:
            toc = pdoc.get_toc(simple=True)
        except Exception:  # noqa: BLE001 - a broken outline is no outline
            toc = []
        self.outline = Outline.of(sampled, toc)

    def _read(self, pdoc: pymupdf.Document, index: int) -> list[Line] | None:
        self._at_page(index)
        try:
            lines = page_lines(pdoc[index])
        except Exception:  # noqa: BLE001 - the page's own row says what is wrong with it
            return None
        finally:
            self.warnings[index] = pymupdf.TOOLS.mupdf_warnings(reset=True)
        self._lines[index] = lines
        return lines

    def lines(self, page: pymupdf.Page) -> list[Line]:
        cached = self._lines.pop(page.number, None)
        return cached if cached is not None else page_lines(page)


def document_markdown(pdoc: pymupdf.Document) -> list[str]:
    """Every page's Markdown, as a run reads the document."""
    document = DocumentText(pdoc)
    return [page_markdown(page, document) for page in pdoc]


def page_markdown(page: pymupdf.Page, document: DocumentText | None = None) -> str:
    """The page's text layer as Markdown in reading order ('' for a page without one).
    document: what the document's pages share; without it the page is its own document."""
    if document is None:
        lines = page_lines(page)
        keeps, outline = writes_reading_order(page.parent.metadata), Outline.of([lines])
    else:
        lines = document.lines(page)
        keeps, outline = document.keeps_order, document.outline
    if not lines:
        return ""
    tables = _tables(page, lines)
    if tables:
        lines = [ln for ln in lines if not any(_inside((ln.x0, ln.y0, ln.x1, ln.y1), box) for box, _ in tables)]
    ordered = lines if keeps else reading_order(lines)
    return _markdown(ordered, tables, outline)


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
    # returns: the layer goes back to an earlier block of the geometric order, to a
    # line of prose in a column beside the line it left, on another row (a key after
    # its value, a label right of a line: short lines, or the same row)
    returns = sum(b < a and len(lb.text) >= PROSE and beside(la, lb) and not level(la, lb)
                  for a, b, la, lb in zip(block_of, block_of[1:], lines, lines[1:]))
    if returns < max(RETURNS, len(geometric) * RETURN_SHARE):
        return lines
    line_of = {id(b): ln for b, ln in zip(boxes, lines)}
    return [dataclasses.replace(line_of[id(b)], block=k)
            for k, block in enumerate(geometric) for row in block for b in row]


def _side_by_side(lines: list[Line]) -> bool:
    """The layer's order jumps sideways between lines (not one line below another) more
    than once: it may read across columns (or a table, a key and its value)."""
    return sum(beside(a, b) for a, b in zip(lines, lines[1:])) >= 2


def _inside(bbox, box: pymupdf.Rect) -> bool:
    """The centre of bbox (x0, y0, x1, y1: a line's, a word's) is in box."""
    x0, y0, x1, y1 = bbox
    cx, cy = (x0 + x1) / 2, (y0 + y1) / 2
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
    words: list[tuple] | None = None
    for table in page.find_tables(strategy="lines").tables:
        if table.row_count >= 2 and table.col_count >= 2:
            words = page_words(page) if words is None else words
            out.append((pymupdf.Rect(table.bbox), _table_markdown(table, words)))
    return out


def _table_markdown(table, words: list[tuple]) -> str:
    """The table's cells filled with the layer's own words, in its order (find_tables'
    cell text reorders characters of a cell now and then: "Part no." came out
    "Partno ."; a layer's line may run across cells: a spreadsheet's). A cell is
    read row by row: a cell find_tables merges down several rows (a column whose
    rules it missed) gives each row the words on that row."""
    return layerrows.table([[" ".join(w[4] for w in words if box is not None and _inside(w[:4], box)).translate(LIGATURES)
                             for box in boxes] for boxes in _cell_boxes(table)])


def _cell_boxes(table) -> list[list[pymupdf.Rect | None]]:
    """Each row's cells as boxes. A cell spanning down more than SPLIT_ROWS rows is
    read row by row (a spreadsheet's column whose rules find_tables missed: each row
    gets the words within its height); a cell spanning fewer keeps its words."""
    lefts = [min((c[0] for r in table.rows if (c := r.cells[k])), default=None) for k in range(table.col_count)]
    tops = [r.bbox[1] for r in table.rows]
    split: dict[int, float] = {}  # column -> the bottom of a cell read row by row
    out = []
    for row in table.rows:
        present = [c for c in row.cells if c is not None]
        y0, y1 = max(c[1] for c in present), min(c[3] for c in present)  # a cell spanning down is taller
        boxes: list[pymupdf.Rect | None] = []
        for k, cell in enumerate(row.cells):
            if cell is not None:
                spans = sum(cell[1] <= top < cell[3] for top in tops)
                if spans > SPLIT_ROWS:
                    split[k] = cell[3]
                    boxes.append(pymupdf.Rect(cell[0], y0, cell[2], y1))
                else:
                    boxes.append(pymupdf.Rect(cell))
            elif lefts[k] is not None and split.get(k, 0) >= y1:
                right = next((x for x in lefts[k + 1:] if x is not None), table.bbox[2])
                boxes.append(pymupdf.Rect(lefts[k], y0, right, y1))
            else:  # within a cell merged across columns, or down fewer rows
                boxes.append(None)
        out.append(boxes)
    return out


def _markdown(lines: list[Line], tables: list[tuple[pymupdf.Rect, str]], outline: Outline) -> str:
    items = layerrows.blocks(layerrows.rows(lines), outline.body)
    pending = sorted(tables, key=lambda t: (t[0].y0, t[0].x0))
    blocks: list[str] = []
    current: list[str] = []
    previous: Line | None = None
    heading: tuple[int, list[str], int] | None = None  # (level, texts, block)

    def flush() -> None:
        nonlocal current, heading
        if heading:
            blocks.append("#" * outline.nest(heading[0]) + " " + mdescape.escape(" ".join(heading[1])))
            heading = None
        if current:
            blocks.append("\n".join(current))
            current = []

    for i, item in enumerate(items):
        first = item.rows[0].first if isinstance(item, Block) else item.first
        while pending and pending[0][0].y1 <= first.y0 and (previous is None or pending[0][0].y0 >= previous.y0):
            flush()
            blocks.append(pending.pop(0)[1])
        if isinstance(item, Block):
            flush()
            blocks.append(layerrows.markdown(item))
            previous = item.rows[-1].cells[-1]
            continue
        new_block = previous is None or first.block != previous.block
        level = _heading_level(item, outline, new_block)
        if level:
            if heading and (heading[2] == first.block and heading[0] == level or NUMBER.match(" ".join(heading[1]))):
                heading = (min(heading[0], level), heading[1] + [item.text], first.block)
            else:
                flush()
                heading = (level, [item.text], first.block)
        else:
            marker = BULLET.match(item.text)
            # list items stay one list, whatever blocks the layer put them in
            if heading or (new_block and not (marker and current and current[0].startswith("- "))):
                flush()
            current.append("- " + mdescape.escape(BULLET.sub("", item.text)) if marker else mdescape.escape(item.text))
        previous = item.cells[-1]
    flush()
    blocks += [markdown for _, markdown in pending]
    return "\n\n".join(blocks)


def _heading_level(row: Row, outline: Outline, new_block: bool) -> int | None:
    """The row's heading level: its style's in the outline; a bold line of body size
    opening its block, alone on its row, is a minor heading (a run-in title)."""
    style = dataclasses.replace(row.style, text=row.text)
    level = outline.level(style)
    if level is None and style.bold and new_block and len(row.cells) == 1 and _run_in(row.text):
        return outline.lowest
    return level


def _run_in(text: str) -> bool:
    return len(text) <= RUN_IN_CHARS and any(c.isalpha() for c in text) and text[-1] not in ".,;"

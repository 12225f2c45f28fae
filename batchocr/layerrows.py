"""Rows of a text layer kept as rows: lines the layer writes one after another on
one row (a table's cells, program output's columns, a card's command and its
description, a section's number and its title) become one row, in the order
the page is read.

A run of rows whose lines are all a typewriter's is code or program output: a
fenced block whose columns keep their places (the font's width places them). A
run of two or more rows of several cells each is a table: a Markdown table where
the columns are clear (as many cells a row, each column's cells left of the
next's), else aligned lines in a fenced block. A lone row of several cells is
one line."""

from __future__ import annotations

import dataclasses
import re
import statistics
from dataclasses import dataclass

from batchocr import mdescape
from batchocr.layerlines import BULLET_GLYPHS, BULLET_MARKS, Line, level

# A row's next cell starts at most this many line heights left of where the one
# before ends (a ligature's box, a kerned space), else it is on another row.
OVERLAP = 0.3
# Cells of one row share a size within this ratio (a title's small print beside it is not its cell).
SIZES = 1.25
LONE_BULLET = re.compile(f"^[{BULLET_MARKS}]$")
GLYPH_BULLET = re.compile(f"^[{BULLET_GLYPHS}]\\s")


@dataclass
class Row:
    cells: list[Line]

    @property
    def first(self) -> Line:
        return self.cells[0]

    @property
    def mono(self) -> bool:
        return all(c.mono for c in self.cells)

    @property
    def style(self) -> Line:
        """The cell whose style speaks for the row: its longest."""
        return max(self.cells, key=lambda c: len(c.text))

    @property
    def text(self) -> str:
        return " ".join(c.text for c in self.cells)


@dataclass
class Block:
    """Rows read as a block: "code" (typewriter lines), "table", "aligned"."""
    kind: str
    rows: list[Row]


def rows(lines: list[Line]) -> list[Row]:
    """Lines in reading order, those on one row one after another joined."""
    out: list[Row] = []
    for ln in lines:
        if out:
            last = out[-1].cells[-1]
            if (level(last, ln) and ln.x0 >= last.x1 - OVERLAP * (last.y1 - last.y0)
                    and max(last.size, ln.size) <= SIZES * min(last.size, ln.size)):
                if LONE_BULLET.match(last.text):  # a bullet and its item: one line, not two cells
                    out[-1].cells[-1] = dataclasses.replace(ln, x0=last.x0, text=f"{last.text} {ln.text}")
                else:
                    out[-1].cells.append(ln)
                continue
        out.append(Row([ln]))
    return out


def blocks(page_rows: list[Row], body: float) -> list[Row | Block]:
    """Rows, with runs of code and of table rows gathered into blocks."""
    out: list[Row | Block] = []
    i = 0
    while i < len(page_rows):
        row = page_rows[i]
        j = i
        if _code(row, body):
            while j < len(page_rows) and _code(page_rows[j], body):
                j += 1
            out.append(Block("code", page_rows[i:j]))
        elif len(row.cells) >= 2:
            while j < len(page_rows) and len(page_rows[j].cells) >= 2 and not _code(page_rows[j], body):
                j += 1
            if j - i >= 2:
                run = page_rows[i:j]
                out.append(Block("table" if _clear_columns(run) else "aligned", run))
            else:
                out.append(row)
                j = i + 1
        else:
            out.append(row)
            j = i + 1
        i = j
    return out


def _code(row: Row, body: float) -> bool:
    """Typewriter text at body size, not a list item of typewriter names (a bullet glyph first)."""
    return row.mono and (not body or row.style.size <= body * 1.15) and not GLYPH_BULLET.match(row.text)


def _clear_columns(run: list[Row]) -> bool:
    n = len(run[0].cells)
    if any(len(r.cells) != n for r in run):
        return False
    return all(max(r.cells[k].x1 for r in run) < min(r.cells[k + 1].x0 for r in run) for k in range(n - 1))


def table(rows: list[list[str]]) -> str:
    """A Markdown table of plain-text cells (escaped here), the first row its header."""
    lines = ["| " + " | ".join(mdescape.escape(c, cell=True) for c in row) + " |" for row in rows]
    lines.insert(1, "|" + "---|" * len(rows[0]))
    return "\n".join(lines)


def markdown(block: Block) -> str:
    """A block as Markdown: a table, or its rows' lines in a fence, placed by character."""
    if block.kind == "table":
        return table([[c.text for c in r.cells] for r in block.rows])
    cells = [c for r in block.rows for c in r.cells]
    width = statistics.median((c.x1 - c.x0) / max(len(c.text), 1) for c in cells) or 1.0
    left = min(c.x0 for c in cells)
    out = []
    for r in block.rows:
        line = ""
        for c in r.cells:
            column = round((c.x0 - left) / width)
            line += " " * max(column - len(line), 1 if line else 0) + c.text
        out.append(line.rstrip())
    fence = "```"
    while any(fence in line for line in out):
        fence += "`"
    return "\n".join([fence, *out, fence])

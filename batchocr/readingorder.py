"""Reading order for engines that find text lines but no layout (rapidocr).

Boxes in, text out: the page's detected text boxes are grouped into columns and
blocks, and read column by column, top to bottom, with a blank line between
blocks. Pure geometry (numpy), so any engine that returns boxes can use it.

The method is a recursive XY-cut that respects full-width lines:

1. the boxes are grouped into rows (vertical overlap, as a line of a receipt);
2. consecutive rows are gathered greedily into a run while the run's boxes,
   projected on the x axis, keep a vertical channel of white (a gutter) with a
   column-wide piece on either side. A row that crosses the channel (a heading
   or table spanning the columns, a full-width line) ends the run;
3. a run with a gutter is cut into its columns, each read (recursively) in
   turn; rows in no such run are read as they are, row after row. A run's last
   row that is a lone line a block gap under the rows above it, and nearer the
   row below that ended the run, is the heading of what follows: it is read
   with that, after the columns.

A gutter is kept only if every column it makes is "text-like": at least
MIN_COLUMN line heights wide, one or two boxes a line (a bullet), and, on
median, MIN_CHARS characters a line. A table's columns fail that (several short
cells a row, a key-value list's short lines), and a table's rows do not start where a text column does (its gap swallows
the gutter): a table is read row by row. The gap between a bullet and its text
is too narrow to count.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

# A gutter is at least this many median box heights wide ...
MIN_GUTTER = 0.6
# ... and leaves columns at least this many median box heights wide on each side,
MIN_COLUMN = 6.0
# whose lines hold, on median, at least this many characters (a key-value list's do not).
MIN_CHARS = 15
# Rows further apart than this many median box heights start a new block.
BLOCK_GAP = 0.9
# Text right of a gutter starting further than this many box heights from the
# column's left edge is not that column's (a table's cells).
ALIGN = 2.0
# Rows this many times the median box height are titles, not a column's first line.
TALL = 1.4
# Rows tried for a gutter to appear before a row is read as it is.
LOOKAHEAD = 3
# Projection resolution for the fast gutter test: cells of this many box heights.
CELL = 0.125


@dataclass(frozen=True)
class Box:
    x0: float
    y0: float
    x1: float
    y1: float
    text: str

    @property
    def height(self) -> float:
        return self.y1 - self.y0


def boxes_from_quads(quads: Iterable[Sequence[Sequence[float]]], texts: Iterable[str]) -> list[Box]:
    """Axis-aligned boxes from detector quadrilaterals (4 points each)."""
    out = []
    for quad, text in zip(quads, texts):
        q = np.asarray(quad, dtype=np.float64)
        out.append(Box(float(q[:, 0].min()), float(q[:, 1].min()), float(q[:, 0].max()), float(q[:, 1].max()), text))
    return out


def read(boxes: Sequence[Box]) -> str:
    """The page text in reading order: lines joined by newlines, blocks by a blank line."""
    return "\n\n".join("\n".join(block) for block in blocks(boxes))


def blocks(boxes: Sequence[Box]) -> list[list[str]]:
    """The page as blocks of lines, in reading order."""
    return [[_line(row) for row in block] for block in layout(boxes)[0]]


def layout(boxes: Sequence[Box]) -> tuple[list[list[list[Box]]], int]:
    """The page as blocks of rows of boxes, in reading order, and how many times it
    was cut into columns (0: read row by row down the page)."""
    boxes = [b for b in boxes if b.x1 > b.x0 and b.y1 > b.y0]
    if not boxes:
        return [], 0
    unit = float(np.median([b.height for b in boxes]))
    reader = _Reader(unit)
    return reader.split(boxes), reader.cuts


def rows(boxes: Sequence[Box]) -> list[list[Box]]:
    """Boxes grouped into rows: boxes whose vertical extents overlap by more than
    half the smaller height are one row (a receipt's "Total ... 12.00"), each row
    left to right, rows top to bottom."""
    out: list[list[Box]] = []
    extent: list[tuple[float, float]] = []
    for box in sorted(boxes, key=lambda b: (b.y0 + b.y1) / 2):
        if out:
            top, bottom = extent[-1]
            overlap = min(bottom, box.y1) - max(top, box.y0)
            if overlap > 0.5 * min(bottom - top, box.height):
                out[-1].append(box)
                extent[-1] = (min(top, box.y0), max(bottom, box.y1))
                continue
        out.append([box])
        extent.append((box.y0, box.y1))
    return [sorted(row, key=lambda b: b.x0) for row in out]


def _line(row: list[Box]) -> str:
    return " ".join(b.text for b in row)


class _Reader:
    def __init__(self, unit: float):
        self.unit = max(unit, 1.0)
        self.gutter = MIN_GUTTER * self.unit
        self.column = MIN_COLUMN * self.unit
        self.cell = CELL * self.unit
        self.cuts = 0

    def split(self, boxes: list[Box]) -> list[list[list[Box]]]:
        out: list[list[list[Box]]] = []
        flow: list[list[Box]] = []
        grouped = rows(boxes)
        x0 = min(b.x0 for b in boxes)
        width = max(b.x1 for b in boxes) - x0
        i = 0
        while i < len(grouped):
            j = self._run(grouped, i, x0, width)
            if i < j - 1 < len(grouped) - 1 and self._heads_next(grouped, j - 1):
                j -= 1  # the run's last row is the heading of what crosses the columns below
            pieces = self._columns([b for row in grouped[i:j] for b in row]) if j > i else None
            if pieces is None:
                flow.append(grouped[i])
                i += 1
                continue
            out += self._flow(flow)
            flow = []
            self.cuts += 1
            for piece in pieces:
                out += self.split(piece)
            i = j
        return out + self._flow(flow)

    def _run(self, grouped: list[list[Box]], i: int, x0: float, width: float) -> int:
        """The end (exclusive) of the longest run of rows from i that keeps a gutter;
        i when there is none. The gutter may need a few rows to appear (a left line
        alone, then a right one): LOOKAHEAD rows are tried for it, and the rows
        before it must each start a column (at its left edge, in body text height:
        not a centred title). Once it is there, a row whose text right of a gutter
        does not start at that column's left edge (a table's cells, whose wide gap
        the gutter fell into) ends the run."""
        occupied = np.zeros(int(width / self.cell) + 2, dtype=bool)
        end = i
        for j in range(i, len(grouped)):
            if end > i and not self._aligned(grouped[j], self._gutters(occupied), x0) \
                    and not self._realigned(grouped, i, j, self._gutters(occupied), x0):
                break
            for b in grouped[j]:
                occupied[int((b.x0 - x0) / self.cell): int(np.ceil((b.x1 - x0) / self.cell))] = True
            gutters = self._gutters(occupied)
            if gutters:
                if end == i and not all(self._starts_column(row, gutters, x0, occupied) for row in grouped[i:j]):
                    return i
                end = j + 1
            elif end > i or j - i + 1 >= LOOKAHEAD:
                break
        return end

    def _heads_next(self, grouped: list[list[Box]], k: int) -> bool:
        """Row k ends a run of columns and row k + 1 crosses them: k is the heading of what
        follows (a section across the page under two columns) when it is one line apart from
        the rows above it (a block gap) and nearer the row below. Read as a column's last
        line, it came out between the two columns (a real scanned product sheet)."""
        row, above, below = grouped[k], grouped[k - 1], grouped[k + 1]
        if len(row) != 1:
            return False
        gap_above = min(b.y0 for b in row) - max(b.y1 for b in above)
        gap_below = min(b.y0 for b in below) - max(b.y1 for b in row)
        return gap_above > BLOCK_GAP * self.unit and gap_below < gap_above

    def _aligned(self, row: list[Box], gutters: list[tuple[float, float]], x0: float) -> bool:
        limits = [start for start, _ in gutters[1:]] + [float("inf")]
        for (start, stop), limit in zip(gutters, limits):
            right = [b.x0 - x0 for b in row if start <= b.x0 - x0 < limit]  # this column's
            if right and abs(min(right) - stop) > ALIGN * self.unit:
                return False
        return True

    def _realigned(self, grouped: list[list[Box]], i: int, j: int, gutters: list[tuple[float, float]],
                   x0: float) -> bool:
        """Row j is off its column's left edge but a row right after it starts there again:
        a line within the column (a centred heading, an indented first line), not a
        table's cells below the columns (whose rows all start elsewhere). Ending the run
        there would cut the columns across at the row, as an XY-cut taking a white band
        across both columns before the gutter: their paragraphs came out alternating."""
        if not gutters:
            return False
        start, stop = gutters[0]
        moved = [b.x0 - x0 for b in grouped[j] if b.x0 - x0 > start]
        # or the column's edge is further left than the run's first line there said (an
        # indented first line), and the rows after start at the new edge too; not after
        # more than that one line of text (a table's cells above two columns start at their edge)
        seen = [b for row in grouped[i:j] for b in row if b.x0 - x0 > start]
        edge = min(moved) if (moved and len(seen) == 1 and len(seen[0].text) >= MIN_CHARS
                              and start + self.gutter <= min(moved) < stop - ALIGN * self.unit) else None
        for row in grouped[j + 1: j + LOOKAHEAD]:
            right = [b.x0 - x0 for b in row if b.x0 - x0 > start]
            if right and (self._aligned(row, gutters, x0) or (edge is not None and abs(min(right) - edge) <= ALIGN * self.unit)):
                return True
        return False

    def _starts_column(self, row: list[Box], gutters, x0: float, occupied: np.ndarray) -> bool:
        edges = [np.flatnonzero(occupied)[0] * self.cell] + [stop for _, stop in gutters]
        return all(b.height <= TALL * self.unit and min(abs(b.x0 - x0 - e) for e in edges) <= ALIGN * self.unit
                   for b in row)

    def _gutters(self, occupied: np.ndarray) -> list[tuple[float, float]]:
        """White channels (start, stop; px from the node's left) >= the minimal gutter,
        with >= a column's width of boxes on each side (cells, so slightly coarse;
        _columns decides exactly)."""
        filled = np.flatnonzero(occupied)
        if filled.size < 2:
            return []
        c = self.cell
        gaps = np.flatnonzero((np.diff(filled) - 1) * c >= self.gutter)  # white cells between
        out = []
        for g in gaps:
            start, stop = (filled[g] + 1) * c, filled[g + 1] * c
            if start - filled[0] * c >= self.column and (filled[-1] + 1) * c - stop >= self.column:
                out.append((float(start), float(stop)))
        return out

    def _columns(self, boxes: list[Box]) -> list[list[Box]] | None:
        """The columns the boxes fall into, left to right, or None when no gutter
        passes (too narrow, or a column that is not text-like, such as a table's)."""
        spans = sorted((b.x0, b.x1) for b in boxes)
        gaps = []  # (width, cut position)
        right = spans[0][1]
        for a, b in spans[1:]:
            if a - right >= self.gutter:
                gaps.append((a - right, (a + right) / 2))
            right = max(right, b)
        if not gaps:
            return None
        # all gutters, then the narrowest next to a column that is not text-like
        # dropped (its columns merged) until every column is
        gaps.sort(key=lambda g: g[1])
        while gaps:
            pieces = _cut(boxes, [x for _, x in gaps])
            bad = [k for k, p in enumerate(pieces) if not self._text_like(p)]
            if not bad:
                return pieces
            near = {g for k in bad for g in (k - 1, k) if 0 <= g < len(gaps)}
            gaps.pop(min(near, key=lambda g: gaps[g][0]))
        return None

    def _text_like(self, piece: list[Box]) -> bool:
        if not piece:
            return False
        x0, x1 = min(b.x0 for b in piece), max(b.x1 for b in piece)
        width = x1 - x0
        if width < self.column:
            return False
        grouped = rows(piece)
        # a text column has one box a line (two with a bullet); a table's columns, several
        if np.median([len(row) > 2 for row in grouped]) > 0:
            return False
        return float(np.median([sum(len(b.text) for b in row) for row in grouped])) >= MIN_CHARS

    def _flow(self, grouped: list[list[Box]]) -> list[list[list[Box]]]:
        """Rows read as they are; a vertical gap wider than BLOCK_GAP starts a new block."""
        out: list[list[list[Box]]] = []
        bottom = None
        for row in grouped:
            top = min(b.y0 for b in row)
            if bottom is None or top - bottom > BLOCK_GAP * self.unit:
                out.append([])
            out[-1].append(row)
            bottom = max(b.y1 for b in row)
        return out


def _cut(boxes: list[Box], cuts: list[float]) -> list[list[Box]]:
    pieces: list[list[Box]] = [[] for _ in range(len(cuts) + 1)]
    for b in boxes:
        centre = (b.x0 + b.x1) / 2
        pieces[sum(centre > c for c in cuts)].append(b)
    return pieces

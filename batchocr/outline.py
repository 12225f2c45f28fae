"""One outline per document: heading levels from the whole document's type styles
(and its bookmarks, where it has them), not page by page.

A style is a line's (size, bold). The body is the size most characters have; a
heading style is larger than the body and bold, or much larger, on short lines
that are not a typewriter's, and rare (a card's bold command font is not a
heading). Levels rank the styles: larger first, bold before not. Where the PDF's
outline (its bookmarks) names lines of a style, that style takes the bookmarks'
level and the styles ranked between keep their order. A document is sampled, not
read twice: up to SAMPLE pages spread over it, whose lines the pages reuse."""

from __future__ import annotations

import re
import time
from collections import Counter
from typing import Callable

from batchocr.layerlines import Line

# A heading's text is this many times the body's size, and bold, or HEADING_BIG times it.
HEADING = 1.15
HEADING_BIG = 1.3
HEADING_CHARS = 120
MAX_LEVEL = 4
# A style on more than this share of the sampled lines is text, not headings.
RARE = 0.2
SAMPLE = 48
SAMPLE_CPU_S = 1.0

Style = tuple[float, bool]


def heading_like(ln: Line) -> bool:
    return len(ln.text) <= HEADING_CHARS and any(c.isalpha() for c in ln.text) and not ln.mono


def _key(text: str) -> str:
    """A title as bookmarks and pages both spell it: letters and digits, lower case."""
    return re.sub(r"[\W_]+", "", text).lower()


class Outline:
    """Heading levels of a document's styles, and the headings open so far: headings
    nest, a heading written one level below the nearest higher-ranked one before it."""

    def __init__(self, levels: dict[Style, int], body: float):
        self.levels = levels
        self.body = body
        self.lowest = min(max(levels.values(), default=0) + 1, MAX_LEVEL)
        self.open: list[tuple[int, int]] = []  # (style's level, level written), outermost first

    @classmethod
    def of(cls, lines: list[list[Line]], toc: list | None = None) -> "Outline":
        """From the sampled pages' lines and the document's bookmarks (get_toc's list)."""
        every = [ln for page in lines for ln in page]
        if not every:
            return cls({}, 0.0)
        sizes: Counter = Counter()
        for ln in every:
            if not ln.mono:
                sizes[ln.size] += len(ln.text)
        body = (sizes or Counter({every[0].size: 1})).most_common(1)[0][0]
        count: Counter = Counter()
        for ln in every:
            if heading_like(ln) and (ln.size >= HEADING_BIG * body or (ln.bold and ln.size >= HEADING * body)):
                count[(ln.size, ln.bold)] += 1
        styles = [s for s, n in count.items() if n <= max(2, RARE * len(every))]
        ranked = sorted(styles, key=lambda s: (-s[0], not s[1]))
        return cls(_levels(ranked, every, toc or []), body)

    def level(self, ln: Line) -> int | None:
        """The heading level of a line of this style, or None (body text)."""
        if not heading_like(ln):
            return None
        return self.levels.get((ln.size, ln.bold))

    def nest(self, level: int) -> int:
        """The level written for a heading of this style's level: one below the nearest
        open heading of a higher rank (a section with no chapter above it is a level 2
        under the title, and so is the next section of a larger style)."""
        while self.open and self.open[-1][0] >= level:
            self.open.pop()
        written = self.open[-1][1] + 1 if self.open else 1
        self.open.append((level, written))
        return written


def _levels(ranked: list[Style], lines: list[Line], toc: list) -> dict[Style, int]:
    """Styles by rank, or by the bookmarks' levels where bookmarks name their lines."""
    marked: dict[Style, Counter] = {}
    titles = {_key(title): lvl for lvl, title, *_ in toc if _key(title)}
    if titles:
        for ln in lines:
            style = (ln.size, ln.bold)
            lvl = titles.get(_key(ln.text)) or titles.get(_key(re.sub(r"^[\d.]+\s*", "", ln.text)))
            if lvl and style in ranked:
                marked.setdefault(style, Counter())[lvl] += 1
    levels: dict[Style, int] = {}
    current = 0
    for style in ranked:
        if style in marked:
            current = max(marked[style].most_common(1)[0][0], current + (current == 0))
        else:
            current += 1
        levels[style] = min(max(current, 1), MAX_LEVEL)
    return levels


def sample(count: int, read: Callable[[int], list[Line] | None], skip: frozenset[int] = frozenset()) -> list[list[Line]]:
    """Up to SAMPLE pages' lines, spread over the document (all of a short one), read
    within SAMPLE_CPU_S of CPU; pages in skip are not read (done, or their row says
    why not), nor is a page that cannot be read."""
    pages = [i for i in range(count) if i not in skip]
    if len(pages) > SAMPLE:
        pages = [pages[round(k * (len(pages) - 1) / (SAMPLE - 1))] for k in range(SAMPLE)]
    start = time.process_time()
    out = []
    for index in pages:
        lines = read(index)
        if lines is not None:
            out.append(lines)
        if time.process_time() - start > SAMPLE_CPU_S:
            break
    return out

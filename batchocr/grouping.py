"""Document mode's feeding: a document's pages for the engine in groups of consecutive
pages, each group one batch (the engine sends it as one request).

The render stage gives every page of a document it was asked for a row of its own (a
page image, or an error row) in page order, but interleaved with other documents and
split across batches. A group leaves once it is full, or once the document's last page
has come back, whether for the engine, the text layer (routed) or as an error. So a
group holds at most `size` pages, and the pages held are those of the documents being
rendered: memory stays bounded by the render workers, not by the documents' length.
"""

from __future__ import annotations

import math
from typing import Iterable

import pyarrow as pa


def balanced_size(pages: int, most: int) -> int:
    """Pages a group of a document of `pages` pages holds: as few groups of at most `most`
    as will do, balanced (15 pages by 14: 8 + 7, not 14 + 1)."""
    return max(1, math.ceil(pages / math.ceil(pages / most))) if pages else 1


class Grouper:
    def __init__(self, size: int):
        self.size = size
        self._skip: dict[str, frozenset[int]] = {}  # pages committed before: not coming
        self._left: dict[str, set[int]] = {}  # pages still to come from the render stage
        self._target: dict[str, int] = {}  # the document's group size, balanced
        self._pending: dict[str, list[pa.RecordBatch]] = {}  # its engine pages not yet sent, a row each

    def expect(self, doc_id: str, skip: Iterable[int]) -> None:
        """A document given to the render stage, less the pages already committed."""
        self._skip[doc_id] = frozenset(skip)

    def add(self, rendered: pa.RecordBatch, good: pa.RecordBatch) -> list[pa.RecordBatch]:
        """`rendered`: every row the render stage gave (pages, error rows, routed pages);
        `good`: those of them for the engine. Returns the groups now complete."""
        cols = rendered.select(["doc_id", "page_index", "page_count"]).to_pydict()
        touched = []
        for doc, index, count in zip(cols["doc_id"], cols["page_index"], cols["page_count"]):
            if doc not in self._left:
                expected = set(range(count)) - self._skip.get(doc, frozenset()) if count is not None else set()
                self._left[doc] = expected
                self._target[doc] = balanced_size(len(expected), self.size)
            if index < 0:  # the document could not be read: nothing more comes
                self._left[doc] = set()
            self._left[doc].discard(index)
            touched.append(doc)
        for i, doc in enumerate(good.column("doc_id").to_pylist()):
            self._pending.setdefault(doc, []).append(good.slice(i, 1))
        out = []
        for doc in dict.fromkeys(touched):
            pending = self._pending.get(doc, [])
            while len(pending) >= self._target[doc]:
                out.append(_group(pending[:self._target[doc]]))
                del pending[:self._target[doc]]
            if not self._left[doc]:  # its last page is back: the rest is a group
                if pending:
                    out.append(_group(pending))
                for state in (self._left, self._target, self._pending, self._skip):
                    state.pop(doc, None)
        return out

    def rest(self) -> list[pa.RecordBatch]:
        """What is held when the render stage has no more (nothing, if every page came back)."""
        out = [_group(pending) for pending in self._pending.values() if pending]
        self._pending.clear()
        return out


def _group(rows: list[pa.RecordBatch]) -> pa.RecordBatch:
    table = pa.Table.from_batches(rows).combine_chunks()
    table = table.take(pa.compute.sort_indices(table, [("page_index", "ascending")]))
    return table.to_batches(max_chunksize=table.num_rows)[0]

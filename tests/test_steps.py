"""The Read step's promise: every page sent to the engine comes back exactly once, or the run
stops with the engine named (BoundaryError), never a page lost or written twice."""

from __future__ import annotations

import threading

import pyarrow as pa
import pytest

from batchocr import schema
from batchocr.engines import Engine
from batchocr.errors import BoundaryError
from batchocr.schema import Needs
from batchocr.steps import Read, Tally


def _pages(doc: str, n: int, skew_angle: float | None = None) -> pa.RecordBatch:
    rows = [{c: None for c in schema.CARRIED} | {"doc_id": doc, "page_index": i, "skew_angle": skew_angle}
            for i in range(n)]
    return pa.RecordBatch.from_pylist(rows)


class _Echo(Engine):
    """Gives back each page it takes, as `answer` says: once, twice, not at all, or it stops early."""

    name, model, needs = "echo", "echo-1", Needs(image=False, text_layer=False)

    def __init__(self, answer: str, skew_angle: float | None = None):
        self.answer, self.skew_angle = answer, skew_angle

    def run(self, pages, stop):
        for n, batch in enumerate(pages):
            rows = [{"doc_id": d, "page_index": i, "skew_angle": self.skew_angle} for d, i in
                    zip(batch.column("doc_id").to_pylist(), batch.column("page_index").to_pylist())]
            if self.answer == "drop":
                rows = rows[1:]
            if self.answer == "twice":
                rows = rows + rows[:1]
            yield pa.RecordBatch.from_pylist(rows)
            if self.answer == "early":
                return


def _read(answer: str, batches: list[pa.RecordBatch], stop: threading.Event | None = None,
          engine: Engine | None = None) -> list[dict]:
    tally = Tally(summary=None, timings={}, bar=None, started=0.0)
    step = Read(engine or _Echo(answer), stop or threading.Event(), tally)
    return [row for rows in step(iter(batches)) for row in rows]


def test_each_page_comes_back_once_joined_to_what_was_sent():
    rows = _read("once", [_pages("a", 2), _pages("b", 1)])
    assert [(r["doc_id"], r["page_index"]) for r in rows] == [("a", 0), ("a", 1), ("b", 0)]


@pytest.mark.parametrize("answer, message", [
    ("drop", "engine echo: 2 pages never output"),
    ("twice", "engine echo: page ('a', 0) output twice or never sent"),
    ("early", "engine echo: returned before it took every page"),
])
def test_a_page_lost_or_doubled_by_the_engine_stops_the_run_naming_it(answer, message):
    with pytest.raises(BoundaryError, match=message.replace("(", r"\(").replace(")", r"\)")):
        _read(answer, [_pages("a", 2), _pages("b", 1)])


def test_a_page_sent_twice_is_the_render_stages_fault():
    with pytest.raises(BoundaryError, match=r"render: page \('a', 0\) sent twice"):
        twice = pa.Table.from_batches([_pages("a", 1), _pages("a", 1)]).combine_chunks().to_batches()[0]
        _read("once", [twice])


def test_after_a_stop_pages_not_yet_back_are_left_to_the_next_run():
    stop = threading.Event()
    stop.set()
    assert len(_read("early", [_pages("a", 2), _pages("b", 1)], stop)) == 2


def test_the_turn_a_render_worker_found_fills_skew_angle_where_the_engine_gives_none():
    """Needs.upright: the page's skew_angle (how it lay before the render worker turned it) is
    the row's where the engine estimates none itself; an engine's own estimate is kept."""
    rows = _read("once", [_pages("a", 1, 90.0), _pages("b", 1)])
    assert [r["skew_angle"] for r in rows] == [90.0, None]
    rows = _read("once", [_pages("a", 1, 90.0)], engine=_Echo("once", skew_angle=1.5))
    assert [r["skew_angle"] for r in rows] == [1.5]

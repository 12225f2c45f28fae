"""A run's steps. Each is called with the stream the step before it gives and gives its own,
lazily, so that memory stays bounded by the render workers. Read in order they are a run
(batchocr/runner.py wires them):

    List ─► Group.expecting ─► Render ─► Route ─► Group ─► Read ─► Write
    tasks    (document mode)    Pages     Pages    batches   rows    part files

A page leaves as a row from one of three steps: Render (an error row), Route (its text layer)
or Read (the engine); each hands its rows to Write, the one step that commits them.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator

import pyarrow as pa
import pyarrow.compute as pc

from batchocr import engines, router, schema
from batchocr.engines import Engine
from batchocr.errors import BoundaryError
from batchocr.grouping import Grouper
from batchocr.progress import Progress
from batchocr.render import RenderTask
from batchocr.renderpool import RenderPool
from batchocr.shard import RunSummary, Shard, committed_pages
from batchocr.sink import PartWriter, Resume
from batchocr.sources import DocRef


@dataclass
class Tally:
    """What a run counts as its steps go: the summary's counts, the timings (from `started`,
    time.monotonic()) and the progress bar."""

    summary: RunSummary
    timings: dict[str, float]
    bar: Progress
    started: float


@dataclass
class Pages:
    """A batch from the render stage: every row it gave (pages, error rows, routed pages) and
    those of them still for the engine."""

    rendered: pa.RecordBatch
    good: pa.RecordBatch


class Write:
    """Rows to the shard's part files, each stamped with the engine that read it, the run and
    the time; counted in the summary and the progress bar."""

    def __init__(self, shard: Shard, run_id: str, engine: Engine, tally: Tally):
        self.writer = PartWriter(shard.out, shard.index, run_id, shard.spec.commit)
        self.run_id, self.shard, self.engine, self.tally = run_id, shard.index, engine, tally

    def __call__(self, rows: list[dict], by: Engine | None = None) -> None:
        """`by`: the engine that read them (the text layer's for routed pages); the run's by default."""
        by = by or self.engine
        t = time.monotonic()
        timings, summary = self.tally.timings, self.tally.summary
        timings.setdefault("first_row_s", t - self.tally.started)  # from the run's start: what its start-up cost
        now = dt.datetime.now(dt.UTC)
        for row in rows:
            if row.get("error_type") is not None and row["error_type"] not in schema.ERROR_TYPES:
                raise BoundaryError(f"undeclared error_type {row['error_type']!r} (add it to schema.ERROR_TYPES and README)")
            row.update(engine=by.name, model=by.model, run_id=self.run_id, shard=self.shard, processed_at=now)
            if row["page_index"] < 0:  # a document that could not be opened: no page of it
                summary.failed_documents += 1
                continue
            summary.pages += 1
            summary.error_pages += row["finish_reason"] == "error"
            summary.skipped_pages += row["finish_reason"] == "skipped"
        self.writer.add(pa.Table.from_pylist(rows, schema=schema.PAGE_TABLE))
        self.tally.bar.done(len(rows))
        timings["write_s"] += time.monotonic() - t

    def flush(self) -> None:
        """Commit what is buffered (a full disk: BatchocrError)."""
        t = time.monotonic()
        try:
            self.writer.flush()
        finally:
            self.tally.timings["write_s"] += time.monotonic() - t

    @property
    def parts(self) -> list[str]:
        """The part files this run committed, relative to OUT."""
        return self.writer.parts


class List:
    """The listed documents not yet complete in OUT, each a render task with the pages it has
    already. The first one with work makes the shard not done again."""

    def __init__(self, shard: Shard, listed: Callable[[], Iterable[DocRef]], done: dict, tally: Tally):
        self.shard, self.listed, self.done, self.tally = shard, listed, done, tally

    def __call__(self) -> Iterator[RenderTask]:
        summary = self.tally.summary
        for doc in self.listed():
            resume = self.done.get((doc.doc_id, doc.etag), Resume(frozenset()))
            if resume is None:
                summary.documents_skipped += 1
                continue
            if summary.documents == 0:
                self.shard.reopen()
            summary.documents += 1
            self.tally.bar.started(doc, len(resume.skip))
            yield RenderTask(doc, resume.skip, resume.retry)

    def count(self) -> None:
        """The progress bar's totals, counted in the background from a listing of its own."""
        self.tally.bar.count_documents(self.listed(), lambda doc: committed_pages(self.done, doc))


class Render:
    """Render tasks to pages in the render workers; a page that cannot be rendered is an error
    row, written at once. Stops taking batches once the run stops."""

    def __init__(self, pool: RenderPool, stop: threading.Event, write: Write, tally: Tally):
        self.pool, self.stop, self.write, self.tally = pool, stop, write, tally

    def __call__(self, tasks: Iterator[RenderTask]) -> Iterator[Pages]:
        batches = self.pool.run(tasks, stop=self.stop.is_set)
        timings = self.tally.timings
        while True:
            t = time.monotonic()
            batch = next(batches, None)
            timings["render_wait_s"] += time.monotonic() - t
            if batch is None or self.stop.is_set():
                return
            for doc, count in zip(batch.column("doc_id").to_pylist(), batch.column("page_count").to_pylist()):
                self.tally.bar.opened(doc, count)  # its first batch: now its pages are known
            failed = batch.column("error_type").is_valid()
            errors = batch.select(schema.CARRIED + ["error_type", "error_message", "attempts"]).filter(failed).to_pylist()
            good = batch
            if errors:
                self.write([row | {"finish_reason": "error"} for row in errors])
                good = batch.filter(pc.invert(failed))  # copies the pixels: only when needed
            yield Pages(batch, good)


class Route:
    """Pages with a good text layer (the router's score, from the render workers) read by the
    textlayer engine and written at once; the rest go on to the model. Where the run does not
    route, every page goes on."""

    def __init__(self, on: bool, write: Write, tally: Tally):
        self.write, self.tally = write, tally
        # The router took these pages for their text: the textlayer engine's own section (min_chars)
        # is for a run of that engine, and must not skip a page the router gave it.
        self.layer = engines.create("textlayer", {}) if on else None

    def __call__(self, pages: Iterator[Pages]) -> Iterator[Pages]:
        for p in pages:
            if self.layer is None:
                yield p
                continue
            routed, good = router.split(p.good)
            if routed is not None:
                self._read(routed)
            yield Pages(p.rendered, good)

    def _read(self, routed: pa.RecordBatch) -> None:
        results = {(r["doc_id"], r["page_index"]): r for out in self.layer.run(iter([routed]), threading.Event())
                   for r in out.to_pylist()}
        meta = routed.select(schema.CARRIED).to_pylist()
        if len(results) != len(meta):
            raise BoundaryError(f"textlayer: {len(meta)} routed pages in, {len(results)} rows out")
        self.write([m | results[(m["doc_id"], m["page_index"])] for m in meta], by=self.layer)
        self.tally.summary.routed_pages += len(meta)


class Group:
    """Document mode (an engine whose group_pages > 1): a document's pages in groups of
    consecutive pages, one batch each (batchocr/grouping.py); else each batch's pages as they are."""

    def __init__(self, group_pages: int, stop: threading.Event):
        self.grouper = Grouper(group_pages) if group_pages > 1 else None
        self.stop = stop

    def expecting(self, tasks: Iterator[RenderTask]) -> Iterator[RenderTask]:
        """The tasks as they are; each document's pages still to come noted first."""
        for task in tasks:
            if self.grouper is not None:
                self.grouper.expect(task.doc.doc_id, task.skip)
            yield task

    def __call__(self, pages: Iterator[Pages]) -> Iterator[pa.RecordBatch]:
        grouper = self.grouper
        for p in pages:
            if grouper is not None:
                yield from grouper.add(p.rendered, p.good)
            elif p.good.num_rows:
                yield p.good
        if grouper is not None and not self.stop.is_set():
            yield from grouper.rest()


class Read:
    """The engine's reading: batches in, each result joined to the page it was sent for. Every
    page sent comes back exactly once; one sent twice, or a result for a page never sent, is
    the engine's fault (BoundaryError)."""

    def __init__(self, engine: Engine, stop: threading.Event, tally: Tally):
        self.engine, self.stop, self.tally = engine, stop, tally
        self.inflight: dict[tuple[str, int], dict] = {}  # pages sent to the engine, by (doc_id, page_index)
        self.taken_all = False  # the engine took the last page there was

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[list[dict]]:
        for results in self.engine.run(self._sent(batches), self.stop):
            yield self._joined(results)
        if self.stop.is_set():
            return
        if not self.taken_all:
            raise BoundaryError(f"engine {self.engine.name}: returned before it took every page")
        if self.inflight:
            raise BoundaryError(f"engine {self.engine.name}: {len(self.inflight)} pages never output, "
                                f"e.g. {next(iter(self.inflight))}")

    def _sent(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            self.tally.timings.setdefault("first_page_s", time.monotonic() - self.tally.started)
            for row in batch.select(schema.CARRIED + ["skew_angle"]).to_pylist():
                key = (row["doc_id"], row["page_index"])
                if key in self.inflight:
                    raise BoundaryError(f"render: page {key} sent twice")
                self.inflight[key] = row
            yield batch
        self.taken_all = True

    def _joined(self, results: pa.RecordBatch) -> list[dict]:
        rows = []
        for res in results.to_pylist():
            meta = self.inflight.pop((res["doc_id"], res["page_index"]), None)
            if meta is None:
                raise BoundaryError(f"engine {self.engine.name}: page {(res['doc_id'], res['page_index'])} "
                                    f"output twice or never sent")
            # the turn a render worker found (Needs.upright) where the engine estimates none itself
            rows.append(meta | res | {"skew_angle": meta["skew_angle"] if res.get("skew_angle") is None
                                      else res["skew_angle"]})
        return rows

"""Wires the stages for one shard:

    list ─► shard filter ─► skip what is committed ─► render pool ─► engine ─► part files

plus the progress bar, SIGTERM/SIGINT, the run record and the done-marker.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import platform
import secrets
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Iterator

import pyarrow as pa

from batchocr import __version__, cost, engines, layout, producer, router, schema
from batchocr.compact import kept_counts
from batchocr.grouping import Grouper
from batchocr.errors import BatchocrError, BoundaryError, ConfigError, Interrupted, NotBatchocrs, StorageError
from batchocr.plan import PlanInfo, planned_documents, read_plan
from batchocr.progress import Progress
from batchocr.render import RenderTask
from batchocr.renderpool import RenderPool
from batchocr.sharding import shard_of
from batchocr.signals import graceful_stop
from batchocr.status import check_shard_count
from batchocr.layout import done_marker, shard_dir
from batchocr.sink import KEY_COLUMNS, PartWriter, Resume, committed_keys, completed
from batchocr.sources import DocRef, check_stores, list_documents, located
from batchocr.spec import JobSpec, RenderSpec, Shard
from batchocr.storage import Store
from batchocr.words import plural

if TYPE_CHECKING:
    from batchocr.parts import Part


@dataclass
class RunSummary:
    run_id: str
    shard: str
    out: str
    documents: int = 0  # documents worked on by this run
    documents_skipped: int = 0  # already complete in OUT
    pages: int = 0
    error_pages: int = 0  # rows with finish_reason error
    skipped_pages: int = 0  # rows with finish_reason skipped
    routed_pages: int = 0  # pages whose text came from the text layer, not the engine (route)
    seconds: float = 0.0
    interrupted: bool = False
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def pages_per_s(self) -> float:
        return self.pages / self.seconds if self.seconds else 0.0

    def line(self) -> str:
        if self.documents == 0 and not self.interrupted:
            return (f"batchocr: shard {self.shard}: nothing to do "
                    f"({plural(self.documents_skipped, 'document')} already done) in {self.out}"
                    + (f" (run {self.run_id})" if self.run_id else ""))
        state = "interrupted after" if self.interrupted else "done:"
        skipped = f", {self.skipped_pages} skipped" if self.skipped_pages else ""
        skipped += f", {self.routed_pages} from the text layer" if self.routed_pages else ""
        return (
            f"batchocr: {state} {plural(self.documents, 'document')}, {plural(self.pages, 'page')} "
            f"({plural(self.error_pages, 'error')}{skipped}), {self.pages_per_s:.2f} pages/s, "
            f"{self.seconds:.1f} s -> {self.out}/{shard_dir(int(self.shard.split('/')[0]))} "
            f"({'runs' if ', ' in self.run_id else 'run'} {self.run_id})"
        )


def new_run_id() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ") + "-" + secrets.token_hex(3)


def run_job(spec: JobSpec, progress: bool = True, engine: engines.Engine | None = None,
            stop: threading.Event | None = None, part: "Part | None" = None) -> RunSummary:
    """Run one shard of a job to completion, or until SIGTERM/SIGINT (or `stop`
    set): then commit what has finished and raise Interrupted. `engine` defaults
    to the spec's. With spec.processes N > 1 the shard runs as N parts, each a
    process (batchocr/parts.py); `part` is one of them (its documents, its turn to
    build its engine), run in that process."""
    if stop is None:
        with graceful_stop() as stop:
            return run_job(spec, progress, engine, stop, part)
    if stop.is_set():
        raise Interrupted("batchocr: interrupted before the run started (nothing done; rerun to resume)")
    if spec.processes > 1:
        if engine is not None:
            raise ConfigError(f"processes: {spec.processes} builds an engine in each part's process: "
                              "pass no engine (or processes: 1)")
        from batchocr.parts import run_parts

        return run_parts(spec, progress, stop)
    started = time.monotonic()
    started_at = dt.datetime.now(dt.UTC)
    run_id = new_run_id()
    shard = spec.shard
    out = Store(spec.out, spec.storage_options)
    source = Store(spec.source, spec.storage_options)
    summary = RunSummary(run_id=run_id, shard=str(shard), out=spec.out)

    check_stores(source, out)  # before the engine loads; a missing SOURCE leaves no run record
    plan = _check_sharding(source, out, spec) if part is None else None  # (a part's parent checked it)
    expected = None  # what OUT is to remember, known before the engine loads
    start = {"turn_wait_s": 0.0, "engine_start_s": 0.0}  # the run's start: a part's turn, the engine's build
    if engine is None:
        expected = _producer_settings(spec)
        producer.check(out, expected, spec.reprocess, spec.out)  # OUT's settings, or exit 2 naming both
        if part is None and engines.kind(spec.engine).slow_to_build:
            idle = nothing_to_do(spec, source, out, plan, expected, started)
            if idle is not None:  # no model loaded for a shard with nothing new
                return idle
        t = time.monotonic()
        if part is not None:
            part.wait_turn(stop)  # one engine starts at a time: vLLM measures the GPU's free memory
        start["turn_wait_s"] = (t_build := time.monotonic()) - t
        engine = engines.create(spec.engine, spec.engine_options)  # fails early: bad options, missing extra
        start["engine_start_s"] = time.monotonic() - t_build
        if part is not None:
            part.built()
    try:
        return _run(spec, engine, run_id, started, started_at, summary, out, source, progress, stop, expected, part,
                    start, plan)
    except NotBatchocrs:  # a file of OUT's to move out, as it says: a rerun alone meets it again
        raise
    except StorageError as exc:  # said here, not by the store: `status` and `report` resume nothing
        raise StorageError(f"{exc}; committed work is intact, rerun to resume") from None
    finally:
        engine.close()  # explicitly: vLLM was seen to hang at exit otherwise


def _run(spec: JobSpec, engine, run_id: str, started: float, started_at: dt.datetime, summary: RunSummary,
         out: Store, source: Store, progress: bool, stop: threading.Event,
         expected: dict[str, Any] | None = None, part: "Part | None" = None,
         start: dict[str, float] | None = None, plan: PlanInfo | None = None) -> RunSummary:
    shard = spec.shard
    render = _render_spec(spec, getattr(engine, "render_hints", {}))
    # The render settings used: the worker count resolved (the spec's own, 0 for "one per CPU", is in "spec").
    used = dataclasses.asdict(dataclasses.replace(render, workers=render.worker_count))
    record = _run_record(spec, engine, run_id, started_at) | {"render": used}
    held = cost.accelerator(engine)  # what the run holds, priced by `report --gpu-hourly-usd`
    if part is not None and part.count > 1:  # a part of a shard holds its share: `report` counts the GPU once
        held["count"] = held["count"] / part.count
    settings = producer.of_record(record)
    if expected is not None and settings != expected:  # the check before the load was on other settings
        raise BoundaryError(f"engine {engine.name}: OUT was checked before it loaded against settings other than "
                            f"the built engine's ({producer.describe_change(expected, settings)}): "
                            f"engines.{engine.name}.settings() disagrees with the engine")
    producer.remember(out, settings, spec.reprocess, spec.out)  # checked again, then OUT takes them
    out.write_json(layout.run_record(run_id), record | {"status": "running"})

    pooled = contextlib.ExitStack()
    try:  # run.end below writes the record's last word; a failure before it must not leave it "running"
        keys = current_keys(out, shard.index, settings)
        run = _Shard(spec, engine, run_id, started, summary, out, part, start or {}, completed(keys),
                     (lambda: iter(part.documents)) if part is not None else (lambda: _documents(source, out, spec, plan)),
                     progress)
        pool = pooled.enter_context(RenderPool(render, run.needs, spec.storage_options))
    except BaseException:
        with contextlib.suppress(BatchocrError):  # the run's own error is the one to tell
            out.write_json(layout.run_record(run_id), record | {
                "status": "failed", "finished_at": dt.datetime.now(dt.UTC).isoformat()})
        raise
    with pooled:
        try:
            t_engine = time.monotonic()
            for results in engine.run(run.stamped(run.feed(pool, stop)), stop):
                run.write(run.rows_of(results))
            run.timings["engine_s"] = (time.monotonic() - t_engine - run.timings["render_wait_s"]
                                       - run.timings["write_s"])
            if run.inflight and not stop.is_set():
                raise BoundaryError(f"engine {engine.name}: {len(run.inflight)} pages never output, "
                                    f"e.g. {next(iter(run.inflight))}")
        finally:
            run.end(sys.exc_info()[1], stop, pool, record, held)

    if summary.interrupted:
        exc = Interrupted(summary.line() + " (finished pages committed; rerun to resume)")
        exc.summary = asdict(summary)  # a part's, for the parent's line (batchocr/parts.py)
        raise exc
    if part is not None:  # the shard is done when every part is: the parent marks it
        return summary
    # Every page of the shard has a row now: only then is the marker written, with what compaction keeps.
    try:
        written = [out.read_parquet(p, KEY_COLUMNS) for p in run.writer.parts]  # this run's rows' keys
        now = pa.concat_tables([keys, *written])
    except FileNotFoundError:  # `batchocr compact` ran meanwhile: its file holds them; the shard as it is now
        now = current_keys(out, shard.index, settings)
    pages, errors = kept_counts(now)
    _write_marker(out, shard, summary.documents + summary.documents_skipped, pages, errors,
                  set(keys.column("run_id").to_pylist()) | {run_id},
                  {"run_id": run_id, "seconds": round(summary.seconds, 3), "pages": summary.pages})
    return summary


class _Shard:
    """One run's way through its shard (or part): the documents still to do as render tasks,
    rendered pages to the engine (render errors and routed pages straight to rows), the engine's
    results matched to the pages sent, rows to the part writer, and what the run took: counts in
    the summary, `timings`, the progress bar, and at the end the run record."""

    def __init__(self, spec: JobSpec, engine, run_id: str, started: float, summary: RunSummary, out: Store,
                 part: "Part | None", start: dict[str, float], done: dict, listed, progress: bool):
        self.engine, self.run_id, self.started, self.summary, self.out = engine, run_id, started, summary, out
        self.shard, self.done = spec.shard, done
        self.documents = listed()
        self.writer = PartWriter(out, self.shard.index, run_id, spec.commit)
        self.inflight: dict[tuple[str, int], dict] = {}  # pages sent to the engine, by (doc_id, page_index)
        self.timings = {"render_wait_s": 0.0, "engine_s": 0.0, "write_s": 0.0, **start}
        self.bar = Progress(f"shard {self.shard}" + (f" part {part}" if part is not None else ""), progress,
                            position=part.index if part is not None else None)
        self.bar.count_documents(listed(), lambda doc: _committed(done, doc))  # in the background
        group_pages = getattr(engine, "group_pages", 1)  # document mode: the engine reads pages in groups
        self.grouper = Grouper(group_pages) if group_pages > 1 else None
        self.needs = router.needs(engine.needs, spec.route)
        # The router took these pages for their text: the textlayer engine's own section (min_chars)
        # is for a run of that engine, and must not skip a page the router gave it
        self.layer = engines.create("textlayer", {}) if self.needs.route else None

    def tasks(self) -> Iterator[RenderTask]:
        """The listed documents not yet complete in OUT, each with the pages it has already."""
        summary = self.summary
        for doc in self.documents:
            resume = self.done.get((doc.doc_id, doc.etag), Resume(frozenset()))
            if resume is None:
                summary.documents_skipped += 1
                continue
            if summary.documents == 0 and self.out.exists(done_marker(self.shard.index)):
                self.out.remove(done_marker(self.shard.index))  # there is work again: not done
            summary.documents += 1
            if self.grouper is not None:
                self.grouper.expect(doc.doc_id, resume.skip)
            self.bar.started(doc, len(resume.skip))
            yield RenderTask(doc, resume.skip, resume.retry)

    def write(self, rows: list[dict], by=None) -> None:
        by = by or self.engine
        t = time.monotonic()
        self.timings.setdefault("first_row_s", t - self.started)  # from the run's start: what its start-up cost
        now = dt.datetime.now(dt.UTC)
        summary = self.summary
        for row in rows:
            if row.get("error_type") is not None and row["error_type"] not in schema.ERROR_TYPES:
                raise BoundaryError(f"undeclared error_type {row['error_type']!r} (add it to schema.ERROR_TYPES and README)")
            row.update(engine=by.name, model=by.model, run_id=self.run_id, shard=self.shard.index, processed_at=now)
            summary.pages += 1
            summary.error_pages += row["finish_reason"] == "error"
            summary.skipped_pages += row["finish_reason"] == "skipped"
        self.writer.add(pa.Table.from_pylist(rows, schema=schema.PAGE_TABLE))
        self.bar.done(len(rows))
        self.timings["write_s"] += time.monotonic() - t

    def feed(self, pool: RenderPool, stop) -> Iterator[pa.RecordBatch]:
        """Render errors go straight to the table; good pages go to the engine (in document
        mode, a group of a document's pages a batch)."""
        pages = pool.run(self.tasks(), stop=stop.is_set)
        grouper = self.grouper
        while True:
            t = time.monotonic()
            batch = next(pages, None)
            self.timings["render_wait_s"] += time.monotonic() - t
            if batch is None and grouper is not None and not stop.is_set():
                yield from grouper.rest()
            if batch is None or stop.is_set():
                return
            for doc, count in zip(batch.column("doc_id").to_pylist(), batch.column("page_count").to_pylist()):
                self.bar.opened(doc, count)  # its first batch: now its pages are known
            failed = batch.column("error_type").is_valid()
            errors = batch.select(schema.CARRIED + ["error_type", "error_message", "attempts"]).filter(failed).to_pylist()
            good = batch
            if errors:
                self.write([row | {"finish_reason": "error"} for row in errors])
                good = batch.filter(pa.compute.invert(failed))  # copies the pixels: only when needed
            routed, good = router.split(good) if self.needs.route else (None, good)
            if routed is not None:  # a good text layer: the textlayer engine's rows, never the model
                self._routed(routed)
            for row in good.select(schema.CARRIED).to_pylist():
                key = (row["doc_id"], row["page_index"])
                if key in self.inflight:
                    raise BoundaryError(f"render: page {key} sent twice")
                self.inflight[key] = row
            if grouper is not None:
                yield from grouper.add(batch, good)
            elif good.num_rows:
                yield good

    def _routed(self, routed: pa.RecordBatch) -> None:
        """Pages with a good text layer: the textlayer engine's rows."""
        results = {(r["doc_id"], r["page_index"]): r for out in self.layer.run(iter([routed])) for r in out.to_pylist()}
        meta = routed.select(schema.CARRIED).to_pylist()
        if len(results) != len(meta):
            raise BoundaryError(f"textlayer: {len(meta)} routed pages in, {len(results)} rows out")
        self.write([m | results[(m["doc_id"], m["page_index"])] for m in meta], by=self.layer)
        self.summary.routed_pages += len(meta)

    def stamped(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        """The batches as they are, the first one's arrival at the engine timed from the run's start."""
        for batch in batches:
            self.timings.setdefault("first_page_s", time.monotonic() - self.started)
            yield batch

    def rows_of(self, results: pa.RecordBatch) -> list[dict]:
        """The engine's results, each joined to the page it was sent for (once, and only a page sent)."""
        rows = []
        for res in results.to_pylist():
            meta = self.inflight.pop((res["doc_id"], res["page_index"]), None)
            if meta is None:
                raise BoundaryError(f"engine {self.engine.name}: page {(res['doc_id'], res['page_index'])} "
                                    f"output twice or never sent")
            rows.append(meta | res)
        return rows

    def end(self, failing: BaseException | None, stop: threading.Event, pool: RenderPool,
            record: dict[str, Any], held: dict[str, Any]) -> None:
        """Commit whatever finished, whatever happened (`failing`: what ends the run, if anything),
        and write the run record with its status; a failed flush is raised unless the run is
        failing already, and a failed record only if nothing else is."""
        engine, summary, timings = self.engine, self.summary, self.timings
        flush_error = None
        t = time.monotonic()
        try:
            self.writer.flush()
        except BatchocrError as exc:  # a full disk: the record still says the run failed
            failing = failing or exc
            flush_error = exc
        timings["write_s"] += time.monotonic() - t
        self.bar.close()
        summary.interrupted = stop.is_set()
        summary.seconds = time.monotonic() - self.started
        first_request = getattr(engine, "first_request_at", None)  # vLLM: its first request taken
        if first_request is not None:
            timings["first_request_s"] = first_request - self.started
        warm_up = getattr(engine, "renderer_warm_up_s", None)  # vLLM: its renderer's first call
        if warm_up is not None:
            timings["renderer_warm_up_s"] = warm_up
        summary.timings = {k: round(v, 3) for k, v in timings.items()}
        summary.timings["render_workers_replaced"] = pool.replaced
        status = "failed" if failing else ("interrupted" if summary.interrupted else "done")
        try:
            # engine_params again: what it counted (document mode's groups) is known now
            self.out.write_json(layout.run_record(self.run_id), record | {"engine_params": engine.describe()}
                                | _finish(summary, status, self.writer) | {
                "accelerator": held | {"seconds": round(summary.seconds * held["count"], 3)}})
        except BatchocrError:
            if failing is None:
                raise  # else the run's own error is the one to tell
        if flush_error is not None and sys.exc_info()[1] is None:
            raise flush_error


def current_keys(out: Store, shard: int, settings: dict[str, Any]) -> pa.Table:
    """The keys of a shard's committed rows, less those made with other settings (before
    a --reprocess: not done, redone now)."""
    keys = committed_keys(out, shard)
    stale = producer.other_runs(out, keys.column("run_id").to_pylist(), settings)
    if stale:
        keys = keys.filter(pa.compute.invert(pa.compute.is_in(keys.column("run_id"), pa.array(sorted(stale)))))
    return keys


def pending(documents: Iterator[DocRef], done: dict) -> tuple[list[DocRef], int]:
    """The documents with pages to do, and how many are done already."""
    todo, finished = [], 0
    for doc in documents:
        if _committed(done, doc) is None:
            finished += 1
        else:
            todo.append(doc)
    return todo, finished


def nothing_to_do(spec: JobSpec, source: Store, out: Store, plan: PlanInfo | None, settings: dict[str, Any],
                  started: float) -> RunSummary | None:
    """Where no document of the shard has pages to do: the shard marked done and the summary of a
    run that did nothing (no engine built, no run record); else None, the listing left at the
    first document with pages to do."""
    done = completed(current_keys(out, spec.shard.index, settings))
    finished = 0
    for doc in _documents(source, out, spec, plan):
        if _committed(done, doc) is not None:
            return None
        finished += 1
    return idle_run(spec, out, finished, started, settings)


def idle_run(spec: JobSpec, out: Store, finished: int, started: float, settings: dict[str, Any]) -> RunSummary:
    """A run of a shard whose `finished` documents are all done: marked done, and its summary."""
    summary = RunSummary(run_id="", shard=str(spec.shard), out=spec.out, documents_skipped=finished,
                         seconds=time.monotonic() - started)
    mark_done(out, spec.shard, finished, {"run_ids": [], "seconds": round(summary.seconds, 3), "pages": 0}, settings)
    return summary


def mark_done(out: Store, shard: Shard, documents: int, last_run: dict[str, Any],
              settings: dict[str, Any]) -> None:
    """The done-marker of a shard whose parts are all done (batchocr/parts.py), from
    what is committed now (as a run alone counts it)."""
    keys = current_keys(out, shard.index, settings)
    _write_marker(out, shard, documents, *kept_counts(keys), set(keys.column("run_id").to_pylist()), last_run)


def _write_marker(out: Store, shard: Shard, documents: int, pages: int, error_pages: int, run_ids: set[str],
                  last_run: dict[str, Any]) -> None:
    out.write_json(done_marker(shard.index), {
        "shard": shard.index,
        "shards": shard.count,
        "documents": documents,
        "pages": pages,
        "error_pages": error_pages,
        "run_ids": sorted(run_ids),
        "last_run": last_run,
        "finished_at": dt.datetime.now(dt.UTC).isoformat(),
    })


def _committed(done: dict, doc: DocRef) -> int | None:
    """How many of a document's pages are committed; None: all (it is done)."""
    resume = done.get((doc.doc_id, doc.etag), Resume(frozenset()))
    return None if resume is None else len(resume.skip)


def _render_spec(spec: JobSpec, hints: dict[str, Any]) -> RenderSpec:
    """The engine's wishes (`render_hints`: a VLM's page size) where the job spec leaves them unset."""
    return dataclasses.replace(spec.render, **{k: v for k, v in hints.items() if getattr(spec.render, k) is None})


def _producer_settings(spec: JobSpec) -> dict[str, Any]:
    """What OUT is to remember of this run (producer.settings), from the configuration
    alone: the engine is not built (engines.settings)."""
    known = engines.settings(spec.engine, spec.engine_options)
    render = dataclasses.asdict(_render_spec(spec, known["render_hints"]))
    return producer.settings(spec.engine, known["model"], known["preset"], known["prompt"], spec.route, render)


def _documents(source: Store, out: Store, spec: JobSpec, plan: PlanInfo | None) -> Iterator[DocRef]:
    """This shard's documents: from OUT's plan (`_check_sharding`'s) if it has one, else the listing."""
    shard = spec.shard
    if plan is None:
        return (d for d in list_documents(source) if shard_of(d.uri, shard.count) == shard.index)
    return located(planned_documents(out, shard.index), source)


def _check_sharding(source: Store, out: Store, spec: JobSpec) -> PlanInfo | None:
    """Before the engine loads, writing nothing: OUT's plan is this run's (its shards, its
    SOURCE), or without one, OUT's output has this run's shard count; else exit 2. Returns
    the plan (None: none), read once a run."""
    plan = read_plan(out)
    if plan is None:
        check_shard_count(out, spec.shard, spec.out)
        return None
    if plan.shards != spec.shard.count:
        raise ConfigError(f"{spec.out} has a plan of {plan.shards} shards: run with --shard I/{plan.shards}")
    if plan.source != source.canonical:
        raise ConfigError(f"{spec.out} has a plan for {plan.source}, not {source.canonical}")
    return plan


def _run_record(spec: JobSpec, engine, run_id: str, started_at: dt.datetime) -> dict[str, Any]:
    import fsspec
    import pymupdf

    return {
        "run_id": run_id,
        "started_at": started_at.isoformat(),
        "engine": engine.name,
        "model": engine.model,
        "engine_params": engine.describe(),
        "spec": spec.public(),
        "versions": {
            "batchocr": __version__,
            "python": platform.python_version(),
            "pyarrow": pa.__version__,
            "pymupdf": pymupdf.__version__,
            "fsspec": fsspec.__version__,
        },
        "host": platform.node(),
    }


def _finish(summary: RunSummary, status: str, writer: PartWriter) -> dict[str, Any]:
    counts = asdict(summary)
    timings = counts.pop("timings")
    return {
        "status": status,
        "finished_at": dt.datetime.now(dt.UTC).isoformat(),
        "counts": counts,
        "timings": timings,
        "pages_per_s": round(summary.pages_per_s, 3),
        "parts": writer.parts,
    }

"""One process's run of a shard (or of a part of one: batchocr/parts.py): the engine built,
the run record opened, the steps (batchocr/steps.py) wired from the listing to the part files,
and at the end what finished committed, the record closed and, for a whole shard, the shard
finished (batchocr/shard.py)."""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import secrets
import sys
import threading
import time
from typing import Any

import pyarrow as pa

from batchocr import cost, engines, renderpool, router
from batchocr.engines import Engine
from batchocr.errors import BatchocrError, Interrupted, NotBatchocrs, StorageError
from batchocr.progress import Progress
from batchocr.renderpool import RenderPool
from batchocr.runrecord import RunRecord
from batchocr.shard import Part, RunSummary, Shard, prepare
from batchocr.sink import KEY_COLUMNS, completed
from batchocr.spec import JobSpec
from batchocr.steps import Group, List, Read, Render, Route, Tally, Write


def new_run_id() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ") + "-" + secrets.token_hex(3)


def run_shard(spec: JobSpec, progress: bool, engine: Engine | None, stop: threading.Event,
              part: Part | None = None) -> RunSummary:
    """Run the shard of `spec` (or `part` of it) in this process with `engine` (None: the
    spec's, built here, after its turn where it is a part's)."""
    started = time.monotonic()
    started_at = dt.datetime.now(dt.UTC)
    shard = prepare(spec, sharding=part is None, settings=engine is None, stop=stop)  # before the engine loads
    start = {"turn_wait_s": 0.0, "engine_start_s": 0.0}  # the run's start: a part's turn, the engine's build
    if engine is None:
        if part is None and engines.kind(spec.engine).slow_to_build:
            idle = shard.idle_if_done(started)
            if idle is not None:  # no model loaded for a shard with nothing new
                return idle
        if part is None:  # a part's parent made it before the parts started
            engines.before_build(spec.engine, spec.engine_options)
        engine = _build(spec, part, stop, start)
        start["engine_built_s"] = time.monotonic() - started  # on the clock of first_page_s and the rest
    try:
        summary = _run(shard, engine, new_run_id(), started, started_at, progress, stop, part, start)
        if part is not None:
            part.wait_for_later_builds(stop)  # its engine's memory held while theirs is measured
        return summary
    except NotBatchocrs:  # a file of OUT's to move out, as it says: a rerun alone meets it again
        raise
    except StorageError as exc:  # said here, not by the store: `status` and `report` resume nothing
        raise StorageError(f"{exc}; committed work is intact, rerun to resume") from None
    finally:
        engine.close()  # explicitly: vLLM was seen to hang at exit otherwise


def _build(spec: JobSpec, part: Part | None, stop: threading.Event, start: dict[str, float]) -> Engine:
    """The spec's engine; a part's waits for the part before it (vLLM measures the GPU's free
    memory while it starts). Bad options or a missing extra fail here, early. The render
    workers' fork server starts first, its imports beside the build."""
    renderpool.prestart()
    t = time.monotonic()
    if part is not None:
        if part.after is not None:
            engines.preload(spec.engine)  # its imports while the part before it builds
        part.wait_turn(stop)
    start["turn_wait_s"] = (t_build := time.monotonic()) - t
    engine = engines.create(spec.engine, spec.engine_options)
    start["engine_start_s"] = time.monotonic() - t_build
    if part is not None:
        part.built()
    return engine


def _run(shard: Shard, engine: Engine, run_id: str, started: float, started_at: dt.datetime, progress: bool,
         stop: threading.Event, part: Part | None, start: dict[str, float]) -> RunSummary:
    spec = shard.spec
    render = shard.render_spec(dict(engine.render_hints))
    record = RunRecord.open(shard, engine, run_id, started_at, render, _held(engine, part))
    summary = RunSummary(run_id=run_id, shard=str(spec.shard), out=spec.out)
    pooled = contextlib.ExitStack()
    with record.failed_unless_set_up():
        keys = shard.committed(record.settings)
        tally = Tally(summary, {"render_wait_s": 0.0, "engine_s": 0.0, "write_s": 0.0, **start},
                      Progress(f"shard {spec.shard}" + (f" part {part}" if part is not None else ""), progress,
                               position=part.index if part is not None else None), started)
        listing = List(shard, (lambda: iter(part.documents)) if part is not None else shard.documents,
                       completed(keys), tally)
        listing.count()  # the progress bar's totals, in the background
        write = Write(shard, run_id, engine, tally)
        needs = router.needs(engine.needs, spec.route)
        route, group, read = Route(needs.route, write, tally), Group(engine.group_pages, stop), Read(engine, stop, tally)
        pool = pooled.enter_context(RenderPool(render, needs, spec.storage_options))
    with pooled:
        try:
            t_engine = time.monotonic()
            for rows in read(group(route(Render(pool, stop, write, tally)(group.expecting(listing()))))):
                write(rows)
            tally.timings["engine_s"] = (time.monotonic() - t_engine - tally.timings["render_wait_s"]
                                         - tally.timings["write_s"])
        finally:
            _end(sys.exc_info()[1], stop, pool, record, write, tally, engine)
    if summary.interrupted:
        exc = Interrupted(summary.line() + " (finished pages committed; rerun to resume)")
        exc.summary = dataclasses.asdict(summary)  # a part's, for the parent's line (batchocr/parts.py)
        raise exc
    if part is None:  # a part's shard is finished by its parent, once every part is done
        _finish(shard, keys, write, record.settings, summary, run_id)
    return summary


def _held(engine: Engine, part: Part | None) -> dict[str, Any]:
    """What the run holds, priced by `report --gpu-hourly-usd`: a part of a shard holds its share,
    so that `report` counts the GPU once."""
    held = cost.accelerator(engine)
    if part is not None and part.count > 1:
        held["count"] = held["count"] / part.count
    return held


def _end(failing: BaseException | None, stop: threading.Event, pool: RenderPool, record: RunRecord,
         write: Write, tally: Tally, engine: Engine) -> None:
    """Commit whatever finished, whatever happened (`failing`: what ends the run, if anything),
    and close the run record with its status; a failed flush is raised unless the run is
    failing already, and a failed record only if nothing else is."""
    summary, timings = tally.summary, tally.timings
    flush_error = None
    try:
        write.flush()
    except BatchocrError as exc:  # a full disk: the record still says the run failed
        failing = failing or exc
        flush_error = exc
    tally.bar.close()
    summary.interrupted = stop.is_set()
    summary.seconds = time.monotonic() - tally.started
    if engine.first_request_at is not None:
        timings["first_request_s"] = engine.first_request_at - tally.started
    if engine.renderer_warm_up_s is not None:
        timings["renderer_warm_up_s"] = engine.renderer_warm_up_s
    if engine.renderer_warm_up_at is not None:  # before engine_built_s: beside the build
        timings["renderer_warm_up_at_s"] = engine.renderer_warm_up_at - tally.started
    summary.timings = {k: round(v, 3) for k, v in timings.items()}
    summary.timings["render_workers_replaced"] = pool.replaced
    status = "failed" if failing else ("interrupted" if summary.interrupted else "done")
    try:
        record.close(status, summary, write.parts)
    except BatchocrError:
        if failing is None:
            raise  # else the run's own error is the one to tell
    if flush_error is not None and sys.exc_info()[1] is None:
        raise flush_error


def _finish(shard: Shard, keys: pa.Table, write: Write, settings: dict[str, Any], summary: RunSummary,
            run_id: str) -> None:
    """Every page of the shard has a row now: the shard is finished, with what compaction keeps."""
    out = shard.out
    try:
        written = [out.read_parquet(p, KEY_COLUMNS) for p in write.parts]  # this run's rows' keys
        now = pa.concat_tables([keys, *written])
    except FileNotFoundError:  # `batchocr compact` ran meanwhile: its file holds them; the shard as it is now
        now = shard.committed(settings)
    shard.finish(summary.documents + summary.documents_skipped,
                 {"run_id": run_id, "seconds": round(summary.seconds, 3), "pages": summary.pages},
                 now, set(keys.column("run_id").to_pylist()) | {run_id})

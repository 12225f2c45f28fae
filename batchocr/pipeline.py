"""Wires the stages for one shard:

    list ─► shard filter ─► skip what is committed ─► render pool ─► engine ─► part files

plus the progress bar, SIGTERM/SIGINT, the run record and the done-marker.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import platform
import secrets
import signal
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Iterator

import pyarrow as pa
from tqdm import tqdm

from batchocr import __version__, engines, schema
from batchocr.errors import BoundaryError, Interrupted
from batchocr.render import RenderTask
from batchocr.renderpool import RenderPool
from batchocr.sharding import shard_of
from batchocr.sink import PartWriter, committed_keys, completed, done_marker, shard_dir
from batchocr.sources import list_documents
from batchocr.spec import JobSpec
from batchocr.storage import Store


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
    seconds: float = 0.0
    interrupted: bool = False
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def pages_per_s(self) -> float:
        return self.pages / self.seconds if self.seconds else 0.0

    def line(self) -> str:
        if self.documents == 0 and not self.interrupted:
            return (f"batchocr: shard {self.shard}: nothing to do "
                    f"({self.documents_skipped} documents already done) in {self.out}")
        state = "interrupted after" if self.interrupted else "done:"
        skipped = f", {self.skipped_pages} skipped" if self.skipped_pages else ""
        return (
            f"batchocr: {state} {self.documents} documents, {self.pages} pages "
            f"({self.error_pages} errors{skipped}), {self.pages_per_s:.2f} pages/s, "
            f"{self.seconds:.1f} s -> {self.out}/{shard_dir(int(self.shard.split('/')[0]))} "
            f"(run {self.run_id})"
        )


def new_run_id() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ") + "-" + secrets.token_hex(3)


def run_job(spec: JobSpec, progress: bool = True) -> RunSummary:
    """Run one shard of a job to completion (or until SIGTERM/SIGINT: then commit
    what has finished and raise Interrupted)."""
    started = time.monotonic()
    started_at = dt.datetime.now(dt.UTC)
    run_id = new_run_id()
    shard = spec.shard
    out = Store(spec.out, spec.storage_options)
    source = Store(spec.source, spec.storage_options)
    summary = RunSummary(run_id=run_id, shard=str(shard), out=spec.out)

    engine = engines.create(spec.engine, spec.engine_options)  # fails early: bad options, missing extra
    record = _run_record(spec, engine, run_id, started_at)
    out.write_json(f"_runs/{run_id}.json", record | {"status": "running"})

    done = completed(committed_keys(out, shard.index))
    writer = PartWriter(out, shard.index, run_id, spec.commit)
    inflight: dict[tuple[str, int], dict] = {}
    timings = {"render_wait_s": 0.0, "engine_s": 0.0, "write_s": 0.0}
    # Not a terminal (a pod's log): a line every 30 s rather than a redrawn bar.
    bar = tqdm(unit="page", file=sys.stderr, disable=not progress, dynamic_ncols=True, desc=f"shard {shard}",
               smoothing=0.1, mininterval=0.5 if sys.stderr.isatty() else 30)

    def tasks() -> Iterator[RenderTask]:
        for doc in list_documents(source):
            if shard_of(doc.uri, shard.count) != shard.index:
                continue
            skip = done.get((doc.doc_id, doc.etag), frozenset())
            if skip is None:
                summary.documents_skipped += 1
                continue
            summary.documents += 1
            bar.set_postfix_str(f"docs {summary.documents}", refresh=False)
            yield RenderTask(doc, skip)

    def write(rows: list[dict]) -> None:
        t = time.monotonic()
        now = dt.datetime.now(dt.UTC)
        for row in rows:
            if row.get("error_type") is not None and row["error_type"] not in schema.ERROR_TYPES:
                raise BoundaryError(f"undeclared error_type {row['error_type']!r} (add it to schema.ERROR_TYPES and README)")
            row.update(engine=engine.name, model=engine.model, run_id=run_id, shard=shard.index, processed_at=now)
            summary.pages += 1
            summary.error_pages += row["finish_reason"] == "error"
            summary.skipped_pages += row["finish_reason"] == "skipped"
        writer.add(pa.Table.from_pylist(rows, schema=schema.PAGE_TABLE))
        bar.update(len(rows))
        timings["write_s"] += time.monotonic() - t

    def feed(pool: RenderPool, stop) -> Iterator[pa.RecordBatch]:
        """Render errors go straight to the table; good pages go to the engine."""
        pages = pool.run(tasks(), stop=stop.is_set)
        while True:
            t = time.monotonic()
            batch = next(pages, None)
            timings["render_wait_s"] += time.monotonic() - t
            if batch is None or stop.is_set():
                return
            failed = batch.column("error_type").is_valid()
            errors = batch.filter(failed).select(schema.CARRIED + ["error_type", "error_message"]).to_pylist()
            if errors:
                write([row | {"finish_reason": "error"} for row in errors])
            good = batch.filter(pa.compute.invert(failed))
            for row in good.select(schema.CARRIED).to_pylist():
                key = (row["doc_id"], row["page_index"])
                if key in inflight:
                    raise BoundaryError(f"render: page {key} sent twice")
                inflight[key] = row
            if good.num_rows:
                yield good

    with _stop_on_signals() as stop, RenderPool(spec.render, engine.needs, spec.storage_options) as pool:
        try:
            t_engine = time.monotonic()
            for results in engine.run(feed(pool, stop)):
                rows = []
                for res in results.to_pylist():
                    meta = inflight.pop((res["doc_id"], res["page_index"]), None)
                    if meta is None:
                        raise BoundaryError(f"engine {engine.name}: page {(res['doc_id'], res['page_index'])} output twice or never sent")
                    rows.append(meta | res)
                write(rows)
            timings["engine_s"] = time.monotonic() - t_engine - timings["render_wait_s"] - timings["write_s"]
            if inflight and not stop.is_set():
                raise BoundaryError(f"engine {engine.name}: {len(inflight)} pages never output, e.g. {next(iter(inflight))}")
        finally:
            t = time.monotonic()
            writer.flush()  # commit whatever finished, whatever happened
            timings["write_s"] += time.monotonic() - t
            engine.close()
            bar.close()
            summary.interrupted = stop.is_set()
            summary.seconds = time.monotonic() - started
            summary.timings = {k: round(v, 3) for k, v in timings.items()}
            summary.timings["render_workers_replaced"] = pool.replaced
            status = "interrupted" if summary.interrupted else ("failed" if sys.exc_info()[0] else "done")
            out.write_json(f"_runs/{run_id}.json", record | _finish(summary, status, writer))

    if summary.interrupted:
        raise Interrupted(summary.line() + " (finished pages committed; rerun to resume)")
    if summary.documents:
        out.write_json(done_marker(shard.index), {
            "shard": shard.index, "shards": shard.count, "run_id": run_id,
            "documents": summary.documents + summary.documents_skipped,
            "pages_this_run": summary.pages, "error_pages_this_run": summary.error_pages,
            "finished_at": dt.datetime.now(dt.UTC).isoformat(),
        })
    return summary


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


@contextlib.contextmanager
def _stop_on_signals():
    """SIGTERM (a spot eviction notice) and SIGINT set a flag: no new work is taken,
    finished pages are committed, and the run raises Interrupted. A second SIGINT
    stops at once."""
    stop = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return

    def handler(signum, frame):
        if stop.is_set() and signum == signal.SIGINT:
            raise KeyboardInterrupt
        stop.set()

    previous = {s: signal.signal(s, handler) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield stop
    finally:
        for s, h in previous.items():
            signal.signal(s, h)

"""A pool of render worker processes that survives its workers.

Why not concurrent.futures: a worker that hangs on a hostile PDF cannot be killed
there, and one that crashes breaks the whole pool. Here each worker has its own
pipe; a hung worker is killed and replaced, a dead one is replaced, and the
document it held becomes error rows. The pipes also give backpressure: a worker
blocks on send until the pipeline wants more pages, so memory stays bounded by
the number of workers, whatever the size of the container.
"""

from __future__ import annotations

import multiprocessing as mp
import time
from multiprocessing.connection import wait
from typing import Any, Callable, Iterable, Iterator, Mapping

import pyarrow as pa

from batchocr import schema
from batchocr.errors import BatchocrError
from batchocr import renderworker
from batchocr.render import RenderTask, doc_error, page_error
from batchocr.schema import Needs
from batchocr.spec import RenderSpec


class _Worker:
    def __init__(self, ctx, spec: RenderSpec, needs: Needs, storage_options: Mapping[str, Any]):
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(
            target=renderworker.main, args=(child, spec, needs, dict(storage_options)), daemon=True
        )
        self.process.start()
        child.close()
        self.task: RenderTask | None = None
        self.pages_seen: set[int] = set()
        self.page_count: int | None = None
        self.deadline = 0.0

    def assign(self, task: RenderTask, timeout_s: float) -> None:
        self.task, self.pages_seen, self.page_count = task, set(), None
        self.deadline = time.monotonic() + timeout_s
        self.conn.send(task)

    def stop(self, kill: bool = False) -> None:
        if kill or self.task is not None:
            self.process.kill()
        else:
            try:
                self.conn.send(None)
            except OSError:
                self.process.kill()
        self.process.join(timeout=5)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()
        self.conn.close()


class RenderPool:
    def __init__(self, spec: RenderSpec, needs: Needs, storage_options: Mapping[str, Any] | None = None):
        self.spec = spec
        self.needs = needs
        self.storage_options = dict(storage_options or {})
        # spawn: the parent holds onnxruntime/vLLM threads that must not be forked.
        self.ctx = mp.get_context("spawn")
        self.workers: list[_Worker] = []
        self.replaced = 0  # workers killed (hung) or found dead

    def __enter__(self) -> "RenderPool":
        self.workers = [self._spawn() for _ in range(self.spec.worker_count)]
        return self

    def __exit__(self, *exc) -> None:
        for w in self.workers:
            w.stop()
        self.workers = []

    def _spawn(self) -> _Worker:
        return _Worker(self.ctx, self.spec, self.needs, self.storage_options)

    def run(self, tasks: Iterable[RenderTask], stop: Callable[[], bool] = lambda: False) -> Iterator[pa.RecordBatch]:
        """Page batches of every task, in the order they finish. When stop() turns
        true, no new document is started and documents in progress are abandoned
        (their uncommitted pages are redone by the next run)."""
        pending = iter(tasks)
        exhausted = False
        timeout = self.spec.timeout_s
        while True:
            if not exhausted and not stop():
                for w in self.workers:
                    if w.task is None:
                        task = next(pending, None)
                        if task is None:
                            exhausted = True
                            break
                        w.assign(task, timeout)
            busy = [w for w in self.workers if w.task is not None]
            if not busy or stop():
                return
            now = time.monotonic()
            # Wake at least twice a second to notice stop().
            ready = wait([w.conn for w in busy], timeout=min(0.5, max(0.0, min(w.deadline for w in busy) - now)))
            for w in busy:
                if w.conn in ready:
                    try:
                        msg = w.conn.recv()
                    except (EOFError, OSError):
                        w.process.join(timeout=1)
                        why = f"the render worker died (exit code {w.process.exitcode})"
                        yield from self._replace(w, "renderer_crashed", why)
                        continue
                    w.deadline = time.monotonic() + timeout
                    if isinstance(msg, BatchocrError):
                        raise msg  # not the document's fault: no error rows, the run stops
                    if msg is None:
                        w.task = None
                        continue
                    self._note_pages(w, msg)
                    suspended = time.monotonic()
                    yield msg
                    # Time spent downstream is not the worker's: move every deadline on.
                    lag = time.monotonic() - suspended
                    for other in self.workers:
                        other.deadline += lag
                elif time.monotonic() >= w.deadline:
                    yield from self._replace(w, "timeout", f"rendering made no progress for {timeout:g} s")

    @staticmethod
    def _note_pages(w: _Worker, batch: pa.RecordBatch) -> None:
        # Two small columns only: to_pydict() would copy every page's pixels into Python.
        for index, count in zip(batch.column("page_index").to_pylist(), batch.column("page_count").to_pylist()):
            w.pages_seen.add(index)
            if count is not None:
                w.page_count = count

    def _replace(self, w: _Worker, error_type: str, why: str) -> Iterator[pa.RecordBatch]:
        """Kill w, start a fresh worker in its place, and yield the error rows for
        the pages of w's document that never arrived."""
        task = w.task
        w.stop(kill=True)
        self.workers[self.workers.index(w)] = self._spawn()
        self.replaced += 1
        doc = task.doc
        message = f"{doc.uri}: {why}"
        if w.page_count is None or -1 in w.pages_seen:
            rows = [] if -1 in w.pages_seen else [doc_error(doc, error_type, message)]
        else:
            missing = set(range(w.page_count)) - w.pages_seen - task.skip
            rows = [page_error(doc, i, w.page_count, error_type, message) for i in sorted(missing)]
        if rows:
            yield schema.batch(schema.PAGES, rows)

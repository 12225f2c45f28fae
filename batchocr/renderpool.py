"""A pool of render worker processes that survives its workers.

Why not concurrent.futures: a worker that hangs on a hostile PDF cannot be killed
there, and one that crashes breaks the whole pool. Here each worker has its own
pipe and a shared progress record (which page of which document it is on). A
worker that hangs is killed, one that dies (on a page, or idle) is replaced; the
page it was on becomes an error row, and a fresh worker renders the rest of the
document from the page after it. The pipes also give backpressure: a worker
blocks on send until the pipeline wants more pages, so memory stays bounded by
the number of workers, whatever the size of the container.
"""

from __future__ import annotations

import collections
import functools
import logging
import multiprocessing as mp
import os
import time
from multiprocessing.connection import wait
from typing import Any, Callable, Iterable, Iterator, Mapping

import pyarrow as pa

from batchocr import schema, signals
from batchocr import renderworker
from batchocr.errors import BatchocrError, StorageError
from batchocr.render import RenderTask, doc_error, page_error
from batchocr.renderprogress import COUNT, PAGE, READING, STARTED, TICKS, UNKNOWN
from batchocr.schema import Needs
from batchocr.spec import RenderSpec

log = logging.getLogger(__name__)
# Workers in a row that die before they are ready: then it is not the input.
START_FAILURES = 3
START_S = 120  # the longest a worker may take to start (imports) before it counts as hung


class _Worker:
    def __init__(self, ctx, spec: RenderSpec, needs: Needs, storage_options: Mapping[str, Any]):
        self.conn, child = ctx.Pipe()
        self.progress = ctx.RawArray("q", 4)
        self.process = ctx.Process(
            target=renderworker.main,
            args=(child, spec, needs, dict(storage_options), self.progress, os.getpid(), dict(os.environ),
                  os.getcwd()),
            daemon=True,
        )
        try:
            self.process.start()
        except BaseException:
            self.conn.close()
            child.close()
            raise
        self.born = time.monotonic()
        child.close()
        self.task: RenderTask | None = None
        self.pages_seen: set[int] = set()
        self.deadline = 0.0
        self.ticks = 0
        self.delay_seen: float | None = None

    def assign(self, task: RenderTask, timeout_s: float) -> None:
        """Raises OSError (BrokenPipeError) if the worker has died meanwhile."""
        self.progress[COUNT] = self.progress[PAGE] = UNKNOWN
        self.task, self.pages_seen = task, set()
        self.deadline = time.monotonic() + timeout_s
        self.starved()  # counted from now
        self.conn.send(task)

    def starved(self) -> float:
        """Seconds the worker was ready to run but waited for a CPU since the last
        call (Linux's schedstat run delay of its main thread, the one that renders;
        0 where the kernel does not say). Not the worker's doing: its deadline moves on
        by as much, so a busy or CPU-throttled node does not turn sound pages into
        timeouts, while a page that hangs computing, or blocked on a read, still does."""
        try:
            with open(f"/proc/{self.process.pid}/schedstat") as f:
                delay = int(f.read().split()[1]) / 1e9
        except (OSError, IndexError, ValueError):
            return 0.0
        waited, self.delay_seen = (delay - self.delay_seen if self.delay_seen is not None else 0.0), delay
        return max(0.0, waited)

    def moved_on(self) -> bool:
        """True if the worker started another page since the last call."""
        ticks = self.progress[TICKS]
        moved, self.ticks = ticks != self.ticks, ticks
        return moved

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


@functools.cache
def _preload() -> list[str]:
    """What the fork server imports before it forks a worker: batchocr.renderserver, if the
    server would import this process's batchocr. Python 3.11's forkserver starts with a fresh
    interpreter's sys.path, not this process's (CPython gh-117378): where a fresh interpreter
    finds another batchocr, or none (a path inserted by hand, a second checkout), the server
    imports nothing and each worker imports it all itself, from the run's sys.path (as slow as
    a spawned one, and right). Asked of a fresh interpreter once a process (~40 ms)."""
    import subprocess
    import sys

    import batchocr

    probe = ("import importlib.util as u; s = u.find_spec('batchocr'); "
             "print(s.submodule_search_locations[0] if s and s.submodule_search_locations else '')")
    try:
        found = subprocess.run([sys.executable, *subprocess._args_from_interpreter_flags(), "-c", probe],
                               capture_output=True, text=True, timeout=60).stdout.strip()
    except (OSError, subprocess.SubprocessError, AttributeError):
        found = ""
    same = bool(found) and os.path.realpath(found) == os.path.realpath(batchocr.__path__[0])
    return ["batchocr.renderserver"] if same else []


# A process forked from a run (vLLM's engine core, forked while the server runs: prestart) lets
# go of its copy of the pipe whose closing ends the server, as the workers do: kept, the server
# would outlive a run killed with kill -9 for as long as the engine core does. Where this process
# started no server, the handler finds nothing to close.
os.register_at_fork(after_in_child=renderworker.close_server_pipe)


def _forkserver():
    """multiprocessing's forkserver context, its server set to import what a worker needs first."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(_preload())
    return ctx


def prestart() -> None:
    """Starts the render workers' fork server now, ahead of the pool: a run calls it before its
    engine builds, so that the server's imports (PyMuPDF, pyarrow, batchocr.render: 1-2 s) run
    beside the build instead of between the build and the first page. Where the server cannot
    start, nothing: the pool meets the same error and says why (RenderPool._spawn)."""
    from multiprocessing import forkserver

    _forkserver()
    try:
        with signals.held_for_a_child():
            forkserver.ensure_running()
    except (OSError, EOFError) as exc:
        log.debug("render workers: the fork server did not start ahead (%s: %s)", type(exc).__name__, exc)


def before_os_exit() -> None:
    """What multiprocessing's exit handler would do, for a process that ends with os._exit (the
    console script, a part): remove multiprocessing's temp folder (the fork server's socket is
    in it: else each run leaves a /tmp/pymp-* behind). The server ends by itself once this process has
    (it reads the end of a pipe only this process holds); its workers end with it."""
    import shutil

    tempdir = getattr(mp.current_process(), "_config", {}).get("tempdir")
    if tempdir:
        shutil.rmtree(tempdir, ignore_errors=True)


class RenderPool:
    def __init__(self, spec: RenderSpec, needs: Needs, storage_options: Mapping[str, Any] | None = None):
        self.spec = spec
        self.needs = needs
        self.storage_options = dict(storage_options or {})
        # Not fork: the parent holds onnxruntime/vLLM threads that must not be forked. Forks of a
        # fork server that imported what a worker needs (batchocr/renderserver.py): a spawned
        # worker imports it all again, about a second of CPU each.
        self.ctx = _forkserver()
        self.workers: list[_Worker] = []
        self.replaced = 0  # workers killed (hung) or found dead
        self._start_failures = 0
        # Rest of documents whose worker hung or died: before any new document.
        self._resume: collections.deque[RenderTask] = collections.deque()

    def __enter__(self) -> "RenderPool":
        # One now (a broken install shows before any document); the others as documents come
        # to them: no more processes than documents at once (render.workers 1000 must not start
        # 1,000 processes for one document).
        self.workers = [self._spawn()]
        return self

    def __exit__(self, *exc) -> None:
        for w in self.workers:
            w.stop()
        self.workers = []

    def _spawn(self) -> _Worker:
        try:
            return self._start()
        except (OSError, EOFError) as exc:
            if self.ctx.get_start_method() != "forkserver":
                raise
            # The fork server could not start: its socket's path is too long for AF_UNIX (108
            # bytes) under a long TMPDIR, or the temp folder cannot be written; or it is gone
            # (killed: EOFError or a refused connection). Spawned workers need none of it:
            # slower to start, the same pages.
            log.warning("render workers: the fork server could not start (%s: %s); spawning each worker "
                        "instead", type(exc).__name__, exc)
            self.ctx = mp.get_context("spawn")
            return self._start()

    def _start(self) -> _Worker:
        """A worker; the fork server or a spawned worker ignores SIGINT and SIGTERM from its
        first instant (signals.held_for_a_child)."""
        with signals.held_for_a_child():
            return _Worker(self.ctx, self.spec, self.needs, self.storage_options)

    def run(self, tasks: Iterable[RenderTask], stop: Callable[[], bool] = lambda: False) -> Iterator[pa.RecordBatch]:
        """Page batches of every task, in the order they finish. When stop() turns
        true, no new document is started and documents in progress are abandoned
        (their uncommitted pages are redone by the next run)."""
        pending = iter(tasks)
        exhausted = False
        timeout = self.spec.timeout_s
        while True:
            if not stop():
                exhausted = self._assign(pending, exhausted, timeout)
            busy = [w for w in self.workers if w.task is not None]
            if not busy or stop():
                return
            now = time.monotonic()
            # Wake at least twice a second to notice stop() and pages started.
            ready = wait([w.conn for w in busy], timeout=min(0.5, max(0.0, min(w.deadline for w in busy) - now)))
            for w in busy:  # the timeout counts the worker's time, not the time it waited for a CPU
                w.deadline += w.starved()
            for w in busy:
                if w.conn in ready:
                    yield from self._receive(w, timeout)
                else:
                    yield from self._watch(w, timeout)

    def _assign(self, pending: Iterator[RenderTask], exhausted: bool, timeout: float) -> bool:
        """A task for each idle worker, up to render.workers: the rest of a document whose
        worker hung or died first, then the next of `pending`. Returns whether `pending` is
        exhausted."""
        for i in range(self.spec.worker_count):
            if i < len(self.workers) and self.workers[i].task is not None:
                continue
            task = self._resume.popleft() if self._resume else None
            if task is None and not exhausted:
                task = next(pending, None)
                exhausted = task is None
            if task is None:
                break
            if i == len(self.workers):  # every worker busy: one more, for this document
                self.workers.append(self._spawn())
            while True:
                try:
                    self.workers[i].assign(task, timeout)
                    break
                except OSError:  # it died while idle: a fresh one takes the task
                    self.workers[i].task = None
                    self._replace_idle(i)
        return exhausted

    def _receive(self, w: _Worker, timeout: float) -> Iterator[pa.RecordBatch]:
        """What a worker sent: a batch of pages (yielded), the end of its document, or the
        error that stops the run; or its death (an error row, and a fresh worker)."""
        try:
            msg = w.conn.recv()
        except (EOFError, OSError):
            w.process.join(timeout=1)
            why = f"the render worker died (exit code {w.process.exitcode})"
            yield from self._replace(w, "renderer_crashed", why)
            return
        w.deadline = time.monotonic() + timeout
        if isinstance(msg, BatchocrError):
            raise msg  # not the document's fault: no error rows, the run stops
        if msg is None:
            w.task = None
            return
        w.pages_seen.update(msg.column("page_index").to_pylist())
        suspended = time.monotonic()
        yield msg
        # Time spent downstream is not the worker's: move every deadline on.
        lag = time.monotonic() - suspended
        for other in self.workers:
            other.deadline += lag

    def _watch(self, w: _Worker, timeout: float) -> Iterator[pa.RecordBatch]:
        """A busy worker that sent nothing: its deadline moves on while it makes progress;
        past it, the worker is replaced and its page gets a timeout row."""
        if w.moved_on() or (not w.progress[STARTED] and time.monotonic() < w.born + START_S):
            # A page started, or the worker is still importing (seconds on a busy node):
            # the timeout is on rendering.
            w.deadline = time.monotonic() + timeout
        elif time.monotonic() >= w.deadline:
            if w.progress[PAGE] == READING:
                # Stuck downloading the document: SOURCE's storage, not the document (every
                # document would follow): the run stops, the document is read by the next run.
                raise StorageError(f"{w.task.doc.uri}: reading it from SOURCE made no progress for "
                                   f"{timeout:g} s (render.timeout_s): is the storage reachable?")
            yield from self._replace(w, "timeout", f"rendering made no progress for {timeout:g} s")

    def _replace_idle(self, i: int) -> None:
        w = self.workers[i]
        w.stop(kill=True)
        self._check_started(w)
        self.workers[i] = self._spawn()
        self.replaced += 1

    def _check_started(self, w: _Worker) -> None:
        """Workers that keep dying before they are ready (a broken install, no
        memory for one more process) stop the run: it is not any document's fault."""
        if w.progress[STARTED]:
            self._start_failures = 0
            return
        self._start_failures += 1
        if self._start_failures >= START_FAILURES:
            raise BatchocrError(f"render workers die before they start ({START_FAILURES} in a row, the last with "
                                f"exit code {w.process.exitcode}): is memory short, or the install broken?")

    def _replace(self, w: _Worker, error_type: str, why: str) -> Iterator[pa.RecordBatch]:
        """Kill w and start a fresh worker in its place. The page w was on gets an
        error row; the rest of its document goes to a fresh worker, first."""
        task = w.task
        count, page = w.progress[COUNT], w.progress[PAGE]
        w.stop(kill=True)
        self.workers[self.workers.index(w)] = self._spawn()
        self.replaced += 1
        if not w.progress[STARTED]:  # it never took the task: not the document's doing
            self._check_started(w)
            self._resume.appendleft(task)
            return
        self._start_failures = 0
        doc = task.doc
        message = f"{doc.uri}: {why}"
        attempts = {i: 2 if i in task.retry else 1 for i in (page, -1)}
        done = w.pages_seen | task.skip
        if -1 in w.pages_seen:  # its only row (the document cannot be read) had arrived
            rows = []
        elif count == UNKNOWN:  # on opening it: no page count to give rows to
            rows = [doc_error(doc, error_type, message) | {"attempts": attempts[-1]}]
        elif 0 <= page < count and page not in done:
            rows = [page_error(doc, page, count, error_type, f"{doc.uri}: page {page}: {why}")
                    | {"attempts": attempts[page]}]
            rest = frozenset(range(count)) - done - {page}
            if rest:
                self._resume.appendleft(RenderTask(doc, frozenset(done | {page}), task.retry))
        else:  # every page rendered: it died sending them, or closing the file
            rows = [page_error(doc, i, count, error_type, message) for i in sorted(set(range(count)) - done)]
        if rows:
            yield schema.batch(schema.PAGES, rows)

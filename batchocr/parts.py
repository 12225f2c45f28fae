"""One shard in several processes side by side (`processes` N in the job spec, `--processes N`).

Why: one batchocr process is host-bound before the GPU is: vLLM's engine core steps one
batch at a time in one interpreter, and the GPU waits for it. Two whole pipelines, each a
process of its own with its own engine, keep the GPU busier than one, or than two engines in
one process, which share its interpreter (measured figures: docs/PERFORMANCE.md).

How: the parent prepares the shard once (batchocr/shard.py) and deals the documents with
pages to do into N shares balanced by bytes; each part runs its share in a spawned process
(batchocr/runner.py; vLLM and onnxruntime hold threads a fork must not copy). The parts
build their engines one after the other (vLLM measures the GPU's free memory while it
starts: two at once would each count the other's, and memory given back meanwhile fails its
start, so a part done early keeps its engine until the later parts have built theirs), each
with its share of the accelerator (`engines.shared`: vLLM's gpu_memory_utilization / N, less
what the model takes beyond vLLM's profile), or all at once where the engine needs no measure
(`engines.starts_alone`: vLLM with kv_cache_gib, the KV cache's size, given, or set by
`engines.shared` from the card and the preset). What the engines run beside starts before the
parts and ends after them (`engines.beside`: vLLM's MPS daemon, engines.vllm.mps, so that the
parts' kernels share the GPU side by side). The parent forwards SIGTERM and SIGINT to the
parts (each commits what finished, as a run alone does), stops the others when one fails (a
systemic failure is the run's: one line, its exit code), and finishes the shard once every
part is done. Whether page errors before any page was read are the engine's or the pages' is
judged over all parts (batchocr.engines.systemic.Parts). Each part writes its own run record,
holding 1/N of the accelerator, so `report` counts the GPU once.
"""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import os
import signal
import threading
import time
from multiprocessing.connection import wait

from batchocr import engines, errors, signals
from batchocr.engines import systemic
from batchocr.errors import BatchocrError, Interrupted
from batchocr.partentry import NOTHING as _NOTHING, main as part_main
from batchocr.shard import Part, RunSummary, prepare
from batchocr.sources import DocRef
from batchocr.spec import JobSpec
from batchocr.words import plural

STOP_S = 120  # after a stop is forwarded: how long the parts have to commit before they are killed


def shares(documents: list[DocRef], n: int) -> list[list[DocRef]]:
    """`documents` dealt into n shares of about equal bytes (largest first to the lightest
    share), each in the listing's order; an empty share is left out."""
    loads = [0] * n
    owner: dict[int, int] = {}
    for i in sorted(range(len(documents)), key=lambda i: -documents[i].size):
        j = min(range(n), key=lambda j: loads[j])
        owner[i] = j
        loads[j] += max(documents[i].size, 1)
    out: list[list[DocRef]] = [[] for _ in range(n)]
    for i, doc in enumerate(documents):
        out[owner[i]].append(doc)
    return [s for s in out if s]


_STOP_EXITS = {-s for s in signals.STOP}  # a part's exit code when a stop signal killed it


def run_parts(spec: JobSpec, progress: bool, stop: threading.Event) -> RunSummary:
    """Run the shard of `spec` as spec.processes parts; the combined RunSummary."""
    started = time.monotonic()
    shard = prepare(spec, stop=stop)  # exit 2 before any part starts
    # Only documents with pages to do are dealt: a CronJob's rerun over a mostly done shard
    # balances the new work, not the listing.
    todo, finished = shard.pending()
    if not todo:  # nothing to do: no engine is loaded for it
        return shard.idle(finished, started)
    engines.before_build(spec.engine, spec.engine_options)  # once, here: the parts inherit it
    dealt = shares(todo, spec.processes)
    parts = _Parts(spec, len(dealt))
    with engines.beside(spec.engine, spec.engine_options, len(dealt)):  # vLLM's MPS daemon: the parts inherit it
        try:
            parts.start(dealt, progress, stop)
            parts.watch(stop)
        finally:
            parts.close()
    failed = [r for r in parts.results.values() if r[0] == "error"]
    if failed:
        _, name, message, code = failed[0]
        raise _error(name, message, code)
    summary, run_ids = _combined(spec, parts.results, finished, started)
    if summary.interrupted:
        raise Interrupted(summary.line() + f" ({plural(parts.n, 'part')}; finished pages committed; rerun to resume)")
    shard.finish(summary.documents + summary.documents_skipped,
                 {"run_ids": run_ids, "seconds": round(summary.seconds, 3), "pages": summary.pages})
    return summary


class _Parts:
    """The parts' processes, as the parent sees them: started, watched until each has given its
    result (or died), stopped together."""

    def __init__(self, spec: JobSpec, n: int):
        self.spec, self.n = spec, n
        self.ctx = mp.get_context("spawn")
        self.built = [self.ctx.Event() for _ in range(n)]
        self.judged = systemic.Parts.new_array(self.ctx, n)
        self.procs: list = []
        self.conns: list = []
        self.results: dict[int, tuple] = {}
        self.stopping_at: float | None = None

    def start(self, dealt: list[list[DocRef]], progress: bool, stop: threading.Event) -> None:
        """Each part's process, with its share of the accelerator; in turn where the engine must
        start alone, else all at once (vLLM with kv_cache_gib given)."""
        spec, n = self.spec, self.n
        one = dataclasses.replace(spec, processes=1, engines={
            **spec.engines, spec.engine: engines.shared(spec.engine, spec.engine_options, n)})
        in_turn = engines.starts_alone(one.engine, one.engine_options)
        for j in range(n):
            if stop.is_set():  # SIGTERM before every part has started: none more starts
                break
            part = Part(j, n, dealt[j], self.built[j - 1] if j and in_turn else None, self.built[j], self.judged,
                        tuple(self.built[j + 1:]) if in_turn else ())
            recv, send = self.ctx.Pipe(duplex=False)
            p = self.ctx.Process(target=part_main, args=(one, part, progress, send, os.getpid()),
                                 name=f"batchocr-part-{j + 1}")
            with signals.held_for_a_child():  # until part_main has its handlers in place
                p.start()
            send.close()
            self.procs.append(p)
            self.conns.append(recv)
        self.results = {j: ("interrupted", _NOTHING) for j in range(len(self.procs), n)}

    def stop(self) -> None:
        """SIGTERM to every part still running (each commits what finished), once."""
        if self.stopping_at is None:
            self.stopping_at = time.monotonic()
            for p in self.procs:
                if p.is_alive():
                    os.kill(p.pid, signal.SIGTERM)

    def watch(self, stop: threading.Event) -> None:
        """Until every part has its result; the run's stop is passed on, and one part's error
        stops the others (they commit what finished: the run ends with that error)."""
        n = self.n
        while len(self.results) < n:
            if stop.is_set():
                self.stop()
            if self.stopping_at is not None and time.monotonic() > self.stopping_at + STOP_S:
                for p in self.procs:
                    if p.is_alive():
                        p.kill()
            left = {self.conns[j]: j for j in range(n) if j not in self.results}
            for conn in wait(list(left), timeout=0.5):
                j = left[conn]
                self.results[j] = self._result(j, conn, stop)
                self.built[j].set()  # a part gone builds nothing: the parts before it wait no more
                systemic.Parts.finished(self.judged, j)  # a part waiting to judge does not wait on it
                if self.results[j][0] == "error":
                    self.stop()

    def _result(self, j: int, conn, stop: threading.Event) -> tuple:
        try:
            return conn.recv()
        except (EOFError, OSError):  # it died without a word (killed, out of memory)
            self.procs[j].join(5)
            if self.procs[j].exitcode in _STOP_EXITS and (stop.is_set() or self.stopping_at is not None):
                # Stopped by the signal the run passed on (or the group's own), before the
                # part's handler was in place (its start-up): it had committed nothing.
                return ("interrupted", _NOTHING)
            return ("error", "BatchocrError", f"part {j + 1}/{self.n} of shard {self.spec.shard}: its process "
                    f"died (exit code {self.procs[j].exitcode}); committed work is intact, rerun to resume",
                    errors.EXIT_FAILED)

    def close(self) -> None:
        """Every process joined (killed after STOP_S), every pipe closed, the shared events freed."""
        if len(self.results) < self.n:  # the parent's own failure (a bug, a second Ctrl-C): the parts stop too
            self.stop()
        for p in self.procs:
            p.join(STOP_S)
            if p.is_alive():
                p.kill()
                p.join()
            p.close()
        for conn in self.conns:
            conn.close()
        del self.built, self.judged  # their semaphores, unlinked now (not left to the resource tracker's warning at exit)


def _combined(spec: JobSpec, results: dict[int, tuple], finished: int,
              started: float) -> tuple[RunSummary, list[str]]:
    """The shard's summary from its parts' (`finished`: documents done before this run, which no
    part saw), and the parts' run ids."""
    summaries = [results[j][1] for j in range(len(results))]
    run_ids = [s["run_id"] for s in summaries if s["run_id"]]  # none: interrupted before its engine
    summary = RunSummary(run_id=", ".join(run_ids), shard=str(spec.shard), out=spec.out,
                         seconds=time.monotonic() - started,
                         interrupted=any(r[0] == "interrupted" for r in results.values()))
    summary.documents_skipped = finished
    for s in summaries:
        for key in ("documents", "documents_skipped", "pages", "error_pages", "skipped_pages", "routed_pages",
                    "failed_documents"):
            setattr(summary, key, getattr(summary, key) + s[key])
    return summary, run_ids


def _error(name: str, message: str, code: int) -> BatchocrError:
    cls = getattr(errors, name, None)
    exc = cls(message) if isinstance(cls, type) and issubclass(cls, BatchocrError) else BatchocrError(message)
    exc.exit_code = code
    return exc

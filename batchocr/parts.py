"""One shard in several processes side by side (`processes` N in the job spec, `--processes N`).

Why: one batchocr process is host-bound before the GPU is. With Unlimited-OCR on an
H200 one engine left the GPU about half idle (its scheduler and its outputs, a step at
a time); a second engine in the same process (`engines.vllm.instances: 2`) shared that
process's interpreter with the first, and made 1.11x the pages/s of one over 2,048 pages
(1.39x once both were full, after a start four times as long), while two whole
pipelines, each a process of its own, made 1.40x over 4,096 (docs/GPU.md). So a shard
can run as N parts: each part is a process with its own render pool, engine and
part files, over a share of the shard's documents, all into the shard's folder.

How: the parent lists the shard once and deals its documents into N shares balanced by
bytes; each part is `run_job` over its share, in a spawned process (vLLM and
onnxruntime hold threads a fork must not copy). The parts build their engines one
after the other (vLLM measures the GPU's free memory while it starts: two at once
would each count the other's), each with its share of the accelerator
(`engines.shared`: vLLM's gpu_memory_utilization / N), or all at once where the
engine needs no measure (`engines.starts_alone`: vLLM with kv_cache_gib, the KV
cache's size, given). The parent forwards SIGTERM and SIGINT to the parts (each
commits what finished, as a run alone does), stops the others when one fails (a
systemic failure is the run's: one line, its exit code), and writes the shard's
done-marker once every part is done. Whether page errors before any page was read are the
engine's or the pages' is judged over all parts (batchocr.engines.systemic.Parts). Each part writes its own run
record, holding 1/N of the accelerator, so `report` counts the GPU once.
"""

from __future__ import annotations

import dataclasses
import multiprocessing as mp
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import wait
from typing import Any

from batchocr import engines, errors, producer, signals
from batchocr.engines import systemic
from batchocr.errors import BatchocrError, Interrupted
from batchocr.sink import completed
from batchocr.sources import DocRef, check_stores
from batchocr.spec import JobSpec
from batchocr.storage import Store
from batchocr.words import plural

STOP_S = 120  # after a stop is forwarded: how long the parts have to commit before they are killed


@dataclass
class Part:
    """Part `index` of `count` of a shard: its documents, and the engine start it waits for."""

    index: int
    count: int
    documents: list[DocRef]
    after: Any = None  # an Event: the part before it has built its engine (None: the first part)
    ready: Any = None  # an Event this part sets once its engine is built
    judged: Any = None  # what the parts share to tell a broken engine from bad pages (systemic.Parts)

    def __str__(self) -> str:
        return f"{self.index + 1}/{self.count}"

    def wait_turn(self, stop: threading.Event) -> None:
        """Until the part before this one has its engine (or the run stops)."""
        while self.after is not None and not self.after.wait(0.2):
            if stop.is_set():
                raise Interrupted(f"batchocr: part {self}: interrupted before its engine started (nothing done)")

    def built(self) -> None:
        if self.ready is not None:
            self.ready.set()


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


_NOTHING = {"run_id": "", "documents": 0, "documents_skipped": 0, "pages": 0, "error_pages": 0, "skipped_pages": 0,
            "routed_pages": 0}  # an interrupted part's summary before its run began
_STOP_EXITS = {-s for s in signals.STOP}  # a part's exit code when a stop signal killed it


def run_parts(spec: JobSpec, progress: bool, stop: threading.Event):
    """Run the shard of `spec` as spec.processes parts; the combined RunSummary."""
    from batchocr import pipeline

    started = time.monotonic()
    out = Store(spec.out, spec.storage_options)
    source = Store(spec.source, spec.storage_options)
    check_stores(source, out)
    plan = pipeline._check_sharding(source, out, spec)  # exit 2 before any part starts
    settings = pipeline._producer_settings(spec)
    producer.check(out, settings, spec.reprocess, spec.out)  # exit 2 before any part starts
    # Only documents with pages to do are dealt: a CronJob's rerun over a mostly done shard
    # balances the new work, not the listing.
    todo, finished = pipeline.pending(pipeline._documents(source, out, spec, plan),
                                      completed(pipeline.current_keys(out, spec.shard.index, settings)))
    if not todo:  # nothing to do: no engine is loaded for it
        return pipeline.idle_run(spec, out, finished, started, settings)
    dealt = shares(todo, spec.processes)
    n = len(dealt)
    one = dataclasses.replace(spec, processes=1, engines={
        **spec.engines, spec.engine: engines.shared(spec.engine, spec.engine_options, n)})
    ctx = mp.get_context("spawn")
    built = [ctx.Event() for _ in range(n)]
    judged = systemic.Parts.new_array(ctx, n)
    in_turn = engines.starts_alone(one.engine, one.engine_options)  # else all at once (kv_cache_gib given)
    procs, conns = [], []
    for j in range(n):
        if stop.is_set():  # SIGTERM before every part has started: none more starts
            break
        part = Part(j, n, dealt[j], built[j - 1] if j and in_turn else None, built[j], judged)
        recv, send = ctx.Pipe(duplex=False)
        p = ctx.Process(target=_part_main, args=(one, part, progress, send, os.getpid()),
                        name=f"batchocr-part-{j + 1}")
        with signals.held_for_a_child():  # until _part_main has its handlers in place
            p.start()
        send.close()
        procs.append(p)
        conns.append(recv)
    results: dict[int, tuple] = {j: ("interrupted", _NOTHING) for j in range(len(procs), n)}
    stopping_at = None

    def stop_parts() -> None:
        nonlocal stopping_at
        if stopping_at is None:
            stopping_at = time.monotonic()
            for p in procs:
                if p.is_alive():
                    os.kill(p.pid, signal.SIGTERM)

    try:
        while len(results) < n:
            if stop.is_set():
                stop_parts()
            if stopping_at is not None and time.monotonic() > stopping_at + STOP_S:
                for p in procs:
                    if p.is_alive():
                        p.kill()
            left = {conns[j]: j for j in range(n) if j not in results}
            for conn in wait(list(left), timeout=0.5):
                j = left[conn]
                try:
                    results[j] = conn.recv()
                except (EOFError, OSError):  # it died without a word (killed, out of memory)
                    procs[j].join(5)
                    if procs[j].exitcode in _STOP_EXITS and (stop.is_set() or stopping_at is not None):
                        # Stopped by the signal the run passed on (or the group's own), before the
                        # part's handler was in place (its start-up): it had committed nothing.
                        results[j] = ("interrupted", _NOTHING)
                        systemic.Parts.finished(judged, j)
                        continue
                    results[j] = ("error", "BatchocrError", f"part {j + 1}/{n} of shard {spec.shard}: its process "
                                  f"died (exit code {procs[j].exitcode}); committed work is intact, rerun to resume",
                                  errors.EXIT_FAILED)
                systemic.Parts.finished(judged, j)  # a part waiting to judge does not wait on it
                if results[j][0] == "error":
                    stop_parts()  # the others commit what finished and stop: the run ends with this one's error
    finally:
        if len(results) < n:  # the parent's own failure (a bug, a second Ctrl-C): the parts stop too
            stop_parts()
        for p in procs:
            p.join(STOP_S)
            if p.is_alive():
                p.kill()
                p.join()
            p.close()
        for conn in conns:
            conn.close()
        del built, judged  # their semaphores, unlinked now (not left to the resource tracker's warning at exit)
    failed = [r for r in results.values() if r[0] == "error"]
    if failed:
        _, name, message, code = failed[0]
        raise _error(name, message, code)
    summaries = [results[j][1] for j in range(n)]
    run_ids = [s["run_id"] for s in summaries if s["run_id"]]  # none: interrupted before its engine
    summary = pipeline.RunSummary(run_id=", ".join(run_ids), shard=str(spec.shard), out=spec.out,
                                  seconds=time.monotonic() - started,
                                  interrupted=any(r[0] == "interrupted" for r in results.values()))
    summary.documents_skipped = finished  # done before this run: no part saw them
    for s in summaries:
        for key in ("documents", "documents_skipped", "pages", "error_pages", "skipped_pages", "routed_pages"):
            setattr(summary, key, getattr(summary, key) + s[key])
    if summary.interrupted:
        raise Interrupted(summary.line() + f" ({plural(n, 'part')}; finished pages committed; rerun to resume)")
    pipeline.mark_done(out, spec.shard, summary.documents + summary.documents_skipped,
                       {"run_ids": run_ids, "seconds": round(summary.seconds, 3),
                        "pages": summary.pages}, settings)
    return summary


def _error(name: str, message: str, code: int) -> BatchocrError:
    cls = getattr(errors, name, None)
    exc = cls(message) if isinstance(cls, type) and issubclass(cls, BatchocrError) else BatchocrError(message)
    exc.exit_code = code
    return exc


def _part_main(spec: JobSpec, part: Part, progress: bool, conn, parent_pid: int) -> None:
    """A part's process: run_job over its share; its summary, or its error, to the parent.
    It dies with the parent (kill -9 of the run must not leave parts writing on, to meet a
    rerun's parts over the same pages), as render workers do."""
    from batchocr import pipeline
    from batchocr.renderworker import die_with_parent

    die_with_parent(parent_pid)
    if part.judged is not None:
        systemic.share(systemic.Parts(part.judged, part.index))

    code = errors.EXIT_OK
    try:
        with signals.graceful_stop():  # before the signals held since the spawn come: a stop, not a death
            signal.pthread_sigmask(signal.SIG_UNBLOCK, signals.STOP)
            summary = pipeline.run_job(spec, progress=progress, part=part)
        conn.send(("done", dataclasses.asdict(summary)))
    except Interrupted as exc:
        summary = getattr(exc, "summary", None)
        conn.send(("interrupted", summary or _NOTHING))
        code = exc.exit_code
    except BatchocrError as exc:
        conn.send(("error", type(exc).__name__, str(exc), exc.exit_code))
        code = exc.exit_code
    except BaseException as exc:  # noqa: BLE001 - a bug: its traceback here, the run's one line there
        import traceback

        traceback.print_exc()
        conn.send(("error", "BoundaryError", f"part {part} of shard {spec.shard}: {type(exc).__name__}: {exc}",
                   errors.EXIT_FAILED))
        code = errors.EXIT_FAILED
    finally:
        conn.close()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
    from batchocr.renderpool import before_os_exit

    before_os_exit()
    os._exit(code)  # as the console script does (batchocr.cli.entry): no interpreter teardown

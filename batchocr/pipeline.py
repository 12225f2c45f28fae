"""A job's entry point: `run_job` runs one shard of a job, in this process (batchocr/runner.py)
or, with `processes` N > 1, as N processes side by side (batchocr/parts.py), until it is done or
SIGTERM/SIGINT stops it (batchocr/signals.py).

    list ─► render ─► route ─► group ─► read ─► write      (batchocr/steps.py)
"""

from __future__ import annotations

import dataclasses
import sys
import threading

from batchocr import engines
from batchocr.errors import ConfigError, Interrupted
from batchocr.parts import run_parts
from batchocr.runner import run_shard
from batchocr.shard import Part, RunSummary
from batchocr.signals import graceful_stop
from batchocr.spec import JobSpec

__all__ = ["RunSummary", "run_job"]


def run_job(spec: JobSpec, progress: bool = True, engine: engines.Engine | None = None,
            stop: threading.Event | None = None, part: Part | None = None) -> RunSummary:
    """Run one shard of a job to completion, or until SIGTERM/SIGINT (or `stop` set): then
    commit what has finished and raise Interrupted. `engine` defaults to the spec's. With
    spec.processes N > 1 the shard runs as N parts, each a process; `part` is one of them (its
    documents, its turn to build its engine), run in that process."""
    if stop is None:
        with graceful_stop() as stop:
            return run_job(spec, progress, engine, stop, part)
    if stop.is_set():
        raise Interrupted("batchocr: interrupted before the run started (nothing done; rerun to resume)")
    if spec.processes == "auto":
        spec = resolve_processes(spec, engine)
    if spec.processes > 1:
        if engine is not None:
            raise ConfigError(f"processes: {spec.processes} builds an engine in each part's process: "
                              "pass no engine (or processes: 1)")
        return run_parts(spec, progress, stop)
    return run_shard(spec, progress, engine, stop, part)


def resolve_processes(spec: JobSpec, engine: engines.Engine | None = None, say=None) -> JobSpec:
    """`processes: auto` as the number of processes that pay for the spec's engine on this
    machine (an engine given: 1, it is this process's), said in one line on stderr."""
    say = say or (lambda line: print(line, file=sys.stderr, flush=True))
    n, why = (1, "an engine was given") if engine is not None else engines.auto_processes(
        spec.engine, spec.engine_options)
    say(f"processes auto: {n} ({why})")
    return dataclasses.replace(spec, processes=n)

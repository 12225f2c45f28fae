"""Spot-safety machinery shared by the chaos tests, whatever the storage (a local
folder, Azure Blob): a run slowed down so that kills land mid-run
(tests/pod_driver.py), killed at random instants and resumed, then compared
with a clean run after compaction."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Mapping

import polars as pl
import yaml

from batchocr import procstat, read_pages
from batchocr.compact import compact
from batchocr.errors import EXIT_INTERRUPTED
from batchocr.storage import Store
from conftest import HANG_S, ROOT

DRIVER = ROOT / "tests" / "pod_driver.py"
MS_PER_PAGE = 80  # slow enough that 8 kills (12 once) land before 300 pages are done, even with a fast start-up
KEY = ["doc_id", "page_index"]


def write_job(tmp: Path, source: str | Path, out: str | Path, storage_options: Mapping | None = None,
              name: str | None = None, **sections) -> Path:
    """A textlayer job committing every 7 pages or 0.3 s; `sections` override
    (e.g. commit={"every_pages": 3})."""
    spec = {"source": str(source), "out": str(out), "engine": "textlayer",
            "render": {"workers": 2, "batch_pages": 2}, "commit": {"every_pages": 7, "every_seconds": 0.3}}
    spec |= sections
    if storage_options:
        spec["storage_options"] = dict(storage_options)
    job = tmp / f"job-{name or str(out).rstrip('/').rsplit('/', 1)[-1]}.yaml"
    job.write_text(yaml.safe_dump(spec))
    return job


def start(job: Path, ms_per_page: float = MS_PER_PAGE, env: Mapping | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(DRIVER), str(job), str(ms_per_page)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            env={**os.environ, "CHAOS_STARTED": str(started_file(job)), **(env or {})})


def started_file(job: Path) -> Path:
    """Where the driver notes each run of `job` whose engine got its first pages."""
    return job.with_suffix(".started")


def wait_until_running(job: Path, proc: subprocess.Popen, runs_before: int, timeout: float = HANG_S) -> bool:
    """Until this run's engine has started (True), or the process has ended (False)."""
    deadline = time.monotonic() + timeout
    marker = started_file(job)
    while time.monotonic() < deadline:
        if marker.exists() and len(marker.read_text().splitlines()) > runs_before:
            return True
        if proc.poll() is not None:
            return False
        time.sleep(0.02)
    raise AssertionError(f"the run of {job} did not start within {timeout} s")


def finish(job: Path, timeout: float = 300, ms_per_page: float = 0, **kwargs) -> subprocess.CompletedProcess:
    """A run left to complete. Not slowed down by default: the slowing is there for
    kills to land mid-run (clean runs and the runs after the kills need none)."""
    proc = start(job, ms_per_page, **kwargs)
    out, err = proc.communicate(timeout=timeout)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def table(out: str | Path, storage_options: Mapping | None = None) -> pl.DataFrame:
    return read_pages(str(out), storage_options).select(*KEY, "text", "finish_reason", "run_id").collect()


def run_with_kills(job: Path, sig: int, kills_wanted: int, rnd: random.Random,
                   window: tuple[float, float] = (0.0, 1.2)) -> tuple[int, list[str]]:
    """Start the job and kill it (its whole process group) at a random instant of
    `window` seconds after its engine got its first pages, again and again, then let
    it finish. Timed from the run's own start, so a busy machine's slow start-up
    cannot swallow the kills. Returns the kills made and the stderr of each run that
    SIGTERM interrupted."""
    kills, attempts, interrupted_runs = 0, 0, []
    while kills < kills_wanted:
        attempts += 1
        assert attempts < kills_wanted * 4, "the run kept finishing before the kill"
        marker = started_file(job)
        runs_before = len(marker.read_text().splitlines()) if marker.exists() else 0
        proc = start(job)
        if wait_until_running(job, proc, runs_before):
            time.sleep(rnd.uniform(*window))
        if proc.poll() is not None:  # finished before the kill: the shard is done
            assert proc.returncode == 0, proc.stderr.read()
            break
        os.killpg(proc.pid, sig)
        code = proc.wait(timeout=60)
        kills += 1
        if sig == signal.SIGTERM:
            err = proc.stderr.read()
            # The run was under way: it commits what finished and says so, or it had just finished.
            assert code in (0, EXIT_INTERRUPTED), (code, err)
            if code == EXIT_INTERRUPTED:
                interrupted_runs.append(err)
    done = finish(job)  # left to finish
    assert done.returncode == 0, done.stderr
    return kills, interrupted_runs


def assert_same_as_clean(out: str | Path, clean: pl.DataFrame, storage_options: Mapping | None = None) -> None:
    """Compaction leaves exactly the clean run's table, and dropped no page the
    uncompacted table had."""
    before = table(out, storage_options)
    compact(Store(str(out), storage_options))
    after = table(out, storage_options)
    assert after.select(KEY).is_unique().all(), "duplicates after compaction"
    assert after.sort(KEY).select(*KEY, "text", "finish_reason").equals(
        clean.sort(KEY).select(*KEY, "text", "finish_reason")
    )
    assert set(before.select(*KEY).unique().rows()) == set(after.select(*KEY).rows())


# Processes of a run: render workers are its fork server's children (batchocr/renderserver.py).
def children(pid: int) -> set[int]:
    try:
        return {int(p) for p in open(f"/proc/{pid}/task/{pid}/children").read().split()}
    except (FileNotFoundError, ProcessLookupError):  # gone (or going) meanwhile
        return set()


def _cmdline(pid: int) -> bytes:
    """The process's command line; empty for one that ended after it was listed."""
    try:
        return open(f"/proc/{pid}/cmdline", "rb").read()
    except (FileNotFoundError, ProcessLookupError):
        return b""


def descendants(pid: int) -> set[int]:
    """Children, theirs, and so on: the render workers are the fork server's children."""
    found, todo = set(), [pid]
    while todo:
        for child in children(todo.pop()) - found:
            found.add(child)
            todo.append(child)
    return found


def fork_servers(pid: int) -> list[int]:
    """The run `pid`'s fork servers (multiprocessing's: the render workers')."""
    return [p for p in children(pid) if b"multiprocessing.forkserver" in _cmdline(p)]


def render_workers(pid: int) -> list[int]:
    """The render workers of the run `pid`: the children of its fork server."""
    return [w for server in fork_servers(pid) for w in children(server)]


def running(pid: int) -> bool:
    """Alive and not a zombie (PID 1 here may never reap what it inherits)."""
    fields = procstat.fields(pid)  # its state first
    return fields is not None and fields[0] not in ("Z", "X")


def still_running_after(pids: set[int], seconds: float) -> set[int]:
    """Those of `pids` still running once `seconds` have passed (or none is, sooner)."""
    deadline = time.monotonic() + seconds
    while (alive := {p for p in pids if running(p)}) and time.monotonic() < deadline:
        time.sleep(0.05)
    return alive

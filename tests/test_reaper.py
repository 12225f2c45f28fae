"""batchocr/engines/vllm/reaper.py: the processes an engine's build started are killed once the
builder has ended, checked by their start time; the engine's close stops the watcher."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from batchocr import procstat
from batchocr.engines.vllm import reaper

ROOT = Path(__file__).resolve().parents[1]


def _sleep() -> subprocess.Popen:
    return subprocess.Popen(["sleep", "120"])


def test_children_are_this_processs_with_their_start_times():
    child = _sleep()
    try:
        found = reaper.children()
        assert found[child.pid] == procstat.started(child.pid) is not None
        assert all(procstat.fields(pid)[procstat.PARENT] == str(os.getpid()) for pid in found)
    finally:
        child.kill()
        child.wait()


def test_after_the_builder_ends_only_the_processes_as_they_started_are_killed():
    """The builder here is a process that arms a Reaper and exits; one process is given with its
    own start time, the other with another (its number since given to another process)."""
    mine, other = _sleep(), _sleep()
    try:
        given = {mine.pid: procstat.started(mine.pid), other.pid: "1"}
        subprocess.run([sys.executable, "-c", f"from batchocr.engines.vllm.reaper import Reaper; Reaper({given!r})"],
                       cwd=ROOT, check=True, timeout=60)
        assert mine.wait(timeout=30) == -signal.SIGKILL
        assert other.poll() is None
    finally:
        for p in (mine, other):
            p.kill()
            p.wait()


def test_close_stops_the_watcher_and_leaves_the_processes():
    child = _sleep()
    try:
        armed = reaper.Reaper({child.pid: procstat.started(child.pid)})
        watcher = armed.watcher
        assert watcher is not None and watcher.poll() is None
        armed.close()
        assert watcher.returncode is not None and child.poll() is None
        assert reaper.Reaper({}).watcher is None  # nothing started: nothing to watch
    finally:
        child.kill()
        child.wait()

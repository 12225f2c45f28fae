"""vLLM's engine-core processes die with the process that built them.

vLLM 0.26 starts each engine core as a child of the process that builds the `LLM`, and shuts it
down only from that process (its shutdown, or its exit handlers). A process killed with SIGKILL
(`kill -9`, the kernel's out-of-memory killer, a part whose run was killed: batchocr/parts.py)
runs neither: the engine core lives on as an orphan, holding its share of the GPU's memory, so
the rerun's engine finds the card full. A watcher process started after the build waits for the
builder's end and then kills the processes the build started, each checked by its start time
(a number the kernel may since have given to another process is left alone). The engine's own
close stops the watcher first.

The watcher is a bare interpreter (`python -I -S`: no site, no batchocr) in a session of its
own, so that a terminal's Ctrl-C, meant for the run, leaves it in place; it holds none of the
run's files or pipes.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from batchocr import procstat

# The watcher: argv[1] the builder's pid, then pid:start-time of each process to kill after it.
# It waits on a pidfd (Linux 5.3+), or polls for being handed to another parent where there is none.
# It reads the start times as batchocr/procstat.py does, which it cannot import (no batchocr).
WATCHER = """
import os, select, signal, sys, time
owner = int(sys.argv[1])
try:
    fd = os.pidfd_open(owner)
except ProcessLookupError:
    fd = None
except (AttributeError, OSError):
    while os.getppid() == owner:
        time.sleep(0.5)
    fd = None
if fd is not None:
    select.select([fd], [], [])
for arg in sys.argv[2:]:
    pid, start = arg.split(":")
    try:
        with open(f"/proc/{pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[19] == start:
                os.kill(int(pid), signal.SIGKILL)
    except (OSError, IndexError):
        pass
"""


def children() -> dict[int, str]:
    """This process's child processes: pid -> start time (batchocr/procstat.py)."""
    me, found = str(os.getpid()), {}
    for entry in Path("/proc").iterdir():
        fields = procstat.fields(entry.name) if entry.name.isdigit() else None
        if fields is not None and fields[procstat.PARENT] == me:
            found[int(entry.name)] = fields[procstat.STARTED]
    return found


class Reaper:
    """Kills `started` (pid -> start time) once this process has ended, however it ended."""

    def __init__(self, started: dict[int, str]):
        self.watcher: subprocess.Popen | None = None
        if started:
            args = [f"{pid}:{start}" for pid, start in sorted(started.items())]
            self.watcher = subprocess.Popen([sys.executable, "-I", "-S", "-c", WATCHER, str(os.getpid()), *args],
                                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                            stderr=subprocess.DEVNULL, start_new_session=True)

    def close(self) -> None:
        """The engine shut down its own processes: the watcher is not needed any more."""
        if self.watcher is not None:
            self.watcher.kill()
            self.watcher.wait()
            self.watcher = None


def around(build):
    """`build()`'s result, and a Reaper of the processes it started."""
    before = children()
    built = build()
    return built, Reaper({pid: start for pid, start in children().items() if pid not in before})

"""py-spy on vLLM's engine-core processes during a run: where a step's host time goes, sampled
(not traced: a tracer slows every Python call and inflates the scheduler's share, which the CPU
bench `bench/engine_core_host.py` puts at ~2.2 ms a step of 256 requests against ~11.7 ms steps
on the H200, 2026-12-06).

    spy = PySpy(delay_s=40, seconds=30, folder=work)   # in the process that builds the engines
    spy.start()                                         # samples from 40 s on, for 30 s
    ...
    report["py_spy"] = spy.result()                     # by thread, by function (self, inclusive)

py-spy comes as a wheel (bench/gpu/device.sh wheels: .whl/, installed under /tmp/site2, its binary
in /tmp/site2/bin). Each engine core (a child process named VLLM::EngineCore) is sampled at
`rate` Hz with its idle time (`--idle`: waiting on the GPU, a lock, a queue shows as the frame
that waits), every thread apart (`--threads`), without pausing it (`--nonblocking`). Where no
engine core is found (the CPU's dry run: the stand-in has none) the process itself is sampled,
so that the mechanism is exercised.
"""

from __future__ import annotations

import collections
import os
import re
import shutil
import subprocess
import threading
from pathlib import Path

FRAME = re.compile(r"^(.*) \((.*?)(?::\d+)?\)$")


SITE2_BIN = Path("/tmp/site2/bin/py-spy")  # where device.sh's wheels put it


def binary() -> str | None:
    return os.environ.get("PYSPY") or shutil.which("py-spy") or (str(SITE2_BIN) if SITE2_BIN.exists() else None)


def engine_cores(pid: int | None = None) -> list[int]:
    import psutil

    me = psutil.Process(pid or os.getpid())
    found = []
    for p in me.children(recursive=True):
        try:
            # vLLM titles it VLLM::EngineCore; the kernel keeps 15 characters of a name (VLLM::EngineCor)
            if "EngineCor" in p.name() or "EngineCore" in " ".join(p.cmdline()[:2]):
                found.append(p.pid)
        except psutil.Error:
            pass
    return found


class PySpy(threading.Thread):
    def __init__(self, delay_s: float, seconds: float, folder: Path, rate: int = 200, name: str = "b"):
        super().__init__(daemon=True, name="bench-py-spy")
        self.delay_s, self.seconds, self.folder, self.rate, self.label = delay_s, seconds, Path(folder), rate, name
        self.files: dict[str, Path] = {}
        self.errors: list[str] = []
        self.done = threading.Event()  # the run ended: nothing to sample if it ended before the delay

    def run(self) -> None:
        if self.done.wait(self.delay_s):
            self.errors.append(f"the run ended before {self.delay_s:g} s: nothing sampled")
            return
        spy = binary()
        if spy is None:
            self.errors.append("no py-spy (bench/gpu/device.sh wheels puts it in .whl/)")
            return
        pids = engine_cores()
        targets = {f"engine_core_{pid}": pid for pid in pids} or {"main": os.getpid()}
        procs = []
        for what, pid in targets.items():
            out = self.folder / f"py-spy-{self.label}-{what}.txt"
            cmd = [spy, "record", "--pid", str(pid), "--rate", str(self.rate), "--duration", str(int(self.seconds)),
                   "--format", "raw", "--idle", "--threads", "--nonblocking", "--output", str(out)]
            procs.append((what, out, subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)))
        for what, out, proc in procs:
            said, _ = proc.communicate(timeout=self.seconds + 120)
            if proc.returncode == 0 and out.exists():
                self.files[what] = out
            else:
                self.errors.append(f"{what}: py-spy exit {proc.returncode}: {said[-500:]}")

    def result(self, top: int = 40) -> dict:
        self.done.set()
        self.join(timeout=self.delay_s + self.seconds + 180)
        return {"delay_s": self.delay_s, "seconds": self.seconds, "rate": self.rate, "errors": self.errors,
                "by_process": {what: summary(path, top) | {"file": path.name} for what, path in self.files.items()}}


def summary(path: Path, top: int = 40) -> dict:
    """A raw py-spy record (`thread (TID): NAME;frame (file:line);... COUNT` a line) by thread, and
    the main thread's samples by function: self (the innermost frame) and inclusive (each function
    once a stack), as shares of its samples."""
    threads: collections.Counter = collections.Counter()
    own: collections.Counter = collections.Counter()
    inclusive: collections.Counter = collections.Counter()
    main = 0
    for line in Path(path).read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        n = int(count)
        head, *frames = stack.split(";")
        thread = head.partition(": ")[2] or head  # "thread (TID): MainThread"
        threads[thread] += n
        if thread != "MainThread":
            continue
        main += n
        names = [_short(f) for f in frames if FRAME.match(f)]
        if names:
            own[names[-1]] += n
            for name in set(names):
                inclusive[name] += n
    share = lambda c: [(k, round(100 * v / main, 2)) for k, v in c.most_common(top)] if main else []  # noqa: E731
    return {"samples": sum(threads.values()), "by_thread": dict(threads.most_common()),
            "main_self_pct": share(own), "main_inclusive_pct": share(inclusive)}


PACKAGES = ("vllm", "batchocr", "torch", "transformers", "triton", "bench", "zmq", "msgspec")


def _short(frame: str) -> str:
    """`func (/tmp/site/vllm/x.py:12)` as `vllm/x.py:func` (from the outermost package it names;
    a file of no such package by its name alone)."""
    m = FRAME.match(frame)
    func, where = m.group(1), m.group(2)
    cuts = [i + 1 for i in (where.find(f"/{p}/") for p in PACKAGES) if i >= 0]
    where = where[min(cuts):] if cuts else where.rsplit("/", 1)[-1]
    return f"{where}:{func}"

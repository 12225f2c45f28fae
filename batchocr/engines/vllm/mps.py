"""NVIDIA's Multi-Process Service (MPS) for a shard's parts on one GPU (engines.vllm.mps).

Without it the GPU runs one process's kernels at a time: the parts' CUDA contexts take turns on
the card. Under one MPS server the parts' kernels run side by side, so a decode step's small
kernels from one engine use SMs the other's leave idle (docs/PERFORMANCE.md, several engines on
one GPU).

The daemon is the run's own: `nvidia-cuda-mps-control -d` with its pipe and log folders in a
private temporary folder, named to the parts through the environment they inherit
(CUDA_MPS_PIPE_DIRECTORY, CUDA_MPS_LOG_DIRECTORY), and told to quit once every part is done. It
starts before any part's CUDA context, in the parent, which makes none. A run killed before its
daemon could quit (SIGKILL) leaves the daemon and its folder: the next run's start tells such a
daemon to quit, its folder naming a process that is gone. Where the environment
names a pipe folder already, an MPS daemon someone else started serves this process: none is
started. A daemon that does not start, or whose server does not, costs one warning line: the parts
then share the GPU in turns, as without MPS. In a Kubernetes pod, the NVIDIA container toolkit mounts nvidia-cuda-mps-control with
the `compute` driver capability, and a daemon started inside the container serves that
container's processes.

Under MPS a fatal GPU fault in one client is reported to every client of the server: a part's
engine death is then every part's, which the run already treats as one failure (batchocr/parts.py).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, Mapping, MutableMapping

CONTROL = "nvidia-cuda-mps-control"
PIPE, LOG = "CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY"
WAIT_S = 60  # for the control program's start (it forks the daemon and returns) or its quit
SERVER_S = 10  # for the daemon's server to be listed once asked to start
REAP_S = 5  # for a killed run's daemon to be told to quit (where none listens, the ask fails or times out)
PREFIX, OWNER = "batchocr-mps-", "owner"  # a run's folder, and the file in it naming the run's process


def control(environ: MutableMapping[str, str] = os.environ) -> str | None:
    """The MPS control program on PATH, or None."""
    return shutil.which(CONTROL, path=environ.get("PATH"))


def wanted(setting: bool | None, n: int, environ: MutableMapping[str, str] = os.environ) -> bool:
    """Whether n engines on one GPU get a daemon of the run's own: n > 1, not switched off, no MPS
    daemon serving this process already, and (unset) the control program on PATH."""
    if n < 2 or setting is False or PIPE in environ:
        return False
    return setting is True or control(environ) is not None


@contextmanager
def daemon(environ: MutableMapping[str, str] = os.environ,
           say: Callable[[str], None] | None = None) -> Iterator[bool]:
    """An MPS daemon of this run's own while the block runs, its folders in `environ` for the
    processes started meanwhile; True where it started, False (one line said) where it did not."""
    say = say or (lambda line: print(line, file=sys.stderr, flush=True))
    program = control(environ)
    why = f"no {CONTROL} on PATH"
    if program is not None:
        _reap(program, environ)
        folder = _new_folder()
        env = {**environ, **_folders(folder)}
        why = _start(program, env)
        if why:
            shutil.rmtree(folder, ignore_errors=True)
    if why:
        say(f"mps: no MPS daemon for the parts ({why}): they share the GPU in turns "
            f"(engines.vllm.mps: false leaves this out)")
        yield False
        return
    environ.update(_folders(folder))
    try:
        yield True
    finally:
        for key in (PIPE, LOG):
            environ.pop(key, None)
        try:
            _ask(program, env, "quit")
        except (OSError, subprocess.SubprocessError):
            pass  # a daemon that does not quit is the machine's to end: its folder goes all the same
        shutil.rmtree(folder, ignore_errors=True)


def _new_folder() -> Path:
    """A run folder of this process's (private to this user): the file naming its owner, the pipe
    and log folders."""
    folder = Path(tempfile.mkdtemp(prefix=PREFIX))
    (folder / OWNER).write_text(str(os.getpid()))
    for path in _folders(folder).values():
        Path(path).mkdir()
    return folder


def _folders(folder: Path) -> dict[str, str]:
    """A run folder's pipe and log folders, as the environment names them to the daemon and its clients."""
    return {PIPE: str(folder / "pipe"), LOG: str(folder / "log")}


def _ask(program: str, env: Mapping[str, str], command: str, timeout: float = WAIT_S) -> str:
    """One command to the daemon (its answer), as `echo COMMAND | nvidia-cuda-mps-control`."""
    return subprocess.run([program], input=command + "\n", env=dict(env), capture_output=True, text=True,
                          timeout=timeout).stdout


def _reap(program: str, environ: Mapping[str, str]) -> None:
    """The daemons of runs killed before they could tell theirs to quit (SIGKILL skips every
    `finally`): each of this user's run folders whose owner process is gone is told to quit through
    its pipe, then removed. A folder without an owner file (one being made) or whose owner lives is
    left alone, as are other users' (mkdtemp makes them readable by their owner only)."""
    for folder in Path(tempfile.gettempdir()).glob(PREFIX + "*"):
        try:
            pid = int((folder / OWNER).read_text())
        except (OSError, ValueError):
            continue
        if _alive(pid):
            continue
        try:
            _ask(program, {**environ, **_folders(folder)}, "quit", REAP_S)
        except (OSError, subprocess.SubprocessError):
            pass  # no daemon listens there any more: the folder alone is left
        shutil.rmtree(folder, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process of that number
        return True
    return True


def _start(program: str, env: Mapping[str, str]) -> str:
    """The daemon started with `env`'s folders, and its server for this user: "" where both are
    up, else why not (a daemon whose server did not start told to quit)."""
    try:
        done = subprocess.run([program, "-d"], env=dict(env), capture_output=True, text=True, timeout=WAIT_S)
        if done.returncode:
            said = (done.stderr or done.stdout).strip().splitlines()
            return f"exit code {done.returncode}" + (f": {said[-1]}" if said else "")
        # The server the parts' CUDA contexts would join, started now: where it cannot start (a GPU
        # MPS cannot share), the parts go without rather than fail their builds.
        _ask(program, env, f"start_server -uid {os.getuid()}")
        until = time.monotonic() + SERVER_S
        while not _ask(program, env, "get_server_list").split():
            if time.monotonic() > until:
                _ask(program, env, "quit")
                return "its server did not start"
            time.sleep(0.2)
    except (OSError, subprocess.SubprocessError) as exc:
        return str(exc)
    return ""

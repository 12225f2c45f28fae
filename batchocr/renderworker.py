"""A render worker process's entry point. Kept free of heavy imports: it must
switch PyMuPDF's optional extras off before PyMuPDF loads in the process."""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from multiprocessing.connection import Connection
from typing import Any, Mapping

from batchocr.renderprogress import COUNT, PAGE, STARTED, TICKS
from batchocr.signals import STOP

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def skip_pymupdf_extras() -> None:
    """PyMuPDF 2 imports pymupdf.layout and pymupdf4llm when it loads (they load
    onnxruntime: 0.4 s and ~100 MB a process); batchocr uses neither, and PyMuPDF
    carries on without them. Only for processes batchocr owns: a library user's
    own process keeps them."""
    for name in ("pymupdf.layout", "pymupdf4llm"):
        sys.modules.setdefault(name, None)
    # ... and without one, find_tables prints an advert for pymupdf.layout on stdout (once a
    # process: into a run's output and its progress line); PyMuPDF's own switch turns it off
    os.environ.setdefault("PYMUPDF_SUGGEST_LAYOUT_ANALYZER", "0")


class _Withheld:
    """A meta path finder under which `import pandas` fails, as where pandas is not installed."""

    @staticmethod
    def find_spec(name: str, path: Any = None, target: Any = None) -> None:
        if name == "pandas" or name.startswith("pandas."):
            raise ModuleNotFoundError(f"No module named {name!r} (withheld from pyarrow's probe)", name=name)
        return None


def skip_pyarrow_pandas_probe() -> None:
    """pyarrow imports pandas, where it is installed, on its first conversion of Python
    objects, to tell pandas objects apart: the largest import of a run's start (pandas, numpy's
    extras, pytz, dateutil). batchocr hands pyarrow no pandas objects, so that first probe
    is made here with pandas withheld, and pyarrow takes pandas as absent for what it only
    probes. An explicit use (Table.to_pandas) still imports pandas. Only for processes
    batchocr owns: a library user's own process keeps pyarrow's probe."""
    if "pandas" in sys.modules:
        return
    import pyarrow as pa

    sys.meta_path.insert(0, _Withheld)
    try:
        pa.array([0])
    finally:
        sys.meta_path.remove(_Withheld)


def own_process() -> None:
    """What makes a process batchocr's own (a run's, a part's, a render server's or worker's):
    PyMuPDF's unused extras and the pandas of pyarrow's probe left out. Before PyMuPDF loads."""
    skip_pymupdf_extras()
    skip_pyarrow_pandas_probe()


def die_with_parent(parent_pid: int | None) -> None:
    """SIGKILL this process when the one that started it dies (kill -9 of a run
    must not leave a worker hung on a page at 100% CPU, re-parented to PID 1). A
    watchdog thread could not do it: MuPDF holds the GIL while it renders. Linux
    sends the signal when the parent's *thread* that started us exits: the pool
    starts workers from the run's main thread. parent_pid None: the parent is the one we
    have now (a fork server's child: the server, not the run, started it)."""
    if parent_pid is None:
        parent_pid = os.getppid()
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent_pid:  # the parent died before prctl: nothing to wait for
        os._exit(1)


def close_server_pipe() -> bool:
    """Whether this process is a fork server's child; if so, it lets go of its copy of the run's
    end of the pipe whose closing ends the server (multiprocessing hands one to every child, for
    children that start processes of their own), so that the server ends when the run does and
    each worker with it (PDEATHSIG). Kept, a worker hung on a page would keep the server alive,
    and the server the worker, after a kill -9 of the run. A fork of the run itself (vLLM's
    engine core) calls it too (renderpool's at-fork handler), for the same reason."""
    from multiprocessing import forkserver

    server = getattr(forkserver, "_forkserver", None)
    fd = getattr(server, "_forkserver_alive_fd", None)
    if fd is None:  # spawned: the run is the parent
        return False
    os.close(fd)
    server._forkserver_alive_fd = None
    return True


def main(conn: Connection, spec, needs, storage_options: Mapping[str, Any], progress, parent_pid: int,
         env: Mapping[str, str] | None = None, cwd: str | None = None) -> None:
    """parent_pid: the run's process; a worker forked by the fork server dies with the server,
    which ends with the run. env, cwd: the run's now (the server's are those of the first run
    of its process: a library user's second run may have others)."""
    die_with_parent(None if close_server_pipe() else parent_pid)
    if env is not None:
        os.environ.clear()
        os.environ.update(env)
    if cwd is not None:
        os.chdir(cwd)
    own_process()
    # The parent decides when to stop: SIGINT (Ctrl-C) and SIGTERM sent to the whole process group
    # (tini -g, kill -TERM -PGID) reach the workers too, and a worker killed by one mid-page would cost
    # that page a renderer_crashed row (final the second time); the parent stops them with SIGKILL.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP)  # held while it started (signals.held_for_a_child)
    import pymupdf

    from batchocr.errors import BatchocrError
    from batchocr.render import render_document

    pymupdf.TOOLS.mupdf_display_errors(False)  # errors become rows, not stderr noise
    pymupdf.TOOLS.mupdf_display_warnings(False)

    def at_page(index: int, count: int) -> None:
        progress[COUNT], progress[PAGE] = count, index
        progress[TICKS] += 1

    progress[STARTED] = 1
    try:
        while True:
            task = conn.recv()
            if task is None:
                return
            try:
                for batch in render_document(task, spec, needs, storage_options, at_page):
                    conn.send(batch)
            except BatchocrError as exc:  # SOURCE failed for good: the parent stops the run
                conn.send(exc)
                return
            conn.send(None)  # end of this document
    except (EOFError, BrokenPipeError, ConnectionResetError):  # the parent is gone (killed: its end of the pipe closed before
        os._exit(1)  # PDEATHSIG lands): nothing to say, and no traceback on the run's stderr

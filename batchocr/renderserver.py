"""The render workers' fork server: imported once, in the server, by multiprocessing's
forkserver (batchocr/renderpool.py), so that each worker is a fork of a process that has
imported what a worker needs, not a fresh interpreter importing it again.

A spawned worker imports PyMuPDF, pyarrow, numpy and batchocr.render's other imports
itself, about a second of CPU each, and a worker killed on a hung page costs as much again;
a fork of the server starts in milliseconds (measured figures: docs/PERFORMANCE.md).

The server is single-threaded when it forks but for jemalloc's background thread, which
jemalloc's own fork handlers deal with (OpenBLAS is held to one thread), so forking it is
safe where forking the run's process, which holds onnxruntime's or vLLM's threads, is not.
It ends when the run's process does (multiprocessing's forkserver reads the end of a pipe only
that process holds: renderworker.close_server_pipe), and each worker dies with it (PDEATHSIG).
"""

from __future__ import annotations

import signal

# SIGTERM sent to the run's whole process group is the run's to handle (commit, exit 75): the
# server ignores it (SIGINT too, which multiprocessing's forkserver ignores only after this
# import), as the workers do. Killed by it, the server would leave the run unable to replace a
# worker (EOFError from the server's socket: click's "Aborted!", exit 1). It ends when the run does,
# whatever the signal. Both were blocked since the run started the server (renderpool): one
# sent meanwhile is dropped here, not a KeyboardInterrupt traceback from the imports below.
signal.signal(signal.SIGTERM, signal.SIG_IGN)
signal.signal(signal.SIGINT, signal.SIG_IGN)
signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})

import atexit  # noqa: E402
import os  # noqa: E402

from batchocr import renderworker  # noqa: E402


def _remove_run_temp() -> None:
    """At the server's end, which follows the run's: the run's multiprocessing temp folder,
    where the server's socket is. A run that ends removes it itself (renderpool.before_os_exit,
    or multiprocessing's exit handler); one killed (kill -9, a spot node's OOM) cannot, and
    left /tmp/pymp-* behind. The workers, forks of this process, end with os._exit: not them."""
    import shutil
    from multiprocessing import forkserver

    address = getattr(getattr(forkserver, "_forkserver", None), "_forkserver_address", None)
    if isinstance(address, str) and os.path.basename(os.path.dirname(address)).startswith("pymp-"):
        shutil.rmtree(os.path.dirname(address), ignore_errors=True)


atexit.register(_remove_run_temp)

try:
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # numpy's BLAS threads: none to fork past
    renderworker.own_process()  # pyarrow's look for pandas too: answered once here, for every worker
    import pymupdf  # noqa: F401

    from batchocr import render  # noqa: F401 - what it imports: pyarrow, fsspec, numpy, the word lists
except Exception:  # noqa: BLE001 - a worker imports what it needs itself, and says what is wrong
    pass

"""SIGTERM (a spot eviction notice) and SIGINT: stop taking work, commit, exit 75."""

from __future__ import annotations

import contextlib
import signal
import threading
from typing import Iterator

# The stop flag while a graceful_stop() block is active: signal handlers are
# process-wide, so nested blocks share the outer one's flag.
_active: threading.Event | None = None
STOP = (signal.SIGTERM, signal.SIGINT)


@contextlib.contextmanager
def held_for_a_child() -> Iterator[None]:
    """SIGTERM and SIGINT blocked in this thread while it starts a process (a part, the render
    workers' fork server or a spawned worker): the child inherits the mask through exec, so a
    signal in its start-up (the interpreter, its imports) waits until it has taken or ignored
    them and unblocked STOP, instead of killing it with a traceback. This process's own signal,
    if one came meanwhile, is delivered when the mask is restored. multiprocessing's resource
    tracker is started first: its own start unblocks both (resource_tracker.ensure_running,
    which starts it the same way)."""
    from multiprocessing import resource_tracker

    resource_tracker.ensure_running()
    old = signal.pthread_sigmask(signal.SIG_BLOCK, STOP)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


@contextlib.contextmanager
def graceful_stop() -> Iterator[threading.Event]:
    """Within the block, SIGTERM and SIGINT set the returned event instead of
    killing the process; a second SIGINT stops at once. Enter it as early as
    possible: a signal before that kills the process the default way."""
    global _active
    if _active is not None:  # nested (a wrapper entered it first): one flag for the process
        yield _active
        return
    stop = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield stop
        return

    def handler(signum, frame):
        if stop.is_set() and signum == signal.SIGINT:
            raise KeyboardInterrupt
        stop.set()

    previous = {s: signal.signal(s, handler) for s in STOP}
    _active = stop
    try:
        yield stop
    finally:
        _active = None
        for s, h in previous.items():
            signal.signal(s, h)

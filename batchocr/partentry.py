"""A part's process (`processes` N > 1, multiprocessing's spawn: batchocr/parts.py starts it).
Kept free of heavy imports: the spawned interpreter imports this module to find the part's
target and unpickles the part's arguments (batchocr.spec, batchocr.shard: no PyMuPDF) before
`main` runs, which makes the process batchocr's own before anything loads PyMuPDF."""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
from typing import TYPE_CHECKING

from batchocr import errors, signals
from batchocr.engines import systemic
from batchocr.errors import BatchocrError, Interrupted
from batchocr.renderworker import die_with_parent, own_process

if TYPE_CHECKING:
    from batchocr.shard import Part
    from batchocr.spec import JobSpec

NOTHING = {"run_id": "", "documents": 0, "documents_skipped": 0, "pages": 0, "error_pages": 0, "skipped_pages": 0,
           "routed_pages": 0, "failed_documents": 0}  # an interrupted part's summary before its run began


def main(spec: JobSpec, part: Part, progress: bool, conn, parent_pid: int) -> None:
    """A part's process: run_job over its share; its summary, or its error, to the parent.
    It dies with the parent (kill -9 of the run must not leave parts writing on, to meet a
    rerun's parts over the same pages), as render workers do. Made batchocr's own first, as a
    run's process is (batchocr.cli): PyMuPDF's unused extras and the pandas of pyarrow's probe
    stay out, before the run's modules load PyMuPDF."""
    die_with_parent(parent_pid)
    own_process()
    from batchocr.renderpool import before_os_exit
    from batchocr.runner import run_shard

    if part.judged is not None:
        systemic.share(systemic.Parts(part.judged, part.index))

    code = errors.EXIT_OK
    try:
        with signals.graceful_stop() as stop:  # before the signals held since the spawn come: a stop, not a death
            signal.pthread_sigmask(signal.SIG_UNBLOCK, signals.STOP)
            if stop.is_set():
                raise Interrupted("batchocr: interrupted before the run started (nothing done; rerun to resume)")
            summary = run_shard(spec, progress, None, stop, part)
        conn.send(("done", dataclasses.asdict(summary)))
    except Interrupted as exc:
        summary = getattr(exc, "summary", None)
        conn.send(("interrupted", summary or NOTHING))
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
    before_os_exit()
    os._exit(code)  # as the console script does (batchocr.cli.entry): no interpreter teardown

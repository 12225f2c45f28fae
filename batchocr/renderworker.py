"""A render worker process's entry point. Kept free of heavy imports: it must
switch PyMuPDF's optional extras off before PyMuPDF loads in the process."""

from __future__ import annotations

import signal
import sys
from multiprocessing.connection import Connection
from typing import Any, Mapping


def skip_pymupdf_extras() -> None:
    """PyMuPDF 2 imports pymupdf.layout and pymupdf4llm when it loads (they load
    onnxruntime: 0.4 s and ~100 MB a process); batchocr uses neither, and PyMuPDF
    carries on without them. Only for processes batchocr owns: a library user's
    own process keeps them."""
    for name in ("pymupdf.layout", "pymupdf4llm"):
        sys.modules.setdefault(name, None)


def main(conn: Connection, spec, needs, storage_options: Mapping[str, Any]) -> None:
    skip_pymupdf_extras()
    # The parent decides when to stop (SIGINT/SIGTERM go to the whole process group).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    import pymupdf

    from batchocr.errors import BatchocrError
    from batchocr.render import render_document

    pymupdf.TOOLS.mupdf_display_errors(False)  # errors become rows, not stderr noise
    pymupdf.TOOLS.mupdf_display_warnings(False)
    while True:
        task = conn.recv()
        if task is None:
            return
        try:
            for batch in render_document(task, spec, needs, storage_options):
                conn.send(batch)
        except BatchocrError as exc:  # SOURCE failed for good: the parent stops the run
            conn.send(exc)
            return
        conn.send(None)  # end of this document

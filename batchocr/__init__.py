"""batchocr: offline batch OCR jobs. Scans in a blob container in, Parquet page tables out."""

import os as _os
import sys as _sys

__version__ = "0.1.0"

# batchocr reads private documents and must make no outbound call. onnxruntime (used
# by rapidocr, and imported by PyMuPDF 2 itself through pymupdf_layout) sends usage
# telemetry unless this is set before it loads; strace saw it resolve
# mobile.events.data.microsoft.com during a run. Set here, before anything imports
# PyMuPDF, and inherited by every worker process.
_os.environ["ORT_DISABLE_TELEMETRY"] = "1"
if "onnxruntime" in _sys.modules:  # loaded before us (a notebook): switch it off too
    _sys.modules["onnxruntime"].disable_telemetry_events()
# vLLM reports its usage (the GPU, the model's architecture, the engine's settings) to
# stats.vllm.ai from a thread of every engine (usage/usage_lib.py) unless one of these is set;
# DO_NOT_TRACK turns off Hugging Face Hub's telemetry too. Read when an engine starts, which
# inherits them from here.
_os.environ["VLLM_NO_USAGE_STATS"] = "1"
_os.environ["DO_NOT_TRACK"] = "1"


def read_pages(out, storage_options=None):
    """A polars LazyFrame over the page table under OUT (see batchocr.table)."""
    from batchocr.table import read_pages as _read_pages

    return _read_pages(out, storage_options)

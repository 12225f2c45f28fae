"""batchocr: offline batch OCR jobs. Scans in a blob container in, Parquet page tables out."""

__version__ = "0.1.0"


def read_pages(out, storage_options=None):
    """A polars LazyFrame over the page table under OUT (see batchocr.table)."""
    from batchocr.table import read_pages as _read_pages

    return _read_pages(out, storage_options)

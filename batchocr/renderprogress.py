"""The progress record a render worker shares with its pool (a multiprocessing RawArray of
'q'): which page of which document the worker is on, read by the pool when a worker hangs
or dies. Its own module, so that render (which reports progress), renderworker (which keeps
the record) and renderpool (which reads it) import it and not one another."""

STARTED, COUNT, PAGE, TICKS = range(4)  # the record's slots: imports done, pages, the page now, pages begun
UNKNOWN = -1
READING = -2  # PAGE while the document is downloaded from SOURCE (before MuPDF opens it)

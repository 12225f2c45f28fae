"""The progress bar of a run: pages done of an estimated total, with an ETA.

The total is known where it can be: the documents of the shard are counted by a
second, background pass over the plan or the listing (names only: a folder
listing, or one page of blob names, at a time), and pages as documents open
(their page count). Until every document has opened, the pages still to come
are estimated from the mean pages per document so far.

On a terminal the bar redraws twice a second; elsewhere (a pod's log) it prints
one line every 30 s.
"""

from __future__ import annotations

import sys
import threading
from typing import Callable, Iterable

from tqdm import tqdm

LOG_INTERVAL_S = 30.0


class Progress:
    def __init__(self, desc: str, enabled: bool):
        self.bar = tqdm(unit="page", file=sys.stderr, disable=not enabled, dynamic_ncols=True, desc=desc,
                        smoothing=0.1, mininterval=0.5 if sys.stderr.isatty() else LOG_INTERVAL_S)
        self.enabled = enabled
        self.documents_total: int | None = None  # documents this run will work on, once counted
        self.documents_started = 0
        self.documents_opened = 0  # their page count is known
        self.pages_known = 0  # rows to come from the opened documents (committed pages excluded)
        self._lock = threading.Lock()

    def count_documents(self, documents: Iterable, todo: Callable[[object], bool]) -> threading.Thread | None:
        """Count, in a daemon thread, the documents of `documents` for which todo(doc)."""
        if not self.enabled:
            return None

        def count() -> None:
            try:
                n = sum(1 for d in documents if todo(d))
            except Exception:  # noqa: BLE001 - progress only: the run's own listing reports faults
                return
            with self._lock:
                self.documents_total = n
            self._update_total()

        thread = threading.Thread(target=count, name="batchocr-progress-count", daemon=True)
        thread.start()
        return thread

    def started(self) -> None:
        self.documents_started += 1
        self._postfix()

    def opened(self, pages_to_do: int) -> None:
        """A document's page count is known: it will give this many more rows."""
        with self._lock:
            self.documents_opened += 1
            self.pages_known += pages_to_do
        self._update_total()

    def done(self, rows: int) -> None:
        self.bar.update(rows)

    def _postfix(self) -> None:
        total = f"/{self.documents_total}" if self.documents_total is not None else ""
        self.bar.set_postfix_str(f"docs {self.documents_started}{total}", refresh=False)

    def estimated_pages(self) -> int | None:
        with self._lock:
            if self.documents_total is None or not self.documents_opened:
                return None
            left = max(self.documents_total - self.documents_opened, 0)
            return self.pages_known + round(left * self.pages_known / self.documents_opened)

    def _update_total(self) -> None:
        total = self.estimated_pages()
        if total is not None and total != self.bar.total:
            self.bar.total = max(total, self.bar.n)
        self._postfix()

    def close(self) -> None:
        self.bar.close()

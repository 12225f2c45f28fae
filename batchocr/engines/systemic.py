"""Telling a broken engine from bad pages: page errors held back until the engine has read a page.

An engine that fails on every page alike (a model it cannot load into the session, an
install whose libraries do not match, a private API gone in a new release) would
otherwise write a final error row for every page of the shard and exit 0: a table of
per-page errors for what is the run's failure. So, until the engine has read one page
(vLLM: taken one request), its page errors are held back; LIMIT alike in a row (the same
message once its numbers are masked) stop the run with one line, exit 1, and no row is
written for them. Once a page is read, what was held is released as the pages' own
rows, and errors from then on are rows at once.
"""

from __future__ import annotations

import re
import threading

from batchocr.errors import BatchocrError

LIMIT = 8  # page errors alike in a row, none read, that make the run's failure


class Held:
    """One engine's held page errors, or its instances' (vllm `instances`, each in a thread
    of its own: they share one, so that what is systemic is judged over all of them)."""

    def __init__(self, failed: str, engines: int = 1):
        # `failed`: what the engine did, as the stopping line says it, with {n} the pages held:
        # "engine vllm refused every request alike ({n} pages, none taken)"
        self.failed = failed
        self.lock = threading.Lock()
        self.read = 0  # pages (vLLM: requests) the engine took
        self.held: list[tuple[str, dict]] = []  # errors before any page was read: (signature, row)
        self.reason = ""
        self.running = engines  # engines whose input has not ended

    def systemic(self) -> BatchocrError:
        return BatchocrError(f"{self.failed.format(n=len(self.held))}: {self.reason} (a property of the engine "
                             "or model, not of the pages: no page was recorded; fix it and rerun)")

    def taken(self) -> list[dict]:
        """The engine read a page: the rows held so far are the pages' own after all."""
        with self.lock:
            self.read += 1
            held, self.held = self.held, []
        return [row for _, row in held]

    def failed_on(self, rows: list[dict], reason: str) -> list[dict]:
        """A page's (or a group's) error `rows`, failing for `reason`: the rows to write now.
        Before any page was read they are held; rows held for another reason are released
        (a run of errors alike is what is systemic); LIMIT alike raise the run's failure."""
        with self.lock:
            if self.read or not rows:
                return rows
            signature = re.sub(r"\d+", "N", reason)
            released = [row for sig, row in self.held if sig != signature]
            self.held = [(sig, row) for sig, row in self.held if sig == signature] + [(signature, row) for row in rows]
            self.reason = reason
            if len(self.held) >= LIMIT:
                raise self.systemic()
            return released

    def ended(self) -> list[dict]:
        """An engine's input ended: the rows still held, or, where more than one page is held
        and none was read (a short shard, every page failing alike), the run's failure. With
        several engines, the last whose input ends judges what all of them hold."""
        with self.lock:
            self.running -= 1
            if self.running > 0:
                return []
            if len(self.held) > 1:
                raise self.systemic()
            held, self.held = self.held, []
        return [row for _, row in held]

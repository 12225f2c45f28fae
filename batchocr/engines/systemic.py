"""Telling a broken engine from bad pages: page errors held back until the engine has read a page.

An engine that fails on every page alike (a model it cannot load into the session, an
install whose libraries do not match, a private API gone in a new version) would
otherwise write a final error row for every page of the shard and exit 0: a table of
per-page errors for what is the run's failure. So, until the engine has read one page
(vLLM: taken one request), its page errors are held back; LIMIT alike in a row (the same
message once its numbers are masked) stop the run with one line, exit 1, and no row is
written for them. Once a page is read, what was held goes out as the pages' own
rows, and errors from then on are rows at once.

A shard run as parts (`processes` N) judges over all of them (`share`, in each part's
process): a page read by any part's engine lets every part's held rows go, and a part
whose input ended holding rows, none read anywhere, waits for the others before it judges,
so that a part dealt one refused page cannot commit its row as a page error while the
others find the engine broken (nor a part dealt two bad pages stop a run whose other part
reads well).
"""

from __future__ import annotations

import re
import threading
import time

from batchocr.errors import BatchocrError

LIMIT = 8  # page errors alike in a row, none read, that make the run's failure
WAIT_S = 0.05  # how often a part that has ended looks at the others


class Parts:
    """What the parts of one shard share, in one multiprocessing Array of ints: pages read by
    any part's engine, rows held when the parts' input ended, and a flag a part (this process:
    `index`) that is judged (its engine's input ended, or the parent has its result)."""

    READ, HELD, FLAGS = 0, 1, 2

    def __init__(self, array, index: int):
        self.array, self.index = array, index

    @staticmethod
    def new_array(ctx, parts: int):
        """The shared Array for a shard of `parts` parts, from multiprocessing context ctx."""
        return ctx.Array("i", Parts.FLAGS + parts)

    @staticmethod
    def finished(array, index: int) -> None:
        """The parent has part `index`'s result (done, failed or died): none waits on it."""
        with array.get_lock():
            array[Parts.FLAGS + index] = 1

    def taken(self) -> None:
        with self.array.get_lock():
            self.array[self.READ] += 1

    def any_read(self) -> bool:
        return self.array[self.READ] > 0

    def judge(self, held: int) -> tuple[bool, int]:
        """This part's input ended holding `held` rows, none read here: once any part has read
        a page or every part is judged, (whether any part read one, the rows held by all)."""
        with self.array.get_lock():
            self.array[self.HELD] += held
            self.array[self.FLAGS + self.index] = 1
        while held:  # holding none, it has nothing to judge: it does not wait
            with self.array.get_lock():
                read, total = self.array[self.READ] > 0, self.array[self.HELD]
                judged = all(self.array[self.FLAGS:])
            if read or judged:
                return read, total
            time.sleep(WAIT_S)
        return self.any_read(), 0


_parts: Parts | None = None


def share(parts: Parts | None) -> None:
    """This process is a part of a shard: its engines' Held judge with the other parts'."""
    global _parts
    _parts = parts


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
        self.parts = _parts  # the shard's other parts, where this process is one of them

    def systemic(self, n: int) -> BatchocrError:
        return BatchocrError(f"{self.failed.format(n=n)}: {self.reason} (a property of the engine "
                             "or model, not of the pages: none of them was recorded; fix it and rerun)")

    def taken(self) -> list[dict]:
        """The engine read a page: the rows held so far are the pages' own after all."""
        with self.lock:
            self.read += 1
            held, self.held = self.held, []
        if self.parts is not None:
            self.parts.taken()
        return [row for _, row in held]

    def failed_on(self, rows: list[dict], reason: str) -> list[dict]:
        """A page's (or a group's) error `rows`, failing for `reason`: the rows to write now.
        Before any page was read they are held; rows held for another reason go out
        (a run of errors alike is what is systemic); LIMIT alike raise the run's failure."""
        with self.lock:
            if self.read or not rows or (self.parts is not None and self.parts.any_read()):
                return rows
            signature = re.sub(r"\d+", "N", reason)
            out = [row for sig, row in self.held if sig != signature]
            self.held = [(sig, row) for sig, row in self.held if sig == signature] + [(signature, row) for row in rows]
            self.reason = reason
            if len(self.held) >= LIMIT:
                raise self.systemic(len(self.held))
            return out

    def ended(self) -> list[dict]:
        """An engine's input ended: the rows still held, or, where more than one page is held
        and none was read (a short shard, every page failing alike), the run's failure. With
        several engines, the last whose input ends judges what all of them hold; in a part of a
        shard, with what the other parts hold (it waits for them: `Parts.judge`)."""
        with self.lock:
            self.running -= 1
            if self.running > 0:
                return []
            held, self.held = self.held, []  # none once a page was read
        read, total = self.parts.judge(len(held)) if self.parts is not None else (self.read > 0, len(held))
        if not read and total > 1:
            raise self.systemic(total)
        return [row for _, row in held]

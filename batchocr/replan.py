"""The re-plan before a run: a job spec's `inventory:` names Azure's blob inventory (its
destination folder, or one rule's: inventory.newest_manifest), and OUT's plan is made again
from the newest Succeeded manifest before any shard is read, once for all the pods of a run,
so that no pod lists the container. Every planned document keeps its shard
(inventory.plan_from_inventory); the new ones are placed.

    OUT/_plan/inventory.json          written after plan.json: the manifest the plan is from
    OUT/_plan/replan-NNNNNN.json      while a pod re-plans: its lock, rewritten as a heartbeat

The first pod to find the plan older than the newest manifest creates a lock (create-if-absent:
of two pods one wins) and re-plans, rewriting the lock every HEARTBEAT_S; the others poll until
inventory.json names the manifest. A lock whose content has not changed for STALE_S of a
waiter's own clock (no clocks compared across machines) is a vanished pod's (evicted, killed):
the waiter creates the next number's lock, which again only one pod can create, and re-plans
from what the dead one left (plan.json is written last, so the old plan stands until a
re-plan finishes; shard files it rewrote keep their old documents). A lock taken is checked
again against inventory.json before planning: a pod that took it after the plan was made
plans nothing. Two planners at once would read each other's half-written shard files, so
STALE_S is far beyond a heartbeat and the storage client's retries of one write.

A pod that reads a shard file while it is rewritten reads the old or the new file whole
(atomic writes), and both give every kept document the same shard: a document is on at
most one shard. A re-plan made while other pods run (a newer inventory that arrives mid-run)
only gives new documents to shards, which the next run does.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import re
import socket
import threading
import time
from typing import Callable, Iterator

from batchocr.errors import Interrupted
from batchocr.inventory import plan_from_inventory
from batchocr.inventoryruns import newest_manifest
from batchocr.layout import PLAN_DIR
from batchocr.storage import Store, public_url

STAMP = f"{PLAN_DIR}/inventory.json"
_LOCK = re.compile(r"replan-(\d{6})\.json")
HEARTBEAT_S = 10.0
STALE_S = 600.0  # sixty missed beats: beyond the storage client's back-off for one write (2 min)
POLL_S = 2.0


def planned_from(out: Store) -> str | None:
    """The manifest OUT's plan was made from (None: none recorded)."""
    try:
        return json.loads(out.read_bytes(STAMP)).get("manifest")
    except (FileNotFoundError, ValueError, AttributeError):
        return None


def record(out: Store, manifest: str) -> None:
    """OUT's plan is from `manifest` (after its plan.json)."""
    out.write_json(STAMP, {"manifest": public_url(manifest), "planned_at": dt.datetime.now(dt.UTC).isoformat()})


def replan(source: Store, out: Store, shards: int, url: str, options: dict | None,
           stop: threading.Event, say: Callable[[str], None]) -> bool:
    """OUT's plan from the newest Succeeded manifest at `url`: made here (True) or by another
    pod (False, once it is there). `say` tells what happens, a line at a time."""
    manifest = newest_manifest(url, options)
    if planned_from(out) == public_url(manifest):
        return False
    said = False
    watch = _Watch()
    while True:
        if stop.is_set():
            raise Interrupted("batchocr: interrupted while waiting for the re-plan (nothing done; rerun to resume)")
        with _lock(out, watch) as held:
            if held:
                if planned_from(out) == public_url(manifest):  # made while the lock was taken
                    return False
                say(f"batchocr: re-planning {public_url(out.url)} from {public_url(manifest)}")
                plan_from_inventory(source, out, shards, manifest, options)
                record(out, manifest)
                return True
        if planned_from(out) == public_url(manifest):
            return False
        if not said:
            say(f"batchocr: waiting for another pod's re-plan from {public_url(manifest)}")
            said = True
        stop.wait(POLL_S)


class _Watch:
    """A waiter's view of the newest lock: its name, its content, since when unchanged."""

    def __init__(self):
        self.seen: tuple[str, bytes] | None = None
        self.since = 0.0

    def stale(self, name: str, content: bytes) -> bool:
        if self.seen != (name, content):
            self.seen, self.since = (name, content), time.monotonic()
        return time.monotonic() - self.since > STALE_S


@contextlib.contextmanager
def _lock(out: Store, watch: _Watch) -> Iterator[bool]:
    """True while this process holds the re-plan's lock (beating it), False if another does."""
    locks = sorted(n for n in out.find(PLAN_DIR, suffix=".json") if _LOCK.fullmatch(n.rpartition("/")[2]))
    number = 0
    if locks:
        newest = locks[-1]
        try:
            content = out.read_bytes(newest)
        except FileNotFoundError:  # let go meanwhile
            yield False
            return
        if not watch.stale(newest, content):
            yield False
            return
        number = int(_LOCK.fullmatch(newest.rpartition("/")[2]).group(1)) + 1  # a vanished holder's: the next
    name = f"{PLAN_DIR}/replan-{number:06d}.json"
    if not out.create(name, _holder(0)):
        yield False
        return
    for old in locks:  # the vanished holders' (their numbers are never taken again)
        out.remove(old)
    done = threading.Event()
    beat = threading.Thread(target=_beat, args=(out, name, done), daemon=True, name="replan-heartbeat")
    beat.start()
    try:
        yield True
    finally:
        done.set()
        beat.join()
        out.remove(name)


def _holder(beat: int) -> bytes:
    return json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "beat": beat,
                       "at": dt.datetime.now(dt.UTC).isoformat()}).encode()


def _beat(out: Store, name: str, done: threading.Event) -> None:
    """Rewrite the lock every HEARTBEAT_S until `done`: its changing content is the holder's life."""
    beat = 0
    while not done.wait(HEARTBEAT_S):
        beat += 1
        with contextlib.suppress(Exception):  # a failed beat: the next one tries again
            out.write_atomic(name, _holder(beat))

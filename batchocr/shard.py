"""One shard's life, apart from the reading itself: prepare (the checks, the plan or the
listing, the pages committed already, what is left to do) and finish (the done-marker, written
and removed here alone, from what is committed). A single-process run (batchocr/runner.py) and
an N-process run (batchocr/parts.py) are two schedulers over it.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Iterator

import pyarrow as pa

from batchocr import engines, producer
from batchocr.compact import kept_counts
from batchocr.errors import ConfigError, Interrupted
from batchocr.layout import done_marker, shard_dir
from batchocr.plan import PlanInfo, planned_documents, read_plan
from batchocr.replan import replan
from batchocr.sharding import shard_of
from batchocr.sink import Resume, committed_keys, completed
from batchocr.sources import DocRef, check_stores, list_documents, located
from batchocr.spec import JobSpec, RenderSpec
from batchocr.spec import Shard as ShardSpec
from batchocr.status import check_shard_count
from batchocr.storage import Store, public_url
from batchocr.words import plural


@dataclass
class RunSummary:
    run_id: str
    shard: str
    out: str
    documents: int = 0  # documents worked on by this run
    documents_skipped: int = 0  # already complete in OUT
    pages: int = 0  # page rows (page_index >= 0): a document's error row is no page
    error_pages: int = 0  # page rows with finish_reason error
    failed_documents: int = 0  # documents that could not be opened: their one row, page_index -1
    skipped_pages: int = 0  # rows with finish_reason skipped
    routed_pages: int = 0  # pages whose text came from the text layer, not the engine (route)
    seconds: float = 0.0
    interrupted: bool = False
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def pages_per_s(self) -> float:
        return self.pages / self.seconds if self.seconds else 0.0

    def line(self) -> str:
        if self.documents == 0 and not self.interrupted:
            return (f"batchocr: shard {self.shard}: nothing to do "
                    f"({plural(self.documents_skipped, 'document')} already done) in {self.out}"
                    + (f" (run {self.run_id})" if self.run_id else ""))
        state = "interrupted after" if self.interrupted else "done:"
        skipped = f", {self.skipped_pages} skipped" if self.skipped_pages else ""
        skipped += f", {self.routed_pages} from the text layer" if self.routed_pages else ""
        failed = f" ({self.failed_documents:,} failed)" if self.failed_documents else ""
        return (
            f"batchocr: {state} {plural(self.documents, 'document')}{failed}, {plural(self.pages, 'page')} "
            f"({plural(self.error_pages, 'error')}{skipped}), {self.pages_per_s:.2f} pages/s, "
            f"{self.seconds:.1f} s -> {self.out}/{shard_dir(int(self.shard.split('/')[0]))} "
            f"({'runs' if ', ' in self.run_id else 'run'} {self.run_id})"
        )


@dataclass
class Part:
    """Part `index` of `count` of a shard run as several processes (batchocr/parts.py): its
    documents, and the engine start it waits for."""

    index: int
    count: int
    documents: list[DocRef]
    after: Any = None  # an Event: the part before it has built its engine (None: the first part)
    ready: Any = None  # an Event this part sets once its engine is built
    judged: Any = None  # what the parts share to tell a broken engine from bad pages (systemic.Parts)
    later: tuple = ()  # Events: each later part has built its engine, or is gone (none: they build at once)

    def __str__(self) -> str:
        return f"{self.index + 1}/{self.count}"

    def wait_turn(self, stop: threading.Event) -> None:
        """Until the part before this one has its engine (or the run stops)."""
        if self.after is not None and not _until(self.after, stop):
            raise Interrupted(f"batchocr: part {self}: interrupted before its engine started (nothing done)")

    def built(self) -> None:
        if self.ready is not None:
            self.ready.set()

    def wait_for_later_builds(self, stop: threading.Event) -> None:
        """Until every later part has built its engine (or is gone, or the run stops): vLLM
        measures the GPU's free memory while it builds and fails its start if that grows, so a
        part done first keeps its engine's memory until then."""
        for event in self.later:
            if not _until(event, stop):
                return


def _until(event: Any, stop: threading.Event) -> bool:
    """Wait for `event` (another process's), looking at `stop` five times a second: whether the
    event came (False: the run stopped first)."""
    while not event.wait(0.2):
        if stop.is_set():
            return False
    return True


@dataclass
class Shard:
    """A shard prepared for a run: its stores, its plan (None: the listing decides), and the
    settings OUT is to remember of the run (None: an engine handed in, checked once built)."""

    spec: JobSpec
    source: Store
    out: Store
    plan: PlanInfo | None
    settings: dict[str, Any] | None
    warned: bool = False  # the listing's warning (no plan, several shards) is said

    @property
    def index(self) -> int:
        return self.spec.shard.index

    def documents(self) -> Iterator[DocRef]:
        """This shard's documents: from OUT's plan if it has one, else the listing."""
        shard = self.spec.shard
        if self.plan is None:
            return self._listed()
        return located(planned_documents(self.out, shard.index), self.source)

    def _listed(self) -> Iterator[DocRef]:
        """The listing's documents of this shard (by hash). With several shards and no plan
        every pod lists all of SOURCE: said once a process, when a listing ends."""
        shard = self.spec.shard
        listed = 0
        for doc in list_documents(self.source):
            listed += 1
            if shard_of(doc.uri, shard.count) == shard.index:
                yield doc
        if shard.count > 1 and not self.warned:
            self.warned = True
            print(unplanned_warning(shard, listed, self.spec), file=sys.stderr, flush=True)

    def committed(self, settings: dict[str, Any] | None = None) -> pa.Table:
        """The keys of the shard's committed rows, less those made with other settings (before
        a --reprocess: not done, redone now)."""
        settings = settings if settings is not None else self.settings
        keys = committed_keys(self.out, self.index)
        stale = producer.other_runs(self.out, keys.column("run_id").to_pylist(), settings)
        if stale:
            keys = keys.filter(pa.compute.invert(pa.compute.is_in(keys.column("run_id"), pa.array(sorted(stale)))))
        return keys

    def pending(self) -> tuple[list[DocRef], int]:
        """The documents with pages to do, and how many are done already."""
        done = completed(self.committed())
        todo, finished = [], 0
        for doc in self.documents():
            if committed_pages(done, doc) is None:
                finished += 1
            else:
                todo.append(doc)
        return todo, finished

    def idle_if_done(self, started: float) -> RunSummary | None:
        """Where no document of the shard has pages to do, the shard finished and the summary of a
        run that did nothing (`idle`); else None, the listing left at the first document with pages
        to do."""
        done = completed(self.committed())
        finished = 0
        for doc in self.documents():
            if committed_pages(done, doc) is not None:
                return None
            finished += 1
        return self.idle(finished, started)

    def render_spec(self, hints: dict[str, Any]) -> RenderSpec:
        """The engine's wishes (its render hints: a VLM's page size) where the job spec leaves them unset."""
        return render_spec(self.spec, hints)

    def reopen(self) -> None:
        """There is work again: the shard is not done (its marker goes)."""
        if self.out.exists(done_marker(self.index)):
            self.out.remove(done_marker(self.index))

    def finish(self, documents: int, last_run: dict[str, Any], keys: pa.Table | None = None,
               run_ids: set[str] | None = None) -> None:
        """Every page of the shard has a row: its done-marker, with what compaction keeps of `keys`
        (the shard's committed keys; None: read now) and the runs that wrote them."""
        keys = keys if keys is not None else self.committed()
        pages, error_pages = kept_counts(keys)
        shard = self.spec.shard
        self.out.write_json(done_marker(shard.index), {
            "shard": shard.index,
            "shards": shard.count,
            "documents": documents,
            "pages": pages,
            "error_pages": error_pages,
            "run_ids": sorted(run_ids if run_ids is not None else set(keys.column("run_id").to_pylist())),
            "last_run": last_run,
            "finished_at": dt.datetime.now(dt.UTC).isoformat(),
        })

    def idle(self, finished: int, started: float) -> RunSummary:
        """A run of a shard whose `finished` documents are all done: marked done, and its summary
        (no engine built, no run record)."""
        summary = RunSummary(run_id="", shard=str(self.spec.shard), out=self.spec.out, documents_skipped=finished,
                             seconds=time.monotonic() - started)
        self.finish(finished, {"run_ids": [], "seconds": round(summary.seconds, 3), "pages": 0})
        return summary


def prepare(spec: JobSpec, *, sharding: bool = True, settings: bool = True,
            stop: threading.Event | None = None) -> Shard:
    """Before any engine loads: SOURCE and OUT checked, OUT's plan (re-planned first from the
    newest inventory where the job spec names one: batchocr/replan.py, the only write here)
    read and checked against this run (`sharding`: a part's parent did it), and (`settings`)
    what OUT is to remember of the run checked against what it holds; else exit 2. `stop`
    ends a wait for another pod's re-plan."""
    out = Store(spec.out, spec.storage_options)
    source = Store(spec.source, spec.storage_options)
    check_stores(source, out, say=sharding)  # a missing SOURCE leaves no run record; a part says nothing twice
    if sharding and spec.inventory:
        replan(source, out, spec.shard.count, spec.inventory, dict(spec.storage_options),
               stop or threading.Event(), lambda line: print(line, file=sys.stderr, flush=True))
    plan = _check_sharding(source, out, spec) if sharding else None
    expected = None
    if settings:
        expected = producer_settings(spec)
        producer.check(out, expected, spec.reprocess, spec.out)  # OUT's settings, or exit 2 naming both
    return Shard(spec, source, out, plan, expected)


def unplanned_warning(shard: ShardSpec, listed: int, spec: JobSpec) -> str:
    """One line: every shard of a run without a plan lists the whole of SOURCE (N pods, N
    listings of it), and the command that plans it once."""
    source, out = public_url(spec.source), public_url(spec.out)  # a SAS token's signature is not shown
    return (f"batchocr: warning: shard {shard}: no plan in {out}, so every one of the {shard.count} shards "
            f"lists all of SOURCE (this one listed {plural(listed, 'document')} to keep its share); plan once: "
            f"batchocr plan {source} {out} --shards {shard.count} (add --inventory URL where the "
            "container has an Azure blob inventory, or the job spec's `inventory:` key to re-plan each run)")


def committed_pages(done: dict, doc: DocRef) -> int | None:
    """How many of a document's pages are committed; None: all (it is done)."""
    resume = done.get((doc.doc_id, doc.etag), Resume(frozenset()))
    return None if resume is None else len(resume.skip)


def render_spec(spec: JobSpec, hints: dict[str, Any]) -> RenderSpec:
    return dataclasses.replace(spec.render, **{k: v for k, v in hints.items() if getattr(spec.render, k) is None})


def producer_settings(spec: JobSpec) -> dict[str, Any]:
    """What OUT is to remember of this run (producer.settings), from the configuration
    alone: the engine is not built (engines.settings)."""
    known = engines.settings(spec.engine, spec.engine_options)
    render = dataclasses.asdict(render_spec(spec, known["render_hints"]))
    return producer.settings(spec.engine, known["model"], known["preset"], known["prompt"], spec.route, render)


def _check_sharding(source: Store, out: Store, spec: JobSpec) -> PlanInfo | None:
    """OUT's plan is this run's (its shards, its SOURCE), or without one, OUT's output has this
    run's shard count; else exit 2. Returns the plan (None: none), read once a run."""
    plan = read_plan(out)
    if plan is None:
        check_shard_count(out, spec.shard, spec.out)
        return None
    if plan.shards != spec.shard.count:
        raise ConfigError(f"{spec.out} has a plan of {plan.shards} shards: run with --shard I/{plan.shards}")
    if plan.source != source.canonical:
        raise ConfigError(f"{spec.out} has a plan for {plan.source}, not {source.canonical}")
    return plan

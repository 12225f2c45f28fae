"""engines.vllm.instances N: N vLLM engines on one GPU, one stream of pages shared between them.

Each engine is its own engine-core process with 1/N of the GPU's memory and max_num_seqs
sequences: while one engine's host work (its scheduler, a step's outputs) runs, the other's
forward pass keeps the GPU busy. To the pipeline they are one engine.
"""

from __future__ import annotations

import queue
import threading
from typing import Any, Callable, Iterator

import pyarrow as pa

from batchocr.engines.vllm import failures
from batchocr.engines.vllm.base import VLLMBase
from batchocr.engines.vllm.options import VLLMOptions
from batchocr.engines.vllm.scheduler import VLLMEngine


class VLLMInstances(VLLMBase):
    """Several VLLMEngines over one stream of pages, each batch to the one that asks first."""

    def __init__(self, options: VLLMOptions, llms: list[Any] | None = None, *,
                 member: Callable[..., VLLMEngine] = VLLMEngine):
        """`llms`: the instances' vllm.LLMs already built (tests pass stand-ins); else each is
        built, one after the other (each sizes its KV from what the others left). `member`
        builds one engine (benchmarks pass a VLLMEngine of their own)."""
        super().__init__(options)
        n = options.instances
        llms = list(llms) if llms is not None else [None] * n
        if len(llms) != n:
            raise ValueError(f"instances {n}: {len(llms)} engines given")
        one, shared = options.one_of(n), failures.refusals(n)  # what is systemic is judged over all of them
        self.instances: list[VLLMEngine] = []
        try:
            for llm in llms:
                self.instances.append(member(one, llm=llm, warm_up=False, refusals=shared))
        except BaseException:
            self.close()
            raise
        # vLLM forks each engine core from this process: no warm-up thread may be running torch
        # or the image processor while it does (a processor run before a build hung the engine
        # core). And one after the other: first calls made at once each paid the set-up.
        before = None
        for each in self.instances:
            before = each.start_warm_up(after=before)

    @property
    def first_request_at(self) -> float | None:
        """When vLLM took the run's first request: the earliest of the engines'."""
        return _pick(min, [each.first_request_at for each in self.instances])

    @property
    def renderer_warm_up_at(self) -> float | None:
        """When the first of the engines' renderer warm-ups began."""
        return _pick(min, [each.renderer_warm_up_at for each in self.instances])

    @property
    def renderer_warm_up_s(self) -> float | None:
        """How long the renderer's warm-up took: the longest of the engines'."""
        return _pick(max, [each.renderer_warm_up_s for each in self.instances])

    @property
    def queue_pages(self) -> int:
        return sum(each.queue_pages for each in self.instances)

    def run(self, pages: Iterator[pa.RecordBatch], stop: threading.Event | None = None) -> Iterator[pa.RecordBatch]:
        """Each engine runs its own loop in a thread of its own (vLLM's step blocks), taking the
        next batch when its queue has room, and what they finish comes back here, in this
        thread. A failure in one stops the others and is raised here."""
        stop = stop or threading.Event()
        halt = threading.Event()  # the others stop when one fails, or when the pipeline stops
        feeds = [_Feed(halt) for _ in self.instances]
        results: queue.Queue = queue.Queue()
        threads = [threading.Thread(target=_work, args=(engine, feed, halt, results), name=f"batchocr-vllm-{i}",
                                    daemon=True) for i, (engine, feed) in enumerate(zip(self.instances, feeds))]
        for t in threads:
            t.start()
        try:
            yield from _deal(pages, feeds, results, stop)
        finally:
            halt.set()
            for t in threads:
                t.join(timeout=30)

    def describe(self) -> dict[str, Any]:
        first = self.instances[0].describe()
        groups = {k: sum(each.groups[k] for each in self.instances) for k in first["groups"]}
        return first | {"instances": len(self.instances), "groups": groups, "queue_pages": self.queue_pages}

    def close(self) -> None:
        for each in self.instances:
            each.close()


def _pick(pick: Callable[[list[float]], float], values: list[float | None]) -> float | None:
    """`pick` of the values that are set; None where none is."""
    known = [v for v in values if v is not None]
    return pick(known) if known else None


class _Feed:
    """One engine's page batches, handed over by the thread that reads the pipeline's
    (the pipeline's iterator writes rows of its own: it stays in one thread)."""

    def __init__(self, halt: threading.Event):
        self.slot: queue.Queue = queue.Queue(maxsize=1)  # a batch at most waits for the engine
        self.halt = halt
        self.ended = threading.Event()  # no more batches: once the slot is empty, the end of input

    def __iter__(self):
        return self

    def __next__(self) -> pa.RecordBatch:
        while True:
            try:
                return self.slot.get(timeout=0.1)
            except queue.Empty:
                if self.halt.is_set():
                    raise StopIteration from None
                if self.ended.is_set():  # set after the last batch went in: look once more
                    try:
                        return self.slot.get_nowait()
                    except queue.Empty:
                        raise StopIteration from None


def _work(engine: VLLMEngine, feed: _Feed, halt: threading.Event, results: queue.Queue) -> None:
    """One engine's loop, in its own thread: its rows, then its end or its failure, to `results`."""
    try:
        for out in engine.run(feed, halt):
            results.put(("rows", out))
    except BaseException as exc:  # noqa: BLE001 - raised again in the pipeline's thread
        results.put(("error", exc))
    else:
        results.put(("end", None))


def _deal(pages: Iterator[pa.RecordBatch], feeds: list[_Feed], results: queue.Queue,
          stop: threading.Event) -> Iterator[pa.RecordBatch]:
    """The pages' batches to the engines with room, in turn, and their rows back, until every
    engine has ended (or the pipeline stops)."""
    batch, exhausted, ended, turn = None, False, 0, 0
    while ended < len(feeds):
        if stop.is_set():
            return
        if not exhausted and batch is None:
            batch = next(pages, None)
            if batch is None:
                exhausted = True
                for feed in feeds:
                    feed.ended.set()
        if batch is not None:  # to the next engine with room, in turn
            free = next((i % len(feeds) for i in range(turn, turn + len(feeds))
                         if feeds[i % len(feeds)].slot.empty()), None)
            if free is not None:
                feeds[free].slot.put(batch)
                batch, turn = None, free + 1
        try:  # what is finished, waiting a little only where nothing else can move
            what, value = results.get(timeout=0.05 if batch is not None or exhausted else 0)
        except queue.Empty:
            continue
        if what == "error":
            raise value
        if what == "end":
            ended += 1
        else:  # an engine's rows come before its "end": none is left after the last
            yield value

"""One vLLM engine: a vision-language OCR model on vLLM's offline engine, fed continuously.

The engine keeps `queue_pages` requests inside vLLM (its scheduler batches them, continuous
batching) and tops the queue up as pages finish, so the GPU never drains between batches, and
each page leaves the moment it is done. Why not `LLM.generate(list)`: a finite call drains at
its end (the longest page runs alone), and it prepares every image one at a time in the calling
thread (~50-60 ms a page, a cap of ~15-20 pages/s whatever the GPU). Here preparation (the
model's image processor, through vLLM's own renderer) runs in a thread pool off the engine loop,
and pages arrive already at the model's size (render workers resize them), so the processor has
nothing to resize.
"""

from __future__ import annotations

import contextlib
import gc
import itertools
import logging
import threading
import time
from collections import deque
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any, Iterator, Mapping

import pyarrow as pa

from batchocr import schema
from batchocr.engines import result, systemic
from batchocr.engines.vllm import failures, reaper
from batchocr.engines.vllm.base import VLLMBase
from batchocr.engines.vllm.document import Documents, grouped, shares
from batchocr.engines.vllm.options import CHECK_EVERY, VLLMOptions, prompt_setting
from batchocr.engines.vllm.patches import pixels, startup
from batchocr.engines.vllm.repetition import RepetitionCheck
from batchocr.engines.vllm.request import Page, Request, retry
from batchocr.errors import ConfigError
from batchocr.words import plural

# batchocr is installed from its clone (it is on no package index), or comes in the image.
INSTALL_HINT = ("pip install '.[vllm]' in batchocr's clone, on a machine with an NVIDIA GPU (or run the image "
                "its Dockerfile builds)")
log = logging.getLogger(__name__)


class VLLMEngine(VLLMBase):
    """One vllm.LLM and the loop that feeds it (several on one GPU: instances.VLLMInstances)."""

    def __init__(self, options: VLLMOptions, llm: Any | None = None, *, warm_up: bool = True,
                 refusals: systemic.Held | None = None):
        """`llm` is a vllm.LLM already built (tests pass a stand-in); else one is built.
        warm_up: start the renderer's warm-up now (engines sharing a GPU start theirs once all
        are built). refusals: what the run's engines judge together (instances), else its own."""
        if options.instances > 1:
            raise ValueError(f"instances {options.instances}: VLLMEngine is one engine (VLLMInstances drives several)")
        super().__init__(options)
        self._SamplingParams, self._delta = _sampling_api()
        options.set_runner_env()
        options.check_patches()
        if options.bytes_on(self.preset):  # engines.vllm.pixel_bytes: class-wide in this process
            pixels.install_processor()
        else:  # an engine built before in this process may have installed it
            pixels.uninstall()
        if 0 < options.queue_pages < options.max_num_seqs:  # allowed (host memory), but it starves the batch
            log.warning("engines.vllm.queue_pages %d is below max_num_seqs %d: at most %d requests run at once "
                        "(a smaller batch, fewer pages/s)", options.queue_pages, options.max_num_seqs,
                        options.queue_pages)
        self.prompt = self.preset.prompt(options.prompt)
        self.check = RepetitionCheck(options.repetition_span, options.repetition_max_period)
        self.documents = Documents(self.preset.document_separator)
        self._ids = itertools.count()
        # (its threads start with its first task: none runs while vLLM forks the engine core)
        self._pool = ThreadPoolExecutor(options.prepare_threads, thread_name_prefix="batchocr-prepare")
        # How long the renderer's warm-up calls took (None until one has run), and when the first
        # began; when vLLM took the run's first request (time.monotonic): before it, the
        # requests' preparation (the image processor's first calls); after it, the GPU's prefill
        # and decode.
        self.renderer_warm_up_s: float | None = None
        self.renderer_warm_up_at: float | None = None
        self.first_request_at: float | None = None
        self._warmed: dict[str, Future] | None = None  # the warm-up of each kind of request
        self._refusals = refusals or failures.refusals()
        # a build here warms the renderer up beside the engine core's start-up, where vLLM's build allows
        beside = (startup.beside_startup(lambda renderer: self.start_warm_up(renderer=renderer))
                  if llm is None and warm_up else contextlib.nullcontext())
        self._reaper = None
        try:
            with beside:
                if llm is None:  # the engine core it starts dies with this process (engines/vllm/reaper.py)
                    llm, self._reaper = reaper.around(lambda: failures.load(options, self.preset))
                self.llm = llm
            self.engine = self.llm.llm_engine
            failures.check_can_generate(self.engine, options.model)
        except BaseException:
            self._pool.shutdown(wait=False, cancel_futures=True)
            raise
        self._watching = threading.Event()
        failures.watch_engine_core(self.engine, self._watching)
        if warm_up:
            self.start_warm_up()  # where it has not begun beside the build

    @property
    def groups(self) -> dict[str, int]:
        """Document mode: groups sent, given back a part a page, read again page by page (and why)."""
        return self.documents.counts

    @property
    def queue_pages(self) -> int:
        """Requests kept in flight (preparing, or inside vLLM): a page each, or in document mode
        a group of up to group_pages pages each, so that document mode fills max_num_seqs too (a
        cap in pages would keep only a few groups running)."""
        n = self.options.max_num_seqs
        return self.options.queue_pages or n + n // 4 + 32

    def sampling(self, request: Request) -> Any:
        """Sampling parameters of one attempt at a request (benchmarks override this)."""
        o, p = self.options, self.preset
        temperature = o.temperature if o.temperature is not None else p.temperature
        if request.attempt > 1:
            ladder = p.retry_temperatures
            temperature = max(temperature, ladder[min(request.attempt - 2, len(ladder) - 1)])
        extra = dict(p.sampling_args)
        max_tokens = o.max_tokens or p.max_tokens
        if request.document:
            extra |= p.document_sampling_args
            # The group was sized so that its prompt plus its pages' budget fits the context:
            # it may use all of the context that its prompt leaves, or max_tokens a page if set.
            left = self._context - (request.prompt_tokens or len(request.pages) * p.document_page_tokens)
            max_tokens = min(left, len(request.pages) * o.max_tokens) if o.max_tokens else left
        return self._SamplingParams(
            temperature=temperature,
            max_tokens=max_tokens,
            ignore_eos=o.ignore_eos,
            detokenize=o.detokenize,
            output_kind=self._delta,
            **extra,
        )

    @property
    def _context(self) -> int:
        return self.options.max_model_len or self.preset.max_model_len

    def start_warm_up(self, after: Future | None = None, renderer: Any = None) -> Future:
        """vLLM's renderer pays a one-time cost on its first call in a process with each set of
        processor arguments (vLLM keeps a processor a set: Unlimited-OCR's document requests,
        their 1024 view, load one of their own), and prepare threads making their first calls
        at once each pay it, several times over what one call alone pays. So one prepare thread
        pays it now, on blank pages, while the first pages render: in document mode a group's
        call first, then a page's (a page read alone: a one-page document, a group read again);
        a request's preparation waits for its kind's. Once; after `after` (another engine's
        warm-up) where given; through `renderer` where the engine is still being built (vLLM's,
        handed over by patches.startup), else the engine's. Returns the last warm-up's future."""
        if self._warmed is None:
            self._warmed = {}
            for kind in (("document", "page") if self.group_pages > 1 else ("page",)):
                after = self._warmed[kind] = self._pool.submit(self._warm_up, kind, after, renderer)
        return list(self._warmed.values())[-1]

    def _warm_up(self, kind: str, after: Future | None = None, renderer: Any = None) -> None:
        """vLLM's renderer's first call of a kind, alone, on blank pages of the preset's size
        (portrait, as scans are): a page, or the smallest group; never raises: where it fails,
        the requests' own calls say why."""
        from PIL import Image

        if after is not None:
            wait((after,))
        side, multiple = self.preset.max_side, self.preset.size_multiple
        width = max(multiple, int(side * 0.7) // multiple * multiple)
        started = time.monotonic()
        if self.renderer_warm_up_at is None:
            self.renderer_warm_up_at = started
        try:
            blank = Image.new("RGB", (width, side), "white")
            (renderer or self.engine.renderer).render_cmpl([self._prompt([blank] * (2 if kind == "document" else 1), kind == "document")])
        except Exception as exc:  # noqa: BLE001
            log.debug("the renderer's warm-up (%s) failed (the requests' calls will say why): %s: %s",
                      kind, type(exc).__name__, exc)
        self.renderer_warm_up_s = round((self.renderer_warm_up_s or 0) + time.monotonic() - started, 3)

    def _prompt(self, images: list, document: bool) -> dict:
        """The renderer's input for a request of these page images: a page alone, or a group."""
        if document:
            prompt = {"prompt": self.preset.document_prompt(len(images)), "multi_modal_data": {"image": images}}
            if self.preset.document_mm_processor_kwargs:
                prompt["mm_processor_kwargs"] = dict(self.preset.document_mm_processor_kwargs)
            return prompt
        return {"prompt": self.prompt, "multi_modal_data": {"image": images[0]}}

    def _prepare(self, request: Request) -> Any:
        """Off the engine loop: the model's image processor and tokenizer, via vLLM's
        renderer (thread-safe with the processor cache off, as in vLLM's server); after
        the warm-up's first call of the request's kind."""
        from PIL import Image

        if self._warmed is not None:
            warmed = self._warmed.get("document" if request.document else "page")
            if warmed is not None:
                wait((warmed,))  # done, or cancelled by close(): the request is prepared either way
        images = [Image.frombuffer("RGB", (p.width, p.height), p.image, "raw", "RGB", 0, 1) for p in request.pages]
        (engine_input,) = self.engine.renderer.render_cmpl([self._prompt(images, request.document)])
        return engine_input

    def run(self, pages: Iterator[pa.RecordBatch], stop: threading.Event | None = None) -> Iterator[pa.RecordBatch]:
        """Page mode: each page of each batch is a request. Document mode (group_pages > 1):
        each batch is one group, consecutive pages of one document (the pipeline groups
        them), sent as one request when it holds more than one page."""
        stop = stop or threading.Event()
        preparing: deque[tuple[Request, Future]] = deque()
        running: dict[str, Request] = {}
        exhausted = False
        try:
            while not stop.is_set():
                if not exhausted:
                    exhausted = self._pull(pages, preparing, running)
                # Hand prepared requests to vLLM, oldest first, as many as admit() says.
                rows = []
                for _ in range(self._admit(preparing, running, exhausted)):
                    request, future = preparing.popleft()
                    rows.extend(self._submit(request, future, running, preparing))
                # Collect what vLLM finished.
                if running:
                    rows.extend(self._collect(running, preparing))
                elif preparing:
                    wait([preparing[0][1]], return_when=FIRST_COMPLETED)
                elif exhausted:
                    rows.extend(self._end_of_input())
                    if rows:
                        yield schema.batch(schema.RESULTS, rows)
                    return
                if rows:
                    yield schema.batch(schema.RESULTS, rows)
        finally:
            # Stopped (SIGTERM) or failed: drop what is unfinished; it is not
            # committed, so the next run redoes it.
            for _, future in preparing:
                future.cancel()
            if running:
                self.engine.abort_request(list(running))

    def _pull(self, pages: Iterator[pa.RecordBatch], preparing: deque, running: dict) -> bool:
        """Keep the queue full: pull rendered pages, start preparing them; but not while vLLM
        could take a prepared request (at the start, filling the whole queue first held the GPU
        idle for the time it takes to render and prepare it). True once the input has ended."""
        while len(preparing) + len(running) < self.queue_pages:  # requests: a page, or a group of pages
            batch = next(pages, None)
            if batch is None:
                return True
            columns = batch.select(["doc_id", "page_index", "width", "height", "image"])
            group = [Page(**row) for row in columns.to_pylist()]
            if self.group_pages > 1 and len(group) > 1:
                self._start(Request(group, document=True), preparing)
            else:
                for page in group:
                    self._start(Request([page]), preparing)
            if self._admit(preparing, running, False):
                break
        return False

    def _admit(self, preparing: deque, running: dict, exhausted: bool) -> int:
        """How many prepared requests go to vLLM now. admit_pages 0: all of them, and vLLM
        admits them from its own queue as sequences free, one a step in the steady state,
        paying a prefill step's fixed cost once a page. admit_pages N: none until N
        sequences are free (nothing runs; or, at the input's end, as many as are left), then
        as many as are free, so that their prefills share steps."""
        ready = 0
        for _, future in preparing:
            if not future.done():
                break
            ready += 1
        admit = self.admit_pages
        if not ready or not admit:
            return ready
        free = self.options.max_num_seqs - len(running)
        tail = exhausted and ready == len(preparing)  # no more to come: the last ones need fewer
        if running and free < (min(admit, ready) if tail else admit):
            return 0
        return min(ready, max(free, 0 if running else 1))

    def _start(self, request: Request, preparing: deque) -> None:
        preparing.append((request, self._pool.submit(self._prepare, request)))

    def _submit(self, request: Request, future: Future, running: dict[str, Request], preparing: deque) -> list[dict]:
        request_id = f"p{next(self._ids)}"
        try:
            engine_input = future.result()
            if request.document:
                ids = engine_input.get("prompt_token_ids") if isinstance(engine_input, Mapping) else None
                request.prompt_tokens = len(ids) if ids is not None else None
            request.started = time.perf_counter()
            self.engine.add_request(request_id, engine_input, self.sampling(request))
            if self.first_request_at is None:
                self.first_request_at = time.monotonic()
        except Exception as exc:  # noqa: BLE001 - a rejected request is that page's error row ...
            if failures.engine_dead(self.engine):  # ... but not a dead engine's refusal: that is the run's
                raise failures.engine_failure(self.engine, exc) from exc
            if request.document:  # a group refused (too long, say): its pages are read alone
                self.documents.sent()
                return self._fall_back(request, "rejected", preparing)
            page = request.pages[0]
            row = self._error(request, page, "rejected",
                              f"page {page.page_index}: vLLM rejected the request: {type(exc).__name__}: {exc}")
            return self._refused(grouped(request, row), exc)  # a fallback's rows leave with its group's
        if request.document:
            self.documents.sent()
        running[request_id] = request
        return self._refusals.taken()  # refused before one was taken: per-page after all

    def _refused(self, rows: list[dict], exc: Exception) -> list[dict]:
        """... unless it is a property of the engine: until vLLM has taken a request (on any
        of the run's engines), refusals are held back; systemic.LIMIT alike in a row stop
        the run with one line, and no row claims a per-page error (batchocr/engines/systemic.py)."""
        return self._refusals.failed_on(rows, failures.named(exc))

    def _end_of_input(self) -> list[dict]:
        """Every page of a short shard refused alike, none taken: systemic too. With several
        engines, the last whose input ends judges what all of them hold."""
        return self._refusals.ended()

    def _collect(self, running: dict[str, Request], preparing: deque) -> list[dict]:
        try:
            outputs = self.engine.step()
        except Exception as exc:  # the engine itself failed: systemic, stop the run
            raise failures.engine_failure(self.engine, exc) from exc
        rows = []
        for out in outputs:
            request = running.get(out.request_id)
            if request is None:
                continue
            completion = out.outputs[0]
            before = len(request.tokens)
            request.tokens.extend(completion.token_ids)
            if completion.text:
                request.text.append(completion.text)
            if request.prompt_tokens is None and out.prompt_token_ids is not None:
                request.prompt_tokens = len(out.prompt_token_ids)
            # Checked every CHECK_EVERY tokens, not every step: checked at every step, 256
            # running pages lost about a third of the throughput to it.
            crossed = len(request.tokens) // CHECK_EVERY != before // CHECK_EVERY
            if not out.finished and crossed and self.check.looping(request.tokens):
                self.engine.abort_request([out.request_id])
                del running[out.request_id]
                if request.document:
                    rows.extend(self._fall_back(request, "repetition", preparing))
                elif request.attempt < self.options.max_attempts:
                    self._start(retry(request), preparing)
                else:
                    rows.extend(self._finished(request, "repetition", preparing))
            elif out.finished:
                del running[out.request_id]
                rows.extend(self._finished(request, completion.finish_reason, preparing))
        return rows

    def _finished(self, request: Request, finish_reason: str | None, preparing: deque) -> list[dict]:
        if not request.document:
            return grouped(request, self._row(request, request.pages[0], finish_reason))
        raw = "".join(request.text) if self.options.detokenize else None
        parts = self.documents.parts(request, finish_reason, raw)
        if isinstance(parts, str):  # why it is read again
            return self._fall_back(request, parts, preparing, finish_reason)
        return [self._row(request, page, "stop", part, share)
                for page, part, share in zip(request.pages, parts, shares(len(request.tokens), parts))]

    def _fall_back(self, request: Request, reason: str, preparing: deque, finish_reason: str | None = None) -> list[dict]:
        """A group whose output is not a part a page (or that hit the token limit, looped,
        or was refused): never shift text onto the wrong page. Its pages are read again
        alone; with document_fallback off (benchmarks on random weights), each gets an
        error row instead, the group's tokens shared between them."""
        self.documents.failed(reason)
        if self.options.document_fallback:
            for alone in self.documents.pages_alone(request):
                self._start(alone, preparing)
            return []
        return [self._error(request, page, "document_split", message, output_tokens=share)
                for page, message, share in self.documents.unread(request, reason, finish_reason)]

    def _row(self, request: Request, page: Page, finish_reason: str | None, raw: str | None = None,
             output_tokens: int | None = None) -> dict:
        reason = {"stop": "stop", "length": "length", "repetition": "repetition"}.get(finish_reason or "", "error")
        if raw is None and self.options.detokenize:
            raw = "".join(request.text)
        text, blocks = self.preset.read(raw, page.width, page.height) if raw is not None else (None, None)
        row = self._common(request, page, output_tokens) | {"text": text, "blocks": blocks, "finish_reason": reason}
        if reason == "repetition":
            row["error_type"] = "repetition"
            row["error_message"] = (f"page {page.page_index}: the output kept repeating itself; stopped after "
                                    f"{len(request.tokens)} tokens, {plural(request.attempt, 'attempt')}")
        elif reason == "error":
            row["error_type"] = "engine_error"
            row["error_message"] = f"page {page.page_index}: vLLM finished the request with {finish_reason!r}"
        return row

    def _error(self, request: Request, page: Page, error_type: str, message: str,
               output_tokens: int | None = None) -> dict:
        return self._common(request, page, output_tokens) | {
            "finish_reason": "error", "error_type": error_type, "error_message": message}

    def _common(self, request: Request, page: Page, output_tokens: int | None) -> dict:
        n = len(request.pages)
        prompt = request.prompt_tokens
        if prompt is not None and n > 1:  # a group's prompt, shared between its pages
            prompt = prompt // n + (request.pages.index(page) < prompt % n)
        return result(page.doc_id, page.page_index, prompt_tokens=prompt,
                      output_tokens=request.spent + (len(request.tokens) if output_tokens is None else output_tokens),
                      attempts=request.attempt, mode=request.mode,
                      latency_ms=(time.perf_counter() - request.started) * 1000 if request.started else None)

    def describe(self) -> dict[str, Any]:
        import vllm

        return {"vllm": vllm.__version__, "preset": self.preset.name, "prompt": prompt_setting(self.options, self.preset),
                "mode": self.options.mode, "group_pages": self.group_pages, "groups": self.groups,
                "document_fallback": self.options.document_fallback,
                "queue_pages": self.queue_pages, "admit_pages": self.admit_pages,
                "prepare_threads": self.options.prepare_threads,
                "max_attempts": self.options.max_attempts, "orient": bool(self.needs.upright),
                "llm_args": self.options.llm_args(self.preset)}

    def close(self) -> None:
        """Shut vLLM down explicitly: a process that finished its LLM work was seen
        to hang at exit until killed."""
        if not hasattr(self, "engine"):  # it failed to build
            return
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._watching.set()  # our own shutdown is no death
        core = getattr(self.engine, "engine_core", None)
        if core is not None and hasattr(core, "shutdown"):
            core.shutdown()
        if self._reaper is not None:
            self._reaper.close()
        self.llm = self.engine = None
        gc.collect()


def _sampling_api() -> tuple[type, Any]:
    """vLLM's SamplingParams and its DELTA output kind (a running request's new tokens only)."""
    try:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind
    except ImportError as exc:
        raise ConfigError(f"--engine vllm needs vLLM, which is not installed ({exc}): {INSTALL_HINT}") from None
    return SamplingParams, RequestOutputKind.DELTA

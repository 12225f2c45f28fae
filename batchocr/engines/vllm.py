"""The production engine: a vision-language OCR model on vLLM's offline engine.

Pages are fed continuously: the engine keeps `queue_pages` requests inside vLLM
(its scheduler batches them, continuous batching) and tops the queue up as pages
finish, so the GPU never drains between batches, and each page leaves the moment
it is done. Why not `LLM.generate(list)`: a finite call drains at its end (the
longest page runs alone), and it prepares every image one at a time in the
calling thread (~50-60 ms a page, a cap of ~15-20 pages/s whatever the GPU).
Here preparation (the model's image processor, through vLLM's own renderer) runs
in a thread pool off the engine loop, and pages arrive already at the model's
size (render workers resize them), so the processor has nothing to resize.
"""

from __future__ import annotations

import gc
import itertools
import os
import re
import threading
import time
from collections import deque
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Annotated, Any, Iterator, Mapping

import pyarrow as pa
from annotated_types import Ge, Gt, Le

from batchocr import schema
from batchocr.config import FORBID
from batchocr.engines import parse_options, result
from batchocr.engines.presets import Preset, get_preset
from batchocr.engines.repetition import RepetitionCheck
from batchocr.errors import BatchocrError, ConfigError
from batchocr.schema import Needs

INSTALL_HINT = "pip install 'batchocr[vllm]' (on a machine with an NVIDIA GPU)"
CHECK_EVERY = 32  # tokens between two looks for runaway repetition
# Refusals alike before vLLM took any request that make the refusal the engine's (a
# model that cannot take this input, a vLLM without the API batchocr calls), not the pages'.
SYSTEMIC_REFUSALS = 8


@dataclass(frozen=True)
class VLLMOptions:
    __pydantic_config__ = FORBID  # typed by batchocr.config, like all configuration
    model: str = ""  # a local folder (or a hub name where a hub is reachable)
    preset: str = "qwen2.5-vl"
    prompt: str | None = None  # replaces the preset's instruction
    # Sampling; None = the preset's.
    max_tokens: int | None = None
    temperature: float | None = None
    # Engine arguments, chosen for throughput (see docs/BENCHMARKS.md).
    max_num_batched_tokens: int = 16384
    max_num_seqs: int = 256
    gpu_memory_utilization: Annotated[float, Gt(0), Le(1)] = 0.9
    max_model_len: int | None = None  # None = the preset's
    # Every page image is new: prefix caching and the processor cache only cost
    # (vLLM's OCR recipes turn both off).
    enable_prefix_caching: bool = False
    mm_processor_cache_gb: float = 0.0
    limit_mm_per_prompt: Mapping[str, int] = field(default_factory=lambda: {"image": 1, "video": 0})
    tensor_parallel_size: int = 1
    dtype: str = "auto"
    quantization: str | None = None  # e.g. "fp8"
    seed: int = 0
    load_format: str = "auto"  # "dummy": random weights, for benchmarks
    enforce_eager: bool = False
    # Pages kept inside vLLM at once; 0 = max_num_seqs + max_num_seqs // 4 + 32.
    queue_pages: int = 0
    # Threads preparing requests (image processor, tokens) off the engine loop.
    prepare_threads: int = 4
    # Runaway repetition: attempts per page (1 = no retry) and the loop detector.
    max_attempts: Annotated[int, Ge(1)] = 3
    repetition_span: int = 384
    repetition_max_period: int = 96
    # For benchmarks with random weights: generate exactly max_tokens, skip detokenizing.
    ignore_eos: bool = False
    detokenize: bool = True
    # Anything else for vllm.LLM(...), passed as is.
    engine_args: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        if not self.model:
            raise ConfigError("engine vllm needs a model: --model PATH (or engines.vllm.model in the job spec)")
        get_preset(self.preset)

    def llm_args(self, preset: Preset) -> dict[str, Any]:
        args = {
            "model": self.model,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "max_num_seqs": self.max_num_seqs,
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "max_model_len": self.max_model_len or preset.max_model_len,
            "enable_prefix_caching": self.enable_prefix_caching,
            "mm_processor_cache_gb": self.mm_processor_cache_gb,
            "limit_mm_per_prompt": dict(self.limit_mm_per_prompt),
            "tensor_parallel_size": self.tensor_parallel_size,
            "dtype": self.dtype,
            "quantization": self.quantization,
            "seed": self.seed,
            "load_format": self.load_format,
            "enforce_eager": self.enforce_eager,
            "mm_processor_kwargs": dict(preset.mm_processor_kwargs) or None,
        }
        return args | dict(preset.engine_args) | dict(self.engine_args)


@dataclass
class _Page:
    doc_id: str
    page_index: int
    width: int
    height: int
    image: bytes
    attempt: int = 1
    started: float = 0.0
    prompt_tokens: int | None = None
    tokens: list[int] = field(default_factory=list)
    text: list[str] = field(default_factory=list)


class VLLMEngine:
    name = "vllm"

    def __init__(self, options: VLLMOptions, llm: Any | None = None):
        """`llm` is a vllm.LLM already built (tests pass a stand-in); else one is built."""
        self.options = options
        self.preset = get_preset(options.preset)
        self.needs = Needs(image=True)
        self.model = options.model
        try:
            from vllm import SamplingParams
            from vllm.sampling_params import RequestOutputKind
        except ImportError as exc:
            raise ConfigError(f"--engine vllm needs vLLM, which is not installed ({exc}): {INSTALL_HINT}") from None
        self._SamplingParams = SamplingParams
        self._delta = RequestOutputKind.DELTA
        if llm is None:
            from vllm import LLM

            if options.model.startswith(("/", "./", "../")) and not os.path.isdir(options.model):
                # A wrong path is the user's to fix: exit 2 fails the Kubernetes Job at once.
                raise ConfigError(f"engine vllm: model folder {options.model} does not exist")
            llm = LLM(**options.llm_args(self.preset))
        self.llm = llm
        self.engine = llm.llm_engine
        _check_can_generate(self.engine, options.model)
        self.prompt = self.preset.prompt(options.prompt)
        self.check = RepetitionCheck(options.repetition_span, options.repetition_max_period)
        self._ids = itertools.count()
        self._pool = ThreadPoolExecutor(options.prepare_threads, thread_name_prefix="batchocr-prepare")
        self._accepted = 0  # requests vLLM took
        self._held: list[tuple[str, dict]] = []  # refusals before any was taken: (signature, row)

    @property
    def accelerator(self) -> dict:
        """The GPUs this run holds (the pod's), for its cost record (batchocr/cost.py)."""
        from batchocr.cost import visible_gpus

        return visible_gpus()

    @property
    def render_hints(self) -> dict[str, int]:
        """The page size the model wants: the pipeline renders to it."""
        return _render_hints(self.preset)

    @property
    def queue_pages(self) -> int:
        n = self.options.max_num_seqs
        return self.options.queue_pages or n + n // 4 + 32

    def sampling(self, page: _Page) -> Any:
        """Sampling parameters of one attempt at a page (benchmarks override this)."""
        o, p = self.options, self.preset
        temperature = o.temperature if o.temperature is not None else p.temperature
        if page.attempt > 1:
            ladder = p.retry_temperatures
            temperature = max(temperature, ladder[min(page.attempt - 2, len(ladder) - 1)])
        return self._SamplingParams(
            temperature=temperature,
            max_tokens=o.max_tokens or p.max_tokens,
            ignore_eos=o.ignore_eos,
            detokenize=o.detokenize,
            output_kind=self._delta,
            **p.sampling_args,
        )

    def _prepare(self, page: _Page) -> Any:
        """Off the engine loop: the model's image processor and tokenizer, via vLLM's
        renderer (thread-safe with the processor cache off, as in vLLM's server)."""
        from PIL import Image

        image = Image.frombuffer("RGB", (page.width, page.height), page.image, "raw", "RGB", 0, 1)
        (engine_input,) = self.engine.renderer.render_cmpl(
            [{"prompt": self.prompt, "multi_modal_data": {"image": image}}]
        )
        return engine_input

    def run(self, pages: Iterator[pa.RecordBatch], stop: threading.Event | None = None) -> Iterator[pa.RecordBatch]:
        stop = stop or threading.Event()
        preparing: deque[tuple[_Page, Future]] = deque()
        running: dict[str, _Page] = {}
        exhausted = False
        try:
            while True:
                if stop.is_set():
                    return
                # 1. Keep the queue full: pull rendered pages, start preparing them.
                while not exhausted and len(preparing) + len(running) < self.queue_pages:
                    batch = next(pages, None)
                    if batch is None:
                        exhausted = True
                        break
                    for row in batch.select(["doc_id", "page_index", "width", "height", "image"]).to_pylist():
                        self._start(_Page(**row), preparing)
                # 2. Hand prepared pages to vLLM, oldest first.
                rows = []
                while preparing and preparing[0][1].done():
                    page, future = preparing.popleft()
                    rows.extend(self._submit(page, future, running))
                # 3. Collect what vLLM finished.
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

    def _start(self, page: _Page, preparing: deque) -> None:
        preparing.append((page, self._pool.submit(self._prepare, page)))

    def _submit(self, page: _Page, future: Future, running: dict[str, _Page]) -> list[dict]:
        request_id = f"p{next(self._ids)}"
        try:
            engine_input = future.result()
            page.started = time.perf_counter()
            self.engine.add_request(request_id, engine_input, self.sampling(page))
        except Exception as exc:  # noqa: BLE001 - a rejected request is that page's error row ...
            row = result(page.doc_id, page.page_index, finish_reason="error", error_type="rejected",
                         error_message=f"page {page.page_index}: vLLM rejected the request: {type(exc).__name__}: {exc}",
                         attempts=page.attempt)
            return self._refused(row, exc)
        running[request_id] = page
        self._accepted += 1
        held, self._held = self._held, []
        return [r for _, r in held]  # refused before one was taken: per-page after all

    def _refused(self, row: dict, exc: Exception) -> list[dict]:
        """... unless it is a property of the engine: until vLLM has taken a request,
        refusals are held back; SYSTEMIC_REFUSALS alike in a row stop the run with one
        line, and no row claims a per-page error."""
        if self._accepted:
            return [row]
        reason = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"
        signature = re.sub(r"\d+", "N", reason)
        released = [r for sig, r in self._held if sig != signature]
        self._held = [(sig, r) for sig, r in self._held if sig == signature] + [(signature, row)]
        self._reason = reason
        if len(self._held) >= SYSTEMIC_REFUSALS:
            raise self._systemic()
        return released

    def _end_of_input(self) -> list[dict]:
        """Every page of a short shard refused alike, none taken: systemic too."""
        if len(self._held) > 1:
            raise self._systemic()
        held, self._held = self._held, []
        return [r for _, r in held]

    def _systemic(self) -> BatchocrError:
        return BatchocrError(f"engine vllm refused every request alike ({len(self._held)} pages, none taken): "
                             f"{self._reason} (a property of the engine or model, not of the pages: no page "
                             "was recorded; fix it and rerun)")

    def _collect(self, running: dict[str, _Page], preparing: deque) -> list[dict]:
        try:
            outputs = self.engine.step()
        except Exception as exc:  # the engine itself failed: systemic, stop the run
            raise BatchocrError(f"the vLLM engine failed: {type(exc).__name__}: {exc}") from exc
        rows = []
        for out in outputs:
            page = running.get(out.request_id)
            if page is None:
                continue
            completion = out.outputs[0]
            before = len(page.tokens)
            page.tokens.extend(completion.token_ids)
            if completion.text:
                page.text.append(completion.text)
            if page.prompt_tokens is None and out.prompt_token_ids is not None:
                page.prompt_tokens = len(out.prompt_token_ids)
            # Checked every CHECK_EVERY tokens, not every step: on every step for
            # 256 running pages the check cost a third of the throughput (H200).
            crossed = len(page.tokens) // CHECK_EVERY != before // CHECK_EVERY
            if not out.finished and crossed and self.check.looping(page.tokens):
                self.engine.abort_request([out.request_id])
                del running[out.request_id]
                if page.attempt < self.options.max_attempts:
                    self._start(_retry(page), preparing)
                else:
                    rows.append(self._row(page, "repetition"))
            elif out.finished:
                del running[out.request_id]
                rows.append(self._row(page, completion.finish_reason))
        return rows

    def _row(self, page: _Page, finish_reason: str | None) -> dict:
        reason = {"stop": "stop", "length": "length", "repetition": "repetition"}.get(finish_reason or "", "error")
        text, blocks = (self.preset.read("".join(page.text), page.width, page.height) if self.options.detokenize
                        else (None, None))
        row = result(page.doc_id, page.page_index, text=text, blocks=blocks, finish_reason=reason,
                     prompt_tokens=page.prompt_tokens, output_tokens=len(page.tokens), attempts=page.attempt,
                     latency_ms=(time.perf_counter() - page.started) * 1000)
        if reason == "repetition":
            row["error_type"] = "repetition"
            row["error_message"] = (f"page {page.page_index}: the output kept repeating itself; stopped after "
                                    f"{len(page.tokens)} tokens, {page.attempt} attempts")
        elif reason == "error":
            row["error_type"] = "engine_error"
            row["error_message"] = f"page {page.page_index}: vLLM finished the request with {finish_reason!r}"
        return row

    def describe(self) -> dict[str, Any]:
        import vllm

        return {"vllm": vllm.__version__, "preset": self.preset.name, "prompt": self.prompt,
                "queue_pages": self.queue_pages, "prepare_threads": self.options.prepare_threads,
                "max_attempts": self.options.max_attempts,
                "llm_args": self.options.llm_args(self.preset)}

    def close(self) -> None:
        """Shut vLLM down explicitly: a process that finished its LLM work was seen
        to hang at exit until killed."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        core = getattr(self.engine, "engine_core", None)
        if core is not None and hasattr(core, "shutdown"):
            core.shutdown()
        self.llm = self.engine = None
        gc.collect()


def _check_can_generate(engine: Any, model: str) -> None:
    """At start, not as 512 error rows: a model vLLM loaded for pooling (an embedding
    model, or a folder whose config says so) cannot OCR."""
    tasks = tuple(engine.get_supported_tasks())
    if "generate" not in tasks:
        raise ConfigError(f"engine vllm: the model {model} cannot generate text (vLLM supports "
                          f"{', '.join(map(str, tasks)) or 'no task'} for it): an OCR model must be a generative "
                          "vision-language model")


def _retry(page: _Page) -> _Page:
    return _Page(page.doc_id, page.page_index, page.width, page.height, page.image, attempt=page.attempt + 1)


def _render_hints(preset: Preset) -> dict[str, int]:
    return {"max_side": preset.max_side, "size_multiple": preset.size_multiple}


def settings(options: Mapping[str, Any]) -> dict[str, Any]:
    """What OUT remembers of this engine (model, preset, prompt, page size), from its
    options alone: vLLM is not imported, no model loaded (engines.settings)."""
    o = parse_options(VLLMOptions, options, "vllm")
    preset = get_preset(o.preset)
    return {"model": o.model, "preset": preset.name, "prompt": preset.prompt(o.prompt),
            "render_hints": _render_hints(preset)}


def create(options: Mapping[str, Any]) -> VLLMEngine:
    return VLLMEngine(parse_options(VLLMOptions, options, "vllm"))

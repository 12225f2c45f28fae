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

import dataclasses
import gc
import itertools
import logging
import os
import queue
import re
import threading
import time
from collections import deque
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Annotated, Any, Callable, Iterator, Literal, Mapping

import pyarrow as pa
from annotated_types import Ge, Gt, Le

from batchocr import schema
from batchocr.engines.vllm.patches import deepencoder, ngram, ngram_sampler, rswa_tiles, vitpad, workerext
from batchocr.config import FORBID
from batchocr.engines import Engine, EngineType, parse_options, result, systemic
from batchocr.engines.vllm.presets import Preset, document_presets, get_preset
from batchocr.engines.vllm.repetition import RepetitionCheck
from batchocr.errors import BatchocrError, ConfigError
from batchocr.schema import Needs
from batchocr.words import plural

INSTALL_HINT = "pip install 'batchocr[vllm]' (on a machine with an NVIDIA GPU)"
CHECK_EVERY = 32  # tokens between two looks for runaway repetition
WATCH_S = 0.5  # how often the engine core's death is looked for
log = logging.getLogger(__name__)
# Why a document group's pages were read again one by one (OUT/_runs: engine_params.groups).
FALLBACK_REASONS = ("split", "length", "repetition", "rejected", "engine_error")
# Document mode: pages a group may hold at most (Unlimited-OCR was trained on 2-50 page documents).
MAX_GROUP_PAGES = 50
DOCUMENT_PROMPT_TOKENS = 16  # a group's prompt beyond its images (BOS, the instruction)


@dataclass(frozen=True)
class VLLMOptions:
    __pydantic_config__ = FORBID  # typed by batchocr.config, like all configuration
    model: str = ""  # a local folder (or a hub name where a hub is reachable)
    preset: str = "qwen2.5-vl"
    prompt: str | None = None  # replaces the preset's instruction
    # Sampling; None = the preset's.
    max_tokens: Annotated[int, Ge(1)] | None = None
    temperature: Annotated[float, Ge(0)] | None = None
    # Engine arguments, chosen for throughput (see docs/BENCHMARKS.md).
    max_num_batched_tokens: Annotated[int, Ge(1)] = 16384
    max_num_seqs: Annotated[int, Ge(1)] = 256
    gpu_memory_utilization: Annotated[float, Gt(0), Le(1)] = 0.9
    # The KV cache's size in GiB (vLLM's kv_cache_memory_bytes); None: what gpu_memory_utilization
    # leaves once vLLM has measured the model's use of the GPU's free memory. Set, no engine
    # measures free memory, so the parts of --processes N build their engines at once (each
    # kv_cache_gib / N) instead of one after the other. Only the GPU's check at start still
    # reads gpu_memory_utilization (free memory at least that share).
    kv_cache_gib: Annotated[float, Gt(0)] | None = None
    max_model_len: Annotated[int, Ge(1)] | None = None  # None = the preset's
    # Every page image is new: prefix caching and the processor cache only cost
    # (vLLM's OCR recipes turn both off). The processor cache must stay off: vLLM keeps a mirror
    # of its engine core's cache here, updated as each request is prepared, which holds only if
    # requests reach the engine core one at a time in that order, each of them; batchocr prepares
    # them in several threads, and some never go (the renderer's warm-up, a refused page).
    enable_prefix_caching: bool = False
    mm_processor_cache_gb: Annotated[float, Ge(0)] = 0.0
    limit_mm_per_prompt: Mapping[str, int] = field(default_factory=lambda: {"image": 1, "video": 0})
    tensor_parallel_size: Annotated[int, Ge(1)] = 1
    dtype: str = "auto"
    quantization: str | None = None  # e.g. "fp8"
    seed: int = 0
    load_format: str = "auto"  # "dummy": random weights, for benchmarks
    enforce_eager: bool = False
    # Requests kept in flight at once (a page, or in document mode a group); 0 = max_num_seqs +
    # max_num_seqs // 4 + 32.
    queue_pages: Annotated[int, Ge(0)] = 0
    # Requests go to vLLM once this many sequences are free, together (their prefills share a
    # step); 0: at once, queued inside vLLM, which admits them as sequences free. None: the
    # preset's in page mode (unlimited-ocr 16, measured: docs/GPU.md; the others 0), 0 in
    # document mode.
    admit_pages: Annotated[int, Ge(0)] | None = None
    # Threads preparing requests (image processor, tokens) off the engine loop.
    prepare_threads: Annotated[int, Ge(1)] = 4
    # Runaway repetition: attempts per page (1 = no retry) and the loop detector: the last
    # repetition_span tokens one block of at most repetition_max_period (<= span / 2) repeated.
    max_attempts: Annotated[int, Ge(1)] = 3
    repetition_span: Annotated[int, Ge(2)] = 384
    repetition_max_period: Annotated[int, Ge(1)] = 96
    # For benchmarks with random weights: generate exactly max_tokens, skip detokenizing.
    ignore_eos: bool = False
    detokenize: bool = True
    # page: a request a page. document: consecutive pages of a document in one request, the
    # output split back a part a page (presets that read documents: unlimited-ocr).
    mode: Literal["page", "document"] = "page"
    # Document mode: pages a group holds at most; 0 = as many as the context allows, each page
    # its image's tokens plus group_page_tokens of output (and at most MAX_GROUP_PAGES).
    group_pages: Annotated[int, Ge(0), Le(MAX_GROUP_PAGES)] = 0
    group_page_tokens: Annotated[int, Gt(0)] = 2048
    # A group whose output does not split a part a page (or hit the token limit) is read again
    # page by page. Off only for benchmarks on random weights, which never write the separator.
    document_fallback: bool = True
    # Where a preset's no-repeat n-gram bans run (unlimited-ocr, deepseek-ocr). processor: a
    # logits processor (batchocr.ngram; vLLM then runs its V1 model runner, the processor on the
    # host a step). sampler: on the GPU in the V2 runner's sampler (batchocr.ngram_sampler), the
    # same bans; right on the H200, its speed against the processor's not settled (docs/GPU.md).
    ngram_bans: Literal["processor", "sampler"] = "processor"
    # unlimited-ocr, deepseek-ocr: their vision encoder over a step's pages at once, not page by
    # page with the host waiting on the GPU between (batchocr.deepencoder, patched into vLLM's
    # engine core). None: the preset's (on for unlimited-ocr, where it won on the H200 at equal
    # work; off for deepseek-ocr, not measured).
    batch_encoder: bool | None = None
    # unlimited-ocr: R-SWA's attention reads only the KV tiles its window and prompt can see
    # (batchocr.rswa_tiles, vLLM's Triton kernel rewritten in its engine core; the same output).
    # None: the preset's in either mode (on for unlimited-ocr, where it won on the H200 at equal
    # work in each), where this vLLM's kernel is the one the rewrite knows (else vLLM's own, with a warning).
    rswa_tiles: bool | None = None
    # qwen2.5-vl, olmocr-2: the vision MLPs' inner size padded 3,420 -> 3,456 with zeros once
    # loaded, so that cuBLAS runs a Hopper GEMM, not an Ampere one (batchocr.vitpad; the same
    # output). None: the preset's (off in every preset: over the compiled vision blocks, the
    # presets' default, 1.007x steady on the H200; docs/GPU.md, seventeenth lease).
    vit_pad: bool | None = None
    # vLLM engines this run drives on its GPU, each its own engine core process with
    # gpu_memory_utilization / instances of the GPU's memory and max_num_seqs sequences, the
    # pages shared between them: one engine's host work (scheduling, a step's outputs) runs
    # while the other's forward pass keeps the GPU busy (docs/GPU.md, "Issue 20, seventh lease").
    instances: Annotated[int, Ge(1), Le(8)] = 1
    # Anything else for vllm.LLM(...), passed as is.
    engine_args: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        preset = get_preset(self.preset)
        if self.mode == "document" and preset.document_template is None:
            raise ConfigError(f"engines.vllm.mode: document needs a preset that reads whole documents "
                              f"({', '.join(document_presets())}); {preset.name} reads one page a request")
        if self.batch_encoder is True and preset.name not in deepencoder.PRESETS:
            raise ConfigError(f"engines.vllm.batch_encoder: batches DeepSeek-OCR's vision encoder "
                              f"({', '.join(deepencoder.PRESETS)}); preset {preset.name} has another")
        if self.rswa_tiles and preset.name not in rswa_tiles.PRESETS:
            raise ConfigError(f"engines.vllm.rswa_tiles: skips the KV tiles R-SWA hides "
                              f"({', '.join(rswa_tiles.PRESETS)}); preset {preset.name} attends without R-SWA")
        if self.vit_pad and preset.name not in vitpad.PRESETS:
            raise ConfigError(f"engines.vllm.vit_pad: pads Qwen2.5-VL's vision MLPs "
                              f"({', '.join(vitpad.PRESETS)}); preset {preset.name} has another vision tower")
        for key, value in (("mm_processor_cache_gb", self.mm_processor_cache_gb),
                           ("engine_args.mm_processor_cache_gb", self.engine_args.get("mm_processor_cache_gb", 0))):
            if value:
                raise ConfigError(f"engines.vllm.{key}: got {value}, expected 0: vLLM's processor cache holds only "
                                  f"for requests prepared one at a time, each sent; batchocr prepares them in "
                                  f"threads, and every page image is new")
        if self.repetition_max_period > self.repetition_span // 2:
            raise ConfigError(f"engines.vllm.repetition_max_period: got {self.repetition_max_period}, expected at most "
                              f"repetition_span / 2 ({self.repetition_span // 2}): a loop is a block repeated at "
                              f"least twice in the last repetition_span tokens")
        if self.instances > 1 and self.tensor_parallel_size > 1:
            raise ConfigError(f"engines.vllm.instances: {self.instances} engines share one GPU; with "
                              f"tensor_parallel_size {self.tensor_parallel_size} use instances: 1")
        if self.mode == "document" and self.group_pages == 1:  # fits, but a group of one page is page mode
            raise ConfigError("engines.vllm.group_pages: got 1, expected 0 (as many as fit) or 2 or more in document "
                              "mode: a group of one page is read in page mode (use mode: page)")
        if self.mode == "document" and self.group_size(preset) < 2:
            raise ConfigError(f"engines.vllm.group_pages: a group of 2 pages does not fit "
                              f"max_model_len {self.max_model_len or preset.max_model_len} with group_page_tokens "
                              f"{self.group_page_tokens} a page: lower group_page_tokens or use mode: page")

    def check_chosen(self) -> None:
        """What only the run's own engine needs (engines.options): a model. A job spec whose
        engine is another may keep a vllm section without one (only the chosen engine's section
        is used, and routing never runs vllm: routed pages go to the textlayer engine)."""
        if not self.model:
            raise ConfigError("engine vllm needs a model: --model PATH (or engines.vllm.model in the job spec)")

    def group_size(self, preset: Preset) -> int:
        """Pages a request holds: 1 in page mode; in document mode as many as fit the context,
        each page costing its image's prompt tokens plus group_page_tokens of output."""
        if self.mode == "page":
            return 1
        context = (self.max_model_len or preset.max_model_len) - DOCUMENT_PROMPT_TOKENS
        fit = context // (preset.document_page_tokens + self.group_page_tokens)
        return min(self.group_pages or MAX_GROUP_PAGES, fit, MAX_GROUP_PAGES)

    def encoder_batched(self, preset: Preset) -> bool:
        """batch_encoder as the engine uses it: where unset, the preset's."""
        return preset.batch_encoder if self.batch_encoder is None else self.batch_encoder

    def mlps_padded(self, preset: Preset) -> bool:
        """vit_pad as the engine uses it: where unset, the preset's."""
        return preset.vit_pad if self.vit_pad is None else self.vit_pad

    def _tiles_by_default(self, preset: Preset) -> bool:
        """rswa_tiles unset, and the preset's on (both modes: measured in each, docs/GPU.md)."""
        return self.rswa_tiles is None and preset.rswa_tiles

    def tiles_on(self, preset: Preset) -> bool:
        """rswa_tiles as the engine uses it: where unset, the preset's (on the H200 at equal work:
        page mode 1.12x, seventh lease; document mode 1.12x, tenth lease), and only with the
        kernel the rewrite knows (vLLM 0.26.0's): a default must not stop a run on another
        vLLM, which then attends with its own kernel."""
        if self.rswa_tiles is not None:
            return self.rswa_tiles
        if not self._tiles_by_default(preset):
            return False
        try:
            rswa_tiles.check_source()
        except ValueError:
            return False
        return True

    def admit_size(self, preset: Preset) -> int:
        """admit_pages as the engine uses it: where unset, the preset's in page mode (measured
        there), at most an eighth of max_num_seqs (a small batch is not held back to refill in
        lumps); never more than max_num_seqs (more could never be free at once)."""
        if self.admit_pages is not None:
            return min(self.admit_pages, self.max_num_seqs)
        if self.mode != "page" or not preset.admit_pages:
            return 0
        return max(1, min(preset.admit_pages, self.max_num_seqs // 8))

    def set_runner_env(self) -> None:
        """Before vLLM is built in this process (its engine-core process inherits it): the
        environment these options need. ngram_bans: sampler asks for vLLM's V2 runner;
        ConfigError naming the key where the environment says no."""
        if self.ngram_bans == "sampler":
            try:
                ngram_sampler.require_v2_runner()
            except ValueError as exc:
                raise ConfigError(f"engines.vllm.ngram_bans: sampler: {exc}") from None

    def check_patches(self) -> None:
        """Before vLLM is built: the vLLM here has what the asked patches rewrite (ConfigError
        naming the key where not); a preset's default that this vLLM cannot take is a warning."""
        asked = self.rswa_tiles is True
        if asked or self._tiles_by_default(get_preset(self.preset)):
            try:
                rswa_tiles.check_source()
            except ValueError as exc:
                if asked:
                    raise ConfigError(f"engines.vllm.rswa_tiles: {exc}; set it false for this vLLM") from None
                log.warning("engines.vllm.rswa_tiles: the preset's default is off for this vLLM (%s): "
                            "vLLM's own attention kernel runs, the same output, slower", exc)

    def llm_args(self, preset: Preset) -> dict[str, Any]:
        args = {
            "model": self.model,
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "max_num_seqs": self.max_num_seqs,
            "gpu_memory_utilization": round(self.gpu_memory_utilization / self.instances, 4),
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
            # a running page's tokens reach batchocr CHECK_EVERY at a time, not every step: the
            # repetition check looks no more often, and the front end makes ~1/32 of the outputs
            # (the same rows; against vLLM's 1 on the 2B's layout +7.9% then -3.3% pages/s end to
            # end at equal work in two H200 leases, within the spread between identical engines:
            # docs/GPU.md, twentieth lease). engine_args.stream_interval 1 gives vLLM's own.
            "stream_interval": CHECK_EVERY,
        }
        if self.kv_cache_gib is not None:
            args["kv_cache_memory_bytes"] = int(self.kv_cache_gib / self.instances * 2**30)
        if self.mode == "document":  # a group's images in one prompt
            limit = args["limit_mm_per_prompt"]
            args["limit_mm_per_prompt"] = limit | {"image": max(limit.get("image", 1), self.group_size(preset))}
        args |= dict(preset.engine_args)
        sampler = self.ngram_bans == "sampler" and ngram.FQCN in (args.get("logits_processors") or ())
        if sampler:
            rest = [p for p in args.pop("logits_processors") if p != ngram.FQCN]
            if rest:
                args["logits_processors"] = rest
        # one worker extension installs what is asked
        if self.tiles_on(preset):
            args["worker_extension_cls"] = rswa_tiles.extension(self.encoder_batched(preset), sampler)
        elif self.mlps_padded(preset):  # Qwen2.5-VL's presets: no n-gram bans, no other extension
            args["worker_extension_cls"] = vitpad.EXTENSION
        elif self.encoder_batched(preset):
            args["worker_extension_cls"] = deepencoder.WITH_SAMPLER if sampler else deepencoder.EXTENSION
        elif sampler:
            args["worker_extension_cls"] = ngram_sampler.EXTENSION
        return workerext.keyed(_merged(args, self.engine_args))


def _merged(args: dict[str, Any], engine_args: Mapping[str, Any]) -> dict[str, Any]:
    """The user's engine_args over the engine's and preset's: a key replaces, except
    `compilation_config`, whose keys are laid over the preset's where both are mappings (so that
    `{cudagraph_capture_sizes: [...]}` keeps the preset's `compile_mm_encoder`, and
    `{compile_mm_encoder: false}` turns it off)."""
    out = args | dict(engine_args)
    mine, theirs = engine_args.get("compilation_config"), args.get("compilation_config")
    if isinstance(mine, Mapping) and isinstance(theirs, Mapping):
        out["compilation_config"] = dict(theirs) | dict(mine)
    return out


@dataclass
class _Page:
    doc_id: str
    page_index: int
    width: int
    height: int
    image: bytes


@dataclass
class _Group:
    """The pages of a document request whose output could not be given back a part a
    page: each is read again alone (mode `fallback`), and the group's rows leave
    together once the last is done, so that a group is committed whole."""

    pages: int
    rows: list[dict] = field(default_factory=list)


@dataclass
class _Request:
    """One request to vLLM: one page (page mode, or a page read again after its group
    failed), or several consecutive pages of one document (document mode)."""

    pages: list[_Page]
    document: bool = False
    attempt: int = 1
    group: _Group | None = None  # the failed group this page is read again for
    spent: int = 0  # tokens generated for these pages before this request: earlier attempts, its group's share
    started: float = 0.0
    prompt_tokens: int | None = None
    tokens: list[int] = field(default_factory=list)
    text: list[str] = field(default_factory=list)

    @property
    def mode(self) -> str:
        return "document" if self.document else ("fallback" if self.group is not None else "page")


def _refusals(engines: int = 1) -> systemic.Held:
    """Requests vLLM refused before it took any, held back (VLLMEngine._refused): one for a
    run's engine, or shared by its instances, whose threads reach it under its lock."""
    return systemic.Held("engine vllm refused every request alike ({n} pages, none taken)", engines)


class VLLMEngine(Engine):
    name = "vllm"

    def __init__(self, options: VLLMOptions, llm: Any | None = None, *, warm_up: bool = True):
        """`llm` is a vllm.LLM already built (tests pass a stand-in; with instances N, a list of
        N); else one is built, or N, one after the other (each sizes its KV from what is left).
        warm_up: start the renderer's warm-up now (an instance's waits until all are built)."""
        self.options = options
        self.preset = get_preset(options.preset)
        self.needs = Needs(image=True)
        self.model = options.model
        self.group_pages = options.group_size(self.preset)
        self.admit_pages = options.admit_size(self.preset)
        self.instances: list[VLLMEngine] = []
        if options.instances > 1:
            llms = list(llm) if llm is not None else [None] * options.instances
            if len(llms) != options.instances:
                raise ValueError(f"instances {options.instances}: {len(llms)} engines given")
            one = dataclasses.replace(options, instances=1,
                                      gpu_memory_utilization=options.gpu_memory_utilization / options.instances,
                                      kv_cache_gib=options.kv_cache_gib and options.kv_cache_gib / options.instances)
            try:
                for each in llms:
                    self.instances.append(type(self)(one, llm=each, warm_up=False))
            except BaseException:
                self.close()
                raise
            # vLLM forks each engine core from this process: no warm-up thread may be running
            # torch or the image processor while it does (a processor run before the build hung
            # the engine core on the H200: docs/GPU.md, fifteenth lease). And one after the
            # other: first calls made at once each paid the set-up (18.8 s against 4.8 alone).
            before = None
            shared = _refusals(len(self.instances))  # what is systemic is judged over all of them
            for each in self.instances:
                each._refusals = shared
                before = each.start_warm_up(after=before)
            return
        try:
            from vllm import SamplingParams
            from vllm.sampling_params import RequestOutputKind
        except ImportError as exc:
            raise ConfigError(f"--engine vllm needs vLLM, which is not installed ({exc}): {INSTALL_HINT}") from None
        self._SamplingParams = SamplingParams
        self._delta = RequestOutputKind.DELTA
        options.set_runner_env()
        options.check_patches()
        if 0 < options.queue_pages < options.max_num_seqs:  # allowed (host memory), but it starves the batch
            log.warning("engines.vllm.queue_pages %d is below max_num_seqs %d: at most %d requests run at once "
                        "(on an H200, 64 of 256 made 0.74x the pages/s; docs/GPU.md, twelfth lease)",
                        options.queue_pages, options.max_num_seqs, options.queue_pages)
        if llm is None:
            from vllm import LLM

            if options.model.startswith(("/", "./", "../")) and not os.path.isdir(options.model):
                # A wrong path is the user's to fix: exit 2 fails the Kubernetes Job at once.
                raise ConfigError(f"engine vllm: model folder {options.model} does not exist")
            _check_engine_args(LLM, options.engine_args)
            llm = _build(LLM, options.llm_args(self.preset))
        self.llm = llm
        self.engine = llm.llm_engine
        _check_can_generate(self.engine, options.model)
        self._watching = threading.Event()
        _watch_engine_core(self.engine, self._watching)
        self.prompt = self.preset.prompt(options.prompt)
        self.check = RepetitionCheck(options.repetition_span, options.repetition_max_period)
        self._ids = itertools.count()
        self._pool = ThreadPoolExecutor(options.prepare_threads, thread_name_prefix="batchocr-prepare")
        self._warm_up_s: float | None = None
        self._warmed: Future | None = None
        if warm_up:
            self.start_warm_up()
        self._refusals = _refusals()  # one for all of a run's instances (set by the composite)
        self._first_request_at: float | None = None  # time.monotonic() of this run's first request vLLM took
        # Document mode: groups sent, given back a part a page, read again page by page (and why).
        self.groups = {"sent": 0, "split": 0, "fallback": 0} | {f"fallback_{r}": 0 for r in FALLBACK_REASONS}

    def _over_instances(self, attr: str, pick: Callable[[list[float]], float]) -> float | None:
        """An engine's `attr`, or with several instances `pick` of theirs; None where none is set."""
        values = [getattr(e, attr) for e in self.instances or [self]]
        values = [v for v in values if v is not None]
        return pick(values) if values else None

    @property
    def first_request_at(self) -> float | None:
        """When vLLM took the run's first request (time.monotonic), the earliest of the instances'
        with several: between the first rendered pages and this, the requests' preparation (the
        image processor's first calls); after it, the GPU's prefill and decode."""
        return self._over_instances("_first_request_at", min)

    @property
    def renderer_warm_up_s(self) -> float | None:
        """How long the renderer's first call (the warm-up) took, the longest of the instances'
        with several; None until it has run."""
        return self._over_instances("_warm_up_s", max)

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
        """Requests kept in flight (preparing, or inside vLLM): a page each, or in document mode
        a group of up to group_pages pages each, so that a group mode fills max_num_seqs too (on
        the H200, a cap in pages held document mode at 44 groups of 8 running of 256)."""
        if self.instances:
            return sum(each.queue_pages for each in self.instances)
        n = self.options.max_num_seqs
        return self.options.queue_pages or n + n // 4 + 32

    def sampling(self, request: _Request) -> Any:
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

    def start_warm_up(self, after: Future | None = None) -> Future:
        """vLLM's renderer pays a one-time cost on its first call in a process, and four prepare
        threads making their first calls at once paid it four times over (on the H200's host,
        Qwen2-VL: 18.8 s each, against 4.8 s for one call alone, then 0.1 s a call; docs/GPU.md,
        fifteenth lease). So one prepare thread pays it now, on a blank page, while the first
        pages render, and every page's preparation waits for that. Once; after `after` (another
        instance's warm-up) where given. Returns the warm-up's future."""
        if self._warmed is None:
            self._warmed = self._pool.submit(self._warm_up, after)
        return self._warmed

    def _warm_up(self, after: Future | None = None) -> None:
        """vLLM's renderer's first call, alone, on a blank page of the preset's size (portrait,
        as scans are); never raises: where it fails, the pages' own calls say why."""
        from PIL import Image

        if after is not None:
            wait((after,))
        side, multiple = self.preset.max_side, self.preset.size_multiple
        width = max(multiple, int(side * 0.7) // multiple * multiple)
        started = time.monotonic()
        try:
            blank = Image.new("RGB", (width, side), "white")
            self.engine.renderer.render_cmpl([{"prompt": self.prompt, "multi_modal_data": {"image": blank}}])
        except Exception as exc:  # noqa: BLE001
            log.debug("the renderer's warm-up failed (the pages' calls will say why): %s: %s",
                      type(exc).__name__, exc)
        self._warm_up_s = round(time.monotonic() - started, 3)

    def _prepare(self, request: _Request) -> Any:
        """Off the engine loop: the model's image processor and tokenizer, via vLLM's
        renderer (thread-safe with the processor cache off, as in vLLM's server); after
        the warm-up's first call."""
        from PIL import Image

        if self._warmed is not None:
            wait((self._warmed,))  # done, or cancelled by close(): the page is prepared either way
        images = [Image.frombuffer("RGB", (p.width, p.height), p.image, "raw", "RGB", 0, 1) for p in request.pages]
        if request.document:
            prompt = {"prompt": self.preset.document_prompt(len(images)), "multi_modal_data": {"image": images}}
            if self.preset.document_mm_processor_kwargs:
                prompt["mm_processor_kwargs"] = dict(self.preset.document_mm_processor_kwargs)
        else:
            prompt = {"prompt": self.prompt, "multi_modal_data": {"image": images[0]}}
        (engine_input,) = self.engine.renderer.render_cmpl([prompt])
        return engine_input

    def run(self, pages: Iterator[pa.RecordBatch], stop: threading.Event | None = None) -> Iterator[pa.RecordBatch]:
        """Page mode: each page of each batch is a request. Document mode (group_pages > 1):
        each batch is one group, consecutive pages of one document (the pipeline groups
        them), sent as one request when it holds more than one page. With several instances,
        each batch goes to the one that asks for more first."""
        stop = stop or threading.Event()
        if self.instances:
            yield from _shared(self.instances, pages, stop)
            return
        preparing: deque[tuple[_Request, Future]] = deque()
        running: dict[str, _Request] = {}
        exhausted = False
        held = lambda: len(preparing) + len(running)  # noqa: E731 - requests: a page, or a group of pages
        try:
            while True:
                if stop.is_set():
                    return
                # 1. Keep the queue full: pull rendered pages, start preparing them; but not while
                #    vLLM could take a prepared request (at the start, filling the whole queue first
                #    held the GPU idle for the time it takes to render and prepare it).
                while not exhausted and held() < self.queue_pages:
                    batch = next(pages, None)
                    if batch is None:
                        exhausted = True
                        break
                    group = [_Page(**row) for row in
                             batch.select(["doc_id", "page_index", "width", "height", "image"]).to_pylist()]
                    if self.group_pages > 1 and len(group) > 1:
                        self._start(_Request(group, document=True), preparing)
                    else:
                        for page in group:
                            self._start(_Request([page]), preparing)
                    if self._admit(preparing, running, exhausted):
                        break
                # 2. Hand prepared requests to vLLM, oldest first, as many as admit() says.
                rows = []
                for _ in range(self._admit(preparing, running, exhausted)):
                    request, future = preparing.popleft()
                    rows.extend(self._submit(request, future, running, preparing))
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

    def _start(self, request: _Request, preparing: deque) -> None:
        preparing.append((request, self._pool.submit(self._prepare, request)))

    def _submit(self, request: _Request, future: Future, running: dict[str, _Request], preparing: deque) -> list[dict]:
        request_id = f"p{next(self._ids)}"
        try:
            engine_input = future.result()
            if request.document:
                ids = engine_input.get("prompt_token_ids") if isinstance(engine_input, Mapping) else None
                request.prompt_tokens = len(ids) if ids is not None else None
            request.started = time.perf_counter()
            self.engine.add_request(request_id, engine_input, self.sampling(request))
            if self._first_request_at is None:
                self._first_request_at = time.monotonic()
        except Exception as exc:  # noqa: BLE001 - a rejected request is that page's error row ...
            if _engine_dead(self.engine):  # ... but not a dead engine's refusal: that is the run's
                raise _engine_failure(self.engine, exc) from exc
            if request.document:  # a group refused (too long, say): its pages are read alone
                self.groups["sent"] += 1
                return self._fall_back(request, "rejected", preparing)
            page = request.pages[0]
            row = self._error(request, page, "rejected",
                              f"page {page.page_index}: vLLM rejected the request: {type(exc).__name__}: {exc}")
            return self._refused(self._grouped(request, row), exc)  # a fallback's rows leave with its group's
        if request.document:
            self.groups["sent"] += 1
        running[request_id] = request
        return self._refusals.taken()  # refused before one was taken: per-page after all

    def _refused(self, rows: list[dict], exc: Exception) -> list[dict]:
        """... unless it is a property of the engine: until vLLM has taken a request (on any
        of the run's instances), refusals are held back; systemic.LIMIT alike in a row stop
        the run with one line, and no row claims a per-page error (batchocr/engines/systemic.py)."""
        return self._refusals.failed_on(rows, _named(exc))

    def _end_of_input(self) -> list[dict]:
        """Every page of a short shard refused alike, none taken: systemic too. With several
        instances, the last whose input ends judges what all of them hold."""
        return self._refusals.ended()

    def _collect(self, running: dict[str, _Request], preparing: deque) -> list[dict]:
        try:
            outputs = self.engine.step()
        except Exception as exc:  # the engine itself failed: systemic, stop the run
            raise _engine_failure(self.engine, exc) from exc
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
            # Checked every CHECK_EVERY tokens, not every step: on every step for
            # 256 running pages the check cost a third of the throughput (H200).
            crossed = len(request.tokens) // CHECK_EVERY != before // CHECK_EVERY
            if not out.finished and crossed and self.check.looping(request.tokens):
                self.engine.abort_request([out.request_id])
                del running[out.request_id]
                if request.document:
                    rows.extend(self._fall_back(request, "repetition", preparing))
                elif request.attempt < self.options.max_attempts:
                    self._start(_retry(request), preparing)
                else:
                    rows.extend(self._finished(request, "repetition", preparing))
            elif out.finished:
                del running[out.request_id]
                rows.extend(self._finished(request, completion.finish_reason, preparing))
        return rows

    def _finished(self, request: _Request, finish_reason: str | None, preparing: deque) -> list[dict]:
        if not request.document:
            return self._grouped(request, self._row(request, request.pages[0], finish_reason))
        raw = "".join(request.text) if self.options.detokenize else None
        parts = split_pages(raw, self.preset.document_separator, len(request.pages)) if raw is not None else None
        reason = "length" if finish_reason == "length" else ("split" if parts is None else None)
        if finish_reason not in ("stop", "length"):
            reason = "engine_error"
        if reason is None:
            self.groups["split"] += 1
            return [self._row(request, page, "stop", part, share)
                    for page, part, share in zip(request.pages, parts, _shares(len(request.tokens), parts))]
        return self._fall_back(request, reason, preparing, finish_reason)

    def _fall_back(self, request: _Request, reason: str, preparing: deque, finish_reason: str | None = None) -> list[dict]:
        """A group whose output is not a part a page (or that hit the token limit, looped,
        or was refused): never shift text onto the wrong page. Its pages are read again
        alone; with document_fallback off (benchmarks on random weights), each gets an
        error row instead, the group's tokens shared between them."""
        self.groups["fallback"] += 1
        self.groups[f"fallback_{reason}"] += 1
        n = len(request.pages)
        if self.options.document_fallback:
            group = _Group(n)
            for page, share in zip(request.pages, _shares(len(request.tokens), [""] * n)):
                self._start(_Request([page], group=group, spent=share), preparing)
            return []
        why = {"split": f"its output did not split into {n} parts on {self.preset.document_separator!r}",
               "length": "its output hit the token limit", "repetition": "its output kept repeating itself",
               "rejected": "vLLM rejected the request",
               "engine_error": f"vLLM finished the request with {finish_reason!r}"}[reason]
        shares = _shares(len(request.tokens), [""] * n)
        return [self._error(request, page, "document_split",
                            f"page {page.page_index}: read in a group of {n} pages, and {why} "
                            f"(document_fallback is off)", output_tokens=share)
                for page, share in zip(request.pages, shares)]

    def _grouped(self, request: _Request, row: dict) -> list[dict]:
        """A page read again for a failed group: its row waits for the group's last."""
        group = request.group
        if group is None:
            return [row]
        group.rows.append(row)
        return group.rows if len(group.rows) == group.pages else []

    def _row(self, request: _Request, page: _Page, finish_reason: str | None, raw: str | None = None,
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

    def _error(self, request: _Request, page: _Page, error_type: str, message: str,
               output_tokens: int | None = None) -> dict:
        return self._common(request, page, output_tokens) | {
            "finish_reason": "error", "error_type": error_type, "error_message": message}

    def _common(self, request: _Request, page: _Page, output_tokens: int | None) -> dict:
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

        if self.instances:
            first = self.instances[0].describe()
            groups = {k: sum(each.groups[k] for each in self.instances) for k in first["groups"]}
            return first | {"instances": len(self.instances), "groups": groups, "queue_pages": self.queue_pages}
        return {"vllm": vllm.__version__, "preset": self.preset.name, "prompt": _prompt_setting(self.options, self.preset),
                "mode": self.options.mode, "group_pages": self.group_pages, "groups": self.groups,
                "document_fallback": self.options.document_fallback,
                "queue_pages": self.queue_pages, "admit_pages": self.admit_pages,
                "prepare_threads": self.options.prepare_threads,
                "max_attempts": self.options.max_attempts,
                "llm_args": self.options.llm_args(self.preset)}

    def close(self) -> None:
        """Shut vLLM down explicitly: a process that finished its LLM work was seen
        to hang at exit until killed."""
        if self.instances or not hasattr(self, "_pool"):  # several, or one that failed to build
            for each in self.instances:
                each.close()
            return
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._watching.set()  # our own shutdown is no death
        core = getattr(self.engine, "engine_core", None)
        if core is not None and hasattr(core, "shutdown"):
            core.shutdown()
        self.llm = self.engine = None
        gc.collect()


class _Feed:
    """One instance's page batches, handed over by the thread that reads the pipeline's
    (the pipeline's iterator writes rows of its own: it stays in one thread)."""

    def __init__(self, halt: threading.Event):
        self.slot: queue.Queue = queue.Queue(maxsize=1)  # a batch at most waits for the instance
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


def _shared(instances: list["VLLMEngine"], pages: Iterator[pa.RecordBatch],
            stop: threading.Event) -> Iterator[pa.RecordBatch]:
    """Several instances over one stream of pages: each runs its own loop in a thread of its own
    (vLLM's step blocks), taking the next batch when its queue has room, and what they finish
    comes back here, in this thread. A failure in one stops the others and is raised here."""
    halt = threading.Event()  # the others stop when one fails, or when the pipeline stops
    feeds = [_Feed(halt) for _ in instances]
    results: queue.Queue = queue.Queue()

    def work(engine: "VLLMEngine", feed: _Feed) -> None:
        try:
            for out in engine.run(feed, halt):
                results.put(("rows", out))
        except BaseException as exc:  # noqa: BLE001 - raised again in the pipeline's thread
            results.put(("error", exc))
        else:
            results.put(("end", None))

    threads = [threading.Thread(target=work, args=(e, f), name=f"batchocr-vllm-{i}", daemon=True)
               for i, (e, f) in enumerate(zip(instances, feeds))]
    for t in threads:
        t.start()
    batch, exhausted, ended, turn = None, False, 0, 0
    try:
        while ended < len(instances):
            if stop.is_set():
                return
            if not exhausted and batch is None:
                batch = next(pages, None)
                if batch is None:
                    exhausted = True
                    for feed in feeds:
                        feed.ended.set()
            if batch is not None:  # to the next instance with room, in turn
                free = next((i % len(feeds) for i in range(turn, turn + len(feeds))
                             if feeds[i % len(feeds)].slot.empty()), None)
                if free is not None:
                    feeds[free].slot.put(batch)
                    batch, turn = None, free + 1
            try:  # what is finished, waiting a little only where nothing else can move
                kind, value = results.get(timeout=0.05 if batch is not None or exhausted else 0)
            except queue.Empty:
                continue
            if kind == "error":
                raise value
            if kind == "end":
                ended += 1
            else:  # an instance's rows come before its "end": none is left after the last
                yield value
    finally:
        halt.set()
        for t in threads:
            t.join(timeout=30)


def split_pages(raw: str, separator: str, pages: int) -> list[str] | None:
    """A document request's output, a part a page, or None where it does not split into
    exactly `pages` parts: then no part is given to any page (text is never shifted onto
    the wrong row). A separator before the first page (Unlimited-OCR's reference code
    expects one before every page: `outputs.split('<PAGE>')[1:]`) or after the last is no
    page; the separator is matched in any case."""
    parts = re.split(re.escape(separator), raw, flags=re.IGNORECASE)
    if len(parts) > pages and not parts[0].strip():
        parts = parts[1:]
    if len(parts) > pages and not parts[-1].strip():
        parts = parts[:-1]
    return [p.strip("\n") for p in parts] if len(parts) == pages else None


def _shares(total: int, parts: list[str]) -> list[int]:
    """A group's output tokens shared between its pages by their text's length (evenly
    where there is no text), summing to the group's: a page's `output_tokens` in document mode."""
    weights = [len(p) for p in parts]
    if not sum(weights):
        weights = [1] * len(parts)
    exact = [total * w / sum(weights) for w in weights]
    shares = [int(x) for x in exact]
    for i in sorted(range(len(parts)), key=lambda i: exact[i] - shares[i], reverse=True)[:total - sum(shares)]:
        shares[i] += 1
    return shares


class EngineCoreDied(RuntimeError):
    pass


def _watch_engine_core(engine: Any, stopped: threading.Event) -> None:
    """vLLM 0.26's sync client never wakes a step() waiting on its output queue when the
    engine-core process dies (killed, out of memory): its monitor thread sets
    `resources.engine_dead` and stops the output thread without a word
    (v1/engine/core_client.py: monitor_engine_cores, BackgroundResources.__call__), so
    step() would wait for good and the run hang. This thread watches the same flag and puts
    an error into that queue: step() raises, and the run stops with one line, exit 1."""
    core = getattr(engine, "engine_core", None)
    resources, outputs = getattr(core, "resources", None), getattr(core, "outputs_queue", None)
    if resources is None or outputs is None or not hasattr(resources, "engine_dead"):
        return  # another client (in-process core): nothing to wake

    def watch() -> None:
        while not stopped.wait(WATCH_S):
            if resources.engine_dead:
                if not stopped.is_set():
                    outputs.put_nowait(EngineCoreDied("vLLM's engine-core process died"))
                return

    threading.Thread(target=watch, name="batchocr-engine-watch", daemon=True).start()


def _engine_failure(engine: Any, exc: Exception) -> BatchocrError:
    """The run's one line. A dead engine-core process says so: vLLM's own EngineDeadError
    ("EngineCore encountered an issue. See stack trace (above)") points at a trace that a
    killed process never wrote (the H200, 2026-12-01: docs/GPU.md)."""
    if _engine_dead(engine):
        return BatchocrError(f"the vLLM engine failed: its engine-core process died (killed, or out of memory: "
                             f"the node's kernel log or the pod's events say which) [{type(exc).__name__}]")
    return BatchocrError(f"the vLLM engine failed: {type(exc).__name__}: {exc}")


def _engine_dead(engine: Any) -> bool:
    return bool(getattr(getattr(getattr(engine, "engine_core", None), "resources", None), "engine_dead", False))


def _check_engine_args(llm_cls: type, engine_args: Mapping[str, Any]) -> None:
    """engines.vllm.engine_args go to vllm.LLM as they are, and a key it does not take stopped
    the build with a TypeError's traceback, exit 1 (a Job retries that). Here, before the model
    loads: exit 2 and one line naming the key, with the nearest vLLM knows. Known: the LLM's
    own parameters and vllm.EngineArgs' fields (where its other keywords go)."""
    if not engine_args:
        return
    try:
        import vllm
        from vllm import EngineArgs
    except ImportError:  # a vLLM without it: its own build says what it refuses
        return
    import difflib
    import inspect

    known = {f.name for f in dataclasses.fields(EngineArgs)} | {
        name for name, p in inspect.signature(llm_cls.__init__).parameters.items()
        if name != "self" and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)}
    for key in engine_args:
        if key not in known:
            near = difflib.get_close_matches(str(key), sorted(known), n=1)
            raise ConfigError(f"engines.vllm.engine_args.{key}: not an argument of vllm.LLM in vLLM "
                              f"{getattr(vllm, '__version__', '?')}" + (f" (did you mean {near[0]}?)" if near else ""))


def _build(llm_cls: type, args: dict[str, Any]) -> Any:
    """vllm.LLM(**args), its failures in one line. vLLM refusing a value (its configs' checks:
    ValueError, pydantic's ValidationError, which is one, or TypeError) is the configuration's:
    exit 2, fail the Job. Its engine-core process failing to start (RuntimeError: no GPU memory
    left, a CUDA error) or a file it could not read (OSError: a model hub out of reach) is
    systemic: exit 1, a retry may help; vLLM's log above the line has the engine core's own
    traceback. Either way no traceback of batchocr's (at debug level, the full one)."""
    try:
        return llm_cls(**args)
    except (TypeError, ValueError) as exc:
        log.debug("vllm.LLM refused its arguments", exc_info=True)
        raise ConfigError(f"engine vllm: vLLM refused the engine's arguments: {_refusal(exc)} (engines.vllm's "
                          "options and engine_args go to vllm.LLM)") from None
    except (RuntimeError, OSError) as exc:
        log.debug("vllm.LLM failed to start", exc_info=True)
        raise BatchocrError(f"the vLLM engine failed to start: {_named(exc)} (vLLM's log above says why)") from None


def _refusal(exc: Exception) -> str:
    """Where and why vLLM refused: a pydantic ValidationError's first error (the field's path
    and the rule, never the value given: engine_args may hold a token), else the first line."""
    errors = getattr(exc, "errors", None)
    if callable(errors):
        try:
            first = errors()[0]
            where = ".".join(str(part) for part in first.get("loc", ())) or type(exc).__name__
            return f"{where}: {first.get('msg', '')}"[:300]
        except Exception:  # noqa: BLE001 - not pydantic's after all: its text below
            pass
    return _named(exc)


def _named(exc: BaseException) -> str:
    """An exception in one line: its type and the first line of its message, at most 300 characters."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {(lines[0] if lines else '')[:300]}"


def _check_can_generate(engine: Any, model: str) -> None:
    """At start, not as 512 error rows: a model vLLM loaded for pooling (an embedding
    model, or a folder whose config says so) cannot OCR."""
    tasks = tuple(engine.get_supported_tasks())
    if "generate" not in tasks:
        raise ConfigError(f"engine vllm: the model {model} cannot generate text (vLLM supports "
                          f"{', '.join(map(str, tasks)) or 'no task'} for it): an OCR model must be a generative "
                          "vision-language model")


def _retry(request: _Request) -> _Request:
    return _Request(request.pages, attempt=request.attempt + 1, group=request.group,
                    spent=request.spent + len(request.tokens))


def _render_hints(preset: Preset) -> dict[str, int]:
    return {"max_side": preset.max_side, "size_multiple": preset.size_multiple}


def settings(options: Mapping[str, Any]) -> dict[str, Any]:
    """What OUT remembers of this engine (model, preset, prompt, page size), from its
    options alone: vLLM is not imported, no model loaded (engines.settings)."""
    o = _chosen(options)
    preset = get_preset(o.preset)
    return {"model": o.model, "preset": preset.name, "prompt": _prompt_setting(o, preset),
            "render_hints": _render_hints(preset)}


def shared(options: Mapping[str, Any], n: int) -> dict[str, Any]:
    """One of n processes on the GPU (a shard's parts): gpu_memory_utilization / n of it,
    and kv_cache_gib / n where it is set."""
    o = parse_options(VLLMOptions, options, "vllm")
    out = {**options, "gpu_memory_utilization": round(o.gpu_memory_utilization / n, 4)}
    if o.kv_cache_gib is not None:
        out["kv_cache_gib"] = o.kv_cache_gib / n
    return out


def starts_alone(options: Mapping[str, Any]) -> bool:
    """Whether this engine must start while no other starts on its GPU: vLLM sizes the KV
    cache from the free memory it measures while it loads, and would count another engine's
    load as its own use, unless kv_cache_gib gives the KV's size. (engine_args go to vLLM as
    they are: a kv_cache_memory_bytes there is each part's, not shared, so the parts still
    take turns.)"""
    return parse_options(VLLMOptions, options, "vllm").kv_cache_gib is None


def _prompt_setting(o: VLLMOptions, preset: Preset) -> str:
    """What OUT remembers as the prompt: in document mode, the group's (OUT made in one
    mode refuses a rerun in the other without --reprocess: other prompts, other text). A
    document mode's page read alone (a document of one page, a failed group's pages) is asked
    the page prompt: where `prompt` makes it another than the preset's, OUT remembers it too."""
    if o.mode == "document":
        alone = preset.prompt(o.prompt)
        return (f"{preset.document_prompt(1)} (document mode: one {preset.image_placeholder} a page"
                + (f"; a page alone: {alone}" if alone != preset.prompt() else "") + ")")
    return preset.prompt(o.prompt)


def _chosen(options: Mapping[str, Any]) -> VLLMOptions:
    """The options of a run whose engine this is."""
    o = parse_options(VLLMOptions, options, "vllm")
    o.check_chosen()
    return o


def create(options: Mapping[str, Any]) -> VLLMEngine:
    return VLLMEngine(_chosen(options))


ENGINE = EngineType(name="vllm", options=VLLMOptions, create=create, settings=settings, shared=shared,
                    starts_alone=starts_alone, slow_to_build=True)

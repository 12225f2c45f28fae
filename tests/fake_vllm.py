"""A stand-in for vLLM at its API boundary only (what batchocr calls): `vllm.SamplingParams`,
`vllm.sampling_params.RequestOutputKind`, `vllm.EngineArgs` (a dataclass of some of its real
fields: batchocr checks engine_args' keys against it), and an `LLM` whose `llm_engine` has
`renderer.render_cmpl`, `add_request`, `step`, `abort_request`, `engine_core.shutdown`,
`get_supported_tasks`; and, installed as vllm, the two steps of vLLM's build that
batchocr.engines.vllm.patches.startup wraps, called as vLLM calls them
(`vllm.v1.engine.llm_engine.renderer_from_config`, `vllm.v1.engine.utils.wait_for_engine_startup`).

It behaves like an engine with continuous batching: up to max_num_seqs requests
decode one token a step; a page's answer length depends on its index (without
ignore_eos: with it, every request runs to max_tokens, as in vLLM); pages whose
image is dark loop ("7 8 9 7 8 9 ...") at low temperature; prompts longer than
max_model_len are rejected at add_request, as vLLM does. With `FakeEngine.answer`
set, every request answers that text instead, a few characters a token (a model
whose answer is parsed: grounding tags), cut where max_tokens cuts it.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import os
import sys
import threading
import time
import types
from dataclasses import dataclass, field
from pathlib import Path


class RequestOutputKind(enum.Enum):
    CUMULATIVE = 0
    DELTA = 1
    FINAL_ONLY = 2


class ImageTransform:
    """vllm.transformers_utils.processors.deepseek_ocr's, as far as batchocr's pixels patch
    reaches it (this stand-in's LLM processes no images)."""

    def __call__(self, image):
        raise NotImplementedError("the stand-in processes no images")


class DeepseekOCRProcessor:
    def tokenize_with_images(self, *args, **kwargs):
        raise NotImplementedError("the stand-in processes no images")


@dataclass
class SamplingParams:
    temperature: float = 1.0
    max_tokens: int = 16
    ignore_eos: bool = False
    detokenize: bool = True
    seed: int | None = None
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE
    skip_special_tokens: bool = True
    extra_args: dict | None = None


@dataclass
class Completion:
    token_ids: list[int]
    text: str
    finish_reason: str | None


@dataclass
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    outputs: list[Completion]
    finished: bool


@dataclass
class _Request:
    params: SamplingParams
    prompt_len: int
    loops: bool
    length: int
    pieces: list[str] = field(default_factory=list)  # the answer's text, token by token
    emitted: list[int] = field(default_factory=list)
    sent: int = 0  # tokens handed to the client so far (stream_interval holds the rest back)
    text: list[str] = field(default_factory=list)  # each emitted token's text


class _Renderer:
    def __init__(self):
        self.kwargs = []  # each request's own mm_processor_kwargs

    def render_cmpl(self, prompts):
        (p,) = prompts
        images = p["multi_modal_data"]["image"]
        many = isinstance(images, list)
        pages = []
        for image in images if many else [images]:
            w, h = image.size
            r, g, _ = image.getpixel((w // 2, h // 2))[:3]
            pages.append({"size": (w, h), "dark": r < 60, "red": r > 200 and g < 80})
        # a page alone: a Qwen-like patch grid; several: Unlimited-OCR's base view, 273 tokens a page
        prompt_len = (273 * len(pages) if many else sum((w // 28) * (h // 28) for w, h in (q["size"] for q in pages))) + 20
        self.kwargs.append(p.get("mm_processor_kwargs"))
        return [{"type": "multimodal", "prompt": p["prompt"], "size": pages[0]["size"], "dark": pages[0]["dark"],
                 "pages": pages if many else None, "prompt_token_ids": list(range(prompt_len))}]


class _Resources:
    engine_dead = False


class _Core:
    """vLLM's sync engine-core client, as far as its death goes: with
    BATCHOCR_FAKE_CORE_PROCESS set, the engine core is a real child process (a sleep, its pid
    a line of that file), watched as vLLM's MPClientEngineMonitor watches its engine cores.
    When it dies, the monitor sets resources.engine_dead and shuts the output thread down without a word,
    as vLLM 0.26 does (v1/engine/core_client.py: monitor_engine_cores, BackgroundResources),
    so that a step() then waits on outputs_queue for good, as vLLM's get_output() does."""

    def __init__(self):
        import os
        import queue
        import subprocess
        import threading

        self.shut = False
        self.resources = _Resources()
        self.outputs_queue = queue.Queue()
        self.process = None
        if os.environ.get("BATCHOCR_FAKE_CORE_PROCESS"):
            self.process = subprocess.Popen(["sleep", "3600"])
            with open(os.environ["BATCHOCR_FAKE_CORE_PROCESS"], "a") as f:  # a line an engine core
                f.write(f"{self.process.pid}\n")

            def monitor():
                self.process.wait()
                self.resources.engine_dead = True

            threading.Thread(target=monitor, daemon=True).start()

    def get_output(self):
        """What vLLM's step() waits on once its engine core is gone."""
        out = self.outputs_queue.get()
        if isinstance(out, Exception):
            raise out
        return out

    def shutdown(self):
        """The engine's GPU memory given back, where vLLM's engine core exits (its time to
        BATCHOCR_FAKE_BUILDS, beside the builds: a build that another engine's release overlaps
        would fail its memory profile in vLLM)."""
        import json
        import os
        import time

        if not self.shut and os.environ.get("BATCHOCR_FAKE_BUILDS"):
            with open(os.environ["BATCHOCR_FAKE_BUILDS"], "a") as f:
                f.write(json.dumps({"pid": os.getpid(), "released": time.time()}) + "\n")
        self.shut = True
        self.resources.engine_dead = True
        if self.process is not None and self.process.poll() is None:
            self.process.kill()


def renderer_from_config(config) -> _Renderer:
    """vllm.v1.engine.llm_engine's (the engine's renderer, made first in its build)."""
    return _Renderer()


def wait_for_engine_startup(load_s: float = 0.0) -> None:
    """vllm.v1.engine.utils' (this process waiting for the engine core's handshake: its load)."""
    time.sleep(load_s)


class FakeEngine:
    def __init__(self, max_num_seqs: int, max_model_len: int, stream_interval: int = 1, renderer=None):
        self.max_num_seqs = max_num_seqs
        self.stream_interval = stream_interval
        self.max_model_len = max_model_len
        self.renderer = renderer or _Renderer()
        self.engine_core = _Core()
        self.requests: dict[str, _Request] = {}
        self.order: list[str] = []
        self.aborted: list[str] = []
        self.added = 0
        self.documents = 0  # requests of several images
        self.peak_waiting = 0
        self.tokens = 0  # tokens handed out, every request's, aborted ones too
        self.outputs = 0  # RequestOutputs made (stream_interval makes fewer)

    # What the model was loaded for (a pooling model: ("embed",)), and an error that
    # add_request raises for every request (an engine that refuses them all).
    tasks: tuple[str, ...] = ("generate",)
    refuse: Exception | None = None
    refusals = 0  # requests it refused so
    answer: str | None = None
    ANSWER_CHARS = 7  # characters of `answer` a token

    def get_supported_tasks(self):
        return self.tasks

    def add_request(self, request_id, engine_input, params):
        if self.refuse is not None:
            self.refusals += 1
            raise self.refuse
        prompt_len = len(engine_input["prompt_token_ids"])
        if prompt_len > self.max_model_len:
            raise ValueError(f"The decoder prompt (length {prompt_len}) is longer than the maximum model "
                             f"length of {self.max_model_len}")
        pages = engine_input["pages"]
        if pages is None:  # one page: the fixed answer, or words
            w, h = engine_input["size"]
            pieces = ([self.answer[i:i + self.ANSWER_CHARS] for i in range(0, len(self.answer), self.ANSWER_CHARS)]
                      if self.answer is not None else [])
            length, loops = len(pieces) or 3 + (w * 7 + h) % 11, engine_input["dark"]
        else:  # a document: each page's words, `<page>` between pages (none before a red page)
            pieces = []
            for i, q in enumerate(pages):
                if i and not q["red"]:
                    pieces.append("<page>")
                w, h = q["size"]
                pieces += [f"w{100 + len(pieces)} " for _ in range(3 + (w * 7 + h) % 11)]
            length, loops = len(pieces), any(q["dark"] for q in pages)
        self.requests[request_id] = _Request(params, prompt_len, loops, length, pieces)
        self.order.append(request_id)
        self.added += 1
        self.documents += pages is not None
        self.peak_waiting = max(self.peak_waiting, len(self.order) - self.max_num_seqs)

    def abort_request(self, ids):
        for rid in ids:
            self.aborted.append(rid)
            self.requests.pop(rid, None)
            if rid in self.order:
                self.order.remove(rid)

    def step(self):
        if os.environ.get("BATCHOCR_FAKE_STEP_S"):  # a real engine's pace (a process of its own: no monkeypatch)
            time.sleep(float(os.environ["BATCHOCR_FAKE_STEP_S"]))
        if self.engine_core.resources.engine_dead:
            self.engine_core.get_output()  # blocks, as vLLM's does, unless something wakes it
        outs = []
        for rid in list(self.order[: self.max_num_seqs]):
            req = self.requests[rid]
            n = len(req.emitted)
            token = (7 + n % 3) if req.loops and req.params.temperature < 0.15 else 100 + n
            req.emitted.append(token)
            self.tokens += 1
            # ignore_eos: no end of answer, as in vLLM: the request runs to max_tokens
            done = (not req.params.ignore_eos and (not req.loops or req.params.temperature >= 0.15)
                    and n + 1 >= req.length)
            reason = "stop" if done else None
            if not done and n + 1 >= req.params.max_tokens:
                done, reason = True, "length"
            req.text.append(req.pieces[n] if n < len(req.pieces) and not (req.loops and req.params.temperature < 0.15)
                            else f"w{token} ")
            # as vLLM's output processor (v1/engine/output_processor.py:289-310): a running request's
            # tokens go out on its first token, then once stream_interval of them are waiting
            if done or req.sent == 0 or len(req.emitted) - req.sent >= self.stream_interval:
                new = slice(req.sent, None)
                req.sent = len(req.emitted)
                outs.append(RequestOutput(rid, list(range(req.prompt_len)),
                                          [Completion(req.emitted[new], "".join(req.text[new]), reason)], done))
                self.outputs += 1
            if done:
                self.order.remove(rid)
                del self.requests[rid]
        return outs


def _compile(log: str, kwargs: dict) -> None:
    """As vLLM's first build: its compiled graph in VLLM_CACHE_ROOT (by default $XDG_CACHE_HOME/vllm),
    keyed by the engine's settings, and a Triton kernel in TRITON_CACHE_DIR; read where there
    already, written where not. As on the GPU (docs/history/GPU.md, the thirty-first lease), a graph
    read at the path it was compiled at starts fast; one copied to another path loads, but starts as
    slowly as after a cold compile: the log says which ("same_path"), and where the caches were."""
    root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    vllm_root = Path(os.environ.get("VLLM_CACHE_ROOT") or root / "vllm")
    # vLLM 0.26 hashes its environment's settings into the key (envs.compile_factors), among them
    # VLLM_XLA_CACHE_PATH, whose default is under XDG_CACHE_HOME: another root, another key.
    xla = os.environ.get("VLLM_XLA_CACHE_PATH") or str(root / "vllm" / "xla_cache")
    key = f"{kwargs.get('max_num_seqs')}-{kwargs.get('max_model_len')}-{kwargs.get('model')}-{hashlib.sha256(xla.encode()).hexdigest()[:10]}"
    graph = vllm_root / "torch_compile_cache" / key / "rank_0_0" / "computation_graph.py"
    hit = graph.is_file()
    compiled_at = f"# compiled at {graph}\n"
    same_path = hit and graph.read_text() == compiled_at
    if not hit:
        graph.parent.mkdir(parents=True, exist_ok=True)
        graph.write_text(compiled_at)
        kernel = Path(os.environ.get("TRITON_CACHE_DIR") or Path.home() / ".triton" / "cache") / "k0" / "kernel.cubin"
        kernel.parent.mkdir(parents=True, exist_ok=True)
        kernel.write_bytes(b"\0" * 4096)
    with open(log, "a") as f:
        f.write(json.dumps({"pid": os.getpid(), "hit": hit, "same_path": same_path, "root": str(root),
                            "vllm": str(vllm_root), "triton": os.environ.get("TRITON_CACHE_DIR"),
                            "inductor": os.environ.get("TORCHINDUCTOR_CACHE_DIR")}) + "\n")


class LLM:
    built = 0  # how many were constructed (loading the model, in real vLLM)

    def __init__(self, max_num_seqs: int = 8, max_model_len: int = 4096, **kwargs):
        LLM.built += 1
        self.kwargs = kwargs
        builds = os.environ.get("BATCHOCR_FAKE_BUILDS")  # a file: each build's span and its memory share
        t0 = time.time()
        # vLLM 0.26's order (LLMEngine.__init__, launch_core_engines), through its modules' globals
        # where this stand-in is installed as vllm, as vLLM calls them (patches.startup wraps them):
        # the renderer, the engine core's process started (the threads this process has then: a
        # fork copies them mid-call), the wait for its handshake (a load that takes a while).
        made = sys.modules.get("vllm.v1.engine.llm_engine") or sys.modules[__name__]
        waits = sys.modules.get("vllm.v1.engine.utils") or sys.modules[__name__]
        renderer = made.renderer_from_config(kwargs)
        self.threads_at_fork = list(threading.enumerate())
        self.waited = [time.monotonic()]
        waits.wait_for_engine_startup(float(os.environ.get("BATCHOCR_FAKE_BUILD_S", "0.5")) if builds else 0.0)
        self.waited.append(time.monotonic())
        if os.environ.get("BATCHOCR_FAKE_COMPILE"):  # a file: each build's compile, from its caches or not
            _compile(os.environ["BATCHOCR_FAKE_COMPILE"], kwargs)
        self.llm_engine = FakeEngine(max_num_seqs, max_model_len, kwargs.get("stream_interval", 1), renderer)
        if os.environ.get("BATCHOCR_FAKE_REFUSE"):  # an engine refusing every request (a process of its own)
            self.llm_engine.refuse = ValueError(os.environ["BATCHOCR_FAKE_REFUSE"])
        if builds:
            with open(builds, "a") as f:
                f.write(json.dumps({"pid": os.getpid(), "t0": t0, "t1": time.time(),
                                    "gpu_memory_utilization": kwargs.get("gpu_memory_utilization"),
                                    # what vLLM's usage reporting reads as it starts (usage_lib.is_usage_stats_enabled)
                                    "no_usage_stats": os.environ.get("VLLM_NO_USAGE_STATS"),
                                    "do_not_track": os.environ.get("DO_NOT_TRACK"),
                                    "kv_cache_memory_bytes": kwargs.get("kv_cache_memory_bytes"),
                                    # the MPS daemon this engine's CUDA context would join (engines.vllm.mps)
                                    "mps_pipe": os.environ.get("CUDA_MPS_PIPE_DIRECTORY")}) + "\n")

    def start_profile(self):
        """As vllm.LLM.start_profile: only with profiler_config; the engine writes one trace of its
        own into torch_profiler_dir (here at once, one span: enough to say which engines traced)."""
        config = self.kwargs.get("profiler_config")
        if not config:
            raise RuntimeError("Profiling is not enabled: set profiler_config")
        trace = Path(config["torch_profiler_dir"]) / f"fake-engine-{id(self)}.pt.trace.json"
        trace.write_text(json.dumps({"traceEvents": [
            {"ph": "X", "name": "execute_model", "cat": "cpu_op", "ts": 0, "dur": 1000, "pid": 1, "tid": 1}]}))

    def generate(self, prompts, sampling_params, use_tqdm=False):
        """One finite call, as vllm.LLM.generate: add everything, step until done."""
        engine, ids = self.llm_engine, []
        for prompt, params in zip(prompts, sampling_params):
            (engine_input,) = engine.renderer.render_cmpl([prompt])
            ids.append(f"g{engine.added}")
            engine.add_request(ids[-1], engine_input, params)
        done, tokens = {}, {i: [] for i in ids}
        while engine.order:
            for o in engine.step():  # the final output holds every token, as vLLM's does
                tokens[o.request_id] += o.outputs[0].token_ids
                if o.finished:
                    done[o.request_id] = RequestOutput(o.request_id, o.prompt_token_ids, [
                        Completion(tokens[o.request_id], "", o.outputs[0].finish_reason)], True)
        return [done[i] for i in ids]


# vllm.EngineArgs: where LLM's other keywords go (a dataclass; these are some of vLLM 0.26's
# 221 fields: what batchocr passes and what its docs name).
ENGINE_ARGS_FIELDS = (
    "model", "tokenizer", "dtype", "seed", "max_model_len", "max_num_seqs", "max_num_batched_tokens",
    "gpu_memory_utilization", "kv_cache_memory_bytes", "kv_cache_dtype", "tensor_parallel_size", "quantization",
    "load_format", "enforce_eager", "enable_prefix_caching", "limit_mm_per_prompt", "mm_processor_kwargs",
    "mm_processor_cache_gb", "mm_tensor_ipc", "mm_encoder_attn_backend", "compilation_config", "attention_config",
    "logits_processors", "worker_extension_cls", "additional_config", "disable_log_stats", "stream_interval",
    "async_scheduling", "hf_overrides", "profiler_config", "trust_remote_code")
EngineArgs = dataclasses.make_dataclass("EngineArgs", [(name, object, None) for name in ENGINE_ARGS_FIELDS])


def _modules() -> dict[str, types.ModuleType]:
    vllm = types.ModuleType("vllm")
    vllm.__version__ = "fake"
    vllm.LLM = LLM
    vllm.EngineArgs = EngineArgs
    vllm.SamplingParams = SamplingParams
    sampling = types.ModuleType("vllm.sampling_params")
    sampling.RequestOutputKind = RequestOutputKind
    vllm.sampling_params = sampling
    processor = _chain("transformers_utils.processors.deepseek_ocr", vllm, ImageTransform=ImageTransform,
                       DeepseekOCRProcessor=DeepseekOCRProcessor)
    engine = _chain("v1.engine.llm_engine", vllm, renderer_from_config=renderer_from_config)
    utils = _chain("utils", engine[1], wait_for_engine_startup=wait_for_engine_startup)
    return {"vllm": vllm, "vllm.sampling_params": sampling, **{m.__name__: m for m in processor + engine + utils}}


def _chain(path: str, root: types.ModuleType, **attrs) -> list[types.ModuleType]:
    """`vllm.PATH` (dotted) and the modules between it and `root` (vllm), each an attribute of the
    one above it; the last holds `attrs`."""
    chain, parent = [], root
    for part in path.split("."):
        module = types.ModuleType(f"{parent.__name__}.{part}")
        setattr(parent, part, module)
        chain.append(parent := module)
    for key, value in attrs.items():
        setattr(parent, key, value)
    return chain


def install(monkeypatch) -> None:
    """Make `import vllm` find this stand-in (for the test's duration)."""
    for name, module in _modules().items():
        monkeypatch.setitem(sys.modules, name, module)


def vllm_module(monkeypatch, path: str, **attrs) -> types.ModuleType:
    """`vllm.PATH` (dotted) holding `attrs`, under a fresh `vllm` (for the test's duration): a
    module one of batchocr's patches reaches (vLLM itself absent, or this stand-in)."""
    root = types.ModuleType("vllm")
    for module in [root, *_chain(path, root, **attrs)]:
        monkeypatch.setitem(sys.modules, module.__name__, module)
    return sys.modules[f"vllm.{path}"]


def model_module(monkeypatch, name: str, **classes) -> types.ModuleType:
    """`vllm.model_executor.models.NAME` holding `classes`: the module one of batchocr's worker
    extensions patches."""
    return vllm_module(monkeypatch, f"model_executor.models.{name}", **classes)


def install_modules() -> None:
    """The same for a whole process (bench/gpu/throughput.py --fake: a dry run on the CPU)."""
    sys.modules.update(_modules())


DATA = Path(__file__).parent / "data" / "vllm"


def vllm_tree(root: Path, version: str = "0.26.0", edit: dict[str, tuple[str, str]] | None = None) -> Path:
    """An installed vLLM under `root` (put it first on PYTHONPATH): this stand-in as its API, a
    `vllm-VERSION.dist-info` as pip leaves one, and as its internals the code batchocr's patches
    rewrite, vLLM 0.26.0's (tests/data/vllm/), laid out in vLLM's files. `edit` changes that code
    as a later vLLM might: {path in vllm/: (old text, new text)}."""
    package = root / "vllm"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(f"from fake_vllm import EngineArgs, LLM, SamplingParams\n"
                                         f"__version__ = {version!r}\n")
    (package / "sampling_params.py").write_text("from fake_vllm import RequestOutputKind\n")
    info = root / f"vllm-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")
    kernel = (DATA / "triton_unified_attention-0.26.0.py.txt").read_text()
    files = {"v1/attention/ops/triton_unified_attention.py": kernel}
    for path, code in json.loads((DATA / "targets-0.26.0.json").read_text()).items():
        if path.startswith("_"):
            continue
        classes: dict[str, list[str]] = {}
        for name, segment in code.items():  # a method's lines after its first keep the class's indent
            owner, _, _ = name.rpartition(".")
            classes.setdefault(owner, []).append(segment)
        parts = classes.pop("", []) + [f"class {owner}:\n    " + "\n\n    ".join(methods)
                                       for owner, methods in classes.items()]
        # importable as it stands (an engine imports the processor's module to install patches.pixels'
        # half): its annotations name what the segments' imports would have brought
        files[path] = "from __future__ import annotations\n\n\n" + "\n\n\n".join(parts) + "\n"
    for path, (old, new) in (edit or {}).items():
        if old not in files[path]:
            raise ValueError(f"{path} has no {old!r}")
        files[path] = files[path].replace(old, new)
    for path, text in files.items():
        (package / path).parent.mkdir(parents=True, exist_ok=True)
        (package / path).write_text(text)
    return root


def imported() -> None:
    """`vllm` imported in this process (the stand-in's package): with BATCHOCR_FAKE_BUILDS set,
    an import of BATCHOCR_FAKE_IMPORT_S seconds (vLLM's and torch's take tens), its span noted
    there beside the builds."""
    builds = os.environ.get("BATCHOCR_FAKE_BUILDS")
    if builds:
        t0 = time.time()
        time.sleep(float(os.environ.get("BATCHOCR_FAKE_IMPORT_S", "0")))
        with open(builds, "a") as f:
            f.write(json.dumps({"pid": os.getpid(), "import_t0": t0, "import_t1": time.time()}) + "\n")


def package(folder: Path) -> str:
    """A `vllm` package under folder that is this stand-in, for processes a test or a bench
    spawns (with this file's folder on their path too); the folder to put on PYTHONPATH."""
    pkg = Path(folder) / "vllm"
    pkg.mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text("import fake_vllm\nfake_vllm.imported()\n__version__ = 'fake'\n"
                                     "LLM, SamplingParams = fake_vllm.LLM, fake_vllm.SamplingParams\n")
    (pkg / "sampling_params.py").write_text("from fake_vllm import RequestOutputKind\n")
    (pkg / "transformers_utils" / "processors").mkdir(parents=True, exist_ok=True)
    (pkg / "transformers_utils" / "__init__.py").write_text("")
    (pkg / "transformers_utils" / "processors" / "__init__.py").write_text("")
    (pkg / "transformers_utils" / "processors" / "deepseek_ocr.py").write_text(
        "from fake_vllm import DeepseekOCRProcessor, ImageTransform  # noqa: F401\n")
    return str(folder)


def pythonpath(folder: Path) -> str:
    """PYTHONPATH for a process a test spawns: package(folder)'s stand-in as `vllm`, this file's
    folder (the stand-in itself) and the repository's root (batchocr)."""
    here = Path(__file__).resolve().parent
    return os.pathsep.join([package(folder), str(here), str(here.parent)])


"""Engines: page batches in, result batches out (any order, keyed by (doc_id, page_index)).

`Engine` is what the pipeline reads of one; `EngineType` is what the spec, the CLI and
the pipeline know of a kind of engine before one is built. Each engine's module (or
package) declares its type once as `ENGINE`, and the registry below names the modules.
"""

from __future__ import annotations

import importlib
import threading
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Callable, Iterator, Mapping

import pyarrow as pa

from batchocr.config import convert
from batchocr.errors import BatchocrError, ConfigError
from batchocr.schema import Needs


class Engine:
    """What the pipeline reads of an engine; every engine subclasses it. The attributes
    below the first three have defaults that an engine overrides where it has more to say."""

    name: str  # the engine type's registered name (engines.NAMES)
    model: str  # what goes in the table's `model` column
    needs: Needs  # what the render stage must produce for it
    # Pages the engine reads as one request. Above 1 (the vllm engine's document mode), the
    # pipeline hands it page groups: each batch is consecutive pages of one document, at most
    # group_pages of them (batchocr/grouping.py).
    group_pages: int = 1
    # Render settings the engine wants where the job spec leaves them unset (a VLM's page size).
    render_hints: Mapping[str, int] = MappingProxyType({})
    # time.monotonic() when the engine took the run's first request (None: it keeps no such time).
    first_request_at: float | None = None
    # How long the engine's own renderer took to warm up, and when (time.monotonic()) it began
    # (None: it has none).
    renderer_warm_up_s: float | None = None
    renderer_warm_up_at: float | None = None

    @property
    def accelerator(self) -> dict[str, Any]:
        """What a run of this engine holds, for its cost record (batchocr/cost.py): the whole
        machine unless the engine says otherwise (a GPU engine: the GPUs it sees)."""
        from batchocr.cost import cpu_machine

        return cpu_machine()

    def run(self, pages: Iterator[pa.RecordBatch], stop: threading.Event) -> Iterator[pa.RecordBatch]:
        """Consume page batches (schema.PAGES, no error rows) lazily; yield
        schema.RESULTS batches holding exactly one row per page received, a group's rows
        in one batch (so that the pipeline commits a group whole). Once `stop` is set,
        return soon: pages not yet output are redone by the next run."""
        raise NotImplementedError

    def describe(self) -> dict[str, Any]:
        """Parameters and versions, for OUT/_runs/<run_id>.json."""
        return {}

    def close(self) -> None:
        """Free what the engine holds (a model on the GPU, worker threads)."""


def _as_they_are(options: Mapping[str, Any], n: int) -> Mapping[str, Any]:
    return options


def _yes(options: Mapping[str, Any]) -> bool:
    return True


def _one_process(options: Mapping[str, Any]) -> tuple[int, str]:
    return 1, "its engine uses the machine alone"


def _nothing() -> None:
    return None


def _nothing_for(options: Mapping[str, Any]) -> None:
    return None


def _nothing_beside(options: Mapping[str, Any], n: int) -> AbstractContextManager:
    return nullcontext()


@dataclass(frozen=True)
class EngineType:
    """An engine type, registered once in its own module as `ENGINE`: everything the spec, the
    CLI and the pipeline know of it. Its module imports without the engine's heavy dependencies
    (vLLM), so that a configuration is checked before anything loads."""

    name: str
    options: type  # its frozen options dataclass (engines.NAME in a job spec)
    # The engine, built from its section's options (bad options: ConfigError, exit 2).
    create: Callable[[Mapping[str, Any]], Engine]
    # What OUT remembers of it from the options alone, without building it: {"model", and
    # where the engine has them "preset", "prompt", "render_hints"}.
    settings: Callable[[Mapping[str, Any]], dict[str, Any]]
    # The options of one of n engines sharing the machine's accelerator (a shard's parts).
    shared: Callable[[Mapping[str, Any], int], Mapping[str, Any]] = _as_they_are
    # Whether it must be built while no other engine of the machine is being built.
    starts_alone: Callable[[Mapping[str, Any]], bool] = _yes
    # `processes: auto`: how many processes of it pay on this machine, and why in a few words.
    auto_processes: Callable[[Mapping[str, Any]], tuple[int, str]] = _one_process
    # Its build costs more than listing a shard again (a model loaded onto the GPU): a run of
    # one process lists its shard first and builds nothing where no document has pages to do.
    slow_to_build: bool = False
    # The imports its build makes, made ahead: a part waiting for its turn to build (the part
    # before it building) makes them meanwhile.
    preload: Callable[[], None] = _nothing
    # What a machine's first build of it needs first, made once a run where it has pages to do
    # (a shard's parts inherit it): vLLM's compile cache copied into the run's caches.
    before_build: Callable[[Mapping[str, Any]], None] = _nothing_for
    # What n of its engines sharing the machine's accelerator run beside them while a shard's
    # parts run (a context): vLLM's MPS daemon.
    beside: Callable[[Mapping[str, Any], int], AbstractContextManager] = _nothing_beside


# The registry: each engine type's name and the module that declares it (`ENGINE`). Each
# module is imported only when its engine is named, so a missing optional dependency (vLLM)
# is reported only to those who ask for that engine.
_MODULES = {
    "rapidocr": "batchocr.engines.rapidocr",
    "textlayer": "batchocr.engines.textlayer",
    "vllm": "batchocr.engines.vllm",
}
NAMES = tuple(_MODULES)


@contextmanager
def _installed(name: str):
    """A module the engine needs that will not import (missing, or a library it loads is
    absent: OpenCV without libGL.so.1 in a slim image) fails every page alike: one line,
    the run's failure (exit 1), not a traceback. vLLM's own absence is a ConfigError the
    engine raises itself (its extra was not installed)."""
    try:
        yield
    except ImportError as exc:
        raise BatchocrError(f"engine {name} cannot import {exc.name or 'a module it needs'} ({exc}): the "
                            "installation is incomplete (pip install batchocr again; a shared library "
                            "named here comes from the system's packages)") from None


def kind(name: str) -> EngineType:
    """The registered engine type `name` (an unknown name: ConfigError, exit 2)."""
    if name not in _MODULES:
        raise ConfigError(f"unknown engine {name!r}; choose one of {', '.join(_MODULES)}")
    with _installed(name):
        return importlib.import_module(_MODULES[name]).ENGINE


def _ask(name: str, what: str, *args) -> Any:
    """Engine type `name`'s `what`(*args), a missing dependency said as one line (_installed)."""
    engine_type = kind(name)
    with _installed(name):
        return getattr(engine_type, what)(*args)


def preload(name: str) -> None:
    """The imports the engine's build makes, now (a missing extra: the error its build would give)."""
    _ask(name, "preload")


def before_build(name: str, options: Mapping[str, Any]) -> None:
    """What the machine's first build of engine `name` needs, made now: once a run, where it has
    pages to do (an idle shard's run copies no compile cache)."""
    _ask(name, "before_build", options)


def beside(name: str, options: Mapping[str, Any], n: int) -> AbstractContextManager:
    """What n engines `name` sharing the accelerator (a shard's parts) run beside, while the block
    runs: vllm's MPS daemon (engines.vllm.mps)."""
    return _ask(name, "beside", options, n)


def create(name: str, options: Mapping[str, Any]) -> Engine:
    return _ask(name, "create", options)


def settings(name: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """What OUT remembers of engine `name` with these options, from the configuration
    alone: {"model", "preset", "prompt", "render_hints"} (None or {} where the engine
    has none), without building the engine (no model loaded, vLLM not imported), so
    that a run OUT would refuse stops before the engine loads. The run checks it against
    the built engine's run record."""
    return {"preset": None, "prompt": None, "render_hints": {}} | _ask(name, "settings", options)


def shared(name: str, options: Mapping[str, Any], n: int) -> Mapping[str, Any]:
    """The options of one of n engines that share a machine's accelerator (a shard's
    parts: batchocr/parts.py); vllm's: 1/n of gpu_memory_utilization, less what its model
    takes beyond vLLM's profile (engines.vllm.shared)."""
    return _ask(name, "shared", options, n)


def auto_processes(name: str, options: Mapping[str, Any]) -> tuple[int, str]:
    """`processes: auto`: how many processes of engine `name` pay on this machine, and why."""
    return _ask(name, "auto_processes", options)


def starts_alone(name: str, options: Mapping[str, Any]) -> bool:
    """Whether the engine must be built while no other engine of the machine is being built."""
    return _ask(name, "starts_alone", options)


def parse_options(cls: type, options: Mapping[str, Any], engine: str, where: str = "engine options"):
    """An engine's frozen options dataclass from its section (engines.NAME), typed
    like every other configuration (batchocr.config)."""
    return convert(cls, options, where, prefix=("engines", engine))


def options(name: str, options: Mapping[str, Any], where: str = "engine options", chosen: bool = False):
    """The options of engine `name`, validated by its own dataclass (without
    building the engine, or importing what only the engine needs). `chosen`: the
    run's engine, whose options must also hold what running needs (the dataclass's
    `check_chosen`, where it has one: vllm's model); another engine's section,
    unused, is only checked."""
    parsed = parse_options(kind(name).options, options, name, where)
    if chosen and hasattr(parsed, "check_chosen"):
        try:
            parsed.check_chosen()
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None
    return parsed


def result(doc_id: str, page_index: int, **fields: Any) -> dict:
    return {"doc_id": doc_id, "page_index": page_index, **fields}

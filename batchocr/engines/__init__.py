"""Engines: page batches in, result batches out (any order, keyed by (doc_id, page_index)).

One file per engine; each is imported only when chosen, so a missing optional
dependency (vLLM) is reported only to those who ask for that engine.
"""

from __future__ import annotations

import importlib
import threading
from contextlib import contextmanager
from typing import Any, Iterator, Mapping, Protocol

import pyarrow as pa

from batchocr.config import convert
from batchocr.errors import BatchocrError, ConfigError
from batchocr.schema import Needs


class Engine(Protocol):
    name: str
    model: str  # what goes in the table's `model` column
    needs: Needs  # what the render stage must produce for it
    # Pages the engine reads as one request (optional; 1 if absent). Above 1 (the vllm engine's
    # document mode), the pipeline hands it page groups: each batch is consecutive pages of one
    # document, at most group_pages of them (batchocr/grouping.py).
    group_pages: int

    def run(self, pages: Iterator[pa.RecordBatch], stop: threading.Event) -> Iterator[pa.RecordBatch]:
        """Consume page batches (schema.PAGES, no error rows) lazily; yield
        schema.RESULTS batches holding exactly one row per page received, a group's rows
        in one batch (so that the pipeline commits a group whole). Once `stop` is set,
        return soon: pages not yet output are redone by the next run."""
        ...

    def describe(self) -> dict[str, Any]:
        """Parameters and versions, for OUT/_runs/<run_id>.json."""
        ...

    def close(self) -> None: ...


_MODULES = {
    "rapidocr": "batchocr.engines.rapidocr",
    "textlayer": "batchocr.engines.textlayer",
    "vllm": "batchocr.engines.vllm",
}


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


def create(name: str, options: Mapping[str, Any]) -> Engine:
    if name not in _MODULES:
        raise ConfigError(f"unknown engine {name!r}; choose one of {', '.join(_MODULES)}")
    with _installed(name):
        module = importlib.import_module(_MODULES[name])
        return module.create(options)


def settings(name: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """What OUT remembers of engine `name` with these options, from the configuration
    alone: {"model", "preset", "prompt", "render_hints"} (None or {} where the engine
    has none), without building the engine (no model loaded, vLLM not imported), so
    that a run OUT would refuse stops before the engine loads. Each engine module's
    `settings(options)` gives it; run_job checks it against the built engine's run record."""
    if name not in _MODULES:
        raise ConfigError(f"unknown engine {name!r}; choose one of {', '.join(_MODULES)}")
    with _installed(name):
        module = importlib.import_module(_MODULES[name])
        return {"preset": None, "prompt": None, "render_hints": {}} | module.settings(options)


def shared(name: str, options: Mapping[str, Any], n: int) -> Mapping[str, Any]:
    """The options of one of n engines that share a machine's accelerator (a shard's
    parts: batchocr/parts.py): the module's `shared(options, n)`, where it has one (vllm:
    1/n of gpu_memory_utilization); else the options as they are."""
    module = importlib.import_module(_MODULES[name])
    return module.shared(options, n) if hasattr(module, "shared") else options


def starts_alone(name: str, options: Mapping[str, Any]) -> bool:
    """Whether the engine must be built while no other engine of the machine is being built
    (the module's `starts_alone(options)`; without one, yes: the safe order)."""
    module = importlib.import_module(_MODULES[name])
    return module.starts_alone(options) if hasattr(module, "starts_alone") else True


# Engines whose build costs more than listing a shard again: a model loaded onto the GPU (vLLM:
# 70-200 s, docs/GPU.md). A run of one process lists its shard before building one of these, and
# builds nothing where no document has pages to do (a CronJob's quiet night), as parts always do.
SLOW_TO_BUILD = frozenset({"vllm"})


# Each engine's options dataclass, in its module.
_OPTIONS = {"rapidocr": "RapidOCROptions", "textlayer": "TextLayerOptions", "vllm": "VLLMOptions"}


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
    if name not in _MODULES:
        raise ConfigError(f"unknown engine {name!r}; choose one of {', '.join(_MODULES)}")
    cls = getattr(importlib.import_module(_MODULES[name]), _OPTIONS[name])
    parsed = parse_options(cls, options, name, where)
    if chosen and hasattr(parsed, "check_chosen"):
        try:
            parsed.check_chosen()
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None
    return parsed


def result(doc_id: str, page_index: int, **fields: Any) -> dict:
    return {"doc_id": doc_id, "page_index": page_index, **fields}

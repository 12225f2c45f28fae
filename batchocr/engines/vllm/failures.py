"""vLLM's failures, each said in one line: a build vLLM refuses (exit 2: the configuration's) or
that fails (exit 1: a retry may help), a model that cannot generate, an engine-core process that
dies mid-run (watched, so that the run stops instead of hanging), and refusals of every request
alike (systemic: the run stops, no per-page error rows)."""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
from typing import Any, Mapping

from batchocr.engines import systemic
from batchocr.engines.vllm.options import VLLMOptions
from batchocr.engines.vllm.presets import Preset
from batchocr.errors import BatchocrError, ConfigError

WATCH_S = 0.5  # how often the engine core's death is looked for
log = logging.getLogger(__name__)


class EngineCoreDied(RuntimeError):
    pass


def watch_engine_core(engine: Any, stopped: threading.Event) -> None:
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


def engine_failure(engine: Any, exc: Exception) -> BatchocrError:
    """The run's one line. A dead engine-core process says so: vLLM's own EngineDeadError
    ("EngineCore encountered an issue. See stack trace (above)") points at a trace that a
    killed process never wrote."""
    if engine_dead(engine):
        return BatchocrError(f"the vLLM engine failed: its engine-core process died (killed, or out of memory: "
                             f"the node's kernel log or the pod's events say which) [{type(exc).__name__}]")
    return BatchocrError(f"the vLLM engine failed: {type(exc).__name__}: {exc}")


def engine_dead(engine: Any) -> bool:
    return bool(getattr(getattr(getattr(engine, "engine_core", None), "resources", None), "engine_dead", False))


def refusals(engines: int = 1) -> systemic.Held:
    """Requests vLLM refused before it took any, held back: one for a run's engine, or shared
    by its instances, whose threads reach it under its lock (batchocr/engines/systemic.py)."""
    return systemic.Held("engine vllm refused every request alike ({n} pages, none taken)", engines)


def load(options: VLLMOptions, preset: Preset) -> Any:
    """vllm.LLM built from the options, what it would refuse said first (a model folder that is not
    there, an engine argument it does not take), its own failures in one line."""
    from vllm import LLM

    if options.model.startswith(("/", "./", "../")) and not os.path.isdir(options.model):
        # A wrong path is the user's to fix: exit 2 fails the Kubernetes Job at once.
        raise ConfigError(f"engine vllm: model folder {options.model} does not exist")
    check_engine_args(LLM, options.engine_args)
    return build(LLM, options.llm_args(preset))


def check_engine_args(llm_cls: type, engine_args: Mapping[str, Any]) -> None:
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


def build(llm_cls: type, args: dict[str, Any]) -> Any:
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
        raise BatchocrError(f"the vLLM engine failed to start: {named(exc)} (vLLM's log above says why)") from None


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
    return named(exc)


def named(exc: BaseException) -> str:
    """An exception in one line: its type and the first line of its message, at most 300 characters."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {(lines[0] if lines else '')[:300]}"


def check_can_generate(engine: Any, model: str) -> None:
    """At start, not as 512 error rows: a model vLLM loaded for pooling (an embedding
    model, or a folder whose config says so) cannot OCR."""
    tasks = tuple(engine.get_supported_tasks())
    if "generate" not in tasks:
        raise ConfigError(f"engine vllm: the model {model} cannot generate text (vLLM supports "
                          f"{', '.join(map(str, tasks)) or 'no task'} for it): an OCR model must be a generative "
                          "vision-language model")

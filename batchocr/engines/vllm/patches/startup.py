"""vLLM 0.26.0: a call beside the engine core's start-up, in the process that builds the LLM.

vllm.LLM's build makes the engine's renderer first (`LLMEngine.__init__`: `renderer_from_config`),
then starts the engine core's process (`EngineCoreClient.make_client` -> `launch_core_engines`)
and waits for its handshake (`wait_for_engine_startup`: the model's load, its compile, the KV
cache and the CUDA graphs, 25-50 s), while this process idles. `beside_startup(call)` hands
the renderer to `call` as that wait begins: after the engine core's process has started, so no
thread of the caller's runs while vLLM forks it, and before the LLM is returned. The engine's
renderer warm-up goes there (the processor's load and its first calls, which otherwise come
after the build, before the first request).

Nothing here changes what vLLM does: the two functions are wrapped for the build's duration
and put back after it. Where this vLLM's code is not the code described (`TARGETS`) or its
modules do not import, nothing is wrapped and `call` is never made: the caller does its work
after the build, as it would without this module. Importing it needs no vLLM.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from typing import Any, Callable, Iterator

from batchocr.engines.vllm.patches import moved as _moved

log = logging.getLogger(__name__)

# The vLLM code whose order the call relies on (as vLLM 0.26.0 writes it): the renderer made
# before the engine core starts; the wait for its handshake after its process has started.
TARGETS = {
    "v1/engine/llm_engine.py:LLMEngine.__init__": "28f3e4f627a5c178",
    "v1/engine/utils.py:launch_core_engines": "7d17b9e2cf74f679",
}
_building = threading.Lock()  # one build at a time wraps vLLM's functions


def moved() -> str | None:
    """Why this vLLM's build is not the one described (None: it is, or no vLLM here)."""
    return _moved("startup", TARGETS)


@contextlib.contextmanager
def beside_startup(call: Callable[[Any], None]) -> Iterator[None]:
    """Inside it, a vllm.LLM's build calls `call(renderer)` once, in the building thread, as the
    wait for its engine core begins; `call` must return at once (hand the work to a thread)."""
    made = [False]
    why = moved()
    try:
        from vllm.v1.engine import llm_engine, utils

        make, wait = llm_engine.renderer_from_config, utils.wait_for_engine_startup
    except Exception as exc:  # noqa: BLE001 - a vLLM laid out otherwise: the caller's own path
        why = why or f"{type(exc).__name__}: {exc}"
    if why is not None:
        log.debug("the renderer's warm-up waits for the build (%s)", why)
        yield
        return
    renderers: list = []

    def renderer_from_config(*args, **kwargs):
        renderer = make(*args, **kwargs)
        renderers.append(renderer)
        return renderer

    def wait_for_engine_startup(*args, **kwargs):
        if renderers and not made[0]:
            made[0] = True
            try:
                call(renderers[-1])
            except Exception as exc:  # noqa: BLE001 - the build goes on; the caller's own path after it
                made[0] = False
                log.debug("the call beside the engine core's start-up failed: %s: %s", type(exc).__name__, exc)
        return wait(*args, **kwargs)

    with _building:
        llm_engine.renderer_from_config, utils.wait_for_engine_startup = renderer_from_config, wait_for_engine_startup
        try:
            yield
        finally:
            llm_engine.renderer_from_config, utils.wait_for_engine_startup = make, wait

"""vLLM's worker extensions, as batchocr's patches use them.

vLLM resolves `worker_extension_cls="batchocr.MODULE.NAME"` in its worker process by importing
MODULE and asking it for NAME, then mixes the class into its Worker class. batchocr's modules
answer with a module `__getattr__` (PEP 562): asking for an extension's name runs the `install()`
of each module that extension names (looked up then, so importing a module patches nothing) and
gives `Extension`, which has no methods that could clash with the Worker's.

    __getattr__ = workerext.resolver(__name__, {"NGramSamplerExtension": ("ngram_sampler",)})
"""

from __future__ import annotations

import importlib
from typing import Callable, Mapping, Sequence


class Extension:
    """Named by `worker_extension_cls`: resolving its name installed the patches. No methods
    of its own (vLLM mixes it into its Worker class)."""


def resolver(module: str, extensions: Mapping[str, Sequence[str]]) -> Callable[[str], type]:
    """A module's `__getattr__`: each extension's name installs the batchocr modules it lists,
    in order, and gives Extension; any other name is an AttributeError."""

    def __getattr__(name: str) -> type:
        if name not in extensions:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        for patch in extensions[name]:
            importlib.import_module(f"batchocr.{patch}").install()
        return Extension

    return __getattr__

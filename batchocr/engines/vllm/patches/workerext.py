"""vLLM 0.26.0: how batchocr's patches reach vLLM's worker process, and key vLLM's compile cache.

vLLM resolves `worker_extension_cls="batchocr.engines.vllm.patches.MODULE.NAME"` in its worker
process by importing MODULE and asking it for NAME, then mixes the class into its Worker class.
The patches answer with a module `__getattr__` (PEP 562): asking for an extension's name runs
the `install()` of each patch that extension names (looked up then, so importing a module
patches nothing) and gives `Extension`, which has no methods that could clash with the Worker's.

    __getattr__ = workerext.resolver(__name__, {"NGramSamplerExtension": ("ngram_sampler",)})

The patches change what vLLM's `torch.compile` traces (vitpad the vision MLPs' weight sizes), but
vLLM keys its compile cache (`~/.cache/vllm/torch_compile_cache/torch_aot_compile/{hash}`) on a hash
that leaves `worker_extension_cls` out (ParallelConfig.compute_hash's ignored factors), and reloads
an artifact if the vLLM files it traced are unchanged. So a graph compiled without a patch would
be reloaded with it, and the reverse: vitpad's padded weights then meet a graph traced at the
unpadded size, and the engine core dies. `keyed` puts the extension's name and its modules'
source hash into `additional_config`, which that hash covers.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
from typing import Any, Callable, Mapping, Sequence

from batchocr.engines.vllm.patches import moved as _moved

KEY = "batchocr_worker_extension"  # in vLLM's additional_config
# How vLLM mixes an extension into its worker, and the config hash that keys its compile cache
# (additional_config in it), as vLLM 0.26.0 writes them.
TARGETS = {
    "v1/worker/worker_base.py:WorkerWrapperBase.init_worker": "af1a7abb243d61b3",
    "config/vllm.py:VllmConfig.compute_hash": "0dc9a299322778f9",
}


def moved() -> str | None:
    """Why this vLLM's worker extensions are not what batchocr's patches ride on (None: they are, or
    no vLLM here): every patch that needs an extension is then off."""
    return _moved("workerext", TARGETS)


class Extension:
    """Named by `worker_extension_cls`: resolving its name installed the patches. No methods
    of its own (vLLM mixes it into its Worker class)."""


def resolver(module: str, extensions: Mapping[str, Sequence[str]]) -> Callable[[str], type]:
    """A module's `__getattr__`: each extension's name installs the patches (modules of this
    package) it lists, in order, and gives Extension; any other name is an AttributeError."""

    def __getattr__(name: str) -> type:
        if name not in extensions:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        for patch in extensions[name]:
            importlib.import_module(f"{__package__}.{patch}").install()
        return Extension

    __getattr__.extensions = dict(extensions)
    return __getattr__


def fingerprint(cls: str) -> str | None:
    """`batchocr.engines.vllm.patches.MODULE.NAME`: NAME and a hash of the source of the modules
    it installs (and of MODULE); None for a name that is not one of batchocr's extensions.
    Installs nothing."""
    module, _, name = cls.rpartition(".")
    if not module.startswith("batchocr."):
        return None
    try:
        extensions = getattr(importlib.import_module(module).__getattr__, "extensions")
    except (ImportError, AttributeError):
        return None
    if name not in extensions:
        return None
    digest = hashlib.sha256()
    for mod in dict.fromkeys([module, *(f"{__package__}.{patch}" for patch in extensions[name])]):
        with open(importlib.util.find_spec(mod).origin, "rb") as f:
            digest.update(f.read())
    return f"{cls}@{digest.hexdigest()[:16]}"


def keyed(args: dict[str, Any]) -> dict[str, Any]:
    """vLLM's engine arguments with a batchocr worker extension's fingerprint in
    `additional_config`, so that vLLM's compile cache tells a patched model from a plain one; as
    they were for any other extension, or an `additional_config` that is not a dict."""
    mark = fingerprint(cls) if isinstance(cls := args.get("worker_extension_cls"), str) else None
    extra = args.get("additional_config")
    if mark is None or not (extra is None or isinstance(extra, dict)):
        return args
    return args | {"additional_config": {**(extra or {}), KEY: mark}}

"""vLLM 0.26.0: batchocr's rewrites of vLLM internals, and the check that this vLLM still has them.

Each patch installs in vLLM's worker (engine-core) process when vLLM resolves the worker
extension that names it (workerext.py); importing a patch patches nothing. engines.vllm's
options choose them (options.py: VLLMOptions.llm_args):

- rswa_tiles.py: R-SWA attention reads only the KV tiles it can see (Unlimited-OCR).
- deepencoder.py: DeepSeek-OCR's vision encoder over a step's images at once.
- vitpad.py: Qwen2.5-VL's vision MLPs padded to an aligned inner size.
- ngram.py: the no-repeat n-gram bans as a logits processor, cheap at 256+ requests a step.
- ngram_sampler.py: the same bans on the GPU, in the V2 model runner's sampler.
- pixels.py: DeepSeek-OCR's image views handed to the engine core as bytes (pixel_bytes; its
  model half rides with deepencoder's, its processor half installs in the engine's process).
- startup.py: the engine's renderer warm-up beside vLLM's wait for its engine core, in the
  process that builds the LLM (wraps two functions for the build's duration; nothing in vLLM's
  worker).
- workerext.py: how the patches reach vLLM's worker, and key its compile cache.
- samattn.py: SAM's relative-position bias folded into its attention (sam_fold; it rides with
  deepencoder's, switched on in the engine's environment).

Each patch names the vLLM code it rewrites or copies (`TARGETS`: a file of the vllm package
and a function or class in it, with a hash of its source in vLLM 0.26.0; rswa_tiles: the anchors
of the kernel source it rewrites) and says, with `moved()`, whether this process's vLLM still has
that code, reading vLLM's files without importing them, before vLLM is built
(options.VLLMOptions.check_patches). Where it moved (workerext's: every patch that rides on a
worker extension):

- the n-gram bans (ngram_bans: processor or sampler) change the output where they are missing:
  the run stops (exit 2, the key named), whatever asked for them.
- rswa_tiles, batch_encoder, vit_pad, pixel_bytes, sam_fold change only speed (and host memory): left to
  the preset, vLLM's own code runs, with one warning naming the key; asked for in the job spec,
  the run stops (exit 2).

Another vLLM than the one tested is said once (`untested`), whether or not a patch is on. Each
warning is said once a run: once in a process, and not again by the parts it starts.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import importlib.util
from pathlib import Path
from typing import Mapping

TESTED = "0.26.0"  # the vLLM the GPU runs were made with: pyproject's `vllm` extra and the Dockerfile's image


def vllm_root() -> Path | None:
    """The folder of this process's vllm package, found without importing it; None where no vLLM is
    installed, or where the vllm on the path is not the installed one (a stand-in of the tests)."""
    from importlib import metadata

    try:
        spec = importlib.util.find_spec("vllm")
        installed = Path(metadata.distribution("vllm").locate_file("vllm"))
    except (ImportError, ValueError, AttributeError, metadata.PackageNotFoundError):
        return None  # none, or a stand-in module in sys.modules (no spec)
    locations = list(spec.submodule_search_locations or ()) if spec is not None else []
    if not locations or Path(locations[0]).resolve() != installed.resolve():
        return None
    return installed


def version() -> str | None:
    """The installed vLLM's version (vLLM is not imported for it); None where none is installed."""
    from importlib import metadata

    try:
        return metadata.version("vllm")
    except metadata.PackageNotFoundError:
        return None


def untested(found: str | None) -> str | None:
    """The warning for a vLLM other than the one tested (a build's local label, +cu130, is the
    same code); None for the tested one, or where none is installed (the engine says so)."""
    if found is None or found.split("+")[0] == TESTED:
        return None
    return (f"engine vllm: batchocr is tested with vLLM {TESTED}, this is vLLM {found}: each of its patches "
            f"checks the vLLM code it rewrites (pip install '.[vllm]' from the clone installs {TESTED})")


def source_of(src: str, qualname: str, tree: ast.Module | None = None) -> str | None:
    """The source of `qualname` (a function or class, or Class.method) in a module's source (and its
    parsed `tree`, where given), its whitespace collapsed (formatting aside, the code); None where
    the module has none by that name."""
    nodes, node = (tree or ast.parse(src)).body, None
    for part in qualname.split("."):
        node = next((n for n in nodes if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                     and n.name == part), None)
        if node is None:
            return None
        nodes = node.body
    lines = src.splitlines(keepends=True)[node.lineno - 1:node.end_lineno]  # as ast.get_source_segment
    if len(lines) == 1:  # cuts them (its offsets count UTF-8 bytes), without its slow line split
        lines[0] = lines[0].encode()[node.col_offset:node.end_col_offset].decode()
    else:
        lines[0] = lines[0].encode()[node.col_offset:].decode()
        lines[-1] = lines[-1].encode()[:node.end_col_offset].decode()
    return " ".join("".join(lines).split())


@functools.lru_cache(maxsize=32)
def _parsed(path: Path, stamp: tuple[int, int]) -> tuple[str, ast.Module]:
    """A file of vLLM's, read and parsed once while it is unchanged (`stamp`: its mtime and size):
    the options ask for the engine's arguments several times a run."""
    src = path.read_text()
    return src, ast.parse(src)


def _code(path: Path, qualname: str) -> str | None:
    """`source_of` qualname in the file at path; None where the file or the name is missing."""
    try:
        stat = path.stat()
        src, tree = _parsed(path, (stat.st_mtime_ns, stat.st_size))
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return None
    return source_of(src, qualname, tree)


def digest(code: str) -> str:
    return hashlib.sha256(code.encode()).hexdigest()[:16]


def moved(patch: str, targets: Mapping[str, str], root: Path | None = None) -> str | None:
    """Why this vLLM's code is not what `patch` rewrites: the first of `targets` ("path/in/vllm.py:
    Qualname" -> `digest` of its `source_of` in vLLM 0.26.0) missing or different, in a phrase;
    None where each is as written, or where no vLLM with files is here (its build says so)."""
    root = root or vllm_root()
    if root is None:
        return None
    for target, want in targets.items():
        path, _, name = target.partition(":")
        code = _code(root / path, name)
        rewrites = f"which batchocr's {patch} patch rewrites"
        if code is None:
            return f"this vLLM has no {name} in vllm/{path}, {rewrites} (written for vLLM {TESTED})"
        if digest(code) != want:
            return f"this vLLM's {name} (vllm/{path}) is not vLLM {TESTED}'s, {rewrites}"
    return None

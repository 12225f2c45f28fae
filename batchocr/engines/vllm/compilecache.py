"""vLLM's compile caches in one folder, filled once by a trusted run and copied into each run's
own before its engine builds (engines.vllm.compile_cache), so that a fresh pod starts from warm
caches instead of compiling again.

What a vLLM engine compiles on its first build, each cache keyed by what it compiled from (the
model's config, vLLM's and torch's versions, the GPU), so that an entry built for another image or
card is never read, only left unused:
  vLLM's torch.compile graphs   $XDG_CACHE_HOME/vllm (VLLM_CACHE_ROOT's default)
  Triton's kernels              TRITON_CACHE_DIR   (its default ~/.triton/cache)
  Inductor's kernels and graphs TORCHINDUCTOR_CACHE_DIR (its default /tmp/torchinductor_USER)
A run puts the last two under the first's root unless set, so that one folder holds them all.

The folder is written by `batchocr warm` (its own generated pages, never a user's documents: the
caches hold compiled code every later run executes) and read by every run that names it, which
copies it whole (the folder itself may be read-only: a shared volume) to the root the warm-up
compiled in, the same absolute path, and points vLLM's, Triton's and Inductor's caches there.
Copied into a root at another path, the compiled graphs load, but the engine's profile run and
CUDA-graph capture then take as long as after a cold compile (docs/PERFORMANCE.md, "A command's
start"); so a run goes to another root only where that path cannot be made, and then says so.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sys
import time
from pathlib import Path

COMPLETE = "batchocr-compile-cache.json"  # written last: a folder without it is not used

# vLLM hashes its environment's settings into its compile cache's keys (vllm.envs.compile_factors,
# which leaves out VLLM_CACHE_ROOT), and one of them is a path under the cache root:
# VLLM_XLA_CACHE_PATH (used on TPUs only), by default $XDG_CACHE_HOME/vllm/xla_cache. Left to
# default, a warm-up's root and a run's give different keys and the run compiles again; pinned,
# they give the same. (VLLM_CONFIG_ROOT, hashed too, follows $HOME: the same in a run's pods and
# their warm-up, which share the pod template.)
XLA_CACHE_PATH = "/tmp/vllm-xla-cache"


def cache_root(environ=os.environ) -> Path:
    """This process's cache root: $XDG_CACHE_HOME, else ~/.cache."""
    return Path(environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")


def one_root(environ=os.environ) -> Path:
    """Triton's and Inductor's caches under the cache root where they are not set, and vLLM's keys
    pinned (pin_keys), in this process's environment: the engine processes it starts inherit it;
    the root."""
    root = cache_root(environ)
    pin_keys(environ)
    environ.setdefault("XDG_CACHE_HOME", str(root))
    environ.setdefault("TRITON_CACHE_DIR", str(root / "triton"))
    environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(root / "inductor"))
    return root


def pin_keys(environ=os.environ) -> None:
    """The environment vLLM keys its compiled graphs by, the same whatever the cache root (where
    not set already: a value set by hand is the pod template's, the same in the warm-up)."""
    environ.setdefault("VLLM_XLA_CACHE_PATH", XLA_CACHE_PATH)


def _size(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file() and not f.is_symlink())


def seed(folder: str, environ=os.environ, say=None) -> bool:
    """Copy the compile cache at `folder` to the root it was compiled in and point this process's
    caches there (at_root), before an engine builds; where that path cannot be made (or the cache
    does not name it), into this process's own cache root (one_root). One line on stderr says what
    was found and where it went. False where it holds none yet (a cold start: vLLM compiles as it
    would without one)."""
    say = say or (lambda line: print(line, file=sys.stderr, flush=True))
    root = one_root(environ)
    src = Path(folder)
    marker = src / COMPLETE
    if not marker.is_file():
        say(f"compile cache: {folder} holds none yet (fill it with `batchocr warm`): vLLM compiles, "
            f"a start of minutes")
        return False
    t0 = time.monotonic()
    try:
        made = json.loads(marker.read_text())
        placed, why = place(src, made)
        if placed is not None:
            at_root(placed, environ)
            where = f"{'already at' if why == 'there' else 'copied to'} {placed}, where it was compiled"
        else:
            shutil.copytree(src, root, symlinks=True, dirs_exist_ok=True,
                            ignore=lambda d, names: [COMPLETE] if Path(d) == src else [])
            where = f"copied into {root}" + (f" ({made['root']}, where it was compiled, {why}: a slower "
                                             f"start, as after a cold compile)" if why else "")
    except (OSError, ValueError) as exc:
        # A cache is only ever a speed-up: a run goes on compiling rather than fail on it.
        say(f"compile cache: {folder} could not be copied ({getattr(exc, 'strerror', None) or exc}): "
            f"vLLM compiles, a start of minutes")
        return False
    say(f"compile cache: {folder} {where} ({made.get('bytes', 0) / 1e6:.0f} MB in "
        f"{time.monotonic() - t0:.1f} s; made by `batchocr warm` {made.get('made_at', '?')}, "
        f"vLLM {made.get('vllm', '?')}" + (f" on {made['gpu']}" if made.get("gpu") else "") + ")")
    return True


def place(src: Path, made: dict) -> tuple[Path | None, str]:
    """The compile cache at `src` (its marker's content `made`) at the root it was compiled in
    (made["root"]): (that root, "there") where an earlier run on this machine put it there already,
    (that root, "") where copied there now, (None, why not) where it cannot be, and (None, "")
    where the cache names no root (made before batchocr recorded it). The copy goes beside the
    root and is renamed into its place with its marker, so a run beside it finds a whole one or none."""
    if not made.get("root"):
        return None, ""
    dest = Path(made["root"])
    if not dest.is_absolute():
        return None, "is not an absolute path"

    def ours() -> bool:
        with contextlib.suppress(OSError, ValueError):
            return json.loads((dest / COMPLETE).read_text()) == made
        return False

    if ours():
        return dest, "there"
    if dest.exists():
        return None, "holds something else"
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(src, tmp, symlinks=True)  # the marker with it: renamed in whole, never half
        os.rename(tmp, dest)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if ours():  # a run beside this one put it there first
            return dest, "there"
        return None, f"could not be made ({exc.strerror or exc})"
    return dest, ""


def at_root(root: Path, environ=os.environ) -> None:
    """vLLM's, Triton's and Inductor's caches at `root`, as `batchocr warm` had them when it
    compiled (a value set by hand gives way: the compile cache is of use only there)."""
    environ["VLLM_CACHE_ROOT"] = str(root / "vllm")
    environ["TRITON_CACHE_DIR"] = str(root / "triton")
    environ["TORCHINDUCTOR_CACHE_DIR"] = str(root / "inductor")


def publish(root: Path, folder: str, about: dict) -> int:
    """The cache root `root` (what a warm run compiled) becomes the compile cache at `folder`,
    whole: copied beside it, its marker written last, then renamed into its place (a run reading
    the old one meanwhile copies a whole one or finds none). The bytes it holds."""
    dest = Path(folder)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_name(f".{dest.name}.{os.getpid()}.tmp")
    old = dest.with_name(f".{dest.name}.{os.getpid()}.old")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        shutil.copytree(root, tmp, symlinks=True)
        size = _size(tmp)
        (tmp / COMPLETE).write_text(json.dumps({**about, "bytes": size}, indent=1) + "\n")
        if dest.exists():
            os.replace(dest, old)
        os.replace(tmp, dest)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)
    return size


def what_built(environ=os.environ) -> dict:
    """vLLM's version and the GPU, for the marker (what a reader of the folder is told)."""
    about = {"made_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    with contextlib.suppress(Exception):
        import vllm

        about["vllm"] = getattr(vllm, "__version__", "?")
    with contextlib.suppress(Exception):
        import torch

        if torch.cuda.is_available():
            about["gpu"] = torch.cuda.get_device_name(0)
    return about


"""vLLM 0.26.0: R-SWA attention that reads only the KV tiles it can see, in vLLM's Triton unified attention.

Unlimited-OCR's R-SWA lets a generated token see the prompt (the page images and the
instruction) and the last `rswa_window` (128) tokens, nothing between. vLLM frees the KV
blocks in between (KV stays flat as the output grows), but its Triton kernel,
`kernel_unified_attention` (v1/attention/ops/triton_unified_attention.py), still walks every
KV tile of the sequence and masks the hidden ones after loading them: its tile pruning is
skipped for R-SWA (`compute_tile_loop_bounds`, triton_attention_helpers.py:185-202, reads the
full sequence where `USE_MM_PREFIX or USE_R_SWA`). Attention is most of a decode step's GPU
time, and its cost grows with the output while the keys it can see do not.

`patch_source` rewrites the kernel's tile loop so that, under R-SWA, a tile holding neither a
prompt key nor a key of the query block's window is skipped: no loads, no dot products. A
skipped tile is one whose every key is masked, which adds exp(-inf) = 0 to the softmax sums, so
the one-pass (2D) path gives the same output bit for bit; in the split (3D) path a segment with
no tile left keeps the initial row max (-inf rather than 0), the same result up to rounding of
the final rescale. `install` loads the rewritten module next to vLLM's and points vLLM's
`unified_attention` at its kernel; models without R-SWA compile it with USE_R_SWA false, where
the added test is constant true. Another vLLM's kernel, whose anchors moved, is refused before
vLLM is built (`check_source`): where the preset turned it on, vLLM's own kernel runs instead.

    LLM(..., worker_extension_cls="batchocr.engines.vllm.patches.rswa_tiles.RswaTilesExtension")
    # engines.vllm.rswa_tiles: true

bench/gpu/check_rswa_tiles.py runs both kernels on the same inputs (the CPU with Triton's
interpreter, or the GPU) and compares them.

`prefill_launch` rewrites the launcher too, for launches with a prefill: vLLM gives a model of
one query a KV head (Unlimited-OCR's 10 x 10) 16-row query blocks and 32-key tiles, sizes made
for decode. With BATCHOCR_PREFILL_TILES="ROWS,TILE[,WARPS]" in the engine's environment (a bench's
switch until measured: `check_rswa_tiles.py --prefill-tiles`, `throughput.py --variant`),
`install` points vLLM's Triton backend at the rewritten launcher as well.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import sys
import tempfile
from pathlib import Path

from batchocr.engines.vllm.patches import TESTED, vllm_root, workerext

MODULE = "vllm.v1.attention.ops.triton_unified_attention"
BACKEND = "vllm.v1.attention.backends.triton_attn"
PATCHED = MODULE + "_batchocr_rswa"

# The tile loop and the statement that ends its body (the epilogue's first line): the anchors.
_LOOP = "    for j in range(loop_lo, loop_hi):\n"
_EPILOGUE = "    # ---- Epilogue"
_SETUP = """    # batchocr's rswa_tiles patch: under R-SWA a key is visible when it is in the prompt or within the
    # window of a query; the block's first query has the window that starts first.
    if USE_R_SWA:
        rswa_prefix = tl.load(rswa_prefix_lens_ptr + seq_idx)
        rswa_first_key = context_len + q_block_local_idx * BLOCK_Q - R_SWA_WINDOW + 1
    else:
        rswa_prefix = 0
        rswa_first_key = 0
"""
_GUARD = "        if (j * TILE_SIZE < rswa_prefix) | ((j + 1) * TILE_SIZE > rswa_first_key):\n"


def patch_source(src: str) -> str:
    """vLLM's triton_unified_attention.py with the tile loop skipping the tiles R-SWA hides.
    ValueError where the source is not the one this was written against (its anchors)."""
    if src.count(_LOOP) != 1 or src.count(_EPILOGUE) != 1 or "USE_R_SWA: tl.constexpr" not in src:
        raise ValueError(f"vLLM's unified attention kernel is not the one {__name__} patches "
                         "(its tile loop or R-SWA arguments moved)")
    head, rest = src.split(_LOOP)
    body, tail = rest.split(_EPILOGUE)
    body = "".join(("    " + line if line.strip() else line) for line in body.splitlines(keepends=True))
    return head + _SETUP + _LOOP + _GUARD + body + _EPILOGUE + tail


# The launcher's lines prefill_launch adds to: where it has chosen the query block, and the prefill tile.
_BLOCK_Q = "    )\n    BLOCK_Q = BLOCK_M // num_queries_per_kv\n"
_TILE = "    if tuned_large_head:\n        TILE_SIZE_PREFILL = 128\n"
PREFILL_ENV = "BATCHOCR_PREFILL_TILES"


def prefill_launch(src: str, rows: int, tile: int, warps: int | None = None) -> str:
    """The module's source with its launcher giving a launch with a prefill (a query of more than
    one token) query blocks of at least `rows` rows, key tiles of `tile` and `warps` warps (None:
    Triton's choice). ValueError where the launcher is not the one this was written against."""
    if src.count(_BLOCK_Q) != 1 or src.count(_TILE) != 1:
        raise ValueError(f"vLLM's unified_attention launcher is not the one {__name__} rewrites")
    src = src.replace(_BLOCK_Q, _BLOCK_Q.replace(
        "    BLOCK_Q", f"    if max_seqlen_q > 1:\n        BLOCK_M = max(BLOCK_M, {rows})\n    BLOCK_Q"))
    return src.replace(_TILE, _TILE + f"    if max_seqlen_q > 1:\n        TILE_SIZE_PREFILL = {tile}\n"
                       + (f"        launch_num_warps = {warps}\n" if warps else ""))


def prefill_sizes(environ=os.environ) -> tuple[int, int, int | None] | None:
    """BATCHOCR_PREFILL_TILES as (rows, tile, warps); None where unset. ValueError where it is not
    two or three powers of two."""
    value = environ.get(PREFILL_ENV, "").strip()
    if not value:
        return None
    try:
        sizes = [int(x) for x in value.split(",")]
    except ValueError:
        sizes = []
    if len(sizes) not in (2, 3) or any(n < 1 or n & (n - 1) for n in sizes):
        raise ValueError(f"{PREFILL_ENV}={value!r}: ROWS,TILE[,WARPS], powers of two")
    return sizes[0], sizes[1], sizes[2] if len(sizes) == 3 else None


def kernel_file() -> Path | None:
    """Where this process's vLLM keeps the kernel's module, found without importing vLLM (None: no
    vLLM with files here, or a stand-in of the tests)."""
    root = vllm_root()
    return root / "v1" / "attention" / "ops" / "triton_unified_attention.py" if root is not None else None


def check_source(path: Path | None = None) -> None:
    """Before vLLM is built: ValueError where its kernel (at `path`, or where this process's vLLM
    has it) is missing or not the one the rewrite was written against, so that the run stops with
    the key named, or leaves the rewrite off, rather than failing inside vLLM's engine core."""
    path = path or kernel_file()
    if path is None:
        return
    if not path.is_file():
        raise ValueError(f"this vLLM has no {MODULE}, which batchocr's rswa_tiles patch rewrites "
                         f"(written for vLLM {TESTED})")
    patch_source(path.read_text())


def moved() -> str | None:
    """Why this vLLM's kernel is not the one the rewrite knows, in a phrase (None: it is, or no vLLM here)."""
    try:
        check_source()
    except ValueError as exc:
        return str(exc)
    return None


def patched_module(original, prefill: tuple[int, int, int | None] | None = None):
    """The rewritten copy of vLLM's kernel module `original`, loaded beside it; with `prefill`
    (rows, tile, warps) its launcher rewritten too (prefill_launch)."""
    src = patch_source(Path(original.__file__).read_text())
    if prefill:
        src = prefill_launch(src, *prefill)
    # Triton reads a kernel's source from its file: the rewritten module is a file of its own
    digest = hashlib.sha256(src.encode()).hexdigest()[:16]
    path = Path(tempfile.gettempdir()) / f"batchocr_rswa_{digest}.py"
    if not path.exists() or path.read_text() != src:
        tmp = path.with_suffix(f".{os.getpid()}.tmp")  # engine processes may write it at once
        tmp.write_text(src)
        tmp.replace(path)
    name = PATCHED + ("_{}_{}_{}".format(*prefill) if prefill else "")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def install() -> None:
    """Point vLLM's unified attention at the rewritten kernel (idempotent): `unified_attention`
    looks its kernel up in its module's globals when it launches, so rebinding the name is enough,
    before any kernel is compiled or captured into a CUDA graph (the worker resolves its extension
    before it loads the model)."""
    original = importlib.import_module(MODULE)
    if getattr(original, "_batchocr_rswa_tiles", False):
        return
    prefill = prefill_sizes()
    module = patched_module(original, prefill)
    original.kernel_unified_attention = module.kernel_unified_attention
    if prefill:  # the backend calls the launcher it imported by name: the rewritten one there
        importlib.import_module(BACKEND).unified_attention = module.unified_attention
    original._batchocr_rswa_tiles = True


def tiles_read(seq_len: int, prefix: int, first_query: int, window: int, tile: int) -> int:
    """Tiles of a query block the patched loop reads (the loop's arithmetic, for tests and
    estimates): those below the prompt's end or reaching the first query's window."""
    tiles = -(-seq_len // tile)
    first_key = first_query - window + 1
    return sum(1 for j in range(tiles) if j * tile < prefix or (j + 1) * tile > first_key)


# The presets whose models attend with R-SWA.
PRESETS = ("unlimited-ocr",)
# Named by worker_extension_cls, with the other patches an engine asks for (one extension a worker).
EXTENSIONS = {
    (False, False): f"{__name__}.RswaTilesExtension",
    (True, False): f"{__name__}.RswaTilesEncoderExtension",
    (False, True): f"{__name__}.RswaTilesSamplerExtension",
    (True, True): f"{__name__}.RswaTilesEncoderSamplerExtension",
}


def extension(encoder: bool, sampler: bool) -> str:
    """The worker extension for the rewritten kernel, with the batched encoder and the sampler's
    n-gram bans where those are asked for too."""
    return EXTENSIONS[(encoder, sampler)]


# The extensions install when vLLM asks for them, and only then (workerext.py): the
# kernel, then the batched encoder and the sampler's bans where the name asks for them.
__getattr__ = workerext.resolver(__name__, {
    full.rsplit(".", 1)[1]: ("rswa_tiles",) + (("deepencoder",) if encoder else ()) + (("ngram_sampler",) if sampler else ())
    for (encoder, sampler), full in EXTENSIONS.items()})

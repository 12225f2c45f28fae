"""batchocr.engines.vllm.patches.rswa_tiles' kernel against vLLM's own, on the same R-SWA attention inputs.

    python3 bench/gpu/check_rswa_tiles.py --json rswa.json                  # the GPU, vLLM installed
    python3 bench/gpu/check_rswa_tiles.py --prefill-tiles 50 --json t.json  # + prefill launch sizes, timed
    TRITON_INTERPRET=1 python bench/gpu/check_rswa_tiles.py --device cpu \\
        --vllm-src .gpu/build/site --json rswa.json                         # a CPU: Triton's interpreter

Decode requests (one query each) and one prefill request, Unlimited-OCR's heads (10 x 128) and
window (128), prompts of a page's length, KV in vLLM's paged layout with shuffled blocks; each
request's output through vLLM's `unified_attention` twice, with its kernel and with the rewritten
one, in the one-pass (2D) and the split (3D) launch. Also a plain torch reference (softmax over
the keys R-SWA lets a query see). Reports the largest differences (and whether the 2D outputs
are identical: on the CPU's interpreter they are), the tiles each kernel reads, and on the GPU
the kernel's time both ways. Exit 1 where a difference is over tolerance (1e-4 float32 on a CPU,
2e-2 bf16 on the GPU).

`--prefill-tiles N`: a page-mode prefill step's attention (10 pages of 906 tokens, alone and beside
246 decodes) under vLLM's launch sizes for a prefill (16-row query blocks for Unlimited-OCR's one
query a KV head, 32-key tiles) and larger ones (`launcher`): the same output, ms a call.

On a CPU without vLLM's dependencies, --vllm-src names a folder holding vLLM's source (the kit's
staged site-packages): the two kernel files load from there, with the few vLLM names they import
(envs, logger, platform, triton_utils, KVQuantMode) stood in for.
"""

from __future__ import annotations

import argparse
import enum
import importlib.util
import json
import sys
import time
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

HEADS, HEAD_SIZE, WINDOW, BLOCK = 10, 128, 128, 16


def stand_in_vllm(src: Path) -> None:
    """vLLM's two kernel modules from `src`, the rest of vLLM stood in for (CPU checks only)."""
    import torch
    import triton
    import triton.language as tl

    def module(name, **attrs):
        m = types.ModuleType(name)
        m.__path__ = []  # a package, so that submodules resolve
        m.__dict__.update(attrs)
        sys.modules[name] = m
        return m

    class KVQuantMode(enum.IntEnum):  # vllm/v1/kv_cache_interface.py's, as 0.26 has it
        NONE = 0
        FP8_PER_TENSOR = 1
        INT8_PER_TOKEN_HEAD = 2
        FP8_PER_TOKEN_HEAD = 3
        INT4_PER_TOKEN_HEAD = 4
        NVFP4 = 5

    platform = types.SimpleNamespace(fp8_dtype=lambda: torch.float8_e4m3fn,
                                     is_device_capability_family=lambda *a: False)
    import logging

    for name in ("vllm", "vllm.v1", "vllm.v1.attention", "vllm.v1.attention.ops"):
        module(name)
    module("vllm.envs", VLLM_BATCH_INVARIANT=False)
    module("vllm.logger", init_logger=logging.getLogger)
    module("vllm.platforms", current_platform=platform)
    module("vllm.triton_utils", tl=tl, triton=triton)
    module("vllm.v1.kv_cache_interface", KVQuantMode=KVQuantMode)
    for name in ("triton_attention_helpers", "triton_unified_attention"):
        full = f"vllm.v1.attention.ops.{name}"
        spec = importlib.util.spec_from_file_location(full, src / "vllm/v1/attention/ops" / f"{name}.py")
        m = importlib.util.module_from_spec(spec)
        sys.modules[full] = m
        spec.loader.exec_module(m)


def inputs(torch, device, decode_lens, prompts, prefill, seed=0):
    """q, a paged KV cache, block tables and R-SWA prompt lengths for decode requests of
    `decode_lens` tokens (prompt `prompts[i]`) and prefill requests of `prefill` tokens each
    (their whole prompts; an int: one, or none where 0), in bf16 on the GPU, float32 on a CPU."""
    g = torch.Generator().manual_seed(seed)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    prefills = [n for n in ([prefill] if isinstance(prefill, int) else prefill) if n]
    seq_lens = list(decode_lens) + prefills
    q_lens = [1] * len(decode_lens) + prefills
    prefix = list(prompts) + prefills
    blocks = [-(-n // BLOCK) for n in seq_lens]
    total = sum(blocks) + 4
    order = torch.randperm(total, generator=g).tolist()  # blocks anywhere in the cache
    table = torch.zeros(len(seq_lens), max(blocks), dtype=torch.int32)
    at = 0
    for i, b in enumerate(blocks):
        table[i, :b] = torch.tensor(order[at:at + b], dtype=torch.int32)
        at += b
    k = torch.randn(total, BLOCK, HEADS, HEAD_SIZE, generator=g).to(dtype)
    v = torch.randn(total, BLOCK, HEADS, HEAD_SIZE, generator=g).to(dtype)
    q = torch.randn(sum(q_lens), HEADS, HEAD_SIZE, generator=g).to(dtype)
    cu = torch.tensor([0] + list(torch.tensor(q_lens).cumsum(0).tolist()), dtype=torch.int32)
    t = lambda x: x.to(device)  # noqa: E731
    return dict(q=t(q), k=t(k), v=t(v), cu=t(cu), seq_lens=t(torch.tensor(seq_lens, dtype=torch.int32)),
                table=t(table), prefix=t(torch.tensor(prefix, dtype=torch.int32)),
                q_lens=q_lens, seq_lens_host=seq_lens, prefix_host=prefix)


def launcher(ops, block_m: int, tile: int, warps: int | None):
    """vLLM's unified_attention whose launches with a prefill (a query of more than one token) take
    query blocks of `block_m` rows, key tiles of `tile` and `warps` warps (rswa_tiles.prefill_launch:
    vLLM's are 16 rows and 32 keys for Unlimited-OCR's one query a KV head, sizes made for decode);
    its kernel the rswa_tiles rewrite's, as batchocr's engine runs it."""
    from batchocr.engines.vllm.patches import rswa_tiles

    return rswa_tiles.patched_module(ops, (block_m, tile, warps))


def attend(ops, torch, x, kernel, split: bool):
    """vLLM's unified_attention with `kernel` in its module's place."""
    saved = ops.kernel_unified_attention
    ops.kernel_unified_attention = kernel
    try:
        out = torch.empty_like(x["q"])
        extra = {}
        if split:  # the 3D launch: decode only, segments' partial sums then reduced
            segs, n = 4, len(x["q_lens"])
            extra = dict(seq_threshold_3D=n, num_par_softmax_segments=segs,
                         softmax_segm_output=torch.empty(x["q"].shape[0], HEADS, segs, HEAD_SIZE,
                                                         dtype=torch.float32, device=out.device),
                         softmax_segm_max=torch.empty(x["q"].shape[0], HEADS, segs, dtype=torch.float32,
                                                      device=out.device),
                         softmax_segm_expsum=torch.empty(x["q"].shape[0], HEADS, segs, dtype=torch.float32,
                                                         device=out.device))
        ops.unified_attention(q=x["q"], k=x["k"], v=x["v"], out=out, cu_seqlens_q=x["cu"],
                              max_seqlen_q=max(x["q_lens"]), seqused_k=x["seq_lens"],
                              max_seqlen_k=max(x["seq_lens_host"]), softmax_scale=HEAD_SIZE ** -0.5,
                              causal=True, window_size=(-1, -1), block_table=x["table"], softcap=0,
                              q_descale=None, k_descale=None, v_descale=None,
                              rswa_prefix_lens=x["prefix"], rswa_window=WINDOW, **extra)
        return out
    finally:
        ops.kernel_unified_attention = saved


def reference(torch, x):
    """Softmax over the keys R-SWA shows each query: prompt keys, and the last WINDOW keys."""
    outs = []
    table, k, v = x["table"].cpu(), x["k"].float().cpu(), x["v"].float().cpu()
    q_at = 0
    for i, (ql, sl, pl) in enumerate(zip(x["q_lens"], x["seq_lens_host"], x["prefix_host"])):
        blocks = table[i, :-(-sl // BLOCK)].long()
        keys = k[blocks].reshape(-1, HEADS, HEAD_SIZE)[:sl]
        vals = v[blocks].reshape(-1, HEADS, HEAD_SIZE)[:sl]
        q = x["q"][q_at:q_at + ql].float().cpu()
        pos_q = torch.arange(sl - ql, sl)[:, None]
        pos_k = torch.arange(sl)[None, :]
        seen = (pos_k <= pos_q) & ((pos_k < pl) | (pos_q - pos_k < WINDOW))
        s = torch.einsum("qhd,khd->hqk", q, keys) * HEAD_SIZE ** -0.5
        s = s.masked_fill(~seen[None], float("-inf"))
        outs.append(torch.einsum("hqk,khd->qhd", s.softmax(-1), vals))
        q_at += ql
    return torch.cat(outs)


def prefill_tiles(ops, torch, device, calls: int, report: dict, tol: float) -> bool:
    """The rswa_tiles kernel under vLLM's launch sizes (16-row query blocks, 32-key tiles) and
    under larger ones, on two steps: 10 prefills of a page's 906 tokens, and the same with 246
    decodes beside them (their prompts 903, up to ~2,000 generated), as a page-mode step admits
    them. The same output (max |difference| <= tol) and ms a call for each."""
    decodes = [903 + 64 + (i * 1936) // 246 for i in range(246)]
    steps = {"prefill10": inputs(torch, device, [], [], [906] * 10, seed=3),
             "mixed": inputs(torch, device, decodes, [903] * 246, [906] * 10, seed=4)}
    variants = [(16, 32, None), (32, 64, 4), (64, 64, 4), (64, 64, 8), (64, 128, 8), (128, 64, 8), (128, 128, 8)]
    out, ok = {}, True
    for name, x in steps.items():
        base = None
        for bm, tile, warps in variants:
            key = f"m{bm}_t{tile}_w{warps or 'auto'}"
            try:
                mod = launcher(ops, bm, tile, warps)
                run = lambda: attend(mod, torch, x, mod.kernel_unified_attention, False)  # noqa: E731
                o = run()
                base = o if base is None else base
                diff = float((o.float() - base.float()).abs().max())
                for _ in range(3):
                    run()
                torch.cuda.synchronize()
                t = time.perf_counter()
                for _ in range(calls):
                    run()
                torch.cuda.synchronize()
                out[f"{name}_{key}"] = {"ms": round((time.perf_counter() - t) * 1e3 / calls, 3), "max_abs_diff": diff}
                ok &= diff <= tol
            except Exception as exc:  # noqa: BLE001 - a size Triton cannot build is a finding, not the end
                out[f"{name}_{key}"] = {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
    report["prefill_tiles"] = out
    return ok


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--vllm-src", type=Path, help="vLLM's source folder, where vLLM cannot be imported (CPU)")
    ap.add_argument("--decode", type=int, default=6, help="decode requests")
    ap.add_argument("--prompt", type=int, default=273, help="their prompt length (273: a base-mode page)")
    ap.add_argument("--output", type=int, default=400, help="the longest's generated tokens so far")
    ap.add_argument("--prefill", type=int, default=96, help="a prefill request's tokens (0: none)")
    ap.add_argument("--time", type=int, default=0, help="GPU: time each kernel over N calls at 256 requests")
    ap.add_argument("--prefill-tiles", type=int, default=0,
                    help="GPU: N calls of a prefill step (10 pages of 906 tokens, with and without 246 decodes) "
                         "under launch sizes other than vLLM's for prefill (query block, key tile, warps)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    import torch

    if args.vllm_src:
        stand_in_vllm(args.vllm_src)
    from vllm.v1.attention.ops import triton_unified_attention as ops

    from batchocr.engines.vllm.patches import rswa_tiles

    original = ops.kernel_unified_attention
    patched = rswa_tiles.patched_module(ops).kernel_unified_attention
    device = torch.device(args.device)
    lens = [args.prompt + max(1, args.output * (i + 1) // args.decode) for i in range(args.decode)]
    x = inputs(torch, device, lens, [args.prompt] * args.decode, args.prefill)
    report = {"device": str(device), "decode_seq_lens": lens, "prompt": args.prompt, "prefill": args.prefill,
              "window": WINDOW, "heads": HEADS, "head_size": HEAD_SIZE}
    ref = reference(torch, x)
    a, b = attend(ops, torch, x, original, False), attend(ops, torch, x, patched, False)
    report["2d_identical"] = bool(torch.equal(a, b))
    report["2d_max_abs_diff"] = float((a.float() - b.float()).abs().max())
    report["2d_vs_reference_max_abs"] = float((b.float().cpu() - ref).abs().max())
    report["vllm_vs_reference_max_abs"] = float((a.float().cpu() - ref).abs().max())
    xd = inputs(torch, device, lens, [args.prompt] * args.decode, 0, seed=1)  # 3D: decode only
    a3, b3 = attend(ops, torch, xd, original, True), attend(ops, torch, xd, patched, True)
    report["3d_max_abs_diff"] = float((a3.float() - b3.float()).abs().max())
    report["3d_vs_reference_max_abs"] = float((b3.float().cpu() - reference(torch, xd)).abs().max())
    tile = ops._get_tile_size(HEAD_SIZE, 0, x["q"].element_size(), is_prefill=False)  # the decode tiles vLLM uses
    report["tiles_read_decode"] = {"vllm": sum(-(-n // tile) for n in lens),
                                   "patched": sum(rswa_tiles.tiles_read(n, args.prompt, n - 1, WINDOW, tile)
                                                  for n in lens)}
    tol = 2e-2 if device.type == "cuda" else 1e-4
    # identical on the CPU's interpreter; compiled for the GPU the two kernels may round apart
    ok = ((report["2d_identical"] or report["2d_max_abs_diff"] <= tol) and report["3d_max_abs_diff"] <= tol
          and report["2d_vs_reference_max_abs"] <= tol and report["3d_vs_reference_max_abs"] <= tol)
    if args.time and device.type == "cuda":  # 256 page-mode decodes: 903 prompt tokens, up to 2,000 generated
        n = 256
        tl_lens = [903 + 64 + (i * 1936) // n for i in range(n)]
        xt = inputs(torch, device, tl_lens, [903] * n, 0, seed=2)
        for name, kernel in (("vllm", original), ("patched", patched), ("vllm", original), ("patched", patched)):
            attend(ops, torch, xt, kernel, False)
            torch.cuda.synchronize()
            t = time.perf_counter()
            for _ in range(args.time):
                attend(ops, torch, xt, kernel, False)
            torch.cuda.synchronize()
            report[f"ms_{name}_256"] = round((time.perf_counter() - t) * 1e3 / args.time, 3)
    if args.prefill_tiles and device.type == "cuda":
        ok &= prefill_tiles(ops, torch, device, args.prefill_tiles, report, tol)
    report["same"] = bool(ok)
    print(json.dumps(report, indent=1))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()

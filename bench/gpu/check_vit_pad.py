"""batchocr.engines.vllm.patches.vitpad on vLLM's real Qwen2.5-VL vision tower (random weights, the layout's config):
the same output before and after its MLPs are padded, each one's ms a page, and the kernels each
ran (profiled: whether the Ampere `cutlass_80_*` GEMM is gone).

    python3 bench/gpu/check_vit_pad.py /tmp/models/qwen2.5-vl-7b --pages 4 --json vitpad.json   # on the GPU

Pages of 896x1288 (64 x 92 patches of 14, 1,472 tokens after the 2x2 merge), as throughput.py
renders them. Exit 1 where the output differs beyond bf16's rounding. Needs vLLM (the kit's)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from check_encoder_batch import compare, enter_vllm, profiled, timed  # noqa: E402

from batchocr.engines.vllm.patches import vitpad  # noqa: E402


def build(model_dir: str, device: str, dtype):
    import torch
    from transformers import AutoConfig

    enter_vllm(device, port=29518)
    from vllm.model_executor.models.qwen2_5_vl import Qwen2_5_VisionTransformer

    config = AutoConfig.from_pretrained(model_dir)
    torch.set_default_dtype(dtype)
    torch.manual_seed(0)
    # built as check_encoder_batch builds its modules (on the host, then moved), in the default dtype
    # the vision attention's backend is chosen for
    visual = Qwen2_5_VisionTransformer(config.vision_config, norm_eps=getattr(config, "rms_norm_eps", 1e-6),
                                       prefix="visual")
    for p in visual.parameters():  # vLLM's layers allocate without initialising
        p.data.normal_(0, 0.02)
    return visual.to(device=device, dtype=dtype).eval(), config


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", help="the layout's folder (make_models.py): its config.json")
    ap.add_argument("--pages", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--json")
    args = ap.parse_args()
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    visual, config = build(args.model, device, dtype)
    vc = config.vision_config
    rows, cols = 1288 // vc.patch_size, 896 // vc.patch_size
    grid = [[1, rows, cols]] * args.pages
    patch = vc.in_channels * vc.temporal_patch_size * vc.patch_size ** 2
    g = torch.Generator().manual_seed(1)
    x = torch.randn(args.pages * rows * cols, patch, generator=g).to(device, dtype)
    repeats = args.repeats if device == "cuda" else 1
    with torch.inference_mode():
        run = lambda: visual(x, grid)  # noqa: E731
        ref = run()
        before_s = timed(run, device, repeats)
        before_prof = profiled(run, device)
        padded = sum(vitpad.pad_mlp(block.mlp) for block in visual.blocks)
        got = run()
        after_s = timed(run, device, repeats)
        after_prof = profiled(run, device)
    tol = 3e-2 if dtype == torch.bfloat16 else 1e-4
    errors, same = compare([ref], [got], tol)

    def ampere(summary):  # the Ampere GEMMs' ms and calls in one profiled call
        rows = [r for r in summary.get("top_ms", []) if r[0] == "kernel" and "cutlass_80" in r[1]]
        return {"ms": round(sum(r[2] for r in rows), 2), "calls": sum(r[3] for r in rows)}

    report = {"device": device, "dtype": str(dtype), "pages": args.pages, "grid": grid[0],
              "inner_size": vc.intermediate_size, "padded_to": vitpad.padded(vc.intermediate_size),
              "mlps_padded": padded, "relative_error_max": errors, "tolerance": tol, "same": same,
              "ms_a_page_before": round(before_s * 1000 / args.pages, 2),
              "ms_a_page_after": round(after_s * 1000 / args.pages, 2),
              "speedup": round(before_s / after_s, 3), "repeats": repeats,
              "ampere_gemm_before": ampere(before_prof), "ampere_gemm_after": ampere(after_prof),
              "profile_before": before_prof, "profile_after": after_prof}
    print(json.dumps({k: v for k, v in report.items() if not k.startswith("profile_")}), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())

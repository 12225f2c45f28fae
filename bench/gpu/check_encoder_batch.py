"""batchocr.engines.vllm.patches.deepencoder's batched encoder against vLLM's own `_pixel_values_to_embedding`, on
vLLM's real modules (SAM ViT-B, DeepSeek's CLIP-L, the projector) with random weights: the same
embeddings for every image, and what each costs a page.

    python3 bench/gpu/check_encoder_batch.py --pages 16 --json enc.json        # on the GPU (bf16)
    python3 bench/gpu/check_encoder_batch.py --pages 16 --profile --compile    # + where it goes, compiled
    python3 bench/gpu/check_encoder_batch.py --pages 16 --sam-attn fold,fold-pad --profile  # + SAM's bias folded in
    PYTHONPATH=/tmp/vsite python bench/gpu/check_encoder_batch.py --pages 3    # CPU, float32: slow

`--profile`: one batched call under torch's profiler, summed as throughput.py sums a run's
profile (its kernels by name, the device's busy share of the call): whether a page's ~20 ms is
arithmetic or launches. `--compile`: the batched encoder again with SAM, CLIP and the projector
under torch.compile (dynamic batch), its embeddings checked against vLLM's too, its ms a page and
its first call's seconds (the compile, paid once at an engine's start). `--sam-attn MODES`:
the batched encoder again with SAM's relative-position bias folded into its attention's dot
products (batchocr.engines.vllm.patches.samattn) instead of made in full for PyTorch's
memory-efficient kernel, in each mode (fold, fold-pad): its embeddings against vLLM's, its ms a
page, its first call.
`--pixels-u8`: views as bytes (random ones) through batchocr.engines.vllm.patches.pixels'
`embed_multimodal` against the same views as vLLM's processor makes them (floats in the model's
dtype) through vLLM's own: the same embeddings, bit for bit.

The pages mix tilings as A4 pages and small images do: (2 x 3) crops mostly, some (1 x 1) (no
crops), one (3 x 2) and one (2 x 2). Exit 1 where an image's embedding differs (beyond
bf16's rounding on the GPU). Needs vLLM (the kit's on the GPU)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from batchocr.engines.vllm.patches import deepencoder  # noqa: E402

_CONTEXT = None


def enter_vllm(device: str, port: int = 29517) -> None:
    """vLLM's config context, entered for the script's life and not left: the modules are built
    and run inside it, as in its worker (an attention backend may look the config up when it
    runs); and its distributed state for one process (its parallel layers ask for it)."""
    from vllm.config import DeviceConfig, VllmConfig, set_current_vllm_config
    from vllm.distributed import parallel_state

    global _CONTEXT  # held: a context manager collected would leave the context
    _CONTEXT = set_current_vllm_config(VllmConfig(device_config=DeviceConfig(device=device)))
    _CONTEXT.__enter__()
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.init_distributed_environment(world_size=1, rank=0, local_rank=0,
                                                    distributed_init_method=f"tcp://127.0.0.1:{port}", backend="gloo")
        parallel_state.initialize_model_parallel(1, 1)


def build(device: str, dtype):
    import torch
    from transformers import CLIPVisionConfig

    enter_vllm(device)
    from vllm.model_executor.models import deepseek_ocr
    from vllm.model_executor.models.deepencoder import DeepCLIPVisionTransformer, build_sam_vit_b
    from vllm.model_executor.models.deepseek_vl2 import MlpProjector
    from vllm.transformers_utils.configs.deepseek_vl2 import MlpProjectorConfig

    cls = deepseek_ocr.DeepseekOCRForCausalLM

    class Encoder(torch.nn.Module):
        """The encoder's part of DeepseekOCRForCausalLM, built as its __init__ builds it."""
        _encode_global_features = cls._encode_global_features
        _encode_local_features = cls._encode_local_features
        _assemble_patch_grid = cls._assemble_patch_grid
        vllm_embedding = cls._pixel_values_to_embedding
        batched_embedding = deepencoder.pixel_values_to_embedding
        # vLLM's way in from a step's kwargs, with the batched encoder as the engine runs it (--pixels-u8)
        _parse_and_validate_image_input = cls._parse_and_validate_image_input
        _process_image_input = cls._process_image_input
        embed_multimodal = cls.embed_multimodal
        _pixel_values_to_embedding = deepencoder.pixel_values_to_embedding

        def __init__(self):
            super().__init__()
            self.sam_model = build_sam_vit_b()
            self.vision_model = DeepCLIPVisionTransformer(config=CLIPVisionConfig(
                hidden_size=1024, intermediate_size=4096, num_attention_heads=16, num_hidden_layers=24,
                image_size=224, patch_size=14, projection_dim=512, layer_norm_eps=1e-5))
            self.projector = MlpProjector(MlpProjectorConfig(projector_type="linear", input_dim=2048, n_embed=1280))
            self.image_newline = torch.nn.Parameter(torch.randn(1280) / 1280 ** 0.5)
            self.view_seperator = torch.nn.Parameter(torch.randn(1280) / 1280 ** 0.5)

    torch.manual_seed(0)
    model = Encoder()
    for p in model.parameters():  # vLLM's layers allocate without initialising
        p.data.normal_(0, 0.02)
    return model.to(device=device, dtype=dtype).eval()


def tilings(pages: int) -> list[tuple[int, int]]:
    out = [(2, 3)] * pages
    for i, t in zip(range(1, pages), [(1, 1), (3, 2), (2, 2), (1, 1)]):
        out[i] = t
    return out


def timed(fn, device: str, repeats: int) -> float:
    import torch

    fn()  # warm-up
    best = float("inf")
    for _ in range(repeats):
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    return best


def profiled(fn, device: str) -> dict:
    """One call of fn under torch's profiler, its trace summed by trace_summary (throughput.py's)."""
    import tempfile

    import torch
    from torch.profiler import ProfilerActivity, profile

    from throughput import trace_summary

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    fn()  # warm-up
    if device == "cuda":
        torch.cuda.synchronize()
    with profile(activities=activities) as prof:
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "encoder.pt.trace.json"
        prof.export_chrome_trace(str(trace))
        summary = trace_summary(trace, top=25)
    kernel_ms = summary.get("ms_by_category", {}).get("kernel", 0.0)
    summary["device_busy_share"] = round(kernel_ms / summary["span_ms"], 3) if summary.get("span_ms") else None
    return summary


def compare(ref, got, tol: float) -> tuple[list, bool]:
    errors = []
    for r, o in zip(ref, got):
        if r.shape != o.shape:
            errors.append(f"shape {tuple(o.shape)} != {tuple(r.shape)}")
            continue
        errors.append(round(float((r.float() - o.float()).abs().max() / r.float().abs().max()), 6))
    return errors, len(ref) == len(got) and all(isinstance(e, float) and e <= tol for e in errors)


def again(name: str, batched, ref, tol: float, device: str, repeats: int, batched_s: float, pages: int,
          profile: bool) -> dict:
    """The batched encoder once more as it now is (a variant: its attention rewritten, its modules
    compiled): its first call's seconds (a compile, paid once at an engine's start), its embeddings
    against vLLM's, its ms a page and speedup over the plain batched call, as NAME_* keys."""
    import torch

    t0 = time.perf_counter()
    got = batched()
    if device == "cuda":
        torch.cuda.synchronize()
    first_s = time.perf_counter() - t0
    errors, same = compare(ref, got, tol)
    seconds = timed(batched, device, repeats)
    out = {f"{name}_relative_error_max": errors, f"{name}_same": same, f"{name}_first_call_s": round(first_s, 1),
           f"{name}_ms_a_page": round(seconds * 1000 / pages, 2), f"{name}_speedup": round(batched_s / seconds, 3)}
    if profile:
        out[f"{name}_profile"] = profiled(batched, device)
    return out


def pixels_u8(model, spatial, crops: int, device: str, dtype) -> dict:
    """Views as bytes through patches.pixels' embed_multimodal against the same views as vLLM's
    processor makes them (model_input: ImageTransform's floats cast to the model's dtype, as
    check_pixels.py shows) through vLLM's: the same embeddings, bit for bit."""
    import torch

    from batchocr.engines.vllm.patches import pixels

    g = torch.Generator().manual_seed(2)
    raw = {"pixel_values": torch.randint(0, 256, (len(spatial), 3, 1024, 1024), generator=g, dtype=torch.uint8),
           "images_crop": torch.randint(0, 256, (crops, 3, 640, 640), generator=g, dtype=torch.uint8)}
    raw = {k: v.to(device) for k, v in raw.items()}
    floats = {k: pixels.model_input(v, dtype) for k, v in raw.items()}
    shape = {"images_spatial_crop": torch.tensor(spatial, dtype=torch.long, device=device)}
    ref = model.embed_multimodal(**floats, **shape)
    pixels.install_model()  # vLLM's embed_multimodal put aside: the wrapper calls it after the bytes' conversion
    try:
        got = pixels.embed_multimodal(model, **raw, **shape)
    finally:
        pixels.uninstall()
    equal = len(ref) == len(got) and all(torch.equal(a, b) for a, b in zip(ref, got))
    return {"pixels_u8_same": equal, "pixels_u8_images": len(ref)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pages", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--profile", action="store_true", help="one batched call profiled: its kernels, the device's busy share")
    ap.add_argument("--compile", action="store_true", help="the batched encoder under torch.compile too")
    ap.add_argument("--sam-attn", default="",
                    help="the batched encoder again with SAM's bias folded into its attention (patches.samattn), "
                         "in each of these modes: e.g. fold,fold-pad")
    ap.add_argument("--pixels-u8", action="store_true",
                    help="views as bytes through patches.pixels' embed_multimodal against vLLM's floats: equal embeddings")
    ap.add_argument("--json")
    args = ap.parse_args()
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = build(device, dtype)
    spatial = tilings(args.pages)
    crops = sum(deepencoder.tile_counts([list(t) for t in spatial]))
    g = torch.Generator().manual_seed(1)
    pixel_values = torch.randn(args.pages, 3, 1024, 1024, generator=g).to(device, dtype)
    images_crop = torch.randn(crops, 3, 640, 640, generator=g).to(device, dtype)
    images_spatial_crop = torch.tensor(spatial, dtype=torch.long, device=device)
    with torch.inference_mode():
        ref = model.vllm_embedding(pixel_values, images_crop, images_spatial_crop)
        got = model.batched_embedding(pixel_values, images_crop, images_spatial_crop)
        tol = 3e-2 if dtype == torch.bfloat16 else 1e-4
        errors, same = compare(ref, got, tol)
        repeats = args.repeats if device == "cuda" else 1
        batched = lambda: model.batched_embedding(pixel_values, images_crop, images_spatial_crop)  # noqa: E731
        vllm_s = timed(lambda: model.vllm_embedding(pixel_values, images_crop, images_spatial_crop), device, repeats)
        batched_s = timed(batched, device, repeats)
        report = {"device": device, "dtype": str(dtype), "pages": args.pages, "crops": crops, "tilings": spatial,
                  "tokens": [int(r.shape[0]) for r in ref], "relative_error_max": errors, "tolerance": tol,
                  "same": same, "vllm_ms_a_page": round(vllm_s * 1000 / args.pages, 2),
                  "batched_ms_a_page": round(batched_s * 1000 / args.pages, 2),
                  "speedup": round(vllm_s / batched_s, 3), "repeats": repeats}
        if args.profile:
            report["batched_profile"] = profiled(batched, device)
        variant = lambda name: again(name, batched, ref, tol, device, repeats, batched_s,  # noqa: E731
                                     args.pages, args.profile)
        for mode in filter(None, args.sam_attn.split(",")):
            from batchocr.engines.vllm.patches import samattn

            samattn.install(mode)
            report |= variant("sam_" + mode.replace("-", "_"))
            samattn.uninstall()
        if args.pixels_u8:
            report |= pixels_u8(model, spatial, crops, device, dtype)
        if args.compile:
            for name in ("sam_model", "vision_model", "projector"):  # the same weights, compiled forwards
                setattr(model, name, torch.compile(getattr(model, name), dynamic=True))
            report |= variant("compiled")
    print(json.dumps(report), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return 0 if same and all(v for k, v in report.items() if k.endswith("_same")) else 1  # pixels_u8_same too


if __name__ == "__main__":
    sys.exit(main())

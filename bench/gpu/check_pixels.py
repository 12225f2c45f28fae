"""batchocr.engines.vllm.patches.pixels against vLLM's own processor: DeepSeek-OCR's and
Unlimited-OCR's views of real pages as bytes, made the model's input (`model_input`), against
the floats vLLM's ImageTransform makes and casts to the model's dtype: the same tensor, value for
value, for every view of every page, and the bytes a page hands over either way.

    python3 bench/gpu/check_pixels.py --json pixels.json                       # the GPU (the kit's vLLM)
    PYTHONPATH=/tmp/vsite python bench/gpu/check_pixels.py                    # CPU

The pages: samples/'s documents rendered as the engine renders them (PyMuPDF, the preset's
render hints), a page small enough for no crops (its empty crops must stay bytes so that a
step's views concatenate), document mode's request of three pages (base views of 1024, no
crops), and the views of two pages concatenated as vLLM batches a step.
`model_input` runs on the GPU where there is one. The processor's tokenizer is a stand-in
(only the image tokens' count matters here). Exit 1 where any value differs."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from batchocr.engines.vllm.patches import pixels  # noqa: E402


class _Tokenizer:
    """What tokenize_with_images asks of a tokenizer."""

    bos_token_id, eos_token_id, pad_token_id = 0, 1, 2
    vocab = {"<image>": 100}

    def encode(self, text, add_special_tokens=False):
        return [3 + (ord(c) % 90) for c in text]


def processor():
    """vLLM's DeepseekOCRProcessor as its __init__ sets it up (defaults), the tokenizer a stand-in."""
    from vllm.transformers_utils.processors.deepseek_ocr import DeepseekOCRProcessor, ImageTransform

    p = DeepseekOCRProcessor.__new__(DeepseekOCRProcessor)
    p.image_size, p.base_size, p.max_crops, p.strategy = 640, 1024, 6, "v1"
    p.patch_size, p.downsample_ratio = 16, 4
    p.image_mean = p.image_std = (0.5, 0.5, 0.5)
    p.normalize = True
    p.image_transform = ImageTransform(mean=p.image_mean, std=p.image_std, normalize=True)
    p.tokenizer = _Tokenizer()
    p.image_token, p.image_token_id, p.ignore_id = "<image>", 100, -100
    return p


def pages() -> list:
    """Real pages as the engine hands them to vLLM (RGB images), and one small image."""
    import pymupdf
    from PIL import Image

    out = []
    for name in ("report.pdf", "scanned.pdf"):
        with pymupdf.open(ROOT / "samples" / name) as doc:
            for page in doc:
                pix = page.get_pixmap(dpi=144)
                out.append((f"{name}#{page.number}", Image.frombytes("RGB", (pix.width, pix.height), pix.samples)))
    for name in ("receipt.png", "letter.jpg", "fax.tiff"):
        with Image.open(ROOT / "samples" / name) as im:
            out.append((name, im.convert("RGB")))
    small = out[0][1].resize((600, 480))
    out.append(("small (no crops)", small))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json")
    args = ap.parse_args()
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16
    proc, prompt = processor(), "<image>\nFree OCR."
    report = {"device": device, "dtype": str(dtype), "pages": []}
    same, views = True, {}
    for name, image in pages():
        t0 = time.perf_counter()
        stock = [x.to(dtype) for x in proc.tokenize_with_images(prompt, [image], cropping=True)[1:3]]
        stock_s = time.perf_counter() - t0
        pixels.install_processor()
        try:
            t0 = time.perf_counter()
            raw = proc.tokenize_with_images(prompt, [image], cropping=True)[1:3]
            raw_s = time.perf_counter() - t0
        finally:
            pixels.uninstall()
        made = [pixels.model_input(x.to(device), dtype).cpu() for x in raw]
        equal = all(torch.equal(a, b) for a, b in zip(stock, made))
        dtypes = [str(x.dtype) for x in raw]
        same &= equal and dtypes == ["torch.uint8"] * 2
        views[name] = raw
        report["pages"].append({
            "page": name, "size": list(image.size), "views": [int(x.shape[0]) for x in raw], "dtypes": dtypes,
            "equal": equal, "bytes_vllm": sum(x.numel() * x.element_size() for x in stock),
            "bytes_u8": sum(x.numel() * x.element_size() for x in raw),
            "processor_ms_vllm": round(stock_s * 1e3, 1), "processor_ms_u8": round(raw_s * 1e3, 1)})
        print(json.dumps(report["pages"][-1]), flush=True)
    # document mode's request: several pages in one, base views only (vLLM's processor turns crops off
    # for several images; the preset's document requests ask for the 1024 view)
    pages_of = [image for name, image in pages()[:3]]
    proc.image_size, prompt_n = 1024, "<image>" * len(pages_of) + "\ndocument parsing."
    stock = [x.to(dtype) for x in proc.tokenize_with_images(prompt_n, pages_of, cropping=False)[1:3]]
    pixels.install_processor()
    try:
        raw = proc.tokenize_with_images(prompt_n, pages_of, cropping=False)[1:3]
    finally:
        pixels.uninstall()
        proc.image_size = 640
    made = [pixels.model_input(x.to(device), dtype).cpu() for x in raw]
    equal = all(torch.equal(a, b) for a, b in zip(stock, made)) and all(x.dtype == torch.uint8 for x in raw)
    report["document"] = {"pages": len(pages_of), "views": [int(x.shape[0]) for x in raw], "equal": equal}
    print(json.dumps(report["document"]), flush=True)
    same &= equal
    # a step's views of a page with crops and one without, concatenated as vLLM's _reduce_data does
    crops = torch.cat([views["report.pdf#0"][1], views["small (no crops)"][1]])
    report["concatenated_dtype"] = str(crops.dtype)
    same &= crops.dtype == torch.uint8
    report["same"] = same
    print(json.dumps({k: v for k, v in report.items() if k != "pages"}), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())

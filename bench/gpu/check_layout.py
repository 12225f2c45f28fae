"""vLLM's own classes load make_models.py's unlimited-ocr folder, with no GPU: its config
(UnlimitedOCRConfig through vLLM's ModelConfig: architecture, head size, KV heads, R-SWA
window, context), its tokenizer (bos, eos, pad, `<image>`, the grounding tokens, `<page>`) and
its multimodal processor (UnlimitedOCRMultiModalProcessor, the path a request takes), run on
real rendered pages: an A4 and a Letter page in page mode (crops), and a 3-page document in one
request (no crops). The image tokens in each prompt must equal
UnlimitedOCRProcessingInfo.get_num_image_tokens; the KV a token costs is computed from the
config.

    python bench/gpu/make_models.py /tmp/models unlimited-ocr
    python bench/gpu/check_layout.py /tmp/models/unlimited-ocr [--max-side 1280] [--json out.json]

Needs vLLM >= 0.26 and PyMuPDF; exits 1 when a check fails.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def render(width_pt: float, height_pt: float, max_side: int, text: str):
    """One real page (PyMuPDF), rendered so that its longest side is max_side pixels."""
    import pymupdf
    from PIL import Image

    doc = pymupdf.open()
    page = doc.new_page(width=width_pt, height=height_pt)
    if page.insert_textbox(pymupdf.Rect(50, 50, width_pt - 50, height_pt - 50), text, fontsize=9) < 0:
        raise ValueError("the text does not fit on the page (PyMuPDF would leave it blank)")
    zoom = max_side / max(width_pt, height_pt)
    pix = page.get_pixmap(matrix=pymupdf.Matrix(zoom, zoom), alpha=False)
    return Image.frombytes("RGB", (pix.width, pix.height), pix.samples)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", type=Path)
    ap.add_argument("--max-side", type=int, default=1280)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    from vllm.config import ModelConfig
    from vllm.model_executor.models.unlimited_ocr import UnlimitedOCRProcessingInfo
    from vllm.multimodal import MULTIMODAL_REGISTRY

    mc = ModelConfig(model=str(args.model), max_model_len=32768, mm_processor_cache_gb=0,
                     limit_mm_per_prompt={"image": 16})
    text = mc.hf_text_config
    layers, kv_heads, head = text.num_hidden_layers, mc.get_total_num_kv_heads(), mc.get_head_size()
    report: dict = {"config": {
        "architectures": mc.architectures, "config_class": type(mc.hf_config).__name__,
        "text_architectures": text.architectures, "head_size": head, "kv_heads": kv_heads, "layers": layers,
        "max_model_len": mc.max_model_len, "rswa_window": mc.rswa_window, "dtype": str(mc.dtype),
        "vocab_size": text.vocab_size, "routed_experts": text.n_routed_experts,
        "experts_per_token": text.num_experts_per_tok, "mla": text.kv_lora_rank is not None,
        "kv_bytes_per_token": layers * kv_heads * head * 2 * mc.dtype.itemsize}}
    processor = MULTIMODAL_REGISTRY.create_processor(mc)
    tok = processor.info.get_tokenizer()
    special = ["<image>", "<|ref|>", "<|/ref|>", "<|det|>", "<|/det|>", "<|grounding|>", "<page>"]
    report["tokenizer"] = {"class": type(tok).__name__, "size": len(tok), "bos": tok.bos_token_id,
                           "eos": tok.eos_token_id, "pad": tok.pad_token_id,
                           "special": {s: tok.encode(s, add_special_tokens=False) for s in special}}
    image_id = tok.convert_tokens_to_ids("<image>")
    failures = []

    def request(images, prompt, **kwargs):
        mm_items = processor.data_parser.parse_mm_data({"image": images})
        out = processor(prompt, mm_items, hf_processor_mm_kwargs=kwargs)
        ids = out["prompt_token_ids"]
        counted = sum(i == image_id for i in ids)
        crops = [x["images_spatial_crop"].data.tolist() for x in out["mm_kwargs"]["image"]]
        request.pixels = out["mm_kwargs"]["image"][0]["pixel_values"].data.clone()  # before the next call
        return ids, counted, crops

    words = "\n".join(" ".join(f"word{i * 8 + j}" for j in range(8)) for i in range(50))
    pages = {"a4": (595.0, 842.0), "letter": (612.0, 792.0)}
    for name, (w, h) in pages.items():
        im = render(w, h, args.max_side, words)
        ids, counted, crops = request([im], "<image>document parsing.")
        expect = UnlimitedOCRProcessingInfo.get_num_image_tokens(processor.info, image_width=im.width,
                                                                 image_height=im.height, cropping=True)
        report[f"page_{name}"] = {"size": list(im.size), "prompt_tokens": len(ids), "image_tokens": counted,
                                  "expected_image_tokens": expect, "tiles": crops, "first_ids": ids[:2],
                                  "last_ids": ids[-3:]}
        if counted != expect or ids[0] != tok.bos_token_id:
            failures.append(f"page {name}: {counted} image tokens, expected {expect}, first id {ids[0]}")
    ims = [render(*pages["a4"], args.max_side, words) for _ in range(3)]
    ids, counted, crops = request(ims, "<image>" * 3 + "Multi page parsing.")
    expect = 3 * UnlimitedOCRProcessingInfo.get_num_image_tokens(processor.info, image_width=ims[0].width,
                                                                 image_height=ims[0].height, cropping=False)
    report["document_3_pages"] = {"prompt_tokens": len(ids), "image_tokens": counted,
                                  "expected_image_tokens": expect, "tiles": crops}
    if counted != expect:
        failures.append(f"3-page document: {counted} image tokens, expected {expect}")
    # vLLM squeezes each page of a multi-image request to the processor's image_size (640 in its
    # Unlimited-OCR config) before the 1024 view; a request's mm_processor_kwargs image_size 1024
    # gives the paper's base mode, at the same tokens
    default = request.pixels
    ids2, counted2, _ = request(ims, "<image>" * 3 + "Multi page parsing.", image_size=1024)
    report["document_3_pages"]["image_size_1024"] = {"image_tokens": counted2,
                                                     "pixels_differ": bool((default != request.pixels).any())}
    if counted2 != expect:
        failures.append(f"3-page document, image_size 1024: {counted2} image tokens, expected {expect}")
    checks = {"architecture": mc.architectures == ["UnlimitedOCRForCausalLM"], "rswa_window": mc.rswa_window == 128,
              "head_size": head == 128, "kv_heads": kv_heads == 10, "no_mla": not report["config"]["mla"],
              "bos_eos_pad": (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (0, 1, 2),
              "special_tokens_single": all(len(v) == 1 for v in report["tokenizer"]["special"].values()),
              "vocab": text.vocab_size == 129280 and len(tok) == 129280}
    failures += [k for k, ok in checks.items() if not ok]
    report["checks"], report["failures"] = checks, failures
    print(json.dumps(report, indent=1))
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

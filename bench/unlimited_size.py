"""The page size for Unlimited-OCR's page mode: image tokens a page against legibility.

vLLM's processor (page mode, "gundam") gives a page a 1024 global view and, when a side is over
640 px, a grid of 640-px crops chosen by count_tiles from the page's aspect ratio (2 to 32 crops;
at an equal ratio the larger grid wins when the page's area exceeds half the grid's), after
resizing the whole page to that grid. So the tokens depend on the aspect ratio and on the area
only through that tie, and what the crops see is the page resized to the grid, whatever it was
rendered at: rendering larger than the grid only costs render time and bytes; smaller, and the
grid is an enlargement of a coarser page.

For each candidate longest side L (batchocr's `max_side`; pages rendered by batchocr's own
page_scale, `size_multiple` rounding both sides down) and each of A4 and Letter:
- tokens: exact, from vLLM's own count_tiles and UnlimitedOCRProcessingInfo.get_num_image_tokens
  (their source read from the vLLM package, --vllm-src; no torch needed);
- legibility: a stated proxy, since no real weights exist: rapidocr's CER (batchocr.evaluate's)
  on real rendered pages of known text at 7-10 pt, after the page went through what the model's
  crops see (vLLM's dynamic_preprocess: resized to the crop grid), enlarged back to the page's
  aspect (information lost stays lost; the squeeze does not penalise rapidocr);
- host cost: render time and RGB bytes a page (the pipeline holds queue_pages of them).
Document mode (one request, several pages: no crops) is shown too: vLLM 0.26's processor squeezes
each page to image_size x image_size (640 in vLLM's Unlimited-OCR config), then pads it to 1024.

    python bench/unlimited_size.py --vllm-src $(python -c 'import vllm, os; print(os.path.dirname(vllm.__file__))') \
        [--sides 768,1024,1280,1536,1920,2339,3508] [--json FILE]
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import math
import os
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

PAGES = {"a4": (595.0, 842.0), "letter": (612.0, 792.0)}
FONTS = {"a4": (6, 7, 8, 9), "letter": (7, 8)}
MARGIN = 50
BAND = 170  # points of text at the top of the page: what is read (the whole page is rendered and resampled)


def vllm_functions(src: Path) -> dict:
    """vLLM's tiling and token count, exec'd from its own source files (pure Python)."""
    wanted = {
        "transformers_utils/processors/deepseek_ocr.py": {
            "BASE_SIZE", "IMAGE_SIZE", "CROP_MODE", "MIN_CROPS", "MAX_CROPS", "find_closest_aspect_ratio",
            "calculate_aspect_ratios", "count_tiles", "dynamic_preprocess"},
        "model_executor/models/unlimited_ocr.py": {"_UNLIMITED_OCR_MAX_CROPS",
                                                   "UnlimitedOCRProcessingInfo.get_num_image_tokens"},
    }
    ns: dict = {"math": math}
    for rel, names in wanted.items():
        tree = ast.parse((src / rel).read_text())
        body = []
        for node in tree.body:
            if isinstance(node, ast.Assign) and {getattr(t, "id", None) for t in node.targets} & names:
                body.append(node)
            elif isinstance(node, ast.FunctionDef) and node.name in names:
                body.append(node)
            elif isinstance(node, ast.ClassDef):
                body += [f for f in node.body if isinstance(f, ast.FunctionDef) and f"{node.name}.{f.name}" in names]
        found = {getattr(n, "name", None) or n.targets[0].id for n in body}
        missing = {n.split(".")[-1] for n in names} - found
        if missing:
            raise SystemExit(f"{src / rel}: not found: {', '.join(sorted(missing))} (another vLLM version?)")
        exec(compile(ast.Module(body=body, type_ignores=[]), str(src / rel), "exec"), ns)  # noqa: S102
    return ns


def tokens(ns: dict, width: int, height: int) -> tuple[int, tuple[int, int]]:
    """Page mode: image tokens and the crop grid (tiles across, down) vLLM gives a width x height image."""
    n = ns["get_num_image_tokens"](None, image_width=width, image_height=height, cropping=True)
    if width <= ns["IMAGE_SIZE"] and height <= ns["IMAGE_SIZE"]:
        return n, (1, 1)
    return n, tuple(ns["count_tiles"](width, height, max_num=ns["_UNLIMITED_OCR_MAX_CROPS"],
                                      image_size=ns["IMAGE_SIZE"]))


def page_pdf(path: Path, size: str, font: float, seed: int) -> str:
    """One page of prose (Times, PyMuPDF) in a band at its top, as much as fits; returns its text."""
    import pymupdf
    from layouts import SENTENCES

    w, h = PAGES[size]
    rng = random.Random(seed)
    doc = pymupdf.open()
    page = doc.new_page(width=w, height=h)
    rect = pymupdf.Rect(MARGIN, MARGIN, w - MARGIN, MARGIN + BAND)
    paragraphs: list[str] = []
    while True:  # as many paragraphs as fit (the truth must be what is on the page)
        trial = paragraphs + [" ".join(rng.sample(SENTENCES, 2))]
        probe = pymupdf.open().new_page(width=w, height=h)
        if probe.insert_textbox(rect, "\n".join(trial), fontsize=font, fontname="tiro", lineheight=1.2) < 0:
            break
        paragraphs = trial
    page.insert_textbox(rect, "\n".join(paragraphs), fontsize=font, fontname="tiro", lineheight=1.2)
    doc.save(path)
    return "\n".join(paragraphs)


def render(path: Path, side: int, multiple: int):
    """The page as batchocr renders it (page_scale: dpi 300, then max_side, size_multiple)."""
    import pymupdf
    from PIL import Image

    from batchocr.render import page_scale
    from batchocr.spec import RenderSpec

    doc = pymupdf.open(path)
    page = doc[0]
    matrix, _ = page_scale(page, True, RenderSpec(dpi=300, max_side=side, size_multiple=multiple))
    t0 = time.perf_counter()
    pix = page.get_pixmap(matrix=matrix, colorspace=pymupdf.csRGB, alpha=False)
    ms = (time.perf_counter() - t0) * 1000
    return Image.frombytes("RGB", (pix.width, pix.height), pix.samples), ms


def seen_by_crops(ns: dict, image):
    """What page mode's crops hold: vLLM's dynamic_preprocess (the page resized to the grid,
    cut in 640-px tiles), the tiles put back together; an image within 640 px is not cropped
    (the global view alone: the page padded to 1024)."""
    from PIL import Image

    size = ns["IMAGE_SIZE"]
    if image.width <= size and image.height <= size:
        return seen_in_base(image, ns["BASE_SIZE"])
    crops, (across, down) = ns["dynamic_preprocess"](image, image_size=size, max_num=ns["_UNLIMITED_OCR_MAX_CROPS"])
    grid = Image.new("RGB", (across * size, down * size))
    for i, crop in enumerate(crops):
        grid.paste(crop, ((i % across) * size, (i // across) * size))
    return grid


def seen_in_base(image, side: int):
    """Document mode in vLLM 0.26 (tokenize_with_images with cropping off): the page resized to
    side x side (the processor's image_size), then padded to the 1024 base view."""
    return image.resize((side, side))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--vllm-src", type=Path, help="the vllm package folder (default: the installed vllm's)")
    ap.add_argument("--sides", default="768,1024,1280,1600,1920,2339,3508", help="longest sides read with rapidocr")
    ap.add_argument("--multiple", type=int, default=16)
    ap.add_argument("--threads", type=int, default=0, help="rapidocr's threads (0: one per CPU)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    src = args.vllm_src
    if src is None:
        spec = importlib.util.find_spec("vllm")
        if spec is None or not spec.origin:
            raise SystemExit("vLLM is not installed here: pass --vllm-src (the vllm package folder)")
        src = Path(spec.origin).parent
    ns = vllm_functions(src)
    os.environ["ORT_DISABLE_TELEMETRY"] = "1"
    import tempfile

    from batchocr.engines.rapidocr import RapidOCREngine, RapidOCROptions
    from batchocr.evaluate import levenshtein, normalise

    # The crop grid of a 300-dpi A4 page is 2560x3840: rapidocr's own 2000-px cap would read
    # every large grid at 2000 px, so it is lifted, and the detector given the memory for it.
    engine = RapidOCREngine(RapidOCROptions(threads=args.threads, memory_mb=3200))
    engine._ocr.max_side_len = 4096

    def cer(image, truth: str, size: str) -> float:
        """rapidocr on the text band of a page image (the page's top BAND + 2 margins)."""
        import numpy as np

        band = image.crop((0, 0, image.width, round(image.height * (BAND + 2 * MARGIN) / PAGES[size][1])))
        text, _ = engine.recognise(np.asarray(band.convert("RGB")))
        t = normalise(truth)
        return levenshtein(normalise(text), t) / len(t)

    sides = [int(s) for s in args.sides.split(",")]
    # tokens alone (no OCR) over every 64 px from 640 to 3584 and the named sides: where the tiling changes
    import pymupdf

    from batchocr.render import page_scale
    from batchocr.spec import RenderSpec

    token_rows = []
    for side in sorted(set(range(640, 3585, 64)) | set(sides)):
        r = {"max_side": side}
        for size, (w, h) in PAGES.items():
            probe = pymupdf.open().new_page(width=w, height=h)
            m, _ = page_scale(probe, True, RenderSpec(dpi=300, max_side=side, size_multiple=args.multiple))
            px = (round(w * m.a), round(h * m.d))
            n, grid = tokens(ns, *px)
            r[size] = {"px": list(px), "tiles": list(grid), "image_tokens": n}
        token_rows.append(r)
    changes = [r for i, r in enumerate(token_rows)
               if i == 0 or any(r[s]["image_tokens"] != token_rows[i - 1][s]["image_tokens"] for s in PAGES)]
    print("image tokens a page, where they change with max_side (dpi 300 before max_side):")
    for r in changes:
        print(f"  from max_side {r['max_side']}: " + ", ".join(
            f"{s} {'x'.join(map(str, r[s]['px']))} -> {'x'.join(map(str, r[s]['tiles']))} tiles, {r[s]['image_tokens']} tokens"
            for s in PAGES), flush=True)
    work = Path(tempfile.mkdtemp(prefix="uocr-size-"))
    pdfs = {(size, font): (work / f"{size}-{font}.pdf", page_pdf(work / f"{size}-{font}.pdf", size, font, font))
            for size in PAGES for font in FONTS[size]}
    rows = []
    for side in sides:
        row: dict = {"max_side": side}
        for size in PAGES:
            first = None
            for font in FONTS[size]:
                path, truth = pdfs[(size, font)]
                image, ms = render(path, side, args.multiple)
                if first is None:
                    n, grid = tokens(ns, image.width, image.height)
                    first = {"px": [image.width, image.height], "tiles": list(grid), "crops": grid[0] * grid[1]
                             if grid != (1, 1) else 0, "image_tokens": n, "render_ms": round(ms, 1),
                             "rgb_mb": round(image.width * image.height * 3 / 1e6, 2), "cer": {}}
                    seen = seen_by_crops(ns, image)
                    first["crop_grid_px"] = list(seen.size)
                    first["dpi_seen"] = round(seen.size[1] / (PAGES[size][1] / 72), 1)
                seen = seen_by_crops(ns, image).resize(image.size, resample=3)  # back to the page's aspect
                first["cer"][f"{font}pt"] = round(cer(seen, truth, size), 4)
            row[size] = first
        rows.append(row)
        print(json.dumps(row), flush=True)
    # document mode: no crops, the page squeezed to the processor's image_size (vLLM: 640; 1024 if
    # mm_processor_kwargs image_size 1024 is passed), whatever its rendered size (here 1280)
    doc_rows = []
    for base in (640, 1024):
        row = {"image_size": base, "image_tokens": ns["get_num_image_tokens"](None, image_width=1280, image_height=1280,
                                                                              cropping=False)}
        for size in PAGES:
            row[size] = {}
            for font in FONTS[size]:
                path, truth = pdfs[(size, font)]
                image, _ = render(path, 1280, args.multiple)
                row[size][f"{font}pt"] = round(cer(seen_in_base(image, base).resize(image.size, resample=3), truth,
                                                  size), 4)
        doc_rows.append(row)
        print(json.dumps(row), flush=True)
    # the same pages rendered at 1920 and read directly (no model resampling): the proxy's floor
    floor = {size: {f"{font}pt": round(cer(render(pdfs[(size, font)][0], 1920, args.multiple)[0],
                                           pdfs[(size, font)][1], size), 4) for font in FONTS[size]} for size in PAGES}
    print("direct at 1920:", json.dumps(floor), flush=True)
    print()
    head = f"{'max_side':>8} | {'A4 px':>10} {'tiles':>5} {'tokens':>6} {'grid':>9} {'dpi':>5} {'ms':>5} {'MB':>5} " \
           f"{'CER 6/7/8/9 pt':>27} | {'Letter px':>10} {'tiles':>5} {'tokens':>6} {'grid':>9} {'CER 7/8 pt':>13}"
    print(head)
    for r in rows:
        a, lt = r["a4"], r["letter"]
        print(f"{r['max_side']:>8} | {'x'.join(map(str, a['px'])):>10} {'x'.join(map(str, a['tiles'])):>5} "
              f"{a['image_tokens']:>6} {'x'.join(map(str, a['crop_grid_px'])):>9} {a['dpi_seen']:>5} "
              f"{a['render_ms']:>5.0f} {a['rgb_mb']:>5.1f} {' '.join(f'{v:.3f}' for v in a['cer'].values()):>27} | "
              f"{'x'.join(map(str, lt['px'])):>10} {'x'.join(map(str, lt['tiles'])):>5} {lt['image_tokens']:>6} "
              f"{'x'.join(map(str, lt['crop_grid_px'])):>9} {' '.join(f'{v:.3f}' for v in lt['cer'].values()):>13}")
    for r in doc_rows:
        print(f"document mode, image_size {r['image_size']}: {r['image_tokens']} tokens a page; CER A4 "
              f"{' '.join(f'{v:.3f}' for v in r['a4'].values())}, Letter {' '.join(f'{v:.3f}' for v in r['letter'].values())}")
    if args.json:
        args.json.write_text(json.dumps({"command": " ".join(["python", "bench/unlimited_size.py", *sys.argv[1:]]),
                                         "vllm_src": str(src), "token_changes": changes, "page_mode": rows, "document_mode": doc_rows,
                                         "direct_1920": floor}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Text-layer benchmark: how born-digital pages are read (order, Markdown) and what
it costs, in one process run.

    python bench/textlayer.py [--docs D] [--baseline DIR] [--json FILE]
    python bench/textlayer.py --warnings FOLDER [--baseline DIR]   # pages with a `warning`

1. Reading order and Markdown, per page set: real pdfTeX files from Debian's
   documentation packages (Octave's three-column reference card, its 1158-page
   manual sampled, libtasn1's manual; fetched by tests/tools.py, skipped when apt-get
   cannot), scored against each file's content order (TeX writes it in reading
   order); generated pages (tests/layouts.py: two-, three-column, aligned paragraph
   breaks, single column), as set and written row by row across their columns,
   scored against their truth. Candidates: `get_text(sort=True)` (the engine before),
   batchocr.layertext (now), pymupdf4llm's layout mode (its GNN) and legacy mode
   (column_boxes), both shipped inside PyMuPDF 2. Distance: edit distance over the
   reference's length, Markdown marks and whitespace runs off; headings: `#` lines;
   CPU: process time per page.
2. Cost of the text-layer path per page (CPU, one process): the router's score,
   the text as before and now, a model page's render at 200 dpi (rapidocr's pages)
   instead, and rapidocr on a few of the same pages; on the routing benchmark's
   mixed corpus (bench/route.py: D documents of 4 pages, half born-digital).
3. `--engine textlayer` over that corpus and the Debian files with run_job:
   pages/s now and, with --baseline DIR (another version's `batchocr` package,
   e.g. `git archive main batchocr | tar -x -C DIR`), that version's, in a subprocess.
4. --warnings FOLDER: its pages with a `warning` through the render workers' code
   with `route: auto` (the router's scoring included), now and the baseline's.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "bench")]

REAL = {  # package, path, pages (None: every page; an int: every n-th)
    "refcard-a4.pdf": ("octave-doc", "usr/share/doc/octave/refcard-a4.pdf", None),
    "octave.pdf": ("octave-doc", "usr/share/doc/octave/octave.pdf", 40),
    "libtasn1.pdf": ("libtasn1-doc", "usr/share/doc/libtasn1-doc/libtasn1.pdf", None),
}


def plain(markdown: str) -> str:
    import unicodedata

    text = unicodedata.normalize("NFKC", markdown)
    text = re.sub(r"^(#+ |- |\\)", "", text, flags=re.M)
    text = re.sub(r"^\|(-+\|)+$", "", text, flags=re.M)
    text = re.sub(r"[|*_`]", " ", text)
    return " ".join(text.split())


def distance(text: str, reference: str) -> float:
    from rapidfuzz.distance import Levenshtein

    ref = plain(reference)
    return Levenshtein.distance(plain(text), ref) / max(1, len(ref))


def candidates():
    import pymupdf
    import pymupdf4llm

    from batchocr.layertext import page_markdown

    def library(layout: bool):
        def read(page):
            pymupdf4llm.use_layout(layout)
            kw = {"use_ocr": False, "header": True, "footer": True} if layout else {}
            return pymupdf4llm.to_markdown(page.parent, pages=[page.number], show_progress=False, **kw)
        return read

    return {"sort": lambda page: page.get_text(sort=True), "batchocr": page_markdown,
            "pymupdf4llm-layout": library(True), "pymupdf4llm-legacy": library(False)}, pymupdf


def page_sets(docs_ok: bool):
    """name -> [(page, reference)]"""
    import pymupdf

    import layouts
    from test_layertext import rows_across

    sets = {}
    if docs_ok:
        import tools

        for name, (package, path, step) in REAL.items():
            try:
                doc = pymupdf.open(tools.debian_doc(package, path))
            except tools.Unavailable as exc:
                print(f"{name}: {exc}", file=sys.stderr)
                continue
            indices = range(doc.page_count) if step is None else range(0, doc.page_count, step)
            sets[f"real {name}"] = [(doc[i], doc[i].get_text()) for i in indices]
    generated = {"multi-column": ["two-column", "three-column", "aligned-breaks"], "single-column": ["single-column"]}
    for kind, names in generated.items():
        made = [layouts.LAYOUTS[n]() for n in names]
        sets[f"generated {kind}"] = [(m.doc[0], "\n\n".join(m.truth)) for m in made]
        if kind == "multi-column":
            sets[f"generated {kind}, rows across"] = [(rows_across(m.doc[0]), "\n\n".join(m.truth)) for m in made]
    return sets


def quality(sets) -> dict:
    readers, _ = candidates()
    out = {}
    print(f"{'pages':42s} {'n':>4s} " + " ".join(f"{name:>27s}" for name in readers))
    print(f"{'':42s} {'':>4s} " + " ".join(f"{'dist mean/max  heads  CPU s':>27s}" for _ in readers))
    for set_name, pages in sets.items():
        row = {}
        for name, read in readers.items():
            dists, heads, cpu = [], 0, 0.0
            for page, reference in pages:
                start = time.process_time()
                text = read(page)
                cpu += time.process_time() - start
                dists.append(distance(text, reference))
                heads += len(re.findall(r"^#+ ", text, re.M))
            row[name] = {"mean": round(statistics.mean(dists), 4), "max": round(max(dists), 4),
                         "headings": heads, "cpu_s_per_page": round(cpu / len(pages), 4)}
        out[set_name] = {"pages": len(pages), **row}
        print(f"{set_name:42s} {len(pages):>4d} " + " ".join(
            f"{r['mean']:>8.3f}/{r['max']:<5.3f} {r['headings']:>5d} {r['cpu_s_per_page']:>6.3f}" for r in row.values()))
    return out


def cost(corpus: Path, ocr_pages: int) -> dict:
    import numpy as np
    import pymupdf

    from batchocr.layertext import layer_words, page_markdown
    from batchocr.router import MIN_SCORE, score_page

    timings = {"score": [], "score on get_text (before 2026-12-05)": [], "text before": [], "text now": [],
               "render 200 dpi": [], "model page 200 dpi": [], "model page 1288 px": []}
    routed, routed_before = [], 0
    for path in sorted(corpus.glob("*.pdf")):
        doc, before = pymupdf.open(path), pymupdf.open(path)  # each scoring on a document of its own:
        for page in doc:  # neither reads what the other's text extraction left cached; in turn first
            for which in (("now", "before") if page.number % 2 else ("before", "now")):
                start = time.process_time()
                if which == "now":
                    s = score_page(page, layer_words(page))  # as router.route_page
                    timings["score"].append(time.process_time() - start)
                else:  # the same page as the router scored it before 2026-12-05: get_text()
                    other = before[page.number]
                    routed_before += score_page(other, other.get_text()).score >= MIN_SCORE
                    timings["score on get_text (before 2026-12-05)"].append(time.process_time() - start)
            if s.score < MIN_SCORE:  # a model page: rendered instead (rapidocr's dpi; olmOCR's 1288 px)
                zoom = 1288 / max(page.rect.width, page.rect.height)
                for name, matrix in (("model page 200 dpi", pymupdf.Matrix(200 / 72, 200 / 72)),
                                     ("model page 1288 px", pymupdf.Matrix(zoom, zoom))):
                    start = time.process_time()
                    page.get_pixmap(matrix=matrix, colorspace=pymupdf.csRGB, alpha=False)
                    timings[name].append(time.process_time() - start)
                continue
            routed.append((path, page.number))
            for name, read in (("text before", lambda p: p.get_text(sort=True)), ("text now", page_markdown)):
                start = time.process_time()
                read(page)
                timings[name].append(time.process_time() - start)
            start = time.process_time()
            page.get_pixmap(dpi=200, colorspace=pymupdf.csRGB, alpha=False)
            timings["render 200 dpi"].append(time.process_time() - start)
    out = {name: round(statistics.mean(v) * 1000, 3) for name, v in timings.items()}  # ms a page
    from batchocr.engines import rapidocr

    engine = rapidocr.create({})
    ocr = []
    for path, number in routed[:ocr_pages]:
        pix = pymupdf.open(path)[number].get_pixmap(dpi=200, colorspace=pymupdf.csRGB, alpha=False)
        rgb = np.frombuffer(pix.samples, np.uint8).reshape(pix.height, pix.width, 3)
        start = time.process_time()
        engine.recognise(rgb)
        ocr.append(time.process_time() - start)
    engine.close()
    out["rapidocr"] = round(statistics.mean(ocr) * 1000, 1)
    out["routed_pages"] = len(routed)
    out["routed_pages_before"] = routed_before
    out["scored_pages"] = len(timings["score"])
    return out


def run_textlayer(corpus: Path, out: Path) -> dict:
    from batchocr.pipeline import run_job
    from batchocr.spec import JobSpec

    start = time.perf_counter()
    summary = run_job(JobSpec(source=str(corpus), out=str(out), engine="textlayer"), progress=False)
    seconds = time.perf_counter() - start
    return {"pages": summary.pages, "seconds": round(seconds, 2), "pages_per_s": round(summary.pages / seconds, 2)}


def warnings(folder: Path) -> dict:
    """Every page of the folder through the render workers' code with `route: auto`
    (images at 50 dpi, nothing OCRed): pages, routed, with a `warning`."""
    from batchocr.render import RenderTask, render_document
    from batchocr.schema import Needs
    from batchocr.sources import list_documents
    from batchocr.spec import RenderSpec
    from batchocr.storage import Store

    total = routed = warned = 0
    for doc in list_documents(Store(str(folder), {})):
        for batch in render_document(RenderTask(doc), RenderSpec(dpi=50), Needs(image=True, route="auto"), {}):
            cols = batch.select(["warning", "route"]).to_pydict()
            total += len(cols["route"])
            routed += sum(r == "textlayer" for r in cols["route"])
            warned += sum(w is not None for w in cols["warning"])
    return {"pages": total, "routed": routed, "warned": warned}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--docs", type=int, default=32, help="documents of the mixed corpus (4 pages each)")
    ap.add_argument("--ocr-pages", type=int, default=4, help="born-digital pages rapidocr reads for the ratio")
    ap.add_argument("--baseline", type=Path, help="a checkout of another version: its textlayer engine's pages/s")
    ap.add_argument("--no-debian", action="store_true", help="generated pages only (no apt-get download)")
    ap.add_argument("--repeat", type=int, default=2, help="rounds of the --engine textlayer runs")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--warnings", type=Path, help="only count the pages of this folder with a `warning`")
    ap.add_argument("--run", type=Path, help=argparse.SUPPRESS)  # the baseline's subprocess: corpus folder
    args = ap.parse_args(argv)
    os.environ["ORT_DISABLE_TELEMETRY"] = "1"
    if args.run:
        print(json.dumps(run_textlayer(args.run, Path(tempfile.mkdtemp(prefix="batchocr-tl-")) / "out")))
        return 0
    if args.warnings:
        if args.baseline:
            env = {**os.environ, "PYTHONPATH": str(args.baseline.resolve())}
            proc = subprocess.run([sys.executable, __file__, "--warnings", str(args.warnings)], env=env, check=True,
                                  capture_output=True, text=True)
            print("baseline:", proc.stdout.strip().splitlines()[-1])
        print(("now: " if args.baseline else "") + json.dumps(warnings(args.warnings)))
        return 0
    from route import build_corpus

    results = {"command": " ".join(["python", "bench/textlayer.py", *(argv if argv is not None else sys.argv[1:])])}
    results["quality"] = quality(page_sets(not args.no_debian))
    tmp = Path(tempfile.mkdtemp(prefix="batchocr-textlayer-"))
    try:
        build_corpus(tmp / "corpus", args.docs)
        c = results["cost"] = cost(tmp / "corpus", args.ocr_pages)
        print(f"\nper page, ms of CPU ({c['scored_pages']} pages scored, {c['routed_pages']} routed): " +
              ", ".join(f"{k} {v}" for k, v in c.items() if not k.endswith("pages")))
        before, now = c["score"] + c["text before"], c["score"] + c["text now"]
        print(f"text-layer path (score + text): before {before:.2f} ms, now {now:.2f} ms a page "
              f"({1000 / before:.0f} -> {1000 / now:.0f} pages/s a CPU; 16 CPUs: {16000 / now:.0f} pages/s); "
              f"rapidocr on the same pages {c['rapidocr'] / now:.0f}x as much CPU")
        model = c["score"] + c["model page 1288 px"]
        mixed = (now + model) / 2
        c["pod16_pages_per_s"] = round(16000 / mixed)
        print(f"render workers, half the pages born-digital: {mixed:.2f} ms a page (score, then text or a 1288-px "
              f"render): a 16-CPU pod's workers feed {16000 / mixed:.0f} pages/s, {8000 / mixed:.0f} of them model pages")
        corpora = {"mixed corpus": tmp / "corpus"}
        if not args.no_debian:  # the real files whole: Octave's manual is 1158 pages
            (tmp / "debian").mkdir()
            for name, (package, path, _) in REAL.items():
                found = ROOT / ".tools" / "debian" / package / path
                if found.is_file():
                    shutil.copyfile(found, tmp / "debian" / name)
            corpora["debian files"] = tmp / "debian"
        runs = results["textlayer_runs"] = {}
        for corpus_name, folder in corpora.items():
            for r in range(args.repeat):
                if args.baseline:
                    env = {**os.environ, "PYTHONPATH": str(args.baseline.resolve())}
                    proc = subprocess.run([sys.executable, __file__, "--run", str(folder)], env=env, check=True,
                                          capture_output=True, text=True)
                    runs.setdefault(corpus_name, {}).setdefault("baseline", []).append(
                        json.loads(proc.stdout.strip().splitlines()[-1]))
                runs.setdefault(corpus_name, {}).setdefault("now", []).append(
                    run_textlayer(folder, tmp / f"out-{len(corpora)}-{r}-{corpus_name[:5]}"))
            for name, rounds in runs[corpus_name].items():
                print(f"--engine textlayer on the {corpus_name}, {name}: " + ", ".join(
                    f"{x['pages']} pages in {x['seconds']} s ({x['pages_per_s']} pages/s)" for x in rounds))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

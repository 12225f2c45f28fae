"""The text layer's reading order on the real set (issue 50): every measured page of
tests/realset.py's born-digital PDFs (Debian 12's documentation packages, fetched by
tests/tools.py) read by batchocr.layertext.page_markdown, held against the page's
content order.

    python bench/textlayer_real.py [--json FILE]

Each document is read as a run's render workers read it: PyMuPDF's optional layout
module off (batchocr.renderworker.skip_pymupdf_extras: find_tables then runs without
its ONNX model), one DocumentText a document (its outline, from a sample of its pages:
its CPU time is spread over the measured pages). For each page: the Markdown's text without marks and whitespace (realset.plain) against
`page.get_text()` without whitespace (the producer's content order), as rapidfuzz's
normalized Levenshtein distance (edits over the longer string's length); the CPU time
of page_markdown (time.process_time, the document's open and the content order not
counted). For a document whose producer writes reading order, a page is over its bound
past 0.05 (reference cards: 0.10). Pages of realset.HAND_CHECKED: whether their anchor
phrases come in order in the Markdown's text. Prints one row a document; --json writes
every page's figures.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests")]

from rapidfuzz.distance import Levenshtein  # noqa: E402

import realset  # noqa: E402
from batchocr.renderworker import skip_pymupdf_extras  # noqa: E402

skip_pymupdf_extras()
from batchocr.layertext import DocumentText, page_markdown  # noqa: E402


def measure(doc: realset.Doc) -> dict:
    """One document's pages: distance, CPU ms and hand-checked anchors."""
    pdf = realset.open_doc(doc)
    pages = []
    measured = realset.measured_pages(doc, pdf)
    start = time.process_time()
    document = DocumentText(pdf)
    shared = (time.process_time() - start) / len(measured)
    for i in measured:
        page = pdf[i]
        start = time.process_time()
        markdown = page_markdown(page, document)
        cpu = time.process_time() - start + shared
        text = realset.plain(markdown)
        row = {"page": i, "distance": round(Levenshtein.normalized_distance(text, realset.content(page)), 4),
               "cpu_ms": round(cpu * 1000, 2)}
        anchors = realset.HAND_CHECKED.get((doc.package, doc.name, i))
        if anchors is not None:
            row["anchors_in_order"] = realset.in_order(text, anchors)
        pages.append(row)
    distances = [p["distance"] for p in pages]
    return {"package": doc.package, "file": doc.name, "kind": doc.kind, "producer": doc.producer,
            "ordered": doc.ordered, "pages": len(pages), "of": pdf.page_count,
            "mean": round(statistics.fmean(distances), 4), "max": max(distances),
            "over": sum(d > doc.bound for d in distances) if doc.ordered else None,
            "ms_page": round(statistics.fmean(p["cpu_ms"] for p in pages), 2),
            "hand_checked": [p["page"] for p in pages if p.get("anchors_in_order") is False] or None,
            "per_page": pages}


def table(results: list[dict]) -> str:
    lines = ["| package | file | kind | pages | mean | max | over bound | ms/page |",
             "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for r in results:
        pages = f"{r['pages']}" + (f" of {r['of']}" if r["pages"] < r["of"] else "")
        over = f"{r['over']}" if r["ordered"] else "(hand)"
        lines.append(f"| {r['package']} | {r['file']} | {r['kind']} | {pages} | {r['mean']:.3f} | {r['max']:.3f} "
                     f"| {over} | {r['ms_page']:.1f} |")
    pages = [p for r in results for p in r["per_page"]]
    ordered = [p for r in results if r["ordered"] for p in r["per_page"]]
    over = sum(r["over"] or 0 for r in results)
    lines.append(f"\n{len(results)} documents, {len(pages)} pages; {over} of {len(ordered)} pages of "
                 f"ordered producers over their bound; mean distance "
                 f"{statistics.fmean(p['distance'] for p in pages):.3f}; page_markdown "
                 f"{statistics.fmean(p['cpu_ms'] for p in pages):.1f} ms CPU a page")
    checked = [(r["file"], p["page"], p["anchors_in_order"]) for r in results for p in r["per_page"]
               if "anchors_in_order" in p]
    if checked:
        lines.append("hand-checked pages in their anchors' order: "
                     + ", ".join(f"{f} p{i + 1} {'yes' if ok else 'NO'}" for f, i, ok in checked))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, help="write every page's figures here")
    args = parser.parse_args()
    results = [measure(doc) for doc in realset.REALSET]
    print(table(results))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()

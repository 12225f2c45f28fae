"""The text layer as Markdown in reading order (batchocr/layertext.py): real pdfTeX
documents from Debian's documentation packages (fetched once into .tools/, see
tools.debian_doc) and generated pages of the same structures, one of them written
row by row across its columns, as some producers do."""

from __future__ import annotations

import os
import re
import shutil

import polars as pl
import pymupdf
import pytest
from rapidfuzz.distance import Levenshtein

import layouts
import realset
import tools
from batchocr import read_pages
from batchocr.layertext import document_markdown, page_markdown
from conftest import run_cli
from tools import MANUAL, REFCARD


def debian(doc: tuple[str, str]):
    try:
        return tools.debian_doc(*doc)
    except tools.Unavailable as exc:
        pytest.skip(str(exc))


def plain(markdown: str) -> str:
    """Markdown's marks off (heading hashes, bullets, code fences, table pipes, escapes:
    realset.plain_lines), words one space apart."""
    return " ".join(" ".join(realset.plain_lines(markdown)).split())


def distance(text: str, truth: str) -> float:
    truth = " ".join(truth.split())
    return Levenshtein.distance(plain(text), truth) / len(truth)


def rows_across(src: pymupdf.Page) -> pymupdf.Page:
    """The same page written row by row across its columns: the layer's own order reads
    across the gutter (the content order of some producers)."""
    doc = pymupdf.open()
    page = doc.new_page(width=src.rect.width, height=src.rect.height)
    spans = [s for b in src.get_text("dict")["blocks"] for ln in b.get("lines", ()) for s in ln["spans"]]
    fonts = {"Times-Roman": "tiro", "Helvetica-Bold": "hebo", "Helvetica": "helv"}
    for s in sorted(spans, key=lambda s: (round(s["origin"][1]), s["origin"][0])):
        page.insert_text(s["origin"], s["text"], fontsize=s["size"], fontname=fonts[s["font"]])
    return page


@pytest.mark.parametrize("order", ["columns", "rows across"])
@pytest.mark.parametrize("layout,headings", [
    ("two-column", ["# Series 40 Circulation Pumps", "## Spare parts", "## Overview"]),  # headings nest
    ("three-column", ["# Installation Notes", "## Before you start"]),
    ("aligned-breaks", ["# Series 60 Booster Sets", "## Technical data", "## Ordering"]),  # written pair by pair
])
def test_generated_multi_column_pages_read_column_by_column(layout, headings, order):
    made = layouts.LAYOUTS[layout]()
    truth = "\n\n".join(made.truth)
    page = made.doc[0] if order == "columns" else rows_across(made.doc[0])
    assert distance(page.get_text(sort=True), truth) > 0.4  # what the engine read before: across the columns
    if order == "rows across" or layout == "aligned-breaks":
        assert distance(page.get_text(), truth) > 0.4  # and the layer's own order is no better
    markdown = page_markdown(page)
    assert distance(markdown, truth) < 0.02
    assert re.findall(r"^#+ .*", markdown, re.M) == sorted(headings, key=markdown.index)
    assert "  " not in markdown


def test_generated_single_column_prose_and_its_table_rows():
    made = layouts.single_column()
    page = made.doc[0]
    markdown = page_markdown(page)
    assert distance(markdown, "\n\n".join(made.truth)) < 0.02
    assert markdown.startswith("# Service Report\n\n")
    assert "- Stainless steel body\n- Quiet fan cover" in markdown


def ruled_table_page() -> pymupdf.Page:
    """A title, a sentence, a 3-row table drawn with a grid of rules, a sentence."""
    rows = [["Part no.", "Description", "Qty", "Price"], ["AB-1042", "Impeller, brass", "2", "18.40"],
            ["AB-2210", "Shaft seal kit", "1", "12.95"]]
    doc = pymupdf.open()
    page = doc.new_page()
    page.insert_text((72, 72), "Spare parts list", fontsize=16, fontname="hebo")
    page.insert_textbox(pymupdf.Rect(72, 90, 540, 140), "The parts below are kept in stock for ten years.", fontsize=11)
    xs, top, step = [72, 172, 372, 432, 512], 160, 20
    for r, row in enumerate(rows):
        for c, text in enumerate(row):
            page.insert_text((xs[c] + 4, top + r * step + 14), text, fontsize=10, fontname="hebo" if r == 0 else "helv")
    for r in range(len(rows) + 1):
        page.draw_line((xs[0], top + r * step), (xs[-1], top + r * step))
    for x in xs:
        page.draw_line((x, top), (x, top + len(rows) * step))
    page.insert_textbox(pymupdf.Rect(72, 240, 540, 300), "Prices exclude delivery.", fontsize=11)
    return page


def test_a_ruled_table_becomes_a_markdown_table():
    page = ruled_table_page()
    assert page_markdown(page) == (
        "# Spare parts list\n\nThe parts below are kept in stock for ten years.\n\n"
        "| Part no. | Description | Qty | Price |\n|---|---|---|---|\n"
        "| AB-1042 | Impeller, brass | 2 | 18.40 |\n| AB-2210 | Shaft seal kit | 1 | 12.95 |\n\n"
        "Prices exclude delivery.")


def test_a_real_three_column_reference_card_reads_column_by_column_with_its_headings():
    """Octave's pdfTeX reference card (3 pages of 3 columns, key-value lists under bold
    headings): the layer's order is the card's, the old engine read across the columns."""
    doc = pymupdf.open(debian(REFCARD))
    for page in doc:
        content = page.get_text()
        assert distance(page.get_text(sort=True), content) > 0.5
        markdown = page_markdown(page)
        assert distance(markdown, content) < 0.10
        assert "\ufb01" not in markdown and "  " not in re.sub(r"(?ms)^```.*?^```", "", markdown)  # code keeps its columns
        assert len(re.findall(r"^#+ ", markdown, re.M)) >= 8
    first = page_markdown(doc[0])
    assert "\ufb01" in doc[0].get_text() and "run Octave on commands in file" in first  # ﬁ expanded
    assert first.startswith("# Octave Quick Reference\n\nOctave Version 3.0.0\n\n## Starting Octave\n\n"
                            "| octave | start interactive Octave session |\n|---|---|\n")  # a command beside its description
    heads = re.findall(r"^## (.*)", first, re.M)
    # the first column's sections, then the second's: not the columns' headings side by side
    assert heads.index("Inserting or Changing Text") < heads.index("Killing and Yanking")


def test_a_real_single_column_manual_reads_as_it_is_written():
    doc = pymupdf.open(debian(MANUAL))
    scores = [distance(page_markdown(page), page.get_text()) for page in doc]
    assert max(scores) < 0.05 and sum(scores) / len(scores) < 0.02
    assert page_markdown(doc[0]).startswith("# Libtasn1\n")


def test_a_sound_file_whose_scoring_makes_mupdf_complain_gets_no_warning(tmp_path):
    """libtasn1's manual is sound (pdfTeX; pages read and render right), but tracing its
    glyphs, as the router's scoring does, makes MuPDF report invalid glyph indices."""
    doc = pymupdf.open(debian(MANUAL))
    pymupdf.TOOLS.mupdf_warnings(reset=True)
    for page in doc:
        page.get_texttrace()
    assert "FT_Get_Advance" in pymupdf.TOOLS.mupdf_warnings(reset=True)
    src = tmp_path / "src"
    src.mkdir()
    shutil.copy(debian(MANUAL), src / "libtasn1.pdf")
    run_cli("run", str(src), str(tmp_path / "out"), "--quiet", check=True)  # rapidocr, route auto
    pages = read_pages(str(tmp_path / "out")).collect()
    assert len(pages) == doc.page_count
    assert pages["route"].to_list() == ["textlayer"] * doc.page_count
    assert pages.filter(pl.col("warning").is_not_null()).height == 0
    assert pages.sort("page_index")["text"][0] == page_markdown(doc[0])


def test_a_run_over_a_ruled_table_prints_nothing_of_pymupdfs_own(tmp_path):
    """find_tables without pymupdf.layout printed an advert for it on stdout, once a worker:
    into the run's output (-q too) and across its progress line."""
    import shutil
    import subprocess

    src = tmp_path / "src"
    src.mkdir()
    page = ruled_table_page()
    page.parent.save(src / "parts.pdf")
    env = {k: v for k, v in os.environ.items() if k != "PYMUPDF_SUGGEST_LAYOUT_ANALYZER"}
    # the console script in a process of its own: the render workers write to its stdout
    proc = subprocess.run([shutil.which("batchocr"), "run", str(src), str(tmp_path / "out"), "--engine", "textlayer",
                           "-q"], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("batchocr: done: 1 document, 1 page"), proc.stdout
    assert "pymupdf_layout" not in proc.stdout + proc.stderr


def test_a_numbered_title_is_one_heading_and_headings_nest_across_pages():
    """"Chapter 1" over "Introduction" is one heading; a document's second page's
    section is a level under its first page's chapter, not a page's own top level."""
    doc = pymupdf.open()
    first = doc.new_page()
    first.insert_text((72, 80), "Chapter 1", fontsize=20, fontname="hebo")
    first.insert_text((72, 110), "Introduction", fontsize=24, fontname="hebo")
    first.insert_textbox(pymupdf.Rect(72, 130, 540, 300), "The pump moves water. " * 20, fontsize=10)
    second = doc.new_page()
    second.insert_text((72, 80), "Installation", fontsize=14, fontname="hebo")
    second.insert_textbox(pymupdf.Rect(72, 100, 540, 300), "Bolt the pump to a level base. " * 20, fontsize=10)
    doc = pymupdf.open("pdf", doc.tobytes())
    pages = document_markdown(doc)
    assert pages[0].startswith("# Chapter 1 Introduction\n\nThe pump moves water.")
    assert pages[1].startswith("## Installation\n\n")
    assert page_markdown(doc[1]).startswith("# Installation")  # the page alone: its own top level

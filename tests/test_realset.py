"""The text layer's reading order and Markdown on the real set (issue 50's "Shown by"):
31 born-digital PDFs of 15 Debian documentation packages (tests/realset.py, fetched by
tools.debian_doc), each read once as a run reads it (batchocr.layertext.page_markdown with
the document's DocumentText: one outline per document).

- Every page of a document whose producer writes reading order is within 0.05 of its
  content order (reference cards 0.10), Markdown marks and whitespace off; hand-checked
  pages of the others read in their anchors' order.
- Named pages: zoo's R output and GLPK's Type/Bounds/Comment table keep each row on one
  line; asyRefCard page 2 and PARI's card page 1 read column by column, each heading over
  its own commands and each description beside its command.
- The Markdown parsed by markdown-it-py (CommonMark): headings nest (no level skipped
  from one heading to the next in a document); nothing is lost to emphasis or HTML.
"""

from __future__ import annotations

import re
from collections import Counter

import pytest
from markdown_it import MarkdownIt
from rapidfuzz.distance import Levenshtein

import realset
import tools
from batchocr.layertext import DocumentText, page_markdown
from realset import REALSET, Doc


@pytest.fixture(scope="module")
def read() -> dict[str, tuple[Doc, list[str], list[str], object]]:
    """Each document opened once: file name -> (doc, Markdown a page, content order a page,
    the open document)."""
    out = {}
    for doc in REALSET:
        try:
            pdf = realset.open_doc(doc)
        except tools.Unavailable as exc:
            pytest.skip(str(exc))
        pages = realset.measured_pages(doc, pdf)
        document = DocumentText(pdf)
        out[doc.name] = (doc, [page_markdown(pdf[i], document) for i in pages], [realset.content(pdf[i]) for i in pages],
                         pdf)
    return out


def ids(docs):
    return [d.name for d in docs]


@pytest.mark.parametrize("doc", [d for d in REALSET if d.ordered], ids=ids([d for d in REALSET if d.ordered]))
def test_reading_order_within_content_order(read, doc: Doc):
    _, markdown, content, _ = read[doc.name]
    distances = [Levenshtein.normalized_distance(realset.plain(md), realset.squeeze(c))
                 for md, c in zip(markdown, content)]
    over = {i + 1: round(d, 3) for i, d in enumerate(distances) if d > doc.bound}
    assert not over, f"{doc.name}: pages over {doc.bound} from the content order (page: distance): {over}"


@pytest.mark.parametrize("key", list(realset.HAND_CHECKED), ids=[f"{n}-p{i + 1}" for _, n, i in realset.HAND_CHECKED])
def test_hand_checked_pages_in_anchor_order(read, key):
    _, name, i = key
    anchors = realset.HAND_CHECKED[key]
    text = realset.plain(read[name][1][i])
    missing = [a for a in anchors if realset.squeeze(a) not in text]
    assert not missing, f"{name} page {i + 1}: anchors not in the Markdown: {missing}"
    assert realset.in_order(text, anchors), f"{name} page {i + 1}: anchors out of order"


def key(text: str) -> str:
    """Text compared loosely: no whitespace, no backslashes, no Markdown marks."""
    return re.sub(r"[\s\\*_`|#]", "", text.translate(realset.LIGATURES))


def lines(markdown: str) -> list[str]:
    return [k for k in (key(ln) for ln in realset.plain_lines(markdown)) if k]


R_ROW = re.compile(r"^(\d{4}-\d\d-\d\d)((?:\s+-?\d+\.\d+)+)$")


def test_zoo_r_output_rows_on_one_line(read):
    """zoo.pdf page 4: R's printed zoo matrix keeps each row (a date and its numbers) on one line."""
    _, markdown, _, pdf = read["zoo.pdf"]
    # the rows as the page shows them: get_text(sort=True) keeps them
    rows = [m for ln in pdf[3].get_text(sort=True).splitlines() if (m := R_ROW.match(ln.strip()))]
    assert any(m.group(1) == "2004-02-02" and "1.2554339" in m.group(2) for m in rows)  # the page is the one
    have = lines(markdown[3])
    split = [m.group(0) for m in rows if key(m.group(0)) not in have]
    assert not split, f"{len(split)} of {len(rows)} R output rows not on one line, e.g. {split[:3]}"


GLPK_ROWS = [("Type", "Bounds", "Comment"), ("GLP_FR", "Free (unbounded) variable"),
             ("GLP_LO", "Variable with lower bound"), ("GLP_UP", "Variable with upper bound"),
             ("GLP_DB", "Double-bounded variable"), ("GLP_FX", "Fixed variable")]


@pytest.mark.parametrize("page", [20, 21])
def test_glpk_type_bounds_comment_rows_on_one_line(read, page):
    """glpk.pdf pages 20-21 (glp_set_row_bnds, glp_set_col_bnds): the borderless table's rows."""
    have = lines(read["glpk.pdf"][1][page - 1])
    split = [row for row in GLPK_ROWS if not any(all(key(cell) in ln for cell in row) for ln in have)]
    assert not split, f"glpk.pdf page {page}: rows not on one line: {split}"


def sections(markdown: str) -> list[tuple[str, list[str]]]:
    """(heading, its lines up to the next heading), the headings' `#` lines in order."""
    out: list[tuple[str, list[str]]] = [("", [])]
    for line in markdown.splitlines():
        if re.match(r"^ {0,3}#{1,6} ", line):
            out.append((key(line.lstrip("# ")), []))
        elif key(line):
            out[-1][1].append(key(line))
    return out


def beside(have: list[str], description: str, command: str) -> bool:
    """The command on the description's line or the next one."""
    d, c = key(description), key(command)
    return any(d in ln and (c in ln.split(d, 1)[1] or (i + 1 < len(have) and have[i + 1].startswith(c)))
               for i, ln in enumerate(have))


def card_checks(markdown: str, headings: list[str], members: dict[str, list[str]],
                pairs: list[tuple[str, str]]) -> list[str]:
    """What is wrong with a card page's Markdown: headings not in column order (each
    alone on its line), commands under another heading, descriptions apart from their
    commands."""
    found = sections(markdown)
    wrong = []
    order = [h for h, _ in found if h in {key(x) for x in headings}]
    if order != [key(h) for h in headings]:
        wrong.append(f"headings {[h for h, _ in found[1:]]}, wanted {headings}")
    for heading, commands in members.items():
        body = next((b for h, b in found if h == key(heading)), [])
        wrong += [f"{c!r} not under {heading!r}" for c in commands if not any(key(c) in ln for ln in body)]
    have = lines(markdown)
    wrong += [f"{d!r} not beside {c!r}" for d, c in pairs if not beside(have, d, c)]
    return wrong


def test_asy_card_page_2_column_by_column(read):
    """asyRefCard page 2: two columns of headed command lists, description left, command right."""
    wrong = card_checks(
        read["asyRefCard.pdf"][1][1],
        ["Arrays", "Initialization", "path connectors", "Labels", "draw commands", "fill commands",
         "label commands", "clip commands", "pens"],
        {"Arrays": ["name[i]", "sort(a,less)", "find(a,n)"], "fill commands": ["fill(path)", "fill(picture,path)"],
         "clip commands": ["clip(path,pen)"], "pens": ["gray(g)", "makepen(path)"]},
        [("array element i", "name[i]"), ("push element x", "name.push(x)"), ("delete all elements", "name.delete()"),
         ("initialize variable", "name=value;"), ("straight segment", "--"), ("lift pen", "^^"),
         ("fill path with current pen", "fill(path)"), ("clip to path with fill rule", "clip(path,pen)"),
         ("draw visible portion of line through two pairs", "drawline(pair,pair)"), ("pen mixing operator", "+")])
    assert not wrong, f"asyRefCard page 2: {len(wrong)} faults: {wrong}"


def test_pari_card_page_1_column_by_column(read):
    """PARI's refcard.pdf page 1 (three columns of headed command lists)."""
    wrong = card_checks(
        read["refcard.pdf"][1][0],
        ["Help", "Input/Output", "Metacommands & Defaults", "Debugger / break loop", "PARI Types & Input Formats",
         "Reserved Variable Names", "Information about an Object, Precision", "Operators"],
        {"Information about an Object, Precision": ["padicprec(x, p), serprec(x, v)", "getlocalprec"],
         "Operators": ["+, - , *, /, ^, sqr", "divrem(x, y)", "shiftmul(x, n)"],
         "PARI Types & Input Formats": ["Vecsmall([x, y, z])", "[1..10]"]},
        [("describe function", "?function"), ("set default d to val", "default({d}, {val})"),
         ("p-adic, series prec. of x", "padicprec(x, p), serprec(x, v)"), ("basic operations", "+, - , *, /, ^, sqr"),
         ("Euclidean quotient, remainder", "x\\/y, x\\y, x%y, divrem(x, y)"), ("multiply by 2", "shiftmul(x, n)"),
         ("comparison operators", "<=, <, >=, >, ==, !=, ===, lex, cmp"), ("t VECSMALL", "Vecsmall([x, y, z])")])
    assert not wrong, f"PARI refcard page 1: {len(wrong)} faults: {wrong}"


MD = MarkdownIt("commonmark").enable("table")


def rendered(markdown: str) -> tuple[list[int], str]:
    """markdown-it's reading of the Markdown: its heading levels in order, and the text a
    renderer shows (text, code spans and blocks; not raw HTML, which a browser hides)."""
    levels, text = [], []
    for token in MD.parse(markdown):
        if token.type == "heading_open":
            levels.append(int(token.tag[1]))
        elif token.type == "list_item_open" and token.info:  # an ordered item's number shows
            text.append(token.info + token.markup)
        elif token.type in ("fence", "code_block"):
            text.append(token.content)
        elif token.type == "inline":
            text += [c.content for c in token.children or () if c.type in ("text", "code_inline")]
    return levels, "".join(text)


@pytest.mark.parametrize("doc", REALSET, ids=ids(REALSET))
def test_headings_nest(read, doc: Doc):
    levels, _ = rendered("\n\n".join(read[doc.name][1]))
    skips = [(a, b) for a, b in zip(levels, levels[1:]) if b > a + 1]
    assert not skips, f"{doc.name}: {len(skips)} headings skip a level (from, to): {Counter(skips).most_common(4)}"


# Glyphs the Markdown writes as its own marks (bullets as list items).
BULLETS = set("•◦▪▫●○■□‣∙·–—")


@pytest.mark.parametrize("doc", REALSET, ids=ids(REALSET))
def test_no_text_lost_to_emphasis_or_html(read, doc: Doc):
    """Every character of the page's text that its Markdown holds is in what markdown-it
    renders: the page's characters (content order) that the Markdown's source has too,
    less those the rendering shows (a glyph the layer drops is not this test's)."""
    _, markdown, content, _ = read[doc.name]
    lost: Counter = Counter()
    for md, text in zip(markdown, content):
        _, shown = rendered(md)
        held = Counter(c for c in realset.squeeze(text) if c not in BULLETS) & Counter(realset.squeeze(md))
        lost += held - Counter(realset.squeeze(shown))
    assert not lost, f"{doc.name}: {sum(lost.values())} characters not rendered: {lost.most_common(8)}"


def test_a_run_exports_real_documents_as_markdown_that_nests_and_keeps_their_text(tmp_path):
    """Three real documents through `batchocr run --engine textlayer` and `batchocr export
    --format markdown` (the render workers' DocumentText, the export's file layout):
    every exported file's headings nest, and every character of the layer that the file
    holds is shown by markdown-it."""
    import shutil

    from conftest import run_cli

    src = tmp_path / "src"
    src.mkdir()
    picked = [d for d in REALSET if d.name in ("asyRefCard.pdf", "refcard.pdf", "zoo-quickref.pdf")]
    for doc in picked:
        pdf = realset.open_doc(doc)
        pdf.save(src / doc.name) if doc.path.endswith(".gz") else shutil.copy(realset.fetch(doc), src / doc.name)
    run_cli("run", str(src), str(tmp_path / "out"), "--engine", "textlayer", "-q", check=True)
    run_cli("export", str(tmp_path / "out"), str(tmp_path / "md"), "--format", "markdown", check=True)
    files = sorted((tmp_path / "md").glob("*.md"))
    assert len(files) == len(picked)
    for path in files:
        markdown = path.read_text()
        levels, shown = rendered(markdown)
        assert levels and not [(a, b) for a, b in zip(levels, levels[1:]) if b > a + 1], path.name
        doc = next(d for d in picked if path.name.startswith(d.name))
        pdf = realset.open_doc(doc)
        text = "".join(realset.content(page) for page in pdf)
        held = Counter(c for c in text if c not in BULLETS) & Counter(realset.squeeze(markdown))
        lost = held - Counter(realset.squeeze(shown))
        assert not lost, f"{path.name}: {lost.most_common(8)}"

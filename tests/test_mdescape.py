"""batchocr.mdescape: a line of text, escaped, reads back as its characters through a
CommonMark parser (markdown-it-py, with GFM's tables and strikethrough as the text
layer's Markdown uses them), alone, in a paragraph of several lines, after a heading's
or a list item's mark and in a table cell."""

from __future__ import annotations

import html
import re

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from markdown_it import MarkdownIt

from batchocr.mdescape import escape

MD = MarkdownIt("commonmark").enable(["table", "strikethrough"])

# Markup characters often, with letters, digits and spaces around them; any printable character too.
MARKUP = st.sampled_from(list("\\`*_[]()<>&#;!|~-+=.:/?@\"' \taeX019"))
LINE = st.text(st.one_of(MARKUP, MARKUP, st.characters(codec="utf-8").filter(str.isprintable)), max_size=40)


def collapsed(text: str) -> str:
    return " ".join(text.split())


def rendered_text(markdown: str) -> str:
    """The rendered HTML as text: tags dropped, entities decoded."""
    return html.unescape(re.sub(r"<[^>]*>", " ", MD.render(markdown)))


def inline_text(markdown: str, blocks: list[str]) -> str:
    """The text of the one inline token under `blocks` (the block tokens, in order);
    fails if the inline holds anything but text (emphasis, code, a link, HTML)."""
    tokens = MD.parse(markdown)
    assert [t.type for t in tokens if t.type != "inline"] == blocks, markdown
    (inline,) = [t for t in tokens if t.type == "inline"]
    kinds = {c.type for c in inline.children}
    assert kinds <= {"text", "softbreak"}, (markdown, kinds)
    return "".join("\n" if c.type == "softbreak" else c.content for c in inline.children)


@given(LINE)
@settings(max_examples=600)
@example("\\, \"")
@example("<lazy>")
@example("*fsolve")
@example("# not a heading")
@example("1. not a list")
@example("---")
@example("```python")
@example("~~~ fence")
@example("* * *")
@example("+ item")
@example("3) third")
@example("Issue #")
@example("&amp; &#65; &x")
@example("<a@b.co> <http://x.org>")
def test_a_line_reads_back_as_its_characters(line):
    escaped = escape(line)
    assert collapsed(rendered_text(escaped)) == collapsed(line)
    if line.strip():
        assert inline_text(escaped, ["paragraph_open", "paragraph_close"]) == line.strip()


@given(LINE.filter(str.strip))
@settings(max_examples=300)
def test_after_a_heading_mark_a_list_mark_and_in_a_table_cell(line):
    assert inline_text("## " + escape(line), ["heading_open", "heading_close"]) == line.strip()
    item = inline_text("- " + escape(line), ["bullet_list_open", "list_item_open", "paragraph_open",
                                             "paragraph_close", "list_item_close", "bullet_list_close"])
    assert item == line.strip()
    table = "| head |\n| --- |\n| " + escape(line, cell=True) + " |"
    cells = [t for t in MD.parse(table) if t.type == "inline"]
    assert len(cells) == 2 and {c.type for c in cells[1].children} <= {"text"}, table
    assert "".join(c.content for c in cells[1].children) == line.strip()


@given(st.lists(LINE.filter(str.strip), min_size=2, max_size=5))
@settings(max_examples=300)
@example(["a | b", "--- | ---"])
@example(["Title", "==="])
@example(["a", "-"])
def test_lines_one_below_another_stay_one_paragraph(lines):
    """What one line cannot show: a setext underline, a table's delimiter row."""
    text = inline_text("\n".join(map(escape, lines)), ["paragraph_open", "paragraph_close"])
    assert text == "\n".join(ln.strip() for ln in lines)


@pytest.mark.parametrize("line, escaped", [
    ("\\, \"", "\\\\, \""),
    ("<lazy>", "\\<lazy>"),
    ("*fsolve", "\\*fsolve"),
    ("# 1 Introduction", "\\# 1 Introduction"),
    ("2. Results", "2\\. Results"),
    ("- item", "\\- item"),
    ("> quoted", "\\> quoted"),
    ("[1] Knuth", "\\[1] Knuth"),
    ("`code`", "\\`code\\`"),
    ("&copy; 2024", "\\&copy; 2024"),
])
def test_what_would_be_markup_is_escaped(line, escaped):
    assert escape(line) == escaped


@pytest.mark.parametrize("line", [
    "e.g. a well-known snake_case name", "2 * 3 = 6", "a < b and c > d", "C:\\Users\\me", "x_1 + y_2",
    "AT&T", "about ~5 MB", "C# and F#", "-1.5 or +2", "3.14", "page 7 | 12", "!important",
])
def test_what_cannot_be_markup_stays_as_it_is(line):
    assert escape(line) == line
    assert collapsed(rendered_text(line)) == line


def test_a_table_cell_escapes_its_pipes():
    assert escape("a | b", cell=True) == "a \\| b"


def test_the_text_layers_lines_read_back_with_its_own_marks_unescaped():
    """A page's heading, bullets and lines of markup characters: the heading and the list
    are batchocr's marks, the characters of every line come back as the layer holds them."""
    import pymupdf

    from batchocr.layertext import page_markdown

    doc = pymupdf.open()
    page = doc.new_page()
    page.insert_text((72, 72), "Options *and* <flags>", fontsize=20, fontname="hebo")
    body = ["\\, \" is a thin space", "*fsolve finds roots", "<lazy> is evaluated late", "# not a heading",
            "1. not an ordered item", "[1] Knuth, `TeX`", "a_b and &amp; stay"]
    bullets = ["\u2022 *starred* item", "\u2022 <b> item"]
    for k, line in enumerate(body + bullets):
        page.insert_text((72, 120 + 16 * k), line, fontsize=11, fontname="helv")
    markdown = page_markdown(page)
    tokens = MD.parse(markdown)
    assert tokens[0].type == "heading_open" and "".join(c.content for c in tokens[1].children) == "Options *and* <flags>"
    items = [t for t in tokens if t.type == "list_item_open"]
    assert len(items) == 2, markdown
    text = rendered_text(markdown)
    for line in body + [b[2:] for b in bullets]:
        assert line in text, (line, markdown)
    assert "<em>" not in MD.render(markdown) and "<lazy>" not in MD.render(markdown)


def test_the_cpu_engines_lines_are_escaped_and_its_blank_lines_kept():
    from batchocr.engines.rapidocr import markdown

    text = markdown("*fsolve x0\n<lazy> one\n\n# 2 Results")
    assert text == "\\*fsolve x0\n\\<lazy> one\n\n\\# 2 Results"
    assert collapsed(rendered_text(text)) == "*fsolve x0 <lazy> one # 2 Results"

"""Plain text and Markdown, both ways.

`escape`: a line of plain text as Markdown that reads back as its characters: the one
escaping rule for every engine's text that is not Markdown already (the text layer's
lines, the CPU engine's; the vLLM engines' text is the model's own Markdown and stays as
it is). A CommonMark parser (with GFM's tables and strikethrough) renders the escaped
line as the line itself, whitespace runs aside, on its own, after a heading's `# `, a
list item's `- ` or in a table cell.

Only what could be markup where it stands is escaped, so that the text stays readable:
`e.g.`, `well-known`, `snake_case`, `2 * 3`, `a < b` and `C:\\Users` stay as they are;
`*fsolve`, `<lazy>`, `\\,` and a line opening with `# ` or `1. ` do not.

`plain`: Markdown as the plain text it renders to, read from a CommonMark parser's tokens
(markdown-it-py, a well-kept parser: stripping marks by hand would re-implement CommonMark's
escapes, emphasis and block rules), for `export --format text` and `eval` (truth is plain text).
"""

from __future__ import annotations

import functools
import re
import string
from html.parser import HTMLParser

PUNCTUATION = frozenset(string.punctuation)  # what a backslash escapes in CommonMark
# Block starts, on the line's first characters: what matches has its first character escaped.
_BLOCK = re.compile(
    r"#{1,6}(?:[ \t]|$)"  # an ATX heading
    r"|>"  # a block quote
    r"|[-+*](?:[ \t]|$)"  # a bullet list item (an empty one too)
    r"|([-*_])(?:[ \t]*\1){2,}[ \t]*$"  # a thematic break
    r"|(?:=+|-+)[ \t]*$"  # a setext heading's underline
    r"|~{3,}"  # a code fence (a backtick fence has its backticks escaped anyway)
)
_ORDERED = re.compile(r"\d{1,9}([.)])(?:[ \t]|$)")  # an ordered list item: its "." or ")" is escaped
_DELIMITER_ROW = re.compile(r"[ \t:|-]*\|[ \t:|-]*$")  # a table's delimiter row, under a line with pipes
_ENTITY = re.compile(r"&(?:#[0-9]{1,7}|#[xX][0-9a-fA-F]{1,6}|[A-Za-z][A-Za-z0-9]{1,31});")
_CLOSING = re.compile(r"(?:^|[ \t])(#+)[ \t]*$")  # an ATX heading's closing sequence, were the line one
_RUN = re.compile(r"\*+|_+|~+")


def escape(text: str, cell: bool = False) -> str:
    """`text`, one line, with what CommonMark would read as markup backslash-escaped;
    leading and trailing whitespace dropped (a paragraph drops it too, and four leading
    spaces would make a code block). cell: the line goes into a table cell (`|` escaped)."""
    line = text.strip()
    marked = _marked(line, cell)
    return "".join("\\" + c if i in marked else c for i, c in enumerate(line))


def _marked(line: str, cell: bool) -> set[int]:
    """The positions in `line` to escape."""
    out = set()
    if _BLOCK.match(line):
        out.add(0)
    elif ordered := _ORDERED.match(line):
        out.add(ordered.start(1))
    if closing := _CLOSING.search(line):
        out.add(closing.start(1))
    for run in _RUN.finditer(line):
        out |= _delimiters(line, run.start(), run.end())
    pipes = cell or _DELIMITER_ROW.match(line)
    for i, c in enumerate(line):
        nxt = line[i + 1] if i + 1 < len(line) else ""
        if (c == "\\" and (not nxt or nxt in PUNCTUATION)  # an escape, or a hard line break at the end
                or c in "`["  # code spans; links, images and reference definitions
                or c == "<" and _tag_or_autolink(line, i)
                or c == "&" and _ENTITY.match(line, i)
                or c == "|" and pipes):
            out.add(i)
    return out


def _delimiters(line: str, start: int, end: int) -> set[int]:
    """A run of `*`, `_` or `~` that could open or close emphasis (or GFM's strikethrough
    of `~~`): all of it. A run with whitespace on both sides can do neither, nor can `_`
    inside a word (`snake_case`), nor one `~` (markdown-it strikes `~~` only)."""
    before = line[start - 1] if start else " "
    after = line[end] if end < len(line) else " "
    if before.isspace() and after.isspace():
        return set()
    if line[start] == "_" and before.isalnum() and after.isalnum():
        return set()
    if line[start] == "~" and end - start == 1:
        return set()
    return set(range(start, end))


def _tag_or_autolink(line: str, i: int) -> bool:
    """`<` opening inline HTML (a tag, a comment, a declaration: these may go on over
    the next line) or an autolink (which must end on this line, without a space)."""
    nxt = line[i + 1: i + 2]
    if nxt and (nxt in "/!?" or nxt.isascii() and nxt.isalpha()):
        return True
    end = line.find(">", i + 1)
    return bool(nxt) and end > 0 and not any(c.isspace() for c in line[i + 1: end])


@functools.cache
def _parser():
    from markdown_it import MarkdownIt

    # CommonMark with GFM's tables and strikethrough: the Markdown the engines write
    return MarkdownIt("commonmark").enable(["table", "strikethrough"])


def plain(markdown: str) -> str:
    """Markdown as the plain text it renders to, read from a CommonMark parser's tokens
    (markdown-it-py): blocks a blank line apart; a list's items and a table's rows one a
    line (an ordered item keeps its number: the page shows it), a table's cells a tab
    apart; code as its lines; the text of HTML (a model's tables) without its tags."""
    out: list[str] = []
    tight = 0  # lists and tables open: their items and rows go one a line
    fresh = True  # the next block starts a new one: a blank line before it
    prefix = ""
    row: list[str] | None = None

    def add(text: str) -> None:
        nonlocal fresh
        if out:
            out.append("\n\n" if fresh or not tight else "\n")
        out.append(text)
        fresh = False

    for t in _parser().parse(markdown):
        kind = t.type
        if kind in ("bullet_list_open", "ordered_list_open", "table_open"):
            fresh = fresh or not tight
            tight += 1
        elif kind in ("bullet_list_close", "ordered_list_close", "table_close"):
            tight -= 1
            fresh = not tight
        elif kind == "list_item_open":
            prefix = f"{t.info}{t.markup} " if t.info else ""
        elif kind == "tr_open":
            row = []
        elif kind == "tr_close" and row is not None:
            add("\t".join(row))
            row = None
        elif kind == "inline" and row is not None:
            row.append(" ".join(_inline(t.children or []).split()))
        elif kind == "inline":
            add(prefix + _inline(t.children or []))
            prefix = ""
        elif kind in ("fence", "code_block"):
            add(t.content.rstrip("\n"))
        elif kind == "html_block":
            text = _html_text(t.content)
            if text:
                add(text)
    return "".join(out)


def _inline(children: list) -> str:
    """An inline token's text: emphasis, links and tags off, their text kept, an image as its alt text."""
    out = []
    for c in children:
        if c.type in ("text", "code_inline"):
            out.append(c.content)
        elif c.type in ("softbreak", "hardbreak") or c.type == "html_inline" and re.match(r"<br\b", c.content, re.I):
            out.append("\n")
        elif c.type == "image":
            out.append(_inline(c.children or []))
    return "".join(out)


class _HTMLText(HTMLParser):
    """HTML's text by lines: a block element or a row starts a line, a cell is a tab apart."""

    LINES = {"br", "p", "div", "tr", "li", "table", "caption", "pre", "blockquote", "ul", "ol", "dt", "dd",
             "h1", "h2", "h3", "h4", "h5", "h6"}

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.lines: list[list[str]] = [[]]  # each line's cells

    def handle_starttag(self, tag: str, attrs: list) -> None:
        if tag in ("td", "th"):
            self.lines[-1].append("")
        elif tag in self.LINES:
            self.lines.append([])

    def handle_endtag(self, tag: str) -> None:
        if tag in self.LINES:
            self.lines.append([])

    def handle_data(self, data: str) -> None:
        cells = self.lines[-1]
        if cells:
            cells[-1] += data
        elif data.strip():
            cells.append(data)

    def text(self) -> str:
        lines = ("\t".join(" ".join(c.split()) for c in cells) for cells in self.lines)
        return "\n".join(ln for ln in lines if ln.strip())


def _html_text(html: str) -> str:
    parser = _HTMLText()
    parser.feed(html)
    parser.close()
    return parser.text()

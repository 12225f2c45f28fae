"""A line of plain text as Markdown that reads back as its characters: the one escaping
rule for every engine's text that is not Markdown already (the text layer's lines, the
CPU engine's; the vLLM engines' text is the model's own Markdown and stays as it is). A CommonMark parser (with GFM's tables and strikethrough) renders the
escaped line as the line itself, whitespace runs aside, on its own, after a heading's
`# `, a list item's `- ` or in a table cell.

Only what could be markup where it stands is escaped, so that the text stays readable:
`e.g.`, `well-known`, `snake_case`, `2 * 3`, `a < b` and `C:\\Users` stay as they are;
`*fsolve`, `<lazy>`, `\\,` and a line opening with `# ` or `1. ` do not.
"""

from __future__ import annotations

import re
import string

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

"""Layout blocks out of a grounding OCR model's answer (DeepSeek-OCR, Unlimited-OCR).

The models write each block's kind and box before its content, in reading order:

- DeepSeek-OCR: `<|ref|>TYPE<|/ref|><|det|>[[x1, y1, x2, y2]]<|/det|>` then the content,
  coordinates on a 0-999 grid of the page image (its own post-processing divides by 999);
  a det may hold several boxes, `[[...], [...]]`.
- Unlimited-OCR: `<|det|>TYPE [x1, y1, x2, y2]<|/det|>` then the content, on a 0-1000
  grid (the paper, section 4.1: PaddleOCR's blocks "normalized to the range of 0-1000").
  Its reference code (`re_match` in modeling_unlimitedocr.py) reads both forms, so both
  are read for both models.

`parse` gives the page's Markdown with every tag removed and the blocks. Decisions:

- No tag at all (a prompt without layout, e.g. DeepSeek-OCR's "Free OCR."): the text as
  it came, less the end-of-sentence token; blocks None (the model gave no layout, as for
  engines without one). Any tag: a list, one block per tag in the model's order.
- Text before the first tag is a block of its own, with type and box None, so the
  page's text is always its blocks' texts joined by blank lines.
- Cut off at max tokens: a tag left unfinished at the end (mid-tag or mid-box) is
  dropped; a block whose content was cut keeps what it has (the row's finish_reason
  says `length`).
- A box outside the grid is clamped to the page (the model's best guess, not a reason
  to lose the block); corners given in the wrong order are sorted; a box that cannot be
  read (not four numbers) is None, the block and its text stay. Several boxes in one
  det: their union (the block's text is one, so is its block).
- An `image` block, which has no text, becomes a Markdown image where the figure was,
  as DeepSeek-OCR's and Unlimited-OCR's own post-processing do (`![](images/0.jpg)`,
  written next to a crop they save). batchocr saves no crops, so the link names the
  region in the page's pixels, in the form olmOCR's prompt asks for:
  `![](page_<x>_<y>_<width>_<height>.png)`.
- As in both models' post-processing, `\\coloneqq` becomes `:=` and `\\eqqcolon` `=:`.
"""

from __future__ import annotations

import re

# The end-of-sentence token's text, which skip_special_tokens=False leaves at the end.
EOS = ("<｜end▁of▁sentence｜>", "<|end▁of▁sentence|>")
DEEPSEEK_GRID = 999
UNLIMITED_GRID = 1000

_TAG = re.compile(
    r"<\|ref\|>(?P<ref>[^<]*)<\|/ref\|>\s*<\|det\|>(?P<ref_box>[^<]*)<\|/det\|>"  # DeepSeek-OCR
    r"|<\|det\|>\s*(?P<label>[A-Za-z_][\w-]*)?\s*(?P<box>[^<]*)<\|/det\|>"  # Unlimited-OCR
)
# What is left of a tag the answer was cut in, to its end: an opening never closed, or
# the text of a tag token itself cut ("<|re", where tokens are not whole tags).
_UNFINISHED = re.compile(r"(?:<\|ref\|>|<\|det\|>)(?:(?!<\|/det\|>).)*\Z|<\|[a-z/]*\|?\Z", re.S)
_STRAY = re.compile(r"<\|/?(?:ref|det|grounding)\|>")
_BOX = re.compile(r"\[\s*(-?\d+(?:\.\d+)?)\s*,\s*(-?\d+(?:\.\d+)?)\s*,\s*(-?\d+(?:\.\d+)?)\s*,"
                  r"\s*(-?\d+(?:\.\d+)?)\s*\]")
_LEADING_BLANK_LINES = re.compile(r"\A(?:[ \t]*\n)+")


def parse(raw: str, width: int, height: int) -> tuple[str, list[dict] | None]:
    """The page's Markdown and its blocks, from a model's raw answer for a page image
    of width x height pixels. Each block: {"type", "box" [x1, y1, x2, y2] in the page's
    pixels, "box_norm" the same as fractions 0-1 of the page, "text"}."""
    raw = _without_eos(raw)
    matches = list(_TAG.finditer(raw))
    cut = _UNFINISHED.search(raw, matches[-1].end() if matches else 0)
    if not matches and cut is None:
        return raw, None
    end = cut.start() if cut is not None else len(raw)  # a first tag cut: layout, no block finished
    blocks = []
    preamble = _content(raw[:matches[0].start() if matches else end])
    if preamble:
        blocks.append({"type": None, "box": None, "box_norm": None, "text": preamble})
    for m, nxt in zip(matches, [*matches[1:], None]):
        kind = m.group("ref") if m.group("ref") is not None else m.group("label")
        grid = DEEPSEEK_GRID if m.group("ref") is not None else UNLIMITED_GRID
        corners = _box(m.group("ref_box") if m.group("ref") is not None else m.group("box"), grid)
        norm = None if corners is None else [c / grid for c in corners]
        # c * side / grid, not (c / grid) * side: 290 on the 0-1000 grid of 100 px is 29, not 28.999...
        box = None if corners is None else [int(c * side / grid) for c, side in zip(corners, (width, height) * 2)]
        text = _content(raw[m.end():nxt.start() if nxt else end])
        kind = kind.strip() if kind is not None else None
        if kind == "image":
            text = "\n".join(filter(None, [_image_link(box), text]))
        blocks.append({"type": kind or None, "box": box, "box_norm": norm, "text": text})
    return "\n\n".join(b["text"] for b in blocks if b["text"]), blocks


def _without_eos(raw: str) -> str:
    stripped = raw.rstrip()
    for eos in EOS:
        if stripped.endswith(eos):
            return stripped[: -len(eos)]
    return raw


def _box(text: str, grid: int) -> list[float] | None:
    """The union of the boxes written in `text` on the grid, clamped to it."""
    boxes = [[float(v) for v in m.groups()] for m in _BOX.finditer(text)]
    if not boxes:
        return None
    clamp = lambda v: min(max(v, 0.0), float(grid))  # noqa: E731
    x1 = min(min(b[0], b[2]) for b in boxes)
    y1 = min(min(b[1], b[3]) for b in boxes)
    x2 = max(max(b[0], b[2]) for b in boxes)
    y2 = max(max(b[1], b[3]) for b in boxes)
    return [clamp(x1), clamp(y1), clamp(x2), clamp(y2)]


def _content(text: str) -> str:
    text = _STRAY.sub("", text).replace("\\coloneqq", ":=").replace("\\eqqcolon", "=:")
    return _LEADING_BLANK_LINES.sub("", text).rstrip()


def _image_link(box: list[int] | None) -> str:
    if box is None:
        return "![]()"
    x1, y1, x2, y2 = box
    return f"![](page_{x1}_{y1}_{x2 - x1}_{y2 - y1}.png)"

"""Document mode: consecutive pages of a document in one request, the output split back a part
a page. A group whose output does not split (or hit the token limit, looped, or was refused) is
never shifted onto the wrong rows: its pages are read again alone, and their rows leave together."""

from __future__ import annotations

import re

from batchocr.engines.vllm.request import Group, Page, Request

# Why a document group's pages were read again one by one (OUT/_runs: engine_params.groups).
FALLBACK_REASONS = ("split", "length", "repetition", "rejected", "engine_error")


def split_pages(raw: str, separator: str, pages: int) -> list[str] | None:
    """A document request's output, a part a page, or None where it does not split into
    exactly `pages` parts: then no part is given to any page (text is never shifted onto
    the wrong row). A separator before the first page (Unlimited-OCR's reference code
    expects one before every page: `outputs.split('<PAGE>')[1:]`) or after the last is no
    page; the separator is matched in any case."""
    parts = re.split(re.escape(separator), raw, flags=re.IGNORECASE)
    if len(parts) > pages and not parts[0].strip():
        parts = parts[1:]
    if len(parts) > pages and not parts[-1].strip():
        parts = parts[:-1]
    return [p.strip("\n") for p in parts] if len(parts) == pages else None


def shares(total: int, parts: list[str]) -> list[int]:
    """A group's output tokens shared between its pages by their text's length (evenly
    where there is no text), summing to the group's: a page's `output_tokens` in document mode."""
    weights = [len(p) for p in parts]
    if not sum(weights):
        weights = [1] * len(parts)
    exact = [total * w / sum(weights) for w in weights]
    out = [int(x) for x in exact]
    for i in sorted(range(len(parts)), key=lambda i: exact[i] - out[i], reverse=True)[:total - sum(out)]:
        out[i] += 1
    return out


def grouped(request: Request, row: dict) -> list[dict]:
    """A page read again for a failed group: its row waits for the group's last, and then
    the group's rows leave together. Any other request's row leaves at once."""
    group = request.group
    if group is None:
        return [row]
    group.rows.append(row)
    return group.rows if len(group.rows) == group.pages else []


class Documents:
    """One engine's document groups: how each finished, counted for its run record (groups sent,
    given back a part a page, read again page by page and why)."""

    def __init__(self, separator: str):
        self.separator = separator
        self.counts = {"sent": 0, "split": 0, "fallback": 0} | {f"fallback_{r}": 0 for r in FALLBACK_REASONS}

    def sent(self) -> None:
        self.counts["sent"] += 1

    def parts(self, request: Request, finish_reason: str | None, raw: str | None) -> list[str] | str:
        """A finished group's output a part a page, or (a str) the reason its pages are read
        again: its output did not split, hit the token limit, or vLLM ended it otherwise."""
        parts = split_pages(raw, self.separator, len(request.pages)) if raw is not None else None
        reason = "length" if finish_reason == "length" else ("split" if parts is None else None)
        if finish_reason not in ("stop", "length"):
            reason = "engine_error"
        if reason is None:
            self.counts["split"] += 1
            return parts
        return reason

    def failed(self, reason: str) -> None:
        self.counts["fallback"] += 1
        self.counts[f"fallback_{reason}"] += 1

    def pages_alone(self, request: Request) -> list[Request]:
        """A failed group's pages, a request each, each with its share of the group's tokens;
        their rows leave together (grouped)."""
        group = Group(len(request.pages))
        return [Request([page], group=group, spent=share)
                for page, share in zip(request.pages, shares(len(request.tokens), [""] * len(request.pages)))]

    def unread(self, request: Request, reason: str, finish_reason: str | None) -> list[tuple[Page, str, int]]:
        """With document_fallback off (benchmarks on random weights): each page of a failed group,
        the error message its row gets and its share of the group's tokens."""
        n = len(request.pages)
        why = {"split": f"its output did not split into {n} parts on {self.separator!r}",
               "length": "its output hit the token limit", "repetition": "its output kept repeating itself",
               "rejected": "vLLM rejected the request",
               "engine_error": f"vLLM finished the request with {finish_reason!r}"}[reason]
        return [(page, f"page {page.page_index}: read in a group of {n} pages, and {why} (document_fallback is off)",
                 share) for page, share in zip(request.pages, shares(len(request.tokens), [""] * n))]

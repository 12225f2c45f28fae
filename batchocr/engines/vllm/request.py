"""What the vLLM engine sends and tracks: a request of one page or of a document's group of pages."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Page:
    doc_id: str
    page_index: int
    width: int
    height: int
    image: bytes


@dataclass
class Group:
    """The pages of a document request whose output could not be given back a part a
    page: each is read again alone (mode `fallback`), and the group's rows leave
    together once the last is done, so that a group is committed whole."""

    pages: int
    rows: list[dict] = field(default_factory=list)


@dataclass
class Request:
    """One request to vLLM: one page (page mode, or a page read again after its group
    failed), or several consecutive pages of one document (document mode)."""

    pages: list[Page]
    document: bool = False
    attempt: int = 1
    group: Group | None = None  # the failed group this page is read again for
    spent: int = 0  # tokens generated for these pages before this request: earlier attempts, its group's share
    started: float = 0.0
    prompt_tokens: int | None = None
    tokens: list[int] = field(default_factory=list)
    text: list[str] = field(default_factory=list)

    @property
    def mode(self) -> str:
        return "document" if self.document else ("fallback" if self.group is not None else "page")


def retry(request: Request) -> Request:
    """The request's next attempt (its output looped): the tokens spent so far still count."""
    return Request(request.pages, attempt=request.attempt + 1, group=request.group,
                   spent=request.spent + len(request.tokens))

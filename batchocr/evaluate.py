"""Character error rate of a run's page text against ground-truth text files.

Truth layout: TRUTH/<document file name>/<page_index>.txt, e.g. truth/scan.pdf/0.txt.
A page's Markdown is scored as the plain text it renders to (batchocr.mdescape.plain:
no heading hashes or escapes; the truth is plain text). Whitespace is normalised (every
run of it becomes one space) on both sides, so line breaks and column alignment do not
count; characters do.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass
from pathlib import Path

import polars as pl
from rapidfuzz.distance import Levenshtein

from batchocr.errors import ConfigError
from batchocr.mdescape import plain
from batchocr.sources import native


_PAGE = re.compile(r"[0-9]+")


def _shown(name: str) -> str:
    """A file name as printed and tabled: bytes that are not UTF-8 (surrogate escapes, as
    os.fsdecode gives them) as \\xNN; polars and stdout refuse the escapes themselves."""
    return name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def _rate(errors: int, chars: int) -> float:
    """Errors over truth characters; a blank truth (0 characters): 1.0 if anything was read."""
    return errors / chars if chars else float(errors > 0)


def normalise(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def levenshtein(a: str, b: str) -> int:
    """Edit distance (insertions, deletions, substitutions), by rapidfuzz in C++:
    100x the pure-Python bit-parallel version it replaces on a 3,000-character page."""
    return Levenshtein.distance(a, b)


@dataclass(frozen=True)
class Evaluation:
    pages: pl.DataFrame  # document, page_index, chars, errors, cer, finish_reason
    missing: list[str]  # truth pages with no row in the output

    @property
    def errors(self) -> int:
        return int(self.pages["errors"].sum()) if self.pages.height else 0

    @property
    def chars(self) -> int:
        return int(self.pages["chars"].sum()) if self.pages.height else 0

    @property
    def cer(self) -> float:
        """Over every page; truth pages all empty (blank pages): 1.0 if anything was read on
        them, as each such page counts (it said 0.00%, and --max-cer 0 passed)."""
        return _rate(self.errors, self.chars)


def _truth_text(path: Path) -> str:
    """A truth file's text: UTF-8 (a BOM allowed), as the README asks; anything else is the
    user's to fix, named (not a UnicodeDecodeError traceback)."""
    try:
        return path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"truth file {path} is not UTF-8 text (byte {exc.start}: {exc.object[exc.start:exc.start + 1]!r}): "
                          "save it as UTF-8") from None
    except OSError as exc:
        raise ConfigError(f"truth file {path}: {exc.strerror or exc}") from None


def evaluate(pages: pl.DataFrame, truth_dir: str | Path) -> Evaluation:
    """pages: the page table (needs source_uri, page_index, text, finish_reason)."""
    truth_dir = Path(truth_dir)
    if not truth_dir.is_dir():
        raise ConfigError(f"truth folder {truth_dir} does not exist")
    truth, files = {}, {}
    for p in sorted(truth_dir.glob("*/*.txt")):
        if not _PAGE.fullmatch(p.stem):  # 0.txt, 12.txt (not ².txt, which isdigit() takes)
            continue
        key = (p.parent.name, int(p.stem))
        if key in files:  # 0.txt and 00.txt: one would be dropped unread
            raise ConfigError(f"truth files {_shown(str(files[key]))} and {_shown(str(p))} are both page {key[1]} of {_shown(key[0])}: "
                              "keep one")
        files[key] = p
        truth[key] = normalise(_truth_text(p))
    if not truth:
        raise ConfigError(f"no truth files in {truth_dir} (expected <document name>/<page_index>.txt)")
    names = {name for name, _ in truth}
    uris: dict[str, set[str]] = {}  # a truth name -> the documents of that file name
    rows, seen, unopened = [], set(), set()

    def score(name: str, index: int, text: str | None, reason: str) -> None:
        seen.add((name, index))
        ref = truth[(name, index)]
        errors = levenshtein(normalise(plain(text or "")), ref)
        rows.append({"document": _shown(name), "page_index": index, "chars": len(ref), "errors": errors,
                     "cer": _rate(errors, len(ref)), "finish_reason": reason})

    for uri, index, text, reason in pages.select("source_uri", "page_index", "text", "finish_reason").iter_rows():
        name = native(posixpath.basename(uri))  # the file's own name: source_uri spells % as %25
        if name not in names:
            continue
        uris.setdefault(name, set()).add(uri)
        if index < 0:  # a document that could not be opened: its pages count, every character wrong
            unopened.add(name)
        elif (name, index) in truth:
            score(name, index, text, reason)
    alike = {name: sorted(u) for name, u in uris.items() if len(u) > 1}
    if alike:
        name, found = next(iter(sorted(alike.items())))
        raise ConfigError(f"truth {truth_dir}/{_shown(name)}/ matches {len(found)} documents of that file name "
                          f"({found[0]}, {found[1]}{', ...' if len(found) > 2 else ''}): truth is matched by "
                          "file name, so evaluate them in OUTs of their own")
    for name, index in sorted(set(truth) - seen):
        if name in unopened:
            score(name, index, None, "error")
    missing = sorted(f"{_shown(name)}/{index}" for name, index in set(truth) - seen)
    schema = {"document": pl.String, "page_index": pl.Int32, "chars": pl.Int64, "errors": pl.Int64,
              "cer": pl.Float64, "finish_reason": pl.String}
    frame = pl.DataFrame(rows, schema=schema).sort("document", "page_index")
    return Evaluation(frame, missing)


def evaluate_output(pages: pl.LazyFrame, truth_dir: str | Path,
                    stale: frozenset[str] | set[str] = frozenset()) -> Evaluation:
    """CER of an output's page table (as `read_pages` gives it), one row per page:
    a page redone before compaction (a changed document, a retry, a `--reprocess`) counts
    once, the row `batchocr compact` would keep. stale: runs made with settings OUT no
    longer has (batchocr.producer.stale_in)."""
    from batchocr.compact import dedupe

    rows = dedupe(pages.select("doc_id", "source_etag", "source_uri", "page_index", "page_count", "text",
                               "finish_reason", "processed_at", "run_id").collect(), stale)
    return evaluate(rows, truth_dir)


def page_line(p: dict) -> str:
    """One evaluated page, as `eval` and `report` print it."""
    return (f"{p['document']:<28} page {p['page_index']:>4}  {p['errors']:>5}/{p['chars']:<6} "
            f"CER {p['cer']:7.2%}  {p['finish_reason']}")

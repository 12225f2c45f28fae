"""The real test set of born-digital PDFs (issue 50): files from Debian 12's documentation
packages that nobody here made, fetched by tools.debian_doc (`apt-get download`, cached
under .tools/debian/), and what tests/test_realset.py and bench/textlayer_real.py need
to read them: each document's kind and producer, whether that producer writes its content
stream in reading order, the pages measured, and `plain()`, the Markdown's text without
its marks.

Whether a producer writes reading order is decided from two pieces of evidence: how it
makes the page (TeX, groff and word processors set text in the order of their source,
one paragraph after the other, column after column; a printer driver or a spreadsheet's
exporter writes whatever order the application draws in), and the rendered pages read
against `page.get_text()` (the content order) on each document's first pages. Documents
whose producer is not known to write reading order are held against hand-checked
anchors instead (HAND_CHECKED).
"""

from __future__ import annotations

import gzip
import re
from dataclasses import dataclass
from pathlib import Path

CARD, ARTICLE, MANUAL, WORD = "card", "article", "manual", "word processor"


@dataclass(frozen=True)
class Doc:
    package: str
    path: str
    kind: str
    producer: str  # the file's metadata, producer / creator
    ordered: bool  # the producer writes its content stream in reading order
    pages: int | None = None  # the first N pages only (a long manual), else every page

    @property
    def name(self) -> str:
        return Path(self.path).name.removesuffix(".gz")

    @property
    def bound(self) -> float:
        """The largest distance from the content order a page of it may have."""
        return 0.10 if self.kind == CARD else 0.05


_ASY = "usr/share/doc/asymptote/"
_PARI = "usr/share/pari/doc/"
_ZOO = "usr/lib/R/site-library/zoo/doc/"
_GROFF = "usr/share/doc/groff-base/"
_TEX = "pdfTeX-1.40.24 / TeX"
_PARI_TEX = "PARI / pdfTeX"
_RGS = "GPL Ghostscript 9.56.1 / LaTeX with hyperref"  # R's compactPDF: pdfTeX's file rewritten by gs
_DVIPDFM = "dvipdfmx (20100328) / LaTeX with hyperref package"
_GROPDF = "gropdf version 1.22.4 / groff version 1.22.4"

REALSET = [
    Doc("asymptote-doc", _ASY + "asyRefCard.pdf", CARD, _TEX, True),
    Doc("asymptote-doc", _ASY + "CAD.pdf", ARTICLE, _TEX, True),
    Doc("asymptote-doc", _ASY + "asy-latex.pdf", MANUAL, "pdfTeX-1.40.24 / LaTeX with hyperref", True),
    Doc("asymptote-doc", _ASY + "TeXShopAndAsymptote.pdf", ARTICLE, _TEX, True),
    Doc("pari-doc", _PARI + "refcard.pdf", CARD, _PARI_TEX, True),
    Doc("pari-doc", _PARI + "refcard-ell.pdf", CARD, _PARI_TEX, True),
    Doc("pari-doc", _PARI + "refcard-nf.pdf", CARD, _PARI_TEX, True),
    Doc("pari-doc", _PARI + "refcard-mf.pdf", CARD, _PARI_TEX, True),
    Doc("pari-doc", _PARI + "refcard-lfun.pdf", CARD, _PARI_TEX, True),
    Doc("pari-doc", _PARI + "parallel.pdf", MANUAL, _PARI_TEX, True),
    Doc("pari-doc", _PARI + "INSTALL.pdf", MANUAL, _PARI_TEX, True),
    Doc("octave-doc", "usr/share/doc/octave/refcard-a4.pdf", CARD, _TEX, True),
    Doc("libtasn1-doc", "usr/share/doc/libtasn1-doc/libtasn1.pdf", MANUAL, _TEX, True),
    Doc("glpk-doc", "usr/share/doc/glpk-doc/glpk.pdf", MANUAL, _DVIPDFM, True, pages=40),
    Doc("glpk-doc", "usr/share/doc/glpk-doc/cnfsat.pdf", ARTICLE, "dvipdfmx (20100328) / TeX output", True),
    Doc("r-cran-zoo", _ZOO + "zoo.pdf", ARTICLE, _RGS, True),
    Doc("r-cran-zoo", _ZOO + "zoo-quickref.pdf", ARTICLE, _RGS, True),
    Doc("r-cran-zoo", _ZOO + "zoo-design.pdf", ARTICLE, _RGS, True),
    Doc("r-cran-zoo", _ZOO + "zoo-faq.pdf", ARTICLE, _RGS, True),
    Doc("r-cran-lmtest", "usr/lib/R/site-library/lmtest/doc/lmtest-intro.pdf", ARTICLE,
        "GPL Ghostscript 9.54.0 / LaTeX with hyperref", True),
    Doc("nut-doc", "usr/share/doc/nut-doc/pdf/packager-guide.pdf", MANUAL, "pdfTeX-1.40.24 / DBLaTeX-0.3.12", True),
    Doc("sdcc-doc", "usr/share/doc/sdcc-doc/sdccman.pdf.gz", MANUAL, "pdfTeX-1.40.24 / LaTeX with hyperref", True,
        pages=30),
    Doc("groff", _GROFF + "examples/mom/mom-pdf.pdf.gz", MANUAL, _GROPDF, True),
    Doc("groff", _GROFF + "pdf/automake.pdf.gz", MANUAL, _GROPDF, True),
    Doc("groff", _GROFF + "examples/mom/typesetting.pdf.gz", ARTICLE, _GROPDF, True),
    Doc("groff", _GROFF + "examples/mom/letter.pdf.gz", ARTICLE, _GROPDF, True),
    Doc("gutenprint-doc", "usr/share/doc/gutenprint-doc/gutenprint-users-manual.pdf", WORD,
        "LibreOffice 5.2 / Writer", True, pages=30),
    Doc("fonts-sil-padauk", "usr/share/doc/fonts-sil-padauk/documentation/Padauk-features.pdf.gz", WORD,
        "LibreOffice 7.1 / Writer", True),
    Doc("fonts-sil-abyssinica", "usr/share/doc/fonts-sil-abyssinica/documentation/AbyssinicaSILFontFeatures.pdf.gz",
        WORD, "LibreOffice 7.1 / Writer", True),
    Doc("fonts-sil-dai-banna", "usr/share/doc/fonts-sil-dai-banna/doc/DaiBannaSIL.pdf.gz", WORD,
        "GPL Ghostscript 8.64 / PScript5.dll Version 5.2", False),
    Doc("fonts-sil-ezra", "usr/share/doc/fonts-sil-ezra/Unicode-Ezra-Chart17short.pdf.gz", WORD,
        "Acrobat Distiller 7.0.5 (Windows) / Acrobat PDFMaker 7.0.7 for Excel", False),
]

# Hand-checked reading order (pages of documents whose producer is not known to write it):
# (package, file name, page index) -> phrases in the order a reader meets them on the
# rendered page (page.get_pixmap()), each a substring of the plain text (whitespace off).
# Excel (PDFMaker) writes the sheet's row numbers (1-39) and column letters first, then the
# cells row by row; a reader reads the sheet row by row, the labels aside. The Word document
# printed through PScript5 and Distiller reads as its content order on these pages. Checked
# against each page rendered at 80 dpi.
HAND_CHECKED: dict[tuple[str, str, int], list[str]] = {
    ("fonts-sil-ezra", "Unicode-Ezra-Chart17short.pdf", 0): [
        "SIL Ezra to Unicode Chart", "POST or Glyph Name", "Description/Difficulties/Comments",
        "entire Latin set (1252)", "required for WIN OpenType fonts", "quotedblright", "201D",
        "RIGHT DOUBLE QUOTATION MARK", "parenleft", "0028", "LEFT PARENTHESIS (opening)",
        "The shape displayed will be the opening paren", "asterisk", "002A", "ASTERISK", "zero", "0030",
        "DIGIT ZERO", "nine", "0039", "DIGIT NINE", "athnah", "0591", "HEBREW ACCENT ETNAHTA", "atnah",
        "Gen 1:1:3", "class2zarqa", "0598", "HEBREW ACCENT ZARQA", "sinnorit", "Psa 2:7:5"],
    ("fonts-sil-dai-banna", "DaiBannaSIL.pdf", 2): [
        "Introduction", "Dai Banna SIL is a Unicode font package", "Two font families, differing only in weight",
        "Dai Banna SIL Light", "Dai Banna SIL Book", "The New Tai Lue script is used by approximately 300,000",
        "We particularly thank the Dai News Department", "We are also grateful for the assistance",
        "located in Beijing, China.", "The New Tai Lue block was first added to Unicode 4.1"],
    ("fonts-sil-dai-banna", "DaiBannaSIL.pdf", 5): [
        "Features and Requirements", "The Dai Banna SIL fonts are encoded in", "to the left of the base consonant:",
        "U+19B5", "NEW TAI LUE VOWEL SIGN E", "U+19B6", "NEW TAI LUE VOWEL SIGN AE", "U+19B7",
        "NEW TAI LUE VOWEL SIGN O", "U+19BA", "NEW TAI LUE VOWEL SIGN AY", "Visual reordering is required",
        "SIL WorldPad 2.4 & 2.8 (Windows)", "OpenOffice Writer 3.2.1", "gedit 2.30.3", "More information on Graphite",
        "Besides Graphite", "more capable OpenType shapers are available yet."],
}


def fetch(doc: Doc) -> Path:
    """The document's file (tools.debian_doc; raises tools.Unavailable)."""
    import tools

    return tools.debian_doc(doc.package, doc.path)


def open_doc(doc: Doc) -> pymupdf.Document:  # noqa: F821 (pymupdf is imported here, not by tools.py)
    """The document opened (a gzipped file unpacked in memory)."""
    import pymupdf

    path = fetch(doc)
    if path.suffix == ".gz":
        return pymupdf.open(stream=gzip.decompress(path.read_bytes()), filetype="pdf")
    return pymupdf.open(path)


def measured_pages(doc: Doc, pdf) -> range:
    return range(min(doc.pages or pdf.page_count, pdf.page_count))


# Ligatures a font maps to one code point (page_markdown expands them; the content order keeps them).
LIGATURES = str.maketrans({"\ufb00": "ff", "\ufb01": "fi", "\ufb02": "fl", "\ufb03": "ffi", "\ufb04": "ffl",
                           "\ufb05": "st", "\ufb06": "st"})
_FENCE = re.compile(r"^ {0,3}(```|~~~).*$", re.M)
_RULE_ROW = re.compile(r"^ *\|?( *:?-{3,}:? *\|)+ *:?-*:? *$", re.M)
_BLOCK_MARK = re.compile(r"^ {0,3}(#{1,6}(?= |$)|[-*+] (?=\S)|> ?)", re.M)
_ESCAPE = re.compile(r"\\([!-/:-@\[-`{-~])")
_INLINE_MARK = re.compile(r"(?<!\\)(\*\*|__|`+)")


def plain_lines(markdown: str) -> list[str]:
    """The Markdown's lines without its marks: heading hashes, bullets, block quotes,
    code fences, table pipes and rule rows, bold and code-span marks, backslash escapes."""
    text = _RULE_ROW.sub("", _FENCE.sub("", markdown))
    text = _BLOCK_MARK.sub("", text)
    out = []
    for line in text.splitlines():
        if line.lstrip().startswith("|"):
            line = re.sub(r"(?<!\\)\|", " ", line)
        out.append(_ESCAPE.sub(r"\1", _INLINE_MARK.sub("", line)).translate(LIGATURES))
    return out


def squeeze(text: str) -> str:
    """Whitespace removed (and ligatures expanded): what the distances compare."""
    return "".join(text.translate(LIGATURES).split())


def plain(markdown: str) -> str:
    """The Markdown's text without marks or whitespace."""
    return squeeze("\n".join(plain_lines(markdown)))


# A bullet opening a line (a glyph, or a dash or star before a space): a list's mark,
# which the Markdown writes as "- ".
_BULLET = re.compile(r"^\s*([•◦▪▫●○■□‣∙·]\s*|[-–—*]\s+)", re.M)


def content(page) -> str:
    """The page's content order (the producer's), bullet glyphs and whitespace removed;
    read with the text layer's own flags (get_text's default puts a glyph's CID where
    its font maps it to no character: a guess, which the layer writes as U+FFFD)."""
    import pymupdf

    return squeeze(_BULLET.sub("", page.get_text(flags=pymupdf.TEXT_MEDIABOX_CLIP)))


def in_order(text: str, anchors: list[str]) -> bool:
    """Whether the anchors (whitespace off) come in `text` one after the other."""
    at = 0
    for anchor in anchors:
        found = text.find(squeeze(anchor), at)
        if found < 0:
            return False
        at = found + len(squeeze(anchor))
    return True

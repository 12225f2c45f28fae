"""Reading order and deskew: geometry on hand-placed boxes (fast), then the real
rapidocr engine end to end on generated pages with ground truth (tests/layouts.py):
CER per page before (reading order, deskew and rescale off: the engine as it was)
and after."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from batchocr import deskew, readingorder, upright
from batchocr.readingorder import Box

H = 30  # a line's box height, px


def line(x0: float, y: float, x1: float, text: str, h: float = H) -> Box:
    return Box(x0, y, x1, y + h, text)


def column(x0: float, x1: float, y: float, texts: list[str], step: float = 40) -> list[Box]:
    """A column's lines; each text padded with '~' to a text line's length."""
    return [line(x0, y + k * step, x1, t.ljust(30, "~")) for k, t in enumerate(texts)]


def words(text: str) -> list[str]:
    return [w.rstrip("~") for w in text.split()]


def test_two_columns_read_column_by_column_with_spanning_title_and_full_width_line():
    left = [f"L{k}" for k in range(6)]
    right = [f"R{k}" for k in range(6)]
    boxes = (
        [line(500, 0, 1000, "Title", 50)]  # centred, taller: not the right column's first line
        + column(100, 700, 100, left) + column(760, 1400, 100, right)
        + [line(100, 360, 1400, "A full-width line")]
        + column(100, 700, 420, ["l0", "l1"]) + column(760, 1400, 420, ["r0", "r1"])
    )
    text = readingorder.read(boxes)
    assert words(text) == ["Title"] + left + right + ["A", "full-width", "line", "l0", "l1", "r0", "r1"]
    assert "\n\n" in text  # blocks apart


def test_three_columns_with_a_heading_in_the_first_and_lines_not_level():
    # the first column starts with a heading, so its lines sit half a line lower
    a = column(100, 500, 20, ["Heading", "a1", "a2", "a3"])
    b = column(540, 940, 0, ["b0", "b1", "b2", "b3"])
    c = column(980, 1380, 0, ["c0", "c1", "c2"])
    assert words(readingorder.read(a + b + c)) == [
        "Heading", "a1", "a2", "a3", "b0", "b1", "b2", "b3", "c0", "c1", "c2"]


def test_a_heading_under_two_columns_goes_with_the_section_across_the_page():
    """As on the real scanned sheet (test below): a heading a block gap under the columns and
    nearer the full-width section it opens is read after both columns, not as the left
    column's last line; a left column's last line that is not apart from it stays."""
    left, right = [f"L{k}" for k in range(6)], [f"R{k}" for k in range(6)]
    section = [line(100, 430, 1400, "A full-width bullet line".ljust(60, "~")),
               line(100, 470, 1400, "another full-width line".ljust(60, "~"))]
    cols = column(100, 700, 100, left) + column(760, 1400, 100, right)
    heading = line(100, 375, 380, "Additional Features")  # 45 px under L5's bottom, 25 px over the section
    assert words(readingorder.read(cols + [heading] + section)) == (
        left + right + ["Additional", "Features", "A", "full-width", "bullet", "line", "another", "full-width", "line"])
    last = line(100, 340, 380, "L6 ends the column")  # the left column's own last line: no gap above
    assert words(readingorder.read(cols + [last] + [line(100, 420, 1400, "X".ljust(60, "~"))])) == (
        left + ["L6", "ends", "the", "column"] + right + ["X"])


def test_a_narrow_gutter_under_larger_type_is_still_a_gutter():
    """The real sheet's columns are 0.8 of the page's median line height apart, its intro set
    larger than its columns: the columns are read one after the other."""
    intro = [line(100, k * 45, 1400, f"intro {k}".ljust(70, "~"), h=36) for k in range(8)]
    left = [line(100, 400 + k * 30, 735, f"l{k}".ljust(30, "~"), h=26) for k in range(10)]
    right = [line(757, 400 + k * 30, 1400, f"r{k}".ljust(30, "~"), h=26) for k in range(10)]  # 22 px apart
    assert words(readingorder.read(intro + left + right))[16:] == [f"l{k}" for k in range(10)] + [f"r{k}" for k in range(10)]


def test_single_column_page_reads_as_rows():
    boxes = [line(600, 0, 900, "Centred title", 45)] + column(100, 1400, 80, [f"p{k}" for k in range(5)])
    boxes += [line(100, 300, 700, "a short last line")]
    assert words(readingorder.read(boxes)) == ["Centred", "title", "p0", "p1", "p2", "p3", "p4", "a", "short",
                                                "last", "line"]


def test_a_table_is_read_row_by_row_even_where_its_gap_holds_the_gutter():
    rows = [["Part", "Description", "Qty", "Price"], ["AB-1", "Impeller", "2", "18.40"], ["AB-2", "Seal kit", "1", "12.95"]]
    xs = [(230, 330), (460, 640), (880, 910), (1030, 1110)]
    table = [line(x0, 40 * r, x1, cell) for r, row in enumerate(rows) for (x0, x1), cell in zip(xs, row)]
    # two text columns below whose gutter (750-790) lies inside the table's gap (640-880)
    below = column(130, 750, 140, ["l0", "l1", "l2"]) + column(790, 1400, 140, ["r0", "r1", "r2"])
    assert words(readingorder.read(table + below)) == " ".join(" ".join(row) for row in rows).split() + ["l0", "l1", "l2", "r0", "r1", "r2"]


def test_bullets_and_a_receipt_stay_on_their_rows():
    bullets = [b for k in range(3) for b in (line(100, 40 * k, 115, "-"), line(140, 40 * k, 600, f"item{k}"))]
    assert readingorder.read(bullets).split() == ["-", "item0", "-", "item1", "-", "item2"]
    receipt = [b for k in range(3) for b in (line(100, 40 * k, 300, f"thing{k}"), line(700, 40 * k, 800, f"{k}.99"))]
    assert readingorder.read(receipt).splitlines() == ["thing0 0.99", "thing1 1.99", "thing2 2.99"]
    # a key-value list (samples/fax.tiff page 1): columns wide apart, but short lines
    pairs = [b for k, (key, value) in enumerate([("Glucose", "5.2 mmol/L"), ("Cholesterol", "4.9 mmol/L"),
                                                 ("Sodium", "139 mmol/L"), ("Potassium", "4.1 mmol/L")])
             for b in (line(100, 40 * k, 330, key), line(450, 40 * k, 700, value))]
    assert readingorder.read(pairs).splitlines()[:2] == ["Glucose 5.2 mmol/L", "Cholesterol 4.9 mmol/L"]


def quad(cx: float, cy: float, w: float, h: float, angle: float) -> list[list[float]]:
    """A box's corners tl, tr, br, bl, turned counter-clockwise by angle (as seen, y down)."""
    a = math.radians(angle)
    ux, uy = math.cos(a), -math.sin(a)  # along the line
    vx, vy = math.sin(a), math.cos(a)  # down the line
    return [[cx + sx * w / 2 * ux + sy * h / 2 * vx, cy + sx * w / 2 * uy + sy * h / 2 * vy]
            for sx, sy in ((-1, -1), (1, -1), (1, 1), (-1, 1))]


@pytest.mark.parametrize("angle", [-5.0, -1.0, 0.0, 2.5, 4.0])
def test_skew_angle_from_boxes_and_turned_boxes_lie_level(angle):
    quads = [quad(800, 200 + 45 * k, 600 + 30 * k, H, angle) for k in range(10)]
    quads.append(quad(300, 900, 40, 30, angle + 30))  # a short box: no say
    assert deskew.skew_angle(quads) == pytest.approx(angle, abs=0.01)
    turned = deskew.turn(quads, angle, (1600, 1600))
    assert np.ptp(turned[:10, :2, 1], axis=1).max() < 0.01  # top edges level


def _page_lines(angle: float, n: int = 12) -> list:
    """Quads of a page's lines as the detector gives them (corners tl, tr, br, bl as seen)
    on a page turned counter-clockwise by `angle`, 0 or a quarter: wide boxes, or tall."""
    if angle % 180 == 0:
        return [quad(800, 200 + 45 * k, 500 + 40 * k, H, 0.0) for k in range(n)]
    return [quad(200 + 45 * k, 800, H, 500 + 40 * k, 0.0) for k in range(n)]


@pytest.mark.parametrize("turned, upside_down, want", [
    (0, False, 0), (180, True, 2),  # wide boxes: upright, or upside down
    (90, False, 1), (270, True, 3),  # tall boxes: rapidocr's crops turned a quarter counter-clockwise
])
def test_quarter_turns_from_box_shapes_and_the_classifiers_vote(turned, upside_down, want):
    quads = _page_lines(turned)
    assert deskew.quarter_turns(quads, [upside_down] * len(quads)) == want
    assert upright.quarter_angle(want) == {0: 0.0, 90: -90.0, 180: 180.0, 270: 90.0}[turned]


def test_quarter_turns_is_a_vote_by_length():
    quads = _page_lines(0)
    # the classifier turns two short lines of an upright page (rapidocr's own steps would turn them)
    votes: list = [False] * len(quads)
    votes[0] = votes[1] = True
    assert deskew.quarter_turns(quads, votes) == 0
    # a near tie stays as it is: the longer line of each pair upside down is 51% of the length
    # (the lines are 500 + 40k px long), under FLIP_MARGIN; three lines in four is not
    assert deskew.quarter_turns(quads, [k % 2 == 1 for k in range(len(quads))]) == 0
    assert deskew.quarter_turns(quads, [k % 4 != 0 for k in range(len(quads))]) == 2
    # unsure lines (None) have no say: the one sure line decides
    assert deskew.quarter_turns(quads, [None] * (len(quads) - 1) + [True]) == 2
    assert deskew.quarter_turns(quads, [None] * len(quads)) == 0
    # a margin label set sideways on an upright page does not turn it
    label = quad(80, 800, H, 900, 0.0)
    assert deskew.quarter_turns(quads + [label], [False] * (len(quads) + 1)) == 0
    assert deskew.quarter_turns([], []) == 0


def test_warp_straightens_and_scales():
    img = np.full((400, 600, 3), 255, np.uint8)
    img[100:110, 100:500] = 0  # a level bar
    out = deskew.warp(img, 0.0, 0.5)
    assert out.shape[:2] == (200, 300)
    import cv2

    m = cv2.getRotationMatrix2D((300, 200), 3.0, 1.0)  # skew it 3 degrees counter-clockwise
    skewed = cv2.warpAffine(img, m, (600, 400), borderValue=(255, 255, 255))
    ys, xs = np.nonzero(deskew.warp(skewed, 3.0, 1.0)[:, :, 0] < 128)
    slope = np.polyfit(xs, ys, 1)[0]
    assert abs(math.degrees(math.atan(slope))) < 0.3


def test_plan_rescales_text_outside_the_detector_range():
    small = [quad(500, 100 + 20 * k, 600, 10, 0) for k in range(10)]
    angle, rotate, scale = deskew.plan(small, (1000, 1000), most=5.0)  # rapidocr had shrunk it 5x
    assert (rotate, scale) == (0.0, pytest.approx(deskew.TEXT_HEIGHT / 10))
    assert deskew.plan(small, (1000, 1000), most=2.0)[2] == 2.0  # never beyond the original pixels
    assert deskew.plan(small, (1000, 1000))[2] == 1.0  # not shrunk: the detector enlarges it itself
    huge = [quad(500, 100 + 200 * k, 900, 150, 0) for k in range(4)]
    assert deskew.plan(huge, (1000, 1000))[2] == pytest.approx(deskew.TEXT_HEIGHT / 150)
    _, rotate, scale = deskew.plan([quad(500, 100 + 50 * k, 600, 36, 0.3) for k in range(5)], (1000, 1000))
    assert (rotate, scale) == (0.0, 1.0)  # below STRAIGHTEN_ABOVE, height in range: nothing to do
    _, rotate, scale = deskew.plan([quad(500, 100 + 50 * k, 600, 36, 2.0) for k in range(5)], (1000, 1000))
    assert rotate == pytest.approx(2.0) and scale == 1.0


@pytest.fixture(scope="module")
def layout_run(tmp_path_factory):
    """The test set OCRed by batchocr run with the engine's defaults. How it read before
    (rapidocr's own order, no deskew: 0.47-0.74 CER on all five pages that are not
    single-column, 0.000 on the one that is) is bench/accuracy.py's before/after
    (docs/history/BENCHMARKS.md); a second OCR of the set here cost CI a minute a run."""
    import layouts

    from batchocr import read_pages
    from batchocr.evaluate import evaluate
    from batchocr.pipeline import run_job
    from batchocr.spec import JobSpec

    root = tmp_path_factory.mktemp("layouts")
    variants = layouts.build(root / "src", layouts.TEST_SET)
    run_job(JobSpec(source=str(root / "src"), out=str(root / "out"), engine="rapidocr"), progress=False)
    pages = read_pages(str(root / "out")).collect()
    scored = evaluate(pages, root / "src" / "truth").pages
    scores = dict(zip(scored["document"], scored["cer"]))
    angles = dict(zip(pages["source_uri"].str.split("/").list.last(), pages["skew_angle"]))
    return variants, scores, angles


def test_cer_on_generated_pages(layout_run):
    variants, cer, _ = layout_run
    lines = [f"{name:28s} {variants[name].category:14s} {cer[name]:.3f}" for name in sorted(variants)]
    print("\n".join(lines))
    assert {v.category for v in variants.values()} == {"multi-column", "skewed", "single-column"}
    for name, v in variants.items():  # columns and skew: 0.47-0.74 before (see the fixture)
        assert cer[name] <= (0.02 if v.category == "single-column" else 0.03), lines


def test_skew_angle_column(layout_run):
    variants, _, angles = layout_run
    for name, v in variants.items():
        assert angles[name] == pytest.approx(v.skew, abs=0.3), (name, angles[name])


def test_no_skew_angle_with_deskew_off():
    """deskew off: the angle is not estimated, and the column is null."""
    import layouts
    import pymupdf

    from batchocr.engines import rapidocr

    page = layouts.two_column().doc[0]
    engine = rapidocr.create({"deskew": False})
    try:
        text, angle = engine.recognise(_pixels(page, clip=pymupdf.Rect(0, 0, page.rect.width, 110)))  # the title: quick
    finally:
        engine.close()
    assert angle is None and "Series" in text


def paragraph(x0: float, x1: float, y: float, tag: str, lines: int = 4, indent: float = 0) -> list[Box]:
    """A paragraph's lines, the first indented by `indent` px, the last short."""
    out = []
    for k in range(lines):
        right = x1 if k < lines - 1 else x0 + 0.6 * (x1 - x0)
        out.append(line(x0 + (indent if k == 0 else 0), y + 40 * k, right, f"{tag}{k}".ljust(30, "~")))
    return out


@pytest.mark.parametrize("trigger", ["centred heading", "indented first lines"])
def test_columns_whose_paragraph_breaks_line_up_are_read_column_by_column(trigger):
    """White bands cross both columns at every paragraph break. A row there that does
    not start at its column's edge (a heading centred in the right column, an indented
    first line) used to end the columns' run: the page was cut across at it, and the
    columns came out paragraph by paragraph, alternating, the heading inside the left one."""
    left, right = [], []
    for p in range(4):
        y = 100 + p * 220
        indent = 80 if trigger == "indented first lines" else 0
        left += paragraph(100, 700, y, f"L{p}_", indent=indent)
        if trigger == "centred heading" and p in (1, 3):
            right += [line(900, y, 1200, f"Heading{p}".ljust(20, "~"))] + paragraph(760, 1400, y + 40, f"R{p}_", 3)
        else:
            right += paragraph(760, 1400, y, f"R{p}_", indent=indent)
    title = line(500, 0, 1000, "Title", 50)
    assert words(readingorder.read([title] + left + right)) == ["Title"] + [w for b in left + right for w in words(b.text)]


@pytest.fixture(scope="module")
def ocr():
    from batchocr.engines import rapidocr

    engine = rapidocr.create({})
    yield engine
    engine.close()


def _pixels(page, clip=None) -> np.ndarray:
    import pymupdf

    pix = page.get_pixmap(dpi=200, colorspace=pymupdf.csRGB, alpha=False, clip=clip)
    return np.frombuffer(pix.samples, np.uint8).reshape(pix.height, pix.width, 3)


def _cer(text: str, truth: str) -> float:
    from rapidfuzz.distance import Levenshtein

    truth = " ".join(truth.split())
    return Levenshtein.distance(" ".join(text.split()), truth) / len(truth)


def test_the_cpu_engine_reads_a_sheet_whose_paragraph_breaks_line_up(ocr):
    """tests/layouts.py's aligned-breaks page (the sheet above, set in type) through the
    real engine: the old reading order scored 0.449 on its boxes (docs/history/BENCHMARKS.md)."""
    import layouts

    made = layouts.aligned_breaks()
    text, _ = ocr.recognise(_pixels(made.doc[0]))
    assert _cer(text, "\n\n".join(made.truth)) <= 0.03
    # the heading after the whole left column, before the right column's paragraph it opens
    k = made.truth.index("Technical data")
    assert text.index(made.truth[k - 2][:30]) < text.index("Technical data") < text.index(made.truth[k + 1][:30])


def test_the_cpu_engine_reads_a_real_reference_card_column_by_column(ocr):
    """Octave's three-column reference card (a real pdfTeX file) as a 200-dpi image:
    against the file's own content order (the card's reading order). The old reading
    order read it across the columns: 0.265 on the same boxes (0.052 now; the rest is
    the engine's misreadings of 7-point type)."""
    import pymupdf
    from test_layertext import REFCARD, debian

    page = pymupdf.open(debian(REFCARD))[0]
    clip = pymupdf.Rect(0, 0, page.rect.width, page.rect.height * 0.4)  # the top of its columns: half the OCR time
    text, _ = ocr.recognise(_pixels(page, clip))
    truth = page.get_text(clip=clip).replace("\ufb01", "fi").replace("\ufb02", "fl")
    assert _cer(text, truth) <= 0.08
    assert text.index("Starting Octave") < text.index("Getting Help") < text.index("Killing and Yanking")


@pytest.fixture(scope="module")
def cardinal(ocr):
    """OCRmyPDF's cardinal.pdf (fetched from PyPI): linn.png scanned onto four pages turned
    0, 90, 180 and 270 degrees. Each page's clip of the sheet's top, and the engine's read
    of the upright one."""
    import pymupdf
    from tools import CARDINAL, Unavailable, pypi_sdist_member

    try:
        doc = pymupdf.open(pypi_sdist_member(*CARDINAL))
    except Unavailable as exc:
        pytest.skip(str(exc))
    clips = []
    for k, page in enumerate(doc):  # the sheet's top: its title, first paragraph and bullets
        w, h = page.rect.width, page.rect.height
        box = [(0, 0, w, .27 * h), (.73 * w, 0, w, h), (0, .73 * h, w, h), (0, 0, .27 * w, h)][k]
        clips.append(_pixels(page, pymupdf.Rect(*box)))
    upright, _ = ocr.recognise(clips[0])
    assert upright.startswith("The LinnSequencer\n32 Track MIDI Sequence Recorder")
    return clips, upright


@pytest.mark.parametrize("k, angle", [(1, -90.0), (2, 180.0), (3, 90.0)])
def test_the_cpu_engine_reads_a_real_scan_turned_sideways_or_upside_down(ocr, cardinal, k, angle):
    """The same scan turned a quarter, a half and three quarters reads as the upright one
    does, and its skew angle says how it lay. Without orient the sideways pages read
    nothing (CER 1.0) and the upside-down one 0.82 (checked)."""
    clips, upright = cardinal
    text, skew = ocr.recognise(clips[k])
    assert _cer(text, upright) <= 0.02
    assert skew == pytest.approx(angle, abs=1.0)


def test_the_cpu_engine_reads_a_real_page_whose_only_text_is_its_number(ocr):
    """PARI's parallel.pdf (a real pdfTeX manual): its fourth page holds nothing but the
    page number. rapidocr's detector finds nothing on the whole page and finds it on the
    page cut to its ink; without the second look the page read empty (checked)."""
    import pymupdf
    from tools import PARI_PARALLEL, debian_doc

    page = pymupdf.open(debian_doc(*PARI_PARALLEL))[3]
    assert page.get_text().split() == ["4"]
    assert ocr.recognise(_pixels(page))[0] == "4"


def test_short_text_alone_on_a_page_is_read_and_a_blank_page_detected_once(ocr, monkeypatch):
    import pymupdf

    doc = pymupdf.open()
    for words in ("Appendix", ""):
        doc.new_page(width=612, height=792).insert_text((150, 400), words, fontsize=14)
    calls = []
    detect = ocr._detect
    monkeypatch.setattr(ocr, "_detect", lambda img: calls.append(img.shape) or detect(img))
    assert ocr.recognise(_pixels(doc[0]))[0] == "Appendix"
    assert len(calls) == 2 and calls[1][0] * calls[1][1] < calls[0][0] * calls[0][1] / 10  # then the cut
    calls.clear()
    assert ocr.recognise(_pixels(doc[1]))[0] == ""
    assert len(calls) == 1  # no ink: nothing to look at again


def test_batchocr_run_reads_a_real_scanned_two_column_sheet_in_order(tmp_path):
    """A real 300-dpi scan (OCRmyPDF's linn.png, fetched from PyPI; truth in tests/data/scans):
    a product sheet whose two columns have a narrow gutter (0.8 of the page's median line
    height: its bullets are set larger than its columns) and a heading, "Additional
    Features", right under them. It read 0.143 (the columns interleaved where the gutter was
    missed, the heading between the columns) before the gutter's width was 0.6 line heights
    and a heading nearer the section below than the column above went with the section."""
    import shutil

    from tools import LINN, Unavailable, pypi_sdist_member

    from batchocr import read_pages
    from batchocr.evaluate import evaluate
    from batchocr.pipeline import run_job
    from batchocr.spec import JobSpec

    try:
        scan = pypi_sdist_member(*LINN)
    except Unavailable as exc:
        pytest.skip(str(exc))
    src = tmp_path / "src"
    (src / "truth" / "linn.png").mkdir(parents=True)
    shutil.copy(scan, src / "linn.png")
    shutil.copy(Path(__file__).parent / "data" / "scans" / "linn.txt", src / "truth" / "linn.png" / "0.txt")
    run_job(JobSpec(source=str(src), out=str(tmp_path / "out"), engine="rapidocr"), progress=False)
    pages = read_pages(str(tmp_path / "out")).collect()
    (text,) = pages["text"].to_list()
    order = ["• Optional remote control.", "Recording a Sequence", "sustain pedal, and program changes!", "Editing",
             "specific points within", "simply use LOCATE", "unwanted sections.", "Creating a Song",
             "Composition Without Compromise", "for a demonstration!", "Additional Features", "• Simple, easy",
             "Linn Electronics, Inc."]
    found = [text.find(s) for s in order]
    assert -1 not in found[:4] and found[:4] == sorted(found[:4]), found
    known = [f for f in found if f >= 0]  # one phrase may be misread ("specifãc"); the rest are in order
    assert len(known) >= len(order) - 1 and known == sorted(known), list(zip(order, found))
    assert evaluate(pages, src / "truth").cer <= 0.03

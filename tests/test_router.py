"""Routing by text-layer quality: per-page decisions on a corpus of good, garbled,
hidden and missing text layers, and a real run where the two routes meet."""

import difflib
import re

import pymupdf
import pytest

from batchocr import read_pages, router
from batchocr.engines.textlayer import TextLayerEngine
from batchocr.errors import ConfigError
from batchocr.render import RenderTask, render_document
from batchocr.schema import Needs
from batchocr.sources import DocRef
from batchocr.spec import JobSpec, RenderSpec, load_job
import routing_corpus
from conftest import run_cli


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    folder = tmp_path_factory.mktemp("routing") / "src"
    return folder, routing_corpus.build(folder)


def _doc(path) -> DocRef:
    st = path.stat()
    return DocRef(uri=path.resolve().as_uri(), size=st.st_size, etag=f"{st.st_size}-{st.st_mtime_ns}", mtime=None)


def _rendered(path, mode: str) -> list[dict]:
    needs = router.needs(Needs(image=True), mode)
    return [row for batch in render_document(RenderTask(_doc(path)), RenderSpec(dpi=72), needs, {})
            for row in batch.to_pylist()]


def _words(text: str) -> list[str]:
    return text.split()


def test_every_page_of_the_corpus_takes_its_expected_route(corpus):
    folder, docs = corpus
    got, want = {}, {}
    for name, pages in docs.items():
        rows = _rendered(folder / name, "auto")
        assert [r["page_index"] for r in rows] == list(range(len(pages)))
        for row, page in zip(rows, pages):
            key = f"{name}#{row['page_index']} ({page.what})"
            got[key], want[key] = row["route"], page.route
            assert (row["route_score"] >= router.MIN_SCORE) == (row["route"] == "textlayer"), key
            if row["route"] == "textlayer":
                # taken from the layer: exactly the page's text, and no image was rendered
                assert row["image"] is None and _words(row["text_layer"]) == _words(page.truth), key
                assert row["width"] == 595 and row["height"] == 842
            else:
                assert row["image"] is not None and len(row["image"]) == row["width"] * row["height"] * 3, key
                assert row["text_layer"] is None
    assert got == want
    assert sorted(set(want.values())) == ["model", "textlayer"]


def test_the_benchmark_corpus_routes_exactly_its_born_digital_half(tmp_path):
    docs = routing_corpus.mixed_corpus(tmp_path, 3)  # bench/route.py's corpus: each kind of trap once
    for name, pages in docs.items():
        assert [r["route"] for r in _rendered(tmp_path / name, "auto")] == [p.route for p in pages], name
    routes = [p.route for pages in docs.values() for p in pages]
    assert routes.count("textlayer") == routes.count("model") == 6


def test_each_signal_sinks_the_score_on_its_own(corpus):
    folder, _ = corpus

    def score(name, index=0):
        page = pymupdf.open(folder / name)[index]
        return router.score_page(page, page.get_text(sort=True))

    good = score("born-digital.pdf")
    assert good.score == 1.0 and good.words >= 0.95 and good.hidden == good.unmapped == good.bad == 0
    garbled = score("garbled.pdf")  # the right glyphs, the wrong characters: only the words tell
    assert garbled.unmapped == 0 and garbled.hidden == 0 and garbled.words < 0.2 and garbled.score < 0.5
    unmapped = score("unmapped.pdf")
    assert unmapped.unmapped == 1.0 and unmapped.score == 0
    hidden = score("hidden-ocr.pdf")
    assert hidden.hidden == 1.0 and hidden.image_cover > 0.99 and hidden.score == 0
    under = score("under-image.pdf")  # visible text, but an opaque image is drawn over it
    assert under.hidden == 1.0 and under.words >= 0.95 and under.score == 0
    picture = score("picture.pdf")  # a caption, the rest of the text inside a picture
    assert picture.chars == 7 and picture.image_cover > 0.5 and picture.score < 0.5
    logo = score("mixed.pdf", 2)  # a small image does not matter
    assert 0 < logo.image_cover < 0.05 and logo.score == 1.0
    assert score("scan.pdf").chars == 0 and score("scan.pdf").score == 0


def test_replacement_and_private_use_characters_sink_the_score():
    doc = pymupdf.open()
    page = doc.new_page()
    text = routing_corpus.prose(1, lines=3)
    clean = router.score_page(page, text)
    noisy = router.score_page(page, text[:100] + "\ufffd\ue000\x01" * 5 + text[100:])
    assert clean.bad == 0 and noisy.bad > 0.05
    assert noisy.score < router.MIN_SCORE <= clean.score


def test_route_modes(corpus):
    folder, _ = corpus
    assert {r["route"] for r in _rendered(folder / "born-digital.pdf", "model")} == {"model"}
    # textlayer: any layer is taken, good or not; a page without one still goes to the engine
    assert [r["route"] for r in _rendered(folder / "mixed.pdf", "textlayer")] == ["textlayer", "model", "textlayer", "textlayer"]
    # the textlayer engine reads every page's layer anyway: no routing, no columns
    assert router.needs(Needs(image=False, text_layer=True), "auto").route is None
    assert router.needs(Needs(image=True), "model").route == "model"


def test_route_is_checked_where_it_is_given(tmp_path):
    job = tmp_path / "job.yaml"
    job.write_text("source: s/\nout: o/\nroute: sometimes\n")
    with pytest.raises(ConfigError, match="route: got 'sometimes', expected 'auto', 'model' or 'textlayer'"):
        load_job(job)
    job.write_text("source: s/\nout: o/\nroute: model\n")
    assert load_job(job).route == "model" and load_job(job, route="textlayer").route == "textlayer"
    assert JobSpec(source="s", out="o").route == "auto"
    proc = run_cli("run", "s/", str(tmp_path / "o"), "--route", "never")
    assert proc.returncode == 2 and "--route" in proc.stderr


def test_a_real_run_routes_each_page_of_a_mixed_document(corpus, tmp_path):
    """rapidocr reads the scans; the born-digital pages come from their layer, in the
    same run and the same part files."""
    folder, docs = corpus
    src = tmp_path / "src"
    src.mkdir()
    (src / "mixed.pdf").write_bytes((folder / "mixed.pdf").read_bytes())
    out = tmp_path / "out"
    proc = run_cli("run", str(src), str(out), "-q", "--dpi", "150", check=True)
    assert "4 pages (0 errors, 2 from the text layer)" in proc.stdout
    pages = read_pages(str(out)).sort("page_index").collect()
    assert pages["route"].to_list() == [p.route for p in docs["mixed.pdf"]]
    assert pages["engine"].to_list() == ["textlayer", "rapidocr", "textlayer", "rapidocr"]
    assert len(set(pages["run_id"])) == 1 and len(list(out.glob("pages/shard-*/*.parquet"))) == 1
    for row, page in zip(pages.iter_rows(named=True), docs["mixed.pdf"]):
        assert row["finish_reason"] == "stop"
        if row["route"] == "textlayer":
            assert _words(row["text"]) == _words(page.truth) and row["latency_ms"] == 0
        else:  # the model read the scan, not the bad hidden layer over page 3
            assert row["latency_ms"] > 0 and row["route_score"] < router.MIN_SCORE
            ocr = re.sub(r"\s+", " ", row["text"]).strip()
            truth = re.sub(r"\s+", " ", page.truth).strip()
            # words in order, aligned (one merged word, "ofour", must not shift the rest)
            match = difflib.SequenceMatcher(None, truth.split(), ocr.split(), autojunk=False)
            same = sum(block.size for block in match.get_matching_blocks())
            assert same >= 0.9 * len(truth.split()), ocr


def test_the_routing_benchmark_runs_with_the_vllm_engine(tmp_path):
    """bench/route.py --engine vllm, dry-run on the CPU with the stand-in at vLLM's API
    boundary: both modes, equal work, auto routes exactly the born-digital pages (the
    GPU figure itself needs the GPU)."""
    import json
    import subprocess
    import sys

    from conftest import ROOT

    figures = tmp_path / "route.json"
    # --dummy as on the GPU (random weights): every model page runs to exactly 24 tokens, one attempt
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "route.py"), "--engine", "vllm", "--fake",
                           "--dummy", "24", "--docs", "2", "--modes", "auto,model", "--workers", "1",
                           "--json", str(figures)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    got = json.loads(figures.read_text())
    assert got["engine"] == "vllm" and got["equal_work"] and got["routed_exactly_born_digital"]
    assert got["engine_options"] | {"ignore_eos": True, "max_tokens": 24, "load_format": "dummy"} == got["engine_options"]
    (round_,) = got["pairs"]
    assert round_["auto"]["engines"] == {"textlayer": 4, "vllm": 4} and round_["model"]["engines"] == {"vllm": 8}
    assert round_["auto"]["work"] == {"model_pages": 4, "output_tokens": 4 * 24, "output_tokens_per_model_page": [24],
                                      "finish_reasons_model": {"length": 4}, "attempts": 8, "attempts_max": 1}
    assert round_["model"]["work"]["output_tokens"] == 8 * 24 and round_["model"]["finish_reasons"] == {"length": 8}


def test_a_page_routed_to_its_layer_keeps_its_text_whatever_the_textlayer_engines_options(tmp_path):
    """engines.textlayer is the textlayer engine's section: a run of rapidocr routed a short
    born-digital page to its layer, then the layer engine built from that section
    (min_chars 20) skipped it as 'no text layer (a scan?)': its text was lost."""
    import pymupdf

    src = tmp_path / "src"
    src.mkdir()
    doc = pymupdf.open()
    doc.new_page().insert_text((72, 72), "Appendix B", fontsize=14)
    doc.save(src / "short.pdf")
    job = tmp_path / "job.yaml"
    job.write_text(f"source: {src}\nout: {tmp_path / 'out'}\nengine: rapidocr\nroute: auto\n"
                   "engines:\n  textlayer:\n    min_chars: 20\n")
    run_cli("run", "--job", str(job), "-q", check=True)
    (row,) = read_pages(str(tmp_path / "out")).collect().to_dicts()
    assert (row["route"], row["engine"], row["finish_reason"], row["text"]) == ("textlayer", "textlayer", "stop",
                                                                             "Appendix B")


def test_text_drawn_as_outlines_beside_a_line_of_real_text_goes_to_the_model():
    """A print-ready page: its text converted to outlines (filled paths, one a glyph), and a
    footer left as text. The layer holds the footer alone; taken as the page, 12 lines were
    lost. A ruled table and a few filled shapes on a born-digital page change nothing."""
    import pymupdf

    from test_layertext import ruled_table_page

    lines = [f"Line {i}: the quarterly figures were checked and agreed" for i in range(12)]
    src = pymupdf.open()
    page = src.new_page()
    for i, line in enumerate(lines):
        page.insert_text((72, 80 + 20 * i), line, fontsize=11)
    svg = page.get_svg_image(text_as_path=True)  # the same page, its text now paths
    outlined = pymupdf.open(stream=pymupdf.open("svg", svg.encode()).convert_to_pdf(), filetype="pdf")
    outlined[0].insert_text((72, 760), "Page 7 of 12", fontsize=9)
    s = router.score_page(outlined[0], outlined[0].get_text())
    assert s.chars == 9 and s.outlines > 0.9 and s.score < router.MIN_SCORE
    assert router.route_page(outlined[0], True, "auto")["route"] == "model"

    table = ruled_table_page()
    for i in range(10):  # bullets, a logo's pieces: fewer than OUTLINES glyph-sized fills
        table.draw_circle((60, 300 + 12 * i), 3, fill=(0, 0, 0))
    s = router.score_page(table, table.get_text())
    assert s.outlines == 0 and s.score == 1.0


def test_a_layer_the_textlayer_engine_cannot_read_goes_to_the_model(tmp_path):
    """The router scored get_text(), which keeps glyphs that the layer's text (page_text:
    PyMuPDF's dict) drops, those of an empty box: a scan's layer drawn at font size 0,
    squeezed flat (0 Tz) or by a singular text matrix, on a MediaBox too large for floats.
    Such a page scored 1.0 and was routed to an empty layer: `skipped`, never read; with a
    line of real text beside it, it was that line alone."""
    text = routing_corpus.prose(3, lines=6)
    size0 = lambda s: s.replace(b" 11 Tf", b" 0 Tf")  # noqa: E731
    pages = {"sound": None, "size 0": size0, "0 Tz": lambda s: s.replace(b"BT", b"BT 0 Tz"),
             "singular": lambda s: s.replace(b"BT", b"BT 0 0 0 0 60 400 Tm"), "huge MediaBox": None,
             "size 0 and a footer": size0}
    scan = pymupdf.Pixmap(pymupdf.csGRAY, pymupdf.IRect(0, 0, 60, 80), 0)  # made uninitialised: set every pixel
    scan.clear_with(230)
    doc = pymupdf.open()
    for what, edit in pages.items():
        page = doc.new_page(width=595, height=842)
        page.insert_image(page.rect, pixmap=scan)  # the scan
        page.insert_text((60, 80), text, fontsize=11)
        if edit:
            page.clean_contents()
            (xref,) = page.get_contents()
            doc.update_stream(xref, edit(doc.xref_stream(xref)))
        if what == "huge MediaBox":
            page.set_mediabox(pymupdf.Rect(0, 0, 1e9, 1e9))
        if what.endswith("footer"):
            page.insert_text((60, 800), "Page 7 of 12", fontsize=9)
    doc.save(tmp_path / "layers.pdf")
    rows = _rendered(tmp_path / "layers.pdf", "auto")
    assert [(r["route"], r["route_score"] >= router.MIN_SCORE) for r in rows] == [("textlayer", True)] + [
        ("model", False)] * (len(pages) - 1), [(what, r["route_score"]) for what, r in zip(pages, rows)]
    assert _words(rows[0]["text_layer"]) == _words(text)
    assert all(r["image"] and r["error_type"] is None for r in rows[1:])
    # route: textlayer takes any layer page_text reads, and only those
    assert [r["route"] for r in _rendered(tmp_path / "layers.pdf", "textlayer")] == [
        "textlayer", "model", "model", "model", "model", "textlayer"]


def test_a_page_read_from_its_text_layer_is_not_refused_for_an_image_it_never_decodes(tmp_path):
    """render.max_image_pixels guards decoding; it was checked before the page was routed, so
    a page whose text is taken from its layer (the textlayer engine's, or one routed there),
    its images never decoded, was a too_large row and lost its text: a searchable scan at
    600 dpi of an A0 sheet, or a born-digital page with one huge photo. Only a page that is
    drawn is checked now; that one is still refused from the header, before decoding."""
    import zlib

    from corpus import page_text

    def pdf(path, box):  # a page of text and an image whose header says 20000x20000 (its data is never read)
        doc = pymupdf.open()
        page = doc.new_page(width=612, height=792)
        page.insert_textbox(pymupdf.Rect(72, 72, 540, 500), page_text(1, 12), fontsize=11)
        xref = page.insert_image(box, pixmap=pymupdf.Pixmap(pymupdf.csGRAY, pymupdf.IRect(0, 0, 8, 8), False))
        data = zlib.compress(b"\xff" * 1000)
        doc.update_object(xref, "<< /Type /XObject /Subtype /Image /Width 20000 /Height 20000 /BitsPerComponent 8 "
                                f"/ColorSpace /DeviceGray /Filter /FlateDecode /Length {len(data)} >>")
        doc.update_stream(xref, data, compress=False)
        doc.save(path)

    pdf(tmp_path / "photo.pdf", pymupdf.Rect(72, 600, 172, 700))  # born-digital: routed to its layer
    pdf(tmp_path / "scan.pdf", pymupdf.Rect(0, 0, 612, 792))  # the image covers the page: to the model
    want = _words(page_text(1, 12))

    def row(name, needs):
        (row,) = [r for b in render_document(RenderTask(_doc(tmp_path / name)), RenderSpec(), needs, {})
                  for r in b.to_pylist()]
        return row

    for name in ("photo.pdf", "scan.pdf"):  # the textlayer engine renders nothing
        got = row(name, TextLayerEngine.needs)
        assert got["error_type"] is None and _words(got["text_layer"]) == want, (name, got["error_message"])
    got = row("photo.pdf", router.needs(Needs(image=True), "auto"))
    assert (got["route"], got["error_type"], got["image"]) == ("textlayer", None, None), got["error_message"]
    assert _words(got["text_layer"]) == want
    got = row("scan.pdf", router.needs(Needs(image=True), "auto"))
    assert got["error_type"] == "too_large" and "20000x20000 = 400 Mpx" in got["error_message"]


def unmapped_glyphs_pdf(path, glyphs: int = 3, more: int = 0) -> str:
    """A born-digital page whose font maps one code to a glyph name no Unicode map knows
    (`summationdisplay`: CMEX's sum sign, as pdfTeX writes it without a ToUnicode map):
    MuPDF reads it as U+FFFD. The text it draws, the unmapped code as `Q`."""
    text = ["Wind Loads on Tall Buildings", "The total load is the sum Q of the loads on every floor,",
            "and the moment is the sum Q of each load times its height above the ground.",
            "Both sums Q run over all floors of the building from the first to the last."][:glyphs + 1]
    text += [f"Floor {k} carries its own share of the load, measured at the slab and at the columns." for k in range(more)]
    doc = pymupdf.open()
    page = doc.new_page()
    for k, line in enumerate(text):
        page.insert_text((72, 72 + 18 * k), line, fontname="helv", fontsize=11)
    doc = pymupdf.open("pdf", doc.tobytes())
    doc.xref_set_key(doc[0].get_fonts()[0][0], "Encoding",
                     "<< /Type /Encoding /BaseEncoding /WinAnsiEncoding /Differences [81 /summationdisplay] >>")
    doc.save(path)
    return "\n".join(text)


@pytest.mark.parametrize("how", [["--engine", "textlayer"], ["--route", "textlayer"]])
def test_a_page_read_from_a_layer_with_unmapped_glyphs_says_so_in_its_warning(tmp_path, how):
    src = tmp_path / "src"
    src.mkdir()
    drawn = unmapped_glyphs_pdf(src / "loads.pdf")
    run_cli("run", str(src), str(tmp_path / "out"), "-q", *how, check=True)
    (row,) = read_pages(str(tmp_path / "out")).collect().to_dicts()
    assert row["engine"] == "textlayer" and row["text"].count("\ufffd") == 3
    assert _words(row["text"].replace("\ufffd", "Q")) == _words(drawn)
    assert row["warning"] == "text layer: 3 glyphs the PDF does not map to characters (U+FFFD)"
    assert row["route_reason"] is None


def test_route_auto_sends_a_page_with_unmapped_glyphs_to_the_model_and_says_why(tmp_path):
    """A page that scores well but has U+FFFD in its layer: rapidocr reads its image; the
    page beside it, the same without the unmapped glyph, is read from its layer."""
    src = tmp_path / "src"
    src.mkdir()
    unmapped_glyphs_pdf(src / "sum.pdf", glyphs=1)
    clean = pymupdf.open()
    clean.new_page().insert_text((72, 72), "Wind Loads on Tall Buildings\nThe total load is the sum of every floor.",
                                 fontname="helv", fontsize=11)
    clean.save(src / "clean.pdf")
    (rendered,) = _rendered(src / "sum.pdf", "auto")
    assert rendered["route_score"] >= router.MIN_SCORE  # the score alone would take the layer
    out = tmp_path / "out"
    run_cli("run", str(src), str(out), "-q", "--route", "auto", "--dpi", "150", check=True)
    pages = {r["source_uri"].rsplit("/", 1)[1]: r for r in read_pages(str(out)).collect().to_dicts()}
    got = pages["sum.pdf"]
    assert (got["route"], got["engine"], got["route_reason"]) == (
        "model", "rapidocr", "unmapped glyphs (U+FFFD) in the text layer: 1")
    assert "\ufffd" not in got["text"] and "Wind Loads" in got["text"] and got["warning"] is None
    assert (pages["clean.pdf"]["route"], pages["clean.pdf"]["route_reason"]) == ("textlayer", None)


def test_route_auto_keeps_the_layer_of_a_page_with_a_few_unmapped_glyphs_in_much_text(tmp_path):
    """One U+FFFD among ~1,700 characters (a card's sum sign): the layer is read, and its
    warning says what it lost."""
    src = tmp_path / "src"
    src.mkdir()
    unmapped_glyphs_pdf(src / "sum.pdf", glyphs=1, more=20)
    (rendered,) = _rendered(src / "sum.pdf", "auto")
    assert rendered["route"] == "textlayer" and rendered["route_reason"] is None
    out = tmp_path / "out"
    run_cli("run", str(src), str(out), "-q", "--route", "auto", check=True)
    (row,) = read_pages(str(out)).collect().to_dicts()
    assert (row["route"], row["engine"]) == ("textlayer", "textlayer") and row["text"].count("\ufffd") == 1
    assert row["warning"] == "text layer: 1 glyph the PDF does not map to characters (U+FFFD)"


def test_route_reason_says_why_each_page_went_to_the_model(corpus):
    folder, docs = corpus
    rows = _rendered(folder / "mixed.pdf", "auto")
    for row, page in zip(rows, docs["mixed.pdf"]):
        if page.route == "textlayer":
            assert row["route_reason"] is None
        else:
            assert re.fullmatch(r"text layer scored 0(\.\d+)? < 0\.5|no text in the layer", row["route_reason"]), row
            if row["route_score"] > 0:
                assert row["route_reason"] == f"text layer scored {row['route_score']:g} < 0.5"
    assert {r["route_reason"] for r in _rendered(folder / "mixed.pdf", "model")} == {"route: model"}

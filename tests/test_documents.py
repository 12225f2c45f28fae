"""Unlimited-OCR's preset, and document mode: a document's pages in one request, the
output split back on <page> into a row a page. vLLM is stood in for at its API boundary
(tests/fake_vllm.py: a request of several images writes each page's words with <page>
between them, and none before a page whose centre is red); the real thing runs on the GPU
(bench/gpu/, docs/history/GPU.md)."""

import json
import threading
import time
from collections import Counter

import numpy as np
import pyarrow as pa
import pymupdf
import pytest

import fake_vllm
from batchocr import schema
from batchocr.compact import compact
from batchocr.engines import create
from batchocr.engines.vllm.presets import get_preset
from batchocr.engines.vllm import VLLMEngine, VLLMOptions, split_pages
from batchocr.errors import ConfigError
from batchocr.grouping import Grouper
from batchocr.pipeline import run_job
from batchocr.spec import load_job
from batchocr.storage import Store
from conftest import read_table, run_cli


# --- the preset --------------------------------------------------------------------------

def test_the_unlimited_ocr_preset_is_vllms_recipe(monkeypatch):
    preset = get_preset("unlimited-ocr")
    assert preset.prompt() == "<image>document parsing."  # no chat template: a literal <image> first
    assert preset.document_prompt(3) == "<image><image><image>Multi page parsing."
    args = VLLMOptions(model="/m", preset="unlimited-ocr").llm_args(preset)
    # vLLM's recipe names its NGramPerReqLogitsProcessor; batchocr's bans the same tokens (test_ngram)
    assert args["logits_processors"] == ["batchocr.engines.vllm.patches.ngram:NoRepeatNGramLogitsProcessor"]
    module, name = args["logits_processors"][0].split(":")
    assert module == "batchocr.engines.vllm.patches.ngram" and hasattr(__import__(module, fromlist=[name]), "NGramBan")
    assert args["enable_prefix_caching"] is False and args["mm_processor_cache_gb"] == 0
    assert args["max_model_len"] == 32768 and args["limit_mm_per_prompt"]["image"] == 1
    engine, _ = _engine(monkeypatch)
    page = engine.sampling(_request(engine, 1))
    assert page.temperature == 0 and page.skip_special_tokens is False
    assert page.extra_args == {"ngram_size": 35, "window_size": 128} and page.max_tokens == preset.max_tokens
    # document mode: the n-gram window of whole documents, and the context its prompt leaves
    engine, _ = _engine(monkeypatch, mode="document")
    assert engine.options.llm_args(preset)["limit_mm_per_prompt"]["image"] == engine.group_pages == 4
    request = _request(engine, 4)
    request.prompt_tokens = 4 * 273 + 6
    doc = engine.sampling(request)
    assert doc.extra_args == {"ngram_size": 35, "window_size": 1024} and doc.skip_special_tokens is False
    assert doc.max_tokens == 32768 - (4 * 273 + 6)
    # max_tokens set: a page's, so a group of 4 pages may write 4 times as many
    engine, _ = _engine(monkeypatch, mode="document", max_tokens=1000)
    request = _request(engine, 4)
    assert engine.sampling(request).max_tokens == 4000


def _request(engine, n):
    from batchocr.engines.vllm.request import Page, Request

    return Request([Page("d", i, 8, 8, b"") for i in range(n)], document=n > 1)


def test_groups_are_sized_so_that_prompt_and_output_fit_the_context():
    def size(**kw):
        return VLLMOptions(model="/m", preset="unlimited-ocr", mode="document", **kw).group_size(get_preset("unlimited-ocr"))

    assert size() == 4  # the preset's: groups of 4 measured faster than page mode, the most that fit slower
    assert size(group_pages=0) == (32768 - 16) // (273 + 2048) == 14  # 0: as many as fit
    assert size(group_pages=0, group_page_tokens=4096) == 7 and size(group_pages=0, group_page_tokens=500) == 42
    assert size(group_pages=0, group_page_tokens=100) == 50  # at most the 50 pages the model was trained on
    assert size(group_pages=6) == 6 and size(max_model_len=8192) == 3  # the preset's 4 does not fit: 3 do
    assert VLLMOptions(model="/m", preset="unlimited-ocr").group_size(get_preset("unlimited-ocr")) == 1
    # 273 + 2048 tokens fit 4096 once: a group of two pages does not, and one page alone is page mode
    with pytest.raises(ConfigError, match=r"engines.vllm.group_pages: a group of 2 pages does not fit max_model_len 4096"):
        size(max_model_len=4096)
    # group_pages 1 fits any context: the message said "a group of 1 page does not fit max_model_len 32768"
    with pytest.raises(ConfigError, match=r"^engines.vllm.group_pages: got 1, expected 0 \(as many as fit\) or 2 or more "
                                          r"in document mode: a group of one page is read in page mode"):
        size(group_pages=1)
    with pytest.raises(ConfigError, match=r"engines.vllm.mode: document needs a preset that reads whole documents "
                                          r"\(unlimited-ocr\); qwen2.5-vl reads one page a request"):
        VLLMOptions(model="/m", mode="document")


def test_document_mode_with_a_page_preset_is_exit_2_with_one_line_naming_the_key(tmp_path):
    for flags, key in [(("--mode", "document"), "engines.vllm.mode")]:
        proc = run_cli("run", str(tmp_path), str(tmp_path / "out"), "--engine", "vllm", "--model", "/m", *flags)
        assert proc.returncode == 2, proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1 and key in proc.stderr and "Traceback" not in proc.stderr


# --- the split ---------------------------------------------------------------------------

def test_the_output_splits_on_page_into_exactly_one_part_a_page():
    assert split_pages("a\n<page>\nb<page>c", "<page>", 3) == ["a", "b", "c"]
    assert split_pages("<page>a<page>b<page>", "<page>", 2) == ["a", "b"]  # separators around: no page
    assert split_pages("<PAGE>a\n<PAGE>b", "<page>", 2) == ["a", "b"]  # the reference code's form
    assert split_pages("a<page><page>c", "<page>", 3) == ["a", "", "c"]  # a blank page keeps its place
    assert split_pages("a<page>b", "<page>", 3) is None  # a page short: nobody's text is shifted
    assert split_pages("a<page>b<page>c<page>d", "<page>", 3) is None


# --- the grouper -------------------------------------------------------------------------

def _rows(doc, indices, count, **extra):
    return [{"doc_id": doc, "page_index": i, "page_count": count, "width": 8, "height": 8, "image": b"x"} | extra
            for i in indices]


def _batch(rows):
    return schema.batch(schema.PAGES, rows)


def test_the_grouper_gives_consecutive_balanced_groups_and_waits_for_each_documents_last_page():
    g = Grouper(4)
    g.expect("a", skip=[])
    g.expect("b", skip=[0, 1])  # committed by an earlier run: not coming
    groups = []
    # a: 7 pages (page 3 an error row, page 5 routed to the text layer); b: pages 2-4; interleaved
    feed = [(_rows("a", [0, 1], 7) + _rows("b", [2], 5), None), (_rows("a", [2, 3], 7), {3}),
            (_rows("b", [3, 4], 5) + _rows("a", [4, 5], 7), {5}), (_rows("a", [6], 7), None)]
    for rows, not_for_the_engine in feed:
        rendered = _batch(rows)
        good = _batch([r for r in rows if r["doc_id"] != "a" or r["page_index"] not in (not_for_the_engine or ())])
        groups += [g.add(rendered, good)]
    sent = [[(d, i) for d, i in zip(b.column("doc_id").to_pylist(), b.column("page_index").to_pylist())]
            for step in groups for b in step]
    # a's 7 pages in groups of 4 balanced to 4 + 3 of what reaches the engine; b's 3 pages once its last is back
    assert sent == [[("b", 2), ("b", 3), ("b", 4)], [("a", 0), ("a", 1), ("a", 2), ("a", 4)], [("a", 6)]]
    assert [len(step) for step in groups] == [0, 0, 2, 1]  # nothing is held past its document's last page
    assert g.rest() == []


def test_a_document_that_cannot_be_opened_ends_its_group():
    g = Grouper(8)
    g.expect("a", skip=[])
    assert g.add(_batch(_rows("a", [0, 1], 5)), _batch(_rows("a", [0, 1], 5))) == []
    # its worker died and the rest of it could not be read again: a document-level row
    (group,) = g.add(_batch(_rows("a", [-1], None)), _batch([]))
    assert group.column("page_index").to_pylist() == [0, 1]


# --- the engine --------------------------------------------------------------------------

def _engine(monkeypatch, **options):
    fake_vllm.install(monkeypatch)
    # the options and the stand-in alike: the engine's admission and queue follow max_num_seqs
    options.setdefault("max_num_seqs", 4)
    llm = fake_vllm.LLM(max_num_seqs=options["max_num_seqs"], max_model_len=options.pop("max_model_len", 32768))
    return VLLMEngine(VLLMOptions(model="/models/fake", preset="unlimited-ocr", **options), llm=llm), llm.llm_engine


def _doc(doc, n, red=(), width=280):
    rows = []
    for i in range(n):
        image = np.full((392, width + 28 * i, 3), 230, np.uint8)
        if i in red:
            image[:, :, 1:] = 20
        rows.append({"doc_id": doc, "page_index": i, "width": width + 28 * i, "height": 392, "image": image.tobytes()})
    return _batch(rows)


def _run(engine, batches):
    outs = list(engine.run(iter(batches), threading.Event()))
    return outs, {(r["doc_id"], r["page_index"]): r for out in outs for r in out.to_pylist()}


def test_a_group_is_one_request_and_comes_back_a_row_a_page(monkeypatch):
    engine, fake = _engine(monkeypatch, mode="document")
    outs, rows = _run(engine, [_doc("a", 4), _doc("b", 3)])
    assert fake.added == fake.documents == 2
    # base mode's 1024 view, not gundam's 640 (the first call is the renderer's warm-up of a group;
    # a page's warm-up, which has none, comes after it, if the run has not ended first)
    assert fake.renderer.kwargs[0] == {"image_size": 1024}
    assert [k for k in fake.renderer.kwargs if k is not None] == [{"image_size": 1024}] * 3
    assert len(rows) == 7 and {r["mode"] for r in rows.values()} == {"document"}
    assert all(r["finish_reason"] == "stop" and r["error_type"] is None for r in rows.values())
    # each page its own words: the fake writes 3 + (w*7 + h) % 11 of them for a page of width w
    for (doc, i), r in rows.items():
        assert len(r["text"].split()) == 3 + ((280 + 28 * i) * 7 + 392) % 11 and "<page>" not in r["text"]
    # a group's tokens and prompt shared between its pages, adding up to the request's
    a = [rows[("a", i)] for i in range(4)]
    assert sum(r["output_tokens"] for r in a) == sum(len(r["text"].split()) for r in a) + 3
    assert sum(r["prompt_tokens"] for r in a) == 4 * 273 + 20
    assert sorted(len(o) for o in outs) == [3, 4]  # a group leaves in one batch: committed whole
    assert engine.groups["sent"] == engine.groups["split"] == 2


def test_the_warm_up_pays_each_kind_of_requests_set_up_before_any_request_of_that_kind(monkeypatch):
    """vLLM keeps a processor a set of its arguments, and a group's (the 1024 view) is not a
    page's: on the H200 a run whose warm-up was a page's alone took its first group 13.2 s in
    against page mode's 4.1 s (four prepare threads each loading the group's processor at once).
    In document mode the warm-up makes a group's call, then a page's, and no request's call is
    the first of its kind."""
    fake_vllm.install(monkeypatch)
    llm = fake_vllm.LLM(max_num_seqs=4, max_model_len=32768)
    fake = llm.llm_engine
    inner, calls, seen = fake.renderer.render_cmpl, [], set()

    def render_cmpl(prompts):  # a processor's set-up on the first call with each set of arguments
        (p,) = prompts
        key = repr(p.get("mm_processor_kwargs"))
        images = p["multi_modal_data"]["image"]
        call = {"key": key, "first": key not in seen, "start": time.monotonic(),
                "blank": (images if isinstance(images, list) else [images])[0].getpixel((0, 0)) == (255, 255, 255)}
        calls.append(call)
        if call["first"]:
            seen.add(key)
            time.sleep(0.3)
        call["end"] = time.monotonic()
        return inner(prompts)

    fake.renderer.render_cmpl = render_cmpl  # before the engine starts its warm-up
    engine = VLLMEngine(VLLMOptions(model="/models/fake", preset="unlimited-ocr", mode="document", max_num_seqs=4,
                                    prepare_threads=4), llm=llm)
    _, rows = _run(engine, [_doc("a", 4), _doc("b", 4), _doc("c", 1)])
    engine.close()
    assert len(rows) == 9 and {r["mode"] for r in rows.values()} == {"document", "page"}
    warm = [c for c in calls if c["first"]]
    assert len(warm) == 2 and all(c["blank"] for c in warm)  # both set-ups paid by the warm-ups, on blank pages
    assert [c["key"] for c in warm] == [repr({"image_size": 1024}), "None"]  # a group's first
    ends = {c["key"]: c["end"] for c in warm}
    assert all(c["start"] >= ends[c["key"]] for c in calls if not c["first"])
    assert fake.added == 3 and engine.renderer_warm_up_s >= 0.6


def test_a_group_that_does_not_split_is_read_again_page_by_page(monkeypatch):
    engine, fake = _engine(monkeypatch, mode="document")
    outs, rows = _run(engine, [_doc("a", 4, red={2}), _doc("b", 2)])
    a = [rows[("a", i)] for i in range(4)]
    assert [r["mode"] for r in a] == ["fallback"] * 4 and all(r["finish_reason"] == "stop" for r in a)
    assert all(r["attempts"] == 1 and "<page>" not in r["text"] for r in a)
    assert [rows[("b", i)]["mode"] for i in range(2)] == ["document"] * 2
    assert fake.added == 2 + 4 and fake.documents == 2
    assert sorted(len(o) for o in outs) == [2, 4]  # the four pages read again leave together
    assert engine.groups["fallback_split"] == 1
    # the failed group's tokens are counted too, shared between its pages (were dropped)
    assert sum(r["output_tokens"] for r in rows.values()) == fake.tokens
    assert all(r["output_tokens"] > len(r["text"].split()) for r in a)


def test_a_group_vllm_refuses_is_read_again_page_by_page(monkeypatch):
    # three pages in one prompt (273 image tokens each) are longer than the context; one alone (448) is not
    engine, fake = _engine(monkeypatch, mode="document", max_model_len=600, group_page_tokens=8)
    _, rows = _run(engine, [_doc("a", 3, width=896)])
    assert engine.groups["fallback_rejected"] == 1 and fake.documents == 0
    assert [rows[("a", i)]["mode"] for i in range(3)] == ["fallback"] * 3
    assert all(rows[("a", i)]["finish_reason"] == "stop" for i in range(3))


def test_the_token_limit_of_a_group_sends_it_back_page_by_page(monkeypatch):
    engine, fake = _engine(monkeypatch, mode="document", group_pages=4)
    engine_sampling = engine.sampling

    def short(request):  # a group allowed fewer tokens than its pages write
        params = engine_sampling(request)
        if request.document:
            params.max_tokens = 10
        return params

    engine.sampling = short
    _, rows = _run(engine, [_doc("a", 4)])
    assert engine.groups["fallback_length"] == 1
    assert [rows[("a", i)]["mode"] for i in range(4)] == ["fallback"] * 4
    assert all(rows[("a", i)]["finish_reason"] == "stop" for i in range(4))


def test_with_the_fallback_off_a_group_that_does_not_split_gives_error_rows_not_shifted_text(monkeypatch):
    engine, fake = _engine(monkeypatch, mode="document", document_fallback=False)
    _, rows = _run(engine, [_doc("a", 3, red={1})])
    assert fake.added == 1
    assert [rows[("a", i)]["error_type"] for i in range(3)] == ["document_split"] * 3
    assert all(rows[("a", i)]["text"] is None and rows[("a", i)]["mode"] == "document" for i in range(3))
    assert "did not split into 3 parts on '<page>'" in rows[("a", 0)]["error_message"]
    assert sum(rows[("a", i)]["output_tokens"] for i in range(3)) > 0  # the work is still counted


def test_a_one_page_group_is_read_in_page_mode(monkeypatch):
    engine, fake = _engine(monkeypatch, mode="document")
    _, rows = _run(engine, [_doc("a", 1)])
    assert fake.documents == 0 and rows[("a", 0)]["mode"] == "page"


# --- through the pipeline: resume and compaction of a half-done grouped document -----------

def _pdfs(folder, docs):
    """Scanned-looking multi-page PDFs (no text layer): every page goes to the model."""
    folder.mkdir()
    for name, pages in docs.items():
        pdf = pymupdf.open()
        for i in range(pages):
            page = pdf.new_page(width=300 + 20 * i, height=400)
            page.draw_rect(page.rect, color=None, fill=(0.9, 0.9, 0.9))
        pdf.save(folder / f"{name}.pdf")


def _spec(src, out, **options):
    return load_job(None, source=str(src), out=str(out), engine="vllm", route="model",
                    engine_options={"model": "/models/fake", "preset": "unlimited-ocr", "mode": "document"} | options,
                    **{"commit.every_pages": 1})


class _StopAfter:
    """An engine that sets `stop` once it has given back `n` rows (a SIGTERM mid-run)."""

    def __init__(self, engine, stop, n):
        self.engine, self.stop, self.n = engine, stop, n

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def run(self, pages, stop):
        for out in self.engine.run(pages, stop):
            yield out
            self.n -= out.num_rows
            if self.n <= 0:
                self.stop.set()


def test_a_half_done_grouped_document_resumes_exactly_once_and_compacts(monkeypatch, tmp_path):
    _pdfs(tmp_path / "src", {"long": 10, "short": 3})
    out = tmp_path / "out"
    engine, fake = _engine(monkeypatch, mode="document", group_pages=4, max_num_seqs=1, queue_pages=4)
    stop = threading.Event()
    from batchocr.errors import Interrupted

    with pytest.raises(Interrupted):
        run_job(_spec(tmp_path / "src", out, group_pages=4), progress=False,
                engine=_StopAfter(engine, stop, 1), stop=stop)
    first = read_table(out).to_pylist()
    # committed whole: only complete groups (4 + 3 + 3 for the long one, 3 for the short)
    assert first and len(first) in (3, 4, 7, 8)
    assert {r["mode"] for r in first} == {"document"}
    engine, fake = _engine(monkeypatch, mode="document", group_pages=4)
    run_job(_spec(tmp_path / "src", out, group_pages=4), progress=False, engine=engine)
    rows = read_table(out).to_pylist()
    keys = Counter((r["source_uri"].rsplit("/", 1)[-1], r["page_index"]) for r in rows)
    assert keys == Counter({("long.pdf", i): 1 for i in range(10)} | {("short.pdf", i): 1 for i in range(3)})
    assert all(r["mode"] == "document" and r["finish_reason"] == "stop" for r in rows)
    assert fake.added == fake.documents  # the rest of the long one was grouped again, not sent page by page
    compact(Store(str(out)))
    again = read_table(out).to_pylist()
    assert sorted((r["doc_id"], r["page_index"]) for r in again) == sorted((r["doc_id"], r["page_index"]) for r in rows)


def test_document_mode_through_the_cli_records_the_mode_and_its_groups(monkeypatch, tmp_path):
    import json

    _pdfs(tmp_path / "src", {"a": 5, "b": 2})
    fake_vllm.install(monkeypatch)
    out = tmp_path / "out"
    run_cli("run", str(tmp_path / "src"), str(out), "--engine", "vllm", "--model", "fake-model",
            "--preset", "unlimited-ocr", "--mode", "document", "--route", "model", "-q", check=True)
    rows = read_table(out).to_pylist()
    assert len(rows) == 7 and {r["mode"] for r in rows} == {"document"}
    (record,) = [json.loads(p.read_text()) for p in (out / "_runs").glob("*.json")]
    # the preset's groups of at most 4 pages: a's 5 pages in two groups, b's 2 in one
    assert record["engine_params"]["mode"] == "document" and record["engine_params"]["group_pages"] == 4
    assert record["engine_params"]["groups"]["split"] == 3
    # OUT remembers the mode (another prompt, other text): a page-mode rerun is refused before vLLM loads
    proc = run_cli("run", str(tmp_path / "src"), str(out), "--engine", "vllm", "--model", "fake-model",
                   "--preset", "unlimited-ocr", "-q")
    assert proc.returncode == 2 and "Multi page parsing." in proc.stderr, proc.stderr


def test_document_mode_remembers_the_prompt_its_pages_read_alone_are_asked(monkeypatch, tmp_path):
    """In document mode a document of one page (and a failed group's pages) is read alone with
    the page prompt, which engines.vllm.prompt replaces: a rerun with another prompt would have
    read a new one-page document with it into the same OUT, unnoticed (OUT remembered only the
    group's prompt). Without a prompt of its own, OUT remembers what it always did."""
    _pdfs(tmp_path / "src", {"a": 3, "b": 1})
    fake_vllm.install(monkeypatch)
    out, plain = tmp_path / "out", tmp_path / "plain"
    flags = ("--engine", "vllm", "--model", "fake-model", "--preset", "unlimited-ocr", "--mode", "document",
             "--route", "model", "-q")
    jobs = {}
    for name, prompt in (("free", "Free OCR."), ("grounding", "<|grounding|>Convert the document to markdown.")):
        jobs[name] = tmp_path / f"{name}.yaml"
        jobs[name].write_text(f"engines:\n  vllm:\n    prompt: '{prompt}'\n")
    run_cli("run", str(tmp_path / "src"), str(out), *flags, "--job", str(jobs["free"]), check=True)
    rows = {r["page_index"]: r["mode"] for r in read_table(out).to_pylist() if r["page_count"] == 1}
    assert rows == {0: "page"}  # b, a page alone: the page prompt
    proc = run_cli("run", str(tmp_path / "src"), str(out), *flags, "--job", str(jobs["grounding"]))
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "prompt '...one: <image>Free OCR.)'; this run: prompt '...one: <image><|grounding|>" in proc.stderr, proc.stderr
    run_cli("run", str(tmp_path / "src"), str(plain), *flags, check=True)
    assert json.loads((plain / "_producer.json").read_text())["prompt"] == \
           "<image>Multi page parsing. (document mode: one <image> a page)"


def test_document_mode_keeps_max_num_seqs_groups_running(monkeypatch):
    """The queue counts requests, not pages: groups of 14 pages still fill every sequence
    (a cap of 37 pages held document mode to 2 groups of 4 sequences; on the H200, 44 of 256)."""
    fake_vllm.install(monkeypatch)
    llm = fake_vllm.LLM(max_num_seqs=4, max_model_len=32768)
    engine = VLLMEngine(VLLMOptions(model="/m", preset="unlimited-ocr", mode="document", max_num_seqs=4), llm=llm)
    fake, running = llm.llm_engine, []
    step = fake.step

    def counting():
        # The engine prepares requests in its own threads while the stand-in steps: until the
        # queue has been full once, each step waits (up to 0.5 s, its first 50 steps) for the
        # engine to hand it 4, so that the count is of what the engine keeps in flight, not of
        # which thread ran first (a bare count saw 3 in about 1 run in 8).
        deadline = time.monotonic() + 0.5
        while (len(running) < 50 and max(running, default=0) < 4 and len(fake.order) < 4
               and time.monotonic() < deadline):
            time.sleep(0.002)
        running.append(min(len(fake.order), 4))
        return step()

    fake.step = counting
    _, rows = _run(engine, [_doc(f"d{i}", 14) for i in range(10)])
    assert len(rows) == 140 and max(running) == 4

"""The vLLM engine on the CPU: vLLM absent, or stood in for at its API boundary
(tests/fake_vllm.py). The real thing runs on the GPU: bench/gpu/."""

import json
import logging
import os
import queue
import sys
import threading
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import fake_vllm
from batchocr import schema
from batchocr.engines import create, parse_options
from batchocr.engines.vllm.presets import PRESETS, get_preset, strip_front_matter
from batchocr.engines.vllm.repetition import RepetitionCheck
from batchocr.engines.vllm import CHECK_EVERY, VLLMEngine, VLLMInstances, VLLMOptions
from batchocr.errors import BatchocrError, ConfigError
from batchocr.pipeline import run_job
from batchocr.spec import load_job
from conftest import SAMPLES, count_pages, read_table, sample_documents

PLACEHOLDERS = {"qwen2.5-vl": "<|image_pad|>", "qwen3-vl": "<|image_pad|>", "olmocr-2": "<|image_pad|>",
                "paddleocr-vl": "<|IMAGE_PLACEHOLDER|>", "deepseek-ocr": "<image>", "dots-ocr": "<|imgpad|>",
                "unlimited-ocr": "<image>"}


def test_without_vllm_installed_the_error_says_what_to_install():
    with pytest.raises(ConfigError, match=r"pip install '\.\[vllm\]' in batchocr's clone"):
        create("vllm", {"model": "/models/x"})


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_each_preset_builds_a_prompt_with_one_image_and_its_instruction(name):
    preset = get_preset(name)
    prompt = preset.prompt()
    assert prompt.count(PLACEHOLDERS[name]) == 1
    assert preset.instruction in prompt and "{instruction}" not in prompt
    assert preset.prompt("Only the tables.").endswith(("Only the tables.", "Only the tables.<|im_end|>\n<|im_start|>assistant\n",
                                                      "Only the tables.\nAssistant: "))
    assert preset.max_side % preset.size_multiple == 0 and preset.max_tokens > 0
    if "min_pixels" in preset.mm_processor_kwargs:  # the processor must not shrink a rendered page again
        assert preset.mm_processor_kwargs["max_pixels"] >= preset.max_side ** 2


def test_olmocr_front_matter_is_stripped():
    text = "---\nprimary_language: en\nis_rotation_valid: True\n---\nInvoice 12\nTotal 3"
    assert strip_front_matter(text) == "Invoice 12\nTotal 3"
    assert strip_front_matter("no front matter") == "no front matter"


def test_unknown_preset_and_missing_model_are_config_errors():
    with pytest.raises(ConfigError, match="unknown vLLM preset"):
        VLLMOptions(model="/m", preset="gpt-5")
    with pytest.raises(ConfigError, match="needs a model"):
        VLLMOptions().check_chosen()  # the run's engine's only: an unused section may lack it


def test_repetition_check():
    check = RepetitionCheck(span=60, max_period=10)
    assert check.looping([1, 2, 3] * 30)
    assert check.looping([5] * 60)
    assert check.looping(list(range(40)) + [4, 5, 6, 7] * 15)
    assert not check.looping(list(range(100)))
    assert not check.looping([1, 2, 3] * 19)  # too short to call it a loop
    assert not check.looping(list(range(30)) + [1, 2] * 20)  # the loop does not fill the span


def _pages(n: int, dark: set[int] = frozenset(), big: set[int] = frozenset()) -> list[pa.RecordBatch]:
    rows = []
    for i in range(n):
        w, h = (3000, 3000) if i in big else (280 + 28 * (i % 5), 392)
        value = 20 if i in dark else 230
        rows.append({"doc_id": f"d{i // 3}", "page_index": i % 3, "width": w, "height": h,
                     "image": np.full((h, w, 3), value, np.uint8).tobytes()})
    return [schema.batch(schema.PAGES, rows[i:i + 4]) for i in range(0, n, 4)]


def _engine(monkeypatch, **options):
    fake_vllm.install(monkeypatch)
    # the options and the stand-in alike: the engine's admission and queue follow max_num_seqs
    options.setdefault("max_num_seqs", 4)
    llm = fake_vllm.LLM(max_num_seqs=options["max_num_seqs"], max_model_len=options.pop("max_model_len", 4096))
    return VLLMEngine(VLLMOptions(model="/models/fake", **options), llm=llm), llm.llm_engine


def test_pixel_bytes_reach_the_engine_core_through_its_environment_and_the_processor_here(monkeypatch):
    """engines.vllm.pixel_bytes (on in the unlimited-ocr preset, with the batched encoder): the
    environment vLLM's engine core inherits says 1 (its batched encoder installs the model's half
    there: test_deepencoder) and this process's processor hands the views over as bytes. An engine
    with it off after one with it on puts vLLM's processor back and says 0, whatever the
    environment said before."""
    from batchocr.engines.vllm.patches import pixels

    monkeypatch.setenv(pixels.ENV, "1")
    for options, switch in [({"preset": "unlimited-ocr"}, "1"), ({"preset": "unlimited-ocr", "pixel_bytes": False}, "0"),
                            ({"preset": "unlimited-ocr", "batch_encoder": False}, "0"), ({"preset": "deepseek-ocr"}, "0"),
                            ({"preset": "deepseek-ocr", "batch_encoder": True}, "0"),
                            ({"preset": "deepseek-ocr", "batch_encoder": True, "pixel_bytes": True}, "1"),
                            ({"preset": "qwen2.5-vl"}, "0")]:
        engine, _ = _engine(monkeypatch, **options)
        engine.close()
        assert os.environ[pixels.ENV] == switch, options
        assert (fake_vllm.ImageTransform.__call__ is pixels.view_bytes) == (switch == "1"), options
        assert (fake_vllm.DeepseekOCRProcessor.tokenize_with_images is pixels.tokenize_with_images) == (switch == "1")


def test_sam_fold_reaches_the_engine_core_through_its_environment(monkeypatch):
    """engines.vllm.sam_fold (on in the unlimited-ocr preset, with the batched encoder): the
    environment vLLM's engine core inherits asks for SAM's folded attention in fold-pad mode (its
    batched encoder installs it there: test_deepencoder); off, or with the batched encoder off, or
    another preset, it asks for none, whatever it asked before."""
    from batchocr.engines.vllm.patches import samattn

    monkeypatch.setenv(samattn.ENV, "fold")
    for options, switch in [({"preset": "unlimited-ocr"}, "fold-pad"), ({"preset": "unlimited-ocr", "sam_fold": False}, ""),
                            ({"preset": "unlimited-ocr", "batch_encoder": False}, ""), ({"preset": "deepseek-ocr"}, ""),
                            ({"preset": "deepseek-ocr", "batch_encoder": True}, ""),
                            ({"preset": "deepseek-ocr", "batch_encoder": True, "sam_fold": True}, "fold-pad"),
                            ({"preset": "qwen2.5-vl"}, "")]:
        engine, _ = _engine(monkeypatch, **options)
        engine.close()
        assert os.environ[samattn.ENV] == switch, options
        assert samattn.switched_to() == (switch or None), options


def _run(engine, batches, stop=None):
    return [row for out in engine.run(iter(batches), stop or threading.Event()) for row in out.to_pylist()]


def test_a_queue_below_max_num_seqs_is_a_warning_naming_the_key(monkeypatch, caplog):
    """queue_pages under max_num_seqs caps the running batch (0.74x the pages/s at 64 of 256 on
    the H200): allowed, to bound host memory, but said once at the start."""
    with caplog.at_level(logging.WARNING, logger="batchocr.engines.vllm"):
        engine, _ = _engine(monkeypatch, queue_pages=64, max_num_seqs=256)
    engine.close()
    (said,) = [r.getMessage() for r in caplog.records if "queue_pages" in r.getMessage()]
    assert said.startswith("engines.vllm.queue_pages 64 is below max_num_seqs 256")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="batchocr.engines.vllm"):
        for depth in (0, 256, 400):  # the default (max_num_seqs * 1.25 + 32), equal, above
            engine, _ = _engine(monkeypatch, queue_pages=depth, max_num_seqs=256)
            engine.close()
    assert not [r for r in caplog.records if "queue_pages" in r.getMessage()]


def test_every_page_comes_back_once_with_tokens_while_the_queue_stays_full(monkeypatch):
    # admit_pages 0: everything prepared goes in at once and queues inside vLLM (admission in
    # groups, the preset's default, has tests of its own below)
    engine, fake = _engine(monkeypatch, queue_pages=10, max_tokens=50, admit_pages=0)
    rows = _run(engine, _pages(30))
    assert sorted((r["doc_id"], r["page_index"]) for r in rows) == sorted((f"d{i // 3}", i % 3) for i in range(30))
    assert all(r["finish_reason"] == "stop" and r["attempts"] == 1 for r in rows)
    for r in rows:
        assert r["output_tokens"] == len(r["text"].split()) and r["prompt_tokens"] > 20
    assert fake.added == 30
    assert fake.peak_waiting >= 5  # pages wait inside vLLM: its batch never runs short
    engine.close()
    assert fake.engine_core.shut


def test_a_looping_page_is_stopped_and_retried_at_a_higher_temperature(monkeypatch):
    engine, fake = _engine(monkeypatch, repetition_span=30, repetition_max_period=5, max_tokens=500)
    rows = {(r["doc_id"], r["page_index"]): r for r in _run(engine, _pages(6, dark={4}))}
    looped = rows[("d1", 1)]
    assert looped["attempts"] == 2 and looped["finish_reason"] == "stop"
    assert len(fake.aborted) == 1  # stopped early: far fewer than max_tokens were spent
    assert all(r["attempts"] == 1 for key, r in rows.items() if key != ("d1", 1))
    # output_tokens counts every attempt's tokens (was: the last attempt's only)
    assert sum(r["output_tokens"] for r in rows.values()) == fake.tokens
    assert looped["output_tokens"] >= 30 + len(looped["text"].split())


def test_a_page_that_keeps_looping_ends_as_repetition(monkeypatch):
    engine, fake = _engine(monkeypatch, repetition_span=30, repetition_max_period=5, max_tokens=500,
                           max_attempts=1, temperature=0.0)
    rows = {(r["doc_id"], r["page_index"]): r for r in _run(engine, _pages(3, dark={0}))}
    assert rows[("d0", 0)]["finish_reason"] == "repetition"
    assert rows[("d0", 0)]["error_type"] == "repetition" and 30 <= rows[("d0", 0)]["output_tokens"] <= 30 + CHECK_EVERY
    assert rows[("d0", 0)]["text"].startswith("w7 w8 w9")
    assert rows[("d0", 0)]["error_message"].endswith(" tokens, 1 attempt")  # not "1 attempts"


def test_tokens_in_pieces_of_check_every_give_the_same_rows_from_far_fewer_outputs(monkeypatch):
    """stream_interval CHECK_EVERY is the engine's default (vLLM sends a running page's tokens on
    its first, then 32 at a time): the repetition check looks as often, one token later (the first
    token comes alone), so every row is what one token a step gave, a loop stopped one token later."""
    assert VLLMOptions(model="/m").llm_args(get_preset("qwen2.5-vl"))["stream_interval"] == CHECK_EVERY
    assert VLLMOptions(model="/m", engine_args={"stream_interval": 1}).llm_args(
        get_preset("qwen2.5-vl"))["stream_interval"] == 1  # vLLM's own, where a user asks
    runs = {}
    for interval in (1, CHECK_EVERY):
        fake_vllm.install(monkeypatch)
        llm = fake_vllm.LLM(max_num_seqs=4, stream_interval=interval)
        engine = VLLMEngine(VLLMOptions(model="/models/fake", max_num_seqs=4, repetition_span=64,
                                        repetition_max_period=5, max_tokens=400), llm=llm)
        rows = _run(engine, _pages(9, dark={2, 6}))
        engine.close()
        runs[interval] = (sorted((r["doc_id"], r["page_index"], r["text"], r["finish_reason"], r["attempts"],
                                  r["output_tokens"]) for r in rows), llm.llm_engine)
    (rows1, fake1), (rows32, fake32) = runs[1], runs[CHECK_EVERY]
    assert [r[:5] for r in rows32] == [r[:5] for r in rows1]
    assert [r[5] - q[5] for r, q in zip(rows32, rows1)] == [int(r[4] == 2) for r in rows1]
    assert len(fake32.aborted) == len(fake1.aborted) == 2 and fake32.tokens == fake1.tokens + 2
    looped = [r for r in rows32 if r[4] == 2]
    assert len(looped) == 2 and all(64 < r[5] <= 64 + CHECK_EVERY + len(r[2].split()) for r in looped)
    assert fake32.outputs * 4 < fake1.outputs


def test_a_rejected_request_is_an_error_row_and_the_rest_goes_on(monkeypatch):
    engine, _ = _engine(monkeypatch, max_model_len=2000)
    rows = {(r["doc_id"], r["page_index"]): r for r in _run(engine, _pages(6, big={2}))}
    assert len(rows) == 6
    bad = rows[("d0", 2)]
    assert (bad["finish_reason"], bad["error_type"]) == ("error", "rejected")
    assert "longer than the maximum model length" in bad["error_message"]
    assert sum(r["finish_reason"] == "stop" for r in rows.values()) == 5


def test_hitting_max_tokens_is_length(monkeypatch):
    engine, _ = _engine(monkeypatch, max_tokens=3)
    rows = _run(engine, _pages(3))
    assert {r["finish_reason"] for r in rows} <= {"length", "stop"} and any(r["finish_reason"] == "length" for r in rows)
    assert all(r["output_tokens"] <= 3 for r in rows)


def _stopped_after_the_first_rows(engine, pages: int) -> list[dict]:
    """The rows a run hands out before it sees the stop set on its first rows."""
    stop = threading.Event()
    seen = []
    for out in engine.run(iter(_pages(pages)), stop):
        seen.extend(out.to_pylist())
        stop.set()
    return seen


def test_stop_aborts_what_is_in_flight(monkeypatch):
    engine, fake = _engine(monkeypatch, queue_pages=8, max_tokens=50)
    seen = _stopped_after_the_first_rows(engine, 40)
    assert 1 <= len(seen) < 40
    assert not fake.order  # nothing left running inside vLLM
    # every request vLLM was given either came back or was aborted (none leaked)
    assert fake.added == len(seen) + len(fake.aborted)


def test_an_engine_failure_stops_the_run(monkeypatch):
    engine, fake = _engine(monkeypatch)

    def dead():
        raise RuntimeError("EngineCore died")

    fake.step = dead
    with pytest.raises(BatchocrError, match="vLLM engine failed"):
        _run(engine, _pages(3))


def test_the_pipeline_with_the_vllm_engine_renders_to_the_presets_size(monkeypatch, tmp_path):
    engine, fake = _engine(monkeypatch, preset="olmocr-2", queue_pages=6, max_tokens=40)
    spec = load_job(None, source=str(SAMPLES), out=str(tmp_path / "out"), engine="vllm",
                    engine_options={"model": "/models/fake", "preset": "olmocr-2"})
    summary = run_job(spec, progress=False, engine=engine)
    table = read_table(tmp_path / "out")
    assert summary.pages == table.num_rows == sum(count_pages(p) for p in sample_documents())
    rows = table.to_pylist()
    assert all(max(r["width"], r["height"]) <= 1288 and r["width"] % 28 == 0 and r["height"] % 28 == 0 for r in rows)
    # route auto, as with every engine: the born-digital report's pages come from their text layer
    routed = [r for r in rows if r["route"] == "textlayer"]
    assert sorted(r["source_uri"].rsplit("/", 1)[-1] for r in routed) == ["report.pdf"] * 3
    assert all(r["engine"] == "textlayer" and r["output_tokens"] is None for r in routed)
    model = [r for r in rows if r["route"] == "model"]
    assert len(model) == len(rows) - 3 == fake.added
    assert all(r["engine"] == "vllm" and r["model"] == "/models/fake" for r in model)
    assert all(r["output_tokens"] > 0 and r["prompt_tokens"] > 0 and r["attempts"] == 1 for r in model)
    assert fake.engine_core.shut  # shut down explicitly at the end of the run
    # where its start went: the first pages to the engine, the first request vLLM took, the first row
    # (one of the text layer's: it needs no request), each after the engine's build
    (record,) = [json.loads(p.read_text()) for p in (tmp_path / "out" / "_runs").glob("*.json")]
    t = record["timings"]
    assert 0 < t["first_page_s"] <= t["first_request_s"] < record["counts"]["seconds"]
    assert engine.first_request_at is not None and summary.timings["first_request_s"] == t["first_request_s"]
    # and how long the renderer's first call, the warm-up, took
    assert t["renderer_warm_up_s"] == engine.renderer_warm_up_s >= 0
    assert isinstance(t["renderer_warm_up_at_s"], float)  # when it began (this engine was built before the run)


def _recorded(renderer, calls: list[dict] | None = None, first_s: float = 0.0, fail: bool = False) -> list[dict]:
    """Each call of the renderer's span, image size and colour, kept in `calls` (a new list where
    none is given); its first call `first_s` slow (the processor's set-up in a fresh process) and,
    with fail, raising (the rest work)."""
    inner, calls = renderer.render_cmpl, ([] if calls is None else calls)

    def render_cmpl(prompts):
        image = prompts[0]["multi_modal_data"]["image"]
        start = time.monotonic()
        first = not calls
        calls.append({"start": start, "size": image.size, "pixel": image.getpixel((0, 0))})
        if first:
            time.sleep(first_s)
        calls[-1]["end"] = time.monotonic()
        if first and fail:
            raise RuntimeError("no processor for a blank page")
        return inner(prompts)

    renderer.render_cmpl = render_cmpl
    return calls


def _slow_first_renderer(llm, fail: bool = False):
    """The stand-in's renderer made as vLLM's is in a fresh process: its first call slow (0.3 s,
    the processor's set-up), the next ones quick (_recorded)."""
    return _recorded(llm.llm_engine.renderer, first_s=0.3, fail=fail)


@pytest.mark.parametrize("preset,size", [("qwen2.5-vl", (896, 1288)), ("unlimited-ocr", (1344, 1920))])
def test_the_renderers_first_call_is_a_blank_page_made_alone_before_any_pages(monkeypatch, preset, size):
    """Four prepare threads making the renderer's first calls at once paid its set-up four times
    over on the H200 (18.8 s each against 4.8 s alone): the engine makes that call itself, once,
    on a blank page of the preset's size, and no page's preparation starts before it ends."""
    fake_vllm.install(monkeypatch)
    llm = fake_vllm.LLM(max_num_seqs=4)
    calls = _slow_first_renderer(llm)
    engine = VLLMEngine(VLLMOptions(model="/models/fake", preset=preset, max_tokens=30, prepare_threads=4), llm=llm)
    rows = _run(engine, _pages(12))
    engine.close()
    assert len(rows) == 12 and all(r["error_type"] is None and r["finish_reason"] == "stop" for r in rows)
    warm, pages = calls[0], calls[1:]
    assert warm["size"] == size and warm["pixel"] == (255, 255, 255)  # portrait, the preset's longest side
    assert len(pages) == 12 and all(c["start"] >= warm["end"] for c in pages)
    assert llm.llm_engine.added == 12  # the warm-up's call is not a request
    assert engine.renderer_warm_up_s >= 0.3


def test_a_failed_warm_up_costs_nothing_but_a_debug_line(monkeypatch, caplog):
    fake_vllm.install(monkeypatch)
    llm = fake_vllm.LLM(max_num_seqs=4)
    calls = _slow_first_renderer(llm, fail=True)
    with caplog.at_level(logging.DEBUG, logger="batchocr.engines.vllm"):
        engine = VLLMEngine(VLLMOptions(model="/models/fake", max_tokens=30), llm=llm)
        rows = _run(engine, _pages(5))
    engine.close()
    assert len(rows) == 5 and all(r["error_type"] is None and r["finish_reason"] == "stop" for r in rows) and len(calls) == 6
    (said,) = [r for r in caplog.records if "warm-up" in r.getMessage()]
    assert said.levelno == logging.DEBUG and "RuntimeError: no processor for a blank page" in said.getMessage()


def _building(monkeypatch, tmp_path) -> list[dict]:
    """The stand-in installed as vllm, its build a load of 0.5 s (the engine core's start-up),
    each call of the renderer it makes kept (_recorded)."""
    fake_vllm.install(monkeypatch)
    monkeypatch.setenv("BATCHOCR_FAKE_BUILDS", str(tmp_path / "builds.jsonl"))
    monkeypatch.setenv("BATCHOCR_FAKE_BUILD_S", "0.5")
    calls, made = [], sys.modules["vllm.v1.engine.llm_engine"]
    inner_made = made.renderer_from_config

    def renderer_from_config(config):
        renderer = inner_made(config)
        _recorded(renderer, calls)
        return renderer

    monkeypatch.setattr(made, "renderer_from_config", renderer_from_config)
    return calls


def test_the_warm_up_runs_while_vllm_waits_for_its_engine_core_after_the_fork(monkeypatch, tmp_path):
    """vLLM's build makes the renderer, starts the engine core's process, then waits for it (25-50 s
    on an H100, this process idle); the renderer's warm-up (2.2-3.4 s there) came after the build,
    before the first request. It runs in that wait now: begun after the engine core's process
    started (no thread of batchocr's running while vLLM forks it) and before the build returns.
    vLLM's functions are its own again after the build."""
    calls = _building(monkeypatch, tmp_path)
    from vllm.v1.engine import llm_engine, utils

    wrapped = (llm_engine.renderer_from_config, utils.wait_for_engine_startup)
    before = set(threading.enumerate())  # (other tests' engines' threads may still be ending)
    engine = VLLMEngine(VLLMOptions(model="fake-model", preset="unlimited-ocr", max_tokens=30))
    llm = engine.llm
    rows = _run(engine, _pages(4))
    engine.close()
    assert len(rows) == 4 and all(r["error_type"] is None for r in rows)
    assert not [t.name for t in llm.threads_at_fork if t not in before], llm.threads_at_fork
    waited, built = llm.waited
    assert waited <= engine.renderer_warm_up_at <= calls[0]["start"] < built, (waited, calls[0], built)
    assert calls[0]["size"] == (1344, 1920) and len(calls) == 5  # the blank page, then the 4 pages
    assert (llm_engine.renderer_from_config, utils.wait_for_engine_startup) == wrapped


def test_where_vllms_build_is_not_as_written_the_warm_up_waits_for_the_build(monkeypatch, tmp_path):
    """A vLLM whose build differs from 0.26's (patches.startup's TARGETS) is not wrapped: the
    warm-up begins after the build, as before, and the run reads every page."""
    from batchocr.engines.vllm.patches import startup

    calls = _building(monkeypatch, tmp_path)
    monkeypatch.setattr(startup, "moved", lambda: "this vLLM has no LLMEngine.__init__ in vllm/v1/engine/llm_engine.py")
    engine = VLLMEngine(VLLMOptions(model="fake-model", max_tokens=30))
    llm = engine.llm
    rows = _run(engine, _pages(4))
    engine.close()
    assert len(rows) == 4 and all(r["error_type"] is None for r in rows)
    built = llm.waited[1]
    assert built <= engine.renderer_warm_up_at <= calls[0]["start"] and len(calls) == 5


def test_a_missing_model_folder_is_a_config_error(monkeypatch):
    fake_vllm.install(monkeypatch)
    with pytest.raises(ConfigError, match="model folder /models/nowhere does not exist"):
        VLLMEngine(VLLMOptions(model="/models/nowhere"))


def test_an_engine_arg_vllm_does_not_take_is_named_before_the_model_loads(monkeypatch):
    """engines.vllm.engine_args go to vllm.LLM as they are: a key it does not take (neither its
    own parameter nor a vllm.EngineArgs field) is exit 2 naming it, the nearest key offered,
    before any model loads; one it takes reaches it."""
    fake_vllm.install(monkeypatch)
    before = fake_vllm.LLM.built
    with pytest.raises(ConfigError) as caught:
        VLLMEngine(VLLMOptions(model="fake-model", engine_args={"stream_interval": 8, "kv_cache_dtyp": "fp8"}))
    assert str(caught.value) == ("engines.vllm.engine_args.kv_cache_dtyp: not an argument of vllm.LLM in vLLM fake "
                                 "(did you mean kv_cache_dtype?)")
    assert caught.value.exit_code == 2 and fake_vllm.LLM.built == before  # nothing loaded
    engine = VLLMEngine(VLLMOptions(model="fake-model", engine_args={"stream_interval": 8, "max_num_seqs": 4}))
    assert engine.llm.kwargs["stream_interval"] == 8 and fake_vllm.LLM.built == before + 1
    engine.close()


def test_vllm_refusing_the_engine_s_arguments_or_failing_to_start_is_one_line(monkeypatch):
    """What vllm.LLM raises while it builds, in one line, no traceback: a value its configs
    refuse (pydantic's ValidationError, a ValueError) is the configuration's, exit 2, naming
    vLLM's field and never the value given; its engine core failing to start is the run's,
    exit 1."""
    import pydantic
    from typing import Literal

    class MultiModalConfig(pydantic.BaseModel):  # as vLLM 0.26's, config/multimodal.py
        mm_tensor_ipc: Literal["direct_rpc", "torch_shm"] = "direct_rpc"

    def refusing(exc_of):
        def build(self, **kwargs):
            raise exc_of(kwargs)
        return build

    def validation(kwargs):
        try:
            MultiModalConfig(mm_tensor_ipc=kwargs["mm_tensor_ipc"])
        except pydantic.ValidationError as exc:
            return exc

    fake_vllm.install(monkeypatch)
    cases = [
        (validation, {"mm_tensor_ipc": "hf_abcdef-secret"}, 2,
         "engine vllm: vLLM refused the engine's arguments: mm_tensor_ipc: Input should be 'direct_rpc' or "
         "'torch_shm' (engines.vllm's options and engine_args go to vllm.LLM)"),
        (lambda kw: ValueError("torch_shm is known to fail without VLLM_WORKER_MULTIPROC_METHOD set to spawn\nmore"),
         {"mm_tensor_ipc": "torch_shm"}, 2,
         "engine vllm: vLLM refused the engine's arguments: ValueError: torch_shm is known to fail without "
         "VLLM_WORKER_MULTIPROC_METHOD set to spawn (engines.vllm's options and engine_args go to vllm.LLM)"),
        (lambda kw: RuntimeError("Engine core initialization failed. See root cause above. Failed core proc(s): {}"),
         {}, 1,
         "the vLLM engine failed to start: RuntimeError: Engine core initialization failed. See root cause above. "
         "Failed core proc(s): {} (vLLM's log above says why)"),
    ]
    for exc_of, engine_args, code, line in cases:
        monkeypatch.setattr(fake_vllm.LLM, "__init__", refusing(exc_of))
        with pytest.raises(BatchocrError) as caught:
            VLLMEngine(VLLMOptions(model="fake-model", engine_args=engine_args))
        assert str(caught.value) == line and caught.value.exit_code == code
        assert "secret" not in str(caught.value) and caught.value.__cause__ is None


def test_the_cli_names_a_bad_engine_arg_in_one_line_exit_2(tmp_path):
    """The same through `batchocr run`, vLLM stood in for in the process: exit 2, one line, no
    traceback, no run started."""
    import subprocess
    import sys
    from pathlib import Path

    job = tmp_path / "job.yaml"
    job.write_text(f"source: {SAMPLES}\nout: {tmp_path / 'out'}\nengine: vllm\n"
                   "engines: {vllm: {model: fake-model, engine_args: {stream_intervl: 8}}}\n")
    tests = Path(__file__).resolve().parent
    boot = ("import sys; sys.path.insert(0, sys.argv.pop(1)); import fake_vllm; fake_vllm.install_modules(); "
            "from batchocr.cli import entry; sys.argv[0] = 'batchocr'; entry()")
    done = subprocess.run([sys.executable, "-c", boot, str(tests), "run", "--job", str(job), "--quiet"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines()[-1] == ("Error: engines.vllm.engine_args.stream_intervl: not an argument "
                                                     "of vllm.LLM in vLLM fake (did you mean stream_interval?)")
    assert "Traceback" not in done.stderr


def test_a_model_that_cannot_generate_stops_at_start(monkeypatch):
    """A folder vLLM loads as an embedding model: one line at start, not a row per page."""
    fake_vllm.install(monkeypatch)
    monkeypatch.setattr(fake_vllm.FakeEngine, "tasks", ("embed",))
    with pytest.raises(ConfigError, match="the model /models/fake cannot generate text .vLLM supports embed"):
        VLLMEngine(VLLMOptions(model="/models/fake"), llm=fake_vllm.LLM())


def test_refusals_alike_before_any_request_was_taken_are_systemic(monkeypatch):
    engine, fake = _engine(monkeypatch)
    fake.refuse = AttributeError("'LLMEngine' object has no attribute 'renderer'")
    with pytest.raises(BatchocrError, match=r"refused every request alike \(8 pages, none taken\): AttributeError"):
        _run(engine, _pages(30))
    # every page of a shard shorter than that, too
    engine, fake = _engine(monkeypatch)
    fake.refuse = ValueError("this model takes no images")
    with pytest.raises(BatchocrError, match=r"\(3 pages, none taken\): ValueError: this model takes no images"):
        _run(engine, _pages(3))
    # a lone page has nothing to be judged against: its row says it was refused (README)
    engine, fake = _engine(monkeypatch)
    fake.refuse = ValueError("this model takes no images")
    (row,) = _run(engine, _pages(1))
    assert row["error_type"] == "rejected" and "this model takes no images" in row["error_message"]


def test_refusals_before_the_first_taken_request_are_still_rows(monkeypatch):
    # the first pages are too big for the model; the rest are fine: per-page, all rows
    engine, _ = _engine(monkeypatch, max_model_len=2000)
    rows = {(r["doc_id"], r["page_index"]): r for r in _run(engine, _pages(12, big={0, 1, 2, 3, 4}))}
    assert len(rows) == 12
    assert [rows[(f"d{i // 3}", i % 3)]["error_type"] for i in range(5)] == ["rejected"] * 5
    assert sum(r["finish_reason"] == "stop" for r in rows.values()) == 7


def test_an_engine_refusing_every_page_ends_the_run_with_one_line_and_no_error_rows(monkeypatch, tmp_path):
    """Through the CLI, the engine built as in production (the stand-in's LLM): exit 1,
    one Error line, no row claiming a per-page error, the run record says failed."""
    from conftest import run_cli

    fake_vllm.install(monkeypatch)
    monkeypatch.setattr(fake_vllm.FakeEngine, "refuse", TypeError("unexpected keyword argument 'prompt'"))
    out = tmp_path / "out"
    proc = run_cli("run", str(SAMPLES), str(out), "--engine", "vllm", "--model", "fake-model", "-q")
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.startswith("Error: engine vllm refused every request alike"), proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
    parts = list(out.glob("pages/**/*.parquet"))
    rows = [r for p in parts for r in pq.read_table(p).to_pylist()]
    assert not [r for r in rows if r["error_type"] == "rejected"]

    (record,) = [json.loads(p.read_text()) for p in (out / "_runs").glob("*.json")]
    assert record["status"] == "failed"


def test_a_rerun_with_another_model_or_prompt_exits_2_before_vllm_loads(monkeypatch, tmp_path):
    """OUT remembers the model and prompt it was made with; a rerun with others stops
    with exit 2 naming both before vllm.LLM is built (a real one takes minutes and a
    GPU), and writes nothing. The same settings rerun: nothing to do, and no engine built."""
    import json

    from conftest import run_cli

    fake_vllm.install(monkeypatch)
    monkeypatch.setattr(fake_vllm.LLM, "built", 0)
    out = tmp_path / "out"
    vllm = ("--engine", "vllm", "--model", "fake-model", "-q")
    run_cli("run", str(SAMPLES), str(out), *vllm, check=True)
    assert fake_vllm.LLM.built == 1
    producer = json.loads((out / "_producer.json").read_text())
    assert producer["model"] == "fake-model" and producer["render"]["max_side"] == 1288  # the preset's page size
    before = sorted((p.name, p.stat().st_mtime_ns) for p in out.rglob("*") if p.is_file())

    job = tmp_path / "job.yaml"
    job.write_text("engines:\n  vllm:\n    prompt: Transcribe the page.\n")
    for args, old, new in [
        (("--engine", "vllm", "--model", "other-model", "-q"), "model 'fake-model'", "model 'other-model'"),
        ((*vllm, "--job", str(job)), "prompt '...vision_end|>Read all the text on this page",
         "prompt '...vision_end|>Transcribe the page.<|im_end|>"),
        ((*vllm, "--preset", "olmocr-2"), "preset 'qwen2.5-vl', prompt", "preset 'olmocr-2', prompt"),
    ]:
        proc = run_cli("run", str(SAMPLES), str(out), *args)
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.startswith(f"Error: OUT {out} holds pages made with {old}"), proc.stderr
        assert f"; this run: {new}" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert fake_vllm.LLM.built == 1, f"vllm.LLM was built for a run OUT refuses: {args}"
        assert sorted((p.name, p.stat().st_mtime_ns) for p in out.rglob("*") if p.is_file()) == before

    assert "nothing to do" in run_cli("run", str(SAMPLES), str(out), *vllm, check=True).stdout
    assert fake_vllm.LLM.built == 1  # the shard is listed first: nothing to do loads no model


def test_settings_known_before_the_load_that_differ_from_the_engines_stop_the_run(monkeypatch, tmp_path):
    """engines.vllm.settings() is what OUT is checked against before the model loads;
    should it ever disagree with the built engine, the run stops with one line (exit 1)
    before writing anything, rather than record settings OUT was not checked against."""
    import batchocr.engines.vllm as engine_module
    from conftest import run_cli

    fake_vllm.install(monkeypatch)
    import dataclasses

    real = engine_module.ENGINE.settings
    monkeypatch.setattr(engine_module, "ENGINE", dataclasses.replace(
        engine_module.ENGINE, settings=lambda options: real(options) | {"prompt": "stale"}))
    out = tmp_path / "out"
    proc = run_cli("run", str(SAMPLES), str(out), "--engine", "vllm", "--model", "fake-model", "-q")
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.startswith("Error: engine vllm: OUT was checked before it loaded against settings other "
                                  "than the built engine's (prompt 'stale'; this run: prompt"), proc.stderr
    assert "disagrees with the engine" in proc.stderr and "Traceback" not in proc.stderr
    assert not (out / "_producer.json").exists() and not list(out.glob("_runs/*"))


def test_the_engine_core_killed_mid_run_stops_it_in_seconds_and_the_rerun_completes_once(monkeypatch, tmp_path):
    """SIGKILL of the engine-core process (a real child process in the stand-in, watched as
    vLLM watches its own): vLLM's sync client would leave step() waiting for good; the run
    stops within seconds with one line, exit 1, the run record `failed`, the committed pages
    kept, and the rerun completes the shard exactly once."""
    import json
    import os
    import signal
    import time
    from collections import Counter

    from conftest import run_cli

    fake_vllm.install(monkeypatch)
    pid_file = tmp_path / "core.pid"
    monkeypatch.setenv("BATCHOCR_FAKE_CORE_PROCESS", str(pid_file))
    step = fake_vllm.FakeEngine.step

    def slow(self):  # a real engine's pace, so that the kill lands mid-run
        time.sleep(0.05)
        return step(self)

    monkeypatch.setattr(fake_vllm.FakeEngine, "step", slow)
    out = tmp_path / "out"
    job = tmp_path / "job.yaml"
    job.write_text("commit:\n  every_pages: 1\n")
    killed = {}

    def kill_once_a_page_is_committed():
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if pid_file.exists() and list(out.glob("pages/**/*.parquet")):
                killed["at"] = time.monotonic()
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
                return
            time.sleep(0.02)

    killer = threading.Thread(target=kill_once_a_page_is_committed)
    killer.start()
    started = time.monotonic()
    proc = run_cli("run", str(SAMPLES), str(out), "--engine", "vllm", "--model", "fake-model", "--route", "model",
                   "--job", str(job), "-q")
    ended = time.monotonic()
    killer.join()
    assert "at" in killed, "the run ended before a page was committed"
    assert proc.returncode == 1, proc.stderr
    # in seconds, not a hang: sooner than the run took to commit its first page on this machine
    # now (or 5 s, on a fast one), a bound from the test's own measure and not a fixed one
    took = ended - killed["at"]
    assert took < max(5.0, killed["at"] - started), f"the run took {took:.1f} s to stop after the kill"
    assert proc.stderr.startswith("Error: the vLLM engine failed: its engine-core process died"), proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
    (record,) = [json.loads(p.read_text()) for p in (out / "_runs").glob("*.json")]
    assert record["status"] == "failed"
    kept = read_table(out).to_pylist()
    total = sum(count_pages(p) for p in sample_documents())
    assert 1 <= len(kept) < total and not [r for r in kept if r["finish_reason"] == "error"]

    monkeypatch.delenv("BATCHOCR_FAKE_CORE_PROCESS")
    run_cli("run", str(SAMPLES), str(out), "--engine", "vllm", "--model", "fake-model", "--route", "model",
            "--job", str(job), "-q", check=True)
    rows = read_table(out).to_pylist()
    assert Counter(Counter((r["doc_id"], r["page_index"]) for r in rows).values()) == {1: total}


def test_admission_in_groups_adds_pages_once_enough_sequences_are_free(monkeypatch):
    """admit_pages N: vLLM never holds a queue of its own; requests are added N or more at
    a time (except at the start of the tail), once N sequences are free, and every page
    still comes back once."""
    fake_vllm.install(monkeypatch)
    llm = fake_vllm.LLM(max_num_seqs=8)
    engine = VLLMEngine(VLLMOptions(model="/m", max_num_seqs=8, admit_pages=4, queue_pages=40, max_tokens=50), llm=llm)
    fake, sizes = llm.llm_engine, []
    step = fake.step

    def counting_step():
        sizes.append(fake.added)
        return step()

    fake.step = counting_step
    rows = _run(engine, _pages(60))
    assert sorted((r["doc_id"], r["page_index"]) for r in rows) == sorted((f"d{i // 3}", i % 3) for i in range(60))
    assert fake.peak_waiting == 0  # nothing ever waited inside vLLM
    added = [b - a for a, b in zip([0] + sizes, sizes) if b != a]
    # in groups: once a request is running, none goes in until 4 sequences are free (fewer only
    # when fewer are prepared by then, or at the end)
    assert sum(added) == 60 and sorted(added)[len(added) // 2] >= 4 and max(added) <= 8, added
    # off (0): everything goes in at once, and waits inside vLLM
    engine, fake = _engine(monkeypatch, max_num_seqs=8, queue_pages=40, max_tokens=50, admit_pages=0)
    _run(engine, _pages(60))
    assert fake.peak_waiting > 0


def test_admission_in_groups_is_the_preset_s_default_in_page_mode(monkeypatch):
    """admit_pages unset: 16 in page mode for the presets measured on the GPU (unlimited-ocr;
    qwen2.5-vl and olmocr-2, one layout), at most an eighth of max_num_seqs; the other presets,
    document mode and an explicit 0 admit as vLLM does; an explicit N is kept (up to max_num_seqs)."""
    fake_vllm.install(monkeypatch)

    def admitted(**options):
        llm = fake_vllm.LLM(max_num_seqs=options.get("max_num_seqs", 256))
        return VLLMEngine(VLLMOptions(model="/m", **options), llm=llm).admit_pages

    assert admitted(preset="unlimited-ocr") == 16
    assert admitted(preset="unlimited-ocr", max_num_seqs=64) == 8
    assert admitted(preset="unlimited-ocr", max_num_seqs=4) == 1
    assert admitted(preset="unlimited-ocr", max_num_seqs=8, admit_pages=6) == 6
    assert admitted(preset="unlimited-ocr", max_num_seqs=8, admit_pages=20) == 8
    assert admitted(preset="unlimited-ocr", admit_pages=0) == 0
    assert admitted(preset="unlimited-ocr", mode="document") == 0
    assert admitted(preset="qwen2.5-vl") == 16 and admitted(preset="olmocr-2") == 16
    assert admitted(preset="qwen2.5-vl", admit_pages=4) == 4 and admitted(preset="qwen2.5-vl", admit_pages=0) == 0
    assert admitted(preset="qwen3-vl") == 0 and admitted(preset="deepseek-ocr") == 0
    # and the engine feeds by it: nothing ever waits inside vLLM
    llm = fake_vllm.LLM(max_num_seqs=32)
    engine = VLLMEngine(VLLMOptions(model="/m", preset="unlimited-ocr", max_num_seqs=32, queue_pages=60,
                                    max_tokens=50), llm=llm)
    rows = _run(engine, _pages(90))
    assert sorted((r["doc_id"], r["page_index"]) for r in rows) == sorted((f"d{i // 3}", i % 3) for i in range(90))
    assert llm.llm_engine.peak_waiting == 0 and engine.describe()["admit_pages"] == 4


def test_the_first_requests_reach_vllm_before_the_whole_queue_is_pulled(monkeypatch):
    """While the queue fills, prepared requests go to vLLM as soon as it can take them: at the
    start, filling the whole queue first left the GPU idle while it was rendered and prepared
    (the first step 20 s into a 1,024-page run on the H200, queue_pages 352). In the steady
    state nothing changes: the queue is topped up as pages finish, and still fills."""
    # admit_pages 0, so that the filled queue shows inside vLLM (admission in groups keeps it here)
    engine, fake = _engine(monkeypatch, queue_pages=40, max_tokens=50, admit_pages=0)
    pulled, at_first_add = [], []
    add = fake.add_request

    def counting_add(*a, **k):
        if not at_first_add:
            at_first_add.append(len(pulled))
        return add(*a, **k)

    fake.add_request = counting_add

    # set once a request's preparation is done as its future says (a callback runs after the
    # future is marked done: set at the end of _prepare, the engine could still see it running)
    prepared, start = threading.Event(), engine._start

    def start_and_watch(request, preparing):
        start(request, preparing)
        preparing[-1][1].add_done_callback(lambda _: prepared.set())

    engine._start = start_and_watch

    def batches():
        for i, b in enumerate(_pages(120)):
            if i == 2:  # rendering is slower than preparing: the first request is prepared by now
                prepared.wait(10)  # (a loaded machine once pulled all 40 pages first)
            pulled.append(b.num_rows)
            yield b

    rows = _run(engine, batches())
    assert sorted((r["doc_id"], r["page_index"]) for r in rows) == sorted((f"d{i // 3}", i % 3) for i in range(120))
    assert at_first_add and sum(pulled[:at_first_add[0]]) < 40, (at_first_add, pulled)  # before the queue was full
    assert fake.peak_waiting >= 20  # and the queue still filled: vLLM's batch never ran short


def _instances(monkeypatch, n=2, **options):
    fake_vllm.install(monkeypatch)
    llms = [fake_vllm.LLM(max_num_seqs=options.get("max_num_seqs", 4)) for _ in range(n)]
    options.setdefault("max_num_seqs", 4)
    engine = VLLMInstances(VLLMOptions(model="/models/fake", instances=n, **options), llms)
    return engine, [llm.llm_engine for llm in llms]


def test_with_instances_no_warm_up_runs_while_an_engine_is_built(monkeypatch):
    """vLLM forks each engine core from this process, and a processor run in it before a build hung
    the engine core on the H200: with instances 3, built one after the other, the renderers'
    warm-ups start once the last is built, one each, one after the other (first calls made at
    once each paid the set-up)."""
    fake_vllm.install(monkeypatch)
    events, real = [], fake_vllm.LLM.__init__

    def build(self, *args, **kwargs):
        events.append("build")
        real(self, *args, **kwargs)
        inner = self.llm_engine.renderer.render_cmpl
        def render_cmpl(prompts):
            events.append("warm-up")
            time.sleep(0.1)  # the first call's set-up: a second call made meanwhile would overlap it
            out = inner(prompts)
            events.append("warmed")
            return out

        self.llm_engine.renderer.render_cmpl = render_cmpl
        time.sleep(0.2)  # a build that takes a while: an earlier instance's warm-up would land in it
        events.append("built")

    monkeypatch.setattr(fake_vllm.LLM, "__init__", build)
    engine = VLLMInstances(VLLMOptions(model="fake-model", instances=3, max_num_seqs=4))
    for each in engine.instances:
        each.start_warm_up().result(timeout=5)  # the last of its warm-ups
    engine.close()
    assert events == ["build", "built"] * 3 + ["warm-up", "warmed"] * 3
    assert engine.renderer_warm_up_s is not None


def test_several_instances_share_the_pages_each_page_once(monkeypatch):
    """engines.vllm.instances 2: two engines (each its own engine core on the GPU) take the pages
    as each has room; every page comes back once, both did part of the work, and each was built
    with half of gpu_memory_utilization."""
    engine, fakes = _instances(monkeypatch, queue_pages=6, max_tokens=50)
    rows = _run(engine, _pages(90))
    assert sorted((r["doc_id"], r["page_index"]) for r in rows) == sorted((f"d{i // 3}", i % 3) for i in range(90))
    assert all(r["finish_reason"] == "stop" and r["attempts"] == 1 for r in rows)
    assert sum(f.added for f in fakes) == 90 and min(f.added for f in fakes) >= 20, [f.added for f in fakes]
    assert [e.options.gpu_memory_utilization for e in engine.instances] == [0.45, 0.45]
    assert engine.options.llm_args(engine.preset)["gpu_memory_utilization"] == 0.45
    assert engine.queue_pages == 12
    engine.close()
    assert all(f.engine_core.shut for f in fakes)


def test_a_looping_page_is_stopped_and_retried_with_several_instances_too(monkeypatch):
    engine, fakes = _instances(monkeypatch, repetition_span=30, repetition_max_period=5, max_tokens=500)
    rows = {(r["doc_id"], r["page_index"]): r for r in _run(engine, _pages(12, dark={1, 7}))}
    assert len(rows) == 12 and sum(len(f.aborted) for f in fakes) == 2
    assert all((r["attempts"], r["finish_reason"]) == ((2, "stop") if key in {("d0", 1), ("d2", 1)} else (1, "stop"))
               for key, r in rows.items())


@pytest.mark.parametrize("pages", [2, 3])
def test_refusals_alike_on_every_instance_are_systemic_and_no_row_leaves(monkeypatch, pages):
    """Each instance held back its own refusals: at the end of its input, one that held a
    single refusal gave it out as a row (committed by the pipeline: `rejected` is final)
    while the other stopped the run saying no page was recorded, or, a page each, both
    gave theirs out and the run ended 0. The instances judge together: the last to end."""
    engine, fakes = _instances(monkeypatch)
    for fake in fakes:
        fake.refuse = ValueError("this model takes no images")
    one_a_batch = pa.Table.from_batches(_pages(pages)).to_batches(max_chunksize=1)
    rows = []
    with pytest.raises(BatchocrError, match=rf"\({pages} pages, none taken\): ValueError: this model takes no images"):
        for out in engine.run(iter(one_a_batch), threading.Event()):
            rows.extend(out.to_pylist())
    assert not rows
    assert all(f.refusals for f in fakes), "both instances were dealt a page"


def test_one_instance_failing_stops_the_run_and_the_other(monkeypatch):
    engine, fakes = _instances(monkeypatch, queue_pages=4, max_tokens=50)
    steps = {"n": 0}
    step = fakes[1].step

    def dying():
        steps["n"] += 1
        if steps["n"] > 3:
            raise RuntimeError("EngineCore died")
        return step()

    fakes[1].step = dying
    with pytest.raises(BatchocrError, match="vLLM engine failed"):
        _run(engine, _pages(200))
    assert not fakes[0].order  # the other's requests aborted, none left running
    assert fakes[0].added < 200


def test_stop_aborts_what_every_instance_has_in_flight(monkeypatch):
    engine, fakes = _instances(monkeypatch, queue_pages=8, max_tokens=50)
    seen = _stopped_after_the_first_rows(engine, 80)
    assert 1 <= len(seen) < 80
    assert not any(f.order for f in fakes)  # the instances' threads were joined, their requests aborted
    # every request came back, was aborted, or finished after the stop, not yet handed back (not
    # committed either: the next run reads it again, as a single engine's unfinished pages)
    assert len(seen) + sum(len(f.aborted) for f in fakes) <= sum(f.added for f in fakes) <= len(seen) + sum(
        len(f.aborted) for f in fakes) + 2 * 4


def test_the_pipeline_with_two_instances_writes_one_row_a_page(monkeypatch, tmp_path):
    engine, fakes = _instances(monkeypatch, preset="olmocr-2", queue_pages=3, max_tokens=40)
    spec = load_job(None, source=str(SAMPLES), out=str(tmp_path / "out"), engine="vllm", route="model",
                    engine_options={"model": "/models/fake", "preset": "olmocr-2", "instances": 2})
    summary = run_job(spec, progress=False, engine=engine)
    table = read_table(tmp_path / "out")
    keys = list(zip(table.column("doc_id").to_pylist(), table.column("page_index").to_pylist()))
    assert summary.pages == table.num_rows == len(set(keys)) == sum(count_pages(p) for p in sample_documents())
    assert sum(f.added for f in fakes) == table.num_rows and all(f.added for f in fakes)
    assert all(f.engine_core.shut for f in fakes)
    # the earliest of the instances' first requests: the run's
    assert engine.first_request_at == min(e.first_request_at for e in engine.instances)
    assert 0 < summary.timings["first_page_s"] <= summary.timings["first_request_s"]


def test_instances_with_tensor_parallelism_is_a_config_error_naming_the_key():
    with pytest.raises(ConfigError, match=r"^engines\.vllm\.instances: "):
        VLLMOptions(model="/m", instances=2, tensor_parallel_size=2)
    with pytest.raises(ConfigError, match=r"instances"):
        parse_options(VLLMOptions, {"model": "/m", "instances": 0}, "vllm")


def test_an_instance_s_feed_ends_only_after_its_last_batch():
    """The end of input is set after the last batch went in: a feed that looked at an empty slot
    just before still hands that batch out before it ends."""
    from batchocr.engines.vllm.instances import _Feed

    class Late(queue.Queue):  # its first wait times out just as the last batch goes in
        late = True

        def get(self, block=True, timeout=None):
            if self.late:
                self.late = False
                raise queue.Empty
            return super().get(block, timeout)

    feed = _Feed(threading.Event())
    feed.slot = Late(maxsize=1)
    feed.slot.put("last")
    feed.ended.set()
    assert list(feed) == ["last"]
    halted = _Feed(threading.Event())
    halted.halt.set()
    assert list(halted) == []


def test_batchocr_run_with_two_instances_from_a_job_spec(monkeypatch, tmp_path):
    """`engines.vllm.instances: 2` in a job spec: `batchocr run` builds two engines, each with
    half of gpu_memory_utilization, every page one row, the run record says 2; 0 is exit 2
    naming the key, before any engine is built."""
    import json

    from conftest import run_cli

    fake_vllm.install(monkeypatch)
    monkeypatch.setattr(fake_vllm.LLM, "built", 0)
    kwargs = []
    init = fake_vllm.LLM.__init__

    def noting(self, *a, **kw):
        kwargs.append(kw)
        init(self, *a, **kw)

    monkeypatch.setattr(fake_vllm.LLM, "__init__", noting)
    job = tmp_path / "job.yaml"
    job.write_text("engines:\n  vllm:\n    instances: 2\n    gpu_memory_utilization: 0.8\n")
    out = tmp_path / "out"
    run_cli("run", str(SAMPLES), str(out), "--engine", "vllm", "--model", "fake-model", "--route", "model",
            "--job", str(job), "-q", check=True)
    assert fake_vllm.LLM.built == 2 and [k["gpu_memory_utilization"] for k in kwargs] == [0.4, 0.4]
    table = read_table(out)
    keys = list(zip(table.column("doc_id").to_pylist(), table.column("page_index").to_pylist()))
    assert table.num_rows == len(set(keys)) == sum(count_pages(p) for p in sample_documents())
    (record,) = [json.loads(p.read_text()) for p in (out / "_runs").glob("*.json")]
    assert record["status"] == "done" and record["engine_params"]["instances"] == 2, record["status"]
    job.write_text("engines:\n  vllm:\n    instances: 0\n")
    proc = run_cli("run", str(SAMPLES), str(tmp_path / "out2"), "--engine", "vllm", "--model", "fake-model",
                   "--job", str(job), "-q")
    assert proc.returncode == 2 and "instances" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert fake_vllm.LLM.built == 2


def test_kv_cache_gib_is_vllm_s_kv_bytes_shared_by_instances_and_parts():
    """kv_cache_gib: vLLM's kv_cache_memory_bytes, split between an engine's instances and a
    shard's parts like gpu_memory_utilization; set, an engine need not start alone."""
    from batchocr.engines import vllm as vllm_engine

    def args(**options):
        o = VLLMOptions(model="/m", preset="qwen2.5-vl", **options)
        return o.llm_args(get_preset("qwen2.5-vl"))

    assert "kv_cache_memory_bytes" not in args()
    assert args(kv_cache_gib=24)["kv_cache_memory_bytes"] == 24 * 2**30
    assert args(kv_cache_gib=24, instances=2)["kv_cache_memory_bytes"] == 12 * 2**30
    half = vllm_engine.shared({"model": "/m", "kv_cache_gib": 24}, 2)
    assert half["kv_cache_gib"] == 12 and half["gpu_memory_utilization"] == 0.45
    assert "kv_cache_gib" not in vllm_engine.shared({"model": "/m"}, 2)
    assert vllm_engine.starts_alone({"model": "/m"})
    assert not vllm_engine.starts_alone({"model": "/m", "kv_cache_gib": 8})
    assert vllm_engine.starts_alone({"model": "/m", "engine_args": {"kv_cache_memory_bytes": 2**33}})  # each part's


def test_qwen2_5_vl_s_vision_blocks_are_compiled_unless_the_user_says_otherwise():
    """compile_mm_encoder is qwen2.5-vl's and olmocr-2's default (won twice at equal work on the
    H200, docs/history/GPU.md); a user's compilation_config is laid over it key by key, so other compile
    settings keep it and `compile_mm_encoder: false` turns it off; models whose encoder vLLM does
    not compile get no such key; the preset's dict is not shared between runs."""
    def args(preset="qwen2.5-vl", **engine_args):
        return VLLMOptions(model="/m", preset=preset, engine_args=engine_args).llm_args(get_preset(preset))

    assert args()["compilation_config"] == {"compile_mm_encoder": True}
    assert args("olmocr-2")["compilation_config"] == {"compile_mm_encoder": True}
    assert "compilation_config" not in args("qwen3-vl") and "compilation_config" not in args("unlimited-ocr")
    assert args(compilation_config={"compile_mm_encoder": False})["compilation_config"] == {"compile_mm_encoder": False}
    assert args(compilation_config={"cudagraph_capture_sizes": [1, 2]})["compilation_config"] == {
        "compile_mm_encoder": True, "cudagraph_capture_sizes": [1, 2]}
    assert args(compilation_config=3)["compilation_config"] == 3  # vLLM's level form replaces the whole
    assert args("qwen3-vl", compilation_config={"mode": 0})["compilation_config"] == {"mode": 0}
    mine = args()
    mine["compilation_config"]["compile_mm_encoder"] = False
    assert args()["compilation_config"] == {"compile_mm_encoder": True}

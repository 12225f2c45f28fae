"""Layout blocks from DeepSeek-OCR's and Unlimited-OCR's real answers (tests/data/grounding,
README there says where each came from), through batchocr.grounding.parse, the presets
and a pipeline run with vLLM stood in for."""

import json
import re
import shutil
from pathlib import Path

import pytest

import fake_vllm
from batchocr.engines.vllm.presets import get_preset
from batchocr.engines.vllm import VLLMEngine, VLLMOptions
from batchocr.grounding import EOS, parse
from batchocr.pipeline import run_job
from batchocr.spec import load_job
from conftest import SAMPLES, read_table, run_cli

DATA = Path(__file__).parent / "data" / "grounding"
TAG_TEXT = re.compile(r"<\|/?(?:ref|det)\|>|<\|$")
SPECIAL = re.compile(r"<\|/?(?:ref|det)\|>")


def raw(name: str) -> str:
    return (DATA / f"{name}.raw.txt").read_text(encoding="utf-8")


REAL = {  # answers of the models, with the page image's size where the source gives it
    "deepseek-ocr/masrren-page001": (1654, 2339),
    "deepseek-ocr/vastera-page015": (1170, 1654),
    "deepseek-ocr/docling-example": (1224, 1584),
    "deepseek-ocr/docling-title": (1224, 1584),
    "unlimited-ocr/npu-invoice": (1000, 1000),
    "unlimited-ocr/documented-page": (1240, 1754),
}


def paragraphs(md: str) -> list[str]:
    return [p.strip() for p in re.split(r"\n\s*\n", md) if p.strip()]


@pytest.mark.parametrize("name", ["masrren-page001", "vastera-page015"])
def test_the_text_is_what_deepseeks_own_post_processing_writes(name):
    """The same answer through DeepSeek-OCR's re_match (result.mmd beside it in its
    source): the same paragraphs, but image links that name the region, not a crop."""
    text, blocks = parse(raw(f"deepseek-ocr/{name}"), *REAL[f"deepseek-ocr/{name}"])
    reference = (DATA / "deepseek-ocr" / f"{name}.result.mmd").read_text(encoding="utf-8")
    links = iter(range(100))
    ours = re.sub(r"!\[\]\(page_\d+_\d+_\d+_\d+\.png\)", lambda _: f"![](images/{next(links)}.jpg)", text)
    assert paragraphs(ours) == paragraphs(reference)
    assert "<|" not in text and len(blocks) == raw(f"deepseek-ocr/{name}").count("<|ref|>")


def test_a_deepseek_page_gives_its_blocks_in_the_pages_pixels():
    text, blocks = parse(raw("deepseek-ocr/masrren-page001"), 1654, 2339)
    assert [b["type"] for b in blocks].count("sub_title") == 5 and len(blocks) == 15
    title = blocks[0]
    # [[142, 77, 864, 106]] on the 0-999 grid of a 1654 x 2339 page
    assert title == {"type": "title", "box": [235, 180, 1430, 248], "text": "# Masrren（梅索伦-双区冰水缸）操作工艺",
                     "box_norm": pytest.approx([142 / 999, 77 / 999, 864 / 999, 106 / 999])}
    (table,) = [b for b in blocks if b["type"] == "table"]
    assert table["text"].startswith("<table><tr><td>适合人数</td>") and table["text"].endswith("</table>")
    assert text == "\n\n".join(b["text"] for b in blocks)


def test_an_unlimited_ocr_page_uses_the_1000_grid():
    text, blocks = parse(raw("unlimited-ocr/npu-invoice"), 2000, 500)
    assert text == "Invoice No: UOCR-2026-0703\n\nTotal: 123.45 USD\n\nDeploy test on Ascend NPU"
    assert [b["type"] for b in blocks] == ["text"] * 3
    assert blocks[0]["box"] == [118, 97, 546, 120]
    assert blocks[0]["box_norm"] == pytest.approx([0.059, 0.194, 0.273, 0.24])
    _, (b,) = parse("<|det|>text [290, 0, 1000, 1000]<|/det|>x", 100, 100)
    assert b["box"] == [29, 0, 100, 100]  # exact: 290 * 100 / 1000, not 0.29 * 100 = 28.999...
    _, (line,) = parse((DATA / "unlimited-ocr" / "docling-pr3944.raw.txt").read_text(), 880, 1200)
    assert line["type"] == "title" and line["text"] == "Reconciliation report No. 2026-07/1481"
    _, blocks = parse(raw("unlimited-ocr/documented-page"), 1240, 1754)
    number = blocks[-1]
    assert number["type"] == "page_number" and number["box"] == [1116, 1687, 1240, 1718]  # 900/1000, not /999
    assert "\n" in blocks[2]["text"]  # a block of two lines stays one block
    (formula,) = [b for b in blocks if b["type"] == "formula"]
    assert formula["text"] == r"R = \frac{A}{L} := 1.42"  # as both models' post-processing rewrites it


def test_an_image_block_becomes_an_image_link_to_its_region():
    _, blocks = parse(raw("deepseek-ocr/vastera-page015"), 1170, 1654)
    images = [b for b in blocks if b["type"] == "image"]
    assert len(images) == 7
    for b in images:
        x1, y1, x2, y2 = b["box"]
        assert b["text"] == f"![](page_{x1}_{y1}_{x2 - x1}_{y2 - y1}.png)"
    assert images[-1] is blocks[-1]  # the page ends on an image: its link is the text's last paragraph
    types = [b["type"] for b in blocks]
    assert all(types[i + 1] == "image_caption" for i, t in enumerate(types[:-1]) if t == "image")


def test_text_before_the_first_tag_and_the_models_order_are_kept():
    text, blocks = parse(raw("deepseek-ocr/docling-example"), 1224, 1584)
    assert blocks[0]["type"] is None and blocks[0]["box"] is None
    assert blocks[0]["text"].startswith("order to compute the TED score.")
    types = [b["type"] for b in blocks]
    table = types.index("table")
    # DeepSeek-OCR writes the table's tag, then its caption's tag, then caption and table
    assert types[table + 1] == "table_caption" and blocks[table]["text"] == ""
    assert "<table>" in blocks[table + 1]["text"] and text.count("<table>") == 1


def test_an_answer_without_tags_is_the_text_as_it_is_and_no_blocks():
    plain = raw("deepseek-ocr/issue200-excerpt")
    assert parse(plain, 800, 1000) == (plain, None)
    assert parse(plain.rstrip() + EOS[0], 800, 1000) == (plain.rstrip(), None)  # skip_special_tokens=False
    assert parse("", 800, 1000) == ("", None)


@pytest.mark.parametrize("name", sorted(REAL))
def test_the_end_of_sentence_token_is_no_part_of_the_text(name):
    assert parse(raw(name) + EOS[0], *REAL[name]) == parse(raw(name), *REAL[name])


def cut_points(answer: str) -> list[int]:
    """Where max_tokens can cut an answer: anywhere but inside a tag token (each of
    <|ref|> <|/ref|> <|det|> <|/det|> is one special token of both models' tokenizers)."""
    inside = {i for m in SPECIAL.finditer(answer) for i in range(m.start() + 1, m.end())}
    return [i for i in range(len(answer)) if i not in inside]


@pytest.mark.parametrize("name", sorted(REAL))
def test_an_answer_cut_anywhere_keeps_every_finished_block_and_no_tag(name):
    """Made from the real answer: its prefix at every cut point, as max_tokens cuts it."""
    answer, size = raw(name), REAL[name]
    _, full = parse(answer, *size)
    for cut in cut_points(answer):
        text, blocks = parse(answer[:cut], *size)
        assert not TAG_TEXT.search(text), (cut, text[-40:])
        if blocks is None:
            assert "<|" not in answer[:cut]
            continue
        assert text == "\n\n".join(b["text"] for b in blocks if b["text"])
        assert len(blocks) <= len(full)
        for got, want in zip(blocks[:-1], full):
            assert got == want, cut
        if blocks:
            last, want = blocks[-1], full[len(blocks) - 1]
            got = re.sub(r"\\[a-z]*$", "", last["text"])  # a cut \coloneqq is not yet rewritten to :=
            assert (last["type"], last["box"]) == (want["type"], want["box"]) and want["text"].startswith(got)


def test_cut_mid_tag_mid_box_and_mid_table():
    answer = raw("deepseek-ocr/masrren-page001")
    _, full = parse(answer, 1654, 2339)
    last_tag = answer.rindex("<|ref|>")
    mid_box = answer[:answer.index("813, 9", last_tag)]  # ...<|det|>[[79, 813, 9
    text, blocks = parse(mid_box, 1654, 2339)
    assert blocks == full[:-1] and text.endswith("需注意；")
    text, blocks = parse(answer[:last_tag + len("<|ref|>te")], 1654, 2339)
    assert blocks == full[:-1]
    for partial in ("<", "<|", "<|re", "<|/de"):  # a tag token's text cut (only where tokens are not whole tags)
        text, blocks = parse(answer[:last_tag] + partial, 1654, 2339)
        assert blocks[:-1] == full[:-2] and not TAG_TEXT.search(text) and "<|" not in text
    table = answer.index("<table>")
    text, blocks = parse(answer[:table + 200], 1654, 2339)
    assert blocks[-1]["type"] == "table" and blocks[-1]["text"] == answer[table:table + 200].rstrip()


def test_a_box_out_of_range_is_clamped_and_an_unreadable_one_is_none():
    """One coordinate of a real answer changed (the tags as the models write them)."""
    answer = raw("deepseek-ocr/masrren-page001")
    assert "[[70, 517, 936, 656]]" in answer
    _, blocks = parse(answer.replace("[[70, 517, 936, 656]]", "[[-12, 517, 1040, 656]]"), 1654, 2339)
    (table,) = [b for b in blocks if b["type"] == "table"]
    assert table["box"] == [0, 1210, 1654, 1535] and table["box_norm"][0] == 0.0 and table["box_norm"][2] == 1.0
    page = raw("unlimited-ocr/documented-page")
    _, blocks = parse(page.replace("image [61, 478, 612, 803]", "image [61, 478, 1212, 803]"), 1240, 1754)
    assert [b for b in blocks if b["type"] == "image"][0]["box"][2] == 1240
    _, reversed_ = parse(page.replace("image [61, 478, 612, 803]", "image [612, 803, 61, 478]"), 1240, 1754)
    assert reversed_ == parse(page, 1240, 1754)[1]  # corners in the wrong order: the same box
    text, blocks = parse(page.replace("title [61, 71, 938, 104]", "title [61, 71, 938]"), 1240, 1754)
    assert blocks[1]["type"] == "title" and blocks[1]["box"] is None and blocks[1]["box_norm"] is None
    assert blocks[1]["text"] == "Statement of financial position" and "Statement of financial position" in text


def test_several_boxes_in_one_tag_give_their_union():
    answer = raw("deepseek-ocr/vastera-page015").replace(
        "[[150, 249, 377, 400]]", "[[150, 249, 377, 400], [425, 250, 640, 420]]", 1)
    _, blocks = parse(answer, 999, 999)
    assert blocks[5]["type"] == "image" and blocks[5]["box"] == [150, 249, 640, 420]


def test_presets_read_their_answers():
    deepseek, olmocr = get_preset("deepseek-ocr"), get_preset("olmocr-2")
    answer = raw("deepseek-ocr/masrren-page001") + EOS[0]
    assert deepseek.read(answer, 1654, 2339) == parse(answer, 1654, 2339)
    assert olmocr.read("---\nprimary_language: zh\n---\n" + answer, 10, 10) == (answer, None)  # no layout parsed


def test_a_pipeline_run_writes_blocks_in_the_rendered_pages_pixels(monkeypatch, tmp_path):
    """The whole way: a real image rendered to the preset's size, vLLM stood in for
    answering a real DeepSeek-OCR answer, the table, compaction, and the Markdown export."""
    src = tmp_path / "src"
    src.mkdir()
    shutil.copy(SAMPLES / "letter.jpg", src / "letter.jpg")
    answer = raw("deepseek-ocr/masrren-page001") + EOS[0]
    fake_vllm.install(monkeypatch)
    monkeypatch.setattr(fake_vllm.FakeEngine, "answer", answer)
    out = tmp_path / "out"
    for name, max_tokens in (("whole", 8000), ("cut", 200)):
        llm = fake_vllm.LLM(max_num_seqs=4, max_model_len=8192)
        engine = VLLMEngine(VLLMOptions(model="/models/fake", preset="deepseek-ocr", max_tokens=max_tokens), llm=llm)
        spec = load_job(None, source=str(src), out=str(out / name), engine="vllm",
                        engine_options={"model": "/models/fake", "preset": "deepseek-ocr", "max_tokens": max_tokens})
        run_job(spec, progress=False, engine=engine)
    (whole,) = read_table(out / "whole").to_pylist()
    (cut,) = read_table(out / "cut").to_pylist()
    text, blocks = parse(answer, whole["width"], whole["height"])
    assert whole["finish_reason"] == "stop" and whole["text"] == text and "<|" not in text
    assert [b | {"box_norm": pytest.approx(b["box_norm"])} for b in whole["blocks"]] == blocks
    assert all(0 <= b["box"][0] < b["box"][2] <= whole["width"] and b["box"][3] <= whole["height"]
               for b in whole["blocks"])
    assert cut["finish_reason"] == "length" and cut["output_tokens"] == 200
    cut_text, cut_blocks = parse(answer[:200 * fake_vllm.FakeEngine.ANSWER_CHARS], cut["width"], cut["height"])
    assert cut["text"] == cut_text and len(cut["blocks"]) == len(cut_blocks) < len(blocks)
    run_cli("export", str(out / "whole"), str(tmp_path / "md"), "--format", "markdown", check=True)
    (md,) = (tmp_path / "md").glob("*.md")
    body = md.read_text()
    assert text in body and "<|" not in body and "end▁of▁sentence" not in body
    # JSONL, the machine-readable export, keeps the page's layout blocks as the table holds them
    run_cli("export", str(out / "whole"), str(tmp_path / "jl"), "--format", "jsonl", check=True)
    (jl,) = (tmp_path / "jl").glob("*.jsonl")
    (page,) = json.loads(jl.read_text())["pages"]
    assert page["text"] == text and page["blocks"] == whole["blocks"]


def test_the_readmes_grounding_prompt_flag_reaches_the_model_and_out_remembers_it(monkeypatch, tmp_path):
    """README (Layout blocks) gives DeepSeek-OCR its grounding prompt as `--prompt '...'`: a flag
    `batchocr run` did not have (exit 2, "No such option"), only the job spec's engines.vllm.prompt."""
    src = tmp_path / "src"
    src.mkdir()
    shutil.copy(SAMPLES / "letter.jpg", src / "letter.jpg")
    fake_vllm.install(monkeypatch)
    monkeypatch.setattr(fake_vllm.FakeEngine, "answer", raw("deepseek-ocr/masrren-page001") + EOS[0])
    prompt = re.search(r"`--prompt '([^']+)'`", (Path(__file__).parents[1] / "README.md").read_text()).group(1)
    out = tmp_path / "out"
    run_cli("run", str(src), str(out), "--engine", "vllm", "--model", "fake-model", "--preset", "deepseek-ocr",
            "--prompt", prompt, "-q", check=True)
    assert prompt in json.loads((out / "_producer.json").read_text())["prompt"]
    (row,) = read_table(out).to_pylist()
    assert row["blocks"] and "<|" not in row["text"]
    proc = run_cli("run", str(src), str(tmp_path / "cpu"), "--prompt", prompt)  # the default engine, rapidocr
    assert proc.returncode == 2 and proc.stderr == "Error: --prompt: for --engine vllm; this run's engine is rapidocr\n"

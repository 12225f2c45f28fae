"""bench/gpu/ cannot run here (no GPU), but it must not rot: throughput.py's dry
run drives all three modes through the vLLM stand-in (tests/fake_vllm.py) and the
real pipeline, and plot.py draws its JSON."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_throughput_dry_run_and_plot(tmp_path):
    report = tmp_path / "tp.json"
    subprocess.run([sys.executable, str(ROOT / "bench/gpu/throughput.py"), "--fake", "--pages", "24",
                    "--max-num-seqs", "4", "--chunk", "8", "--render-workers", "1", "--modes", "a,c,b,a0",
                    "--b-variants", "queue_pages=2", "--variant", "seqs8=--max-num-seqs 8",
                    "--variant", "engines2=--engines 2", "--json", str(report)],
                   check=True, capture_output=True, text=True, timeout=300)
    r = json.loads(report.read_text())
    assert r["pages"] == 24
    modes = ("a_vllm_alone", "c_batch_at_a_time", "b_batchocr", "b_queue_pages_2", "a0_vllm_defaults", "b_seqs8",
             "b_engines2")
    for mode in modes:
        assert r[mode]["pages_per_s"] > 0, mode
        # what each mode did is on its record: pages, attempts, finish reasons, every token handed out
        work = r[mode]["work"]
        assert work["pages"] == 24 and work["attempts"] == {"1": 24} and sum(work["finish_reasons"].values()) == 24
        assert work["client_tokens"] == work["output_tokens_rows"] > 24, mode
    assert r["equal_work"]["equal"] and set(r["equal_work"]["tokens"]) == set(modes)
    assert len(set(r["equal_work"]["prompt_tokens"].values())) == 1  # the same prompts too (same page sizes)
    # b is the real pipeline: one row per page, and every page's finish time recorded.
    assert r["b_batchocr"]["rows"] == 24 and len(r["b_batchocr"]["timeline"]) == 24
    assert r["b_batchocr"]["guard"] == "off" and r["b_batchocr"]["work"]["errors"] == {}
    assert r["b_queue_pages_2"]["queue_pages"] == 2 and r["b_queue_pages_2"]["rows"] == 24
    # a' and the variants ran with their own engines: vLLM's defaults, the variant's arguments
    assert "max_num_seqs" not in r["a0_vllm_defaults"]["llm_args"]
    assert r["a0_vllm_defaults"]["llm_args"]["load_format"] == "dummy"
    assert r["b_seqs8"]["llm_args"]["max_num_seqs"] == 8 and r["b_batchocr"]["queue_pages"] == 4 + 1 + 32
    # two engine processes, the documents split between them, every page once
    assert r["b_engines2"]["engines"] == 2 and sorted(e["rows"] for e in r["b_engines2"]["per_engine"]) == [8, 16]
    assert r["b_engines2"]["rows"] == 24 and len(r["b_engines2"]["timeline"]) == 24
    assert all(0 <= t <= r["b_engines2"]["wall_s"] + 0.01 for t in r["b_engines2"]["timeline"])
    for key in ("ratio_b_batchocr/a_vllm_alone", "ratio_b_batchocr/c_batch_at_a_time",
                "ratio_b_batchocr/a0_vllm_defaults", "ratio_b_engines2/b_batchocr"):
        assert r[key] > 0, key
    png = tmp_path / "tp.png"
    subprocess.run([sys.executable, str(ROOT / "bench/gpu/plot.py"), str(report), str(png)], check=True, timeout=120)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_compute_ceiling_of_the_issue_layouts(tmp_path):
    # The issue quotes ~18 pages/s (7B layout) and ~37 (2B) at 773 TFLOP/s bf16.
    sys.path.insert(0, str(ROOT / "bench/gpu"))
    from throughput import compute_ceiling

    seven = tmp_path / "7b"
    seven.mkdir()
    (seven / "config.json").write_text(json.dumps({
        "text_config": {"hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
                        "num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 152064},
        "vision_config": {"depth": 32, "hidden_size": 1280, "intermediate_size": 3420, "out_hidden_size": 3584,
                          "fullatt_block_indexes": [7, 15, 23, 31]}}))
    two = tmp_path / "2b"
    two.mkdir()
    (two / "config.json").write_text(json.dumps({
        "text_config": {"hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 28,
                        "num_attention_heads": 12, "num_key_value_heads": 2, "vocab_size": 151936},
        "vision_config": {"depth": 32, "embed_dim": 1280, "hidden_size": 1536, "mlp_ratio": 4}}))
    patches = (924 // 14) * (1288 // 14)  # an A4 page at 1288 px, 1,518 image tokens
    a = compute_ceiling(str(seven), 1518 + 84, 1000, patches, 773)
    b = compute_ceiling(str(two), 1518 + 84, 1000, patches, 773)
    assert 16 <= a["ceiling_pages_per_s"] <= 19 and 34 <= b["ceiling_pages_per_s"] <= 40
    assert a["text_share"] > 0.75 and b["text_share"] < 0.5  # the 2B layout's vision tower dominates

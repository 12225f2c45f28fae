"""bench/gpu/ cannot run here (no GPU), but it must not rot: throughput.py's dry
run drives all three modes through the vLLM stand-in (tests/fake_vllm.py) and the
real pipeline, and plot.py draws its JSON."""

import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]


def dry_run(tmp_path, *argv) -> dict:
    """throughput.py on the CPU (the vLLM stand-in), its JSON report."""
    report = tmp_path / "tp.json"
    subprocess.run([sys.executable, str(ROOT / "bench/gpu/throughput.py"), "--fake", *argv, "--json", str(report)],
                   check=True, capture_output=True, text=True, timeout=300)
    return json.loads(report.read_text())


def test_throughput_dry_run_and_plot(tmp_path):
    r = dry_run(tmp_path, "--pages", "24", "--max-num-seqs", "4", "--chunk", "8", "--render-workers", "1",
                "--modes", "a,c,b,a0", "--b-variants", "queue_pages=2", "--variant", "seqs8=--max-num-seqs 8 --admit-pages 2",
                "--variant", "engines2=--engines 2", "--variant", "same=", "--warmup", "8")
    assert r["pages"] == 24
    assert r["warmup"]["requests"] == 8  # off the clock, before every mode: the work below is unchanged
    modes = ("a_vllm_alone", "c_batch_at_a_time", "b_batchocr", "b_queue_pages_2", "a0_vllm_defaults", "b_seqs8",
             "b_engines2", "b_same")
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
    # admission: the preset's (qwen2.5-vl's 16, at most an eighth of 4 sequences: 1), a variant's own
    assert r["b_batchocr"]["admit_pages"] == 1 and r["b_seqs8"]["admit_pages"] == 2
    # two engine processes, the documents split between them, every page once
    assert r["b_engines2"]["engines"] == 2 and sorted(e["rows"] for e in r["b_engines2"]["per_engine"]) == [8, 16]
    assert r["b_engines2"]["rows"] == 24 and len(r["b_engines2"]["timeline"]) == 24
    assert all(0 <= t <= r["b_engines2"]["wall_s"] + 0.01 for t in r["b_engines2"]["timeline"])
    for key in ("ratio_b_batchocr/a_vllm_alone", "ratio_b_batchocr/c_batch_at_a_time",
                "ratio_b_batchocr/a0_vllm_defaults", "ratio_b_engines2/b_batchocr"):
        assert r[key] > 0, key
    # the control: b's own engine arguments in a child, and each variant against it as well as against b
    assert r["b_same"]["llm_args"] == r["llm_args"] and r["b_same"]["child_args"] == ""
    assert r["ratio_b_seqs8/b_same"] > 0 and r["ratio_b_same/b_batchocr"] > 0
    assert not any(k.startswith("ratio_b_same/b_same") or k.startswith("ratio_b_batchocr/b_same") for k in r)
    png = tmp_path / "tp.png"
    subprocess.run([sys.executable, str(ROOT / "bench/gpu/plot.py"), str(tmp_path / "tp.json"), str(png)],
                   check=True, timeout=120)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_b_alone_warms_up_its_pipeline_in_every_process(tmp_path):
    # b against a variant: each process runs batchocr's pipeline on the first documents off the clock (the
    # first process on a machine pays the cold compiles the second skips), and the timed work is unchanged
    r = dry_run(tmp_path, "--pages", "32", "--per-doc", "8", "--max-num-seqs", "4", "--chunk", "8",
                "--render-workers", "1", "--modes", "b", "--variant", "same=", "--warmup", "10")
    for warm in (r["warmup"], r["b_same"]["warmup"]):
        assert warm["pages"] == 16 and warm["requests"] > 0  # the two 8-page documents that hold 10 pages
    for mode in ("b_batchocr", "b_same"):
        assert r[mode]["rows"] == 32 and r[mode]["work"]["pages"] == 32 and r[mode]["work"]["attempts"] == {"1": 32}
    assert r["equal_work"]["equal"]


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


def test_throughput_document_mode_dry_run(tmp_path):
    # Document mode at equal work: documents of 8, 12 and 16 pages, a and c send batchocr's groups
    # (8 | 12 | 8+8), a request a group with its pages' images and lengths; b groups them itself.
    # --ngram off (a variant, its own engine) gives b's requests no n-gram arguments. KV: the
    # layout's config gives R-SWA's window and the bytes a token.
    sys.path.insert(0, str(ROOT / "bench/gpu"))
    from make_models import UNLIMITED_OCR_CONFIG

    model = tmp_path / "uocr"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(UNLIMITED_OCR_CONFIG))
    r = dry_run(tmp_path, "--model", str(model), "--pages", "36", "--per-doc", "8,12,16", "--mode", "document",
                "--preset", "unlimited-ocr", "--max-num-seqs", "4", "--chunk", "2", "--render-workers", "1",
                "--modes", "a,c,b", "--variant", "nongram=--ngram off", "--variant", "inst2=--instances 2",
                "--variant", "page=--mode page")
    assert r["pages"] == 36 and r["requests"] == 4
    for mode in ("a_vllm_alone", "c_batch_at_a_time", "b_batchocr", "b_nongram", "b_inst2"):
        work = r[mode]["work"]
        assert work["requests"] == 4 and work["pages"] == 36 and work["client_tokens"] == r["output_tokens_total"]
        assert sum(work["finish_reasons"].values()) == 36, mode  # a row's reason a page, a's too
    # page mode against them (uocr-waves' form): the same pages and output tokens are equal work; the
    # prompts and requests differ by design (base-mode images, a group a request), compared within a mode
    assert r["b_page"]["mode"] == "page" and r["b_batchocr"]["mode"] == "document"
    assert r["b_page"]["work"]["pages"] == 36 and r["b_page"]["work"]["client_tokens"] == r["output_tokens_total"]
    requests = r["equal_work"]["requests"]
    assert r["equal_work"]["equal"] and requests.pop("b_page") == 36 and set(requests.values()) == {4}
    prompts = r["equal_work"]["prompt_tokens"]
    assert prompts.pop("b_page") > prompts["b_batchocr"] and len(set(prompts.values())) == 1
    assert r["b_batchocr"]["extra_args"]["ngram_size"] == 35 and r["b_batchocr"]["extra_args"]["window_size"] == 1024
    assert not (r["b_nongram"]["extra_args"] or {}).get("ngram_size")
    # engines.vllm.instances 2: two engines in b's one process, each half of the GPU's memory, every page once
    assert r["b_inst2"]["instances"] == 2 and r["b_inst2"]["rows"] == 36 and len(r["b_inst2"]["timeline"]) == 36
    assert r["b_inst2"]["llm_args"]["gpu_memory_utilization"] == 0.45 and r["ratio_b_inst2/b_batchocr"] > 0
    # the stand-in's prompt: 20 + 273 a page of a group; KV held: the prefix's blocks, R-SWA's 128, one more
    kv = r["kv"]
    assert kv["mean_prompt_tokens"] == (4 * 20 + 36 * 273) / 4 and kv["kv_bytes_per_token"] == 61_440
    assert kv["rswa_window"] == 128 and kv["mean_tokens_held_per_request"] > kv["mean_prompt_tokens"] + 128


def test_doc_counts_and_kv_accounting(tmp_path):
    sys.path.insert(0, str(ROOT / "bench/gpu"))
    from make_models import UNLIMITED_OCR_CONFIG
    from throughput import doc_counts, kv_accounting

    assert doc_counts(30, [8, 12, 16]) == [8, 12, 10] and doc_counts(16, [8]) == [8, 8]
    model = tmp_path / "uocr"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(UNLIMITED_OCR_CONFIG))

    class Cache:
        num_gpu_blocks, block_size = 100_000, 16

    llm = type("LLM", (), {"llm_engine": type("E", (), {"vllm_config": type("V", (), {"cache_config": Cache})})})
    kv = kv_accounting(llm, str(model), [907, 907], [1000, 50], 512)
    assert kv["kv_bytes_per_token"] == 61_440 and kv["kv_tokens"] == 1_600_000 and kv["rswa_window"] == 128
    # R-SWA: the prefix's 57 blocks, the window's 8 (or 4 for 50 tokens), one being filled
    assert kv["mean_tokens_held_per_request"] == ((57 + 8 + 1) + (57 + 4 + 1)) * 16 / 2
    assert kv["max_num_seqs_by_kv"] == 1_600_000 // 1024


def test_a_profile_s_python_functions_are_summed_by_their_own_time(tmp_path):
    """--profile-stack's summary: a Python function's own time excludes what it called (functions
    and ops), per thread; two threads do not nest into each other."""
    import gzip

    sys.path.insert(0, str(ROOT / "bench/gpu"))
    from throughput import trace_summary

    def span(name, cat, ts, dur, tid=1):
        return {"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "pid": 7, "tid": tid}

    events = [span("step", "python_function", 0, 1000), span("schedule", "python_function", 100, 300),
              span("aten::copy_", "cpu_op", 150, 100), span("apply", "python_function", 500, 400),
              span("banned", "python_function", 550, 50), span("banned", "python_function", 700, 50),
              span("<built-in method sum of Tensor object at 0x7fb3dca44500>", "python_function", 800, 40),
              span("<built-in method sum of Tensor object at 0x7fb3dca44aa0>", "python_function", 860, 20),
              span("step", "python_function", 0, 500, tid=2),  # another thread at the same instants
              span("kernel_x", "kernel", 200, 600, tid=9)]
    trace = tmp_path / "t.pt.trace.json.gz"
    with gzip.open(trace, "wt") as f:
        json.dump({"traceEvents": events}, f)
    got = trace_summary(trace)
    own = {name: (self_ms, total_ms, calls) for name, self_ms, total_ms, calls in got["python_by_self_ms"]}
    assert own == {"step": (0.8, 1.5, 2), "schedule": (0.2, 0.3, 1), "apply": (0.24, 0.4, 1),
                   "banned": (0.1, 0.1, 2), "<built-in method sum of Tensor object>": (0.06, 0.06, 2)}
    assert [row[0] for row in got["python_by_total_ms"]][:2] == ["step", "apply"]


def test_a_profile_is_broken_down_step_by_step(tmp_path):
    """The per-step view of a trace: each kernel in the step that launched it (the sampler's,
    launched after vLLM's step annotation closes, in that step too; through the runtime API or
    the driver's, as cuBLAS's nvjet and Triton launch theirs), steps grouped by how many
    requests they prefill, the kernels' classes and the traced phases, and what one page's prefill
    adds to a decode step, kernel by kernel."""
    import gzip

    sys.path.insert(0, str(ROOT / "bench/gpu"))
    from throughput import trace_summary

    events, corr = [], iter(range(1, 10**6))

    def span(name, cat, ts, dur, **args):
        events.append({"ph": "X", "name": name, "cat": cat, "ts": ts, "dur": dur, "pid": 7, "tid": 1, "args": args})

    def kernel(name, launch_ts, start, dur):
        c = next(corr)
        if name.startswith(("nvjet", "triton")):  # cuBLAS's Hopper kernels and Triton's: the driver API
            span("cuLaunchKernelEx", "cuda_driver", launch_ts, 5, correlation=c)
        else:
            span("cudaLaunchKernel", "cuda_runtime", launch_ts, 5, correlation=c)
        events.append({"ph": "X", "name": name, "cat": "kernel", "ts": start, "dur": dur, "pid": 0, "tid": 7,
                       "args": {"correlation": c}})

    t = 0
    for n in (0, 1, 0, 1, 0):  # decode, one page's prefill, ... (us)
        wall = 100_000 if n else 16_000
        span(f"execute_context_{n}({1514 * n})_generation_{256 - n}({256 - n})", "user_annotation", t, wall - 2_000)
        span("execute_model", "python_function", t, wall - 2_000)
        if n:
            span("execute_mm_encoder", "python_function", t + 100, 20_000)
            span("forward", "python_function", t + 150, 1_000)  # the vision tower's own forward: the encoder's
            kernel("nvjet_vit_gemm", t + 200, t + 300, 15_000)
            kernel("flash_fwd_varlen", t + 10_000, t + 15_000, 4_000)
        span("run_fullgraph", "python_function", t + 25_000 * n + 10, 1_000)
        kernel("cutlass_80_tensorop_bf16_s1681gemm", t + 25_000 * n + 20, t + 25_000 * n + 100, 8_000 + 30_000 * n)
        kernel("flash_fwd_splitkv", t + 25_000 * n + 30, t + 25_000 * n + 9_000, 5_000)
        span("sample_tokens", "python_function", t + wall - 1_500, 1_000)  # after the annotation: still this step
        kernel("triton_sample", t + wall - 1_400, t + wall - 1_000, 500)
        t += wall
    trace = tmp_path / "t.pt.trace.json.gz"
    with gzip.open(trace, "wt") as f:
        json.dump({"traceEvents": events}, f)
    steps = trace_summary(trace)["steps"]
    decode, one = steps["0"], steps["1"]
    assert decode["steps"] == 2 and one["steps"] == 2  # the last step has no wall: left out
    assert decode["wall_ms"] == 16.0 and one["wall_ms"] == 100.0 and one["prefill_tokens"] == 1514
    assert decode["kernel_ms"] == 13.5 and one["kernel_ms"] == 62.5 and one["kernels"] == 5
    assert one["class_ms"] == {"attention": 9.0, "gemm": 53.0, "triton": 0.5, "other": 0.0}
    assert one["phase_ms"] == {"encoder": 19.0, "embeddings": 0.0, "sample": 0.5, "forward": 43.0, "other": 0.0}
    assert decode["phase_ms"]["forward"] == 13.0 and decode["gpu_share_of_wall"] == round(13.5 / 16, 3)
    assert steps["one_page_adds_ms"][:3] == [["cutlass_80_tensorop_bf16_s1681gemm", 30.0], ["nvjet_vit_gemm", 15.0],
                                             ["flash_fwd_varlen", 4.0]]


def test_profile_traces_every_engine_b_builds(tmp_path):
    """--profile with --instances 2: each of b's engines gets vLLM's profiler_config and is started
    (it profiled nothing before: the profiler went only to an LLM that instances never build)."""
    r = dry_run(tmp_path, "--pages", "16", "--max-num-seqs", "4", "--chunk", "8", "--render-workers", "1",
                "--modes", "b", "--instances", "2", "--profile", "2,3")
    assert r["b_batchocr"]["rows"] == 16 and r["b_batchocr"]["instances"] == 2
    traces = r["profile_summary"]
    assert len(traces) == 2 and len({t["file"] for t in traces}) == 2
    assert all(t["ms_by_category"] == {"cpu_op": 1.0} for t in traces)


def _processes(tmp_path: Path, *args: str) -> dict:
    """bench/gpu/processes.py --fake ARGS, its work in tmp_path/w and its JSON in tmp_path/p.json
    (each run's log beside it): the report it wrote."""
    proc = subprocess.run([sys.executable, str(ROOT / "bench/gpu/processes.py"), "--fake", *args,
                           "--work", str(tmp_path / "w"), "--json", str(tmp_path / "p.json")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads((tmp_path / "p.json").read_text())


def test_processes_bench_dry_run_records_equal_work_and_the_ratios(tmp_path):
    """bench/gpu/processes.py on the CPU (the vLLM stand-in): `batchocr run --processes 2`
    with kv_cache_gib 8 (2@8: the parts start at once) against 1 over the same pages, every
    page exactly --max-tokens tokens, one attempt."""
    work = tmp_path / "w"
    report = _processes(tmp_path, "--pages", "32", "--per-doc", "8", "--max-tokens", "12", "--processes", "1,2@8")
    one, two = report["runs"]["1"], report["runs"]["2@8"]
    assert one["rc"] == two["rc"] == 0, (one["stderr_tail"], two["stderr_tail"])
    assert report["equal_work"]["equal"] and one["rows"] == two["rows"] == one["unique_pages"] == 32
    assert one["output_tokens"] == two["output_tokens"] == 32 * 12 and one["attempts"] == {"1": 32}
    assert "kv_cache_gib" not in (work / "job-1.yaml").read_text()
    assert "kv_cache_gib: 8.0" in (work / "job-2@8.yaml").read_text()
    # engines.vllm.orient as the runs had it (on where the classifier is installed), and no page turned
    from batchocr import upright

    assert one["orient"] == two["orient"] == [upright.model_path() is not None]
    assert one["turned_pages"] == two["turned_pages"] == 0
    assert len(two["runs"]) == 2 and {r["accelerator"]["count"] for r in two["runs"]} == {0.5}
    assert report["ratio_2@8/1"] == round(one["wall_s"] / two["wall_s"], 3)
    assert report["steady_ratio_2@8/1"] == round(two["steady_pages_per_s"] / one["steady_pages_per_s"], 3)
    # two parts' processes are counted: more than one's. Not by a fixed factor: the sampler reads RSS once
    # a second, and these runs last ~2 s (1.2x failed once in a fresh clone's suite under load: 1.85 vs 1.57 GB)
    assert one["host_rss_peak_gb"] > 0.05 and two["host_rss_peak_gb"] > one["host_rss_peak_gb"]
    assert 0 < one["first_row_s"] < one["wall_s"] and 0 < two["first_row_s"] < two["wall_s"]
    # each run as a fresh pod: caches of its own under the work folder (a warm compile cache is a faster start)
    assert one["caches"] == str(work / "cache-1") and two["caches"] == str(work / "cache-2@8")
    # each part's first row (two parts, two run ids), and each run's whole log beside the JSON
    assert len(one["first_row_s_by_part"]) == 1 and len(two["first_row_s_by_part"]) == 2
    assert min(two["first_row_s_by_part"].values()) == two["first_row_s"]
    # and its last row and output tokens: the parts' ends apart, and the work each did
    assert two["last_row_s_by_part"].keys() == two["first_row_s_by_part"].keys()
    assert max(two["last_row_s_by_part"].values()) == two["last_row_s"]
    assert sum(two["output_tokens_by_part"].values()) == two["output_tokens"] == 32 * 12
    # and over time, 10 s a bin from the command's start: every token once, the last bin the last row's
    assert sum(two["output_tokens_by_10s"]) == two["output_tokens"] and two["output_tokens_by_10s"][-1] > 0
    last = two["last_row_s"]  # rounded to 0.01 s: the bin of a last row at 29.996 s is 2, not 3
    assert len(two["output_tokens_by_10s"]) - 1 in (int(last // 10), int((last - 0.01) // 10))
    assert "batchocr: done" in (tmp_path / "p-2@8.log").read_text()
    # issue 53's measure: output tokens over the span from the first page handed to an engine to the last row
    for run in (one, two):
        # (first_row_s and first_request_s are rounded to 0.1 s, last_row_s to 0.01 s)
        assert 0 < run["first_request_s"] <= run["last_row_s"] < run["wall_s"] and run["first_row_s"] <= run["last_row_s"] + 0.05
        assert run["engine_span_s"] == round(run["last_row_s"] - run["first_request_s"], 2)
        assert run["engine_span_output_tokens_per_s"] == round(32 * 12 / (run["last_row_s"] - run["first_request_s"]), 1)


def test_processes_bench_seeded_caches_start_later_runs_from_the_first_run_s(tmp_path):
    """--caches seeded: one cache folder (as a pod's $HOME/.cache); the first run starts it empty,
    each later run from a copy of what the first left, not from what the run before it added.
    A run named twice gets a key of its own."""
    sys.path.insert(0, str(ROOT / "bench" / "gpu"))
    from processes import caches_of

    seed, root = tmp_path / "seed", tmp_path / "cache"
    (seed / "vllm" / "torch_compile_cache").mkdir(parents=True)
    (seed / "vllm" / "torch_compile_cache" / "graph").write_text("compiled")
    (root / "triton").mkdir(parents=True)
    (root / "triton" / "added-by-the-run-before").write_text("x")
    env = caches_of(root, seed)
    assert (root / "vllm" / "torch_compile_cache" / "graph").read_text() == "compiled"
    assert not (root / "triton" / "added-by-the-run-before").exists()
    assert env == {"XDG_CACHE_HOME": str(root), "TRITON_CACHE_DIR": str(root / "triton"),
                   "TORCHINDUCTOR_CACHE_DIR": str(root / "inductor")}
    assert set(caches_of(tmp_path / "empty")) == set(env)  # no seed: the same folders, empty
    assert not [f for f in (tmp_path / "empty").rglob("*") if f.is_file()]

    work = tmp_path / "w"
    report = _processes(tmp_path, "--pages", "4", "--per-doc", "4", "--max-tokens", "8", "--processes", "1,1",
                        "--caches", "seeded")
    assert list(report["runs"]) == ["1", "1#2"] and report["equal_work"]["equal"]
    assert [r["caches"] for r in report["runs"].values()] == ["cold (the seed)", "seeded from 1"]
    assert "seed_mb" in report["runs"]["1"] and (work / "cache-seed").is_dir() and "ratio_1#2/1" in report


def test_processes_bench_says_what_a_build_added_beyond_the_compile_cache(tmp_path):
    """cache_gained: the files a run's build wrote into its cache root that the compile cache it was
    seeded from did not hold (all of them where there was no seed), by compile hash under vllm/ and by
    first folder elsewhere, the largest first and past `most` summed."""
    sys.path.insert(0, str(ROOT / "bench" / "gpu"))
    from processes import cache_gained

    seed, root = tmp_path / "compile-cache", tmp_path / "cache"
    for base in (seed, root):  # what the run copied in
        (base / "triton" / "K1").mkdir(parents=True)
        (base / "triton" / "K1" / "k.cubin").write_bytes(b"x" * 10)
    (root / "triton" / "K2").mkdir(parents=True)
    (root / "triton" / "K2" / "k.cubin").write_bytes(b"y" * 2**20)  # compiled during the build
    graphs = root / "vllm" / "torch_compile_cache" / "71c0135d91" / "rank_0_0"
    graphs.mkdir(parents=True)
    (graphs / "graph").write_text("g")
    (root / "vllm" / "modelinfos.json").write_text("{}")
    gained = cache_gained(root, seed)
    assert gained == {"triton": {"files": 1, "mb": 1.0},
                      "vllm/torch_compile_cache/71c0135d91": {"files": 1, "mb": 0.0},
                      "vllm": {"files": 1, "mb": 0.0}}
    assert cache_gained(root, None)["triton"]["files"] == 2  # no seed: all of it
    assert cache_gained(root, seed, most=1) == {"triton": {"files": 1, "mb": 1.0},
                                                "(the rest)": {"files": 2, "mb": 0.0}}


def test_processes_bench_warm_root_compares_the_compiled_path_with_the_runs_own(tmp_path):
    """--caches warm --warm-root own,warm: the first run from a copy of the compile cache without
    its recorded root (into the run's own root, as before batchocr recorded it), the second at the
    path `batchocr warm` compiled in (batchocr's way), under WORK/tmp and made again for each run;
    each run's cache_gained against the compile cache; a value other than own or warm is refused."""
    work = tmp_path / "w"
    report = _processes(tmp_path, "--pages", "4", "--per-doc", "4", "--max-tokens", "8", "--processes", "1,1,1",
                        "--caches", "warm", "--no-cold", "--warm-pages", "4", "--warm-root", "own,warm")
    at = report["warm"]["root"]
    assert report["warm"]["rc"] == 0 and Path(at).parent == work / "tmp" and report["equal_work"]["equal"], report["warm"]
    assert [r["caches"] for r in report["runs"].values()] == [
        "compile_cache (batchocr warm) copied into the run's own root",
        f"compile_cache (batchocr warm) at the path it was compiled in, {at}",
        f"compile_cache (batchocr warm) at the path it was compiled in, {at}"]
    assert "processes: 1\n" in (work / "job-warm.yaml").read_text()  # built as the runs' engines are
    assert "root" not in json.loads((work / "compile-cache-own" / "batchocr-compile-cache.json").read_text())
    assert json.loads((work / "compile-cache" / "batchocr-compile-cache.json").read_text())["root"] == at
    # The stand-in's log: the first run's graph not at the path it was compiled at, the others' there,
    # each of the two a fresh copy (the third did not find the second's left in place)
    assert "copied into" in report["runs"]["1"]["stderr_tail"]
    assert f"copied to {at}, where it was compiled" in report["runs"]["1#3"]["stderr_tail"]
    assert all(isinstance(r["cache_gained"], dict) for r in report["runs"].values())
    bad = subprocess.run([sys.executable, str(ROOT / "bench/gpu/processes.py"), "--fake", "--warm-root", "own,there"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--warm-root" in bad.stderr


def test_processes_bench_lognormal_lengths_reach_every_part(tmp_path):
    """--lengths B: each page generates throughput.py's lognormal length for its (doc_id,
    page), in the parts' own processes too (the sitecustomize on their path)."""
    sys.path.insert(0, str(ROOT / "bench" / "gpu"))
    from throughput import length_of

    work = tmp_path / "w"
    run = _processes(tmp_path, "--pages", "8", "--per-doc", "2", "--lengths", "B", "--processes", "2")["runs"]["2"]
    assert run["rc"] == 0 and run["rows"] == 8 and len(run["runs"]) == 2, run["stderr_tail"]
    rows = pq.read_table(work / "out-2" / "pages", partitioning=None).to_pylist()
    want = {(r["doc_id"], r["page_index"]): length_of(f"{r['doc_id']}/{r['page_index']}", "B", 0) for r in rows}
    assert {(r["doc_id"], r["page_index"]): r["output_tokens"] for r in rows} == want and len(set(want.values())) > 4


def test_throughput_over_a_processes_folder_does_the_processes_runs_work(tmp_path):
    """throughput.py --src: vLLM alone (mode c, two calls) over processes.py's documents generates
    each page's length as processes.py keys it (doc_id, page), so the two runs do equal work: the
    same rows, prompt and output tokens, one attempt each. By file name (without --src) they differ."""
    run = _processes(tmp_path, "--pages", "16", "--per-doc", "4", "--lengths", "B", "--processes", "1")["runs"]["1"]
    assert run["rc"] == 0 and run["rows"] == 16, run["stderr_tail"]
    argv = ("--pages", "16", "--per-doc", "4", "--lengths", "B", "--modes", "c", "--chunk", "8",
            "--max-num-seqs", "4", "--render-workers", "1", "--preset", "unlimited-ocr")
    (tmp_path / "own").mkdir()
    alone = dry_run(tmp_path, *argv, "--src", str(tmp_path / "w" / "src"))
    work = alone["c_batch_at_a_time"]["work"]
    assert work["pages"] == 16 and work["attempts"] == {"1": 16}
    assert alone["equal_work"]["tokens"]["c_batch_at_a_time"] == run["output_tokens"] == alone["output_tokens_total"]
    assert alone["equal_work"]["prompt_tokens"]["c_batch_at_a_time"] == run["prompt_tokens"]
    assert dry_run(tmp_path / "own", *argv)["output_tokens_total"] != run["output_tokens"]
    assert sorted(p.name for p in (tmp_path / "w" / "src").iterdir()) == [f"doc{d:04d}.pdf" for d in range(4)]


def test_processes_bench_document_mode(tmp_path):
    """--mode document: a request a document of 4 (--group-pages 4), --max-tokens a page; the
    split's fallback off (random weights write no <page>), so every row is an error row."""
    work = tmp_path / "w"
    run = _processes(tmp_path, "--pages", "16", "--per-doc", "4", "--max-tokens", "12", "--processes", "2",
                     "--mode", "document")["runs"]["2"]
    assert run["rc"] == 0 and run["rows"] == 16 and run["output_tokens"] == 16 * 12, run["stderr_tail"]
    rows = pq.read_table(work / "out-2" / "pages", partitioning=None).to_pylist()
    assert {r["mode"] for r in rows} == {"document"} and run["finish_reasons"] == ["error"]


def test_steps_splits_a_steady_window_into_prefill_and_decode_steps(tmp_path):
    """bench/gpu/steps.py on a timeline whose answer is known: 10 admissions of 16 pages, each a
    100 ms prefill step then 19 decode steps of 10 ms, 200 pages finished; a mode on two engines
    is not split."""
    import gzip

    steps, t = [[999.99, 240, 0, 0.1, 240, 1]], 1000.0  # before the window: not counted
    for _ in range(10):
        steps.append([t, 256, 0, 0.1, 240, 0])  # 16 admitted: the running count jumps
        t += 0.100
        for j in range(1, 20):  # then pages finish as the batch decodes
            steps.append([t, 256 - (j * 16) // 19, 0, 0.1, 256, 1])
            t += 0.010
    steps.append([t, 240, 0, 0.1, 240, 0])  # the last step's end
    window = {"window_start_abs": 1000.0, "window_end_abs": t, "pages": 200}
    report = {"engine_steps": steps, "b_batchocr": {"steady": window, "work": {"attempts": {"1": 256}}},
              "equal_work": {"equal": True, "pages": {"b_batchocr": 256}, "tokens": {"b_batchocr": 9000},
                             "prompt_tokens": {"b_batchocr": 40000}},
              "b_inst2": {"instances": 2, "steady": window}, "a_vllm_alone": {"steady": None}}
    path = tmp_path / "run.json.gz"
    with gzip.open(path, "wt") as f:
        json.dump(report, f)
    out = tmp_path / "steps.json"
    done = subprocess.run([sys.executable, str(ROOT / "bench/gpu/steps.py"), str(path), "--json", str(out)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    got = json.loads(out.read_text())
    b = got["b_batchocr"]
    assert b["steps"] == 200 and b["prefill_steps"] == 10 and b["decode_steps"] == 190
    assert b["prefill_s"] == 1.0 and b["decode_s"] == 1.9 and b["decode_median_ms"] == 10.0
    assert b["prefill_ms_per_page"] == 5.0 and b["decode_ms_per_page"] == 9.5 and b["ms_per_page"] == 14.5
    # the running count's jumps: the first admission's is from a step before the window
    assert b["groups"] == 9 and b["pages_per_group"] == 22.2 and b["prefill_share"] == 0.345
    assert "interleave" in got["b_inst2"]["error"] and "a_vllm_alone" not in got  # no steady window: not a mode
    assert "| b_batchocr | 200 | 10, 1.0 s (34%) | 5.0 |" in done.stdout
    # the work that makes the modes comparable, as the run recorded it
    assert ('equal work: True {"b_batchocr": {"pages": 256, "prompt_tokens": 40000, "output_tokens": 9000, '
            '"attempts": {"1": 256}}') in done.stdout
    bad = subprocess.run([sys.executable, str(ROOT / "bench/gpu/steps.py"), str(tmp_path / "none.json")],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "cannot read" in bad.stderr and "Traceback" not in bad.stderr


def test_a_py_spy_record_is_summed_by_thread_and_by_the_main_threads_functions(tmp_path):
    """bench/gpu/pyspy.py reads py-spy's raw format (`thread (TID): NAME;frame (file:line);... COUNT`, as
    py-spy 0.4.3 wrote it here): shares of the main thread's samples, self and inclusive; other
    threads counted apart."""
    sys.path.insert(0, str(ROOT / "bench" / "gpu"))
    from pyspy import PySpy, summary

    raw = tmp_path / "raw.txt"
    site = "/tmp/site/vllm/v1"
    raw.write_text(
        f"thread (11): MainThread;run_busy_loop ({site}/engine/core.py:900);step ({site}/engine/core.py:617);"
        f"schedule ({site}/core/sched/scheduler.py:425) 30\n"
        f"thread (11): MainThread;run_busy_loop ({site}/engine/core.py:900);step ({site}/engine/core.py:617);"
        f"result (/usr/lib/python3.12/concurrent/futures/_base.py:440) 50\n"
        f"thread (11): MainThread;run_busy_loop ({site}/engine/core.py:900) 20\n"
        f"thread (12): EngineCoreOutputQueueThread;process_output_sockets ({site}/engine/core.py:1700) 90\n"
        "a line that is not a sample\n")
    s = summary(raw)
    assert s["samples"] == 190 and s["by_thread"] == {"MainThread": 100, "EngineCoreOutputQueueThread": 90}
    assert s["main_self_pct"] == [("_base.py:result", 50.0), ("vllm/v1/core/sched/scheduler.py:schedule", 30.0),
                                  ("vllm/v1/engine/core.py:run_busy_loop", 20.0)]
    inclusive = dict(s["main_inclusive_pct"])
    assert inclusive["vllm/v1/engine/core.py:run_busy_loop"] == 100.0 and inclusive["vllm/v1/engine/core.py:step"] == 80.0
    # a run that ends before the delay samples nothing, and says so
    spy = PySpy(delay_s=30, seconds=5, folder=tmp_path)
    spy.start()
    assert spy.result()["errors"] == ["the run ended before 30 s: nothing sampled"]


def test_every_gpu_bench_script_imports_batchocr_names_that_exist():
    """Each `from batchocr... import NAME` of bench/gpu/*.py names a module of this tree and, in it,
    a name it defines, a submodule, or one its module-level __getattr__ serves (names built from
    vLLM, absent here). check_encoder_batch.py and check_vit_pad.py imported modules the layout's
    rebuild had moved, and only the GPU would have said so."""
    import importlib
    import importlib.util

    sys.path.insert(0, str(ROOT / "bench" / "gpu"))
    from check_imports import batchocr_imports

    scripts = sorted((ROOT / "bench" / "gpu").glob("*.py"))
    assert len(scripts) > 10
    missing = []
    for script in scripts:
        for module, name in batchocr_imports(script):
            try:
                got = importlib.import_module(module)
            except ImportError as exc:
                missing.append(f"{script.name}: {module}: {exc}")
                continue
            if name and name not in vars(got) and "__getattr__" not in vars(got):
                try:
                    found = importlib.util.find_spec(f"{module}.{name}") is not None
                except ImportError:  # the module is not a package
                    found = False
                if not found:
                    missing.append(f"{script.name}: from {module} import {name}")
    assert not missing, missing


def test_stack_sampler_take_while_it_samples():
    """take() runs while the sampler thread still counts (mode c's record comes before the
    sampler stops): a key the sampler adds during take()'s pass must wait for it, not break it.
    The counter here yields its items slowly, so the sampler adds its new key (the main thread
    inside take) during the pass."""
    import collections
    import time

    sys.path.insert(0, str(ROOT / "bench/gpu"))
    from throughput import StackSampler

    class SlowCounter(collections.Counter):
        def items(self):
            for item in super().items():
                time.sleep(0.01)
                yield item

    stacks = StackSampler()
    stacks.counts = SlowCounter({f"k{i}": 20 - i for i in range(20)})
    stacks.start()
    stacks.running = True
    top = stacks.take()
    stacks.running = False
    assert list(top)[:3] == ["k0", "k1", "k2"] and len(top) == 15
    time.sleep(0.05)  # the sampler's count of the main thread inside take() lands after the pass
    assert sum(stacks.counts.values()) >= 1

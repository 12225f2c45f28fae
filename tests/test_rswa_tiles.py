"""engines.vllm.rswa_tiles: batchocr.engines.vllm.patches.rswa_tiles' rewrite of vLLM 0.26.0's Triton unified attention
(its file, Apache-2.0, kept in tests/data/vllm/ so that CI, which has no torch, Triton or vLLM,
checks the rewrite against the real source) and its plumbing. That the rewritten kernel gives
vLLM's output is shown by running both: bench/gpu/check_rswa_tiles.py (the CPU under Triton's
interpreter, and the GPU)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from batchocr.engines.vllm.patches import deepencoder, ngram_sampler, rswa_tiles, workerext
from batchocr.engines.vllm.presets import get_preset
from batchocr.engines.vllm import VLLMOptions
from batchocr.errors import ConfigError

KERNEL = Path(__file__).parent / "data" / "vllm" / "triton_unified_attention-0.26.0.py.txt"


def _kernel_loop(tree: ast.Module) -> ast.For:
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "kernel_unified_attention")
    (loop,) = [n for n in fn.body if isinstance(n, ast.For)]
    return fn, loop


def test_the_rewrite_puts_the_tile_loop_s_whole_body_under_the_r_swa_test():
    src = KERNEL.read_text()
    new = rswa_tiles.patch_source(src)
    fn, loop = _kernel_loop(ast.parse(new))
    old_fn, old_loop = _kernel_loop(ast.parse(src))
    (guard,) = loop.body  # one statement: the test, with everything the loop did inside it
    assert isinstance(guard, ast.If) and not guard.orelse
    assert "rswa_prefix" in ast.unparse(guard.test) and "rswa_first_key" in ast.unparse(guard.test)
    assert [ast.dump(n) for n in guard.body] == [ast.dump(n) for n in old_loop.body]
    # the prompt length and the window's first key are set before the loop, for R-SWA only
    setup = fn.body[fn.body.index(loop) - 1]
    assert isinstance(setup, ast.If) and ast.unparse(setup.test) == "USE_R_SWA"
    assert "rswa_prefix_lens_ptr + seq_idx" in ast.unparse(setup.body[0])
    # and nothing else in the file changed
    rest = lambda t: [ast.dump(n) for n in ast.parse(t).body if getattr(n, "name", "") != "kernel_unified_attention"]  # noqa: E731
    assert rest(new) == rest(src)
    others = [ast.dump(n) for n in fn.body if n is not loop and n is not setup]
    assert others == [ast.dump(n) for n in old_fn.body if n is not old_loop]


def test_a_kernel_that_moved_is_refused_not_half_patched():
    src = KERNEL.read_text()
    with pytest.raises(ValueError, match="not the one batchocr.engines.vllm.patches.rswa_tiles patches"):
        rswa_tiles.patch_source(src.replace("    for j in range(loop_lo, loop_hi):\n", "    for j in range(lo, hi):\n"))
    with pytest.raises(ValueError):
        rswa_tiles.patch_source(src.replace("USE_R_SWA: tl.constexpr", "USE_RSWA: tl.constexpr"))


def _launcher(src: str) -> ast.FunctionDef:
    return next(n for n in ast.parse(src).body if isinstance(n, ast.FunctionDef) and n.name == "unified_attention")


def test_a_prefill_s_launch_sizes_change_only_for_launches_with_a_prefill():
    """prefill_launch (BATCHOCR_PREFILL_TILES): after vLLM's launcher has chosen its query block and
    prefill tile, a launch whose longest query is more than one token takes at least ROWS rows,
    TILE keys and WARPS warps; the kernel, and the launcher's other lines, as before."""
    src = rswa_tiles.patch_source(KERNEL.read_text())
    new = rswa_tiles.prefill_launch(src, 64, 128, 8)
    old_body = [ast.unparse(n) for n in _launcher(src).body]
    body = [ast.unparse(n) for n in _launcher(new).body]
    added = [b for b in body if b not in old_body]
    assert added == ["if max_seqlen_q > 1:\n    BLOCK_M = max(BLOCK_M, 64)",
                     "if max_seqlen_q > 1:\n    TILE_SIZE_PREFILL = 128\n    launch_num_warps = 8"]
    assert [b for b in body if b not in added] == old_body
    # each after the line it overrides: BLOCK_Q derives from the new BLOCK_M; the tile before the clamp USE_TD needs
    assert body.index(added[0]) < body.index("BLOCK_Q = BLOCK_M // num_queries_per_kv")
    assert body.index("BLOCK_M = 16 if num_queries_per_kv <= 16 else triton.next_power_of_2(num_queries_per_kv)") \
        < body.index(added[0])
    assert body.index("if tuned_large_head:\n    TILE_SIZE_PREFILL = 128") < body.index(added[1]) \
        < next(i for i, b in enumerate(body) if b.startswith("if use_td:"))
    rest = lambda t: [ast.dump(n) for n in ast.parse(t).body if getattr(n, "name", "") != "unified_attention"]  # noqa: E731
    assert rest(new) == rest(src)
    assert rswa_tiles.prefill_launch(src, 64, 64).count("launch_num_warps =") == src.count("launch_num_warps =")
    with pytest.raises(ValueError, match="launcher is not the one"):
        rswa_tiles.prefill_launch(src.replace("    BLOCK_Q = BLOCK_M // num_queries_per_kv\n", "    BLOCK_Q = 1\n"),
                                  64, 64)


def test_the_prefill_switch_reads_powers_of_two():
    assert rswa_tiles.prefill_sizes({}) is None and rswa_tiles.prefill_sizes({"BATCHOCR_PREFILL_TILES": ""}) is None
    assert rswa_tiles.prefill_sizes({"BATCHOCR_PREFILL_TILES": "64,128,8"}) == (64, 128, 8)
    assert rswa_tiles.prefill_sizes({"BATCHOCR_PREFILL_TILES": " 32,64 "}) == (32, 64, None)
    for bad in ("64", "48,64", "64,x", "64,64,8,2", "0,64"):
        with pytest.raises(ValueError, match="ROWS,TILE"):
            rswa_tiles.prefill_sizes({"BATCHOCR_PREFILL_TILES": bad})


def test_tiles_read_are_the_prompt_s_and_the_window_s():
    # 1,000 keys, a 273-token prompt, the query at 999, window 128, tiles of 16: the prompt's
    # 18 tiles (0-17) and the window's, which starts at key 872 (tile 54): 54-62
    assert rswa_tiles.tiles_read(1000, 273, 999, 128, 16) == 18 + 9
    assert rswa_tiles.tiles_read(300, 273, 299, 128, 16) == 19  # all of them: the window reaches the prompt
    assert rswa_tiles.tiles_read(5000, 1092, 4999, 128, 16) == 69 + 9  # document mode's 4 pages


def test_rswa_tiles_names_one_extension_with_the_other_patches_asked(monkeypatch):
    p = get_preset("unlimited-ocr")

    def ext(**kw):
        return VLLMOptions(model="/m", preset="unlimited-ocr", **kw).llm_args(p)["worker_extension_cls"]

    assert ext(rswa_tiles=True) == "batchocr.engines.vllm.patches.rswa_tiles.RswaTilesEncoderExtension"  # the batched encoder: default
    assert ext(rswa_tiles=True, batch_encoder=False) == "batchocr.engines.vllm.patches.rswa_tiles.RswaTilesExtension"
    assert ext(rswa_tiles=True, ngram_bans="sampler") == "batchocr.engines.vllm.patches.rswa_tiles.RswaTilesEncoderSamplerExtension"
    assert ext(rswa_tiles=False) == deepencoder.EXTENSION
    calls = []
    monkeypatch.setattr(rswa_tiles, "install", lambda: calls.append("tiles"))
    monkeypatch.setattr(deepencoder, "install", lambda: calls.append("encoder"))
    monkeypatch.setattr(ngram_sampler, "install", lambda: calls.append("sampler"))
    for name, want in (("RswaTilesExtension", ["tiles"]), ("RswaTilesEncoderSamplerExtension",
                                                           ["tiles", "encoder", "sampler"])):
        calls.clear()
        module, attr = f"batchocr.engines.vllm.patches.rswa_tiles.{name}".rsplit(".", 1)  # as vLLM's resolve_obj_by_qualname splits it
        assert getattr(__import__(module, fromlist=[attr]), attr) is workerext.Extension
        assert calls == want
    with pytest.raises(AttributeError):
        rswa_tiles.NotAnExtension  # noqa: B018


def test_rswa_tiles_on_a_model_without_r_swa_is_a_config_error_naming_the_key():
    with pytest.raises(ConfigError, match=r"^engines\.vllm\.rswa_tiles: .*qwen2\.5-vl"):
        VLLMOptions(model="/m", preset="qwen2.5-vl", rswa_tiles=True)


def test_a_vllm_whose_kernel_moved_stops_the_run_naming_the_key_before_vllm_starts(tmp_path, monkeypatch):
    moved = tmp_path / "triton_unified_attention.py"
    moved.write_text(KERNEL.read_text().replace("    for j in range(loop_lo, loop_hi):\n", "    for j in range(lo, hi):\n"))
    rswa_tiles.check_source(KERNEL)  # vLLM 0.26.0's: fine
    with pytest.raises(ValueError):
        rswa_tiles.check_source(moved)
    monkeypatch.setattr(rswa_tiles, "kernel_file", lambda: moved)
    with pytest.raises(ConfigError, match=r"^engines\.vllm\.rswa_tiles: .*set it false"):
        VLLMOptions(model="/m", preset="unlimited-ocr", rswa_tiles=True).check_patches()
    VLLMOptions(model="/m", preset="unlimited-ocr").check_patches()  # not asked: not checked
    monkeypatch.setattr(rswa_tiles, "kernel_file", lambda: None)  # no vLLM with that module here: the worker's to say
    VLLMOptions(model="/m", preset="unlimited-ocr", rswa_tiles=True).check_patches()


def test_rswa_tiles_unset_is_the_preset_s_in_both_modes_and_only_with_the_kernel_it_rewrites(
        tmp_path, monkeypatch, caplog):
    """Unset: on for unlimited-ocr in both modes (each won on the H200 at equal work, docs/history/GPU.md:
    page mode in the seventh lease, document mode in the tenth). A vLLM whose kernel moved runs its own kernel
    with one warning, once a run: a default never stops a run; asked for, it is exit 2 (the test above)."""
    from batchocr.engines.vllm import options

    monkeypatch.setenv(options.WARNED_ENV, "")  # nothing said yet in this run
    p = get_preset("unlimited-ocr")

    def ext(**kw):
        return VLLMOptions(model="/m", preset="unlimited-ocr", **kw).llm_args(p).get("worker_extension_cls")

    monkeypatch.setattr(rswa_tiles, "kernel_file", lambda: KERNEL)  # vLLM 0.26.0's kernel
    assert ext() == "batchocr.engines.vllm.patches.rswa_tiles.RswaTilesEncoderExtension"
    assert ext(batch_encoder=False) == "batchocr.engines.vllm.patches.rswa_tiles.RswaTilesExtension"
    assert ext(mode="document") == "batchocr.engines.vllm.patches.rswa_tiles.RswaTilesEncoderExtension"
    assert ext(mode="document", rswa_tiles=False) == deepencoder.EXTENSION
    assert get_preset("deepseek-ocr").rswa_tiles is False and VLLMOptions(model="/m", preset="deepseek-ocr").llm_args(
        get_preset("deepseek-ocr")).get("worker_extension_cls") is None
    with caplog.at_level("WARNING", logger="batchocr.engines.vllm"):
        VLLMOptions(model="/m", preset="unlimited-ocr").check_patches()
    assert caplog.records == []
    moved = tmp_path / "triton_unified_attention.py"
    moved.write_text(KERNEL.read_text().replace("USE_R_SWA: tl.constexpr", "USE_RSWA: tl.constexpr"))
    monkeypatch.setattr(rswa_tiles, "kernel_file", lambda: moved)
    assert ext() == deepencoder.EXTENSION  # vLLM's own kernel, the batched encoder still
    with caplog.at_level("WARNING", logger="batchocr.engines.vllm"):
        VLLMOptions(model="/m", preset="unlimited-ocr").check_patches()  # no ConfigError
        VLLMOptions(model="/m", preset="unlimited-ocr", rswa_tiles=False).check_patches()  # off: no word
    (said,) = [r.getMessage() for r in caplog.records]
    assert said.startswith("engines.vllm.rswa_tiles: the preset's default is off for this vLLM (vLLM's unified "
                           "attention kernel is not the one") and "engines.vllm.rswa_tiles: false" in said
    caplog.clear()
    with caplog.at_level("WARNING", logger="batchocr.engines.vllm"):
        VLLMOptions(model="/m", preset="unlimited-ocr", mode="document").check_patches()  # its default too ...
    assert caplog.records == []  # ... said once a run (the engines of instances, the parts)
    monkeypatch.setenv(options.WARNED_ENV, "")
    with caplog.at_level("WARNING", logger="batchocr.engines.vllm"):
        VLLMOptions(model="/m", preset="unlimited-ocr", mode="document").check_patches()
    assert [r.getMessage().split(" (")[0] for r in caplog.records] == [
        "engines.vllm.rswa_tiles: the preset's default is off for this vLLM"]


def test_the_kernel_is_found_where_vllm_keeps_it(tmp_path):
    """kernel_file finds the module as the installed vLLM's package holds it (a package tree of vLLM's
    layout with the 0.26.0 kernel file, and its dist-info; in a process of its own, away from the
    stand-in vLLM other tests install)."""
    import subprocess
    import sys

    ops = tmp_path / "vllm" / "v1" / "attention" / "ops"
    ops.mkdir(parents=True)
    for d in (tmp_path / "vllm", ops.parents[1], ops.parent, ops):
        (d / "__init__.py").write_text("")
    (ops / "triton_unified_attention.py").write_text(KERNEL.read_text())
    (tmp_path / "vllm-0.26.0.dist-info").mkdir()
    (tmp_path / "vllm-0.26.0.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.26.0\n")
    code = "from batchocr.engines.vllm.patches import rswa_tiles; p = rswa_tiles.kernel_file(); rswa_tiles.check_source(); print(p)"
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": f"{tmp_path}:{root}", "PATH": "/usr/bin:/bin"}).stdout.strip()
    assert out == str(ops / "triton_unified_attention.py")
    (ops / "triton_unified_attention.py").unlink()  # a vLLM that moved the module: refused, not passed over
    fails = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           env={"PYTHONPATH": f"{tmp_path}:{root}", "PATH": "/usr/bin:/bin"})
    assert fails.returncode == 1 and "ValueError: this vLLM has no vllm.v1.attention.ops.triton_unified_attention" \
        in fails.stderr

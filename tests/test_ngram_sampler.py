"""batchocr.engines.vllm.patches.ngram_sampler bans on the GPU, in vLLM's V2 sampler, what batchocr.engines.vllm.patches.ngram.NGramBan
(vLLM's processor's bans) bans on the host. Its arithmetic is the same code for numpy and torch:
here on numpy, with vLLM's request state replaced by arrays of the same names."""

import os

import fake_vllm
import numpy as np
import pytest

from batchocr.engines.vllm.patches import ngram_sampler, workerext
from batchocr.engines.vllm.patches.ngram import NGramBan
from batchocr.engines.vllm.patches.ngram_sampler import MAX_WHITELIST, RequestBans, apply_bans, window_bans

VOCAB = 7  # few tokens: n-grams repeat often


def _right_aligned(seqs: list[list[int]], t: int, rng) -> np.ndarray:
    """Each row's last t tokens, the newest at t-1; rows shorter than t padded in front with
    tokens that must never count (as the prompt's are, in vLLM's all_token_ids)."""
    out = rng.integers(0, VOCAB, size=(len(seqs), t))
    for r, s in enumerate(seqs):
        tail = s[-t:]
        if tail:
            out[r, t - len(tail):] = tail
    return out


def _banned_sets(followers, banned) -> list[set[int]]:
    return [set(f[b].tolist()) for f, b in zip(followers, banned)]


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_window_bans_ban_what_ngramban_bans(n):
    rng = np.random.default_rng(n)
    seqs, windows, whitelists = [], [], []
    for _ in range(300):
        length = int(rng.integers(0, 60))
        loop = rng.random() < 0.3  # a looping row, as random weights write
        period = int(rng.integers(1, 6))
        base = rng.integers(0, VOCAB, size=period).tolist()
        seq = [base[i % period] for i in range(length)] if loop else rng.integers(0, VOCAB, size=length).tolist()
        seqs.append(seq)
        windows.append(int(rng.integers(max(1, n - 1), 40)))
        whitelists.append(sorted(set(rng.integers(0, VOCAB, size=int(rng.integers(0, 3))).tolist())))
    t = max(windows)
    wl = np.full((len(seqs), MAX_WHITELIST), -1)
    for r, w in enumerate(whitelists):
        wl[r, : len(w)] = w
    out = window_bans(_right_aligned(seqs, t, rng), np.array([len(s) for s in seqs]), n, np.array(windows), wl)
    got = _banned_sets(*out)
    want = [NGramBan(n, w, white).banned(s) for s, w, white in zip(seqs, windows, whitelists)]
    assert got == want
    assert sum(map(bool, want)) > 50  # the case is not empty


def test_window_bans_at_the_presets_sizes_on_a_looping_row():
    rng = np.random.default_rng(0)
    for n, window in ((35, 128), (35, 1024), (30, 90)):
        loop = rng.integers(0, 50_000, size=17).tolist()
        seqs = [(loop * 200)[:k] for k in (0, n - 1, n, window - 1, window, window + 3, 3 * window)]
        seqs.append(rng.integers(0, 50_000, size=2 * window).tolist())  # sound text: nothing banned
        out = window_bans(_right_aligned(seqs, window, rng), np.array([len(s) for s in seqs]), n,
                          np.full(len(seqs), window))
        want = [NGramBan(n, window).banned(s) for s in seqs]
        assert _banned_sets(*out) == want
        assert want[-1] == set() and want[-2] == {loop[(3 * window) % 17]}


def test_apply_bans_sets_each_banned_follower_to_minus_infinity_whatever_else_repeats():
    logits = np.zeros((2, 5))
    followers = np.array([[3, 3, 1], [2, 4, 2]])
    banned = np.array([[False, True, False], [True, False, False]])  # token 3 banned at s=1, not at s=0
    apply_bans(logits, followers, banned)
    assert np.isneginf(logits).tolist() == [[False, False, False, True, False], [False, False, True, False, False]]
    assert (logits[np.isfinite(logits)] == 0).all()


class Staged:
    """vLLM's UvaBackedTensor for the test: .np written by the host, .gpu what a step reads,
    refreshed by copy_to_uva()."""

    def __init__(self, size):
        self.np = np.zeros(size, dtype=np.int32)
        self.gpu = self.np.copy()

    def copy_to_uva(self):
        self.gpu = self.np.copy()


class Params:
    def __init__(self, **extra):
        self.extra_args = extra or None


class RequestStates:
    """The V2 runner's RequestState, as far as the bans read it."""

    def __init__(self, slots: int, max_len: int):
        self.all_token_ids = Staged((slots, max_len))
        self.prompt_len = Staged(slots)
        self.total_len = Staged(slots)

    def put(self, slot: int, prompt: list[int], output: list[int]):
        ids = prompt + output
        self.all_token_ids.np[slot, : len(ids)] = ids
        self.prompt_len.np[slot], self.total_len.np[slot] = len(prompt), len(ids)
        for t in (self.all_token_ids, self.prompt_len, self.total_len):
            t.copy_to_uva()


def test_request_bans_over_the_runners_state_ban_each_requests_ngrams_by_its_own_arguments():
    """Five slots, three in the batch in a shuffled order, with different n, windows and
    whitelists, one without n-gram arguments; greedy decoding of random logits for 200 steps
    with the bans: each step bans exactly what NGramBan bans for each request, and no output
    ever repeats an n-gram within its window."""
    rng = np.random.default_rng(3)
    bans = RequestBans(5, Staged)
    states = RequestStates(5, 400)
    asked = {4: dict(ngram_size=3, window_size=20, whitelist_token_ids=[2]),
             1: dict(ngram_size=2, window_size=9),
             2: {}}  # no bans
    outputs = {slot: [] for slot in asked}
    prompts = {slot: rng.integers(0, VOCAB, size=5 + slot).tolist() for slot in asked}
    for slot, extra in asked.items():
        bans.add_request(slot, Params(**extra))
    bans.apply_staged_writes()
    order = np.array([4, 1, 2])
    for _ in range(200):
        for slot in asked:
            states.put(slot, prompts[slot], outputs[slot])
        logits = rng.normal(size=(3, 12))  # 12 tokens: a key's followers in a window never ban them all
        logits[:, 0] += 2.5  # a favourite token, so that bans are needed
        bans.apply(logits, order.astype(np.int32), order, states)
        for row, slot in enumerate(order.tolist()):
            extra = asked[slot]
            want = NGramBan(extra["ngram_size"], extra["window_size"], extra.get("whitelist_token_ids")).banned(
                outputs[slot]) if extra else set()
            assert set(np.flatnonzero(np.isneginf(logits[row])).tolist()) == want
            outputs[slot].append(int(np.argmax(logits[row])))
    assert outputs[2].count(0) > 150  # unbanned: the favourite most of the time
    for slot in (4, 1):
        n, w = asked[slot]["ngram_size"], asked[slot]["window_size"]
        out = outputs[slot]
        assert out.count(0) < 120
        for j in range(n, len(out) + 1):  # every n-gram, against those starting in its window
            gram = tuple(out[j - n:j])
            if gram[-1] in asked[slot].get("whitelist_token_ids", []):
                continue
            earlier = {tuple(out[i:i + n]) for i in range(max(0, j - 1 - w), j - n)}
            assert gram not in earlier, (slot, j)


def test_request_arguments_are_checked_as_vllms_processor_checks_them():
    bans = RequestBans(2, Staged)
    with pytest.raises(ValueError, match="ngram_size"):
        bans.add_request(0, Params(ngram_size=0))
    with pytest.raises(ValueError, match="at most 16"):
        bans.add_request(0, Params(ngram_size=3, whitelist_token_ids=list(range(17))))
    bans.add_request(1, Params(ngram_size=3))  # window_size defaults to vLLM's 100
    assert (bans.n.np[1], bans.window.np[1]) == (3, 100)


def test_importing_the_module_patches_nothing():
    """Only vLLM's resolving of the extension's name installs the bans (here, without vLLM,
    it fails for want of vLLM); window_bans' users import the module freely."""
    import importlib

    assert "NGramSamplerExtension" not in vars(ngram_sampler)
    module, name = ngram_sampler.EXTENSION.rsplit(".", 1)  # as vLLM's resolve_obj_by_qualname splits it
    assert importlib.import_module(module) is ngram_sampler and name == "NGramSamplerExtension"
    with pytest.raises(ImportError):
        ngram_sampler.NGramSamplerExtension  # noqa: B018


@pytest.mark.parametrize("preset", ["unlimited-ocr", "deepseek-ocr"])
def test_ngram_bans_sampler_names_the_extension_in_the_processors_place(preset):
    """engines.vllm.ngram_bans: sampler gives vLLM the worker extension and no logits processor
    (so vLLM may pick its V2 runner); the default keeps the processor; a preset without bans,
    or a user's own engine_args, are left as they are."""
    from batchocr.engines.vllm.presets import get_preset
    from batchocr.engines.vllm import VLLMOptions
    from batchocr.engines.vllm.patches.ngram import FQCN

    p = get_preset(preset)  # the batched encoder and rswa_tiles (unlimited-ocr's defaults) off: their
    off = {"batch_encoder": False, "rswa_tiles": False if preset == "unlimited-ocr" else None}  # extensions: other tests'
    default = VLLMOptions(model="/m", preset=preset, **off).llm_args(p)
    assert default["logits_processors"] == [FQCN] and "worker_extension_cls" not in default
    sampler = VLLMOptions(model="/m", preset=preset, ngram_bans="sampler", **off).llm_args(p)
    assert "logits_processors" not in sampler
    assert sampler["worker_extension_cls"] == ngram_sampler.EXTENSION == "batchocr.engines.vllm.patches.ngram_sampler.NGramSamplerExtension"
    assert sampler["additional_config"] == {workerext.KEY: workerext.fingerprint(ngram_sampler.EXTENSION)}
    assert {k: v for k, v in sampler.items() if k not in ("worker_extension_cls", "additional_config")} == {
        k: v for k, v in default.items() if k != "logits_processors"}
    mine = VLLMOptions(model="/m", preset=preset, ngram_bans="sampler", **off,
                       engine_args={"worker_extension_cls": "my.ext:X"}).llm_args(p)
    assert mine["worker_extension_cls"] == "my.ext:X"
    plain = VLLMOptions(model="/m", preset="qwen2.5-vl", ngram_bans="sampler").llm_args(get_preset("qwen2.5-vl"))
    assert "worker_extension_cls" not in plain and "logits_processors" not in plain


def test_a_bad_ngram_bans_value_is_exit_2_naming_the_key(tmp_path):
    from conftest import run_cli

    job = tmp_path / "job.yaml"
    job.write_text(f"source: {tmp_path}\nout: {tmp_path / 'out'}\nengine: vllm\n"
                   "engines: {vllm: {model: /m, preset: unlimited-ocr, ngram_bans: gpu}}\n")
    proc = run_cli("run", "--job", str(job))
    assert proc.returncode == 2 and "ngram_bans" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_the_sampler_bans_ask_vllm_for_its_v2_runner(monkeypatch):
    """vLLM gave Unlimited-OCR's layout its V1 runner by itself (the H200, 2026-12-02): with the
    sampler's bans the engine sets VLLM_USE_V2_MODEL_RUNNER=1 before vLLM is built; a 0 set by
    hand is exit 2 naming the key, not an engine that refuses later."""
    from batchocr.engines.vllm import VLLMEngine, VLLMOptions
    from batchocr.errors import ConfigError

    fake_vllm.install(monkeypatch)
    monkeypatch.delenv("VLLM_USE_V2_MODEL_RUNNER", raising=False)
    VLLMEngine(VLLMOptions(model="/models/fake", preset="unlimited-ocr"), llm=fake_vllm.LLM())
    assert "VLLM_USE_V2_MODEL_RUNNER" not in os.environ  # the processor's engine: vLLM chooses
    VLLMEngine(VLLMOptions(model="/models/fake", preset="unlimited-ocr", ngram_bans="sampler"), llm=fake_vllm.LLM())
    assert os.environ["VLLM_USE_V2_MODEL_RUNNER"] == "1"
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "0")
    with pytest.raises(ConfigError, match="engines.vllm.ngram_bans: sampler: VLLM_USE_V2_MODEL_RUNNER=0"):
        VLLMEngine(VLLMOptions(model="/models/fake", preset="unlimited-ocr", ngram_bans="sampler"),
                   llm=fake_vllm.LLM())


def test_rswa_prompt_lengths_are_padded_to_the_padded_batch():
    """vLLM 0.26's V2 runner builds attention metadata for 184 rows (a captured CUDA-graph size)
    with R-SWA prompt lengths for the 181 real requests, and Triton attention's copy fails (the
    H200, 2026-12-02): the wrapper gives the builder lengths for every row, zeros for the padding,
    the real rows' unchanged; a batch that needs no padding, or no R-SWA, is passed as it came."""
    seen = {}

    def build(**kwargs):
        seen.update(kwargs)
        return "metadata"

    wrapped = ngram_sampler.padded_rswa(build)
    lengths = np.array([903, 911, 1810], dtype=np.int32)
    assert wrapped(num_reqs=8, rswa_prefix_lens=lengths, seq_lens="s") == "metadata"
    assert seen["rswa_prefix_lens"].tolist() == [903, 911, 1810, 0, 0, 0, 0, 0]
    assert seen["rswa_prefix_lens"].dtype == np.int32 and seen["seq_lens"] == "s"
    wrapped(num_reqs=3, rswa_prefix_lens=lengths)
    assert seen["rswa_prefix_lens"] is lengths
    wrapped(num_reqs=8, rswa_prefix_lens=None)
    assert seen["rswa_prefix_lens"] is None
    assert wrapped.batchocr_padded

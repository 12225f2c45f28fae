"""batchocr.engines.vllm.patches.ngram bans what vLLM's no-repeat n-gram processor bans, step by step."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest

from batchocr.engines.vllm.patches.ngram import BatchBans, NGramBan, check_params


def reference(ids: list[int], n: int, window: int, whitelist=frozenset()) -> set[int]:
    """vLLM 0.26's NoRepeatNGramLogitsProcessor.__call__ (model_executor/models/deepseek_ocr.py),
    its loop as written there, returning the banned tokens instead of writing the logits."""
    if len(ids) < n:
        return set()
    prefix = tuple(ids[-(n - 1):]) if n > 1 else ()
    banned = set()
    for i in range(max(0, len(ids) - window), len(ids) - n + 1):
        ngram = tuple(ids[i:i + n])
        if ngram[:-1] == prefix:
            banned.add(ngram[-1])
    return banned - set(whitelist)


def looping(rng: random.Random, length: int, period: int, vocab: int = 50) -> list[int]:
    """What random weights write: a preamble, then a short cycle, with a slip now and then."""
    cycle = [rng.randrange(vocab) for _ in range(period)]
    out = [rng.randrange(129280) for _ in range(20)]
    while len(out) < length:
        out.append(rng.randrange(vocab) if rng.random() < 0.02 else cycle[len(out) % period])
    return out


CASES = [(35, 128), (5, 128), (35, 1024), (3, 16), (2, 2), (1, 8), (6, 4), (4, 5)]


@pytest.mark.parametrize("n,window", CASES)
def test_the_same_bans_as_vllms_loop_token_by_token(n, window):
    rng = random.Random(n * 1000 + window)
    histories = [[rng.randrange(129280) for _ in range(400)], looping(rng, 600, 7), looping(rng, 300, 1),
                 looping(rng, 500, 40, vocab=5)]
    for history in histories:
        ban, ids, hits = NGramBan(n, window), [], 0
        for tok in history:
            ids.append(tok)  # vLLM hands the same list each step, a token longer
            want = reference(ids, n, window)
            assert ban.banned(ids) == want, (n, window, len(ids))
            hits += bool(want)
        if history is histories[1] and n <= 35 and window >= n + 7:
            assert hits > len(history) // 5  # the looping text is banned from, so the test can fail


def test_the_whitelist_is_never_banned():
    rng = random.Random(1)
    history = looping(rng, 400, 5, vocab=6)
    white = frozenset(history[100:103])
    ban, ids = NGramBan(4, 64, white), []
    for tok in history:
        ids.append(tok)
        got = ban.banned(ids)
        assert got == reference(ids, 4, 64, white) and not got & white


def test_several_tokens_a_call_and_a_history_that_shrinks_or_changes():
    rng = random.Random(2)
    history = looping(rng, 900, 9)
    ban = NGramBan(6, 100)
    length = 0
    for step in range(300):
        length = min(len(history), length + rng.choice([1, 1, 1, 2, 5, 130]))  # 130: past the window
        ids = history[:length]
        if step % 37 == 36:  # vLLM dropped tokens (a KV-load failure), then went on
            length = max(0, length - rng.randrange(1, 20))
            ids = history[:length]
        if step % 53 == 52 and ids:  # the last known token is now another
            ids = ids[:-1] + [ids[-1] + 1]
        assert ban.banned(ids) == reference(ids, 6, 100), step
        if length >= len(history):
            break


def test_a_batch_bans_each_row_and_skips_requests_without_arguments():
    rng = random.Random(3)
    bans = BatchBans()
    a, b, c = looping(rng, 200, 4, vocab=4), [rng.randrange(99999) for _ in range(200)], looping(rng, 200, 3)
    for row, ids, extra in ((0, a, {"ngram_size": 5, "window_size": 50}), (1, b, {"ngram_size": 5}),
                            (2, c, None), (3, c, {"temperature": 0})):
        state = BatchBans.new_state(SimpleNamespace(extra_args=extra), None, ids)
        assert (state is None) == (extra is None or "ngram_size" not in extra)
        if state is not None:
            bans.rows[row] = state
    assert set(bans.rows) == {0, 1}
    rows, cols = bans.pairs()
    want = [(0, t) for t in reference(a, 5, 50)] + [(1, t) for t in reference(b, 5, 100)]  # window default 100
    assert want and sorted(zip(rows, cols)) == sorted(want)
    a.append(99)  # the rows hold the live lists: the next step sees the new token
    rows, cols = bans.pairs()
    assert sorted(zip(rows, cols)) == sorted([(0, t) for t in reference(a, 5, 50)] + [(1, t) for t in reference(b, 5, 100)])


@pytest.mark.parametrize("extra,message", [
    ({"ngram_size": 0}, "ngram_size"), ({"ngram_size": "35"}, "ngram_size"), ({"ngram_size": True}, "ngram_size"),
    ({"ngram_size": 35, "window_size": -1}, "window_size"), ({"ngram_size": 35, "whitelist_token_ids": 5}, "whitelist"),
])
def test_malformed_arguments_are_refused_as_vllm_refuses_them(extra, message):
    with pytest.raises(ValueError, match=message):
        check_params(extra)


def test_arguments_as_the_presets_send_them():
    assert check_params(None) is None and check_params({"window_size": 9}) is None
    assert check_params({"ngram_size": 35, "window_size": 128}) == (35, 128, frozenset())
    assert check_params({"ngram_size": 30, "window_size": 90, "whitelist_token_ids": [128821, 128822]}) == (
        30, 90, frozenset({128821, 128822}))


def test_the_host_benchmark_runs_and_checks_its_bans(tmp_path):
    """bench/ngram_host.py against this checkout itself: it finishes, equal bans on both sides."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    out = tmp_path / "ngram.json"
    done = subprocess.run([sys.executable, str(root / "bench" / "ngram_host.py"), "--baseline", str(root),
                           "--requests", "6", "--steps", "40", "--repeats", "1", "--json", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == 4 and all(r["same_bans"] for r in rows)
    assert [r["banned_a_step"] > 0 for r in rows] == [False, True, False, True]  # looping histories ban

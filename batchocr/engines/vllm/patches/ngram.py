"""vLLM 0.26.0: a no-repeat n-gram logits processor (DeepSeek-OCR, Unlimited-OCR), cheap at 256+ requests a step.

Both models' recipes register vLLM's `NGramPerReqLogitsProcessor`: every decode step, for every
running request, a Python loop over the last `window_size` generated tokens compares
(ngram_size - 1)-token tuples, then a row of the logits is indexed on the GPU. The engine core
runs it between the forward pass and sampling, so a step of R requests pays R calls, and the GPU
is idle for most of a decode step of 256 requests.

`NGramBan` bans exactly the same tokens, kept up to date as tokens arrive instead of recomputed:
a dict from each (n-1)-token prefix in the window to the tokens that followed it, one n-gram
added and one dropped a step. `NoRepeatNGramLogitsProcessor` is vLLM's batch-level logits
processor over them: the same request arguments (`extra_args` ngram_size, window_size,
whitelist_token_ids) and validation as vLLM's, and one indexed write for the whole batch, only
on the steps where something is banned (sound text: few; the looping text of random weights:
nearly every step). A step of 256 requests costs its host a few milliseconds, an order of
magnitude and more below vLLM's (measured figures: docs/PERFORMANCE.md; bench/ngram_host.py
times this checkout's against another's). Register it in vLLM's place (the presets do):

    LLM(..., logits_processors=[FQCN])   # "batchocr.engines.vllm.patches.ngram:NoRepeatNGramLogitsProcessor"

vLLM's engine core imports it by that name, so the class exists only where vLLM does.
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Iterable

from batchocr.engines.vllm.patches import moved as _moved

FQCN = f"{__name__}:NoRepeatNGramLogitsProcessor"
# The logits-processor interface the processor implements, and the helper it keeps its state with.
TARGETS = {
    "v1/sample/logits_processor/interface.py:LogitsProcessor": "6870402a79d0fbb3",
    "v1/sample/logits_processor/builtin.py:process_dict_updates": "bf79e08b8ad953c9",
}


def moved() -> str | None:
    """Why this vLLM's logits-processor interface is not the one the processor implements (None: it
    is, or no vLLM here)."""
    return _moved("ngram", TARGETS)


class NGramBan:
    """The tokens vLLM's NoRepeatNGramLogitsProcessor bans after `ids`: every token that
    followed the last (n-1) tokens in an n-gram starting in the last `window_size` tokens,
    [max(0, L - window), L - n] of the L so far, less the whitelist.

    `ids` is a request's generated tokens, the same list each call, grown by a token or more
    a step. If it is not (shorter, or its last known token changed: vLLM discards tokens
    after a KV-load failure), the index is built again from it."""

    __slots__ = ("n", "window", "whitelist", "follow", "keys", "lo", "hi", "known", "last_tok", "tail", "next_len")

    def __init__(self, ngram_size: int, window_size: int, whitelist_token_ids: Iterable[int] | None = None):
        self.n, self.window = ngram_size, window_size
        self.whitelist = frozenset(whitelist_token_ids or ())
        self._reset(0)

    def _reset(self, lo: int) -> None:
        self.follow: dict[tuple, dict[int, int]] = {}
        self.keys: deque[tuple[tuple, int]] = deque()  # the window's n-grams, oldest first
        self.lo = self.hi = lo  # the n-grams starting in [lo, hi) are indexed
        self.known = -1  # the length at the last call that indexed (-1: none since the reset)
        self.last_tok = None  # its last token
        self.tail = None  # its last n-1 tokens: the prefix of the n-gram that the next token ends
        self.next_len = -1  # the length at which one more token takes the step's path (-1: none)

    def banned(self, ids: list[int]) -> set[int] | frozenset[int]:
        length, n = len(ids), self.n
        if length == self.next_len and ids[-2] == self.last_tok:
            # One token since the last call, what a decode step gives: the newest n-gram is the
            # last call's tail and that token, at most one n-gram leaves the window, and the new
            # tail is looked up. The state the general path below would leave, at about 0.6x of
            # its cost (bench/ngram_host.py).
            follow, tok, key = self.follow, ids[-1], self.tail
            self.keys.append((key, tok))
            nxt = follow.get(key)
            if nxt is None:
                follow[key] = {tok: 1}
            else:
                nxt[tok] = nxt.get(tok, 0) + 1
            self.hi += 1
            if self.lo < length - self.window:  # the window moved past its oldest n-gram
                self._drop_oldest()
                self.lo += 1
            self.known, self.next_len, self.last_tok = length, length + 1, tok
        else:
            if length < n:
                if self.hi:  # the list shrank below one n-gram
                    self._reset(0)
                return _NONE
            self._catch_up(ids, length)
        self.tail = tail = tuple(ids[length - n + 1:])
        nxt = self.follow.get(tail)
        if not nxt:
            return _NONE
        return set(nxt) - self.whitelist if self.whitelist else set(nxt)

    def _catch_up(self, ids: list[int], length: int) -> None:
        """Index the n-grams since the last call, however many tokens came (or build the index
        again if ids is not the list it was), and drop those the window left."""
        n, known = self.n, self.known
        if known >= 0 and (length < known or ids[known - 1] != self.last_tok):
            self._reset(0)
        lo, hi = max(0, length - self.window), length - n + 1
        if lo > self.hi:  # more tokens than the window since the last call: skip what left it
            self._reset(lo)
        follow, keys = self.follow, self.keys
        for i in range(self.hi, hi):
            key, tok = tuple(ids[i:i + n - 1]), ids[i + n - 1]
            keys.append((key, tok))
            nxt = follow.get(key)
            if nxt is None:
                follow[key] = {tok: 1}
            else:
                nxt[tok] = nxt.get(tok, 0) + 1
        for _ in range(self.lo, min(lo, hi)):
            self._drop_oldest()
        self.lo, self.hi = max(self.lo, min(lo, hi)), max(self.hi, hi)
        self.known, self.last_tok = length, ids[-1]
        # The step's path needs the window to hold an n-gram (vLLM's range is empty otherwise).
        self.next_len = length + 1 if self.window >= n else -1

    def _drop_oldest(self) -> None:
        key, tok = self.keys.popleft()
        nxt = self.follow[key]
        if nxt[tok] == 1:
            del nxt[tok]
            if not nxt:
                del self.follow[key]
        else:
            nxt[tok] -= 1


_NONE: frozenset[int] = frozenset()  # nothing banned (most steps of sound text): no set made


def check_params(extra_args: dict | None) -> tuple[int, int, frozenset[int]] | None:
    """A request's n-gram arguments, as vLLM's processor reads and checks them (and a bool,
    which vLLM's isinstance(int) lets through, refused): None when it asks for no bans (no
    ngram_size); ValueError when they are malformed."""
    extra = extra_args or {}
    ngram_size = extra.get("ngram_size")
    if ngram_size is None:
        return None
    window_size = extra.get("window_size", 100)
    whitelist = extra.get("whitelist_token_ids")
    if not isinstance(ngram_size, int) or isinstance(ngram_size, bool) or ngram_size <= 0:
        raise ValueError(f"`ngram_size` has to be a strictly positive integer, got {ngram_size}.")
    if not isinstance(window_size, int) or isinstance(window_size, bool) or window_size <= 0:
        raise ValueError(f"`window_size` has to be a strictly positive integer, got {window_size}.")
    if whitelist is not None and not isinstance(whitelist, Iterable):
        raise ValueError(f"`whitelist_token_ids` has to be a sequence of integers, got {whitelist}.")
    return ngram_size, window_size, frozenset(whitelist or ())


class BatchBans:
    """The bans of a batch of requests, by batch row: the state of the logits processor,
    apart from vLLM (so that it is tested without it)."""

    def __init__(self):
        self.rows: dict[int, tuple[NGramBan, list[int]]] = {}  # batch row -> (bans, its output ids)

    @staticmethod
    def new_state(params, prompt_ids: list[int] | None, output_ids: list[int]) -> tuple[NGramBan, list[int]] | None:
        args = check_params(getattr(params, "extra_args", None))
        return None if args is None else (NGramBan(*args), output_ids)

    def pairs(self) -> tuple[list[int], list[int]]:
        """(rows, tokens) to set to -inf this step."""
        rows: list[int] = []
        cols: list[int] = []
        for row, (ban, ids) in self.rows.items():
            banned = ban.banned(ids)
            if banned:
                rows.extend([row] * len(banned))
                cols.extend(banned)
        return rows, cols


def write_bans(logits, rows: list[int], cols: list[int]):
    """logits[rows[i], cols[i]] = -inf, the host not waiting on the GPU: the indices travel from
    pinned memory, and the value is a tensor already on the logits' device, as vLLM's own
    processors write theirs. `logits[r, c] = -inf` hands index_put_ a host scalar, which it copies
    to the device with a blocking copy: the engine core then waits out the step's forward pass
    at every step that bans a token (bench/gpu/check_ban_sync.py times both writes)."""
    import torch

    device = logits.device
    index = torch.tensor([rows, cols], dtype=torch.long, pin_memory=device.type == "cuda")
    index = index.to(device, non_blocking=True)
    logits.index_put_((index[0], index[1]), _neg_inf(device, logits.dtype))
    return logits


@functools.lru_cache(maxsize=8)
def _neg_inf(device, dtype):
    import torch

    return torch.full((), -float("inf"), dtype=dtype, device=device)  # filled there: no copy


def _processor_class():
    """NoRepeatNGramLogitsProcessor, built on vLLM's LogitsProcessor where it is first asked for
    (vLLM's engine core, by FQCN): importing this module (every job spec names the preset's
    engine arguments) does not import vLLM and torch, a start's seconds in each process."""
    from vllm.v1.sample.logits_processor import LogitsProcessor
    from vllm.v1.sample.logits_processor.builtin import process_dict_updates

    class NoRepeatNGramLogitsProcessor(LogitsProcessor):
        """vLLM's NGramPerReqLogitsProcessor (same request arguments and validation), with
        NGramBan a request and one indexed write a step for the batch."""

        def __init__(self, vllm_config, device, is_pin_memory: bool):  # vLLM's signature; the logits say the device
            self.bans = BatchBans()

        @classmethod
        def validate_params(cls, sampling_params) -> None:
            check_params(sampling_params.extra_args)

        def is_argmax_invariant(self) -> bool:
            return False

        def update_state(self, batch_update) -> None:
            process_dict_updates(self.bans.rows, batch_update, self.bans.new_state)

        def apply(self, logits):
            if not self.bans.rows:
                return logits
            rows, cols = self.bans.pairs()
            if rows:
                write_bans(logits, rows, cols)
            return logits

    NoRepeatNGramLogitsProcessor.__module__ = __name__
    return NoRepeatNGramLogitsProcessor


def __getattr__(name: str):
    """The processor, made once on first use (no vLLM here: AttributeError, as before)."""
    if name != "NoRepeatNGramLogitsProcessor":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        cls = _processor_class()
    except ImportError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r} (no vLLM here)") from None
    globals()[name] = cls
    return cls

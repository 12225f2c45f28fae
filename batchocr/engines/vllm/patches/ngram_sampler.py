"""vLLM 0.26.0: no-repeat n-gram bans on the GPU, inside the sampler of vLLM's V2 model runner.

Why: any custom logits processor moves vLLM off its V2 model runner ("Model Runner V2 does not
yet support custom logits processors; using the V1 model runner", config/vllm.py:2201), and
hands each request's output tokens to the host before sampling. Unlimited-OCR's and DeepSeek-OCR's
recipes need a processor for their no-repeat n-gram bans (patches.ngram's is the cheap one); a
decode step on the V1 runner with a processor takes several times as long as on V2 without one.

How: the V2 runner keeps every request's tokens where the GPU reads them (`RequestState`:
`all_token_ids` in UVA memory, `total_len` on the GPU, advanced by its `post_update` kernel) and
applies `bad_words` from them in its sampler (v1/worker/gpu/sample/bad_words.py). `window_bans`
does the ban the same way: it gathers each row's last W generated tokens, compares the first n-1
tokens of every n-gram in the window with the last n-1, and one scatter sets the followers of the
matches to -inf. The shapes come from host-side copies of the requests' arguments, so nothing
waits for the GPU, and the host does no work a token.

The bans are those of patches.ngram.NGramBan, which are vLLM's NoRepeatNGramLogitsProcessor's
(tests/test_ngram_sampler.py checks them on random and looping sequences). Requests carry the same
`extra_args` (ngram_size, window_size, whitelist_token_ids). Use it in place of the processor:

    LLM(..., worker_extension_cls=EXTENSION)  # no logits_processors; engines.vllm.ngram_bans: sampler

vLLM resolves that name in its worker process, which adds the bans to the V2 runner's `Sampler`
and makes the V1 runner refuse to start (the bans would be missing there). Not with speculative
decoding (one logit row a request). The arithmetic is written for numpy and torch alike, so
that its tests run where torch is absent, against vLLM's state replaced by arrays.
"""

from __future__ import annotations

from batchocr.engines.vllm.patches import moved as _moved
from batchocr.engines.vllm.patches import workerext
from batchocr.engines.vllm.patches.ngram import check_params

MAX_WHITELIST = 16  # tokens exempt from the bans, a request (DeepSeek-OCR's recipe exempts 2)
EXTENSION = f"{__name__}.NGramSamplerExtension"
# The V2 runner's code that install() wraps or reads (vLLM 0.26.0's): the sampler's methods, the
# attention metadata padded and its call site, the request state and its buffers.
TARGETS = {
    "v1/worker/gpu/sample/sampler.py:Sampler.__init__": "c5fd0eaef6e27369",
    "v1/worker/gpu/sample/sampler.py:Sampler.add_request": "72047678e746f28b",
    "v1/worker/gpu/sample/sampler.py:Sampler.apply_staged_writes": "705583a39ec283d1",
    "v1/worker/gpu/sample/sampler.py:Sampler.apply_sampling_params": "ccbb409b205ec1c6",
    "v1/worker/gpu/attn_utils.py:build_attn_metadata": "08f9976687ec9c2d",
    "v1/worker/gpu/model_states/default.py:DefaultModelState.prepare_attn": "d78826d61916e758",
    "v1/worker/gpu/buffer_utils.py:UvaBackedTensor": "7c1d8907267c499d",
    "v1/worker/gpu/states.py:RequestState.__init__": "e7ffdd49c93e0230",
}


def moved() -> str | None:
    """Why this vLLM's V2 sampler is not the one the bans are added to (None: it is, or no vLLM here)."""
    return _moved("ngram_sampler", TARGETS)


def _torch(a) -> bool:
    return hasattr(a, "unfold")


def _arange(like, n: int):
    if _torch(like):
        import torch

        return torch.arange(n, device=like.device)
    import numpy as np

    return np.arange(n)


def _long(a):
    return a.long() if _torch(a) else a.astype("int64")


def window_bans(history, lengths, ngram_size: int, windows, whitelist=None):
    """The banned followers of a batch's rows, all n-grams at once: (followers, banned), each of
    shape [R, S] with S = T - ngram_size + 1, or None when no n-gram fits in T.

    history [R, T]: each row's last T generated tokens, the newest at T-1 (a row with fewer than
    T holds anything before them); lengths [R]: each row's count of generated tokens; windows
    [R]: each row's window_size (T at least the largest); whitelist [R, K] or None: tokens never
    banned, padded with -1. banned[r, s] says that followers[r, s] is banned for row r: the
    n-gram at s starts in the row's window ([max(0, L - W), L - n]) and its first n-1 tokens
    are the row's last n-1."""
    n = ngram_size
    t = history.shape[1]
    s = t - n + 1
    if s <= 0:
        return None
    if _torch(history):
        grams = history.unfold(1, n, 1)  # [R, S, n], a view
    else:
        import numpy as np

        grams = np.lib.stride_tricks.sliding_window_view(history, n, axis=1)
    index = _arange(history, s)
    prefix = history[:, t - n + 1:]  # the last n-1 tokens
    match = (grams[:, :, : n - 1] == prefix[:, None, :]).all(axis=-1)
    reach = lengths.clip(max=windows)  # tokens of the window that exist
    valid = index[None, :] >= (t - reach)[:, None]  # none for a row of fewer than n tokens
    followers = grams[:, :, n - 1]
    banned = match & valid
    if whitelist is not None:
        banned = banned & ~(followers[:, :, None] == whitelist[:, None, :]).any(axis=-1)
    return followers, banned


def apply_bans(logits, followers, banned) -> None:
    """Set logits[r, followers[r, s]] to -inf where banned[r, s], in place, with one scatter:
    the minimum of -inf (banned) or +inf (not) and the logit, so a token that is banned at one
    s and not at another is banned, whatever the order."""
    if _torch(logits):
        import torch

        inf = torch.tensor(float("inf"), dtype=logits.dtype, device=logits.device)
        logits.scatter_reduce_(1, followers.long(), torch.where(banned, -inf, inf), reduce="amin")
    else:
        import numpy as np

        rows = np.broadcast_to(np.arange(logits.shape[0])[:, None], followers.shape)
        np.minimum.at(logits, (rows, followers), np.where(banned, -np.inf, np.inf))


class RequestBans:
    """Each request slot's n-gram arguments, as vLLM's V2 sampler keeps its bad words: numpy
    arrays written when a request is added, copied where the GPU reads them once a step
    (vLLM's UvaBackedTensor: `tensor(size)` makes them, with .np and .gpu, so that the tests
    can pass numpy arrays)."""

    def __init__(self, max_num_reqs: int, tensor):
        self.n = tensor(max_num_reqs)  # 0: no bans
        self.window = tensor(max_num_reqs)
        self.whitelist = tensor((max_num_reqs, MAX_WHITELIST))
        self.whitelist.np[:] = -1

    def add_request(self, req_idx: int, sampling_params) -> None:
        args = check_params(getattr(sampling_params, "extra_args", None))
        if args is None:
            self.n.np[req_idx] = 0
            return
        n, window, whitelist = args
        if len(whitelist) > MAX_WHITELIST:
            raise ValueError(f"`whitelist_token_ids` has {len(whitelist)} tokens; batchocr's sampler bans "
                             f"take at most {MAX_WHITELIST}")
        self.n.np[req_idx], self.window.np[req_idx] = n, window
        self.whitelist.np[req_idx] = -1
        self.whitelist.np[req_idx, : len(whitelist)] = sorted(whitelist)

    def apply_staged_writes(self) -> None:
        for t in (self.n, self.window, self.whitelist):
            t.copy_to_uva()

    def apply(self, logits, expanded_idx_mapping, idx_mapping_np, req_states) -> None:
        """Ban, in `logits` (a row a request of the batch), what each row's request bans.
        `req_states` is the V2 runner's RequestState (its total_len, prompt_len, all_token_ids)."""
        ns = self.n.np[idx_mapping_np]
        if not ns.any():
            return
        if logits.shape[0] != len(idx_mapping_np):
            raise RuntimeError("batchocr's sampler n-gram bans do not support speculative decoding")
        import numpy as np

        req = _long(expanded_idx_mapping)
        total = _long(req_states.total_len.gpu[req])
        lengths = total - _long(req_states.prompt_len.gpu[req])
        windows = _long(self.window.gpu[req])
        row_n = self.n.gpu[req]
        whitelist = self.whitelist.gpu[req] if (self.whitelist.np[idx_mapping_np] >= 0).any() else None
        for n in np.unique(ns[ns > 0]).tolist():
            t = int(self.window.np[idx_mapping_np][ns == n].max())
            if t < n:
                continue
            pos = (total[:, None] - t + _arange(total, t)[None, :]).clip(min=0)
            out = window_bans(req_states.all_token_ids.gpu[req[:, None], pos], lengths, n, windows, whitelist)
            if out is not None:
                followers, banned = out
                apply_bans(logits, followers, banned & (row_n == n)[:, None])


V2_ENV = "VLLM_USE_V2_MODEL_RUNNER"


def require_v2_runner() -> None:
    """Ask vLLM for its V2 model runner, before the engine is built (its engine-core process
    inherits the variable). Without it vLLM gives Unlimited-OCR's layout (DeepSeek-V2's MoE
    decoder) the V1 runner, where the bans would be missing (the extension refuses to start
    there). ValueError where the variable says no."""
    import os

    value = os.environ.get(V2_ENV)
    if not value:
        os.environ[V2_ENV] = "1"
    elif value.strip().lower() in ("0", "false"):
        raise ValueError(f"{V2_ENV}={value} is set, and the sampler's bans run in vLLM's V2 model runner only")


def pad_rows(lengths, num_reqs):
    """`lengths` with zeros appended up to `num_reqs` rows (as is when it has them, or is None)."""
    if lengths is None or num_reqs is None or lengths.shape[0] >= num_reqs:
        return lengths
    if _torch(lengths):
        import torch

        return torch.cat([lengths, lengths.new_zeros(num_reqs - lengths.shape[0])])
    import numpy as np

    return np.concatenate([lengths, np.zeros(num_reqs - lengths.shape[0], dtype=lengths.dtype)])


def padded_rswa(build):
    """vLLM 0.26's V2 runner with full CUDA graphs builds attention metadata for the batch padded to
    a captured size, but R-SWA's prompt lengths (`rswa_prefix_lens`) only for its real requests:
    Triton attention's copy into its persistent buffer then fails at the first batch of another
    size (triton_attn.py:264, "The size of tensor a (184) must match the size of tensor b (181)";
    flash_attn.py:710 has the same copy), as Unlimited-OCR's layout does. The padded rows are no
    requests: a prompt length of 0 for them changes nothing."""
    def build_attn_metadata(*args, **kwargs):
        if "rswa_prefix_lens" in kwargs:
            kwargs["rswa_prefix_lens"] = pad_rows(kwargs["rswa_prefix_lens"], kwargs.get("num_reqs"))
        return build(*args, **kwargs)

    build_attn_metadata.batchocr_padded = True
    return build_attn_metadata


def install() -> None:
    """Add the bans to vLLM's V2 `Sampler`, pad R-SWA's prompt lengths to the V2 runner's padded
    batch (padded_rswa) and make the V1 runner refuse to start (idempotent)."""
    from vllm.v1.worker import gpu_model_runner
    from vllm.v1.worker.gpu.model_states import default as model_states
    from vllm.v1.worker.gpu.buffer_utils import UvaBackedTensor
    from vllm.v1.worker.gpu.sample import sampler

    if not getattr(model_states.build_attn_metadata, "batchocr_padded", False):
        model_states.build_attn_metadata = padded_rswa(model_states.build_attn_metadata)
    cls = sampler.Sampler
    if getattr(cls, "_batchocr_ngram", False):
        return
    import torch

    init, add, writes, params = cls.__init__, cls.add_request, cls.apply_staged_writes, cls.apply_sampling_params

    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.batchocr_bans = RequestBans(self.req_states.max_num_reqs,
                                         lambda size: UvaBackedTensor(size, dtype=torch.int32))

    def add_request(self, req_idx, prompt_len, sampling_params):
        add(self, req_idx, prompt_len, sampling_params)
        self.batchocr_bans.add_request(req_idx, sampling_params)

    def apply_staged_writes(self):
        writes(self)
        self.batchocr_bans.apply_staged_writes()

    def apply_sampling_params(self, logits, expanded_idx_mapping, idx_mapping_np, *args, **kwargs):
        self.batchocr_bans.apply(logits, expanded_idx_mapping, idx_mapping_np, self.req_states)
        return params(self, logits, expanded_idx_mapping, idx_mapping_np, *args, **kwargs)

    cls.__init__, cls.add_request, cls.apply_staged_writes = __init__, add_request, apply_staged_writes
    cls.apply_sampling_params = apply_sampling_params
    cls._batchocr_ngram = True

    v1 = gpu_model_runner.GPUModelRunner

    def refuse(self, *args, **kwargs):
        raise RuntimeError(f"{EXTENSION} bans n-grams in vLLM's V2 model runner, and this engine chose the V1 "
                           "runner (a logits processor is set, or VLLM_USE_V2_MODEL_RUNNER=0): drop one or the other")

    v1.__init__ = refuse


# `NGramSamplerExtension` installs the bans when vLLM asks for it, and only then: importing this
# module (window_bans' tests, a batchocr process whose engine core vLLM forks) patches nothing
# (workerext.py).
__getattr__ = workerext.resolver(__name__, {"NGramSamplerExtension": ("ngram_sampler",)})

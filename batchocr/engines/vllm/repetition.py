"""Runaway repetition: an OCR VLM that loops ("the the the ...", a table row again
and again) until max_tokens burns GPU time and yields garbage. Detected on token
ids as the generation streams, so the request can be stopped early and retried."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence


@dataclass(frozen=True)
class RepetitionCheck:
    # The last `span` tokens must be one block of at most `max_period` tokens
    # repeated back to back (so at least span / max_period times).
    span: int = 384
    max_period: int = 96

    def __post_init__(self):
        if not 1 <= self.max_period <= self.span // 2:
            raise ValueError(f"need 1 <= max_period <= span / 2, got {self.max_period}, {self.span}")

    def looping(self, tokens: Sequence[int]) -> bool:
        if len(tokens) < self.span:
            return False
        tail = list(tokens[-self.span:])
        for period in range(1, self.max_period + 1):
            # tail is periodic with this period iff it equals itself shifted by it
            if tail[period:] == tail[:-period]:
                return True
        return False

"""Which shard a document belongs to: a function of its URI alone, so adding
documents never moves old ones to another shard."""

from __future__ import annotations

import hashlib


def shard_of(uri: str, count: int) -> int:
    digest = hashlib.sha256(uri.encode()).digest()
    return int.from_bytes(digest[8:16], "big") % count

"""Counts and durations as a person reads them ("1 page", "8 min 3 s"), for every
message batchocr prints. Hand-written rather than a library (inflect): every noun
batchocr counts takes an s."""

from __future__ import annotations


def plural(n: int, word: str, words: str | None = None) -> str:
    """'1 page', '2 pages', '1,024 runs'."""
    return f"{n:,} {word if n == 1 else words or word + 's'}"


def duration(seconds: float) -> str:
    """14.2 s, 8 min 3 s, 3 h 12 min, 2 d 4 h."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    s = round(seconds)
    for unit, size, sub, sub_size in (("d", 86400, "h", 3600), ("h", 3600, "min", 60), ("min", 60, "s", 1)):
        if s >= size:
            return f"{s // size} {unit} {s % size // sub_size} {sub}"
    return f"{s} s"  # pragma: no cover


def duration_word(seconds: int) -> str:
    """A bucket's width as the unit of a rate: 'second', '10 s', 'minute', '5 min', 'hour', '2 h', 'day'."""
    for size, one, many in ((86400, "day", "d"), (3600, "hour", "h"), (60, "minute", "min"), (1, "second", "s")):
        if seconds >= size and seconds % size == 0:
            n = seconds // size
            return one if n == 1 else f"{n} {many}"
    return f"{seconds} s"  # pragma: no cover

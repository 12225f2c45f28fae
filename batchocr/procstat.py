"""A process's line in /proc/PID/stat (Linux): its parent, and its start time, which a pid the
kernel has given to another process since does not share."""

from __future__ import annotations

from pathlib import Path

PARENT, STARTED = 1, 19  # indexes in fields(): the stat file's 4th and 22nd fields


def fields(pid: int | str) -> list[str] | None:
    """The fields after the command's name (state first; the name, in parentheses, may hold
    spaces), or None where the process is gone."""
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def started(pid: int | str) -> str | None:
    """The process's start time in clock ticks since boot; None where it is gone."""
    f = fields(pid)
    return f[STARTED] if f is not None else None

"""What several subcommands' options share: storage options, refusing an empty argument, a
finite number, a file written whole."""

from __future__ import annotations

import contextlib
import math
import os

import click

from batchocr.errors import BatchocrError


def write_whole(target, text: str) -> None:
    """A file written whole or not at all: a full disk or a read-only folder is one line (exit
    1), and no half-written page is left (nor an older one truncated). Written beside it, then
    renamed over it; a target that is not a regular file (/dev/stdout) is written as it is."""
    tmp = target if target.exists() and not target.is_file() else target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        if tmp != target:
            os.replace(tmp, target)
    except OSError as exc:
        if tmp != target:
            with contextlib.suppress(OSError):
                tmp.unlink()
        raise BatchocrError(f"{target}: cannot write it ({exc.strerror or exc})") from None


class Finite(click.FloatRange):
    """A number in range that is a number: nan passes FloatRange (no comparison holds), inf
    passes an open end."""

    def convert(self, value, param, ctx):
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number


def _storage_options(ctx, param, pairs: tuple[str, ...]) -> dict[str, str]:
    """--storage-option KEY=VALUE ... as the dict the command receives."""
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            # Not echoed: what was typed may be a secret.
            raise click.BadParameter("expected key=value (e.g. account_name=NAME)", param_hint="--storage-option")
        out[key] = value
    return out


def storage_option(what: str):
    return click.option("--storage-option", "storage", multiple=True, metavar="KEY=VALUE",
                        callback=_storage_options, help=f"fsspec storage option for {what} (repeatable)")


def not_empty(ctx, param, value):
    """An empty SOURCE, OUT, DEST or --html (an unset shell variable: "$OUT") is refused: it
    named the current folder (plan, export wrote there with exit 0) or nothing (report --html)."""
    if value is not None and value.strip() == "":
        hint = f"'{param.human_readable_name}'" if isinstance(param, click.Argument) else None  # run's: not '[OUT]'
        raise click.BadParameter("is empty (an unset variable?)", param_hint=hint)
    return value


def processes(ctx, param, value: str | int | None) -> int | str | None:
    """--processes: N (1 to 8, checked with the job spec's key) or auto."""
    if value is None or isinstance(value, int) or value == "auto":
        return value
    try:
        return int(value)
    except ValueError:
        raise click.BadParameter(f"got {value!r}, expected a number of processes or auto") from None

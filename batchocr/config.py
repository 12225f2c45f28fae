"""One typed validation for every configuration source: the job spec, flags, the
environment, engine options and storage options all become batchocr's frozen
dataclasses through `convert`, which pydantic checks against the dataclasses' own
annotations (types, `Annotated` ranges such as `Gt(0)`, `Literal` choices) and their
`__pydantic_config__` (`FORBID`: an unknown key is an error, in every section).

A value that does not fit is a ConfigError (exit 2) of one line naming the key path,
the value and what is expected, e.g.
`jobs/x.yaml: render.dpi: got 200.7, expected a valid integer`. Values from YAML
must have the right type (`threads: '4'` is refused, so is `every_pages: true`);
values that can only be text (environment variables, --storage-option KEY=VALUE)
are parsed (`strings=True`).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import typing
from typing import Any, Mapping, TypeVar

from batchocr.errors import ConfigError

# Each dataclass's `__pydantic_config__`: no key beyond its fields, no number that is not
# finite (`.inf`, `.nan` in YAML, `inf` in a flag or a storage option).
FORBID = {"extra": "forbid", "allow_inf_nan": False}

T = TypeVar("T")


@functools.cache
def _adapter(cls: type):
    from pydantic import TypeAdapter

    return TypeAdapter(cls)


def convert(cls: type[T], data: Mapping[str, Any] | Any, where: str, *, prefix: tuple[str, ...] = (),
            strings: bool = False, secret: tuple[str, ...] = ()) -> T:
    """`data` (a mapping, or an instance of `cls`) as a validated `cls`.

    `where` opens the message (the job spec's file, "storage options"); `prefix` is
    the key path of `data` inside it (("engines", "vllm")); values of the keys in
    `secret` are never shown."""
    from pydantic import ValidationError

    adapter = _adapter(cls)
    try:
        plain = _plain(data)
        text = json.dumps(plain, ensure_ascii=False)  # _plain left only what JSON holds
        try:
            utf8 = text.encode()
        except UnicodeEncodeError:  # a path's bytes that are not UTF-8 (os.fsdecode's escapes): not JSON
            adapter.validate_json(text.encode(errors="replace"), strict=not strings)  # checked with "?" for them
            return adapter.validate_python(plain, strict=False)  # then built from the values themselves
        return adapter.validate_json(utf8, strict=not strings)
    except ValidationError as exc:
        errors = _unions(exc.errors(include_url=False))
        line = _describe(cls, errors[0], where, prefix, secret)
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise ConfigError(line + more) from None
    except ConfigError as exc:  # the dataclass's own check (its __post_init__), naming its key
        message = str(exc)
        raise ConfigError(message if message.startswith(f"{where}: ") else f"{where}: {message}") from None


def _plain(data: Any, path: tuple[str, ...] = (), inside: frozenset[int] = frozenset()) -> Any:
    """Instances of the dataclasses (a Shard from a flag) as the mappings they came from.
    What YAML can hold but configuration cannot (a date, bytes, a mapping that contains
    itself through an anchor) is a ConfigError naming its key path."""
    where = ".".join(path) or "(top level)"
    if isinstance(data, (Mapping, list, tuple)) or dataclasses.is_dataclass(data):
        if id(data) in inside:
            raise ConfigError(f"{where}: contains itself (a recursive YAML anchor)")
        inside |= {id(data)}
    if dataclasses.is_dataclass(data) and not isinstance(data, type):
        return {f.name: _plain(getattr(data, f.name), (*path, f.name), inside) for f in dataclasses.fields(data)}
    if isinstance(data, Mapping):
        for k in data:
            if not isinstance(k, _SCALARS):
                raise ConfigError(f"{where}: a key of type {type(k).__name__}, expected a name")
        return {k: _plain(v, (*path, key_name(k)), inside) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [_plain(v, (*path, str(i)), inside) for i, v in enumerate(data)]
    if not isinstance(data, _SCALARS):
        raise ConfigError(f"{where}: got a value of type {type(data).__name__}, expected text, a number, "
                          f"true/false, a list or a mapping (quote it to make it text)")
    return data


_SCALARS = (str, int, float, bool, type(None))


def key_name(key: Any) -> str:
    """A key for a message: a typo'd name is shown, a pasted secret is not."""
    key = str(key)
    return key if key.isidentifier() and len(key) <= 40 else "(a key that is not a name)"


def _unions(errors: list[dict]) -> list[dict]:
    """pydantic reports a value that fits no member of a union (`processes: 1-8 | auto`) once a
    member, each under a tag naming it ("constrained-int", "literal['auto']"): those of the first
    error's key become one, its expectations joined with "or"."""
    loc = errors[0]["loc"]
    same = [e for e in errors if len(e["loc"]) == len(loc) and e["loc"][:-1] == loc[:-1]] if loc else []
    if len(same) < 2 or not all(_union_tag(e["loc"][-1]) for e in same):
        return errors
    expected = " or ".join(e["msg"].removeprefix("Input should be ").removeprefix("Input should ") for e in same)
    return [dict(errors[0], loc=loc[:-1], msg=f"Input should be {expected}")] + [e for e in errors if e not in same]


def _union_tag(part: Any) -> bool:
    return isinstance(part, str) and (part in ("int", "float", "str", "bool") or part.startswith(("constrained-", "literal[")))


def _describe(cls: type, error: dict, where: str, prefix: tuple[str, ...], secret: tuple[str, ...]) -> str:
    loc = [str(p) for p in error["loc"] if p != "[key]"]
    path = ".".join([*prefix, *(key_name(p) for p in loc)]) or "(top level)"
    kind, msg = error["type"], error["msg"]
    if kind == "unexpected_keyword_argument":
        parent = ".".join([*prefix, *loc[:-1]])
        known = _fields(cls, loc[:-1])
        hint = f"; known: {', '.join(known)}" if known else ""
        key = key_name(loc[-1])
        return f"{where}: {parent + ': ' if parent else ''}unknown key {repr(key) if key == loc[-1] else key}{hint}"
    if kind == "missing":
        return f"{where}: {path}: missing (required)"
    if kind == "value_error":  # a check of the dataclass's own (__post_init__)
        return f"{where}: {path}: {error['ctx']['error']}"
    shown = "(hidden)" if any(p in secret for p in loc) else _short(error["input"])
    expected = msg.removeprefix("Input should be ").removeprefix("Input should ")
    expected = {"an object": "a mapping", "a valid dictionary": "a mapping"}.get(expected, expected)
    return f"{where}: {path}: got {shown}, expected {expected}"


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _fields(cls: type, loc: list[str]) -> list[str]:
    """The field names of the dataclass found at `loc` under `cls`, if it is one."""
    for name in loc:
        if not dataclasses.is_dataclass(cls):
            return []
        hint = typing.get_type_hints(cls).get(name)
        candidates = [hint, *typing.get_args(hint)]
        cls = next((c for c in candidates if dataclasses.is_dataclass(c)), None)
    return [f.name for f in dataclasses.fields(cls)] if dataclasses.is_dataclass(cls) else []

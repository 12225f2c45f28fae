"""Which inventory run a URL names. Azure's blob inventory writes a run a day (or a week) into
its destination container, one folder a run and a rule in it:

    <destination>/YYYY/MM/DD/HH-MM-SS/<rule>/<rule>-manifest.json    status, files[]
    <destination>/YYYY/MM/DD/HH-MM-SS/<rule>/<rule>_<n>.parquet       the report files

A folder of such runs names its newest run whose manifest's status is Succeeded (a newer one
still running, or failed, is passed over), found by listing one level of dated folders at a
time, newest first: a few requests, however many runs the destination keeps. Only one rule's
runs may be there (several: name one, `<destination>/<rule>`)."""

from __future__ import annotations

import itertools
import json
import posixpath
import re
from typing import Iterator

from batchocr.errors import ConfigError
from batchocr.storage import Store

MANIFEST = "-manifest.json"
REPORTS = (".parquet", ".csv")
# The dated folders of a run, each level's pattern: year, month, day, time of day.
LEVELS = (r"\d{4}", r"\d{2}", r"\d{2}", r"\d{2}-\d{2}-\d{2}")
RULES_LOOKED_AT = 8  # runs whose rules are counted: a week and a day covers a weekly rule beside a daily one


def newest_manifest(url: str, options: dict | None = None) -> str:
    """The one inventory URL names: a file is itself; a folder of Azure's dated runs (or
    `<destination>/<rule>`, where no such folder is, one rule's runs there) is its newest
    Succeeded manifest; a folder holding manifests itself (one run's) is the newest
    Succeeded of them; a folder of report files alone is itself."""
    if url.lower().endswith((".json", *REPORTS)):
        return url
    folder = Store(url, options)
    if _dated(folder):
        return _newest(url, folder, _runs(folder, None))
    names = _files(folder)
    if not names and (parent := _destination(url, options)) is not None:
        return _newest(url, parent, _runs(parent, posixpath.basename(url.rstrip("/"))))
    manifests = sorted((n for n in names if n.endswith(MANIFEST)), reverse=True)
    return _newest(url, folder, iter(manifests)) if manifests else url


def _newest(url: str, folder: Store, manifests: Iterator[str]) -> str:
    """The first of `manifests` (newest first) whose status is Succeeded, once they are known to
    be one rule's; else one line (exit 2)."""
    manifests = iter(manifests)
    first = [m for _, m in zip(range(RULES_LOOKED_AT), manifests)]
    rules = sorted({posixpath.basename(n)[:-len(MANIFEST)] for n in first})
    if len(rules) > 1:
        raise ConfigError(f"--inventory {url}: holds the runs of {len(rules)} inventory rules "
                          f"({', '.join(rules[:4])}{', ...' if len(rules) > 4 else ''}): name one rule's folder, "
                          f"e.g. {url.rstrip('/')}/{rules[0]} (its newest Succeeded run is read)")
    if not rules:
        raise ConfigError(f"--inventory {url}: no inventory run there")
    passed = []
    for name in itertools.chain(first, manifests):  # lazily: the runs after the one taken are never listed
        status = _status(folder, name)
        if status == "Succeeded":
            return folder.uri(folder.path(name))
        passed.append(f"{name}: {status}")
    raise ConfigError(f"--inventory {url}: no inventory run of rule {rules[0]} has status Succeeded "
                      f"({'; '.join(passed[:3])})")


def _runs(folder: Store, rule: str | None) -> Iterator[str]:
    """The manifests of the dated runs under `folder`, newest first (of `rule` alone, if given)."""
    for run in _dated_folders(folder, "", 0):
        rules = [rule] if rule is not None else _level(folder, run, None)
        for name in sorted(rules, reverse=True):
            yield f"{run}/{name}/{name}{MANIFEST}"


def _dated_folders(folder: Store, under: str, depth: int) -> Iterator[str]:
    for name in sorted(_level(folder, under, LEVELS[depth]), reverse=True):
        path = f"{under}/{name}" if under else name
        if depth == len(LEVELS) - 1:
            yield path
        else:
            yield from _dated_folders(folder, path, depth + 1)


def _level(folder: Store, under: str, pattern: str | None) -> list[str]:
    names = [posixpath.basename(n.rstrip("/")) for n in folder.subfolders(under)]
    return [n for n in names if pattern is None or re.fullmatch(pattern, n)]


def _dated(folder: Store) -> bool:
    """The folder holds Azure's runs: a year's folder."""
    return bool(_level(folder, "", LEVELS[0]))


def _status(folder: Store, name: str) -> str:
    """A manifest's `status` (a manifest without one: Succeeded, as inventory reads it)."""
    try:
        raw = json.loads(folder.read_bytes(name))
        return str(raw.get("status", "Succeeded")) if isinstance(raw, dict) else "not a manifest"
    except FileNotFoundError:  # a run under way writes its manifest last
        return "no manifest yet"
    except ValueError:
        return "not JSON"


def _destination(url: str, options: dict | None) -> Store | None:
    """The folder above URL where it holds Azure's dated runs: an inventory's destination, of
    which URL names a rule. Nothing else is listed (a typo's parent may hold millions)."""
    path = url.rstrip("/").partition("://")[2] or url.rstrip("/")
    if "/" not in path.strip("/"):
        return None
    parent = Store(posixpath.dirname(url.rstrip("/")), options)
    return parent if _dated(parent) else None


def _files(folder: Store) -> list[str]:
    try:
        return folder.find("")
    except FileNotFoundError:
        return []

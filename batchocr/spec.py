"""The job spec: typed once at the edge (YAML, flags, env), passed down whole."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import yaml

from batchocr.cpus import available_cpus
from batchocr.errors import ConfigError

ENGINES = ("rapidocr", "textlayer", "vllm")
ROUTES = ("auto", "model", "textlayer")


@dataclass(frozen=True)
class RenderSpec:
    # Resolution for PDF pages. Image files (PNG, JPEG, TIFF) keep their own pixels.
    dpi: int = 200
    # If set, pages are scaled down so that their longest side is at most this many
    # pixels (VLM presets use it: olmOCR-2 wants 1288).
    max_side: int | None = None
    # If set, both sides are rounded down to a multiple of this (a VLM's patch
    # grid, e.g. 28 for Qwen2.5-VL). VLM presets set max_side and size_multiple.
    size_multiple: int | None = None
    # A page that would render to more pixels than this is scaled down to fit;
    # guards memory against absurd page sizes.
    max_pixels: int = 40_000_000
    # An image (an image file, or one inside a PDF page) larger than this is refused
    # as `too_large` before it is decoded: decompression bombs.
    max_image_pixels: int = 200_000_000
    # Render worker processes (PyMuPDF is not thread-safe). 0 = one per CPU, at most 4.
    workers: int = 0
    # A document whose worker sends nothing for this long is killed and recorded as an error.
    timeout_s: float = 300.0
    # Pages per Arrow record batch sent by a render worker.
    batch_pages: int = 4

    def __post_init__(self):
        _positive(self, "dpi", "batch_pages", "max_pixels", "max_image_pixels")
        if self.max_side is not None and self.max_side < 32:
            raise ConfigError(f"render.max_side must be >= 32, got {self.max_side}")
        if self.workers < 0:
            raise ConfigError(f"render.workers must be >= 0, got {self.workers}")
        if self.timeout_s <= 0:
            raise ConfigError(f"render.timeout_s must be > 0, got {self.timeout_s}")

    @property
    def worker_count(self) -> int:
        return self.workers or min(4, available_cpus())


@dataclass(frozen=True)
class CommitSpec:
    # A part file is committed every `every_pages` finished pages or `every_seconds`,
    # whichever comes first: at most that much work is lost to a SIGKILL.
    every_pages: int = 500
    every_seconds: float = 60.0

    def __post_init__(self):
        _positive(self, "every_pages", "every_seconds")


@dataclass(frozen=True)
class Shard:
    index: int = 0
    count: int = 1

    def __post_init__(self):
        if self.count < 1 or not 0 <= self.index < self.count:
            raise ConfigError(f"shard must be I/N with 0 <= I < N, got {self.index}/{self.count}")

    @classmethod
    def parse(cls, text: str) -> "Shard":
        try:
            i, n = text.split("/")
            return cls(int(i), int(n))
        except ValueError:
            raise ConfigError(f"shard must look like I/N (e.g. 3/16), got {text!r}") from None

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> "Shard | None":
        """Inside a Kubernetes Indexed Job: JOB_COMPLETION_INDEX / BATCHOCR_SHARDS."""
        index, count = env.get("JOB_COMPLETION_INDEX"), env.get("BATCHOCR_SHARDS")
        if index is None and count is None:
            return None
        try:
            return cls(int(index or 0), int(count or 1))
        except ValueError:
            raise ConfigError(
                f"JOB_COMPLETION_INDEX={index!r} / BATCHOCR_SHARDS={count!r} are not integers"
            ) from None

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


@dataclass(frozen=True)
class JobSpec:
    source: str
    out: str
    engine: str = "rapidocr"
    # Options of each engine, by engine name; only the chosen engine's are used.
    engines: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    render: RenderSpec = field(default_factory=RenderSpec)
    commit: CommitSpec = field(default_factory=CommitSpec)
    shard: Shard = field(default_factory=Shard)
    # fsspec storage options for SOURCE and OUT (credentials: never logged).
    storage_options: Mapping[str, Any] = field(default_factory=dict)
    # Per page: auto (a good text layer is taken, the rest go to the engine),
    # model (every page to the engine), textlayer (every page with a text layer
    # takes it). Only engines that read images route (batchocr/router.py).
    route: str = "auto"

    def __post_init__(self):
        if self.route not in ROUTES:
            raise ConfigError(f"unknown route {self.route!r}; choose one of {', '.join(ROUTES)}")
        if not self.source:
            raise ConfigError("no SOURCE given")
        if not self.out:
            raise ConfigError("no OUT given")
        if self.engine not in ENGINES:
            raise ConfigError(f"unknown engine {self.engine!r}; choose one of {', '.join(ENGINES)}")

    @property
    def engine_options(self) -> Mapping[str, Any]:
        return self.engines.get(self.engine, {})

    def public(self) -> dict:
        """The spec as plain data for _runs/*.json: storage options are left out (secrets)."""
        d = dataclasses.asdict(self)
        d["storage_options"] = sorted(self.storage_options)
        return d


def _positive(obj, *names):
    for name in names:
        value = getattr(obj, name)
        if value <= 0:
            raise ConfigError(f"{type(obj).__name__}.{name} must be > 0, got {value}")


def load_job(path: str | Path | None, **overrides: Any) -> JobSpec:
    """Read a job spec YAML (or nothing) and apply overrides (flags): a None override is unset.

    Override keys: source, out, engine, shard (Shard), storage_options, and dotted
    section keys such as "render.dpi" or "commit.every_pages".
    """
    raw: dict[str, Any] = {}
    if path is not None:
        try:
            text = Path(path).read_text()
        except OSError as exc:
            raise ConfigError(f"cannot read job spec {path}: {exc.strerror}") from None
        try:
            raw = yaml.safe_load(text) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"job spec {path} is not valid YAML: {exc}") from None
        if not isinstance(raw, dict):
            raise ConfigError(f"job spec {path} must be a mapping at the top level")
    where = str(path) if path else "job spec"

    known = {"source", "out", "engine", "engines", "render", "commit", "shard", "storage_options", "route"}
    unknown = set(raw) - known
    if unknown:
        raise ConfigError(f"{where}: unknown keys {sorted(unknown)}; known: {sorted(known)}")

    sections = {"render": dict(raw.get("render") or {}), "commit": dict(raw.get("commit") or {})}
    top = {k: raw[k] for k in ("source", "out", "engine", "route") if raw.get(k) is not None}
    storage = dict(raw.get("storage_options") or {})
    shard = Shard.parse(str(raw["shard"])) if raw.get("shard") is not None else None
    extra_engine_options: dict[str, Any] = {}
    for key, value in overrides.items():
        if value is None:
            continue
        if "." in key:
            section, name = key.split(".", 1)
            sections[section][name] = value
        elif key == "shard":
            shard = value
        elif key == "storage_options":
            storage.update(value)
        elif key == "engine_options":  # flags such as --model: into the chosen engine's section
            extra_engine_options.update(value)
        else:
            top[key] = value

    try:
        render = RenderSpec(**sections["render"])
        commit = CommitSpec(**sections["commit"])
    except TypeError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    engines = raw.get("engines") or {}
    if not isinstance(engines, dict) or not all(isinstance(v, dict) for v in engines.values()):
        raise ConfigError(f"{where}: 'engines' must map an engine name to its options")
    if extra_engine_options:
        name = top.get("engine", "rapidocr")
        engines = {**engines, name: {**engines.get(name, {}), **extra_engine_options}}
    return JobSpec(
        source=top.get("source", ""),
        out=top.get("out", ""),
        engine=top.get("engine", "rapidocr"),
        engines=engines,
        render=render,
        commit=commit,
        shard=shard or Shard(),
        storage_options=storage,
        route=top.get("route", "auto"),
    )

"""The job spec: typed once at the edge (YAML, flags, env), passed down whole.

Every source goes through `batchocr.config.convert`: the annotations below are the
validation (types, `Annotated` ranges, `Literal` choices), no key beyond the fields."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal, Mapping

import yaml
from annotated_types import Ge, Gt, Le

from batchocr.config import FORBID, convert
from batchocr.cpus import available_cpus
from batchocr.engines import NAMES as ENGINES  # the registered engine types
from batchocr.engines import options as engine_options
from batchocr.errors import ConfigError

ROUTES = ("auto", "model", "textlayer")


@dataclass(frozen=True)
class RenderSpec:
    __pydantic_config__ = FORBID
    # Resolution for PDF pages. Image files (PNG, JPEG, TIFF) keep their own pixels.
    dpi: Annotated[int, Gt(0)] = 200
    # If set, pages are scaled down so that their longest side is at most this many
    # pixels (VLM presets use it: olmOCR-2 wants 1288).
    max_side: Annotated[int, Ge(32)] | None = None
    # If set, both sides are rounded down to a multiple of this (a VLM's patch
    # grid, e.g. 28 for Qwen2.5-VL). VLM presets set max_side and size_multiple.
    size_multiple: Annotated[int, Gt(0)] | None = None
    # A page that would render to more pixels than this is scaled down to fit;
    # guards memory against absurd page sizes.
    max_pixels: Annotated[int, Gt(0)] = 40_000_000
    # An image (an image file, or one inside a PDF page) larger than this is refused
    # as `too_large` before it is decoded: decompression bombs.
    max_image_pixels: Annotated[int, Gt(0)] = 200_000_000
    # Render worker processes (PyMuPDF is not thread-safe). 0 = one per CPU, at most 4.
    workers: Annotated[int, Ge(0)] = 0
    # A render worker that makes no progress (starts no page, sends nothing) for this
    # long is killed, and its page recorded as `timeout`. Time it spent waiting for a CPU
    # (a busy or CPU-throttled node) does not count.
    timeout_s: Annotated[float, Gt(0)] = 300.0
    # Pages per Arrow record batch sent by a render worker.
    batch_pages: Annotated[int, Gt(0)] = 4

    @property
    def worker_count(self) -> int:
        return self.workers or min(4, available_cpus())


@dataclass(frozen=True)
class CommitSpec:
    # A part file is committed every `every_pages` finished pages or `every_seconds`,
    # whichever comes first: at most that much work is lost to a SIGKILL.
    __pydantic_config__ = FORBID
    every_pages: Annotated[int, Gt(0)] = 500
    every_seconds: Annotated[float, Gt(0)] = 60.0


@dataclass(frozen=True)
class Shard:
    __pydantic_config__ = FORBID
    index: int = 0
    count: int = 1

    def __post_init__(self):
        if self.count < 1 or not 0 <= self.index < self.count:
            raise ConfigError(f"shard must be I/N with 0 <= I < N, got {self.index}/{self.count}")

    @classmethod
    def parse(cls, text: str, where: str = "") -> "Shard":
        """`where`: the job spec's file the text is from, named first (a flag's needs none)."""
        at = f"{where}: " if where else ""
        i, sep, n = text.partition("/")
        if not sep:
            raise ConfigError(f"{at}shard must look like I/N (e.g. 3/16), got {text!r}")
        return convert(cls, {"index": i.strip(), "count": n.strip()}, f"{at}shard {text!r}", strings=True)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> "Shard | None":
        """Inside a Kubernetes Indexed Job: JOB_COMPLETION_INDEX / BATCHOCR_SHARDS."""
        names = ("JOB_COMPLETION_INDEX", "BATCHOCR_SHARDS")
        given = {name: env[name] for name in names if env.get(name)}
        if not given:
            return None
        if len(given) == 1:  # the count alone would be 1: every pod would take every document
            (have,), (lack,) = given, set(names) - set(given)
            raise ConfigError(f"environment: {have} is set but {lack} is not: set both (an Indexed Job's "
                              f"index and its completions) or neither")
        shard = convert(_EnvShard, given, "environment", strings=True)
        index, count = shard.JOB_COMPLETION_INDEX, shard.BATCHOCR_SHARDS
        if count < 1 or not 0 <= index < count:
            raise ConfigError(f"environment: JOB_COMPLETION_INDEX={index} BATCHOCR_SHARDS={count}: need "
                              f"0 <= JOB_COMPLETION_INDEX < BATCHOCR_SHARDS")
        return cls(index, count)

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


@dataclass(frozen=True)
class _EnvShard:
    """The shard as an Indexed Job's environment gives it (checked, then a Shard)."""

    __pydantic_config__ = FORBID
    JOB_COMPLETION_INDEX: int
    BATCHOCR_SHARDS: int


@dataclass(frozen=True)
class JobSpec:
    __pydantic_config__ = FORBID
    source: str
    out: str
    engine: Literal[ENGINES] = "rapidocr"
    # Options of each engine, by engine name; only the chosen engine's are used (all
    # are validated, by the engine's options dataclass).
    engines: Mapping[Literal[ENGINES], Mapping[str, Any]] = field(default_factory=dict)
    render: RenderSpec = field(default_factory=RenderSpec)
    commit: CommitSpec = field(default_factory=CommitSpec)
    shard: Shard = field(default_factory=Shard)
    # fsspec storage options for SOURCE and OUT (credentials: never logged).
    storage_options: Mapping[str, Any] = field(default_factory=dict)
    # Per page: auto (a good text layer is taken, the rest go to the engine),
    # model (every page to the engine), textlayer (every page with a text layer
    # takes it). Only engines that read images route (batchocr/router.py).
    route: Literal["auto", "model", "textlayer"] = "auto"
    # Price of one accelerator-hour (a GPU; for CPU engines the machine), for
    # `batchocr report`: dollars per million pages. `report --gpu-hourly-usd` overrides it.
    gpu_hourly_usd: Annotated[float, Ge(0)] | None = None
    # OUT remembers the settings that made its pages (batchocr/producer.py): a run
    # with others stops (exit 2) unless this is set; then their pages are redone.
    reprocess: bool = False
    # The shard as N parts side by side, each a process of its own (render pool, engine,
    # part files) over a share of its documents; vllm: each with 1/N of the GPU's memory
    # (batchocr/parts.py says why: one process is host-bound before the GPU is). auto: as
    # many as pay for the engine's model on this machine's GPU and host (vllm: the preset's
    # measured need, batchocr/engines/vllm/processes.py; other engines: 1).
    processes: Annotated[int, Ge(1), Le(8)] | Literal["auto"] = 1
    # Azure's blob inventory for SOURCE (its destination folder, or one rule's in it): each
    # run re-plans OUT from its newest Succeeded manifest first, once for all pods, keeping
    # every planned document on its shard (batchocr/replan.py). None: OUT's plan as it is.
    inventory: str | None = None

    def __post_init__(self):
        if self.route not in ROUTES:
            raise ConfigError(f"unknown route {self.route!r}; choose one of {', '.join(ROUTES)}")
        if not self.source:
            raise ConfigError("no SOURCE given: give `source:` in the job spec or SOURCE on the command line")
        if not self.out:
            raise ConfigError("no OUT given: give `out:` in the job spec or OUT on the command line")
        if self.engine not in ENGINES:
            raise ConfigError(f"unknown engine {self.engine!r}; choose one of {', '.join(ENGINES)}")

    @property
    def engine_options(self) -> Mapping[str, Any]:
        return self.engines.get(self.engine, {})

    def public(self) -> dict:
        """The spec as plain data for _runs/*.json: storage options are left out (secrets), and
        so are the credentials of a SOURCE or OUT URL (a SAS token's signature)."""
        from batchocr.storage import public_url

        d = dataclasses.asdict(self)
        d["storage_options"] = sorted(self.storage_options)
        d["source"], d["out"] = public_url(self.source), public_url(self.out)
        d["inventory"] = public_url(self.inventory) if self.inventory else None
        return d


def load_job(path: str | Path | None, **overrides: Any) -> JobSpec:
    """Read a job spec YAML (or nothing) and apply overrides (flags): a None override is unset.

    Override keys: source, out, engine, shard (Shard), storage_options, and dotted
    section keys such as "render.dpi" or "commit.every_pages".
    """
    raw: dict[str, Any] = {}
    if path is not None:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"cannot read job spec {path}: {exc.strerror}") from None
        except UnicodeDecodeError as exc:
            line = exc.object.count(b"\n", 0, exc.start) + 1
            raise ConfigError(f"{path}:{line}: not UTF-8 text (byte 0x{exc.object[exc.start]:02x}): "
                              f"save the job spec as UTF-8") from None
        try:
            raw = yaml.load(text, Loader=_Loader) or {}  # noqa: S506 - a SafeLoader
        except yaml.YAMLError as exc:
            raise ConfigError(_yaml_error(path, exc)) from None
        if not isinstance(raw, dict):
            raise ConfigError(f"job spec {path} must be a mapping at the top level")
    where = str(path) if path else "configuration"
    raw = {k: v for k, v in raw.items() if v is not None}  # `render:` with nothing under it: the defaults
    if isinstance(raw.get("shard"), str):
        raw["shard"] = Shard.parse(raw["shard"], where)
    elif "shard" in raw and not isinstance(raw["shard"], Mapping):  # `shard: 2`: the documented form is I/N
        raise ConfigError(f"{where}: shard: got {raw['shard']!r}, expected I/N (e.g. shard: 0/4)")

    # Flags over the file: a None override is unset.
    data = {**raw, "source": raw.get("source") or "", "out": raw.get("out") or ""}
    for key, value in overrides.items():
        if value is None:
            continue
        if "." in key:
            section, name = key.split(".", 1)
            data[section] = {**_mapping(data.get(section), section, where), name: value}
        elif key == "storage_options":
            data[key] = {**_mapping(data.get(key), key, where), **value}
        elif key == "engine_options":  # flags such as --model: into the chosen engine's section
            name = data.get("engine", "rapidocr")
            given = [k for k, v in value.items() if v is not None]
            if not given:  # no such flag: no section made for it (`engine: typo` got a second error)
                continue
            if name != "vllm":  # --model, --preset, --prompt, --mode are the vLLM engine's
                flags = " ".join(f"--{k}" for k in given)
                raise ConfigError(f"{flags}: for --engine vllm; this run's engine is {name}")
            engines = _mapping(data.get("engines"), "engines", where)
            data["engines"] = {**engines, name: {**_mapping(engines.get(name), f"engines.{name}", where), **value}}
        else:
            data[key] = value
    spec = convert(JobSpec, data, where)
    for name, options in spec.engines.items():  # every engine's section, typed by its options class
        engine_options(name, options, where, chosen=name == spec.engine)
    return spec


class _Loader(yaml.SafeLoader):
    """yaml.safe_load's loader, less two traps of YAML 1.1 that PyYAML keeps: a key given
    twice (`dpi: 150` ... `dpi: 300`) silently took the last value, now it is an error
    naming the key and both lines; and `1e3` (an exponent without a dot) was text, so
    `every_seconds: 1e3` failed as "not a number", now it is the number (YAML 1.2)."""

    def construct_mapping(self, node, deep=False):
        seen: dict[Any, Any] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *defaults`: no key, SafeLoader merges it
                continue
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, (str, int, float, bool)):  # not hashable, or no name: convert() says so
                continue
            if key in seen:
                from batchocr.config import key_name

                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key_name(key)!r} given twice (first at line {seen[key].line + 1})",
                    key_node.start_mark)
            seen[key] = key_node.start_mark
        return super().construct_mapping(node, deep=deep)


_Loader.yaml_implicit_resolvers = {k: list(v) for k, v in yaml.SafeLoader.yaml_implicit_resolvers.items()}
_Loader.add_implicit_resolver("tag:yaml.org,2002:float", re.compile(r"^[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+$"),
                              list("-+0123456789"))


def _yaml_error(path: str | Path, exc: yaml.YAMLError) -> str:
    """A YAML syntax error as one line, `FILE:LINE:COL: ...`: what is wrong and where,
    never the offending line itself (it may hold a secret: `account_key: '...`)."""
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark, what = exc.problem_mark, exc.problem
        if exc.context and exc.context_mark is not None:
            where = exc.context_mark
            what += f" ({exc.context} from line {where.line + 1}, column {where.column + 1})"
        return f"{path}:{mark.line + 1}:{mark.column + 1}: not valid YAML: {what}"
    return f"job spec {path} is not valid YAML: {str(exc).splitlines()[0]}"


def _mapping(value: Any, key: str, where: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where}: {key}: got {value!r}, expected a mapping of keys to values")
    return value

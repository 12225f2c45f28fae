"""The docs in the repo stay true: README's column table, error types, the example job."""

import dataclasses
import re

from batchocr import schema
from batchocr.engines.rapidocr import RapidOCROptions
from batchocr.engines.textlayer import TextLayerOptions
from batchocr.spec import CommitSpec, RenderSpec, load_job
from conftest import ROOT

README = (ROOT / "README.md").read_text()


def test_readme_documents_every_page_table_column_with_its_type():
    rows = re.findall(r"^\| `(\w+)` \| ([\w\[\], =<>:]+) \| (.+) \|$", README, re.M)
    documented: dict[str, tuple[str, str]] = {}
    for name, typ, meaning in rows:  # the first table naming a column is the column table
        if name in schema.PAGE_TABLE.names:
            documented.setdefault(name, (typ.strip(), meaning))
    assert list(documented) == schema.PAGE_TABLE.names
    for name, typ, meaning in schema.PAGE_TABLE_COLUMNS:
        assert documented[name] == (str(typ), meaning)


def test_readme_lists_every_error_type():
    documented = set(re.findall(r"^\| `(\w+)` \| (?:document|page)", README, re.M))
    assert documented == schema.ERROR_TYPES
    # The pipeline refuses to write any other (tests/test_bad_input.py sees them written).


def test_example_job_spec_loads_and_states_the_defaults():
    spec = load_job(ROOT / "jobs" / "example.yaml")
    assert spec.render == RenderSpec(**{**dataclasses.asdict(RenderSpec())})
    assert spec.commit == CommitSpec()
    assert RapidOCROptions(**spec.engines["rapidocr"]) == RapidOCROptions()
    assert TextLayerOptions(**spec.engines["textlayer"]) == TextLayerOptions()
    from batchocr.engines.vllm import VLLMOptions

    assert VLLMOptions(**spec.engines["vllm"]) == VLLMOptions(model=spec.engines["vllm"]["model"])


def test_readme_starts_with_the_two_commands():
    blocks = re.findall(r"```sh\n(.+?)\n```", README, re.S)
    assert "batchocr run samples/" in blocks[0] and "pip install ." in blocks[0]
    assert "pytest" in blocks[1]
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    commands = [line for line in ci if line.strip() and not line.startswith(("#", "set ", "cd "))]
    assert commands == [blocks[1]], ".ci/run must run exactly the README's test command, and nothing else"


def test_example_job_spec_names_every_key():
    """jobs/example.yaml says it documents every key: each field of the job spec, its
    sections and every engine's options is there (a top-level one may be commented out)."""
    import yaml

    from batchocr.engines.vllm import VLLMOptions
    from batchocr.spec import JobSpec

    text = (ROOT / "jobs" / "example.yaml").read_text()
    raw = yaml.safe_load(text)
    top = set(re.findall(r"^(?:# )?(\w+):", text, re.M))
    assert {f.name for f in dataclasses.fields(JobSpec)} <= top
    for section, cls in (("render", RenderSpec), ("commit", CommitSpec)):
        assert set(raw[section]) == {f.name for f in dataclasses.fields(cls)}, section
    for name, cls in (("rapidocr", RapidOCROptions), ("textlayer", TextLayerOptions), ("vllm", VLLMOptions)):
        assert set(raw["engines"][name]) == {f.name for f in dataclasses.fields(cls)}, name


def test_the_synopsis_of_run_names_every_option_run_takes():
    """README's "Using it" gives run's whole synopsis: each option `batchocr run --help` lists."""
    import click

    from batchocr.cli import main

    synopsis = re.search(r"## Using it\n\n```sh\n(batchocr run .+?)\nbatchocr plan ", README, re.S).group(1)
    options = [p.opts[0] for p in main.commands["run"].params if isinstance(p, click.Option)]
    assert len(options) > 10
    assert [o for o in options if not re.search(rf"\[{re.escape(o)}[ \]]", synopsis)] == []


def test_readme_tables_every_vllm_option_with_its_default():
    """The vLLM options table: a row for every key `engines: vllm:` takes, and nothing else."""
    from batchocr.engines.vllm import VLLMOptions

    table = re.search(r"#### Options \(`engines: vllm:` in the job spec\)\n.+?\n(\| option \| default .+?)\n\n", README,
                      re.S).group(1)
    rows = re.findall(r"^\| `(\w+)` \| ([^|]+) \| [^|]+ \| [^|]+ \|$", table, re.M)
    assert sorted(name for name, _ in rows) == sorted(f.name for f in dataclasses.fields(VLLMOptions))
    defaults = {f.name: f.default for f in dataclasses.fields(VLLMOptions) if f.default is not dataclasses.MISSING}
    for name, default in rows:  # a plain default is given as it is
        if isinstance(defaults.get(name), (int, float)) and not isinstance(defaults[name], bool) and defaults[name]:
            assert re.match(rf"`?{defaults[name]}\b", default.strip()), (name, default)

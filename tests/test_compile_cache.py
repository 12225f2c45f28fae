"""A compile cache filled once by `batchocr warm` and copied into each run's caches before its
engine builds (batchocr/engines/vllm/compilecache.py). The vLLM stand-in (tests/fake_vllm.py)
compiles as vLLM does on a first build: its graph into $XDG_CACHE_HOME/vllm, a kernel into
TRITON_CACHE_DIR, read back where they are there already; BATCHOCR_FAKE_COMPILE logs which."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import fake_vllm
import pytest

from batchocr.engines.vllm import compilecache

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = ROOT / "samples"


def _env(tmp_path: Path, home: str) -> dict:
    """A spawned CLI's environment: the stand-in as `vllm`, caches of its own under `home`
    (a pod's empty $HOME), its compiles logged, temporary folders under tmp_path/tmp."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("XDG_CACHE_HOME", "TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "VLLM_CACHE_ROOT")}
    (tmp_path / home).mkdir(exist_ok=True)
    (tmp_path / "tmp").mkdir(exist_ok=True)
    return env | {"PYTHONPATH": fake_vllm.pythonpath(tmp_path / "shim"), "TMPDIR": str(tmp_path / "tmp"),
                  "HOME": str(tmp_path / home), "BATCHOCR_FAKE_COMPILE": str(tmp_path / f"{home}.jsonl")}


def _spec(tmp_path: Path, cache: Path | None, processes: int = 2, name: str = "job.yaml", where: str = "") -> Path:
    """A job spec of the vLLM engine; `where`: its source, out and inventory (a pod's in Azure)."""
    spec = tmp_path / name
    spec.write_text(where + f"engine: vllm\nprocesses: {processes}\nroute: model\n"
                    "engines:\n  vllm:\n    model: fake-model\n    preset: unlimited-ocr\n    max_num_seqs: 8\n"
                    + (f"    compile_cache: {cache}\n" if cache else ""))
    return spec


def _cli(*args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "batchocr.cli", *args], env=env, capture_output=True, text=True,
                          timeout=600)


def _compiles(log: Path) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def test_warm_fills_the_cache_and_a_fresh_pods_parts_start_from_it(tmp_path):
    cache = tmp_path / "volume" / "compile-cache"
    # The pods' own job spec: its source, out and inventory are not the warm run's
    spec = _spec(tmp_path, cache, name="pods.yaml",
                 where="source: az://scans/\nout: az://results/scans\ninventory: az://inventory/scans\n")
    warmed = _cli("warm", str(cache), "--job", str(spec), "--pages", "20", "-q", env=_env(tmp_path, "warm-home"))
    assert warmed.returncode == 0, warmed.stderr
    assert f"warm: {cache} holds" in warmed.stdout and "read 20 generated pages (0 errors)" in warmed.stdout, warmed.stdout
    assert "batchocr-warm-" not in warmed.stdout + warmed.stderr  # its own temporary OUT is nobody's business
    # The warm run compiled from empty caches of its own (not the machine's $HOME), the second
    # part from what the first left; none of it was left in $HOME.
    built = _compiles(tmp_path / "warm-home.jsonl")
    assert [b["hit"] for b in built] == [False, True], built
    assert all(not b["root"].startswith(str(tmp_path / "warm-home")) for b in built), built
    assert Path(built[0]["triton"]).parent == Path(built[0]["vllm"]).parent == Path(built[0]["root"]), built
    made = json.loads((cache / compilecache.COMPLETE).read_text())
    assert made["pages"] == 20 and made["processes"] == 2 and made["vllm"] == "fake" and made["bytes"] > 4096, made
    # The root it compiled in is recorded: a folder of its own under the temporary folder, gone now
    assert made["root"] == built[0]["root"] and Path(made["root"]).name.startswith("batchocr-compile-"), made
    assert Path(made["root"]).parent == tmp_path / "tmp" and not Path(made["root"]).exists(), made
    assert list(cache.glob("vllm/torch_compile_cache/*/rank_0_0/computation_graph.py"))
    assert list(cache.glob("triton/*/kernel.cubin"))
    assert not list(cache.parent.glob(".*tmp")), list(cache.parent.iterdir())  # nothing half-written beside it

    # A pod: an empty $HOME, the volume read-only. Each part's engine finds the graph compiled.
    for path in [cache, *cache.rglob("*")]:
        path.chmod(path.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
    try:
        out = tmp_path / "out"
        ran = _cli("run", str(SAMPLES), str(out), "--job", str(_spec(tmp_path, cache)), "-q",
                   env=_env(tmp_path, "pod-home"))
    finally:
        for path in [cache, *cache.rglob("*")]:
            path.chmod(path.stat().st_mode | stat.S_IWUSR)
    assert ran.returncode == 0, ran.stderr
    # ... at the path it was compiled in, copied there again: the graphs read where they were compiled
    pod = _compiles(tmp_path / "pod-home.jsonl")
    assert [(b["hit"], b["same_path"]) for b in pod] == [(True, True), (True, True)], pod
    assert {b["vllm"] for b in pod} == {str(Path(made["root"]) / "vllm")}, pod
    assert {b["triton"] for b in pod} == {str(Path(made["root"]) / "triton")}, pod
    assert {b["inductor"] for b in pod} == {str(Path(made["root"]) / "inductor")}, pod
    said = [line for line in ran.stderr.splitlines() if line.startswith("compile cache:")]
    assert len(said) == 1 and f"{cache} copied to {made['root']}, where it was compiled" in said[0], ran.stderr
    assert "vLLM fake" in said[0], ran.stderr
    assert json.loads((Path(made["root"]) / compilecache.COMPLETE).read_text()) == made
    assert not list(Path(made["root"]).parent.glob(".*tmp"))

    # Another run on the same machine finds it there: nothing copied
    ran = _cli("run", str(SAMPLES), str(tmp_path / "out-next"), "--job", str(_spec(tmp_path, cache, 1)), "-q",
               env=_env(tmp_path, "next-home"))
    assert ran.returncode == 0, ran.stderr
    assert [(b["hit"], b["same_path"]) for b in _compiles(tmp_path / "next-home.jsonl")] == [(True, True)]
    said = [line for line in ran.stderr.splitlines() if line.startswith("compile cache:")]
    assert len(said) == 1 and f"{cache} already at {made['root']}, where it was compiled" in said[0], ran.stderr

    # The CronJob's next pods over the same OUT, nothing new: no engine to build, so no cache is
    # copied (in two parts or in one process alike)
    for processes in (2, 1):
        home = f"idle-{processes}-home"
        again = _cli("run", str(SAMPLES), str(out), "--job", str(_spec(tmp_path, cache, processes)), "-q",
                     env=_env(tmp_path, home))
        assert again.returncode == 0 and "nothing to do" in again.stdout, again.stdout + again.stderr
        assert "compile cache:" not in again.stderr, again.stderr
        assert not (tmp_path / home / ".cache" / "vllm").exists()


def test_a_cache_not_filled_yet_is_said_once_and_the_run_compiles(tmp_path):
    cache = tmp_path / "volume" / "compile-cache"
    cache.mkdir(parents=True)
    (cache / "vllm").mkdir()  # a warm run's copy cut short: no marker, never read
    ran = _cli("run", str(SAMPLES), str(tmp_path / "out"), "--job", str(_spec(tmp_path, cache, processes=1)), "-q",
               env=_env(tmp_path, "pod-home"))
    assert ran.returncode == 0, ran.stderr
    assert [b["hit"] for b in _compiles(tmp_path / "pod-home.jsonl")] == [False]
    said = [line for line in ran.stderr.splitlines() if line.startswith("compile cache:")]
    assert said == [f"compile cache: {cache} holds none yet (fill it with `batchocr warm`): vLLM compiles, "
                    f"a start of minutes"], ran.stderr


def test_warm_needs_the_vllm_engine_exit_2_in_one_line(tmp_path):
    spec = tmp_path / "job.yaml"
    spec.write_text("source: s\nout: o\nengine: rapidocr\n")
    proc = _cli("warm", str(tmp_path / "c"), "--job", str(spec), env=_env(tmp_path, "home"))
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0, proc.stderr
    assert "engine is rapidocr, expected vllm" in proc.stderr
    assert not (tmp_path / "c").exists()


def test_publish_replaces_an_older_cache_whole(tmp_path):
    old, new = tmp_path / "old-root", tmp_path / "new-root"
    (old / "vllm" / "a").mkdir(parents=True)
    (old / "vllm" / "a" / "graph").write_text("old")
    (new / "triton" / "b").mkdir(parents=True)
    (new / "triton" / "b" / "kernel").write_text("new")
    dest = tmp_path / "cache"
    assert compilecache.publish(old, str(dest), {"vllm": "1"}) == 3
    assert compilecache.publish(new, str(dest), {"vllm": "2"}) == 3
    assert sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file()) == [
        compilecache.COMPLETE, "triton/b/kernel"]
    assert json.loads((dest / compilecache.COMPLETE).read_text())["vllm"] == "2"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cache", "new-root", "old-root"]


def test_where_the_compiled_path_cannot_be_made_the_run_copies_into_its_own_root_and_says_why(tmp_path):
    cache = tmp_path / "volume" / "compile-cache"
    warmed = _cli("warm", str(cache), "--job", str(_spec(tmp_path, cache, 1, "pods.yaml", "source: s\nout: o\n")),
                  "--pages", "4", "-q", env=_env(tmp_path, "warm-home"))
    assert warmed.returncode == 0, warmed.stderr
    marker = cache / compilecache.COMPLETE
    made = json.loads(marker.read_text())
    (tmp_path / "a-file").write_text("")  # the recorded root under a file: it cannot be made
    marker.write_text(json.dumps(made | {"root": str(tmp_path / "a-file" / "cache")}))
    ran = _cli("run", str(SAMPLES), str(tmp_path / "out"), "--job", str(_spec(tmp_path, cache, 1)), "-q",
               env=_env(tmp_path, "pod-home"))
    assert ran.returncode == 0, ran.stderr
    own = tmp_path / "pod-home" / ".cache"
    # The graph is found but not at the path it was compiled at: the slower start
    assert [(b["hit"], b["same_path"], b["vllm"]) for b in _compiles(tmp_path / "pod-home.jsonl")] == [
        (True, False, str(own / "vllm"))]
    said = [line for line in ran.stderr.splitlines() if line.startswith("compile cache:")]
    assert len(said) == 1 and f"{cache} copied into {own} ({tmp_path / 'a-file' / 'cache'}, where it was compiled, " \
        "could not be made" in said[0] and "a slower start" in said[0], ran.stderr


def test_place_shares_the_root_with_a_run_beside_it_and_leaves_anything_else_alone(tmp_path):
    (tmp_path / "made" / "vllm").mkdir(parents=True)
    (tmp_path / "made" / "vllm" / "g").write_text("x")
    src = tmp_path / "cache"
    compilecache.publish(tmp_path / "made", str(src), {"root": str(tmp_path / "at")})
    made = json.loads((src / compilecache.COMPLETE).read_text())
    assert compilecache.place(src, made) == (tmp_path / "at", "")
    assert (tmp_path / "at" / "vllm" / "g").read_text() == "x"
    assert compilecache.place(src, made) == (tmp_path / "at", "there")  # a second run: nothing copied
    assert compilecache.place(src, made | {"made_at": "later"}) == (None, "holds something else")
    assert compilecache.place(src, made | {"root": "relative/cache"}) == (None, "is not an absolute path")
    assert compilecache.place(src, {k: v for k, v in made.items() if k != "root"}) == (None, "")
    env: dict = {"VLLM_CACHE_ROOT": "/set/by/hand"}
    compilecache.at_root(tmp_path / "at", env)
    assert env == {"VLLM_CACHE_ROOT": str(tmp_path / "at" / "vllm"), "TRITON_CACHE_DIR": str(tmp_path / "at" / "triton"),
                   "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "at" / "inductor")}


def test_seed_puts_every_cache_under_one_root_unless_placed(tmp_path):
    src = tmp_path / "cache"
    (tmp_path / "made" / "inductor").mkdir(parents=True)
    (tmp_path / "made" / "inductor" / "fx").write_text("x")
    compilecache.publish(tmp_path / "made", str(src), {"vllm": "v", "gpu": "G"})
    lines: list[str] = []
    env = {"XDG_CACHE_HOME": str(tmp_path / "xdg"), "TRITON_CACHE_DIR": str(tmp_path / "elsewhere")}
    assert compilecache.seed(str(src), env, lines.append)
    assert env["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "xdg" / "inductor")
    assert env["TRITON_CACHE_DIR"] == str(tmp_path / "elsewhere")  # a place given stays
    assert (tmp_path / "xdg" / "inductor" / "fx").read_text() == "x"
    assert not (tmp_path / "xdg" / compilecache.COMPLETE).exists()
    assert len(lines) == 1 and "vLLM v on G" in lines[0], lines


@pytest.mark.parametrize("broken", ["marker", "in the way"])
def test_a_cache_that_cannot_be_read_is_compiled_past(tmp_path, broken):
    src = tmp_path / "cache"
    (tmp_path / "made" / "vllm").mkdir(parents=True)
    (tmp_path / "made" / "vllm" / "g").write_text("x")
    compilecache.publish(tmp_path / "made", str(src), {})
    if broken == "marker":
        (src / compilecache.COMPLETE).write_text("{not json")
    else:  # a file where the cache has a folder: the copy fails part-way
        (tmp_path / "xdg").mkdir()
        (tmp_path / "xdg" / "vllm").write_text("a file")
    lines: list[str] = []
    assert not compilecache.seed(str(src), {"XDG_CACHE_HOME": str(tmp_path / "xdg")}, lines.append)
    assert len(lines) == 1 and "could not be copied" in lines[0] and "vLLM compiles" in lines[0], lines


def test_a_cache_in_a_url_is_exit_2_naming_the_key(tmp_path):
    spec = tmp_path / "job.yaml"
    spec.write_text("source: s\nout: o\nengine: vllm\nengines:\n  vllm:\n    model: m\n"
                    "    compile_cache: az://models/.compile-cache\n")
    proc = _cli("run", "--job", str(spec), env=_env(tmp_path, "home"))
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stderr.startswith("Error: ") and "engines.vllm.compile_cache" in proc.stderr and "local folder" in proc.stderr

"""`processes: auto` (batchocr/engines/vllm/processes.py): as many processes as pay for the preset's
model on this machine's GPU and host; one where one engine keeps a GPU busy, or there is no GPU.
The GPU is asked of nvidia-smi: here a script of that name on PATH answers as a card would."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from batchocr.engines.vllm import processes
from batchocr.pipeline import resolve_processes
from batchocr.spec import load_job
from conftest import H100, SAMPLES, count_pages, nvidia_smi, sample_documents

H200 = "NVIDIA H200, 143771"
UOCR = {"model": "/models/uocr", "preset": "unlimited-ocr"}


@pytest.fixture
def host(monkeypatch):
    """The host's CPUs and memory as the rule reads them."""
    def set_(cpus: int, gib: float | None):
        monkeypatch.setattr(processes, "available_cpus", lambda: cpus)
        monkeypatch.setattr(processes, "available_memory_gib", lambda: gib)
    set_(16, 96.0)  # the AKS pod's requests (k8s/base/job.yaml)
    return set_


def test_a_host_bound_model_gets_as_many_processes_as_the_card_holds(tmp_path, host):
    n, why = processes.auto(UOCR, nvidia_smi(tmp_path, H100))
    assert n == 2, why
    assert why == ("unlimited-ocr's engine core is its limit: NVIDIA H100 80GB HBM3 (80 GiB x 0.9) holds 2 of 30 GiB; "
                   "16 CPUs carry 4, 96 GiB of memory 4; at most 3")
    assert processes.auto(UOCR, nvidia_smi(tmp_path, H200))[0] == 3  # 4 fit: the most measured to pay is 3
    # a smaller share of the card holds fewer
    assert processes.auto(UOCR | {"gpu_memory_utilization": 0.4}, nvidia_smi(tmp_path, H100))[0] == 1


def test_the_hosts_cpus_and_memory_bound_the_processes_too(tmp_path, host):
    host(8, 96.0)
    assert processes.auto(UOCR, nvidia_smi(tmp_path, H200))[0] == 2
    host(16, 48.0)
    assert processes.auto(UOCR, nvidia_smi(tmp_path, H200))[0] == 2
    host(2, 16.0)  # below one process's share of both: still one
    assert processes.auto(UOCR, nvidia_smi(tmp_path, H200))[0] == 1
    host(16, None)  # memory unknown: the GPU and CPUs decide
    assert processes.auto(UOCR, nvidia_smi(tmp_path, H200))[0] == 3


def test_one_process_where_one_engine_fills_the_gpu_or_there_is_none(tmp_path, host):
    assert processes.auto({"model": "/m", "preset": "qwen2.5-vl"}, nvidia_smi(tmp_path, H200)) == (
        1, "one qwen2.5-vl engine keeps a GPU busy")
    assert processes.auto(UOCR | {"instances": 2}, nvidia_smi(tmp_path, H200))[0] == 1
    assert processes.auto(UOCR | {"tensor_parallel_size": 2}, nvidia_smi(tmp_path, H200)) == (
        1, "engines.vllm.tensor_parallel_size 2 spreads one engine over several GPUs")
    no_smi = {"PATH": str(tmp_path / "empty")}
    assert processes.auto(UOCR, no_smi) == (1, "no GPU found (nvidia-smi)")
    assert processes.auto(UOCR, nvidia_smi(tmp_path, None)) == (1, "no GPU found (nvidia-smi)")  # it failed
    assert processes.auto(UOCR, nvidia_smi(tmp_path, H200) | {"CUDA_VISIBLE_DEVICES": ""})[0] == 1


def test_the_card_asked_for_is_the_first_this_process_may_use(tmp_path):
    env = nvidia_smi(tmp_path, H200)
    assert processes.card(env | {"CUDA_VISIBLE_DEVICES": "3,1"}) == processes.Card("NVIDIA H200", 143771 / 1024)
    assert processes.card(env) is not None
    calls = (tmp_path / "smi-args").read_text().splitlines()
    assert calls == ["--query-gpu=name,memory.total --format=csv,noheader,nounits --id=3",
                     "--query-gpu=name,memory.total --format=csv,noheader,nounits"]


def test_a_spec_asking_auto_runs_the_number_said_in_one_line(tmp_path):
    said = []
    spec = load_job(None, source=str(SAMPLES), out=str(tmp_path / "out"), processes="auto")
    assert resolve_processes(spec, say=said.append).processes == 1  # rapidocr: its threads use the CPUs
    assert said == ["processes auto: 1 (its engine uses the machine alone)"]


def test_run_processes_auto_with_vllm_parts(tmp_path):
    """A whole command on the vLLM stand-in with an H100's nvidia-smi: the parent says how many
    and why, and that many parts each write a run record; every page one row. This machine's
    CPUs and memory bound the number as a pod's would."""
    from batchocr.cpus import available_cpus, available_memory_gib
    import fake_vllm

    expected = max(1, min(3, 2, available_cpus() // 4, int(available_memory_gib() // 20)))
    env = {**os.environ, **nvidia_smi(tmp_path, H100),
           "PYTHONPATH": fake_vllm.pythonpath(tmp_path / "shim")}
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "batchocr.cli", "run", str(SAMPLES), str(out), "--engine", "vllm",
                           "--model", "fake-model", "--preset", "unlimited-ocr", "--route", "model",
                           "--processes", "auto", "-q"], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    (line,) = [x for x in proc.stderr.splitlines() if x.startswith("processes auto:")]
    assert line.startswith(f"processes auto: {expected} (unlimited-ocr's engine core is its limit: "
                           "NVIDIA H100 80GB HBM3 (80 GiB x 0.9) holds 2 of 30 GiB;"), line
    records = [json.loads(r.read_text()) for r in (out / "_runs").glob("*.json")]
    assert len(records) == expected
    import pyarrow.parquet as pq

    table = pq.read_table(out / "pages")
    keys = list(zip(table.column("doc_id").to_pylist(), table.column("page_index").to_pylist()))
    assert len(keys) == len(set(keys)) == sum(count_pages(p) for p in sample_documents())


def test_parts_share_the_card_less_what_each_engine_but_one_takes_beyond_vllms_profile(tmp_path, monkeypatch):
    """Unlimited-OCR's engine takes GiBs beyond the memory vLLM's start-up profile counts
    (`beyond_profile_gib`): one engine's fits in the card's memory beyond gpu_memory_utilization,
    and n engines sharing it leave it to each of the others, so that together they peak where one
    would alone."""
    from batchocr import engines
    from batchocr.engines.vllm.presets import get_preset
    from batchocr.errors import ConfigError

    extra = get_preset("unlimited-ocr").beyond_profile_gib
    assert extra > 0
    monkeypatch.setenv("PATH", nvidia_smi(tmp_path, H100)["PATH"])
    gib = 81559 / 1024
    for n in (2, 3):
        share = engines.shared("vllm", UOCR, n)["gpu_memory_utilization"]
        assert share < 0.9 / n
        assert n * (share * gib + extra) == pytest.approx(0.9 * gib + extra, abs=0.05)  # share rounded to 1e-4
    assert engines.shared("vllm", UOCR, 1)["gpu_memory_utilization"] == 0.9
    # a model without such a figure, the KV's size given, or no card to size it on: 1/n as before
    assert engines.shared("vllm", UOCR | {"preset": "deepseek-ocr"}, 2)["gpu_memory_utilization"] == 0.45
    assert engines.shared("vllm", UOCR | {"kv_cache_gib": 20}, 2)["gpu_memory_utilization"] == 0.45
    # more engines than the card holds so: a configuration error naming the key (exit 2)
    with pytest.raises(ConfigError, match=r"^processes: 8 unlimited-ocr engines do not fit NVIDIA H100 80GB HBM3 "):
        engines.shared("vllm", UOCR, 8)
    monkeypatch.setenv("PATH", nvidia_smi(tmp_path, None)["PATH"])
    assert engines.shared("vllm", UOCR, 2)["gpu_memory_utilization"] == 0.45


def test_a_run_of_more_parts_than_the_card_holds_is_exit_2_in_one_line(tmp_path):
    import shutil

    import fake_vllm

    src = tmp_path / "src"  # 8 documents: 8 parts
    src.mkdir()
    for i in range(8):
        shutil.copy(sample_documents()[0], src / f"{i}{sample_documents()[0].suffix}")
    env = {**os.environ, **nvidia_smi(tmp_path, H100), "PYTHONPATH": fake_vllm.pythonpath(tmp_path / "shim")}
    proc = subprocess.run([sys.executable, "-m", "batchocr.cli", "run", str(src), str(tmp_path / "out"),
                           "--engine", "vllm", "--model", "fake-model", "--preset", "unlimited-ocr",
                           "--processes", "8", "-q"], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("Error: processes: 8 unlimited-ocr engines do not fit NVIDIA H100 80GB HBM3 at "
                           "gpu_memory_utilization 0.9"), line


def test_parts_get_the_kv_their_share_leaves_and_build_at_once(tmp_path, monkeypatch):
    """Where the preset knows what an engine holds besides its KV (`non_kv_gib`, at the default
    batch sizes), each of n parts gets the KV its share of the card leaves, as vLLM's
    kv_cache_memory_bytes: no engine measures free memory (one measuring beside a running engine
    counts that engine's growth as its own use and takes less KV), and the parts build at once."""
    from batchocr import engines
    from batchocr.engines.vllm.presets import get_preset
    from batchocr.errors import ConfigError

    non_kv = get_preset("unlimited-ocr").non_kv_gib
    assert non_kv
    monkeypatch.setenv("PATH", nvidia_smi(tmp_path, H100)["PATH"])
    gib = 81559 / 1024
    one = engines.shared("vllm", UOCR, 2)
    assert one["kv_cache_gib"] == pytest.approx(one["gpu_memory_utilization"] * gib - non_kv, abs=0.01)
    assert 16.5 * 1e9 / 2**30 < one["kv_cache_gib"] < 0.45 * gib - non_kv  # 256 pages' KV fits; within 1/2 of 0.9
    assert engines.starts_alone("vllm", one) is False
    assert engines.starts_alone("vllm", UOCR) is True  # one engine measures what it has
    assert "kv_cache_gib" not in engines.shared("vllm", UOCR, 1)
    # batches other than those the figure holds for (document mode's requests hold several images;
    # larger batch sizes), a preset without the figure:
    # vLLM measures, the parts in turn
    for options in (UOCR | {"max_num_batched_tokens": 32768}, UOCR | {"engine_args": {"max_num_seqs": 512}},
                    UOCR | {"engine_args": {"gpu_memory_utilization": 0.8}}, UOCR | {"preset": "deepseek-ocr"},
                    UOCR | {"mode": "document"}):
        part = engines.shared("vllm", options, 2)
        assert "kv_cache_gib" not in part and engines.starts_alone("vllm", part), options
    assert engines.shared("vllm", UOCR | {"max_num_seqs": 128}, 2)["kv_cache_gib"] == one["kv_cache_gib"]
    assert engines.shared("vllm", UOCR | {"kv_cache_gib": 20}, 2)["kv_cache_gib"] == 10
    # a share that leaves no KV: exit 2 naming the key
    with pytest.raises(ConfigError, match=r"^processes: 3 unlimited-ocr engines do not fit NVIDIA H100 80GB HBM3 at "
                                          r"gpu_memory_utilization 0.5 \(each holds 11.5 GiB besides its KV\)"):
        engines.shared("vllm", UOCR | {"gpu_memory_utilization": 0.5}, 3)
    monkeypatch.setenv("PATH", nvidia_smi(tmp_path, None)["PATH"])  # no card to size it on
    part = engines.shared("vllm", UOCR, 2)
    assert "kv_cache_gib" not in part and engines.starts_alone("vllm", part)

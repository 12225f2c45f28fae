"""Azurite, Microsoft's Azure Storage emulator (npm package `azurite`, which
tests/tools.py installs into the git-ignored .tools/ on first use), for tests and benchmarks: its blob service on a free loopback port, in a
temp folder. Everything talks to it through an explicit connection string: with an
account name alone the SDK falls back to DefaultAzureCredential, which probes
addresses off this machine and stalls."""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path
from typing import Iterable

import pytest

import tools

ACCOUNT = "devstoreaccount1"
# Azurite's published development key (the same in every Azurite): not a secret
# anywhere, but the redaction tests treat it as one.
KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


def connection_string(port: int, key: str = KEY) -> str:
    return (f"DefaultEndpointsProtocol=http;AccountName={ACCOUNT};AccountKey={key};"
            f"BlobEndpoint=http://127.0.0.1:{port}/{ACCOUNT};")


def executable() -> str:
    return tools.azurite_blob()


class Azurite:
    """A running Azurite blob service; `stop()` ends it."""

    def __init__(self, folder: Path):
        folder.mkdir(parents=True, exist_ok=True)
        self.log = (folder / "azurite.log").open("w+")
        self.process = subprocess.Popen(
            # Blobs in memory (1.6x the uploads per second of disk); the temp folder is its
            # working directory (Azurite refuses --location with --inMemoryPersistence).
            [executable(), "--blobHost", "127.0.0.1", "--blobPort", "0", "--inMemoryPersistence",
             "--skipApiVersionCheck", "--disableTelemetry", "--silent"],
            stdout=self.log, stderr=subprocess.STDOUT, cwd=folder)
        self.port = self._wait_for_port()
        self.connection_string = connection_string(self.port)

    def _wait_for_port(self, timeout: float = 60) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.log.seek(0)
            found = re.search(r"listens on http://127\.0\.0\.1:(\d+)", self.log.read())
            if found:
                return int(found.group(1))
            if self.process.poll() is not None:
                break
            time.sleep(0.1)
        self.log.seek(0)
        output = self.log.read()
        self.stop()
        raise RuntimeError(f"Azurite did not start:\n{output}")

    def options(self, **extra) -> dict:
        """Storage options for batchocr: the explicit connection string."""
        return {"connection_string": self.connection_string, **extra}

    def client(self, port: int | None = None):
        from azure.storage.blob import BlobServiceClient

        return BlobServiceClient.from_connection_string(connection_string(port or self.port))

    def container(self, name: str):
        """A new, empty container (any earlier one of that name is deleted first)."""
        service = self.client()
        if service.get_container_client(name).exists():
            service.delete_container(name)
        return service.create_container(name)

    def upload(self, container: str, files: Iterable[Path], prefix: str = "") -> None:
        cc = self.client().get_container_client(container)
        for path in files:
            cc.upload_blob(f"{prefix}{path.name}", path.read_bytes(), overwrite=True)

    def blobs(self, container: str, prefix: str = "") -> dict[str, bytes]:
        cc = self.client().get_container_client(container)
        return {b.name: cc.download_blob(b.name).readall() for b in cc.list_blobs(name_starts_with=prefix or None)}

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()


@pytest.fixture(scope="session")
def azurite(tmp_path_factory):
    try:
        tools.azurite_blob()
    except tools.Unavailable as e:
        pytest.skip(str(e))
    server = Azurite(tmp_path_factory.mktemp("azurite"))
    yield server
    server.stop()

"""Azure Blob behind the storage seam: az://container/prefix (also abfs://, abfss://)
through adlfs. Only batchocr/storage.py imports this module, and only for such URLs.

What adlfs leaves to us, and why each piece is here:
- credentials in batchocr's documented order (adlfs lets AZURE_STORAGE_CONNECTION_STRING
  override a key given explicitly, and hands unknown options to DefaultAzureCredential);
- the SDK's own retry policy, configured (adlfs keeps the SDK default: 15 s before the
  first retry, 3 retries), and downloads whose reply broke off mid-body read again as
  often as it says (the SDK's downloader tries such a reply 3 times, whatever the policy);
- a listing that streams page by page (adlfs lists a whole folder into a list);
- errors that say what to change and never carry a secret;
- polars' own Azure client (object_store) wants account_name/account_key/endpoint,
  not a connection string: `polars_options` translates.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import errno
import logging
import os
from dataclasses import dataclass, field
from typing import Annotated, Any, Iterator, Mapping

from adlfs import AzureBlobFileSystem
from adlfs.spec import AzureBlobFile
from annotated_types import Ge
from azure.core.exceptions import (AzureError, ClientAuthenticationError, DecodeError, HttpResponseError,
                                   IncompleteReadError, ResourceNotFoundError,
                                   ServiceResponseError)
from fsspec.asyn import sync, sync_wrapper

from batchocr import __version__
from batchocr.config import FORBID, convert
from batchocr.errors import BatchocrError, ConfigError, StorageError, Unreadable
from batchocr.storage import AZURE_PROTOCOLS as PROTOCOLS  # the first is how batchocr writes URIs

# Retries and timeouts of the Azure SDK's ExponentialRetry and transport; each one is
# also a storage option (`--storage-option retry_total=10`). The n-th retry waits
# backoff + base**n s (1 + 2, 1 + 4, ... 1 + 64 s, +-jitter): 6 retries span about two minutes.
RETRY_DEFAULTS: dict[str, float] = {
    "retry_total": 6,  # retries of one request (connection errors, dropped responses, 408/5xx)
    "retry_backoff": 1.0,  # seconds: initial_backoff
    "retry_backoff_base": 2.0,  # increment_base
    "retry_jitter": 0.5,  # random_jitter_range, seconds either side
    "connection_timeout": 20.0,  # seconds to connect
    "read_timeout": 60.0,  # seconds of silence from the server while reading
}
# How to reach the account. Credentials: at most one of these three in storage options.
ACCOUNT_KEYS = ("account_name", "account_host")
CREDENTIAL_KEYS = ("connection_string", "account_key", "sas_token")

# Blobs per listing request: one page is all the listing ever holds (Azure allows 5,000).
LIST_PAGE = 1000

# The SDK's transport logs a bare "Incomplete download." each time a reply breaks off, which
# batchocr reads again (BlobFileSystem.read_again) and reports itself if it stays broken: with no
# logging configured, Python would print each one on stderr with no blob named.
logging.getLogger("azure.core.pipeline.transport").setLevel(logging.ERROR)
# DefaultAzureCredential logs each credential it tried (80-odd lines, on stderr) before failing;
# batchocr says in one line what is missing (AzureBackend.explain).
logging.getLogger("azure.identity").setLevel(logging.ERROR)


@dataclass(frozen=True, repr=False)
class Credentials:
    """Where the account is and how to sign in, resolved in the documented order."""

    origin: str  # for messages: which storage option or variable they came from
    account_name: str | None = None
    account_host: str | None = None  # a custom blob endpoint host; default <account>.blob.core.windows.net
    connection_string: str | None = None
    account_key: str | None = None
    sas_token: str | None = None
    # Neither of the three: DefaultAzureCredential (workload identity in a pod, managed
    # identity, AZURE_CLIENT_ID/SECRET/TENANT_ID, az login).

    def __repr__(self) -> str:  # never the secrets
        return f"Credentials(origin={self.origin!r}, account_name={self.account_name!r})"

    @property
    def uses_default_credential(self) -> bool:
        return not (self.connection_string or self.account_key or self.sas_token)

    @property
    def secrets(self) -> tuple[str, ...]:
        """Every secret string these credentials hold, for redaction."""
        found = [self.connection_string, self.account_key, self.sas_token]
        if self.connection_string:
            parts = parse_connection_string(self.connection_string, self.origin)
            found += [parts.get("accountkey"), parts.get("sharedaccesssignature")]
        if self.sas_token:
            found.append(self.sas_token.lstrip("?"))
        return tuple(s for s in found if s)

    def token(self) -> tuple:
        """Plain values for the filesystem's constructor (so fsspec can cache instances)."""
        return (self.origin, self.account_name, self.account_host, self.connection_string, self.account_key,
                self.sas_token)


@dataclass(frozen=True, repr=False)
class AzureOptions:
    """The Azure storage options, typed by batchocr.config like all configuration
    (values from --storage-option are text: numbers are parsed)."""

    __pydantic_config__ = FORBID
    account_name: str | None = None
    account_host: str | None = None
    connection_string: str | None = None
    account_key: str | None = None
    sas_token: str | None = None
    retry_total: Annotated[int, Ge(0)] = RETRY_DEFAULTS["retry_total"]  # a count: 2.5 is refused, not cut to 2
    retry_backoff: Annotated[float, Ge(0)] = RETRY_DEFAULTS["retry_backoff"]
    retry_backoff_base: Annotated[float, Ge(0)] = RETRY_DEFAULTS["retry_backoff_base"]
    retry_jitter: Annotated[float, Ge(0)] = RETRY_DEFAULTS["retry_jitter"]
    connection_timeout: Annotated[float, Ge(0)] = RETRY_DEFAULTS["connection_timeout"]
    read_timeout: Annotated[float, Ge(0)] = RETRY_DEFAULTS["read_timeout"]


def parse_connection_string(text: str, origin: str) -> dict[str, str]:
    """`Key=Value;...` with keys lower-cased; ConfigError (without the text) if malformed."""
    parts: dict[str, str] = {}
    for item in text.strip().strip(";").split(";"):
        key, sep, value = item.strip().partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"the connection string from {origin} is malformed: expected Key=Value pairs "
                              "separated by ';' (AccountName and AccountKey, or BlobEndpoint and SharedAccessSignature)")
        parts[key.strip().lower()] = value.strip()
    if parts.get("usedevelopmentstorage", "").lower() == "true":
        return parts
    if not ("accountname" in parts or "blobendpoint" in parts):
        raise ConfigError(f"the connection string from {origin} names no AccountName or BlobEndpoint")
    return parts


def _check_key(key: str, origin: str) -> None:
    try:
        base64.b64decode(key, validate=True)
    except (binascii.Error, ValueError):
        raise ConfigError(f"the account key from {origin} is not valid base64 (copy it whole from the portal)") from None


def resolve(options: Mapping[str, Any], env: Mapping[str, str] = os.environ, url_account: str | None = None
            ) -> tuple[Credentials, dict[str, float]]:
    """Credentials in order: storage options (job spec or --storage-option), then
    AZURE_STORAGE_CONNECTION_STRING, AZURE_STORAGE_ACCOUNT_KEY, AZURE_STORAGE_SAS_TOKEN,
    else DefaultAzureCredential. Returns them and the retry settings."""
    typed = convert(AzureOptions, options, "Azure storage options", strings=True, secret=CREDENTIAL_KEYS)
    retry = {key: getattr(typed, key) for key in RETRY_DEFAULTS}
    account = options.get("account_name") or url_account or env.get("AZURE_STORAGE_ACCOUNT_NAME") or None
    host = options.get("account_host") or None
    given = [k for k in CREDENTIAL_KEYS if options.get(k)]
    if len(given) > 1:
        raise ConfigError(f"storage options give {' and '.join(given)} (more than one credential): give one")
    if given:
        key = given[0]
        creds = Credentials(f"storage option {key}", account, host, **{key: str(options[key])})
    elif env.get("AZURE_STORAGE_CONNECTION_STRING"):
        creds = Credentials("AZURE_STORAGE_CONNECTION_STRING", account, host,
                            connection_string=env["AZURE_STORAGE_CONNECTION_STRING"])
    elif env.get("AZURE_STORAGE_ACCOUNT_KEY"):
        creds = Credentials("AZURE_STORAGE_ACCOUNT_KEY", account, host, account_key=env["AZURE_STORAGE_ACCOUNT_KEY"])
    elif env.get("AZURE_STORAGE_SAS_TOKEN"):
        creds = Credentials("AZURE_STORAGE_SAS_TOKEN", account, host, sas_token=env["AZURE_STORAGE_SAS_TOKEN"])
    else:
        creds = Credentials("DefaultAzureCredential", account, host)
    if creds.connection_string:
        parts = parse_connection_string(creds.connection_string, creds.origin)
        if parts.get("accountkey"):
            _check_key(parts["accountkey"], creds.origin)
    elif not creds.account_name:
        raise ConfigError(f"Azure credentials from {creds.origin} need the storage account's name: "
                          "--storage-option account_name=NAME (or storage_options.account_name in the job spec, "
                          "or AZURE_STORAGE_ACCOUNT_NAME)")
    if creds.account_key:
        _check_key(creds.account_key, creds.origin)
    return creds, retry


class BlobFileSystem(AzureBlobFileSystem):
    """adlfs with batchocr's credentials and the SDK's retry policy configured.

    Its client is made here, not by adlfs: adlfs reads AZURE_STORAGE_* itself and
    would let the environment's connection string win over options given explicitly.
    """

    protocol = PROTOCOLS

    def __init__(self, *, credentials: tuple, retry: tuple, **kwargs):
        self._credentials = Credentials(*credentials)
        self._retry = dict(retry)
        # anon=True: adlfs must not build credentials of its own (do_connect below does).
        # No listings cache: a resumed shard must see parts committed a moment ago.
        super().__init__(account_name=self._credentials.account_name, anon=True, assume_container_exists=False,
                         use_listings_cache=False, **kwargs)

    def do_connect(self) -> None:
        from azure.storage.blob.aio import BlobServiceClient, ExponentialRetry

        creds, r = self._credentials, self._retry
        total = int(r["retry_total"])
        self._retry_policy = ExponentialRetry(
            initial_backoff=r["retry_backoff"], increment_base=r["retry_backoff_base"],
            random_jitter_range=r["retry_jitter"], retry_total=total,
            retry_connect=total, retry_read=total, retry_status=total,
        )
        client_kwargs: dict[str, Any] = {
            "retry_policy": self._retry_policy,
            "connection_timeout": r["connection_timeout"],
            "read_timeout": r["read_timeout"],
            "user_agent": f"batchocr/{__version__}",
        }
        if creds.connection_string:
            self.service_client = BlobServiceClient.from_connection_string(creds.connection_string, **client_kwargs)
            return
        url = f"https://{creds.account_host or f'{creds.account_name}.blob.core.windows.net'}"
        if creds.account_key:
            credential: Any = {"account_name": creds.account_name, "account_key": creds.account_key}
        elif creds.sas_token:
            credential = creds.sas_token.lstrip("?")
        else:
            from azure.identity.aio import DefaultAzureCredential

            # In a pod with workload identity: AZURE_CLIENT_ID, AZURE_TENANT_ID and
            # AZURE_FEDERATED_TOKEN_FILE, injected by the webhook, are all it needs.
            credential = self.credential = DefaultAzureCredential()
        self.service_client = BlobServiceClient(url, credential=credential, **client_kwargs)

    async def read_again(self, download):
        """await download() again while its reply breaks off mid-body, up to retry_total
        times, waiting as the retry policy does between requests. The SDK's downloader
        reads a broken reply's range 3 times and then gives up (azure-storage-blob
        12.31 aio/_download_async.py, a fixed `retry_total = 3`), so on a network that
        resets connections, one blob among thousands fails while `retry_total` (10,
        say) promised more: seen in CI, a quarter of requests reset."""
        total = int(self._retry["retry_total"])
        for count in range(total + 1):
            try:
                return await download()
            except HttpResponseError as err:
                if not _cut_off(err) or count == total:
                    raise
            await asyncio.sleep(self._retry_policy.get_backoff_time({"count": count + 1}))

    async def _cat_file(self, path, start=None, end=None, max_concurrency=None, **kwargs):
        cat_file = super()._cat_file
        return await self.read_again(lambda: cat_file(path, start, end, max_concurrency, **kwargs))

    def _open(self, path: str, mode: str = "rb", block_size: int | None = None, **kwargs):
        """adlfs's file, its ranged reads (Store.read_parquet) read again like _cat_file.
        (adlfs's _open also refuses version_id on a filesystem not version aware:
        batchocr names no versions.)"""
        return _BlobFile(fs=self, path=path, mode=mode, block_size=block_size or self.blocksize, **kwargs)


class _BlobFile(AzureBlobFile):
    async def _async_fetch_range(self, start: int, end: int | None = None, **kwargs):
        """A blob deleted since it was opened (a part `batchocr compact` replaced: sink.read_parts
        lists the shard again) is FileNotFoundError, as adlfs's _cat_file says it, not a 404."""
        fetch = super()._async_fetch_range
        try:
            return await self.fs.read_again(lambda: fetch(start, end, **kwargs))
        except ResourceNotFoundError as exc:
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), self.path) from exc

    _fetch_range = sync_wrapper(_async_fetch_range)


def _cut_off(err: HttpResponseError) -> bool:
    """The downloader's own give-up: a reply whose body broke off (or would not decode),
    wrapped with no status code. An answer with a status is the retry policy's business."""
    return err.status_code is None and isinstance(err.__cause__, (IncompleteReadError, DecodeError,
                                                                   ServiceResponseError))


@dataclass
class AzureBackend:
    """One az:// URL: its filesystem, root, listing, error messages and polars options."""

    url: str
    options: Mapping[str, Any]
    document: bool = False  # one blob to read (render.open_document), not a folder: no prefix check
    fs: BlobFileSystem = field(init=False)
    root: str = field(init=False)
    credentials: Credentials = field(init=False)

    def __post_init__(self):
        url_account = BlobFileSystem._get_kwargs_from_urls(self.url).get("account_name")
        self.credentials, retry = resolve(self.options, os.environ, url_account)
        self.fs = BlobFileSystem(credentials=self.credentials.token(), retry=tuple(sorted(retry.items())))
        self.root = BlobFileSystem._strip_protocol(self.url).rstrip("/")
        if not self.root:
            raise ConfigError(f"{self.url}: name a container, as az://container/prefix")
        if self.document:  # a blob named 10:30.pdf reads well; its own row says if it does not
            return
        try:  # adlfs parses paths as URLs: a name like run[1] reads as an IPv6 host, on every write
            self.fs._parent(f"{self.root.partition('/')[2]}/x")  # adlfs asks this of the name in the container
        except ValueError as exc:
            raise ConfigError(f"{self.url}: adlfs cannot address this name ({exc}): "
                              "choose one without '[', ']' or ':'") from None

    faults = (AzureError, OSError, ValueError)  # what the SDK and adlfs raise for storage faults

    def exists(self, path: str) -> bool:
        return self.fs.exists(path)  # adlfs raises what it cannot answer (explain() says what it means)

    @property
    def secrets(self) -> tuple[str, ...]:
        return self.credentials.secrets

    def walk(self, root: str) -> Iterator[tuple[str, dict]]:
        """(path, info) of every blob under root, in name order, one page at a time. The
        root is one blob only if its URL does not end in `/` and no blob is under it: a
        blob `docs` (a 0-byte folder marker, say) beside `docs/x.pdf` leaves az://c/docs/
        the folder."""
        container, _, name = root.partition("/")
        prefix = f"{name}/" if name else ""
        page, token = sync(self.fs.loop, _list_page, self.fs.service_client, container, prefix, None)
        folder = page or token or (root == self.root and self.url.endswith("/"))
        if name and not folder and self.fs.isfile(root):
            yield root, self.fs.info(root)
            return
        yield from page
        while token:
            page, token = sync(self.fs.loop, _list_page, self.fs.service_client, container, prefix, token)
            yield from page

    def document_fault(self, exc: BaseException, where: str) -> Exception | None:
        """Azure's answer to reading one SOURCE document, when it is about that blob alone
        (Unreadable: its row) or says the container went away mid-run (StorageError:
        every document would follow); None for the rest (explain)."""
        code, status = _error_code(_azure_cause(exc))
        if code == "ContainerNotFound":
            container = self.root.split("/", 1)[0]
            return StorageError(f"{where}: the container {container!r} no longer exists (deleted during the run?)")
        if code == "BlobNotFound" or (isinstance(exc, FileNotFoundError) and status is None):
            if any(ord(c) < 32 or ord(c) == 127 for c in where):  # adlfs strips them from a path: another name
                return Unreadable("adlfs cannot address a blob whose name holds a control character (a tab, a "
                                  "line break): rename the blob")
            return Unreadable("the blob was deleted after it was listed")
        if code == "BlobArchived":
            return Unreadable("the blob is in the Archive tier: rehydrate it (set its tier to Hot or Cool) to read it")
        # A 403 stays the run's (explain): a SAS or a role that may list but not read answers
        # it for every blob alike, and that must stop the run, not become a row a document;
        # one blob refused by an access condition (ABAC) looks the same from here.
        return None

    def explain(self, exc: BaseException, where: str) -> BatchocrError:
        """A storage failure as one line saying what to do; never a secret."""
        err = _azure_cause(exc)
        creds = self.credentials
        container = self.root.split("/", 1)[0]
        if isinstance(err, ClientAuthenticationError) and creds.uses_default_credential:
            return ConfigError(
                f"{where}: no Azure credentials: none in the storage options, AZURE_STORAGE_CONNECTION_STRING, "
                "AZURE_STORAGE_ACCOUNT_KEY or AZURE_STORAGE_SAS_TOKEN, and DefaultAzureCredential found none "
                "or was refused (in a pod: is workload identity set up for its service account, with the "
                "'Storage Blob Data Contributor' role?)")
        if isinstance(err, HttpResponseError) and err.status_code is not None:  # None: the body was cut off
            code = _error_code(err)[0] or err.reason or "error"
            if code in ("InvalidResourceName", "OutOfRangeInput"):
                return ConfigError(f"{where}: Azure refuses the name ({code}): a container name is 3 to 63 "
                                   "lowercase letters, digits and single hyphens")
            if code == "ContainerNotFound":
                return ConfigError(f"{where}: the container {container!r} does not exist in the storage account")
            if err.status_code in (401, 403) or isinstance(err, ClientAuthenticationError):
                what = "SAS token (expired, or missing a permission: read, write, list, delete?)" if (
                    creds.sas_token or "sharedaccesssignature=" in (creds.connection_string or "").lower()
                ) else "account key"
                return ConfigError(f"{where}: Azure refused the {what} from {creds.origin} ({code})")
            return StorageError(f"{where}: Azure answered HTTP {err.status_code} {code}")
        if isinstance(err, AzureError):
            reason = str(err.message).splitlines()[0][:200] if err.message else type(err).__name__
            total = int(self.fs._retry["retry_total"])
            return StorageError(f"{where}: Azure Blob storage unreachable after {total} "
                                f"retr{'y' if total == 1 else 'ies'} ({type(err).__name__}: {reason})")
        reason = str(exc).splitlines()[0][:200] if str(exc) else ""
        return StorageError(f"{where}: {type(exc).__name__}: {reason}")

    def polars_options(self) -> tuple[dict[str, str], Any]:
        """(storage_options, credential_provider) for polars.scan_parquet on this account."""
        return polars_options(self.credentials)


async def _list_page(client, container: str, prefix: str, token: str | None) -> tuple[list, str | None]:
    """One page of blobs and the token of the next (None at the end)."""
    pages = client.get_container_client(container).list_blobs(
        name_starts_with=prefix or None, results_per_page=LIST_PAGE).by_page(continuation_token=token)
    async for page in pages:
        items = [
            (f"{container}/{b.name}", {"name": f"{container}/{b.name}", "type": "file", "size": b.size,
                                       "etag": b.etag, "last_modified": b.last_modified})
            async for b in page
            if not b.name.endswith("/")  # a folder marker, not a file
        ]
        return items, pages.continuation_token
    return [], None


def _error_code(err: BaseException) -> tuple[str | None, int | None]:
    """(Azure's error code, HTTP status) of an SDK error; Nones where it has none."""
    if not isinstance(err, HttpResponseError):
        return None, None
    code = getattr(err, "error_code", None)
    return getattr(code, "value", code), err.status_code


def _azure_cause(exc: BaseException) -> BaseException:
    """adlfs wraps SDK errors (ValueError(...) from err): the SDK's error, if any."""
    seen = exc
    while seen is not None:
        if isinstance(seen, AzureError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return exc


def polars_options(creds: Credentials) -> tuple[dict[str, str], Any]:
    """polars reads az:// with its own client (object_store): it takes account_name,
    account_key or sas_token, and an endpoint, where the SDK takes a connection string."""
    opts: dict[str, str] = {}
    if creds.account_name:
        opts["account_name"] = creds.account_name
    if creds.account_host:
        opts["endpoint"] = f"https://{creds.account_host}"
    if creds.connection_string:
        parts = parse_connection_string(creds.connection_string, creds.origin)
        if parts.get("usedevelopmentstorage", "").lower() == "true":
            return {"use_emulator": "true"}, None
        opts["account_name"] = parts.get("accountname") or creds.account_name or ""
        if parts.get("accountkey"):
            opts["account_key"] = parts["accountkey"]
        if parts.get("sharedaccesssignature"):
            opts["sas_token"] = parts["sharedaccesssignature"]
        if parts.get("blobendpoint"):
            # Azurite's endpoint carries the account in its path (http://127.0.0.1:10000/devstoreaccount1).
            opts["endpoint"] = parts["blobendpoint"].rstrip("/")
        elif parts.get("endpointsuffix"):
            opts["endpoint"] = f"https://{opts['account_name']}.blob.{parts['endpointsuffix']}"
        if opts.get("endpoint", "").startswith("http://"):
            opts["allow_http"] = "true"
        return opts, None
    if creds.account_key:
        return opts | {"account_key": creds.account_key}, None
    if creds.sas_token:
        return opts | {"sas_token": creds.sas_token.lstrip("?")}, None
    import polars as pl
    from azure.identity import DefaultAzureCredential

    return opts, pl.CredentialProviderAzure(credential=DefaultAzureCredential())

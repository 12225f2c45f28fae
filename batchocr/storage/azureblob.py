"""Azure Blob (az://container/prefix; also abfs://, abfss://) through adlfs.

What adlfs leaves to batchocr, and why each piece is here:
- credentials in batchocr's documented order (batchocr/storage/azureauth.py);
- the SDK's own retry policy, configured (adlfs keeps the SDK default: 15 s before the
  first retry, 3 retries), and downloads whose reply broke off mid-body read again as
  often as it says (the SDK's downloader tries such a reply 3 times, whatever the policy);
- a listing that streams page by page (adlfs lists a whole folder into a list), its
  virtual folders listed in parallel;
- exclusive creation by If-None-Match (adlfs's pipe_file with overwrite=False);
- errors that say what to change and never carry a secret;
- polars' own Azure client (object_store) wants account_name/account_key/endpoint,
  not a connection string: `polars_options` translates.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
from collections import deque
from typing import Any, Iterator, Mapping

from adlfs import AzureBlobFileSystem
from adlfs.spec import AzureBlobFile
from azure.storage.blob.aio import BlobPrefix
from azure.core.exceptions import (AzureError, ClientAuthenticationError, DecodeError, HttpResponseError,
                                   IncompleteReadError, ResourceNotFoundError,
                                   ServiceResponseError)
from fsspec.asyn import sync, sync_wrapper

from batchocr import __version__
from batchocr.errors import BatchocrError, ConfigError, StorageError, Unreadable
from batchocr.storage.azureauth import Credentials, polars_options, resolve
from batchocr.storage.backend import AZURE_PROTOCOLS, Backend
from batchocr.storage.fsspecbackend import FsspecBackend

# Blobs per listing request: one page is all the listing ever holds (Azure allows 5,000).
LIST_PAGE = 1000
# Virtual folders listed at once ahead of the one being read (AzureBackend.walk), each at
# most two pages ahead: the listing holds at most about 2 x LIST_AHEAD + 2 pages.
LIST_AHEAD = 8

# The SDK's transport logs a bare "Incomplete download." each time a reply breaks off, which
# batchocr reads again (BlobFileSystem.read_again) and reports itself if it stays broken: with no
# logging configured, Python would print each one on stderr with no blob named.
logging.getLogger("azure.core.pipeline.transport").setLevel(logging.ERROR)
# DefaultAzureCredential logs each credential it tried (80-odd lines, on stderr) before failing;
# batchocr says in one line what is missing (AzureBackend.explain).
logging.getLogger("azure.identity").setLevel(logging.ERROR)


class BlobFileSystem(AzureBlobFileSystem):
    """adlfs with batchocr's credentials and the SDK's retry policy configured.

    Its client is made here, not by adlfs: adlfs reads AZURE_STORAGE_* itself and
    would let the environment's connection string win over options given explicitly.
    """

    protocol = AZURE_PROTOCOLS

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
        resets connections (a quarter of requests, say), one blob among thousands fails
        while `retry_total` (10, say) promises more."""
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


class AzureBackend(FsspecBackend):
    """One az:// URL: its filesystem (BlobFileSystem), root, listing, exclusive creation,
    error messages and polars options; the rest as any fsspec filesystem."""

    faults = (AzureError, OSError, ValueError)  # what the SDK and adlfs raise for storage faults
    exact_sizes = True  # a blob's size is its bytes

    def __init__(self, url: str, options: Mapping[str, Any], document: bool = False):
        """`document`: one blob to read (render.open_document), not a folder: no check of its name."""
        Backend.__init__(self, url, options, document)  # not fsspec's registry: BlobFileSystem, made here
        url_account = BlobFileSystem._get_kwargs_from_urls(url).get("account_name")
        self.credentials, retry = resolve(options, os.environ, url_account)
        self.fs = BlobFileSystem(credentials=self.credentials.token(), retry=tuple(sorted(retry.items())))
        self.root = BlobFileSystem._strip_protocol(url).rstrip("/")
        if not self.root:
            raise ConfigError(f"{url}: name a container, as az://container/prefix")
        if document:  # a blob named 10:30.pdf reads well; its own row says if it does not
            return
        try:  # adlfs parses paths as URLs: a name like run[1] reads as an IPv6 host, on every write
            self.fs._parent(f"{self.root.partition('/')[2]}/x")  # adlfs asks this of the name in the container
        except ValueError as exc:
            raise ConfigError(f"{url}: adlfs cannot address this name ({exc}): "
                              "choose one without '[', ']' or ':'") from None

    @property
    def secrets(self) -> tuple[str, ...]:
        return self.credentials.secrets

    def exists(self, path: str) -> bool:
        return self.fs.exists(path)  # adlfs raises what it cannot answer (explain() says what it means)

    def create(self, path: str, data: bytes) -> bool:
        """An upload with If-None-Match: *: of two writers, the store lets one win."""
        try:
            self.fs.pipe_file(path, data, overwrite=False)
        except FileExistsError:
            return False
        return True

    def walk(self, root: str) -> Iterator[tuple[str, dict]]:
        """(path, info) of every blob under root, in name order. The root is one blob only if
        its URL does not end in `/` and no blob is under it: a blob `docs` (a 0-byte folder
        marker, say) beside `docs/x.pdf` leaves az://c/docs/ the folder.

        The root is listed a level at a time (delimiter `/`): its own blobs page by page, and
        in their place among them each virtual folder's blobs, from a flat listing of that
        folder (_by_folders). A root whose level holds one folder and nothing else is that
        folder. Without folders this is the flat listing, page by page."""
        container, _, name = root.partition("/")
        prefix = f"{name}/" if name else ""
        page, token = self._level(container, prefix, None)
        folder = any(info is not None for _, info in page) or (root == self.root and self.url.endswith("/"))
        if name and not folder and self.fs.isfile(root):
            if page or token:  # folders only: of blobs, or of folder markers alone?
                flat, more = sync(self.fs.loop, _list_page, self.fs.service_client, container, prefix, None)
                folder = bool(flat or more)
            if not folder:
                yield root, self.fs.info(root)
                return
        while len(page) == 1 and page[0][1] is None and not token:
            prefix = page[0][0].partition("/")[2]
            page, token = self._level(container, prefix, None)
        yield from self._by_folders(container, prefix, page, token)

    def _level(self, container: str, prefix: str, token: str | None) -> tuple[list, str | None]:
        """One page of the level under prefix (folders as (path, None)) and the next's token."""
        return sync(self.fs.loop, _list_page, self.fs.service_client, container, prefix, token, delimiter="/")

    def _by_folders(self, container: str, prefix: str, page: list, token: str | None
                    ) -> Iterator[tuple[str, dict]]:
        """The level's blobs, each folder's blobs in its place: the flat listing's order, as
        the names under a folder sort together. While a folder is read, LIST_AHEAD folders
        after it are listed at once (_FolderListing: each at most two pages ahead of its
        reader), and the level's next page is asked for ahead only then, with less than a page
        of entries waiting: memory stays flat, and a level of blobs alone is read as the flat
        listing is, a page when its first blob is wanted."""
        pages = self._level_pages(container, prefix, page, token)
        rest: deque = deque()  # the level's page being read
        ahead: deque = deque()  # entries read and not yet yielded: (path, info) or a _FolderListing
        listing = 0  # folders in `ahead`

        def read_ahead():
            nonlocal rest, listing
            while listing < LIST_AHEAD:
                if not rest:
                    if ahead and not (listing and len(ahead) < LIST_PAGE):
                        return
                    rest = deque(next(pages, ()))
                    if not rest:
                        return
                entry = rest.popleft()
                if entry[1] is None:
                    listing += 1
                    entry = _FolderListing(self.fs.loop, self.fs.service_client, container,
                                           entry[0].partition("/")[2])
                ahead.append(entry)

        entry = None  # the one being yielded
        try:
            while True:
                read_ahead()
                if not ahead:
                    return
                entry = ahead.popleft()
                if isinstance(entry, _FolderListing):
                    listing -= 1
                    read_ahead()  # the next folders start while this one is read
                    yield from entry
                else:
                    yield entry
        finally:  # the reader stopped early, or a listing failed: the folders ahead stop
            for listed in (entry, *ahead):
                if isinstance(listed, _FolderListing):
                    listed.stop()

    def _level_pages(self, container: str, prefix: str, page: list, token: str | None) -> Iterator[list]:
        """The level's pages that hold entries, from the one given on; a folder named again at
        the top of the next page is listed once."""
        last_folder = None
        while True:
            folders = [path for path, info in page if info is None]
            page = [entry for entry in page if entry[1] is not None or entry[0] != last_folder]
            last_folder = folders[-1] if folders else last_folder
            if page:  # Azure may answer a page of none, with a token
                yield page
            if not token:
                return
            page, token = self._level(container, prefix, token)

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


async def _list_page(client, container: str, prefix: str, token: str | None,
                     delimiter: str | None = None) -> tuple[list, str | None]:
    """One page of blobs and the token of the next (None at the end). With a delimiter, a
    level: its virtual folders too, as (path, None), in name order among its blobs."""
    cc = client.get_container_client(container)
    listing = (cc.walk_blobs(name_starts_with=prefix or None, delimiter=delimiter, results_per_page=LIST_PAGE)
               if delimiter else cc.list_blobs(name_starts_with=prefix or None, results_per_page=LIST_PAGE))
    pages = listing.by_page(continuation_token=token)
    async for page in pages:
        items = []
        async for b in page:
            path = f"{container}/{b.name}"
            if isinstance(b, BlobPrefix):
                items.append((path, None))
            elif not b.name.endswith("/"):  # a folder marker, not a file
                items.append((path, {"name": path, "type": "file", "size": b.size, "etag": b.etag,
                                     "last_modified": b.last_modified}))
        if delimiter:
            items.sort(key=lambda item: item[0])  # the SDK gives a page's folders first, then its blobs
        return items, pages.continuation_token
    return [], None


class _FolderListing:
    """One virtual folder's blobs, listed on the filesystem's event loop ahead of their
    reader: a task fetches the folder's pages in turn, each waiting in a queue of one until
    the reader takes it (two pages at most: the one waiting and the one being fetched). A
    listing error waits there too, raised when the reader reaches this folder."""

    def __init__(self, loop, client, container: str, prefix: str):
        self.loop = loop
        self.pages: asyncio.Queue = asyncio.Queue(maxsize=1)
        self.task = asyncio.run_coroutine_threadsafe(self._fill(client, container, prefix), loop)

    async def _fill(self, client, container: str, prefix: str) -> None:
        token = None
        try:
            while True:
                page, token = await _list_page(client, container, prefix, token)
                await self.pages.put((page, bool(token), None))
                if not token:
                    return
        except Exception as exc:  # noqa: BLE001 - the reader raises it, in the listing's order
            await self.pages.put(([], False, exc))

    async def _next(self) -> tuple[list, bool]:
        page, more, exc = await self.pages.get()
        if exc is not None:
            raise exc  # raised through sync(), as the page's own request would have been
        return page, more

    def __iter__(self) -> Iterator[tuple[str, dict]]:
        try:
            more = True
            while more:
                page, more = sync(self.loop, self._next)
                yield from page
        finally:
            self.stop()

    def stop(self) -> None:
        self.task.cancel()  # cancels the task on the loop; nothing once it is done


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


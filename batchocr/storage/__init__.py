"""The one storage seam: every read and write of SOURCE and OUT goes through a Store.

- store.py: Store, a folder on a backend; faults leave it as one-line BatchocrErrors with
  no secret in them.
- backend.py: the backend contract (read, range read, atomic write, exclusive create,
  remove, walk, exists, explain, ...) and the registry that picks a backend by protocol.
- local.py: local disk. azureblob.py (with azureauth.py, its credentials): Azure Blob.
  fsspecbackend.py: any other filesystem fsspec knows (memory://, http(s)://, ...).
- redaction.py: secrets out of messages and URIs.
"""

from batchocr.storage.backend import DOWNLOAD_CHUNK
from batchocr.storage.local import STALE_TEMP_S
from batchocr.storage.redaction import SECRET_VARIABLES, environment_secrets, public_url, redact
from batchocr.storage.store import READ_THREADS, Store, each

__all__ = ["DOWNLOAD_CHUNK", "READ_THREADS", "SECRET_VARIABLES", "STALE_TEMP_S", "Store", "each",
           "environment_secrets", "public_url", "redact"]

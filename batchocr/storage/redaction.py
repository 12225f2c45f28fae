"""Secrets out of what batchocr says: error lines (redact), URIs of signed URLs (public_url)."""

from __future__ import annotations

import os
import re
import urllib.parse
from typing import Iterable, Mapping

# Variables whose values are secrets wherever they appear (see redact).
SECRET_VARIABLES = ("AZURE_STORAGE_CONNECTION_STRING", "AZURE_STORAGE_ACCOUNT_KEY", "AZURE_STORAGE_SAS_TOKEN",
                    "AZURE_CLIENT_SECRET")
_SECRET_FIELDS = re.compile(
    r"(?i)\b(AccountKey|SharedAccessSignature|sig|signature|account_key|sas_token|connection_string|client_secret)"
    r"(['\"]?\s*[=:]\s*['\"]?)([^;&\s'\",]+)")  # quoted too: account_key: 'SECRET, {"sig": "SECRET"}

_URL_PASSWORD = re.compile(r"(://[^/@\s:]*:)[^/@\s]+@")  # https://user:PASSWORD@host

# A signed URL's query is its credential: an Azure SAS (sig=, with sv=, se=, sp=, ...), S3's
# and GCS's presigned URLs (X-Amz-Signature, X-Goog-Signature).
_SIGNATURES = ("sig", "signature", "x-amz-signature", "x-goog-signature")


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """text with every secret (and every key=value that names one) replaced by ***."""
    for secret in sorted({s for s in secrets if s and len(s) >= 8}, key=len, reverse=True):
        for form in (secret, urllib.parse.quote(secret, safe=""), urllib.parse.quote_plus(secret)):
            text = text.replace(form, "***")
    text = _URL_PASSWORD.sub(r"\1***@", text)
    return _SECRET_FIELDS.sub(lambda m: f"{m.group(1)}{m.group(2)}***", text)


def environment_secrets(env: Mapping[str, str] = os.environ) -> tuple[str, ...]:
    return tuple(env[k] for k in SECRET_VARIABLES if env.get(k))


def public_url(url: str) -> str:
    """An http(s) URL without its credentials: a signed URL's query (it names no document: the
    path does, and a new signature must not make a new document) and the password of
    `user:password@`. Any other URL, or one with neither, is returned as it is."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme.lower() not in ("http", "https"):
        return url
    signed = any(k.lower() in _SIGNATURES for k, _ in urllib.parse.parse_qsl(parts.query, keep_blank_values=True))
    if not signed and parts.password is None:
        return url
    userinfo, at, host = parts.netloc.rpartition("@")
    netloc = f"{userinfo.partition(':')[0]}@{host}" if at else host
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, "" if signed else parts.query, parts.fragment))

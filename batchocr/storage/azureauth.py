"""Azure credentials: where the account is and how to sign in, resolved from storage options
and the environment in batchocr's documented order, and the same credentials as polars'
own Azure client (object_store) takes them. adlfs would let AZURE_STORAGE_CONNECTION_STRING
override a key given explicitly, and hands unknown options to DefaultAzureCredential: the
filesystem of batchocr/storage/azureblob.py is made from these instead."""

from __future__ import annotations

import base64
import binascii
import os
from dataclasses import dataclass
from typing import Annotated, Any, Mapping

from annotated_types import Ge

from batchocr.config import FORBID, convert
from batchocr.errors import ConfigError

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

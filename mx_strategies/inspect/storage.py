"""Listing and ranged reads on local folders and object stores.

Probing a candidate source must never read tensor data: a 700 GB checkpoint
is inspected by listing its prefix and reading each shard's header with one
ranged read (two for a header larger than the first read). runai-model-streamer streams data but has no ranged-read or
listing-with-sizes API, so this module uses the clients the runai extras
already install (boto3, google-cloud-storage, azure-storage-blob), configured
from the same environment variables runai reads.
"""

from __future__ import annotations

import functools
import importlib
import os
import re
import stat
from collections import deque
from dataclasses import dataclass, field
from typing import Optional, Protocol

from ..errors import StoreError

S3_PREFIX = "s3://"
GCS_PREFIX = "gs://"
AZURE_PREFIX = "az://"
OBJECT_STORE_PREFIXES = (S3_PREFIX, GCS_PREFIX, AZURE_PREFIX)

# Entries a local discovery walk looks at when the caller does not say (MX_ROBUST_MAX_DISCOVERY_ENTRIES).
DEFAULT_MAX_ENTRIES = 100_000
REGULAR = "file"


@dataclass(frozen=True)
class ObjectInfo:
    """One file under a source root."""

    key: str  # path relative to the root, "/"-separated
    uri: str  # what runai-model-streamer is given to stream it
    size: int
    # What changes when the file is rewritten: size, mtime and inode locally, the ETag or
    # generation on object stores. None when the store cannot say.
    identity: Optional[str] = field(default=None, compare=False)
    # "file" for a regular file; locally also "FIFO", "socket", "character device", ...
    # (listed so a checkpoint file that is one is reported, never opened).
    kind: str = field(default=REGULAR, compare=False)

    @property
    def regular(self) -> bool:
        return self.kind == REGULAR


class Store(Protocol):
    root: str

    def list(self, max_depth: int) -> list[ObjectInfo]:
        """Every file up to ``max_depth`` folders below the root, unordered."""

    def read(self, obj: ObjectInfo, start: int, length: int) -> bytes:
        """``length`` bytes of ``obj`` from ``start`` (one ranged request)."""

    def identity(self, obj: ObjectInfo) -> Optional[str]:
        """``obj``'s identity now (see :attr:`ObjectInfo.identity`); None when unknown."""


class ListingTooLarge(StoreError):
    """A local discovery walk met more entries than its bound; the message names the folder and the setting."""


def _file_kind(mode: int) -> str:
    if stat.S_ISREG(mode):
        return REGULAR
    if stat.S_ISDIR(mode):
        return "folder"
    if stat.S_ISFIFO(mode):
        return "FIFO"
    if stat.S_ISSOCK(mode):
        return "socket"
    if stat.S_ISCHR(mode):
        return "character device"
    if stat.S_ISBLK(mode):
        return "block device"
    return "special file"


def local_identity(st: os.stat_result) -> str:
    return f"size={st.st_size} mtime_ns={st.st_mtime_ns} inode={st.st_ino}"


# "org/name" that is no local folder: a Hugging Face hub id, which we cannot stream.
HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")


def is_object_store_uri(uri: str) -> bool:
    return uri.startswith(OBJECT_STORE_PREFIXES)


def normalize_uri(uri: str) -> str:
    """One spelling per location: object-store URIs without a trailing slash, local paths absolute."""
    if is_object_store_uri(uri) or "://" in uri:
        return uri.rstrip("/")
    return os.path.abspath(uri)


def looks_like_hub_id(uri: str) -> bool:
    """``org/name`` with no such local folder: someone passed a Hugging Face hub id."""
    return bool(HUB_ID.match(uri)) and not uri.startswith((".", "/")) and not os.path.exists(uri)


def open_store(
    uri: str, *, timeout_s: float = 20.0, max_attempts: int = 3, max_entries: Optional[int] = None
) -> Store:
    """The store holding ``uri``; raises StoreError for what is no source.

    ``max_entries`` bounds a local discovery walk (None: MX_ROBUST_MAX_DISCOVERY_ENTRIES).
    """
    if uri.startswith(S3_PREFIX):
        return S3Store(uri, timeout_s=timeout_s, max_attempts=max_attempts)
    if uri.startswith(GCS_PREFIX):
        return GcsStore(uri)
    if uri.startswith(AZURE_PREFIX):
        return AzureStore(uri)
    if "://" in uri:
        raise StoreError(f"{uri}: unsupported scheme (expected s3://, gs://, az:// or a local folder)")
    if looks_like_hub_id(uri):
        raise StoreError(f"{uri}: no such local folder (it looks like a Hugging Face hub id, which cannot be streamed)")
    if not os.path.exists(uri):
        raise StoreError(f"{uri}: no such local folder")
    if not os.path.isdir(uri):
        raise StoreError(f"{uri}: not a folder")
    return LocalStore(uri, max_entries=max_entries)


def _depth(key: str) -> int:
    return key.count("/")


def _configured_max_entries() -> int:
    from ..settings import current_settings

    return current_settings().max_discovery_entries


class LocalStore:
    """A local folder. Discovery follows symlinks but visits each real folder once.

    Only regular files are ever opened: a FIFO, socket or device is listed
    with its ``kind`` (so inspection can name it) and refused by
    :meth:`read`, checked with ``stat`` before any ``open``. Folders that
    cannot be listed are kept in ``unreadable`` (key -> reason).
    """

    def __init__(self, root: str, *, max_entries: Optional[int] = None) -> None:
        self.root = normalize_uri(root)
        self.max_entries = max_entries
        self.unreadable: dict[str, str] = {}

    def list(self, max_depth: int) -> list[ObjectInfo]:
        limit = self.max_entries if self.max_entries is not None else _configured_max_entries()
        found: list[ObjectInfo] = []
        self.unreadable = {}
        try:
            top = os.stat(self.root)
        except OSError as exc:
            raise StoreError(f"{self.root}: {exc.strerror or exc}") from exc
        visited = {(top.st_dev, top.st_ino)}
        # Breadth first, names sorted: a folder reachable twice (a symlink and its target) is
        # listed under its shallowest, then alphabetically first, path.
        queue: deque[tuple[str, str, int]] = deque([("", self.root, 0)])
        seen = 0
        while queue:
            rel, path, depth = queue.popleft()
            entries = []
            try:
                with os.scandir(path) as listing:
                    for entry in listing:
                        seen += 1
                        if seen > limit:
                            raise ListingTooLarge(
                                f"{self.root}: more than {limit} entries within {max_depth} folder level(s) "
                                f"(stopped in {path}); point the source at the checkpoint folder, or raise "
                                f"MX_ROBUST_MAX_DISCOVERY_ENTRIES or lower MX_ROBUST_DISCOVERY_DEPTH"
                            )
                        entries.append(entry)
            except OSError as exc:
                if rel:
                    self.unreadable[rel] = exc.strerror or str(exc)
                    continue
                raise StoreError(f"{self.root}: cannot list it: {exc.strerror or exc}") from exc
            entries.sort(key=lambda e: e.name)
            for entry in entries:
                key = f"{rel}/{entry.name}" if rel else entry.name
                try:
                    st = entry.stat()  # follows symlinks; never opens
                except OSError:
                    continue  # a dangling symlink is no file
                kind = _file_kind(st.st_mode)
                if kind == "folder":
                    if entry.name.startswith(".") or depth >= max_depth:
                        continue
                    real = (st.st_dev, st.st_ino)
                    if real in visited:
                        continue  # a symlink loop, or a second way into a folder already listed
                    visited.add(real)
                    queue.append((key, entry.path, depth + 1))
                elif kind == REGULAR:
                    found.append(ObjectInfo(key=key, uri=entry.path, size=st.st_size, identity=local_identity(st)))
                else:
                    found.append(ObjectInfo(key=key, uri=entry.path, size=0, kind=kind))
        return found

    @staticmethod
    def _open_regular(path: str) -> int:
        """A descriptor for ``path`` if it is a regular file; never blocks on a FIFO."""
        try:
            kind = _file_kind(os.stat(path).st_mode)
            if kind != REGULAR:
                raise StoreError(f"{path}: not a regular file (a {kind}); not opened")
            # O_NONBLOCK: should it have become a FIFO since the stat, open returns at once.
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0))
        except OSError as exc:
            raise StoreError(f"{path}: {exc.strerror or exc}") from exc
        try:
            kind = _file_kind(os.fstat(fd).st_mode)
        except OSError as exc:
            os.close(fd)
            raise StoreError(f"{path}: {exc.strerror or exc}") from exc
        if kind != REGULAR:
            os.close(fd)
            raise StoreError(f"{path}: not a regular file (a {kind}); not read")
        return fd

    def read(self, obj: ObjectInfo, start: int, length: int) -> bytes:
        if length <= 0:
            return b""
        fd = self._open_regular(obj.uri)
        try:
            parts = []
            offset, remaining = start, length
            while remaining > 0:
                chunk = os.pread(fd, remaining, offset)
                if not chunk:
                    break
                parts.append(chunk)
                offset += len(chunk)
                remaining -= len(chunk)
            return b"".join(parts)
        except OSError as exc:
            raise StoreError(f"{obj.uri}: {exc.strerror or exc}") from exc
        finally:
            os.close(fd)

    def identity(self, obj: ObjectInfo) -> Optional[str]:
        try:
            return local_identity(os.stat(obj.uri))
        except OSError as exc:
            return f"unreadable ({exc.strerror or exc})"


# -- access errors that say what to do -----------------------------------------------------------
#
# A store that cannot be opened, listed or read names, on one line: what failed, the variables its clients
# read, which of them are set (names only, never values), the one to set or check next, and the section of
# docs/troubleshooting.md about that store. tests/test_store_errors.py checks every section cited here exists.

TROUBLESHOOTING = "docs/troubleshooting.md"
DETAIL_CHARS = 300  # of the client's own message: one line, bounded (Azure's carry the whole XML answer)

# What the probe's clients read, per scheme (runai's C++ streamers differ in places: each section of the doc says).
ACCESS_VARIABLES = {
    S3_PREFIX: (
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_PROFILE",
        "AWS_ENDPOINT_URL",
        "AWS_REGION",
        "AWS_DEFAULT_REGION",
        "RUNAI_STREAMER_S3_UNSIGNED",
    ),
    GCS_PREFIX: (
        "GOOGLE_APPLICATION_CREDENTIALS",
        "RUNAI_STREAMER_GCS_CREDENTIAL_FILE",
        "RUNAI_STREAMER_GCS_USE_ANONYMOUS_CREDENTIALS",
        "STORAGE_EMULATOR_HOST",
    ),
    AZURE_PREFIX: (
        "AZURE_STORAGE_CONNECTION_STRING",
        "AZURE_STORAGE_ACCOUNT_NAME",
        "AZURE_STORAGE_ACCOUNT_KEY",
        "AZURE_STORAGE_SAS_TOKEN",
        "AZURE_STORAGE_ENDPOINT_SUFFIX",
    ),
}
ANCHORS = {S3_PREFIX: "s3", GCS_PREFIX: "gcs", AZURE_PREFIX: "azure"}

_CONNECTION = frozenset(
    {
        "EndpointConnectionError",
        "ConnectTimeoutError",
        "ConnectionClosedError",
        "ReadTimeoutError",
        "ConnectionError",
        "ConnectionRefusedError",
        "NewConnectionError",
        "MaxRetryError",
        "ProxyConnectionError",
        "ProtocolError",
        "TimeoutError",
        "ServiceRequestError",
        "TransportError",
    }
)
_REFUSED = frozenset({"InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken"})
_DENIED = frozenset({"AccessDenied", "AllAccessDisabled", "Forbidden", "403", "Unauthorized", "401"})
_WRONG_REGION = frozenset(
    {"PermanentRedirect", "AuthorizationHeaderMalformed", "IllegalLocationConstraintException", "301"}
)


def _error_code(exc: BaseException) -> str:
    """S3's error code (a ClientError's, a ranged read's), else the exception's type name."""
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        code = response.get("Error", {}).get("Code")
        if code:
            return str(code)
    for attribute in ("code", "error_code"):  # a ranged read's (S3's code, or "HTTP 403"); Azure's
        code = getattr(exc, attribute, None)
        if isinstance(code, str) and code:
            return code.removeprefix("HTTP ")
    return type(exc).__name__


def _one_line(text: str, limit: int = DETAIL_CHARS) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _set(names) -> list[str]:
    return [name for name in names if os.environ.get(name)]


def _s3_next(code: str, is_set: set[str]) -> str:
    endpoint = "AWS_ENDPOINT_URL" in is_set
    if code == "NoCredentialsError":
        return (
            "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE; RUNAI_STREAMER_S3_UNSIGNED=1 for a "
            "public bucket)"
        )
    if code == "PartialCredentialsError":
        return "set both AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"
    if code == "ProfileNotFound":
        return "set AWS_PROFILE to a profile of ~/.aws/config, or unset it"
    if code in ("ExpiredToken", "TokenRefreshRequired", "RequestExpired"):
        return "renew AWS_SESSION_TOKEN with its key pair, or the session of AWS_PROFILE"
    if code in _REFUSED:
        if not endpoint:
            return (
                "check AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY; keys of MinIO or another S3-compatible store need "
                "AWS_ENDPOINT_URL"
            )
        return "check AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY: the store at AWS_ENDPOINT_URL refused them"
    if code in _DENIED:
        return (
            "grant these credentials s3:ListBucket and s3:GetObject on the bucket, or set AWS_PROFILE to ones that "
            "have them"
        )
    if code in _WRONG_REGION:
        return "set AWS_REGION to the bucket's region"
    if code == "SSLError":
        return "set AWS_CA_BUNDLE to the CA bundle of AWS_ENDPOINT_URL's server"
    if code in _CONNECTION:
        if endpoint:
            return "check AWS_ENDPOINT_URL: nothing answered there (scheme, host and port)"
        return (
            "set AWS_ENDPOINT_URL for MinIO or another S3-compatible store (e.g. http://minio:9000); for AWS itself "
            "check the network path and AWS_REGION"
        )
    if code in ("NoSuchBucket", "404", "NotFound"):
        if endpoint:
            return "check the bucket name, and that AWS_ENDPOINT_URL is the store that holds it"
        return "check the bucket name; a bucket of MinIO or another S3-compatible store needs AWS_ENDPOINT_URL"
    return "check AWS_ENDPOINT_URL and the credentials"


def _gcs_next(code: str, is_set: set[str]) -> str:
    emulator = "STORAGE_EMULATOR_HOST" in is_set
    if code == "DefaultCredentialsError":
        files = [n for n in ("RUNAI_STREAMER_GCS_CREDENTIAL_FILE", "GOOGLE_APPLICATION_CREDENTIALS") if n in is_set]
        if files:
            return f"point {files[0]} at a readable service-account key file"
        if emulator:
            return (
                "set RUNAI_STREAMER_GCS_USE_ANONYMOUS_CREDENTIALS=1 (an emulator at STORAGE_EMULATOR_HOST takes no "
                "credentials)"
            )
        return (
            "set GOOGLE_APPLICATION_CREDENTIALS to a service-account key file "
            "(or RUNAI_STREAMER_GCS_USE_ANONYMOUS_CREDENTIALS=1 for a public bucket or an emulator)"
        )
    if code in _DENIED or code in ("RefreshError", "InvalidGrant"):
        return "grant these credentials storage.objects.list and storage.objects.get on the bucket"
    if code in _CONNECTION:
        if emulator:
            return "check STORAGE_EMULATOR_HOST: nothing answered there"
        return "check the network path to storage.googleapis.com (an emulator needs STORAGE_EMULATOR_HOST)"
    if code in ("NotFound", "404"):
        return "check the bucket name" + ("" if emulator else " (an emulator's bucket needs STORAGE_EMULATOR_HOST)")
    return "check GOOGLE_APPLICATION_CREDENTIALS"


# What runai's Azure streamer reads (its release build ignores AZURE_STORAGE_CONNECTION_STRING; docs/faults.md).
_AZURE_ACCOUNT = (
    "set AZURE_STORAGE_ACCOUNT_NAME and AZURE_STORAGE_ACCOUNT_KEY (runai's streamer reads these, not the "
    "connection string)"
)


def _azure_next(code: str, is_set: set[str]) -> str:
    has_key = bool(is_set & {"AZURE_STORAGE_ACCOUNT_KEY", "AZURE_STORAGE_SAS_TOKEN"})
    if "AZURE_STORAGE_ACCOUNT_NAME" not in is_set and "AZURE_STORAGE_CONNECTION_STRING" not in is_set:
        return _AZURE_ACCOUNT
    if code in ("ClientAuthenticationError", "AuthenticationFailed", "AuthorizationFailure") or code in _DENIED:
        if "AZURE_STORAGE_CONNECTION_STRING" in is_set:  # the probe takes it before the others
            return "check AccountName and AccountKey (or SharedAccessSignature) in AZURE_STORAGE_CONNECTION_STRING"
        if has_key:
            return "check AZURE_STORAGE_ACCOUNT_KEY (or AZURE_STORAGE_SAS_TOKEN) against AZURE_STORAGE_ACCOUNT_NAME"
        return "set AZURE_STORAGE_ACCOUNT_KEY or AZURE_STORAGE_SAS_TOKEN for AZURE_STORAGE_ACCOUNT_NAME"
    if code == "CredentialUnavailableError":
        return "set AZURE_STORAGE_ACCOUNT_KEY or AZURE_STORAGE_SAS_TOKEN, or give the pod a managed identity"
    if code in _CONNECTION:
        if "AZURE_STORAGE_CONNECTION_STRING" in is_set:
            return "check BlobEndpoint in AZURE_STORAGE_CONNECTION_STRING: nothing answered there"
        return (
            "check AZURE_STORAGE_ACCOUNT_NAME and AZURE_STORAGE_ENDPOINT_SUFFIX: nothing answered at "
            "https://<name>.<suffix>"
        )
    if code in ("ResourceNotFoundError", "ContainerNotFound", "404"):
        return "check the container name and AZURE_STORAGE_ACCOUNT_NAME"
    if "AZURE_STORAGE_ACCOUNT_NAME" not in is_set:
        return _AZURE_ACCOUNT
    return "check AZURE_STORAGE_ACCOUNT_NAME and AZURE_STORAGE_ACCOUNT_KEY"


_NEXT = {S3_PREFIX: _s3_next, GCS_PREFIX: _gcs_next, AZURE_PREFIX: _azure_next}


def access_hint(scheme: str, exc: BaseException) -> str:
    """``read A, B (set: B); <what to do>; see docs/troubleshooting.md#<store>`` for an error of ``scheme``'s store."""
    names = ACCESS_VARIABLES[scheme]
    is_set = _set(names)
    step = _NEXT[scheme](_error_code(exc), set(is_set))
    return (
        f"read {', '.join(names)} (set: {', '.join(is_set) or 'none'}); {step}; "
        f"see {TROUBLESHOOTING}#{ANCHORS[scheme]}"
    )


def access_error(scheme: str, what: str, exc: BaseException) -> StoreError:
    """One line: ``<what>: <Type>: <client message, bounded>; <access_hint>``."""
    detail = _one_line(f"{type(exc).__name__}: {exc}")
    return StoreError(f"{what}: {detail}; {access_hint(scheme, exc)}")


# Codes of a read or HEAD that are about access (credentials, endpoint), not about the object: those get the hint.
ACCESS_CODES = (
    _CONNECTION
    | _REFUSED
    | _DENIED
    | _WRONG_REGION
    | {
        "NoCredentialsError",
        "PartialCredentialsError",
        "ProfileNotFound",
        "ExpiredToken",
        "SSLError",
        "DefaultCredentialsError",
        "RefreshError",
        "ClientAuthenticationError",
        "CredentialUnavailableError",
        "AuthenticationFailed",
        "AuthorizationFailure",
    }
)


def is_access_problem(exc: BaseException) -> bool:
    return _error_code(exc) in ACCESS_CODES


def _split_bucket(uri: str, scheme: str) -> tuple[str, str]:
    rest = uri[len(scheme) :]
    bucket, _, prefix = rest.partition("/")
    prefix = prefix.strip("/")
    return bucket, f"{prefix}/" if prefix else ""


class S3Store:
    """S3 and S3-compatible stores, configured like runai's own S3 client.

    ``AWS_ENDPOINT_URL`` and credentials come from boto3's usual chain;
    ``RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING=0`` selects path addressing and
    ``RUNAI_STREAMER_S3_UNSIGNED=1`` anonymous access, as for runai.
    """

    def __init__(self, uri: str, *, timeout_s: float, max_attempts: int) -> None:
        self.root = normalize_uri(uri)
        self.bucket, self.prefix = _split_bucket(uri, S3_PREFIX)
        if not self.bucket:
            raise StoreError(f"{uri}: no bucket in the URI")
        env = tuple(os.environ.get(v) for v in S3_CLIENT_ENV)
        try:
            self._client = _s3_client(timeout_s, max_attempts, env)
            self._reader = _s3_reader(timeout_s, max_attempts, env)
        except Exception as exc:  # half a key pair, an unknown AWS_PROFILE: no source, not a crash
            raise access_error(S3_PREFIX, f"{uri}: cannot create an S3 client", exc) from exc

    def _fail(self, what: str, exc: Exception, *, always: bool = True) -> StoreError:
        """``what`` failed with ``exc``; an access problem (or any, with ``always``) says which variables to set."""
        if always or is_access_problem(exc):
            return access_error(S3_PREFIX, what, exc)
        return StoreError(f"{what}: {type(exc).__name__}: {_one_line(str(exc))}")

    def list(self, max_depth: int) -> list[ObjectInfo]:
        found: list[ObjectInfo] = []
        try:
            paginator = self._client.get_paginator("list_objects_v2")
            for page in paginator.paginate(Bucket=self.bucket, Prefix=self.prefix):
                for obj in page.get("Contents", ()):
                    key = obj["Key"][len(self.prefix) :]
                    if not key or key.endswith("/") or _depth(key) > max_depth:
                        continue
                    found.append(
                        ObjectInfo(
                            key=key,
                            uri=f"s3://{self.bucket}/{obj['Key']}",
                            size=int(obj["Size"]),
                            identity=_etag(obj.get("ETag")),
                        )
                    )
        except Exception as exc:  # botocore raises many unrelated types
            raise self._fail(f"{self.root}: listing failed", exc) from exc
        return found

    def read(self, obj: ObjectInfo, start: int, length: int) -> bytes:
        """A ranged GET through :mod:`.s3_ranged` (presigned by this store's client, sent by urllib3)."""
        if length <= 0:
            return b""
        from .s3_ranged import RangedReadError

        key = obj.uri[len(f"s3://{self.bucket}/") :]
        try:
            return self._reader.read(self.bucket, key, start, length)
        except RangedReadError as exc:
            what = f"{obj.uri}: ranged read of bytes {start}-{start + length - 1} failed"
            if is_access_problem(exc):
                raise StoreError(f"{what}: {_one_line(str(exc))}; {access_hint(S3_PREFIX, exc)}") from exc
            raise StoreError(f"{what}: {exc}") from exc
        except Exception as exc:  # presigning: credentials or configuration botocore refuses
            raise self._fail(f"{obj.uri}: ranged read of bytes {start}-{start + length - 1} failed", exc) from exc

    def identity(self, obj: ObjectInfo) -> Optional[str]:
        key = obj.uri[len(f"s3://{self.bucket}/") :]
        try:
            head = self._client.head_object(Bucket=self.bucket, Key=key)
        except Exception as exc:
            response = getattr(exc, "response", None) or {}
            if response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return "deleted"
            raise self._fail(f"{obj.uri}: HEAD failed", exc, always=False) from exc
        return _etag(head.get("ETag"))


# What an S3 client is built from: one client per distinct set, reused by every probe and check.
S3_CLIENT_ENV = (
    "AWS_ENDPOINT_URL",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_PROFILE",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING",
    "RUNAI_STREAMER_S3_UNSIGNED",
)
S3_POOL_CONNECTIONS = 32  # above the probe's and checks' thread counts, so no connection is dropped


@functools.lru_cache(maxsize=8)
def _s3_client(timeout_s: float, max_attempts: int, env: tuple):
    """A boto3 S3 client, configured like runai's (built once per process and configuration).

    Building one costs hundreds of ms (botocore loads its service model);
    a load used to build three. A session of its own per configuration
    means credentials are read from the environment it was built for.
    ``env`` (the values of :data:`S3_CLIENT_ENV`) is part of the cache key.
    """
    import boto3
    from botocore import UNSIGNED
    from botocore.config import Config

    values = dict(zip(S3_CLIENT_ENV, env))
    config = Config(
        connect_timeout=timeout_s,
        read_timeout=timeout_s,
        retries={"total_max_attempts": max_attempts, "mode": "standard"},  # attempts, first included
        s3={"addressing_style": "path"} if (values["RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING"] or "1") == "0" else None,
        # SigV4 also for the presigned ranged reads (botocore presigns S3 with SigV2 by default, which newer
        # regions refuse).
        signature_version=UNSIGNED if values["RUNAI_STREAMER_S3_UNSIGNED"] == "1" else "s3v4",
        max_pool_connections=S3_POOL_CONNECTIONS,
    )
    return boto3.session.Session().client("s3", config=config)


@functools.lru_cache(maxsize=8)
def _s3_reader(timeout_s: float, max_attempts: int, env: tuple):
    """The ranged-GET path (:mod:`.s3_ranged`) of the client for the same configuration."""
    from .s3_ranged import RangedReader

    client = _s3_client(timeout_s, max_attempts, env)
    return RangedReader(client, timeout_s=timeout_s, max_attempts=max_attempts, pool_size=S3_POOL_CONNECTIONS)


def _etag(value: object) -> Optional[str]:
    return f"etag={str(value).strip(chr(34))}" if value else None


def _import_create_client(module: str):
    """``from <module> import _create_client``: ImportError when the extra, or that name in it, is missing."""
    create_client = getattr(importlib.import_module(module), "_create_client", None)
    if create_client is None:
        raise ImportError(f"cannot import name '_create_client' from {module!r}")
    return create_client


class _BucketStore:
    """What the GCS and Azure stores share: a bucket (an Azure container) through the client a runai extra
    installs, every failure a StoreError naming the URI. A subclass says how its client opens the bucket
    (``_open``), lists it (``_list_blobs``), reads a range (``_read_range``) and an object's metadata
    (``_metadata``), and what identity a listed blob or that metadata gives (``_identity_of``)."""

    scheme = ""  # GCS_PREFIX or AZURE_PREFIX
    extra = ""  # the runai-model-streamer extra that installs the client
    client_module = ""  # the extra's module whose _create_client builds the client
    client_name = ""  # what the message says could not be created
    missing_error: Optional[str] = None  # the name of the exception type a metadata read of a deleted object raises

    def __init__(self, uri: str) -> None:
        try:
            create_client = _import_create_client(self.client_module)
        except ImportError as exc:
            extra, scheme = self.extra, self.scheme
            raise StoreError(f"{uri}: install runai-model-streamer[{extra}] to read {scheme} sources") from exc
        self.root = normalize_uri(uri)
        self.bucket_name, self.prefix = _split_bucket(uri, self.scheme)
        try:
            self._bucket = self._open(create_client())
        except Exception as exc:  # missing credentials, bad config: no source, not a crash
            raise access_error(self.scheme, f"{uri}: cannot create {self.client_name}", exc) from exc

    def list(self, max_depth: int) -> list[ObjectInfo]:
        try:
            blobs = list(self._list_blobs())
        except Exception as exc:
            raise access_error(self.scheme, f"{self.root}: listing failed", exc) from exc
        found = []
        for blob in blobs:
            key = blob.name[len(self.prefix) :]
            if key and not key.endswith("/") and _depth(key) <= max_depth:
                found.append(
                    ObjectInfo(
                        key=key,
                        uri=f"{self.scheme}{self.bucket_name}/{blob.name}",
                        size=int(blob.size),
                        identity=self._identity_of(blob),
                    )
                )
        return found

    def _name(self, obj: ObjectInfo) -> str:
        """``obj``'s name in the bucket: its URI after the bucket's."""
        return obj.uri[len(f"{self.scheme}{self.bucket_name}/") :]

    def read(self, obj: ObjectInfo, start: int, length: int) -> bytes:
        if length <= 0:
            return b""
        name = self._name(obj)
        try:
            return self._read_range(name, start, length)
        except Exception as exc:
            raise self._fail(f"{obj.uri}: ranged read failed", exc) from exc

    def identity(self, obj: ObjectInfo) -> Optional[str]:
        name = self._name(obj)
        try:
            found = self._metadata(name)
        except Exception as exc:
            if type(exc).__name__ == self.missing_error:
                return "deleted"
            raise self._fail(f"{obj.uri}: metadata read failed", exc) from exc
        return self._identity_of(found)

    def _fail(self, what: str, exc: Exception) -> StoreError:
        """A read's failure: with the variables to set when it is about access."""
        if is_access_problem(exc):
            return access_error(self.scheme, what, exc)
        return StoreError(f"{what}: {type(exc).__name__}: {_one_line(str(exc))}")


class GcsStore(_BucketStore):
    """Google Cloud Storage through the client runai's gcs extra installs."""

    scheme, extra, client_name = GCS_PREFIX, "gcs", "a GCS client"
    client_module = "runai_model_streamer_gcs.files.files"

    def _open(self, client):
        return client.bucket(self.bucket_name)

    def _list_blobs(self):
        return self._bucket.client.list_blobs(self.bucket_name, prefix=self.prefix)

    def _read_range(self, name: str, start: int, length: int) -> bytes:
        return self._bucket.blob(name).download_as_bytes(start=start, end=start + length - 1)

    def _metadata(self, name: str):
        return self._bucket.get_blob(name)  # None when deleted

    @staticmethod
    def _identity_of(blob) -> Optional[str]:
        """The blob's generation (its ETag where it has none); deleted when there is no blob."""
        if blob is None:
            return "deleted"
        generation = getattr(blob, "generation", None)
        if generation is not None:
            return f"generation={generation}"
        etag = getattr(blob, "etag", None)
        return f"etag={etag}" if etag else None


class AzureStore(_BucketStore):
    """Azure Blob through the client runai's azure extra installs."""

    scheme, extra, client_name = AZURE_PREFIX, "azure", "an Azure client"
    client_module = "runai_model_streamer_azure.files.files"
    missing_error = "ResourceNotFoundError"

    def _open(self, client):
        return client.get_container_client(self.bucket_name)

    def _list_blobs(self):
        return self._bucket.list_blobs(name_starts_with=self.prefix)

    def _read_range(self, name: str, start: int, length: int) -> bytes:
        return self._bucket.download_blob(name, offset=start, length=length).readall()

    def _metadata(self, name: str):
        return self._bucket.get_blob_client(name).get_blob_properties()

    @staticmethod
    def _identity_of(item) -> Optional[str]:
        """A listed blob's or a blob's properties' ETag."""
        return _etag(getattr(item, "etag", None))

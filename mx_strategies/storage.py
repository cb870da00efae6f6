"""Listing and ranged reads on local folders and object stores.

Probing a candidate source must never read tensor data: a 700 GB checkpoint
is inspected by listing its prefix and reading each shard's header with two
ranged reads. runai-model-streamer streams data but has no ranged-read or
listing-with-sizes API, so this module uses the clients the runai extras
already install (boto3, google-cloud-storage, azure-storage-blob), configured
from the same environment variables runai reads.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Protocol

from .errors import StoreError

S3_PREFIX = "s3://"
GCS_PREFIX = "gs://"
AZURE_PREFIX = "az://"
OBJECT_STORE_PREFIXES = (S3_PREFIX, GCS_PREFIX, AZURE_PREFIX)


@dataclass(frozen=True)
class ObjectInfo:
    """One file under a source root."""

    key: str  # path relative to the root, "/"-separated
    uri: str  # what runai-model-streamer is given to stream it
    size: int


class Store(Protocol):
    root: str

    def list(self, max_depth: int) -> list[ObjectInfo]:
        """Every file up to ``max_depth`` folders below the root, unordered."""

    def read(self, obj: ObjectInfo, start: int, length: int) -> bytes:
        """``length`` bytes of ``obj`` from ``start`` (one ranged request)."""


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


def open_store(uri: str, *, timeout_s: float = 20.0, max_attempts: int = 3) -> Store:
    """The store holding ``uri``; raises StoreError for what is no source."""
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
    return LocalStore(uri)


def _depth(key: str) -> int:
    return key.count("/")


class LocalStore:
    def __init__(self, root: str) -> None:
        self.root = normalize_uri(root)

    def list(self, max_depth: int) -> list[ObjectInfo]:
        found: list[ObjectInfo] = []
        for dirpath, dirnames, filenames in os.walk(self.root, followlinks=True):
            rel_dir = os.path.relpath(dirpath, self.root)
            depth = 0 if rel_dir == "." else rel_dir.count(os.sep) + 1
            if depth >= max_depth:
                dirnames[:] = []
            dirnames[:] = [d for d in dirnames if not d.startswith(".")]
            for name in filenames:
                path = os.path.join(dirpath, name)
                key = name if rel_dir == "." else f"{rel_dir.replace(os.sep, '/')}/{name}"
                try:
                    size = os.stat(path).st_size
                except OSError:
                    continue  # a dangling symlink is no file
                found.append(ObjectInfo(key=key, uri=path, size=size))
        return found

    def read(self, obj: ObjectInfo, start: int, length: int) -> bytes:
        try:
            with open(obj.uri, "rb") as handle:
                handle.seek(start)
                return handle.read(length)
        except OSError as exc:
            raise StoreError(f"{obj.uri}: {exc.strerror or exc}") from exc


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
        import boto3
        from botocore import UNSIGNED
        from botocore.config import Config

        self.root = normalize_uri(uri)
        self.bucket, self.prefix = _split_bucket(uri, S3_PREFIX)
        if not self.bucket:
            raise StoreError(f"{uri}: no bucket in the URI")
        config = Config(
            connect_timeout=timeout_s,
            read_timeout=timeout_s,
            retries={"total_max_attempts": max_attempts, "mode": "standard"},  # attempts, first included
            s3={"addressing_style": "path"}
            if os.getenv("RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING", "1") == "0"
            else None,
            signature_version=UNSIGNED if os.getenv("RUNAI_STREAMER_S3_UNSIGNED") == "1" else None,
        )
        self._client = boto3.client("s3", config=config)
        self._max_attempts = max_attempts

    def _fail(self, what: str, exc: Exception) -> StoreError:
        return StoreError(f"{what}: {type(exc).__name__}: {exc}")

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
                        ObjectInfo(key=key, uri=f"s3://{self.bucket}/{obj['Key']}", size=int(obj["Size"]))
                    )
        except Exception as exc:  # botocore raises many unrelated types
            raise self._fail(f"{self.root}: listing failed", exc) from exc
        return found

    def read(self, obj: ObjectInfo, start: int, length: int) -> bytes:
        if length <= 0:
            return b""
        from botocore.exceptions import ConnectionClosedError, ReadTimeoutError, ResponseStreamingError

        key = obj.uri[len(f"s3://{self.bucket}/") :]
        what = f"{obj.uri}: ranged read of bytes {start}-{start + length - 1} failed"
        for attempt in range(1, self._max_attempts + 1):
            try:
                response = self._client.get_object(
                    Bucket=self.bucket, Key=key, Range=f"bytes={start}-{start + length - 1}"
                )
                return response["Body"].read()
            except (ResponseStreamingError, ReadTimeoutError, ConnectionClosedError) as exc:
                # A body cut or reset after the headers: botocore's retries end at the headers.
                if attempt == self._max_attempts:
                    raise self._fail(what, exc) from exc
            except Exception as exc:
                raise self._fail(what, exc) from exc
        raise AssertionError("unreachable")  # the loop returns or raises


class GcsStore:
    """Google Cloud Storage through the client runai's gcs extra installs."""

    def __init__(self, uri: str) -> None:
        try:
            from runai_model_streamer_gcs.files.files import _create_client
        except ImportError as exc:
            raise StoreError(f"{uri}: install runai-model-streamer[gcs] to read gs:// sources") from exc
        self.root = normalize_uri(uri)
        self.bucket_name, self.prefix = _split_bucket(uri, GCS_PREFIX)
        try:
            self._bucket = _create_client().bucket(self.bucket_name)
        except Exception as exc:  # missing credentials, bad config: no source, not a crash
            raise StoreError(f"{uri}: cannot create a GCS client: {type(exc).__name__}: {exc}") from exc

    def list(self, max_depth: int) -> list[ObjectInfo]:
        try:
            blobs = list(self._bucket.client.list_blobs(self.bucket_name, prefix=self.prefix))
        except Exception as exc:
            raise StoreError(f"{self.root}: listing failed: {type(exc).__name__}: {exc}") from exc
        found = []
        for blob in blobs:
            key = blob.name[len(self.prefix) :]
            if key and not key.endswith("/") and _depth(key) <= max_depth:
                found.append(ObjectInfo(key=key, uri=f"gs://{self.bucket_name}/{blob.name}", size=int(blob.size)))
        return found

    def read(self, obj: ObjectInfo, start: int, length: int) -> bytes:
        if length <= 0:
            return b""
        name = obj.uri[len(f"gs://{self.bucket_name}/") :]
        try:
            return self._bucket.blob(name).download_as_bytes(start=start, end=start + length - 1)
        except Exception as exc:
            raise StoreError(f"{obj.uri}: ranged read failed: {type(exc).__name__}: {exc}") from exc


class AzureStore:
    """Azure Blob through the client runai's azure extra installs."""

    def __init__(self, uri: str) -> None:
        try:
            from runai_model_streamer_azure.files.files import _create_client
        except ImportError as exc:
            raise StoreError(f"{uri}: install runai-model-streamer[azure] to read az:// sources") from exc
        self.root = normalize_uri(uri)
        self.container_name, self.prefix = _split_bucket(uri, AZURE_PREFIX)
        try:
            self._container = _create_client().get_container_client(self.container_name)
        except Exception as exc:  # missing credentials, bad config: no source, not a crash
            raise StoreError(f"{uri}: cannot create an Azure client: {type(exc).__name__}: {exc}") from exc

    def list(self, max_depth: int) -> list[ObjectInfo]:
        try:
            blobs = list(self._container.list_blobs(name_starts_with=self.prefix))
        except Exception as exc:
            raise StoreError(f"{self.root}: listing failed: {type(exc).__name__}: {exc}") from exc
        found = []
        for blob in blobs:
            key = blob.name[len(self.prefix) :]
            if key and not key.endswith("/") and _depth(key) <= max_depth:
                found.append(ObjectInfo(key=key, uri=f"az://{self.container_name}/{blob.name}", size=int(blob.size)))
        return found

    def read(self, obj: ObjectInfo, start: int, length: int) -> bytes:
        if length <= 0:
            return b""
        name = obj.uri[len(f"az://{self.container_name}/") :]
        try:
            return self._container.download_blob(name, offset=start, length=length).readall()
        except Exception as exc:
            raise StoreError(f"{obj.uri}: ranged read failed: {type(exc).__name__}: {exc}") from exc

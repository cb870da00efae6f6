"""The object stores (S3, GCS, Azure) and the one door to every store, :func:`open_store`.

runai-model-streamer streams data but has no ranged-read or listing-with-sizes API, so the probe uses the
clients the runai extras already install (boto3, google-cloud-storage, azure-storage-blob), configured from
the same environment variables runai reads. Every failure is a StoreError naming the URI; one about access
says what to set (:mod:`.access_hints`).
"""

from __future__ import annotations

import functools
import importlib
import os
from typing import Optional

from ..errors import StoreError
from .access_hints import access_error, failure
from .s3_ranged import RangedReader, RangedReadError
from .storage import (
    AZURE_PREFIX, GCS_PREFIX, S3_PREFIX, LocalStore, ObjectInfo, Store, looks_like_hub_id, normalize_uri, split_bucket,
)  # fmt: skip

# Attempts per object-store request while probing, the first included (retries on throttling and resets).
# Fixed (it was MX_ROBUST_PROBE_MAX_ATTEMPTS); read when a store is opened.
PROBE_MAX_ATTEMPTS = 3


def open_store(uri: str, *, timeout_s: float = 20.0) -> Store:
    """The store holding ``uri``; raises StoreError for what is no source."""
    if uri.startswith(S3_PREFIX):
        return _S3Store(uri, timeout_s=timeout_s, max_attempts=PROBE_MAX_ATTEMPTS)
    if uri.startswith(GCS_PREFIX):
        return _GcsStore(uri)
    if uri.startswith(AZURE_PREFIX):
        return _AzureStore(uri)
    if "://" in uri:
        raise StoreError(f"{uri}: unsupported scheme (expected s3://, gs://, az:// or a local folder)")
    if looks_like_hub_id(uri):
        raise StoreError(f"{uri}: no such local folder (it looks like a Hugging Face hub id, which cannot be streamed)")
    if not os.path.exists(uri):
        raise StoreError(f"{uri}: no such local folder")
    if not os.path.isdir(uri):
        raise StoreError(f"{uri}: not a folder")
    return LocalStore(uri)


def source_changes(source: str, shards, settings) -> tuple[list[str], list[str]]:
    """(shards whose identity changed, shards whose identity could not be read), as messages.

    One listing of the source gives every shard's identity at once (a page
    per 1,000 objects on an object store), instead of a request per shard.
    """
    try:
        store = open_store(source, timeout_s=settings.probe_timeout_s)
        depth = max((shard.key.count("/") for shard in shards), default=0)
        listed = {obj.key: obj.identity for obj in store.list(depth)}
    except StoreError as exc:
        return [], [f"{source} ({exc})"]
    changed, unknown = [], []
    for shard in shards:
        if shard.key not in listed:
            changed.append(f"{shard.uri} (was {shard.identity}, now gone)")
        elif listed[shard.key] is None:
            unknown.append(f"{shard.uri} (no identity)")
        elif listed[shard.key] != shard.identity:
            changed.append(f"{shard.uri} (was {shard.identity}, now {listed[shard.key]})")
    return changed, unknown


class _S3Store:
    """S3 and S3-compatible stores, configured like runai's own S3 client.

    ``AWS_ENDPOINT_URL`` and credentials come from boto3's usual chain;
    ``RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING=0`` selects path addressing and
    ``RUNAI_STREAMER_S3_UNSIGNED=1`` anonymous access, as for runai.
    """

    def __init__(self, uri: str, *, timeout_s: float, max_attempts: int) -> None:
        self.root = normalize_uri(uri)
        self.bucket, self.prefix = split_bucket(uri, S3_PREFIX)
        if not self.bucket:
            raise StoreError(f"{uri}: no bucket in the URI")
        env = tuple(os.environ.get(v) for v in S3_CLIENT_ENV)
        try:
            self._client = _s3_client(timeout_s, max_attempts, env)
            self._reader = _s3_reader(timeout_s, max_attempts, env)
        except Exception as exc:  # half a key pair, an unknown AWS_PROFILE: no source, not a crash
            raise access_error(S3_PREFIX, f"{uri}: cannot create an S3 client", exc) from exc

    def list(self, max_depth: int) -> list[ObjectInfo]:
        found: list[ObjectInfo] = []
        try:
            paginator = self._client.get_paginator("list_objects_v2")
            for page in paginator.paginate(Bucket=self.bucket, Prefix=self.prefix):
                for obj in page.get("Contents", ()):
                    key = obj["Key"][len(self.prefix) :]
                    if not key or key.endswith("/") or key.count("/") > max_depth:
                        continue
                    uri = f"s3://{self.bucket}/{obj['Key']}"
                    found.append(ObjectInfo(key, uri, int(obj["Size"]), identity=_etag(obj.get("ETag"))))
        except Exception as exc:  # botocore raises many unrelated types
            raise access_error(S3_PREFIX, f"{self.root}: listing failed", exc) from exc
        return found

    def read(self, obj: ObjectInfo, start: int, length: int) -> bytes:
        """A ranged GET through :mod:`.s3_ranged` (presigned by this store's client, sent by urllib3)."""
        if length <= 0:
            return b""
        key = obj.uri[len(f"s3://{self.bucket}/") :]
        what = f"{obj.uri}: ranged read of bytes {start}-{start + length - 1} failed"
        try:
            return self._reader.read(self.bucket, key, start, length)
        except RangedReadError as exc:
            raise failure(S3_PREFIX, what, exc, named=False) from exc
        except Exception as exc:  # presigning: credentials or configuration botocore refuses
            raise access_error(S3_PREFIX, what, exc) from exc

    def identity(self, obj: ObjectInfo) -> Optional[str]:
        key = obj.uri[len(f"s3://{self.bucket}/") :]
        try:
            head = self._client.head_object(Bucket=self.bucket, Key=key)
        except Exception as exc:
            response = getattr(exc, "response", None) or {}
            if response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return "deleted"
            raise failure(S3_PREFIX, f"{obj.uri}: HEAD failed", exc) from exc
        return _etag(head.get("ETag"))


# What an S3 client is built from: one client per distinct set, reused by every probe and check.
S3_CLIENT_ENV = (
    "AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
    "AWS_REGION", "AWS_DEFAULT_REGION", "RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING", "RUNAI_STREAMER_S3_UNSIGNED",
)  # fmt: skip
_POOL_CONNECTIONS = 32  # above the probe's and checks' thread counts, so no connection is dropped


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
        connect_timeout=timeout_s, read_timeout=timeout_s,
        retries={"total_max_attempts": max_attempts, "mode": "standard"},  # attempts, first included
        s3={"addressing_style": "path"} if (values["RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING"] or "1") == "0" else None,
        # SigV4 also for the presigned ranged reads (botocore presigns S3 with SigV2 by default, which newer
        # regions refuse).
        signature_version=UNSIGNED if values["RUNAI_STREAMER_S3_UNSIGNED"] == "1" else "s3v4",
        max_pool_connections=_POOL_CONNECTIONS,
    )
    return boto3.session.Session().client("s3", config=config)


@functools.lru_cache(maxsize=8)
def _s3_reader(timeout_s: float, max_attempts: int, env: tuple):
    """The ranged-GET path (:mod:`.s3_ranged`) of the client for the same configuration."""
    client = _s3_client(timeout_s, max_attempts, env)
    return RangedReader(client, timeout_s=timeout_s, max_attempts=max_attempts, pool_size=_POOL_CONNECTIONS)


def _etag(value: object) -> Optional[str]:
    return f"etag={str(value).strip(chr(34))}" if value else None


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
        try:  # ImportError when the extra, or _create_client in it, is missing
            create_client = importlib.import_module(self.client_module)._create_client
        except (ImportError, AttributeError) as exc:
            extra, scheme = self.extra, self.scheme
            raise StoreError(f"{uri}: install runai-model-streamer[{extra}] to read {scheme} sources") from exc
        self.root = normalize_uri(uri)
        self.bucket_name, self.prefix = split_bucket(uri, self.scheme)
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
            if key and not key.endswith("/") and key.count("/") <= max_depth:
                uri = f"{self.scheme}{self.bucket_name}/{blob.name}"
                found.append(ObjectInfo(key, uri, int(blob.size), identity=self._identity_of(blob)))
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
            raise failure(self.scheme, f"{obj.uri}: ranged read failed", exc) from exc

    def identity(self, obj: ObjectInfo) -> Optional[str]:
        name = self._name(obj)
        try:
            found = self._metadata(name)
        except Exception as exc:
            if type(exc).__name__ == self.missing_error:
                return "deleted"
            raise failure(self.scheme, f"{obj.uri}: metadata read failed", exc) from exc
        return self._identity_of(found)


class _GcsStore(_BucketStore):
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
        generation, etag = getattr(blob, "generation", None), getattr(blob, "etag", None)
        return f"generation={generation}" if generation is not None else (f"etag={etag}" if etag else None)


class _AzureStore(_BucketStore):
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

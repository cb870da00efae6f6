"""Ranged GETs on S3 without botocore's per-request pipeline.

A probe reads one ranged slice per shard (the header), 163 of them for
DeepSeek-V3, on a few threads that share the GIL. botocore spends about
1.4 ms of Python per ``get_object`` (measured here with ``time.thread_time``
against s3rver on 127.0.0.1: event hooks, request building, signing, response
parsing), and that time serializes across the probe's threads. Signing a URL
costs about 0.12 ms and a urllib3 GET about 0.5 ms, so :class:`RangedReader`
presigns each object once with the same boto3 client (its credentials, endpoint,
addressing and signature version) and sends the GETs itself, through
urllib3, which botocore already depends on.

What botocore's standard retry mode gave the probe stays: throttling and 5xx
answers, connection errors, timeouts and bodies cut short are retried up to
the configured attempts with jittered backoff; any other answer fails at once
with S3's own error code and message (``SlowDown``, ``AccessDenied``, ...).
"""

from __future__ import annotations

import random
import re
import threading
import time
from typing import Optional

# S3 answers worth another attempt (botocore's standard mode retries the same).
_RETRY_STATUS = frozenset({429, 500, 502, 503, 504})
_RETRY_CODES = frozenset({"SlowDown", "Throttling", "ThrottlingException", "RequestTimeout", "InternalError"})
_PRESIGN_TTL_S = 3600  # a URL is reused for at most _PRESIGN_REUSE_S, well inside its validity
_PRESIGN_REUSE_S = 900
_BACKOFF_BASE_S = 0.05
_BACKOFF_CAP_S = 2.0


class RangedReadError(Exception):
    """A ranged GET that did not return the bytes: ``code`` is S3's error code or the exception's type."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code


def _s3_error(body: bytes) -> tuple[Optional[str], str]:
    text = body[:4096].decode("utf-8", "replace")
    code = re.search(r"<Code>([^<]*)</Code>", text)
    message = re.search(r"<Message>([^<]*)</Message>", text)
    return (code.group(1) if code else None), (message.group(1) if message else text.strip()[:200])


class RangedReader:
    """Ranged GETs for one boto3 S3 client: presigned URLs (cached per object), a urllib3 pool."""

    def __init__(self, client, *, timeout_s: float, max_attempts: int, pool_size: int) -> None:
        import botocore
        import urllib3

        self._client = client
        self._max_attempts = max(1, max_attempts)
        self._timeout = urllib3.Timeout(connect=timeout_s, read=timeout_s)
        self._pool = urllib3.PoolManager(maxsize=pool_size, block=False, retries=False)
        self._errors = (urllib3.exceptions.HTTPError, OSError)
        # The probe is a Python SDK client, and says so (S3 access logs, and the tests' fault proxy, tell by it).
        self._agent = f"Botocore/{botocore.__version__} mx-strategies-probe"
        self._urls: dict[tuple[str, str], tuple[str, float]] = {}
        self._lock = threading.Lock()

    def _url(self, bucket: str, key: str) -> str:
        now = time.monotonic()
        with self._lock:
            cached = self._urls.get((bucket, key))
            if cached is not None and now - cached[1] < _PRESIGN_REUSE_S:
                return cached[0]
        url = self._client.generate_presigned_url("get_object", Params={"Bucket": bucket, "Key": key},
                                                  ExpiresIn=_PRESIGN_TTL_S)  # fmt: skip
        with self._lock:
            self._urls[(bucket, key)] = (url, now)
        return url

    def read(self, bucket: str, key: str, start: int, length: int) -> bytes:
        """Bytes ``start`` to ``start + length - 1`` of the object; raises RangedReadError."""
        headers = {"Range": f"bytes={start}-{start + length - 1}", "User-Agent": self._agent}
        code, message, attempts = "", "", 0
        for attempts in range(1, self._max_attempts + 1):
            if attempts > 1:
                time.sleep(random.uniform(0, min(_BACKOFF_CAP_S, _BACKOFF_BASE_S * 2 ** (attempts - 1))))
            try:
                response = self._pool.request(
                    "GET", self._url(bucket, key), headers=headers, timeout=self._timeout, preload_content=True
                )
            except self._errors as exc:  # refused, reset, timed out, or a body cut short
                code, message = type(exc).__name__, str(exc)
                continue
            if response.status == 206:
                return response.data
            if response.status == 200:  # a server that ignores Range sends the object: keep the slice
                return response.data[start : start + length]
            found, text = _s3_error(response.data)
            code, message = found or f"HTTP {response.status}", f"{text} (HTTP {response.status})"
            if response.status == 403:
                with self._lock:  # credentials may have rotated: sign again on the next attempt
                    self._urls.pop((bucket, key), None)
            if response.status not in _RETRY_STATUS and code not in _RETRY_CODES:
                break
        tried = f" (after {attempts} attempts)" if attempts > 1 else ""
        raise RangedReadError(code, message + tried)


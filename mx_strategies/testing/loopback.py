"""A real S3-compatible server on 127.0.0.1, for the demo, benchmarks and tests.

``LoopbackS3`` starts moto's threaded server, puts a byte-counting TCP proxy
in front of it (so a caller can see how many bytes a load really pulled),
points boto3 and runai-model-streamer at the proxy through the environment,
and restores everything on exit. Only 127.0.0.1 is ever bound or targeted.
"""

from __future__ import annotations

import os
import socket
import threading
from typing import Optional

LOOPBACK = "127.0.0.1"
S3_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
    "RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING": "0",
}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((LOOPBACK, 0))
        return sock.getsockname()[1]


class LoopbackListener:
    """Accepts TCP connections on 127.0.0.1 and serves each in a thread.

    Subclasses say what serving a connection means (``_serve``): forwarding
    and counting here, fault injection in the tests.
    """

    thread_name = "loopback-listener"

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self._lock = threading.Lock()
        self._sock: Optional[socket.socket] = None
        self._stop = threading.Event()

    @property
    def endpoint(self) -> str:
        return f"http://{LOOPBACK}:{self.port}"

    def start(self):
        self._sock = socket.socket()
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((LOOPBACK, 0))
        self._sock.listen(128)
        self._sock.settimeout(0.2)
        self.port = self._sock.getsockname()[1]
        threading.Thread(target=self._accept, name=self.thread_name, daemon=True).start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._sock is not None:
            self._sock.close()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._sock.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), name=f"{self.thread_name}-conn", daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        raise NotImplementedError


class CountingProxy(LoopbackListener):
    """Forwards TCP connections to ``target_port`` and counts bytes each way.

    ``to_client`` is what the server served: a load's real read volume.
    """

    thread_name = "counting-proxy"

    def __init__(self, target_port: int) -> None:
        super().__init__(target_port)
        self.to_client = 0
        self.to_server = 0
        self.connections = 0

    def reset(self) -> None:
        with self._lock:
            self.to_client = self.to_server = self.connections = 0

    def _serve(self, client: socket.socket) -> None:
        try:
            upstream = socket.create_connection((LOOPBACK, self.target_port), timeout=10)
        except OSError:
            client.close()
            return
        upstream.settimeout(None)
        client.settimeout(None)
        with self._lock:
            self.connections += 1
        threading.Thread(target=self._pipe, args=(client, upstream, "to_server"), daemon=True).start()
        self._pipe(upstream, client, "to_client")

    def _pipe(self, src: socket.socket, dst: socket.socket, counter: str) -> None:
        try:
            while True:
                data = src.recv(1 << 16)
                if not data:
                    break
                dst.sendall(data)
                with self._lock:
                    setattr(self, counter, getattr(self, counter) + len(data))
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                sock.close()


class LoopbackS3:
    """moto on 127.0.0.1 behind a proxy (``proxy_class``), with the environment set.

    Clients under test (boto3 for the probe, runai for streaming) reach moto
    through the proxy, whose counters (or faults) therefore see only them;
    setting up (``create_bucket``, ``upload``) goes to moto directly. Use as a
    context manager; ``upload(folder, bucket, prefix)`` returns the ``s3://``
    URI of the uploaded folder.
    """

    proxy_class: type = CountingProxy

    def __init__(self) -> None:
        self.server = None
        self.proxy = None
        self.endpoint = ""  # the proxy, as clients under test see it
        self.direct = ""  # moto itself
        self._saved_env: dict[str, Optional[str]] = {}

    def __enter__(self):
        from . import require_demo_extra

        require_demo_extra("the loopback S3 server")
        from moto.server import ThreadedMotoServer

        port = free_port()
        self.server = ThreadedMotoServer(ip_address=LOOPBACK, port=port, verbose=False)
        self.server.start()
        self.direct = f"http://{LOOPBACK}:{port}"
        self.proxy = self.proxy_class(port).start()
        self.endpoint = self.proxy.endpoint
        env = dict(S3_ENV, AWS_ENDPOINT_URL=self.endpoint)
        for key, value in env.items():
            self._saved_env[key] = os.environ.get(key)
            os.environ[key] = value
        return self

    def __exit__(self, *exc) -> None:
        for key, value in self._saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        if self.proxy is not None:
            self.proxy.stop()
        if self.server is not None:
            self.server.stop()

    def client(self):
        """A boto3 client talking to moto directly (for setting up)."""
        import boto3

        return boto3.client("s3", endpoint_url=self.direct, region_name="us-east-1")

    def create_bucket(self, bucket: str) -> None:
        client = self.client()
        try:
            client.create_bucket(Bucket=bucket)
        except client.exceptions.BucketAlreadyOwnedByYou:
            pass

    def upload(self, folder: str, bucket: str, prefix: str) -> str:
        """Upload every file under ``folder`` to ``s3://bucket/prefix/``."""
        self.create_bucket(bucket)
        client = self.client()
        for dirpath, _, filenames in os.walk(folder):
            for name in sorted(filenames):
                path = os.path.join(dirpath, name)
                rel = os.path.relpath(path, folder).replace(os.sep, "/")
                client.upload_file(path, bucket, f"{prefix}/{rel}")
        return f"s3://{bucket}/{prefix}"

    @property
    def bytes_served(self) -> int:
        return self.proxy.to_client if self.proxy else 0

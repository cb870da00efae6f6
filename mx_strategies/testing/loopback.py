"""A real S3-compatible server on 127.0.0.1, for the demo, benchmarks and tests.

``LoopbackS3`` starts an S3 server, puts a byte-counting TCP proxy in front
of it (so a caller can see how many bytes a load really pulled), points
boto3 and runai-model-streamer at the proxy through the environment, and
restores everything on exit. Only 127.0.0.1 is ever bound or targeted.

Two servers: moto (in process, the default; the tests' server) and s3rver
(``S3rverS3``, npm, a subprocess). moto copies the whole object for every
ranged GET and serves about 0.1 GB/s here, which makes it the bottleneck of
any throughput measurement; s3rver streams a range from its file. For
benchmarks, :class:`ShapingProxy` adds what a real object store has and
loopback lacks: a delay to first byte per request and a bandwidth cap per
connection.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from typing import Callable, Optional

LOOPBACK = "127.0.0.1"
# One key pair for every loopback server: s3rver accepts only its own, moto any. (botocore keeps
# the first credentials a process resolves, so servers with different keys could not share one.)
S3_ENV = {
    "AWS_ACCESS_KEY_ID": "S3RVER",
    "AWS_SECRET_ACCESS_KEY": "S3RVER",
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
        self.requests: list[tuple[str, str, Optional[str]]] = []  # (method, path, Range header), as sent

    def reset(self) -> None:
        with self._lock:
            self.to_client = self.to_server = self.connections = 0
            self.requests = []

    def _note_request(self, data: bytes) -> None:
        """Record a request's method, path and Range when ``data`` starts one (its head arrives whole)."""
        if not data.startswith((b"GET ", b"HEAD ", b"PUT ", b"POST ", b"DELETE ")):
            return
        head = data.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")
        method, path = head[0].split(" ")[:2]
        ranges = [line.split(":", 1)[1].strip() for line in head[1:] if line.lower().startswith("range:")]
        with self._lock:
            self.requests.append((method, path, ranges[0] if ranges else None))

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
        self._piping(src, dst)
        self._pump(src, dst, lambda data: self._forward(data, dst, counter))

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket, forward: Callable[[bytes], Optional[bool]]) -> None:
        """Hand each chunk ``src`` sends to ``forward`` (which passes it to ``dst``) until ``src`` closes,
        ``forward`` returns True or a socket fails; then close both."""
        try:
            while True:
                data = src.recv(1 << 16)
                if not data or forward(data):
                    break
        except OSError:
            pass
        finally:
            _close(src, dst)

    def _forward(self, data: bytes, dst: socket.socket, counter: str) -> bool:
        """Forward one chunk and count it under ``counter``; True ends this pipe."""
        if counter == "to_server":
            self._note_request(data)
        dst.sendall(data)
        with self._lock:
            setattr(self, counter, getattr(self, counter) + len(data))
        return self._forwarded(counter)

    def _piping(self, src: socket.socket, dst: socket.socket) -> None:
        """Hook: a pipe from ``src`` to ``dst`` starts. Fault-injecting subclasses keep the sockets."""

    def _forwarded(self, counter: str) -> bool:
        """Hook, after each chunk was forwarded and counted; True ends this pipe. Counting forwards all."""
        return False


class ShapingProxy(CountingProxy):
    """A counting proxy that behaves like a remote object store: latency and per-connection bandwidth.

    Each response's first byte waits ``first_byte_s`` after its request was
    sent, and each response flows at most ``bytes_per_s`` (its clock starts
    with the response, so a kept-alive connection that sat idle cannot burst
    above the cap). Set the two class attributes (or subclass) before
    starting it.
    """

    thread_name = "shaping-proxy"
    first_byte_s: float = 0.03
    bytes_per_s: float = 200e6

    def __init__(self, target_port: int) -> None:
        super().__init__(target_port)
        self._requested: dict[int, float] = {}  # upstream socket -> when its pending request went out

    def _pipe(self, src: socket.socket, dst: socket.socket, counter: str) -> None:
        if counter == "to_server":
            return self._pump(src, dst, self._request_forwarder(dst))
        return self._pump(src, dst, self._response_forwarder(src, dst))

    def _request_forwarder(self, dst: socket.socket) -> Callable[[bytes], None]:
        """A request pipe's step: note when the request went out (its response waits from then), forward, count."""
        key = id(dst)

        def forward(data: bytes) -> None:
            self._requested.setdefault(key, time.monotonic())  # a request went out: its response waits
            self._note_request(data)
            dst.sendall(data)
            with self._lock:
                self.to_server += len(data)

        return forward

    def _response_forwarder(self, src: socket.socket, dst: socket.socket) -> Callable[[bytes], None]:
        """A response pipe's step: delay a response's first byte, cap its rate, forward, count."""
        started = time.monotonic()
        sent = 0

        def forward(data: bytes) -> None:
            nonlocal started, sent
            requested = self._requested.pop(id(src), None)
            if requested is not None:  # a new response: its first byte waits, its rate restarts
                delay = requested + self.first_byte_s - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                started, sent = time.monotonic(), 0
            dst.sendall(data)
            sent += len(data)
            if self.bytes_per_s:
                ahead = started + sent / self.bytes_per_s - time.monotonic()
                if ahead > 0:
                    time.sleep(ahead)
            with self._lock:
                self.to_client += len(data)

        return forward


def _close(*socks: socket.socket) -> None:
    for sock in socks:
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
        port = self._start_server()
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

    def _start_server(self) -> int:
        """Start the S3 server on 127.0.0.1; return its port."""
        from . import require_demo_extra

        require_demo_extra("the loopback S3 server")
        from moto.server import ThreadedMotoServer

        port = free_port()
        self.server = ThreadedMotoServer(ip_address=LOOPBACK, port=port, verbose=False)
        self.server.start()
        return port

    def client(self):
        """A boto3 client talking to the server directly (for setting up)."""
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.direct,
            region_name="us-east-1",
            aws_access_key_id=S3_ENV["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=S3_ENV["AWS_SECRET_ACCESS_KEY"],
        )

    def create_bucket(self, bucket: str) -> None:
        client = self.client()
        try:
            client.create_bucket(Bucket=bucket)
        except (client.exceptions.BucketAlreadyOwnedByYou, client.exceptions.BucketAlreadyExists):
            pass  # moto says the first, s3rver the second

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


S3RVER_VERSION = "3.7.1"


def s3rver_binary(cache: Optional[str] = None) -> str:
    """s3rver from the npm registry, installed once into a cache folder (idempotent)."""
    cache = cache or os.environ.get("MX_TEST_CACHE") or os.path.expanduser("~/.cache/mx-strategies")
    prefix = os.path.join(cache, f"s3rver-{S3RVER_VERSION}")
    binary = os.path.join(prefix, "node_modules", ".bin", "s3rver")
    if not os.path.exists(binary):
        npm = shutil.which("npm")
        if npm is None:
            raise RuntimeError("s3rver needs Node.js and npm (apt-get install nodejs npm)")
        subprocess.run(
            [npm, "install", "--prefix", prefix, "--no-audit", "--no-fund", "--loglevel=error", f"s3rver@{S3RVER_VERSION}"],
            check=True,
            timeout=600,
        )
    return binary


class _Process:
    """A server subprocess that ``stop()`` ends (the interface ThreadedMotoServer has)."""

    def __init__(self, process: subprocess.Popen, workdir: str) -> None:
        self.process = process
        self.workdir = workdir

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)
        shutil.rmtree(self.workdir, ignore_errors=True)


class S3rverS3(LoopbackS3):
    """:class:`LoopbackS3` on s3rver (npm), which serves a ranged GET from its file without copying the object.

    s3rver checks request signatures with its own fixed key pair (``S3_ENV``'s).
    """

    start_timeout_s = 60.0

    def _start_server(self) -> int:
        binary = s3rver_binary()
        port = free_port()
        workdir = tempfile.mkdtemp(prefix="mx-s3rver-")
        process = subprocess.Popen(
            [binary, "--address", LOOPBACK, "--port", str(port), "--directory", workdir, "--silent"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.server = _Process(process, workdir)
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"s3rver exited with {process.returncode} before listening on {LOOPBACK}:{port}")
            try:
                socket.create_connection((LOOPBACK, port), timeout=1).close()
                return port
            except OSError:
                time.sleep(0.1)
        self.server.stop()
        raise RuntimeError(f"s3rver did not listen on {LOOPBACK}:{port} within {self.start_timeout_s:.0f}s")

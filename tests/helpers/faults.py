"""A fault-injecting HTTP proxy on 127.0.0.1, for object-store fault tests.

``FaultProxy`` sits between the clients under test (runai-model-streamer's
C++ S3/Azure/GCS clients and the probe's Python clients) and a real local
server (moto, azurite, fake-gcs-server). It parses each HTTP/1.1 request,
forwards it upstream with ``http.client``, and before answering applies the
first matching :class:`Rule`: a burst of 5xx with a throttling body, a
connection reset or a body cut short mid-way, a delay or a mid-body stall,
a ranged read answered with the wrong bytes, or data bytes flipped at chosen
file offsets. Every fault that fires is recorded in ``events``, so a test
can assert the fault really happened rather than passing vacuously.

Only 127.0.0.1 is bound or targeted. Each connection is handled in its own
daemon thread and every socket read has a timeout, so nothing outlives a
test for long.

``python -m helpers.faults``, run in ``tests/``, prints docs/faults.md's fault table.
"""

from __future__ import annotations

import http.client
import re
import socket
import struct
import time
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from mx_strategies.testing.loopback import LOOPBACK, LoopbackListener, LoopbackS3
from mx_strategies.verify.tensor_bytes import same_bytes

SOCKET_TIMEOUT_S = 30.0

SLOWDOWN_XML = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n'
    b"<Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message>"
    b"<RequestId>fault-proxy</RequestId></Error>"
)
INTERNAL_ERROR_XML = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n'
    b"<Error><Code>InternalError</Code><Message>We encountered an internal error. Please try again.</Message>"
    b"<RequestId>fault-proxy</RequestId></Error>"
)
_RANGE = re.compile(r"bytes=(\d+)-(\d*)")
_CONTENT_RANGE = re.compile(r"bytes (\d+)-(\d+)/(\d+|\*)")

# The fault kinds a Rule can inject.
STATUS = "status"  # answer with `status` and a throttling/error XML body instead of forwarding
RESET = "reset"  # send the head and `keep_bytes` of the body, then reset the connection (RST)
SHORT = "short"  # send the head (full Content-Length) and `keep_bytes`, then close cleanly (FIN)
DELAY = "delay"  # wait `delay_s` before answering
STALL = "stall"  # send the head and `keep_bytes`, wait `delay_s`, then send the rest
WRONG_RANGE = "wrong_range"  # serve the bytes `shift` further on, labelled as the range asked for
CORRUPT = "corrupt"  # flip the bits of file bytes [corrupt_start, corrupt_end) wherever served
KINDS = (STATUS, RESET, SHORT, DELAY, STALL, WRONG_RANGE, CORRUPT)


@dataclass
class Request:
    """One parsed client request."""

    method: str
    target: str  # the request target as sent (path and query)
    headers: dict[str, str]  # lower-cased names
    body: bytes

    @property
    def path(self) -> str:
        return self.target.split("?", 1)[0]

    @property
    def range(self) -> Optional[tuple[int, Optional[int]]]:
        match = _RANGE.fullmatch(self.headers.get("range", "").strip())
        if not match:
            return None
        return int(match.group(1)), int(match.group(2)) if match.group(2) else None

    @property
    def client(self) -> str:
        """Who sent it: "probe" (Python SDKs) or "streamer" (runai's C++ clients)."""
        agent = self.headers.get("user-agent", "").lower()
        if any(p in agent for p in ("boto", "botocore", "azsdk-python", "gcloud-python", "gl-python", "python-requests")):
            return "probe"
        return "streamer"


@dataclass
class Rule:
    """Inject ``kind`` into matching requests, ``times`` times (None: always).

    A request matches when every given criterion holds: HTTP ``method``,
    ``path_contains`` in the path, ``ranged`` (has a Range header or not),
    ``client`` ("probe" or "streamer", told apart by User-Agent), and
    ``when`` (any predicate on the :class:`Request`). ``skip`` lets that many
    matching requests through first. ``delay_s`` is the wait before
    answering, for every kind (for STALL: the pause mid-body).
    """

    kind: str
    times: Optional[int] = 1
    method: Optional[str] = "GET"
    path_contains: Optional[str] = None
    ranged: Optional[bool] = None
    client: Optional[str] = None
    when: Optional[Callable[[Request], bool]] = None
    skip: int = 0
    status: int = 503
    keep_bytes: int = 0
    delay_s: float = 0.0
    shift: int = 8
    corrupt_start: int = 0
    corrupt_end: int = 0
    fired: int = 0
    seen: int = 0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown fault kind {self.kind!r}; expected one of {KINDS}")

    def matches(self, request: Request) -> bool:
        if self.method is not None and request.method != self.method:
            return False
        if self.path_contains is not None and self.path_contains not in request.path:
            return False
        if self.ranged is not None and (request.range is not None) != self.ranged:
            return False
        if self.client is not None and request.client != self.client:
            return False
        if self.when is not None and not self.when(request):
            return False
        return True

    def take(self, request: Request) -> bool:
        """Whether this rule fires for ``request`` (counts it if so)."""
        if not self.matches(request):
            return False
        self.seen += 1
        if self.seen <= self.skip:
            return False
        if self.times is not None and self.fired >= self.times:
            return False
        self.fired += 1
        return True


@dataclass(frozen=True)
class Event:
    """A fault that fired, for tests to assert on."""

    kind: str
    method: str
    path: str
    range: Optional[tuple[int, Optional[int]]]
    client: str
    at: float


@dataclass
class _Response:
    status: int
    reason: str
    headers: list[tuple[str, str]]
    body: bytes
    keep_alive: bool = True

    def head(self) -> bytes:
        lines = [f"HTTP/1.1 {self.status} {self.reason}"]
        lines += [f"{k}: {v}" for k, v in self.headers]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    def set_header(self, name: str, value: str) -> None:
        self.headers = [(k, v) for k, v in self.headers if k.lower() != name.lower()] + [(name, value)]

    def header(self, name: str) -> Optional[str]:
        for k, v in self.headers:
            if k.lower() == name.lower():
                return v
        return None


class FaultProxy(LoopbackListener):
    """HTTP proxy on 127.0.0.1 in front of ``target_port``, injecting faults.

    ``add(rule)`` arms a fault; ``clear()`` disarms all and forgets events.
    ``requests`` counts every request seen, by client ("probe"/"streamer").
    """

    thread_name = "fault-proxy"

    def __init__(self, target_port: int) -> None:
        super().__init__(target_port)
        self.rules: list[Rule] = []
        self.events: list[Event] = []
        self.requests: dict[str, int] = {"probe": 0, "streamer": 0}
        self.log: list[tuple[str, str, str, Optional[tuple[int, Optional[int]]]]] = []

    # -- control ---------------------------------------------------------------

    def add(self, rule: Rule) -> Rule:
        with self._lock:
            self.rules.append(rule)
        return rule

    def clear(self) -> None:
        with self._lock:
            self.rules.clear()
            self.events.clear()
            self.requests = {"probe": 0, "streamer": 0}
            self.log.clear()

    def fired(self, kind: Optional[str] = None) -> list[Event]:
        with self._lock:
            return [e for e in self.events if kind is None or e.kind == kind]

    # -- serving ---------------------------------------------------------------

    def _serve(self, client: socket.socket) -> None:
        client.settimeout(SOCKET_TIMEOUT_S)
        upstream = http.client.HTTPConnection(LOOPBACK, self.target_port, timeout=SOCKET_TIMEOUT_S)
        reader = client.makefile("rb")
        try:
            while not self._stop.is_set():
                request = _read_request(reader)
                if request is None:
                    return
                with self._lock:
                    self.requests[request.client] += 1
                    self.log.append((request.client, request.method, request.path, request.range))
                    rule = next((r for r in self.rules if r.take(request)), None)
                    if rule is not None:
                        self.events.append(
                            Event(rule.kind, request.method, request.path, request.range, request.client, time.time())
                        )
                if not self._answer(client, upstream, request, rule):
                    return
        except (OSError, http.client.HTTPException):
            return
        finally:
            upstream.close()
            reader.close()
            try:
                client.close()
            except OSError:
                pass

    def _answer(self, client: socket.socket, upstream, request: Request, rule: Optional[Rule]) -> bool:
        """Answer one request; False when the connection is finished."""
        if rule is not None and rule.delay_s and rule.kind != STALL:
            time.sleep(rule.delay_s)  # DELAY is only this; for other faults it holds the fault back
        if rule is not None and rule.kind == STATUS:
            body = SLOWDOWN_XML if rule.status == 503 else INTERNAL_ERROR_XML
            reason = "Slow Down" if rule.status == 503 else "Internal Server Error"
            response = _Response(rule.status, reason, [("Content-Type", "application/xml")], body)
            response.set_header("Content-Length", str(len(body)))
            client.sendall(response.head() + response.body)
            return True
        if rule is not None and rule.kind == WRONG_RANGE and request.range is not None:
            start, end = request.range
            shifted = f"bytes={start + rule.shift}-" + ("" if end is None else str(end + rule.shift))
            request.headers["range"] = shifted
            response = _forward(upstream, request)
            _relabel_range(response, start, end)
        else:
            response = _forward(upstream, request)
        if rule is not None and rule.kind == CORRUPT:
            response.body = _flip(response, rule.corrupt_start, rule.corrupt_end)
        head = response.head()
        if rule is not None and rule.kind in (RESET, SHORT, STALL):
            keep = min(rule.keep_bytes, max(len(response.body) - 1, 0))
            client.sendall(head + response.body[:keep])
            if rule.kind == STALL:
                time.sleep(rule.delay_s)
                client.sendall(response.body[keep:])
                return response.keep_alive
            if rule.kind == RESET:
                # SO_LINGER with a zero timeout makes close() send RST, not FIN.
                client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            else:
                client.shutdown(socket.SHUT_RDWR)
            return False
        client.sendall(head + response.body)
        return response.keep_alive


def _read_request(reader) -> Optional[Request]:
    line = reader.readline(65537)
    while line in (b"\r\n", b"\n"):
        line = reader.readline(65537)
    if not line:
        return None
    parts = line.decode("latin-1").rstrip("\r\n").split(" ")
    if len(parts) != 3:
        return None
    method, target, _version = parts
    headers: dict[str, str] = {}
    while True:
        raw = reader.readline(65537)
        if raw in (b"\r\n", b"\n", b""):
            break
        name, _, value = raw.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    body = b""
    if headers.get("transfer-encoding", "").lower() == "chunked":
        chunks = []
        while True:
            size = int(reader.readline().split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while reader.readline() not in (b"\r\n", b"\n", b""):
                    pass
                break
            chunks.append(reader.read(size))
            reader.readline()
        body = b"".join(chunks)
        headers.pop("transfer-encoding")
        headers["content-length"] = str(len(body))
    elif "content-length" in headers:
        body = reader.read(int(headers["content-length"]))
    return Request(method, target, headers, body)


def _forward(upstream: http.client.HTTPConnection, request: Request) -> _Response:
    """Send ``request`` upstream and read the whole response."""
    for attempt in range(2):
        try:
            upstream.putrequest(request.method, request.target, skip_host=True, skip_accept_encoding=True)
            for name, value in request.headers.items():
                if name not in ("connection", "expect"):
                    upstream.putheader(name, value)
            upstream.endheaders(request.body if request.body or request.method in ("PUT", "POST") else None)
            reply = upstream.getresponse()
            body = reply.read()
            break
        except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
            upstream.close()  # the server closed an idle keep-alive connection; reconnect once
            if attempt:
                raise
    headers = [(k, v) for k, v in reply.getheaders() if k.lower() not in ("transfer-encoding", "connection", "content-length")]
    response = _Response(reply.status, reply.reason, headers, body)
    if request.method != "HEAD":
        response.set_header("Content-Length", str(len(body)))
    else:
        length = reply.getheader("Content-Length")
        if length is not None:
            response.set_header("Content-Length", length)
    return response


def _relabel_range(response: _Response, start: int, end: Optional[int]) -> None:
    """Make a shifted range answer claim to be the range that was asked for."""
    served = response.header("Content-Range")
    match = _CONTENT_RANGE.fullmatch(served or "")
    if match is None:
        return
    total = match.group(3)
    last = start + len(response.body) - 1 if end is None else min(end, start + len(response.body) - 1)
    response.body = response.body[: last - start + 1]
    response.set_header("Content-Range", f"bytes {start}-{last}/{total}")
    response.set_header("Content-Length", str(len(response.body)))


def _flip(response: _Response, corrupt_start: int, corrupt_end: int) -> bytes:
    """The body with bits flipped at file offsets [corrupt_start, corrupt_end)."""
    match = _CONTENT_RANGE.fullmatch(response.header("Content-Range") or "")
    offset = int(match.group(1)) if match else 0
    lo = max(corrupt_start - offset, 0)
    hi = min(corrupt_end - offset, len(response.body))
    if lo >= hi:
        return response.body
    body = bytearray(response.body)
    for i in range(lo, hi):
        body[i] ^= 0xFF
    return bytes(body)


# The layer the fault tests and the table load: 3 shards of these, seed 7.
FAULTS_LAYER = (
    ("q_proj.weight", (1, 1), torch.float32),
    ("down_proj.weight", (1, 2), torch.bfloat16),
    ("norm.weight", (1,), torch.float32),
)


class FaultyS3(LoopbackS3):
    """moto on 127.0.0.1 behind a :class:`FaultProxy`, with the environment set.

    Clients under test (boto3 for the probe, runai for streaming) reach moto
    only through the proxy; ``upload`` goes to moto directly, so setting up
    a test is never disturbed by the faults it arms.
    """

    proxy_class = FaultProxy


# -- the fault table in docs/faults.md -------------------------------------------------------
#
#     python -m helpers.faults     # (from tests/) prints the table's rows, measured on this machine
#
# Each row loads a fresh 3-shard checkpoint from moto through the proxy with the
# robust strategy (runai-model-streamer, real safetensors files) and reports the
# outcome and the wall time of the load. Persistent faults are also measured with
# MX_ROBUST_STREAMER_S3_MAX_RETRIES=1, the setting the tests use.


def _table() -> None:  # pragma: no cover - a measuring tool, run by hand
    import itertools
    import tempfile

    from mx_strategies.stream.streaming import streamer_environment

    from .checkpoints import layer_shards, write_checkpoint
    from .engine import direct_load, model_config

    buckets = itertools.count()
    folder = tempfile.mkdtemp()
    ckpt = write_checkpoint(folder, layer_shards(3, seed=7, layer=FAULTS_LAYER))
    files, reference = ckpt.names, ckpt.reference
    offsets = {t: (key, start) for t, (key, start, _) in ckpt.offsets.items()}

    def header_of(i):
        return lambda r: r.path.endswith(files[i]) and r.range is not None and r.range[0] == 0

    def data_of(i):
        first = min(start for key, start in offsets.values() if key == files[i])
        return lambda r: r.path.endswith(files[i]) and r.range is not None and r.range[0] >= first

    victim_key, victim_start = offsets["model.layers.1.q_proj.weight"]
    flip = dict(kind=CORRUPT, times=None, client="streamer", path_contains=victim_key, ranged=True,
                corrupt_start=victim_start + 4, corrupt_end=victim_start + 12)  # fmt: skip
    few = {"MX_ROBUST_STREAMER_S3_MAX_RETRIES": "1"}
    rows = [
        ("stream", "503 SlowDown x3 on a header read", dict(kind=STATUS, times=3, client="streamer", when=header_of(1)), {}),
        ("stream", "500 x2 on a data read", dict(kind=STATUS, status=500, times=2, client="streamer", when=data_of(1)), {}),
        ("stream", "reset mid-body x2", dict(kind=RESET, keep_bytes=300, times=2, client="streamer", when=data_of(1)), {}),
        ("stream", "body cut short x2 (Content-Length says more)", dict(kind=SHORT, keep_bytes=300, times=2, client="streamer", when=data_of(1)), {}),
        ("stream", "1.5 s delay before one answer", dict(kind=DELAY, delay_s=1.5, times=1, client="streamer", when=data_of(1)), {}),
        ("stream", "1.5 s stall mid-body", dict(kind=STALL, keep_bytes=300, delay_s=1.5, times=1, client="streamer", when=data_of(1)), {}),
        ("stream", "503 SlowDown on every header read of shard 1", dict(kind=STATUS, times=None, client="streamer", when=header_of(0)), {}),
        ("stream", "503 SlowDown on every header read of shard 1", dict(kind=STATUS, times=None, client="streamer", when=header_of(0)), few),
        ("stream", "503 x4 on a header read", dict(kind=STATUS, times=4, client="streamer", when=header_of(0)), few),
        ("stream", "503 x4 on a header read", dict(kind=STATUS, times=4, client="streamer", when=header_of(0)), dict(few, MX_ROBUST_STREAMER_S3_RETRY_TIMEOUT_S="10")),
        ("stream", "reset on every data read of the last shard", dict(kind=RESET, keep_bytes=300, delay_s=0.6, times=None, client="streamer", when=data_of(2)), {}),
        ("stream", "reset on every data read of the last shard", dict(kind=RESET, keep_bytes=300, delay_s=0.6, times=None, client="streamer", when=data_of(2)), few),
        ("stream", "body cut short on every data read of the last shard", dict(kind=SHORT, keep_bytes=300, delay_s=0.6, times=None, client="streamer", when=data_of(2)), {}),
        ("stream", "no answer at all (server hangs) on shard 1's data", dict(kind=DELAY, delay_s=120.0, times=None, client="streamer", when=data_of(0)), {}),
        ("stream", "no answer at all (server hangs) on shard 1's data", dict(kind=DELAY, delay_s=120.0, times=None, client="streamer", when=data_of(0)), few),
        ("stream", "`Range: bytes=0-7` answered with bytes 8-15", dict(kind=WRONG_RANGE, shift=8, times=None, client="streamer", when=header_of(0)), {}),
        ("stream", "data range answered 4 bytes off (last 4 missing)", dict(kind=WRONG_RANGE, shift=4, times=None, client="streamer", when=data_of(2)), {}),
        ("stream", "data range answered 4 bytes off (last 4 missing)", dict(kind=WRONG_RANGE, shift=4, times=None, client="streamer", when=data_of(2)), {"MX_ROBUST_VERIFY_CONTENT": "all"}),
        ("stream", "8 data bytes of one tensor flipped", flip, {}),
        ("stream", "8 data bytes of one tensor flipped", flip, {"MX_ROBUST_VERIFY_CONTENT": "all"}),
        ("probe", "503 SlowDown x2 on a header read", dict(kind=STATUS, times=2, client="probe", when=header_of(0)), {}),
        ("probe", "503 SlowDown on every header read", dict(kind=STATUS, times=None, client="probe", when=header_of(0)), {}),
        ("probe", "reset mid-body once", dict(kind=RESET, keep_bytes=20, times=1, client="probe", when=lambda r: r.range is not None and r.range[0] == 8), {}),
        ("probe", "body cut short once", dict(kind=SHORT, keep_bytes=20, times=1, client="probe", when=lambda r: r.range is not None and r.range[0] == 8), {}),
        ("probe", "`Range: bytes=0-7` answered with bytes 8-15", dict(kind=WRONG_RANGE, shift=8, times=None, client="probe", when=header_of(1)), {}),
    ]  # fmt: skip

    print("| side | fault | settings | outcome | time to outcome |")
    print("| --- | --- | --- | --- | --- |")
    with FaultyS3() as s3:
        for side, fault, rule, env in rows:
            uri = s3.upload(folder, f"table-{next(buckets)}", "model")
            s3.proxy.clear()
            s3.proxy.add(Rule(**rule))
            with streamer_environment({**env, "MX_MODEL_URI": uri}):
                attempt = direct_load(model_config(), reference)
            if attempt.error is None:
                wrong = [n for n, t in reference.items() if not same_bytes(attempt.model.weights[n], t)]
                outcome = "loaded, every tensor equal" if not wrong else f"**loaded with {len(wrong)} wrong tensor(s)**"
            else:
                outcome = f"failed, mutated={attempt.error.mutated}: {str(attempt.error)[:150]}"
            seconds = attempt.seconds
            shown = ", ".join(f"{k}={v}" for k, v in env.items()) or "defaults"
            fired = len(s3.proxy.fired())
            print(f"| {side} | {fault} ({fired} fired) | {shown} | {outcome} | {seconds:.1f} s |", flush=True)


if __name__ == "__main__":  # pragma: no cover
    _table()

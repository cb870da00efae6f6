"""The S3 site: a real S3 server on 127.0.0.1 behind a proxy that shapes the link like an object store.

Servers (``--s3-server``): ``s3rver`` (npm, the default) answers a ranged GET
by streaming that range from its file; ``moto`` (PyPI, the tests' server)
copies the whole object for every ranged GET in Python and serves about
0.1 GB/s here, which made it the bottleneck of every earlier S3 figure.

The proxy (:class:`ShapingProxy`) adds what loopback lacks: a delay to
the first byte of each response (``--s3-first-byte-ms``) and a bandwidth cap
per connection (``--s3-conn-mbps``), and it logs every request (method,
path, Range), so a run can say how many round trips each loader made.
"""

from __future__ import annotations

from collections import Counter

from mx_strategies.testing.loopback import LoopbackS3, S3rverS3, ShapingProxy

SERVERS = {"s3rver": S3rverS3, "moto": LoopbackS3}


def shaped_server(server: str, first_byte_s: float, bytes_per_s: float) -> LoopbackS3:
    """An S3 server context (``SERVERS[server]``) whose clients go through a shaping proxy.

    ``first_byte_s`` 0 and ``bytes_per_s`` 0 make it a plain counting proxy
    (loopback as is).
    """
    base = SERVERS[server]
    if first_byte_s <= 0 and bytes_per_s <= 0:
        return base()
    proxy = type("Shaping", (ShapingProxy,), {"first_byte_s": max(first_byte_s, 0.0), "bytes_per_s": bytes_per_s})
    return type(f"Shaped{base.__name__}", (base,), {"proxy_class": proxy})()


def describe_link(server: str, first_byte_s: float, bytes_per_s: float) -> dict:
    return {
        "server": server,
        "first_byte_s": first_byte_s,
        "bytes_per_connection_per_s": bytes_per_s or None,
        "shaped": first_byte_s > 0 or bytes_per_s > 0,
    }


def request_counts(requests: list[tuple[str, str, object]]) -> dict[str, int]:
    """Requests by kind: listings, HEADs, ranged GETs, whole-object GETs."""
    kinds: Counter = Counter()
    for method, path, ranged in requests:
        base, _, query = path.partition("?")
        presigned = "X-Amz-Signature=" in query or "Signature=" in query  # the probe's ranged GETs
        if method == "GET" and not presigned and ("list-type" in query or base.rstrip("/").count("/") <= 1 and query):
            kinds["list"] += 1
        elif method == "GET":
            kinds["ranged_get" if ranged else "get"] += 1
        else:
            kinds[method.lower()] += 1
    return dict(kinds)

"""The probe's per-request cost: an 8-byte ranged GET against s3rver on 127.0.0.1.

boto3's ``get_object`` against :mod:`mx_strategies.inspect.s3_ranged` (presigned URL,
urllib3), interleaved in the same process, medians of 9 x 100 requests. The
CPU figure is this thread's own (``time.thread_time``): the Python a probe
thread spends per request, which serializes across the probe's threads under
the GIL; the server and the loopback proxy are not in it.

Run: ``python -m benchmarks.request_cost``
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time

REPS, PER_REP = 9, 100


def main() -> None:
    from mx_strategies.inspect.object_stores import S3_CLIENT_ENV, _s3_client, _s3_reader
    from mx_strategies.testing.loopback import S3rverS3

    with S3rverS3() as s3:
        folder = tempfile.mkdtemp()
        with open(os.path.join(folder, "f.bin"), "wb") as handle:
            handle.write(os.urandom(1 << 20))
        s3.create_bucket("request-cost")
        s3.upload(folder, "request-cost", "x")
        env = tuple(os.environ.get(v) for v in S3_CLIENT_ENV)
        client, reader = _s3_client(10.0, 3, env), _s3_reader(10.0, 3, env)

        def boto3_get_object() -> bytes:
            return client.get_object(Bucket="request-cost", Key="x/f.bin", Range="bytes=0-7")["Body"].read()

        def s3_ranged() -> bytes:
            return reader.read("request-cost", "x/f.bin", 0, 8)

        assert boto3_get_object() == s3_ranged()
        samples: dict[str, list[tuple[float, float]]] = {f.__name__: [] for f in (boto3_get_object, s3_ranged)}
        for rep in range(REPS):
            for fetch in (boto3_get_object, s3_ranged) if rep % 2 else (s3_ranged, boto3_get_object):
                wall, cpu = time.perf_counter(), time.thread_time()
                for _ in range(PER_REP):
                    fetch()
                samples[fetch.__name__].append(
                    ((time.perf_counter() - wall) * 1e3 / PER_REP, (time.thread_time() - cpu) * 1e3 / PER_REP)
                )
    for name, values in samples.items():
        print(
            f"{name:18s} wall {statistics.median(w for w, _ in values):.2f} ms/request, "
            f"client-thread CPU {statistics.median(c for _, c in values):.2f} ms/request"
        )
    print("load average", " ".join(f"{v:.2f}" for v in os.getloadavg()))


if __name__ == "__main__":
    main()

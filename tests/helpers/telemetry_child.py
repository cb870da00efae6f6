"""One process of tests/test_telemetry.py: real loads with ModelExpress's metrics on.

prometheus_client picks multiprocess mode when it is imported, from
``PROMETHEUS_MULTIPROC_DIR``; the test sets it (and ``MX_METRICS_ENABLED=1``,
``MX_STRATEGY``, ``MX_MODEL_URI``) in this process's environment before it
starts, as a pod manifest does.

``python -m helpers.telemetry_child load CKPT``: one load through ModelExpress's
chain, then exit (a rank that is gone by the time of the scrape).
``python -m helpers.telemetry_child serve CKPT BAD_URI``: one load, one load
from ``BAD_URI`` that fails, then serve ModelExpress's exposition registry (the
union of every process's files) on 127.0.0.1, print the port and the load
reports as one JSON line, and wait for stdin to close.
"""

from __future__ import annotations

import json
import os
import sys


def main() -> int:
    mode, checkpoint = sys.argv[1], sys.argv[2]
    from helpers.checkpoints import reference_tensors
    from helpers.engine import direct_load, model_config, run_chain

    from mx_strategies import activation
    from mx_strategies.observe.report import recent_reports

    reference = reference_tensors(checkpoint)
    activation.register()
    run_chain(model_config(), reference)
    if mode == "load":
        print(json.dumps({"reports": recent_reports()}), flush=True)
        return 0

    os.environ["MX_MODEL_URI"] = sys.argv[3]
    failed = direct_load(model_config(), reference)
    assert failed.error is not None, "the load from a missing source did not fail"

    from modelexpress.metrics import metrics
    from prometheus_client import start_http_server

    from mx_strategies.testing.loopback import free_port

    port = free_port()
    served = start_http_server(port, addr="127.0.0.1", registry=metrics._exposition_registry())
    print(json.dumps({"port": port, "reports": recent_reports()}), flush=True)
    sys.stdin.read()
    if isinstance(served, tuple):  # prometheus_client >= 0.20: (server, thread)
        served[0].shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""configs/k8s/vllm-mtp-s3.yaml turns ModelExpress's metrics on, and Prometheus can find them.

ModelExpress 0.7's client collector (``modelexpress/metrics.py``) is opt-in:
``MX_METRICS_ENABLED`` switches it on, every rank records into
``PROMETHEUS_MULTIPROC_DIR`` (which must be set in the pod, not in Python), and
one rank serves the union on ``MX_METRICS_PORT``. The pod template's
``prometheus.io/*`` annotations must name that port and path, and the container
must expose it. The variable names are read from the installed ModelExpress, so
a rename there fails here.
"""

from __future__ import annotations

import importlib.util
import os

import yaml

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MANIFEST = os.path.join(REPO, "configs", "k8s", "vllm-mtp-s3.yaml")
METRICS_VARIABLES = ("MX_METRICS_ENABLED", "PROMETHEUS_MULTIPROC_DIR", "MX_METRICS_PORT")


def deployment() -> dict:
    with open(MANIFEST) as handle:
        (found,) = [d for d in yaml.safe_load_all(handle) if d and d["kind"] == "Deployment"]
    return found


def vllm_container() -> dict:
    (container,) = [c for c in deployment()["spec"]["template"]["spec"]["containers"] if c["name"] == "vllm"]
    return container


def test_modelexpress_reads_the_metrics_variables():
    spec = importlib.util.find_spec("modelexpress")
    assert spec is not None and spec.submodule_search_locations
    package = list(spec.submodule_search_locations)[0]
    with open(os.path.join(package, "envs.py")) as handle:
        envs_source = handle.read()
    with open(os.path.join(package, "metrics.py")) as handle:
        metrics_source = handle.read()
    for name in METRICS_VARIABLES:
        assert f'"{name}"' in envs_source, name
    assert "MX_METRICS_ENABLED" in metrics_source and "PROMETHEUS_MULTIPROC_DIR" in metrics_source


def test_manifest_turns_metrics_on_and_prometheus_scrapes_them():
    env = {entry["name"]: entry.get("value") for entry in vllm_container()["env"]}
    assert env["MX_METRICS_ENABLED"] == "1"
    assert env["PROMETHEUS_MULTIPROC_DIR"].startswith("/")
    port = int(env["MX_METRICS_PORT"])
    assert port > 0

    annotations = deployment()["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert int(annotations["prometheus.io/port"]) == port
    assert annotations["prometheus.io/path"] == "/metrics"

    exposed = {p["containerPort"] for p in vllm_container()["ports"]}
    assert port in exposed

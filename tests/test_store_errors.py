"""Access errors that say what to do (issue 46): each names the variables read, those set, the next step and
the section of docs/troubleshooting.md, on one line.

S3 runs against the session's real moto server on 127.0.0.1 (``s3`` fixture), with the credentials removed
or the endpoint pointed at a port where nothing listens; GCS and Azure fail in their real clients (runai's
extras) before any request, so no emulator is started (azurite takes over 10 s to start here). Each test
starts from an environment without any of the variables the stores read, so the "set:" list is exact.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
from test_docs import anchors

from mx_strategies import cli
from mx_strategies.inspect import access_hints
from mx_strategies.testing.loopback import free_port

REPO = Path(__file__).resolve().parents[1]
_TROUBLESHOOTING = REPO / "docs" / "troubleshooting.md"

S3_READ = (
    "read AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_PROFILE, AWS_ENDPOINT_URL, AWS_REGION, "
    "AWS_DEFAULT_REGION, RUNAI_STREAMER_S3_UNSIGNED"
)
GCS_READ = (
    "read GOOGLE_APPLICATION_CREDENTIALS, RUNAI_STREAMER_GCS_CREDENTIAL_FILE, "
    "RUNAI_STREAMER_GCS_USE_ANONYMOUS_CREDENTIALS, STORAGE_EMULATOR_HOST"
)
AZURE_READ = (
    "read AZURE_STORAGE_CONNECTION_STRING, AZURE_STORAGE_ACCOUNT_NAME, AZURE_STORAGE_ACCOUNT_KEY, "
    "AZURE_STORAGE_SAS_TOKEN, AZURE_STORAGE_ENDPOINT_SUFFIX"
)


@pytest.fixture
def bare_environment(monkeypatch, tmp_path):
    """None of the variables a store reads; no config file, metadata server or proxy to fall back on."""
    for key in list(os.environ):
        if key.startswith(("AWS_", "AZURE_", "GOOGLE_", "RUNAI_STREAMER_", "STORAGE_EMULATOR", "CLOUD_STORAGE")):
            monkeypatch.delenv(key)
        if key.lower() in ("http_proxy", "https_proxy", "all_proxy", "no_proxy"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "no-gcloud"))  # no application-default login
    monkeypatch.setattr("mx_strategies.inspect.object_stores.PROBE_MAX_ATTEMPTS", 1)
    monkeypatch.setenv("MX_ROBUST_PROBE_TIMEOUT_S", "2")
    # google.auth reads NO_GCE_CHECK at import; on a GCE runner its metadata server would hand out credentials.
    from google.auth.compute_engine import _metadata

    monkeypatch.setattr(_metadata, "_NO_GCE_CHECK", True)


def doctor_error(capsys, uri: str) -> str:
    """``mx-strategies doctor URI``: exit 2, nothing on stdout, one line on stderr (returned)."""
    code = cli.main(["doctor", uri])
    captured = capsys.readouterr()
    assert (code, captured.out) == (2, ""), captured
    assert captured.err.endswith("\n") and captured.err.count("\n") == 1, captured.err
    return captured.err[:-1]


# -- S3 (moto on 127.0.0.1) ---------------------------------------------------------------------


def test_s3_without_credentials_says_which_to_set(capsys, s3, bare_environment, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3.endpoint)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    uri = f"s3://{s3.bucket}/glm"

    assert doctor_error(capsys, uri) == (
        f"mx-strategies doctor: {uri}: listing failed: NoCredentialsError: Unable to locate credentials; "
        f"{S3_READ} (set: AWS_ENDPOINT_URL, AWS_DEFAULT_REGION); set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY "
        "(or AWS_PROFILE; RUNAI_STREAMER_S3_UNSIGNED=1 for a public bucket); see docs/troubleshooting.md#s3"
    )


def test_s3_with_one_half_of_the_key_pair(capsys, s3, bare_environment, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3.endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "S3RVER")
    uri = f"s3://{s3.bucket}/glm"

    assert doctor_error(capsys, uri) == (
        f"mx-strategies doctor: {uri}: cannot create an S3 client: PartialCredentialsError: Partial credentials "
        "found in env, "
        f"missing: AWS_SECRET_ACCESS_KEY; {S3_READ} (set: AWS_ACCESS_KEY_ID, AWS_ENDPOINT_URL); "
        "set both AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY; see docs/troubleshooting.md#s3"
    )


def test_s3_profile_that_does_not_exist(capsys, s3, bare_environment, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3.endpoint)
    monkeypatch.setenv("AWS_PROFILE", "minio")
    uri = f"s3://{s3.bucket}/glm"

    assert doctor_error(capsys, uri) == (
        f"mx-strategies doctor: {uri}: cannot create an S3 client: ProfileNotFound: The config profile (minio) "
        f"could not be found; {S3_READ} (set: AWS_PROFILE, AWS_ENDPOINT_URL); set AWS_PROFILE to a profile of "
        "~/.aws/config, or unset it; see docs/troubleshooting.md#s3"
    )


def test_s3_endpoint_where_nothing_listens(capsys, bare_environment, monkeypatch):
    endpoint = f"http://127.0.0.1:{free_port()}"
    for key, value in {"AWS_ENDPOINT_URL": endpoint, "AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s"}.items():
        monkeypatch.setenv(key, value)

    assert doctor_error(capsys, "s3://models/glm") == (
        "mx-strategies doctor: s3://models/glm: listing failed: EndpointConnectionError: Could not connect to the "
        f'endpoint URL: "{endpoint}/models?list-type=2&prefix=glm%2F&encoding-type=url"; {S3_READ} '
        "(set: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL); check AWS_ENDPOINT_URL: nothing "
        "answered there (scheme, host and port); see docs/troubleshooting.md#s3"
    )


def test_s3_compatible_store_without_endpoint_goes_to_aws(capsys, bare_environment, monkeypatch):
    """A MinIO key pair and no AWS_ENDPOINT_URL: the request goes to AWS (here into a proxy where nothing
    listens, so the test never leaves 127.0.0.1 and fails the same way wherever it runs)."""
    proxy = f"http://127.0.0.1:{free_port()}"
    for key, value in {"AWS_ACCESS_KEY_ID": "minio", "AWS_SECRET_ACCESS_KEY": "minio123", "HTTPS_PROXY": proxy}.items():
        monkeypatch.setenv(key, value)

    assert doctor_error(capsys, "s3://models/glm") == (
        "mx-strategies doctor: s3://models/glm: listing failed: ProxyConnectionError: Failed to connect to proxy "
        f'URL: "{proxy}"; {S3_READ} (set: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY); set AWS_ENDPOINT_URL for '
        "MinIO or another S3-compatible store (e.g. http://minio:9000); for AWS itself check the network path and "
        "AWS_REGION; see docs/troubleshooting.md#s3"
    )


def test_the_strategys_source_chain_carries_the_same_line(s3, bare_environment, monkeypatch):
    """What the strategy logs for a passed-over candidate is the line doctor prints."""
    from mx_strategies.inspect.sources import Candidate, resolve
    from mx_strategies.settings import RobustSettings

    monkeypatch.setenv("AWS_ENDPOINT_URL", s3.endpoint)
    uri = f"s3://{s3.bucket}/glm"
    with pytest.raises(Exception) as caught:
        resolve([Candidate("MX_MODEL_URI", uri)], RobustSettings())
    assert str(caught.value) == (
        f"no candidate source holds streamable safetensors: MX_MODEL_URI={uri!r}: {uri}: listing failed: "
        f"NoCredentialsError: Unable to locate credentials; {S3_READ} (set: AWS_ENDPOINT_URL); set AWS_ACCESS_KEY_ID "
        "and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE; RUNAI_STREAMER_S3_UNSIGNED=1 for a public bucket); "
        "see docs/troubleshooting.md#s3"
    )


# -- GCS and Azure (their real clients, failing before any request) --------------------------------


def test_gcs_without_credentials(capsys, bare_environment):
    assert doctor_error(capsys, "gs://models/glm") == (
        "mx-strategies doctor: gs://models/glm: cannot create a GCS client: DefaultCredentialsError: Your default "
        "credentials were not found. To set up Application Default Credentials, see "
        "https://cloud.google.com/docs/authentication/external/set-up-adc for more information.; "
        f"{GCS_READ} (set: none); set GOOGLE_APPLICATION_CREDENTIALS to a service-account key file "
        "(or RUNAI_STREAMER_GCS_USE_ANONYMOUS_CREDENTIALS=1 for a public bucket or an emulator); "
        "see docs/troubleshooting.md#gcs"
    )


def test_gcs_key_file_that_is_not_there(capsys, bare_environment, monkeypatch, tmp_path):
    missing = tmp_path / "sa.json"
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(missing))

    assert doctor_error(capsys, "gs://models/glm") == (
        "mx-strategies doctor: gs://models/glm: cannot create a GCS client: DefaultCredentialsError: "
        f"File {missing} was not found.; {GCS_READ} (set: GOOGLE_APPLICATION_CREDENTIALS); "
        "point GOOGLE_APPLICATION_CREDENTIALS at a readable service-account key file; "
        "see docs/troubleshooting.md#gcs"
    )


def test_gcs_emulator_without_anonymous_credentials(capsys, bare_environment, monkeypatch):
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{free_port()}")

    line = doctor_error(capsys, "gs://models/glm")
    assert line.endswith(
        f"; {GCS_READ} (set: STORAGE_EMULATOR_HOST); set RUNAI_STREAMER_GCS_USE_ANONYMOUS_CREDENTIALS=1 "
        "(an emulator at STORAGE_EMULATOR_HOST takes no credentials); see docs/troubleshooting.md#gcs"
    ), line
    assert line.startswith("mx-strategies doctor: gs://models/glm: cannot create a GCS client: DefaultCredentialsError")


def test_azure_without_any_variable(capsys, bare_environment):
    assert doctor_error(capsys, "az://models/glm") == (
        "mx-strategies doctor: az://models/glm: cannot create an Azure client: ValueError: Azure credentials "
        "required. Set AZURE_STORAGE_CONNECTION_STRING for local testing, or AZURE_STORAGE_ACCOUNT_NAME for "
        f"production with DefaultAzureCredential.; {AZURE_READ} (set: none); set AZURE_STORAGE_ACCOUNT_NAME and "
        "AZURE_STORAGE_ACCOUNT_KEY (runai's streamer reads these, not the connection string); "
        "see docs/troubleshooting.md#azure"
    )


# -- bounds, and the sections the messages cite ---------------------------------------------------


def test_a_long_multi_line_client_message_is_one_bounded_line(bare_environment):
    """Azure's errors carry the whole XML answer over several lines: the line keeps the first DETAIL_CHARS."""
    error = RuntimeError("Server failed to authenticate the request.\nRequestId:1\n" + "<xml>" * 500)
    message = str(access_hints.access_error(access_hints.AZURE_PREFIX, "az://c/m: listing failed", error))
    assert "\n" not in message
    detail = message.split("; read ")[0]
    assert detail == "az://c/m: listing failed: " + (
        "RuntimeError: Server failed to authenticate the request. RequestId:1 " + "<xml>" * 500
    )[: access_hints._DETAIL_CHARS - 3] + "..."


def test_every_troubleshooting_section_cited_exists():
    """Each ``docs/troubleshooting.md#anchor`` the package cites (literally, or per store) is a heading there."""
    known = anchors(_TROUBLESHOOTING.read_text(encoding="utf-8"))
    cited = set(access_hints._ANCHORS.values())
    for path in (REPO / "mx_strategies").rglob("*.py"):
        cited |= set(re.findall(r"troubleshooting\.md#([A-Za-z0-9_-]+)", path.read_text(encoding="utf-8")))
    assert cited >= {"s3", "gcs", "azure"}
    assert sorted(cited - known) == []

"""What to do when a store cannot be opened, listed or read: one line, from a table per store.

The line names what failed, the variables the store's clients read, which of them are set (names only, never
values), the one to set or check next, and the section of docs/troubleshooting.md about that store.
tests/test_store_errors.py checks every section cited here exists. The next step is the first row of the
store's table (:data:`_STEPS`) whose error codes and variables match: plain data, read by :func:`_access_hint`.
"""

from __future__ import annotations

import os

from ..errors import StoreError
from .storage import AZURE_PREFIX, GCS_PREFIX, S3_PREFIX

_TROUBLESHOOTING = "docs/troubleshooting.md"
_DETAIL_CHARS = 300  # of the client's own message: one line, bounded (Azure's carry the whole XML answer)

# What the probe's clients read, per scheme (runai's C++ streamers differ in places: each section of the doc says).
_VARIABLES = {
    S3_PREFIX: ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE", "AWS_ENDPOINT_URL",
                "AWS_REGION", "AWS_DEFAULT_REGION", "RUNAI_STREAMER_S3_UNSIGNED"),
    GCS_PREFIX: ("GOOGLE_APPLICATION_CREDENTIALS", "RUNAI_STREAMER_GCS_CREDENTIAL_FILE",
                 "RUNAI_STREAMER_GCS_USE_ANONYMOUS_CREDENTIALS", "STORAGE_EMULATOR_HOST"),
    AZURE_PREFIX: ("AZURE_STORAGE_CONNECTION_STRING", "AZURE_STORAGE_ACCOUNT_NAME", "AZURE_STORAGE_ACCOUNT_KEY",
                   "AZURE_STORAGE_SAS_TOKEN", "AZURE_STORAGE_ENDPOINT_SUFFIX"),
}  # fmt: skip
_ANCHORS = {S3_PREFIX: "s3", GCS_PREFIX: "gcs", AZURE_PREFIX: "azure"}

_CONNECTION = frozenset(
    "EndpointConnectionError ConnectTimeoutError ConnectionClosedError ReadTimeoutError ConnectionError "
    "ConnectionRefusedError NewConnectionError MaxRetryError ProxyConnectionError ProtocolError TimeoutError "
    "ServiceRequestError TransportError".split()
)
_REFUSED = frozenset({"InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken"})
_DENIED = frozenset({"AccessDenied", "AllAccessDisabled", "Forbidden", "403", "Unauthorized", "401"})
_WRONG_REGION = frozenset({"PermanentRedirect", "AuthorizationHeaderMalformed", "IllegalLocationConstraintException",
                           "301"})  # fmt: skip
_AZURE_AUTH = _DENIED | {"ClientAuthenticationError", "AuthenticationFailed", "AuthorizationFailure"}
# Codes of a read or HEAD that are about access (credentials, endpoint), not about the object: those get the hint.
_ACCESS_CODES = _CONNECTION | _REFUSED | _AZURE_AUTH | _WRONG_REGION | {
    "NoCredentialsError", "PartialCredentialsError", "ProfileNotFound", "ExpiredToken", "SSLError",
    "DefaultCredentialsError", "RefreshError", "CredentialUnavailableError",
}  # fmt: skip

# What runai's Azure streamer reads (its release build ignores AZURE_STORAGE_CONNECTION_STRING; docs/faults.md).
_AZURE_ACCOUNT = (
    "set AZURE_STORAGE_ACCOUNT_NAME and AZURE_STORAGE_ACCOUNT_KEY (runai's streamer reads these, not the "
    "connection string)"
)
_ENDPOINT, _EMULATOR, _CONN = "AWS_ENDPOINT_URL", "STORAGE_EMULATOR_HOST", "AZURE_STORAGE_CONNECTION_STRING"

# Per scheme, rows of (error codes, or None for any; variables: at least one of the plain names set and none of
# the "!"-prefixed; the next step). The first row that matches is the one.
_STEPS = {
    S3_PREFIX: (
        ({"NoCredentialsError"}, (), "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE; "
                                     "RUNAI_STREAMER_S3_UNSIGNED=1 for a public bucket)"),
        ({"PartialCredentialsError"}, (), "set both AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"),
        ({"ProfileNotFound"}, (), "set AWS_PROFILE to a profile of ~/.aws/config, or unset it"),
        ({"ExpiredToken", "TokenRefreshRequired", "RequestExpired"}, (),
         "renew AWS_SESSION_TOKEN with its key pair, or the session of AWS_PROFILE"),
        (_REFUSED, ("!" + _ENDPOINT,), "check AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY; keys of MinIO or another "
                                       "S3-compatible store need AWS_ENDPOINT_URL"),
        (_REFUSED, (), "check AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY: the store at AWS_ENDPOINT_URL refused them"),
        (_DENIED, (), "grant these credentials s3:ListBucket and s3:GetObject on the bucket, or set AWS_PROFILE to "
                      "ones that have them"),
        (_WRONG_REGION, (), "set AWS_REGION to the bucket's region"),
        ({"SSLError"}, (), "set AWS_CA_BUNDLE to the CA bundle of AWS_ENDPOINT_URL's server"),
        (_CONNECTION, (_ENDPOINT,), "check AWS_ENDPOINT_URL: nothing answered there (scheme, host and port)"),
        (_CONNECTION, (), "set AWS_ENDPOINT_URL for MinIO or another S3-compatible store (e.g. http://minio:9000); "
                          "for AWS itself check the network path and AWS_REGION"),
        ({"NoSuchBucket", "404", "NotFound"}, (_ENDPOINT,),
         "check the bucket name, and that AWS_ENDPOINT_URL is the store that holds it"),
        ({"NoSuchBucket", "404", "NotFound"}, (),
         "check the bucket name; a bucket of MinIO or another S3-compatible store needs AWS_ENDPOINT_URL"),
        (None, (), "check AWS_ENDPOINT_URL and the credentials"),
    ),
    GCS_PREFIX: (
        ({"DefaultCredentialsError"}, ("RUNAI_STREAMER_GCS_CREDENTIAL_FILE",),
         "point RUNAI_STREAMER_GCS_CREDENTIAL_FILE at a readable service-account key file"),
        ({"DefaultCredentialsError"}, ("GOOGLE_APPLICATION_CREDENTIALS",),
         "point GOOGLE_APPLICATION_CREDENTIALS at a readable service-account key file"),
        ({"DefaultCredentialsError"}, (_EMULATOR,), "set RUNAI_STREAMER_GCS_USE_ANONYMOUS_CREDENTIALS=1 (an emulator "
                                                    "at STORAGE_EMULATOR_HOST takes no credentials)"),
        ({"DefaultCredentialsError"}, (), "set GOOGLE_APPLICATION_CREDENTIALS to a service-account key file (or "
                                          "RUNAI_STREAMER_GCS_USE_ANONYMOUS_CREDENTIALS=1 for a public bucket or an "
                                          "emulator)"),
        (_DENIED | {"RefreshError", "InvalidGrant"}, (),
         "grant these credentials storage.objects.list and storage.objects.get on the bucket"),
        (_CONNECTION, (_EMULATOR,), "check STORAGE_EMULATOR_HOST: nothing answered there"),
        (_CONNECTION, (), "check the network path to storage.googleapis.com (an emulator needs STORAGE_EMULATOR_HOST)"),
        ({"NotFound", "404"}, (_EMULATOR,), "check the bucket name"),
        ({"NotFound", "404"}, (), "check the bucket name (an emulator's bucket needs STORAGE_EMULATOR_HOST)"),
        (None, (), "check GOOGLE_APPLICATION_CREDENTIALS"),
    ),
    AZURE_PREFIX: (
        (None, ("!AZURE_STORAGE_ACCOUNT_NAME", "!" + _CONN), _AZURE_ACCOUNT),
        (_AZURE_AUTH, (_CONN,),  # the probe takes the connection string before the others
         "check AccountName and AccountKey (or SharedAccessSignature) in AZURE_STORAGE_CONNECTION_STRING"),
        (_AZURE_AUTH, ("AZURE_STORAGE_ACCOUNT_KEY", "AZURE_STORAGE_SAS_TOKEN"),
         "check AZURE_STORAGE_ACCOUNT_KEY (or AZURE_STORAGE_SAS_TOKEN) against AZURE_STORAGE_ACCOUNT_NAME"),
        (_AZURE_AUTH, (), "set AZURE_STORAGE_ACCOUNT_KEY or AZURE_STORAGE_SAS_TOKEN for AZURE_STORAGE_ACCOUNT_NAME"),
        ({"CredentialUnavailableError"}, (),
         "set AZURE_STORAGE_ACCOUNT_KEY or AZURE_STORAGE_SAS_TOKEN, or give the pod a managed identity"),
        (_CONNECTION, (_CONN,), "check BlobEndpoint in AZURE_STORAGE_CONNECTION_STRING: nothing answered there"),
        (_CONNECTION, (), "check AZURE_STORAGE_ACCOUNT_NAME and AZURE_STORAGE_ENDPOINT_SUFFIX: nothing answered at "
                          "https://<name>.<suffix>"),
        ({"ResourceNotFoundError", "ContainerNotFound", "404"}, (),
         "check the container name and AZURE_STORAGE_ACCOUNT_NAME"),
        (None, ("!AZURE_STORAGE_ACCOUNT_NAME",), _AZURE_ACCOUNT),
        (None, (), "check AZURE_STORAGE_ACCOUNT_NAME and AZURE_STORAGE_ACCOUNT_KEY"),
    ),
}  # fmt: skip


def _error_code(exc: BaseException) -> str:
    """S3's error code (a ClientError's, a ranged read's), else the exception's type name."""
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        code = response.get("Error", {}).get("Code")
        if code:
            return str(code)
    for attribute in ("code", "error_code"):  # a ranged read's (S3's code, or "HTTP 403"); Azure's
        code = getattr(exc, attribute, None)
        if isinstance(code, str) and code:
            return code.removeprefix("HTTP ")
    return type(exc).__name__


def _one_line(text: str, limit: int = _DETAIL_CHARS) -> str:
    """``text`` on one line, cut to ``limit`` characters."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _matches(variables: tuple[str, ...], is_set: set[str]) -> bool:
    wanted = [name for name in variables if not name.startswith("!")]
    unwanted = [name[1:] for name in variables if name.startswith("!")]
    return (not wanted or any(n in is_set for n in wanted)) and not any(n in is_set for n in unwanted)


def _access_hint(scheme: str, exc: BaseException) -> str:
    """``read A, B (set: B); <what to do>; see docs/troubleshooting.md#<store>`` for an error of ``scheme``'s store."""
    names = _VARIABLES[scheme]
    is_set = [name for name in names if os.environ.get(name)]
    code = _error_code(exc)
    step = next(text for codes, variables, text in _STEPS[scheme]
                if (codes is None or code in codes) and _matches(variables, set(is_set)))  # fmt: skip
    where = f"{_TROUBLESHOOTING}#{_ANCHORS[scheme]}"
    return f"read {', '.join(names)} (set: {', '.join(is_set) or 'none'}); {step}; see {where}"


def access_error(scheme: str, what: str, exc: BaseException) -> StoreError:
    """One line: ``<what>: <Type>: <client message, bounded>; <access_hint>``."""
    return StoreError(f"{what}: {_one_line(f'{type(exc).__name__}: {exc}')}; {_access_hint(scheme, exc)}")


def failure(scheme: str, what: str, exc: BaseException, *, named: bool = True) -> StoreError:
    """``what`` failed with ``exc``: with the variables to set when it is about access. ``named`` False: an S3
    ranged read's error, whose text names its own code (no type name; bounded only when about access)."""
    access = _error_code(exc) in _ACCESS_CODES
    if not named:
        return StoreError(f"{what}: {_one_line(str(exc))}; {_access_hint(scheme, exc)}" if access else f"{what}: {exc}")
    if access:
        return access_error(scheme, what, exc)
    return StoreError(f"{what}: {type(exc).__name__}: {_one_line(str(exc))}")

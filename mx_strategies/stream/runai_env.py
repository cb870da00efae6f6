"""runai's process-wide settings for one load: its variables, and the object-store plugin it binds.

runai-model-streamer reads its knobs from the environment when a stream
starts, and binds an object-store plugin once per process. A load (and a
read-ahead started before it, :mod:`.read_ahead`) sets the variables for
its duration (:func:`streamer_environment`) and claims the plugin
(:func:`claim_backend`) before runai is started.
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Mapping, Optional

from ..errors import StreamStartError
from ..settings import RobustSettings, env_name

# Our settings -> the runai variables they set for the duration of a load.
_STREAMER_ENV = {
    "streamer_concurrency": "RUNAI_STREAMER_CONCURRENCY",
    "streamer_memory_limit": "RUNAI_STREAMER_MEMORY_LIMIT",
    "streamer_chunk_bytesize": "RUNAI_STREAMER_CHUNK_BYTESIZE",
    "streamer_s3_max_retries": "RUNAI_STREAMER_S3_MAX_RETRIES",
    "streamer_s3_retry_timeout_s": "RUNAI_STREAMER_S3_TIMEOUT",
}
# vLLM's model_loader_extra_config keys for runai -> the variables vLLM sets from them.
_LOADER_EXTRA_CONFIG_ENV = {
    "concurrency": "RUNAI_STREAMER_CONCURRENCY",
    "memory_limit": "RUNAI_STREAMER_MEMORY_LIMIT",
}


# runai-model-streamer (0.17.0) loads the object-store plugin (S3, GCS or Azure) of
# the first object-store URI it streams and keeps it until the process exits;
# every later object-store load uses it whatever its scheme. A gs:// load after
# an s3:// one then fails, an s3:// load after a gs:// one retries for minutes.
_bound_backend: Optional[str] = None


def _backend_of(uris: list[str]) -> Optional[str]:
    schemes = {uri.split("://", 1)[0] for uri in uris if "://" in uri}
    return next(iter(schemes)) if len(schemes) == 1 else ("+".join(sorted(schemes)) or None)


def claim_backend(source: str, uris: list[str]) -> None:
    """Refuse a load runai would send to another store's plugin (StreamStartError)."""
    global _bound_backend
    wanted = _backend_of(uris)
    if wanted is None:
        return  # local files: no plugin
    if _bound_backend is None:
        _bound_backend = wanted
        return
    if wanted != _bound_backend:
        raise StreamStartError(
            f"streaming {source} did not start: runai-model-streamer keeps the object-store plugin of the "
            f"first load in a process ({_bound_backend}://) and would read these {wanted}:// files with it; "
            f"load {wanted}:// checkpoints in a process of their own"
        )


def streamer_variables(
    settings: RobustSettings,
    loader_extra_config: Optional[Mapping[str, Any]] = None,
    on_warning: Optional[Callable[[str], None]] = None,
    *,
    distributed: bool = False,
) -> dict[str, str]:
    """The runai variables a load sets: vLLM's ``model_loader_extra_config`` keys, then ours.

    vLLM's runai loader (which ModelExpress's parent strategy uses) turns
    ``concurrency`` and ``memory_limit`` into runai's variables; we honour
    them the same way. Where one of our settings names the same variable,
    ours wins, and ``on_warning`` is told. A distributed load sets
    ``RUNAI_STREAMER_DIST=1``: runai's default distributes over nccl only, so
    a gloo engine (vLLM on CPUs) would silently read everything on every rank.
    """
    variables: dict[str, str] = {"RUNAI_STREAMER_DIST": "1"} if distributed else {}
    extra = loader_extra_config or {}
    for key, var in _LOADER_EXTRA_CONFIG_ENV.items():
        if extra.get(key) is not None:
            variables[var] = str(extra[key])
    for field, var in _STREAMER_ENV.items():
        value = getattr(settings, field)
        if value is None:
            continue
        if var in variables and variables[var] != str(value) and on_warning is not None:
            on_warning(
                f"{env_name(field)}={value} overrides model_loader_extra_config "
                f"{_extra_key(var)}={variables[var]} ({var})"
            )
        variables[var] = str(value)
    return variables


def _extra_key(var: str) -> str:
    return next(key for key, name in _LOADER_EXTRA_CONFIG_ENV.items() if name == var)


@contextmanager
def streamer_environment(variables: Mapping[str, str]) -> Iterator[None]:
    """Set runai's variables for the duration of a load, restoring them afterwards."""
    # runai sets its process group size once and leaves it in the environment (runai_plan._no_rank_discovery).
    saved = {"RUNAI_STREAMER_PROCESS_GROUP_SIZE": os.environ.get("RUNAI_STREAMER_PROCESS_GROUP_SIZE")}
    try:
        for var, value in variables.items():
            saved[var] = os.environ.get(var)
            os.environ[var] = value
        yield
    finally:
        for var, old in saved.items():
            if old is None:
                os.environ.pop(var, None)
            else:
                os.environ[var] = old

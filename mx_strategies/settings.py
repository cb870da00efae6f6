"""Every knob a deployment can turn, in one typed model, read once and refused whole when wrong.

One pydantic-settings model holds every setting. Each field names the environment variable it is read from
(``validation_alias``), says what it does (``description``) and who would set it (``json_schema_extra["who"]``),
so the class is the reference for what a deployment can set; ``docs/settings.md`` and the examples under
``configs/`` are generated from it (``scripts/settings_doc.py``). Values come from, in order of precedence:

1. the environment;
2. a file named by ``MX_STRATEGIES_CONFIG`` (a ``.env`` file, or ``.toml``), using the same variable names as
   keys (a key that is no setting is an error);
3. the defaults below.

An invalid value raises :class:`ConfigurationError` with one message naming the variable, the value and what
is allowed (:mod:`.settings_errors`), so a bad deployment fails at activation instead of at the first model
load. A retired variable (:data:`RETIRED`) still set logs one warning naming what replaced it, and changes
nothing.
"""

from __future__ import annotations

import logging
import os
import resource
from pathlib import Path
from typing import Annotated, Any, Literal, Optional, get_args

from pydantic import Field, ValidationError, ValidationInfo, field_validator
from pydantic_settings import (
    BaseSettings,
    DotEnvSettingsSource,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from .errors import ConfigurationError
from .settings_errors import invalid_text, unknown_text

CONFIG_FILE_ENV = "MX_STRATEGIES_CONFIG"

_SourceName = Literal["model_weights", "model", "MX_MODEL_URI"]
_DraftConvention = Literal["mtp", "nextn_layers", "mtp_layers"]

# runai-model-streamer refuses a shard header over 100 MiB (its MAX_HEADER_SIZE).
RUNAI_MAX_HEADER_BYTES = 100 << 20

#: Variables that were settings once, and what stands in their place. Set, each logs one warning.
RETIRED = {
    "MX_ROBUST_DELIVERY_ORDER": "tensors reach the model as runai's reads complete (arrival order)",
    "MX_ROBUST_PLAN_ORDER_HOLD_BYTES": "no tensor is held back: each reaches the model as runai's read of it completes",
    "MX_ROBUST_DRY_RUN_SAMPLE_ABOVE": "the dry run samples the per-expert names of a checkpoint of over 8192 names",
    "MX_ROBUST_SELECTION_SOURCES": "the module is asked first (dry run), then the table, then the naming conventions "
    "(MX_ROBUST_DRAFT_CONVENTIONS picks those)",
    "MX_ROBUST_MAX_INDEX_BYTES": "model.safetensors.index.json is read up to 64 MiB",
    "MX_ROBUST_MAX_CONFIG_BYTES": "config.json is read up to 16 MiB",
    "MX_ROBUST_PROBE_MAX_ATTEMPTS": "3 attempts per object-store request while probing",
    "MX_ROBUST_MAX_DISCOVERY_ENTRIES": "a local discovery walk looks at 100000 entries at most; "
    "MX_ROBUST_DISCOVERY_DEPTH bounds it",
    "MX_ROBUST_VERIFY_SAMPLE": "MX_ROBUST_VERIFY_CONTENT=sample checks 8 tensors per load",
    "MX_ROBUST_PROGRESS_ALL_RANKS": "progress lines are logged on rank 0 only",
}

_logger = logging.getLogger("modelexpress.strategy_robust_model_streamer.settings")
_PREFIX = "MX_ROBUST_"  # every variable of ours starts with this; one that is no setting is a typo
_RUNAI_MAX_SIZE_T = 2**64 - 1  # runai 0.17.0 reads RUNAI_STREAMER_CHUNK_BYTESIZE as a size_t
_ENUM_LISTS = ("source_order", "draft_conventions")  # each entry known, at most once
_OPTIONAL = ("reads_cache_dir", "streamer_concurrency", "streamer_memory_limit", "streamer_chunk_bytesize",
             "streamer_s3_max_retries", "streamer_s3_retry_timeout_s")  # fmt: skip
_warned: set[str] = set()  # retired variables already warned about in this process


def _who(text: str) -> dict[str, str]:
    """The operator who would set a field, and why (one line in docs/settings.md)."""
    return {"who": text}


def _split_list(value: Any) -> Any:
    """Accept ``a,b,c`` (environment, .env) as well as a list (TOML)."""
    return [item.strip() for item in value.split(",") if item.strip()] if isinstance(value, str) else value


class RobustSettings(BaseSettings):
    """Every knob of ``mx_strategies.robust``, read from the environment."""

    model_config = SettingsConfigDict(extra="ignore", populate_by_name=False, validate_default=True, frozen=True)

    # -- source resolution -------------------------------------------------
    model_uri: Optional[str] = Field(
        None, validation_alias="MX_MODEL_URI",
        json_schema_extra={**_who("the checkpoint lies in an object store, or in a folder the engine's model does "
                                  "not name"), "allowed": "an s3://, gs:// or az:// URI or a local path"},
        description="Checkpoint ModelExpress streams from (s3://, gs://, az:// or a local folder). Gates the "
        "strategy, like upstream's model_streamer, and is the last candidate of the source chain by default.",
    )  # fmt: skip
    source_order: Annotated[list[_SourceName], NoDecode] = Field(
        ["model_weights", "model", "MX_MODEL_URI"], validation_alias="MX_ROBUST_SOURCE_ORDER",
        json_schema_extra=_who("MX_MODEL_URI must win over a copy the engine's own folder also holds"),
        description="Comma-separated order in which candidate sources are probed: the engine's model_weights, its "
        "model, and MX_MODEL_URI. A candidate holding no non-empty safetensors shard is passed over.",
    )  # fmt: skip
    require_model_uri: bool = Field(
        False, validation_alias="MX_ROBUST_REQUIRE_MODEL_URI",
        json_schema_extra=_who("a fleet where only the deployments that set MX_MODEL_URI should stream with robust"),
        description="Offer the strategy only when MX_MODEL_URI is set, as upstream's model_streamer is gated. Off "
        "by default: MX_STRATEGY alone switches robust on, and it streams the engine's own model_weights/model. "
        "true keeps the engine's other loaders for loads without MX_MODEL_URI (each such load logs one warning).",
    )  # fmt: skip
    guard_chain: Literal["auto", "module", "off"] = Field(
        "auto", validation_alias="MX_ROBUST_GUARD_CHAIN",
        json_schema_extra=_who("off: a node whose local folders are trusted and InstantTensor must start at once; "
                               "module: indexed folders whose module may still miss a tensor"),
        description="Before ModelExpress's strategies that load the engine's own local folder without the default "
        "loader's checks (instant_tensor, gds) run, robust inspects that folder as it would for its own load; a "
        "folder it would refuse (a shard missing or cut short, tensors the model needs absent) or an object-store "
        "model is kept from them, and robust's chain decides the load. Whole folders go to them unchanged. auto: "
        "the listing, index and headers, and the module's answer where the folder has no index (only the module "
        "can then say what is missing); module: the module's answer always, as robust's own load asks it (more "
        "time before the reader starts); off: they read any folder, as ModelExpress does.",
    )  # fmt: skip
    discovery_depth: int = Field(
        3, ge=0, le=8, validation_alias="MX_ROBUST_DISCOVERY_DEPTH",
        json_schema_extra=_who("shards lie deeper below the named folder than 3 levels, or a walk must stay at its "
                               "top"),
        description="How many folder levels below a local candidate are searched for shards when none lie at its "
        "top (vLLM's model_streamer/<hash> cache, HF snapshots/<rev>). 0 searches the top only.",
    )  # fmt: skip
    probe_timeout_s: float = Field(
        20.0, gt=0, le=600, allow_inf_nan=False, validation_alias="MX_ROBUST_PROBE_TIMEOUT_S",
        json_schema_extra=_who("an object store slower to answer than 20 s (another region, a cold tier), or a "
                               "probe that must fail fast"),
        description="Connect and read timeout, in seconds, for listing an object-store prefix and reading shard "
        "headers.",
    )  # fmt: skip
    max_header_bytes: int = Field(
        RUNAI_MAX_HEADER_BYTES, ge=64, le=RUNAI_MAX_HEADER_BYTES, validation_alias="MX_ROBUST_MAX_HEADER_BYTES",
        json_schema_extra=_who("a memory-tight host that must refuse a huge shard header before parsing it"),
        description="Largest safetensors shard header (the JSON after the 8-byte length) a probe reads; a longer "
        "one is a corrupt_header problem. At most 100 MiB, runai-model-streamer's own limit.",
    )  # fmt: skip

    # -- delivery ------------------------------------------------------------
    skip_empty_shards: bool = Field(
        True, validation_alias="MX_ROBUST_SKIP_EMPTY_SHARDS",
        json_schema_extra=_who("false: hand runai every listed file, as a load without robust would"),
        description="Leave shards holding zero tensors out of the streamer request (runai-model-streamer <= 0.16.0 "
        "dropped every later file after one). Applies to checkpoints without model.safetensors.index.json: with an "
        "index, only the files it names load, and it names no empty file, so this setting changes nothing there.",
    )  # fmt: skip
    completeness: Literal["fail", "warn"] = Field(
        "fail", validation_alias="MX_ROBUST_COMPLETENESS",
        json_schema_extra=_who("warn: a checkpoint known to stream a tensor twice or miss one must load until fixed"),
        description="What a load does when a tensor expected from the selected shards was not delivered exactly "
        "once: fail (the chain falls back) or warn.",
    )  # fmt: skip
    model_completeness: Literal["fail", "warn"] = Field(
        "fail", validation_alias="MX_ROBUST_MODEL_COMPLETENESS",
        json_schema_extra=_who("warn: a model whose unwritten parameters are known to be filled another way"),
        description="What a load does when part of a parameter the model keeps would not be, or was not, written "
        "from the checkpoint, apart from what the engine fills afterwards (an MTP draft's shared embedding and "
        "head). Checked per element before streaming on the module's answer (a stacked or fused parameter the "
        "checkpoint fills only in part: refused, the model untouched), and after streaming on what the load wrote "
        "and on the names the model's load_weights reports (the chain rebuilds the model and falls back): fail, "
        "naming the parameters and the rows, or warn.",
    )  # fmt: skip
    verify_content: Literal["off", "sample", "all"] = Field(
        "off", validation_alias="MX_ROBUST_VERIFY_CONTENT",
        json_schema_extra=_who("a store or network that could corrupt bytes unseen: sample on every load, all for "
                               "an audit"),
        description="Compare delivered tensors with the stored bytes: SHA-256 of each checked tensor against a "
        "direct ranged read of its byte range. off, sample (8 tensors per load, spread over the shards, the same "
        "ones on every load of a checkpoint) or all (reads the checkpoint a second time). A mismatch fails the "
        "load naming the tensor and file; runai itself does not notice wrong bytes.",
    )  # fmt: skip
    read_ahead_bytes: int = Field(
        16 << 30, ge=0, le=1 << 44, validation_alias="MX_ROBUST_READ_AHEAD_BYTES",
        json_schema_extra=_who("a host short of memory (lower, 0 off), or a slow dry run before a fast store "
                               "(raise)"),
        description="How many bytes runai may read while the built module is asked what it reads (a second or more "
        "on the largest checkpoints): the head of the load the engine's rules foresee (its table row or "
        "conventions, as doctor plans). Nothing read ahead reaches the model before the module's answer admits "
        "it; what the answer leaves out is dropped and counted in the report. runai's RUNAI_STREAMER_MEMORY_LIMIT "
        "bounds what is held meanwhile. 0: no read-ahead. Loads of one rank only (not MX_MS_DISTRIBUTED).",
    )  # fmt: skip
    file_reader: Literal["auto", "page_cache", "runai"] = Field(
        "auto", validation_alias="MX_ROBUST_FILE_READER",
        json_schema_extra=_who("runai: rule out or measure the page-cache reader; page_cache: files known cached"),
        description="Who reads a local checkpoint's files: auto (the page-cache reader where the kernel holds "
        "every shard in its page cache, as on a restart on the same node; runai's direct reads otherwise), "
        "page_cache (always the page-cache reader: each file mapped under a read lease, or read with preadv where "
        "no lease can be had), or runai (runai-model-streamer, direct I/O by default). Object stores and "
        "distributed loads always stream with runai.",
    )  # fmt: skip
    progress_interval_s: float = Field(
        10.0, ge=0, le=3600, allow_inf_nan=False, validation_alias="MX_ROBUST_PROGRESS_INTERVAL_S",
        json_schema_extra=_who("quieter logs (longer, 0 none), or a slow store watched closely (shorter)"),
        description="Seconds between the progress lines a load logs at INFO on rank 0 while it streams (bytes done "
        "of planned, rate, ETA, shards done, source); a line is also logged when a shard completes. 0 turns the "
        "lines off. Where vLLM shows its own progress bar (use_tqdm_on_load, rank 0) a tqdm bar is shown whatever "
        "this says.",
    )  # fmt: skip

    # -- speculative drafts and what the module reads ---------------------------------
    draft_conventions: Annotated[list[_DraftConvention], NoDecode] = Field(
        ["mtp", "nextn_layers", "mtp_layers"], validation_alias="MX_ROBUST_DRAFT_CONVENTIONS",
        json_schema_extra=_who("a checkpoint whose target tensors a convention would take for the draft's"),
        description="Comma-separated MTP naming conventions recognised as draft tensors: mtp (mtp.*, "
        "Qwen3-Next/Qwen3.5), nextn_layers (model.layers.{N+i}.*, DeepSeek-V3/GLM), mtp_layers (model.mtp.layers.*).",
    )  # fmt: skip
    draft_extra_prefixes: Annotated[list[str], NoDecode] = Field(
        default_factory=list, validation_alias="MX_ROBUST_DRAFT_EXTRA_PREFIXES",
        json_schema_extra=_who("a draft whose tensors follow a naming no convention covers"),
        description="Comma-separated extra tensor-name prefixes that belong to the draft.",
    )  # fmt: skip
    draft_shared_weights: Literal["auto", "always", "never"] = Field(
        "auto", validation_alias="MX_ROBUST_DRAFT_SHARED_WEIGHTS",
        json_schema_extra=_who("always: a draft that does not take the target's embedding and head; never: save "
                               "their bytes"),
        description="Whether an MTP draft streams the embed_tokens/lm_head it shares with the target: auto (only "
        "when pipeline parallel > 1, where vLLM cannot share them), always, or never.",
    )  # fmt: skip
    target_selection: Literal["model", "all"] = Field(
        "model", validation_alias="MX_ROBUST_TARGET_SELECTION",
        json_schema_extra=_who("all: a target module that reads its MTP layers itself, or a cache warmed with "
                               "every byte"),
        description="What a target load streams from a checkpoint that also holds its MTP draft: model (the "
        "default: every tensor but the draft's own MTP layers, which the target's load_weights skips and the "
        "draft streams itself) or all (every tensor of every shard).",
    )  # fmt: skip
    dry_run_timeout_s: float = Field(
        120.0, gt=0, le=3600, validation_alias="MX_ROBUST_DRY_RUN_TIMEOUT_S",
        json_schema_extra=_who("a huge module on a slow CPU needs longer; a tight start-up budget shorter"),
        description="Seconds one dry run of a module's load_weights may take before it is abandoned (the model "
        "untouched) and the next selection source answers.",
    )  # fmt: skip
    reads_cache_dir: Optional[Path] = Field(
        Path("~/.cache/mx-strategies/reads"), validation_alias="MX_ROBUST_READS_CACHE_DIR",
        json_schema_extra=_who("a volume that outlives the pod keeps the answers across restarts; empty: a "
                               "read-only home"),
        description="Folder where the dry run's answers are kept, one file per module class, parameter layout, "
        "parallel rank and checkpoint name set (a restart with the same ones asks nothing); any change of these "
        "makes a new key. A kept answer a load proves wrong (the model-side check fails with it) is deleted by "
        "that load; the next asks the module again. Empty turns the cache off. Put it on a volume that outlives "
        "the pod to keep answers across restarts. A leading ~ is the loading user's home.",
    )  # fmt: skip

    # -- runai-model-streamer pass-through -----------------------------------
    streamer_concurrency: Optional[int] = Field(
        None, ge=1, le=1024, validation_alias="MX_ROBUST_STREAMER_CONCURRENCY",
        json_schema_extra=_who("more parallel reads for an object store, fewer for a busy local disk"),
        description="RUNAI_STREAMER_CONCURRENCY for our loads; unset keeps runai's own. Also at most the "
        "process's hard open-file limit (ulimit -Hn): runai keeps a file open per concurrent read.",
    )  # fmt: skip
    streamer_memory_limit: Optional[int] = Field(
        None, ge=-1, le=2**63 - 1, validation_alias="MX_ROBUST_STREAMER_MEMORY_LIMIT",
        json_schema_extra=_who("a memory-tight node must cap runai's host buffers"),
        description="RUNAI_STREAMER_MEMORY_LIMIT in bytes (-1 unlimited, 0 minimal); unset keeps runai's own.",
    )  # fmt: skip
    streamer_chunk_bytesize: Optional[int] = Field(
        None, ge=1, le=_RUNAI_MAX_SIZE_T, validation_alias="MX_ROBUST_STREAMER_CHUNK_BYTESIZE",
        json_schema_extra=_who("larger reads for a high-latency store, smaller for a memory-tight node"),
        description="RUNAI_STREAMER_CHUNK_BYTESIZE for our loads; unset keeps runai's own.",
    )  # fmt: skip
    streamer_s3_max_retries: Optional[int] = Field(
        None, ge=1, le=100, validation_alias="MX_ROBUST_STREAMER_S3_MAX_RETRIES",
        json_schema_extra=_who("a flaky S3 endpoint needs more retries; a load that must fail fast fewer"),
        description="RUNAI_STREAMER_S3_MAX_RETRIES for our loads: retries of one request (throttling, 5xx, reset, "
        "cut body, a read stalled for about 5 s) inside runai's S3 client. Unset keeps the AWS CRT default of 5: a "
        "persistent error fails a load after about 7-11 s, a server that stops answering after about 40 s. runai "
        "0.17.0 reads but does not apply AWS_MAX_ATTEMPTS and AWS_RETRY_MODE.",
    )  # fmt: skip
    streamer_s3_retry_timeout_s: Optional[int] = Field(
        None, ge=0, le=3600, validation_alias="MX_ROBUST_STREAMER_S3_RETRY_TIMEOUT_S",
        json_schema_extra=_who("an S3 endpoint that drops out for a while should be waited for, not failed"),
        description="RUNAI_STREAMER_S3_TIMEOUT for our loads: seconds runai keeps re-requesting a chunk after its "
        "client's own retries failed (0: never, runai's default). Adds up to this much to the time a persistent "
        "fault takes to fail a load. Unset keeps runai's own.",
    )  # fmt: skip

    @field_validator(*_ENUM_LISTS, mode="before")
    @classmethod
    def _known_unique_entries(cls, value: Any, info: ValidationInfo) -> Any:
        """Check the entries as a whole, so an error shows the full value."""
        entries = _split_list(value)
        if not isinstance(entries, list):
            return entries  # not a list at all: pydantic reports the type
        allowed = get_args(get_args(cls.model_fields[info.field_name].annotation)[0])
        unknown = [entry for entry in entries if entry not in allowed]
        if unknown:
            raise ValueError(f"unknown entry {unknown[0]!r}")
        repeated = [entry for index, entry in enumerate(entries) if entry in entries[:index]]
        if repeated:
            raise ValueError(f"{repeated[0]!r} is named twice")
        if not entries:
            raise ValueError("names no entry")
        return entries

    @field_validator("model_uri", mode="before")
    @classmethod
    def _model_uri_shape(cls, value: Any) -> Any:
        """Empty is unset (upstream's gate); blank, a foreign scheme or a bucket-less URI is refused."""
        if not isinstance(value, str):
            return value  # pydantic reports the type
        if value == "":
            return None
        if not value.strip():
            raise ValueError("is blank (unset it, or name a checkpoint)")
        if value != value.strip():
            raise ValueError("has leading or trailing whitespace")
        scheme, found, rest = value.partition("://")
        if found and scheme not in ("s3", "gs", "az"):
            raise ValueError(f"unsupported scheme {scheme}://")
        if found and not rest.split("/", 1)[0]:
            raise ValueError(f"names no bucket or container after {scheme}://")
        return value

    @field_validator("streamer_concurrency")
    @classmethod
    def _within_fd_limit(cls, value: Optional[int]) -> Optional[int]:
        """runai opens a file per concurrent read and cannot raise the limit past the hard one."""
        _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if value is not None and hard != resource.RLIM_INFINITY and value > hard:
            raise ValueError(f"above this process's hard open-file limit ({hard}; ulimit -Hn)")
        return value

    @field_validator("draft_extra_prefixes", mode="before")
    @classmethod
    def _lists_from_commas(cls, value: Any) -> Any:
        return _split_list(value)

    @field_validator(*_OPTIONAL, mode="before")
    @classmethod
    def _empty_is_unset(cls, value: Any) -> Any:
        """``VAR=`` (or ``""`` in TOML) means unset, as for MX_MODEL_URI upstream."""
        return None if isinstance(value, str) and not value.strip() else value

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        config_file = os.environ.get(CONFIG_FILE_ENV)
        if config_file:
            return init_settings, env_settings, _config_file_source(settings_cls, config_file)
        return init_settings, env_settings


def _config_file_source(settings_cls: type[BaseSettings], config_file: str) -> PydanticBaseSettingsSource:
    """The source for the file ``MX_STRATEGIES_CONFIG`` names.

    ``*.toml`` (also ``*.toml.example``) is TOML, anything else a .env file. A key that is no setting is an
    error: the file holds nothing else, so an unknown key is a typo that would otherwise be ignored without a
    word. A retired key is warned about, as in the environment.
    """
    path = Path(config_file)
    where = f"{CONFIG_FILE_ENV}={config_file!r} is invalid"
    if not path.is_file():
        raise ConfigurationError(f"{where}: no such file (allowed: the path of a .env or .toml file)")
    names = _setting_names()
    try:
        if ".toml" in path.suffixes:
            source: PydanticBaseSettingsSource = TomlConfigSettingsSource(settings_cls, toml_file=path)
            keys = set(source.toml_data)  # type: ignore[attr-defined]
        else:
            from dotenv import dotenv_values

            source = DotEnvSettingsSource(settings_cls, env_file=path)
            keys = {key.upper() for key in dotenv_values(path)}
    except (OSError, ValueError) as exc:  # TOMLDecodeError and UnicodeDecodeError are ValueErrors
        raise ConfigurationError(f"{where}: cannot read it: {exc}") from None
    _warn_retired(keys)
    unknown = sorted(keys - names - RETIRED.keys())
    if unknown:
        raise ConfigurationError(f"{where}: {', '.join(unknown)} is not a setting (allowed: {', '.join(sorted(names))})")
    return source


def env_name(field_name: str) -> str:
    """The environment variable a field is read from."""
    return str(RobustSettings.model_fields[field_name].validation_alias)


def _setting_names() -> set[str]:
    return {str(info.validation_alias) for info in RobustSettings.model_fields.values()}


def _warn_retired(names: Any) -> None:
    """One warning per retired variable set, once per process: what replaced it; never an error."""
    for name in sorted(set(names) & RETIRED.keys() - _warned):
        _warned.add(name)
        _logger.warning(f"{name} is retired and no longer read: {RETIRED[name]}; unset it")


def load_settings(**overrides: Any) -> RobustSettings:
    """Read the settings, turning a validation error into one clear message.

    An ``MX_ROBUST_*`` variable that is no setting is refused too: a typo (``MX_ROBUST_COMPLETNESS=warn``)
    would otherwise leave the default in force without a word. A retired one is warned about.
    """
    names = _setting_names()
    _warn_retired(os.environ)
    unknown = [var for var in os.environ if var.startswith(_PREFIX) and var not in names and var not in RETIRED]
    if unknown:
        raise ConfigurationError("; ".join(unknown_text(unknown, names, _PREFIX)))
    try:
        return RobustSettings(**overrides)
    except ValidationError as exc:
        raise ConfigurationError(invalid_text(exc, RobustSettings.model_json_schema()["properties"])) from None


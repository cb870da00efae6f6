"""Typed settings for the mx-strategies load strategies.

One pydantic-settings model holds every knob. Each field names the
environment variable it is read from (``validation_alias``), so the class is
the reference for what a deployment can set. Values come from, in order of
precedence:

1. the environment;
2. a file named by ``MX_STRATEGIES_CONFIG`` (a ``.env`` file, or ``.toml``),
   using the same variable names as keys (a key that is no setting is an
   error);
3. the defaults below.

An invalid value raises :class:`ConfigurationError` with one message naming the
variable, the value and what is allowed, so a bad deployment fails at
activation instead of at the first model load.
"""

from __future__ import annotations

import difflib
import os
import resource
import types
from pathlib import Path
from typing import Annotated, Any, Literal, Optional, Union, get_args, get_origin

import annotated_types
from pydantic import Field, ValidationError, ValidationInfo, field_validator
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    DotEnvSettingsSource,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from .errors import ConfigurationError

CONFIG_FILE_ENV = "MX_STRATEGIES_CONFIG"

SourceName = Literal["model_weights", "model", "MX_MODEL_URI"]
DraftConvention = Literal["mtp", "nextn_layers", "mtp_layers"]
SelectionSource = Literal["dry_run", "table", "convention"]

# Every variable of ours starts with this; one that is no setting is a typo.
OUR_PREFIX = "MX_ROBUST_"
# MX_MODEL_URI: an object-store URI with one of these schemes, or a local path.
MODEL_URI_SCHEMES = ("s3", "gs", "az")
# runai-model-streamer 0.17.0 reads RUNAI_STREAMER_CHUNK_BYTESIZE as a size_t: 2**64 and above
# fail every load with "Invalid request parameters", naming no variable.
RUNAI_MAX_SIZE_T = 2**64 - 1
RUNAI_MAX_INT64 = 2**63 - 1
MIB = 1024 * 1024
# runai-model-streamer refuses a shard header over 100 MiB (its MAX_HEADER_SIZE).
RUNAI_MAX_HEADER_BYTES = 100 * MIB

DEFAULT_SOURCE_ORDER: tuple[SourceName, ...] = ("model_weights", "model", "MX_MODEL_URI")
DEFAULT_DRAFT_CONVENTIONS: tuple[DraftConvention, ...] = ("mtp", "nextn_layers", "mtp_layers")
DEFAULT_SELECTION_SOURCES: tuple[SelectionSource, ...] = ("dry_run", "table", "convention")
DEFAULT_READS_CACHE = Path("~/.cache/mx-strategies/reads")  # expanded where it is used

# Lists of known names: at least one entry, each at most once.
ENUM_LIST_FIELDS = ("source_order", "draft_conventions", "selection_sources")
# Optional fields where an empty value means unset.
OPTIONAL_FIELDS = (
    "reads_cache_dir",
    "streamer_concurrency",
    "streamer_memory_limit",
    "streamer_chunk_bytesize",
    "streamer_s3_max_retries",
    "streamer_s3_retry_timeout_s",
)


def _split_list(value: Any) -> Any:
    """Accept ``a,b,c`` (environment, .env) as well as a list (TOML)."""
    if isinstance(value, str):
        return [item.strip() for item in value.split(",") if item.strip()]
    return value


class RobustSettings(BaseSettings):
    """Every knob of ``mx_strategies.robust``, read from the environment."""

    model_config = SettingsConfigDict(
        extra="ignore",
        populate_by_name=False,
        validate_default=True,
        frozen=True,
    )

    # -- source resolution -------------------------------------------------
    model_uri: Optional[str] = Field(
        default=None,
        validation_alias="MX_MODEL_URI",
        description=(
            "Checkpoint ModelExpress streams from (s3://, gs://, az:// or a local "
            "folder). Gates the strategy, like upstream's model_streamer, and is "
            "the last candidate of the source chain by default."
        ),
    )
    source_order: Annotated[list[SourceName], NoDecode] = Field(
        default=list(DEFAULT_SOURCE_ORDER),
        validation_alias="MX_ROBUST_SOURCE_ORDER",
        description=(
            "Comma-separated order in which candidate sources are probed: the "
            "engine's model_weights, its model, and MX_MODEL_URI. A candidate "
            "holding no non-empty safetensors shard is passed over."
        ),
    )
    require_model_uri: bool = Field(
        default=False,
        validation_alias="MX_ROBUST_REQUIRE_MODEL_URI",
        description=(
            "Offer the strategy only when MX_MODEL_URI is set, as upstream's model_streamer is gated. "
            "Off by default: MX_STRATEGY alone switches robust on, and it streams the engine's own "
            "model_weights/model. true keeps the engine's other loaders for loads without MX_MODEL_URI "
            "(each such load logs one warning)."
        ),
    )
    guard_chain: Literal["auto", "module", "off"] = Field(
        default="auto",
        validation_alias="MX_ROBUST_GUARD_CHAIN",
        description=(
            "Before ModelExpress's strategies that load the engine's own local folder without the default "
            "loader's checks (instant_tensor, gds) run, robust inspects that folder as it would for its own "
            "load; a folder it would refuse (a shard missing or cut short, tensors the model needs absent) "
            "or an object-store model is kept from them, and robust's chain decides the load. Whole folders "
            "go to them unchanged. auto: the listing, index and headers, and the module's answer where the "
            "folder has no index (only the module can then say what is missing); module: the module's answer "
            "always, as robust's own load asks it (more time before the reader starts); off: they read any "
            "folder, as ModelExpress does."
        ),
    )
    discovery_depth: int = Field(
        default=3,
        ge=0,
        le=8,
        validation_alias="MX_ROBUST_DISCOVERY_DEPTH",
        description=(
            "How many folder levels below a local candidate are searched for "
            "shards when none lie at its top (vLLM's model_streamer/<hash> cache, "
            "HF snapshots/<rev>). 0 searches the top only."
        ),
    )
    probe_timeout_s: float = Field(
        default=20.0,
        gt=0,
        le=600,
        allow_inf_nan=False,
        validation_alias="MX_ROBUST_PROBE_TIMEOUT_S",
        description=(
            "Connect and read timeout, in seconds, for listing an object-store "
            "prefix and reading shard headers."
        ),
    )
    max_discovery_entries: int = Field(
        default=100_000,
        ge=1,
        le=10_000_000,
        validation_alias="MX_ROBUST_MAX_DISCOVERY_ENTRIES",
        description=(
            "Most folder entries a local candidate's discovery walk looks at "
            "(symlinks followed, each real folder once). A walk that meets more "
            "fails with a message naming the folder, instead of running for "
            "minutes over a wrong path such as / or a whole cache."
        ),
    )
    max_header_bytes: int = Field(
        default=RUNAI_MAX_HEADER_BYTES,
        ge=64,
        le=RUNAI_MAX_HEADER_BYTES,
        validation_alias="MX_ROBUST_MAX_HEADER_BYTES",
        description=(
            "Largest safetensors shard header (the JSON after the 8-byte length) "
            "a probe reads; a longer one is a corrupt_header problem. At most "
            "100 MiB, runai-model-streamer's own limit."
        ),
    )
    max_index_bytes: int = Field(
        default=64 * MIB,
        ge=64,
        le=1024 * MIB,
        validation_alias="MX_ROBUST_MAX_INDEX_BYTES",
        description=(
            "Largest model.safetensors.index.json a probe reads (DeepSeek-V3's is "
            "about 9 MB); a larger one is a corrupt_index problem, not read."
        ),
    )
    max_config_bytes: int = Field(
        default=16 * MIB,
        ge=64,
        le=1024 * MIB,
        validation_alias="MX_ROBUST_MAX_CONFIG_BYTES",
        description=(
            "Largest config.json a probe reads; a larger one is a corrupt_config "
            "problem, not read."
        ),
    )
    probe_max_attempts: int = Field(
        default=3,
        ge=1,
        le=10,
        validation_alias="MX_ROBUST_PROBE_MAX_ATTEMPTS",
        description="Attempts per object-store request while probing (retries on throttling and resets).",
    )

    # -- delivery ------------------------------------------------------------
    skip_empty_shards: bool = Field(
        default=True,
        validation_alias="MX_ROBUST_SKIP_EMPTY_SHARDS",
        description=(
            "Leave shards holding zero tensors out of the streamer request "
            "(runai-model-streamer <= 0.16.0 dropped every later file after one). "
            "Applies to checkpoints without model.safetensors.index.json: with an index, only the files "
            "it names load, and it names no empty file, so this setting changes nothing there."
        ),
    )
    completeness: Literal["fail", "warn"] = Field(
        default="fail",
        validation_alias="MX_ROBUST_COMPLETENESS",
        description=(
            "What a load does when a tensor expected from the selected shards was "
            "not delivered exactly once: fail (the chain falls back) or warn."
        ),
    )
    model_completeness: Literal["fail", "warn"] = Field(
        default="fail",
        validation_alias="MX_ROBUST_MODEL_COMPLETENESS",
        description=(
            "What a load does when part of a parameter the model keeps would not "
            "be, or was not, written from the checkpoint, apart from what the "
            "engine fills afterwards (an MTP draft's shared embedding and head). "
            "Checked per element before streaming on the module's answer (a "
            "stacked or fused parameter the checkpoint fills only in part: "
            "refused, the model untouched), and after streaming on what the load "
            "wrote and on the names the model's load_weights reports (the chain "
            "rebuilds the model and falls back): fail, naming the parameters and "
            "the rows, or warn."
        ),
    )

    verify_content: Literal["off", "sample", "all"] = Field(
        default="off",
        validation_alias="MX_ROBUST_VERIFY_CONTENT",
        description=(
            "Compare delivered tensors with the stored bytes: SHA-256 of each "
            "checked tensor against a direct ranged read of its byte range. off, "
            "sample (MX_ROBUST_VERIFY_SAMPLE tensors per load) or all (reads the "
            "checkpoint a second time). A mismatch fails the load naming the "
            "tensor and file; runai itself does not notice wrong bytes."
        ),
    )
    verify_sample: int = Field(
        default=8,
        ge=1,
        le=1_000_000,
        validation_alias="MX_ROBUST_VERIFY_SAMPLE",
        description=(
            "How many tensors MX_ROBUST_VERIFY_CONTENT=sample checks per load, "
            "spread over the shards; the same ones on every load of a checkpoint."
        ),
    )
    read_ahead_bytes: int = Field(
        default=16 << 30,
        ge=0,
        le=1 << 44,
        validation_alias="MX_ROBUST_READ_AHEAD_BYTES",
        description=(
            "How many bytes runai may read while the built module is asked what "
            "it reads (a second or more on the largest checkpoints): the head of "
            "the load the engine's rules foresee (its table row or conventions, "
            "as doctor plans). Nothing read ahead reaches the model before the "
            "module's answer admits it; what the answer leaves out is dropped "
            "and counted in the report. runai's RUNAI_STREAMER_MEMORY_LIMIT "
            "bounds what is held meanwhile. 0: no read-ahead. Loads of one rank "
            "only (not MX_MS_DISTRIBUTED)."
        ),
    )
    file_reader: Literal["auto", "page_cache", "runai"] = Field(
        default="auto",
        validation_alias="MX_ROBUST_FILE_READER",
        description=(
            "Who reads a local checkpoint's files: auto (the page-cache reader where the kernel holds "
            "every shard in its page cache, as on a restart on the same node; runai's direct reads "
            "otherwise), page_cache (always the page-cache reader: each file mapped under a read lease, "
            "or read with preadv where no lease can be had), or runai (runai-model-streamer, direct I/O "
            "by default). Object stores and distributed loads always stream with runai."
        ),
    )
    delivery_order: Literal["arrival", "plan"] = Field(
        default="arrival",
        validation_alias="MX_ROBUST_DELIVERY_ORDER",
        description=(
            "Order in which tensors reach the model: arrival (as runai's reads "
            "complete, like vLLM's own runai loader; no host memory held) or plan "
            "(shards in natural order, tensors by file offset, the same on every "
            "load; early arrivals are held in host memory, at most "
            "MX_ROBUST_PLAN_ORDER_HOLD_BYTES). The ledger checks every tensor off "
            "either way, and the load report lists the shards in plan order."
        ),
    )
    plan_order_hold_bytes: int = Field(
        default=1 << 30,
        ge=0,
        le=1 << 40,
        validation_alias="MX_ROBUST_PLAN_ORDER_HOLD_BYTES",
        description=(
            "With MX_ROBUST_DELIVERY_ORDER=plan: the most tensor bytes held back "
            "waiting for their turn. Past it "
            "the rest of the load is delivered in arrival order, with a warning."
        ),
    )

    # -- progress while streaming (mx_strategies.observe.progress) -------------------
    progress_interval_s: float = Field(
        default=10.0,
        ge=0,
        le=3600,
        allow_inf_nan=False,
        validation_alias="MX_ROBUST_PROGRESS_INTERVAL_S",
        description=(
            "Seconds between the progress lines a load logs at INFO while it streams (bytes done of "
            "planned, rate, ETA, shards done, source); a line is also logged when a shard completes. "
            "0 turns the lines off. Where vLLM shows its own progress bar (use_tqdm_on_load, rank 0) "
            "a tqdm bar is shown whatever this says."
        ),
    )
    progress_all_ranks: bool = Field(
        default=False,
        validation_alias="MX_ROBUST_PROGRESS_ALL_RANKS",
        description="Log the progress lines on every rank, not only on rank 0.",
    )

    # -- speculative drafts --------------------------------------------------
    draft_conventions: Annotated[list[DraftConvention], NoDecode] = Field(
        default=list(DEFAULT_DRAFT_CONVENTIONS),
        validation_alias="MX_ROBUST_DRAFT_CONVENTIONS",
        description=(
            "Comma-separated MTP naming conventions recognised as draft tensors: "
            "mtp (mtp.*, Qwen3-Next/Qwen3.5), nextn_layers "
            "(model.layers.{N+i}.*, DeepSeek-V3/GLM), mtp_layers (model.mtp.layers.*)."
        ),
    )
    draft_extra_prefixes: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        validation_alias="MX_ROBUST_DRAFT_EXTRA_PREFIXES",
        description="Comma-separated extra tensor-name prefixes that belong to the draft.",
    )
    draft_shared_weights: Literal["auto", "always", "never"] = Field(
        default="auto",
        validation_alias="MX_ROBUST_DRAFT_SHARED_WEIGHTS",
        description=(
            "Whether an MTP draft streams the embed_tokens/lm_head it shares with "
            "the target: auto (only when pipeline parallel > 1, where vLLM cannot "
            "share them), always, or never."
        ),
    )

    target_selection: Literal["model", "all"] = Field(
        default="model",
        validation_alias="MX_ROBUST_TARGET_SELECTION",
        description=(
            "What a target load streams from a checkpoint that also holds its MTP "
            "draft: model (the default: every tensor but the draft's own MTP "
            "layers, which the target's load_weights skips and the draft streams "
            "itself) or all (every tensor of every shard)."
        ),
    )

    # -- what the module reads (mx_strategies.select.module_reads) --------------------
    selection_sources: Annotated[list[SelectionSource], NoDecode] = Field(
        default=list(DEFAULT_SELECTION_SOURCES),
        validation_alias="MX_ROBUST_SELECTION_SOURCES",
        description=(
            "Comma-separated sources asked, in this order, which checkpoint tensors a load streams, "
            "after what the model and the engine declare: dry_run (the built module's own load_weights "
            "run over the checkpoint's names with data-less tensors), table (mx_strategies.select.mtp_table, "
            "for classes that cannot be asked), convention (the generic MTP naming conventions). "
            "Leaving out table turns the hand-written table off."
        ),
    )
    dry_run_timeout_s: float = Field(
        default=120.0,
        gt=0,
        le=3600,
        validation_alias="MX_ROBUST_DRY_RUN_TIMEOUT_S",
        description=(
            "Seconds one dry run of a module's load_weights may take before it is abandoned "
            "(the model untouched) and the next selection source answers."
        ),
    )
    dry_run_sample_above: int = Field(
        default=8192,
        ge=0,
        validation_alias="MX_ROBUST_DRY_RUN_SAMPLE_ABOVE",
        description=(
            "Above this many checkpoint names, the dry run feeds every name with fewer than two integers "
            "and a sample of the per-expert ones that covers every layer and expert index of every name "
            "template, and infers the rest (mx_strategies.select.name_sampling): DeepSeek-V3's 92k names cost "
            "seconds instead of minutes. 0 samples every load."
        ),
    )
    reads_cache_dir: Optional[Path] = Field(
        default=DEFAULT_READS_CACHE,
        validation_alias="MX_ROBUST_READS_CACHE_DIR",
        description=(
            "Folder where the dry run's answers are kept, one file per module class, parameter layout, "
            "parallel rank and checkpoint name set (a restart with the same ones asks nothing); any change "
            "of these makes a new key. A kept answer a load proves wrong (the model-side check fails with it) "
            "is deleted by that load; the next asks the module again. Empty turns the cache off. Put it on a "
            "volume that outlives the pod to keep answers across restarts. A leading ~ is the loading user's home."
        ),
    )

    # -- runai-model-streamer pass-through -----------------------------------
    streamer_concurrency: Optional[int] = Field(
        default=None,
        ge=1,
        le=1024,
        validation_alias="MX_ROBUST_STREAMER_CONCURRENCY",
        description=(
            "RUNAI_STREAMER_CONCURRENCY for our loads; unset keeps runai's own. "
            "Also at most the process's hard open-file limit (ulimit -Hn): runai "
            "keeps a file open per concurrent read."
        ),
    )
    streamer_memory_limit: Optional[int] = Field(
        default=None,
        ge=-1,
        le=RUNAI_MAX_INT64,
        validation_alias="MX_ROBUST_STREAMER_MEMORY_LIMIT",
        description="RUNAI_STREAMER_MEMORY_LIMIT in bytes (-1 unlimited, 0 minimal); unset keeps runai's own.",
    )
    streamer_chunk_bytesize: Optional[int] = Field(
        default=None,
        ge=1,
        le=RUNAI_MAX_SIZE_T,
        validation_alias="MX_ROBUST_STREAMER_CHUNK_BYTESIZE",
        description="RUNAI_STREAMER_CHUNK_BYTESIZE for our loads; unset keeps runai's own.",
    )
    streamer_s3_max_retries: Optional[int] = Field(
        default=None,
        ge=1,
        le=100,
        validation_alias="MX_ROBUST_STREAMER_S3_MAX_RETRIES",
        description=(
            "RUNAI_STREAMER_S3_MAX_RETRIES for our loads: retries of one request "
            "(throttling, 5xx, reset, cut body, a read stalled for about 5 s) "
            "inside runai's S3 client. Unset keeps the AWS CRT default of 5: a "
            "persistent error fails a load after about 7-11 s, a server that "
            "stops answering after about 40 s. runai 0.17.0 reads but does not "
            "apply AWS_MAX_ATTEMPTS and AWS_RETRY_MODE."
        ),
    )
    streamer_s3_retry_timeout_s: Optional[int] = Field(
        default=None,
        ge=0,
        le=3600,
        validation_alias="MX_ROBUST_STREAMER_S3_RETRY_TIMEOUT_S",
        description=(
            "RUNAI_STREAMER_S3_TIMEOUT for our loads: seconds runai keeps "
            "re-requesting a chunk after its client's own retries failed (0: "
            "never, runai's default). Adds up to this much to the time a "
            "persistent fault takes to fail a load. Unset keeps runai's own."
        ),
    )
    @field_validator(*ENUM_LIST_FIELDS, mode="before")
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
        if "://" in value:
            scheme, _, rest = value.partition("://")
            if scheme not in MODEL_URI_SCHEMES:
                raise ValueError(f"unsupported scheme {scheme}://")
            if not rest.split("/", 1)[0]:
                raise ValueError(f"names no bucket or container after {scheme}://")
        return value

    @field_validator("streamer_concurrency")
    @classmethod
    def _within_fd_limit(cls, value: Optional[int]) -> Optional[int]:
        """runai opens a file per concurrent read and cannot raise the limit past the hard one."""
        if value is None:
            return value
        _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard != resource.RLIM_INFINITY and value > hard:
            raise ValueError(f"above this process's hard open-file limit ({hard}; ulimit -Hn)")
        return value

    @field_validator("draft_extra_prefixes", mode="before")
    @classmethod
    def _lists_from_commas(cls, value: Any) -> Any:
        return _split_list(value)

    @field_validator(*OPTIONAL_FIELDS, mode="before")
    @classmethod
    def _empty_is_unset(cls, value: Any) -> Any:
        """``VAR=`` (or ``""`` in TOML) means unset, as for MX_MODEL_URI upstream."""
        if isinstance(value, str) and not value.strip():
            return None
        return value

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        config_file = os.environ.get(CONFIG_FILE_ENV)
        if config_file:
            sources.append(_config_file_source(settings_cls, config_file))
        return tuple(sources)


def _config_file_source(settings_cls: type[BaseSettings], config_file: str) -> PydanticBaseSettingsSource:
    """The source for the file ``MX_STRATEGIES_CONFIG`` names.

    ``*.toml`` (also ``*.toml.example``) is TOML, anything else a .env file.
    A key that is no setting is an error: the file holds nothing else, so an
    unknown key is a typo that would otherwise be ignored without a word.
    """
    path = Path(config_file)
    where = f"{CONFIG_FILE_ENV}={config_file!r} is invalid"
    if not path.is_file():
        raise ConfigurationError(f"{where}: no such file (allowed: the path of a .env or .toml file)")
    names = setting_names()
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
    unknown = sorted(keys - names)
    if unknown:
        raise ConfigurationError(f"{where}: {', '.join(unknown)} is not a setting (allowed: {', '.join(sorted(names))})")
    return source


def env_name(field_name: str) -> str:
    """The environment variable a field is read from."""
    alias = RobustSettings.model_fields[field_name].validation_alias
    return str(alias)


def setting_names() -> set[str]:
    """Every variable a setting is read from."""
    return {str(info.validation_alias) for info in RobustSettings.model_fields.values()}


def unknown_variables(environ: Optional[Any] = None) -> list[str]:
    """``MX_ROBUST_*`` variables in the environment that are no setting, each with the nearest valid name."""
    environ = os.environ if environ is None else environ
    names = setting_names()
    problems = []
    for var in sorted(key for key in environ if key.startswith(OUR_PREFIX) and key not in names):
        # Compare what follows the shared prefix, or every name looks alike.
        tails = {name[len(OUR_PREFIX) :]: name for name in names if name.startswith(OUR_PREFIX)}
        close = difflib.get_close_matches(var[len(OUR_PREFIX) :], sorted(tails), n=1, cutoff=0.6)
        hint = f"did you mean {tails[close[0]]}?" if close else f"the settings are {', '.join(sorted(names))}"
        problems.append(f"{var} is not a setting ({hint})")
    return problems


def load_settings(**overrides: Any) -> RobustSettings:
    """Read the settings, turning a validation error into one clear message.

    An ``MX_ROBUST_*`` variable that is no setting is refused too: a typo
    (``MX_ROBUST_COMPLETNESS=warn``) would otherwise leave the default in
    force without a word.
    """
    unknown = unknown_variables()
    if unknown:
        raise ConfigurationError("; ".join(unknown))
    try:
        return RobustSettings(**overrides)
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            name = str(error["loc"][0]) if error["loc"] else "?"
            value = error.get("input")
            problems.append(f"{name}={value!r} is invalid: {_allowed(name, error)}")
        raise ConfigurationError("; ".join(problems)) from None


def current_settings() -> RobustSettings:
    """The settings in force, for code that was handed none (a store, an inspection).

    An invalid environment was already refused at activation and by the
    strategy before it probes; here it falls back to the defaults rather
    than fail a second time.
    """
    try:
        return load_settings()
    except ConfigurationError:
        return RobustSettings.model_construct()


def _allowed(name: str, error: dict[str, Any]) -> str:
    """pydantic's complaint, plus what the variable accepts when it does not say."""
    message = error["msg"]
    if message.startswith("Value error, "):
        message = message[len("Value error, ") :]
    if error.get("type") == "literal_error":
        return message  # "Input should be 'fail' or 'warn'" already says it
    allowed = allowed_for_env(name)
    return f"{message} (allowed: {allowed})" if allowed else message


# -- field -> text -------------------------------------------------------------


def _unwrap_optional(annotation: Any) -> tuple[Any, bool]:
    """``Optional[X]`` -> ``(X, True)``; anything else -> ``(annotation, False)``."""
    if get_origin(annotation) in (Union, types.UnionType):
        members = [arg for arg in get_args(annotation) if arg is not type(None)]
        if len(members) == 1 and len(members) < len(get_args(annotation)):
            return members[0], True
    return annotation, False


def _bounds(info: FieldInfo) -> tuple[Optional[str], Optional[str]]:
    """The lower and upper bound of a numeric field as ``">= 0"``-style text."""
    lower = upper = None
    for item in info.metadata:
        if isinstance(item, annotated_types.Ge):
            lower = f">= {item.ge}"
        elif isinstance(item, annotated_types.Gt):
            lower = f"> {item.gt}"
        elif isinstance(item, annotated_types.Le):
            upper = f"<= {item.le}"
        elif isinstance(item, annotated_types.Lt):
            upper = f"< {item.lt}"
    return lower, upper


def _number_text(kind: str, info: FieldInfo) -> str:
    lower, upper = _bounds(info)
    if lower and upper and lower.startswith(">=") and upper.startswith("<="):
        return f"{kind} from {lower[3:]} to {upper[3:]}"
    limits = " and ".join(bound for bound in (lower, upper) if bound)
    return f"{kind} {limits}" if limits else kind


def _choices(values: tuple[Any, ...]) -> str:
    return ", ".join(str(value) for value in values)


def allowed_text(field: str) -> str:
    """What a field accepts, in words (used in docs and error messages)."""
    info = RobustSettings.model_fields[field]
    annotation, optional = _unwrap_optional(info.annotation)
    origin = get_origin(annotation)
    if annotation is bool:
        text = "true or false; 1/0, yes/no, on/off also work"
    elif origin is Literal:
        text = f"one of {_choices(get_args(annotation))}"
    elif origin is list:
        (item,) = get_args(annotation)
        if get_origin(item) is Literal:
            text = f"one or more of {_choices(get_args(item))}"
            if field in ENUM_LIST_FIELDS:
                text += ", each at most once"
        else:
            text = "a list of strings, possibly empty"
    elif annotation is int:
        text = _number_text("an integer", info)
    elif annotation is float:
        text = _number_text("a number", info)
    elif field == "model_uri":
        text = "an s3://, gs:// or az:// URI or a local path"
    elif annotation is str:
        text = "a string"
    else:  # a new kind of field: say its type rather than guess
        text = getattr(annotation, "__name__", str(annotation))
    if optional:
        text += ", or empty for unset"
    return text


def allowed_for_env(env: str) -> Optional[str]:
    """:func:`allowed_text` for the field read from ``env`` (None if none is)."""
    for field, info in RobustSettings.model_fields.items():
        if str(info.validation_alias) == env:
            return allowed_text(field)
    return None

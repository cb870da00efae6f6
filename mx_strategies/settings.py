"""Typed settings for the mx-strategies load strategies.

One pydantic-settings model holds every knob. Each field names the
environment variable it is read from (``validation_alias``), so the class is
the reference for what a deployment can set. Values come from, in order of
precedence:

1. the environment;
2. a file named by ``MX_STRATEGIES_CONFIG`` (a ``.env`` file, or ``.toml``),
   using the same variable names as keys;
3. the defaults below.

An invalid value raises :class:`SettingsError` with one message naming the
variable, the value and what is allowed, so a bad deployment fails at
activation instead of at the first model load.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any, Literal, Optional

from pydantic import Field, ValidationError, field_validator
from pydantic_settings import (
    BaseSettings,
    DotEnvSettingsSource,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

CONFIG_FILE_ENV = "MX_STRATEGIES_CONFIG"

SourceName = Literal["model_weights", "model", "MX_MODEL_URI"]
DraftConvention = Literal["mtp", "nextn_layers", "mtp_layers"]

DEFAULT_SOURCE_ORDER: tuple[SourceName, ...] = ("model_weights", "model", "MX_MODEL_URI")
DEFAULT_DRAFT_CONVENTIONS: tuple[DraftConvention, ...] = ("mtp", "nextn_layers", "mtp_layers")


class SettingsError(ValueError):
    """A setting has a value the strategies cannot use."""


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
        default=True,
        validation_alias="MX_ROBUST_REQUIRE_MODEL_URI",
        description=(
            "Only offer the strategy when MX_MODEL_URI is set (upstream's gate). "
            "Set to false to stream from the engine's own model_weights/model "
            "without MX_MODEL_URI."
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
        validation_alias="MX_ROBUST_PROBE_TIMEOUT_S",
        description=(
            "Connect and read timeout, in seconds, for listing an object-store "
            "prefix and reading shard headers."
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
            "(runai-model-streamer <= 0.16.0 dropped every later file after one)."
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

    # -- runai-model-streamer pass-through -----------------------------------
    streamer_concurrency: Optional[int] = Field(
        default=None,
        ge=1,
        le=1024,
        validation_alias="MX_ROBUST_STREAMER_CONCURRENCY",
        description="RUNAI_STREAMER_CONCURRENCY for our loads; unset keeps runai's own.",
    )
    streamer_memory_limit: Optional[int] = Field(
        default=None,
        ge=-1,
        validation_alias="MX_ROBUST_STREAMER_MEMORY_LIMIT",
        description="RUNAI_STREAMER_MEMORY_LIMIT in bytes (-1 unlimited, 0 minimal); unset keeps runai's own.",
    )
    streamer_chunk_bytesize: Optional[int] = Field(
        default=None,
        ge=1,
        validation_alias="MX_ROBUST_STREAMER_CHUNK_BYTESIZE",
        description="RUNAI_STREAMER_CHUNK_BYTESIZE for our loads; unset keeps runai's own.",
    )
    distributed: bool = Field(
        default=True,
        validation_alias="MX_MS_DISTRIBUTED",
        description=(
            "Use runai's distributed streaming when the engine runs tensor "
            "parallel > 1 (ModelExpress's own variable, same default)."
        ),
    )

    @field_validator("source_order", "draft_conventions", "draft_extra_prefixes", mode="before")
    @classmethod
    def _lists_from_commas(cls, value: Any) -> Any:
        return _split_list(value)

    @field_validator("source_order", "draft_conventions")
    @classmethod
    def _non_empty_unique(cls, value: list[str]) -> list[str]:
        if not value:
            raise ValueError("must name at least one entry")
        if len(set(value)) != len(value):
            raise ValueError("must not repeat an entry")
        return value

    @field_validator("model_uri")
    @classmethod
    def _empty_uri_is_unset(cls, value: Optional[str]) -> Optional[str]:
        return value or None

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
            path = Path(config_file)
            if not path.is_file():
                raise SettingsError(f"{CONFIG_FILE_ENV}={config_file!r}: no such file")
            if path.suffix == ".toml":
                sources.append(TomlConfigSettingsSource(settings_cls, toml_file=path))
            else:
                sources.append(DotEnvSettingsSource(settings_cls, env_file=path))
        return tuple(sources)


def env_name(field_name: str) -> str:
    """The environment variable a field is read from."""
    alias = RobustSettings.model_fields[field_name].validation_alias
    return str(alias)


def load_settings(**overrides: Any) -> RobustSettings:
    """Read the settings, turning a validation error into one clear message."""
    try:
        return RobustSettings(**overrides)
    except ValidationError as exc:
        problems = []
        for error in exc.errors():
            name = str(error["loc"][0]) if error["loc"] else "?"
            value = error.get("input")
            problems.append(f"{name}={value!r} is invalid: {_allowed(error)}")
        raise SettingsError("; ".join(problems)) from None


def _allowed(error: dict[str, Any]) -> str:
    message = error["msg"]
    if message.startswith("Value error, "):
        message = message[len("Value error, ") :]
    return message

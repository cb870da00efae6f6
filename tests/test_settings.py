"""Settings: defaults, environment and file parsing, precedence, error text,
and the generated example files and docs staying in step with the model.

Every test starts from an environment without MX_* variables (conftest's
``clean_environment``); config files are written under ``tmp_path``.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from dotenv import dotenv_values
from helpers.scripts import load_script

from mx_strategies.errors import ConfigurationError
from mx_strategies.settings import RobustSettings, load_settings

settings_doc = load_script("settings_doc")

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

REPO = Path(__file__).resolve().parents[1]

@pytest.fixture(autouse=True)
def default_reads_cache(monkeypatch):
    """The suite's conftest points every test's kept answers at a folder of its own; these tests read the defaults."""
    monkeypatch.delenv("MX_ROBUST_READS_CACHE_DIR", raising=False)
    monkeypatch.delenv("MX_ROBUST_FILE_READER", raising=False)


# Spelled out, not read from the model: this is what the docs promise.
DEFAULTS = {
    "model_uri": None,
    "source_order": ["model_weights", "model", "MX_MODEL_URI"],
    "require_model_uri": False,
    "guard_chain": "auto",
    "discovery_depth": 3,
    "probe_timeout_s": 20.0,
    "max_discovery_entries": 100_000,
    "max_header_bytes": 100 * 1024 * 1024,
    "max_index_bytes": 64 * 1024 * 1024,
    "max_config_bytes": 16 * 1024 * 1024,
    "probe_max_attempts": 3,
    "skip_empty_shards": True,
    "completeness": "fail",
    "model_completeness": "fail",
    "verify_content": "off",
    "verify_sample": 8,
    "file_reader": "auto",
    "delivery_order": "arrival",
    "plan_order_hold_bytes": 1 << 30,
    "read_ahead_bytes": 16 << 30,
    "progress_interval_s": 10.0,
    "progress_all_ranks": False,
    "draft_conventions": ["mtp", "nextn_layers", "mtp_layers"],
    "draft_extra_prefixes": [],
    "draft_shared_weights": "auto",
    "target_selection": "model",
    "selection_sources": ["dry_run", "table", "convention"],
    "dry_run_timeout_s": 120.0,
    "dry_run_sample_above": 8192,
    "reads_cache_dir": Path("~/.cache/mx-strategies/reads"),
    "streamer_concurrency": None,
    "streamer_memory_limit": None,
    "streamer_chunk_bytesize": None,
    "streamer_s3_max_retries": None,
    "streamer_s3_retry_timeout_s": None,
}

# One non-default value per variable, as the environment spells it, and the
# typed value it must become.
NON_DEFAULTS = {
    "MX_MODEL_URI": ("s3://models/qwen3-next", "s3://models/qwen3-next"),
    "MX_ROBUST_SOURCE_ORDER": ("MX_MODEL_URI , model", ["MX_MODEL_URI", "model"]),
    "MX_ROBUST_REQUIRE_MODEL_URI": ("true", True),
    "MX_ROBUST_GUARD_CHAIN": ("module", "module"),
    "MX_ROBUST_DISCOVERY_DEPTH": ("0", 0),
    "MX_ROBUST_PROBE_TIMEOUT_S": ("2.5", 2.5),
    "MX_ROBUST_MAX_DISCOVERY_ENTRIES": ("5000", 5000),
    "MX_ROBUST_MAX_HEADER_BYTES": ("1048576", 1048576),
    "MX_ROBUST_MAX_INDEX_BYTES": ("2097152", 2097152),
    "MX_ROBUST_MAX_CONFIG_BYTES": ("65536", 65536),
    "MX_ROBUST_PROBE_MAX_ATTEMPTS": ("10", 10),
    "MX_ROBUST_SKIP_EMPTY_SHARDS": ("0", False),
    "MX_ROBUST_COMPLETENESS": ("warn", "warn"),
    "MX_ROBUST_MODEL_COMPLETENESS": ("warn", "warn"),
    "MX_ROBUST_FILE_READER": ("page_cache", "page_cache"),
    "MX_ROBUST_DELIVERY_ORDER": ("plan", "plan"),
    "MX_ROBUST_PLAN_ORDER_HOLD_BYTES": ("0", 0),
    "MX_ROBUST_READ_AHEAD_BYTES": ("0", 0),
    "MX_ROBUST_PROGRESS_INTERVAL_S": ("0.5", 0.5),
    "MX_ROBUST_PROGRESS_ALL_RANKS": ("yes", True),
    "MX_ROBUST_VERIFY_CONTENT": ("sample", "sample"),
    "MX_ROBUST_VERIFY_SAMPLE": ("64", 64),
    "MX_ROBUST_DRAFT_CONVENTIONS": ("nextn_layers", ["nextn_layers"]),
    "MX_ROBUST_DRAFT_EXTRA_PREFIXES": ("model.eagle.,extra.", ["model.eagle.", "extra."]),
    "MX_ROBUST_DRAFT_SHARED_WEIGHTS": ("always", "always"),
    "MX_ROBUST_TARGET_SELECTION": ("all", "all"),
    "MX_ROBUST_SELECTION_SOURCES": ("table, convention", ["table", "convention"]),
    "MX_ROBUST_DRY_RUN_TIMEOUT_S": ("2.5", 2.5),
    "MX_ROBUST_DRY_RUN_SAMPLE_ABOVE": ("0", 0),
    "MX_ROBUST_READS_CACHE_DIR": ("/var/cache/mx-reads", Path("/var/cache/mx-reads")),
    "MX_ROBUST_STREAMER_CONCURRENCY": ("32", 32),
    "MX_ROBUST_STREAMER_MEMORY_LIMIT": ("-1", -1),
    "MX_ROBUST_STREAMER_CHUNK_BYTESIZE": ("8388608", 8388608),
    "MX_ROBUST_STREAMER_S3_MAX_RETRIES": ("2", 2),
    "MX_ROBUST_STREAMER_S3_RETRY_TIMEOUT_S": ("0", 0),
}


def _field_of(env: str) -> str:
    (field,) = [name for name, info in RobustSettings.model_fields.items() if info.validation_alias == env]
    return field


def _use_config(monkeypatch, path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    monkeypatch.setenv("MX_STRATEGIES_CONFIG", str(path))
    return path


# -- defaults and parsing ------------------------------------------------------


def test_defaults():
    assert set(DEFAULTS) == set(RobustSettings.model_fields), "a field was added or removed: update DEFAULTS"
    assert load_settings().model_dump() == DEFAULTS


def test_every_variable_parsed_from_the_environment(monkeypatch):
    assert {_field_of(env) for env in NON_DEFAULTS} == set(RobustSettings.model_fields)
    for env, (raw, _) in NON_DEFAULTS.items():
        monkeypatch.setenv(env, raw)
    settings = load_settings()
    for env, (_, typed) in NON_DEFAULTS.items():
        assert getattr(settings, _field_of(env)) == typed, env


@pytest.mark.parametrize(
    "env",
    [
        "MX_MODEL_URI",
        "MX_ROBUST_STREAMER_CONCURRENCY",
        "MX_ROBUST_STREAMER_MEMORY_LIMIT",
        "MX_ROBUST_STREAMER_CHUNK_BYTESIZE",
        "MX_ROBUST_STREAMER_S3_MAX_RETRIES",
        "MX_ROBUST_STREAMER_S3_RETRY_TIMEOUT_S",
    ],
)
def test_empty_value_of_an_optional_setting_means_unset(monkeypatch, env):
    monkeypatch.setenv(env, "")
    assert getattr(load_settings(), _field_of(env)) is None


def test_empty_extra_prefixes_mean_none(monkeypatch):
    monkeypatch.setenv("MX_ROBUST_DRAFT_EXTRA_PREFIXES", " , ")
    assert load_settings().draft_extra_prefixes == []


def test_dotenv_file(monkeypatch, tmp_path):
    _use_config(
        monkeypatch,
        tmp_path / "robust.env",
        "# a comment\n"
        "MX_MODEL_URI=s3://models/deepseek\n"
        "MX_ROBUST_SOURCE_ORDER=MX_MODEL_URI,model_weights\n"
        'MX_ROBUST_COMPLETENESS="warn"\n'
        "MX_ROBUST_SKIP_EMPTY_SHARDS=off\n"
        "MX_ROBUST_PROBE_TIMEOUT_S=7.5\n"
        "MX_ROBUST_STREAMER_CONCURRENCY=\n",
    )
    settings = load_settings()
    assert settings.model_uri == "s3://models/deepseek"
    assert settings.source_order == ["MX_MODEL_URI", "model_weights"]
    assert settings.completeness == "warn"
    assert settings.skip_empty_shards is False
    assert settings.probe_timeout_s == 7.5
    assert settings.streamer_concurrency is None
    assert settings.discovery_depth == DEFAULTS["discovery_depth"]


def test_toml_file(monkeypatch, tmp_path):
    _use_config(
        monkeypatch,
        tmp_path / "robust.toml",
        'MX_MODEL_URI = "gs://models/glm"\n'
        'MX_ROBUST_DRAFT_CONVENTIONS = ["mtp_layers", "mtp"]\n'
        'MX_ROBUST_DRAFT_EXTRA_PREFIXES = "a.,b."\n'  # a comma-separated string works too
        "MX_ROBUST_REQUIRE_MODEL_URI = true\n"
        "MX_ROBUST_DISCOVERY_DEPTH = 8\n"
        "MX_ROBUST_PROBE_TIMEOUT_S = 1\n"
        "MX_ROBUST_STREAMER_MEMORY_LIMIT = 0\n",
    )
    settings = load_settings()
    assert settings.model_uri == "gs://models/glm"
    assert settings.draft_conventions == ["mtp_layers", "mtp"]
    assert settings.draft_extra_prefixes == ["a.", "b."]
    assert settings.require_model_uri is True
    assert settings.discovery_depth == 8
    assert settings.probe_timeout_s == 1.0
    assert settings.streamer_memory_limit == 0
    assert settings.completeness == DEFAULTS["completeness"]


@pytest.mark.parametrize(
    "name, text",
    [
        ("robust.env", "MX_ROBUST_COMPLETENESS=warn\nMX_ROBUST_DISCOVERY_DEPTH=5\n"),
        ("robust.toml", 'MX_ROBUST_COMPLETENESS = "warn"\nMX_ROBUST_DISCOVERY_DEPTH = 5\n'),
    ],
)
def test_environment_wins_over_file_and_file_over_defaults(monkeypatch, tmp_path, name, text):
    _use_config(monkeypatch, tmp_path / name, text)
    monkeypatch.setenv("MX_ROBUST_DISCOVERY_DEPTH", "1")
    settings = load_settings()
    assert settings.discovery_depth == 1  # environment over file
    assert settings.completeness == "warn"  # file over default
    assert settings.probe_max_attempts == DEFAULTS["probe_max_attempts"]  # default


# -- invalid values: one message naming the variable, the value, what is allowed


INVALID = [
    ("MX_ROBUST_MODEL_COMPLETENESS", "maybe", "Input should be 'fail' or 'warn'"),
    ("MX_ROBUST_DELIVERY_ORDER", "sorted", "Input should be 'arrival' or 'plan'"),
    ("MX_ROBUST_FILE_READER", "mmap", "Input should be 'auto', 'page_cache' or 'runai'"),
    ("MX_ROBUST_PLAN_ORDER_HOLD_BYTES", "-1",
     "Input should be greater than or equal to 0 (allowed: an integer from 0 to 1099511627776)"),
    ("MX_ROBUST_READ_AHEAD_BYTES", "16GiB",
     "Input should be a valid integer, unable to parse string as an integer (allowed: an integer from 0 to 17592186044416)"),
    # source order: bad entry, duplicate, empty
    ("MX_ROBUST_SOURCE_ORDER", "model,bogus",
     "unknown entry 'bogus' (allowed: one or more of model_weights, model, MX_MODEL_URI, each at most once)"),
    ("MX_ROBUST_SOURCE_ORDER", "model,model",
     "'model' is named twice (allowed: one or more of model_weights, model, MX_MODEL_URI, each at most once)"),
    ("MX_ROBUST_SOURCE_ORDER", "",
     "names no entry (allowed: one or more of model_weights, model, MX_MODEL_URI, each at most once)"),
    ("MX_ROBUST_SOURCE_ORDER", " , ",
     "names no entry (allowed: one or more of model_weights, model, MX_MODEL_URI, each at most once)"),
    # draft conventions
    ("MX_ROBUST_DRAFT_CONVENTIONS", "mtp,eagle",
     "unknown entry 'eagle' (allowed: one or more of mtp, nextn_layers, mtp_layers, each at most once)"),
    ("MX_ROBUST_DRAFT_CONVENTIONS", "mtp,nextn_layers,mtp",
     "'mtp' is named twice (allowed: one or more of mtp, nextn_layers, mtp_layers, each at most once)"),
    ("MX_ROBUST_DRAFT_CONVENTIONS", "",
     "names no entry (allowed: one or more of mtp, nextn_layers, mtp_layers, each at most once)"),
    # choices (pydantic's message already lists them)
    ("MX_ROBUST_COMPLETENESS", "maybe", "Input should be 'fail' or 'warn'"),
    ("MX_ROBUST_DRAFT_SHARED_WEIGHTS", "sometimes", "Input should be 'auto', 'always' or 'never'"),
    ("MX_ROBUST_TARGET_SELECTION", "everything", "Input should be 'model' or 'all'"),
    # what the module reads
    ("MX_ROBUST_SELECTION_SOURCES", "dry_run,guess",
     "unknown entry 'guess' (allowed: one or more of dry_run, table, convention, each at most once)"),
    ("MX_ROBUST_SELECTION_SOURCES", "", "names no entry (allowed: one or more of dry_run, table, convention, each at most once)"),
    ("MX_ROBUST_DRY_RUN_TIMEOUT_S", "0", "Input should be greater than 0 (allowed: a number > 0 and <= 3600)"),
    ("MX_ROBUST_DRY_RUN_SAMPLE_ABOVE", "-1", "Input should be greater than or equal to 0 (allowed: an integer >= 0)"),
    ("MX_ROBUST_VERIFY_CONTENT", "most", "Input should be 'off', 'sample' or 'all'"),
    # content verification sample
    ("MX_ROBUST_VERIFY_SAMPLE", "0",
     "Input should be greater than or equal to 1 (allowed: an integer from 1 to 1000000)"),
    ("MX_ROBUST_VERIFY_SAMPLE", "1000001",
     "Input should be less than or equal to 1000000 (allowed: an integer from 1 to 1000000)"),
    # discovery depth
    ("MX_ROBUST_DISCOVERY_DEPTH", "9", "Input should be less than or equal to 8 (allowed: an integer from 0 to 8)"),
    ("MX_ROBUST_DISCOVERY_DEPTH", "-1", "Input should be greater than or equal to 0 (allowed: an integer from 0 to 8)"),
    ("MX_ROBUST_DISCOVERY_DEPTH", "two",
     "Input should be a valid integer, unable to parse string as an integer (allowed: an integer from 0 to 8)"),
    # probe timeout
    ("MX_ROBUST_PROBE_TIMEOUT_S", "0", "Input should be greater than 0 (allowed: a number > 0 and <= 600)"),
    ("MX_ROBUST_PROBE_TIMEOUT_S", "601",
     "Input should be less than or equal to 600 (allowed: a number > 0 and <= 600)"),
    ("MX_ROBUST_PROBE_TIMEOUT_S", "nan", "Input should be a finite number (allowed: a number > 0 and <= 600)"),
    ("MX_ROBUST_PROBE_TIMEOUT_S", "soon",
     "Input should be a valid number, unable to parse string as a number (allowed: a number > 0 and <= 600)"),
    # probe attempts
    ("MX_ROBUST_PROBE_MAX_ATTEMPTS", "0",
     "Input should be greater than or equal to 1 (allowed: an integer from 1 to 10)"),
    ("MX_ROBUST_PROBE_MAX_ATTEMPTS", "11",
     "Input should be less than or equal to 10 (allowed: an integer from 1 to 10)"),
    ("MX_ROBUST_PROBE_MAX_ATTEMPTS", "2.5",
     "Input should be a valid integer, unable to parse string as an integer (allowed: an integer from 1 to 10)"),
    # streamer pass-through
    ("MX_ROBUST_STREAMER_CONCURRENCY", "0",
     "Input should be greater than or equal to 1 (allowed: an integer from 1 to 1024, or empty for unset)"),
    ("MX_ROBUST_STREAMER_CONCURRENCY", "1025",
     "Input should be less than or equal to 1024 (allowed: an integer from 1 to 1024, or empty for unset)"),
    ("MX_ROBUST_STREAMER_MEMORY_LIMIT", "-2",
     "Input should be greater than or equal to -1 "
     "(allowed: an integer from -1 to 9223372036854775807, or empty for unset)"),
    ("MX_ROBUST_STREAMER_MEMORY_LIMIT", "1GB",
     "Input should be a valid integer, unable to parse string as an integer "
     "(allowed: an integer from -1 to 9223372036854775807, or empty for unset)"),
    ("MX_ROBUST_STREAMER_CHUNK_BYTESIZE", "0",
     "Input should be greater than or equal to 1 "
     "(allowed: an integer from 1 to 18446744073709551615, or empty for unset)"),
    ("MX_ROBUST_STREAMER_CHUNK_BYTESIZE", "8MiB",
     "Input should be a valid integer, unable to parse string as an integer "
     "(allowed: an integer from 1 to 18446744073709551615, or empty for unset)"),
    ("MX_ROBUST_STREAMER_CHUNK_BYTESIZE", "18446744073709551616",
     "Input should be less than or equal to 18446744073709551615 "
     "(allowed: an integer from 1 to 18446744073709551615, or empty for unset)"),
    # probe caps (issue 15)
    ("MX_ROBUST_MAX_DISCOVERY_ENTRIES", "0",
     "Input should be greater than or equal to 1 (allowed: an integer from 1 to 10000000)"),
    ("MX_ROBUST_MAX_HEADER_BYTES", "104857601",
     "Input should be less than or equal to 104857600 (allowed: an integer from 64 to 104857600)"),
    ("MX_ROBUST_MAX_INDEX_BYTES", "63",
     "Input should be greater than or equal to 64 (allowed: an integer from 64 to 1073741824)"),
    ("MX_ROBUST_MAX_CONFIG_BYTES", "1GiB",
     "Input should be a valid integer, unable to parse string as an integer (allowed: an integer from 64 to 1073741824)"),
    # MX_MODEL_URI (issue 15)
    ("MX_MODEL_URI", " ",
     "is blank (unset it, or name a checkpoint) "
     "(allowed: an s3://, gs:// or az:// URI or a local path, or empty for unset)"),
    ("MX_MODEL_URI", "hf://org/name",
     "unsupported scheme hf:// (allowed: an s3://, gs:// or az:// URI or a local path, or empty for unset)"),
    ("MX_ROBUST_STREAMER_S3_MAX_RETRIES", "0",
     "Input should be greater than or equal to 1 (allowed: an integer from 1 to 100, or empty for unset)"),
    ("MX_ROBUST_STREAMER_S3_MAX_RETRIES", "101",
     "Input should be less than or equal to 100 (allowed: an integer from 1 to 100, or empty for unset)"),
    ("MX_ROBUST_STREAMER_S3_RETRY_TIMEOUT_S", "-1",
     "Input should be greater than or equal to 0 (allowed: an integer from 0 to 3600, or empty for unset)"),
    ("MX_ROBUST_STREAMER_S3_RETRY_TIMEOUT_S", "1.5",
     "Input should be a valid integer, unable to parse string as an integer "
     "(allowed: an integer from 0 to 3600, or empty for unset)"),
    # progress lines
    ("MX_ROBUST_PROGRESS_INTERVAL_S", "-1",
     "Input should be greater than or equal to 0 (allowed: a number from 0 to 3600)"),
    ("MX_ROBUST_PROGRESS_INTERVAL_S", "inf", "Input should be a finite number (allowed: a number from 0 to 3600)"),
    ("MX_ROBUST_PROGRESS_ALL_RANKS", "rank0",
     "Input should be a valid boolean, unable to interpret input (allowed: true or false; 1/0, yes/no, on/off also work)"),
    # booleans
    ("MX_ROBUST_SKIP_EMPTY_SHARDS", "perhaps",
     "Input should be a valid boolean, unable to interpret input (allowed: true or false; 1/0, yes/no, on/off also work)"),
    ("MX_ROBUST_SKIP_EMPTY_SHARDS", "",
     "Input should be a valid boolean, unable to interpret input (allowed: true or false; 1/0, yes/no, on/off also work)"),
    ("MX_ROBUST_REQUIRE_MODEL_URI", "2",
     "Input should be a valid boolean, unable to interpret input (allowed: true or false; 1/0, yes/no, on/off also work)"),
    ("MX_ROBUST_GUARD_CHAIN", "false", "Input should be 'auto', 'module' or 'off'"),
]  # fmt: skip


@pytest.mark.parametrize("env, value, reason", INVALID, ids=[f"{env}={value!r}" for env, value, _ in INVALID])
def test_invalid_value_names_variable_value_and_what_is_allowed(monkeypatch, env, value, reason):
    monkeypatch.setenv(env, value)
    with pytest.raises(ConfigurationError) as caught:
        load_settings()
    assert str(caught.value) == f"{env}={value!r} is invalid: {reason}"


def test_every_validated_setting_has_an_invalid_value_test():
    tested = {env for env, _, _ in INVALID}
    free_form = {"MX_ROBUST_DRAFT_EXTRA_PREFIXES", "MX_ROBUST_READS_CACHE_DIR"}  # any string is accepted
    assert tested | free_form == {info.validation_alias for info in RobustSettings.model_fields.values()}


def test_several_invalid_values_are_reported_together(monkeypatch):
    monkeypatch.setenv("MX_ROBUST_COMPLETENESS", "maybe")
    monkeypatch.setenv("MX_ROBUST_PROBE_MAX_ATTEMPTS", "0")
    with pytest.raises(ConfigurationError) as caught:
        load_settings()
    assert str(caught.value) == (
        "MX_ROBUST_PROBE_MAX_ATTEMPTS='0' is invalid: Input should be greater than or equal to 1 "
        "(allowed: an integer from 1 to 10); "
        "MX_ROBUST_COMPLETENESS='maybe' is invalid: Input should be 'fail' or 'warn'"
    )


@pytest.mark.parametrize(
    "name, text, message",
    [
        (
            "robust.toml",
            'MX_ROBUST_SOURCE_ORDER = ["model", "bogus"]\n',
            "MX_ROBUST_SOURCE_ORDER=['model', 'bogus'] is invalid: unknown entry 'bogus' "
            "(allowed: one or more of model_weights, model, MX_MODEL_URI, each at most once)",
        ),
        (
            "robust.env",
            "MX_ROBUST_PROBE_TIMEOUT_S=-3\n",
            "MX_ROBUST_PROBE_TIMEOUT_S='-3' is invalid: Input should be greater than 0 (allowed: a number > 0 and <= 600)",
        ),
    ],
    ids=["toml", "dotenv"],
)
def test_invalid_value_in_a_config_file(monkeypatch, tmp_path, name, text, message):
    _use_config(monkeypatch, tmp_path / name, text)
    with pytest.raises(ConfigurationError) as caught:
        load_settings()
    assert str(caught.value) == message


def test_missing_config_file(monkeypatch, tmp_path):
    missing = tmp_path / "nowhere.toml"
    monkeypatch.setenv("MX_STRATEGIES_CONFIG", str(missing))
    with pytest.raises(ConfigurationError) as caught:
        load_settings()
    assert str(caught.value) == (
        f"MX_STRATEGIES_CONFIG={str(missing)!r} is invalid: no such file (allowed: the path of a .env or .toml file)"
    )


def test_config_file_key_that_is_no_setting(monkeypatch, tmp_path):
    path = _use_config(monkeypatch, tmp_path / "robust.toml", 'MX_ROBUST_COMPLETNESS = "warn"\n')
    with pytest.raises(ConfigurationError) as caught:
        load_settings()
    message = str(caught.value)
    assert message.startswith(
        f"MX_STRATEGIES_CONFIG={str(path)!r} is invalid: MX_ROBUST_COMPLETNESS is not a setting (allowed: "
    )
    assert "MX_ROBUST_COMPLETENESS" in message


def test_config_file_that_is_not_toml(monkeypatch, tmp_path):
    path = _use_config(monkeypatch, tmp_path / "robust.toml", "MX_ROBUST_COMPLETENESS = warn\n")
    with pytest.raises(ConfigurationError) as caught:
        load_settings()
    assert str(caught.value).startswith(f"MX_STRATEGIES_CONFIG={str(path)!r} is invalid: cannot read it: ")


# -- the generated example files and docs --------------------------------------

ENV_LINE = re.compile(r"^# (MX_[A-Z0-9_]+)=(.*)$", re.MULTILINE)
TOML_LINE = re.compile(r"^# (MX_[A-Z0-9_]+) = (.*)$", re.MULTILINE)
ALL_ENVS = {str(info.validation_alias) for info in RobustSettings.model_fields.values()}


def test_generated_files_match_the_model():
    """The drift test: regenerate with `python scripts/settings_doc.py --write`."""
    for relative, text in settings_doc.rendered_files().items():
        on_disk = (REPO / relative).read_text(encoding="utf-8")
        assert on_disk == text, f"{relative} is stale: run `python scripts/settings_doc.py --write`"


def test_a_changed_field_makes_the_files_stale(monkeypatch):
    assert settings_doc.stale_files(REPO) == []
    monkeypatch.setattr(RobustSettings.model_fields["discovery_depth"], "description", "Something else.")
    assert settings_doc.stale_files(REPO) == [
        settings_doc.ENV_EXAMPLE,
        settings_doc.TOML_EXAMPLE,
        settings_doc.SETTINGS_DOC,
    ]


def test_every_setting_is_in_both_examples_and_the_docs():
    env_text = (REPO / "configs/robust.env.example").read_text(encoding="utf-8")
    toml_text = (REPO / "configs/robust.toml.example").read_text(encoding="utf-8")
    docs_text = (REPO / "docs/settings.md").read_text(encoding="utf-8")
    env_lines = [env for env, _ in ENV_LINE.findall(env_text)]
    toml_lines = [env for env, _ in TOML_LINE.findall(toml_text)]
    doc_rows = re.findall(r"^\| `(MX_[A-Z0-9_]+)` \|", docs_text, re.MULTILINE)
    for listed in (env_lines, toml_lines, doc_rows):
        assert sorted(listed) == sorted(ALL_ENVS)  # each setting exactly once, nothing else
    for info in RobustSettings.model_fields.values():
        assert info.description, f"{info.validation_alias} has no description"


def _uncommented(text: str, pattern: re.Pattern) -> str:
    return pattern.sub(lambda match: match.group(0)[2:], text)


@pytest.mark.parametrize(
    "example, copy_name, pattern",
    [("robust.env.example", "robust.env", ENV_LINE), ("robust.toml.example", "robust.toml", TOML_LINE)],
)
def test_example_with_every_line_uncommented_gives_the_defaults(monkeypatch, tmp_path, example, copy_name, pattern):
    text = _uncommented((REPO / "configs" / example).read_text(encoding="utf-8"), pattern)
    path = _use_config(monkeypatch, tmp_path / copy_name, text)
    keys = set(tomllib.loads(text)) if copy_name.endswith(".toml") else set(dotenv_values(path))
    assert keys == ALL_ENVS  # every setting really is read from the file
    assert load_settings().model_dump() == DEFAULTS


def test_examples_as_shipped_change_nothing(monkeypatch):
    for example in ("robust.env.example", "robust.toml.example"):
        monkeypatch.setenv("MX_STRATEGIES_CONFIG", str(REPO / "configs" / example))
        assert load_settings().model_dump() == DEFAULTS


@pytest.mark.parametrize("copy_name", ["robust.toml", "site.toml.example"])
def test_toml_example_with_a_few_values_changed(monkeypatch, tmp_path, copy_name):
    text = (REPO / "configs/robust.toml.example").read_text(encoding="utf-8")
    edits = {
        "# MX_ROBUST_COMPLETENESS = \"fail\"": 'MX_ROBUST_COMPLETENESS = "warn"',
        "# MX_ROBUST_SOURCE_ORDER = [\"model_weights\", \"model\", \"MX_MODEL_URI\"]":
            'MX_ROBUST_SOURCE_ORDER = ["MX_MODEL_URI", "model"]',
        "# MX_ROBUST_STREAMER_CONCURRENCY = \"\"": "MX_ROBUST_STREAMER_CONCURRENCY = 16",
    }  # fmt: skip
    for old, new in edits.items():
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    _use_config(monkeypatch, tmp_path / copy_name, text)
    expected = dict(DEFAULTS, completeness="warn", source_order=["MX_MODEL_URI", "model"], streamer_concurrency=16)
    assert load_settings().model_dump() == expected


def test_regenerating_writes_what_the_check_accepts(tmp_path, capsys):
    assert settings_doc.main(["--check", "--root", str(tmp_path)]) == 1  # nothing there yet
    assert settings_doc.main(["--write", "--root", str(tmp_path)]) == 0
    assert settings_doc.main(["--check", "--root", str(tmp_path)]) == 0
    for relative in settings_doc.rendered_files():
        assert (tmp_path / relative).read_bytes() == (REPO / relative).read_bytes()
    (tmp_path / settings_doc.TOML_EXAMPLE).write_text("# edited by hand\n", encoding="utf-8")
    assert settings_doc.main(["--check", "--root", str(tmp_path)]) == 1
    assert "configs/robust.toml.example is out of date" in capsys.readouterr().err

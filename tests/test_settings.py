"""Settings: defaults, environment and file parsing, precedence, error text,
and the generated example files and docs staying in step with the model.

Every test starts from an environment without MX_* variables (conftest's
``clean_environment``); config files are written under ``tmp_path``.
"""

from __future__ import annotations

import ast
import logging
import re
import time
from pathlib import Path

import pytest
import torch
from dotenv import dotenv_values
from helpers.checkpoints import write_shard
from helpers.scripts import load_script

import mx_strategies.settings as settings_module
from mx_strategies.errors import ConfigurationError
from mx_strategies.settings import RETIRED, RobustSettings, load_settings

SETTINGS_LOGGER = "modelexpress.strategy_robust_model_streamer.settings"

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
    "max_header_bytes": 100 * 1024 * 1024,
    "skip_empty_shards": True,
    "completeness": "fail",
    "model_completeness": "fail",
    "verify_content": "off",
    "file_reader": "auto",
    "read_ahead_bytes": 16 << 30,
    "progress_interval_s": 10.0,
    "draft_conventions": ["mtp", "nextn_layers", "mtp_layers"],
    "draft_extra_prefixes": [],
    "draft_shared_weights": "auto",
    "target_selection": "model",
    "dry_run_timeout_s": 120.0,
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
    "MX_ROBUST_MAX_HEADER_BYTES": ("1048576", 1048576),
    "MX_ROBUST_SKIP_EMPTY_SHARDS": ("0", False),
    "MX_ROBUST_COMPLETENESS": ("warn", "warn"),
    "MX_ROBUST_MODEL_COMPLETENESS": ("warn", "warn"),
    "MX_ROBUST_FILE_READER": ("page_cache", "page_cache"),
    "MX_ROBUST_READ_AHEAD_BYTES": ("0", 0),
    "MX_ROBUST_PROGRESS_INTERVAL_S": ("0.5", 0.5),
    "MX_ROBUST_VERIFY_CONTENT": ("sample", "sample"),
    "MX_ROBUST_DRAFT_CONVENTIONS": ("nextn_layers", ["nextn_layers"]),
    "MX_ROBUST_DRAFT_EXTRA_PREFIXES": ("model.eagle.,extra.", ["model.eagle.", "extra."]),
    "MX_ROBUST_DRAFT_SHARED_WEIGHTS": ("always", "always"),
    "MX_ROBUST_TARGET_SELECTION": ("all", "all"),
    "MX_ROBUST_DRY_RUN_TIMEOUT_S": ("2.5", 2.5),
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
    assert settings.probe_timeout_s == DEFAULTS["probe_timeout_s"]  # default


# -- invalid values: one message naming the variable, the value, what is allowed


INVALID = [
    ("MX_ROBUST_MODEL_COMPLETENESS", "maybe", "Input should be 'fail' or 'warn'"),
    ("MX_ROBUST_FILE_READER", "mmap", "Input should be 'auto', 'page_cache' or 'runai'"),
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
    ("MX_ROBUST_DRY_RUN_TIMEOUT_S", "0", "Input should be greater than 0 (allowed: a number > 0 and <= 3600)"),
    ("MX_ROBUST_VERIFY_CONTENT", "most", "Input should be 'off', 'sample' or 'all'"),
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
    ("MX_ROBUST_MAX_HEADER_BYTES", "104857601",
     "Input should be less than or equal to 104857600 (allowed: an integer from 64 to 104857600)"),
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
    monkeypatch.setenv("MX_ROBUST_DISCOVERY_DEPTH", "9")
    with pytest.raises(ConfigurationError) as caught:
        load_settings()
    assert str(caught.value) == (
        "MX_ROBUST_DISCOVERY_DEPTH='9' is invalid: Input should be less than or equal to 8 "
        "(allowed: an integer from 0 to 8); "
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


# -- retired variables: one warning each, never an error, nothing changed ------


@pytest.fixture
def settings_log(monkeypatch, caplog):
    """The settings' warnings, with this process's memory of those already given cleared."""
    monkeypatch.setattr(settings_module, "_warned", set())
    caplog.set_level(logging.WARNING, logger=SETTINGS_LOGGER)
    return lambda: [r.getMessage() for r in caplog.records if r.name == SETTINGS_LOGGER]


@pytest.mark.parametrize("env", sorted(RETIRED))
def test_a_retired_variable_logs_one_warning_naming_what_replaced_it(monkeypatch, settings_log, env):
    monkeypatch.setenv(env, "plan")  # any value, even one the setting once refused
    assert load_settings().model_dump() == DEFAULTS
    load_settings()  # once per process, however often the settings are read
    assert settings_log() == [f"{env} is retired and no longer read: {RETIRED[env]}; unset it"]


def test_retired_variables_in_a_config_file_warn_too(monkeypatch, tmp_path, settings_log):
    _use_config(monkeypatch, tmp_path / "robust.toml", 'MX_ROBUST_DELIVERY_ORDER = "plan"\nMX_ROBUST_COMPLETENESS = "warn"\n')
    monkeypatch.setenv("MX_ROBUST_PROGRESS_ALL_RANKS", "true")
    assert load_settings().completeness == "warn"
    assert settings_log() == [  # the environment's first, then the file's
        f"MX_ROBUST_PROGRESS_ALL_RANKS is retired and no longer read: {RETIRED['MX_ROBUST_PROGRESS_ALL_RANKS']}; "
        "unset it",
        f"MX_ROBUST_DELIVERY_ORDER is retired and no longer read: {RETIRED['MX_ROBUST_DELIVERY_ORDER']}; unset it",
    ]


def test_a_retired_variable_is_no_setting_and_a_typo_still_is_refused(monkeypatch, settings_log):
    assert not RETIRED.keys() & ALL_ENVS
    monkeypatch.setenv("MX_ROBUST_PROGRESS_ALL_RANKS", "true")
    monkeypatch.setenv("MX_ROBUST_COMPLETNESS", "warn")
    with pytest.raises(ConfigurationError, match=r"^MX_ROBUST_COMPLETNESS is not a setting \(did you mean MX_ROBUST_COMPLETENESS\?\)$"):
        load_settings()
    assert len(settings_log()) == 1


def test_the_docs_list_every_retired_variable_with_what_replaced_it():
    docs_text = (REPO / "docs/settings.md").read_text(encoding="utf-8")
    for env, replacement in RETIRED.items():
        assert f"- `{env}`: {replacement}." in docs_text


# -- every setting earns its place: who sets it, and a test that shows what it changes

# Each setting -> the test that shows what it changes (docs/settings.md names it; scripts/settings_doc.py reads it).
SHOWN_BY = {
    "MX_MODEL_URI": "tests/test_report.py::test_report_says_what_loaded_from_where_and_how_long_each_phase_took",
    "MX_ROBUST_SOURCE_ORDER": "tests/test_sources.py::test_source_order_is_configurable",
    "MX_ROBUST_REQUIRE_MODEL_URI": "tests/test_robust.py::test_offered_without_mx_model_uri_unless_the_gate_is_kept",
    "MX_ROBUST_GUARD_CHAIN": "tests/test_chain_guard.py::test_the_setting_lets_instant_tensor_read_any_folder",
    "MX_ROBUST_DISCOVERY_DEPTH": "tests/test_target_loads.py::test_discovery_depth_too_shallow_rejects_hf_layout_with_reason",
    "MX_ROBUST_PROBE_TIMEOUT_S": "tests/test_sources.py::test_unreachable_endpoint_fails_cleanly_and_quickly",
    "MX_ROBUST_MAX_HEADER_BYTES": "tests/test_settings.py::test_a_header_over_max_header_bytes_is_a_named_problem",
    "MX_ROBUST_SKIP_EMPTY_SHARDS": "tests/test_planning.py::test_loaded_shards_leave_empty_ones_out_unless_told",
    "MX_ROBUST_COMPLETENESS": "tests/test_streaming.py::test_shortfall_under_warn_policy_loads_and_warns",
    "MX_ROBUST_MODEL_COMPLETENESS": "tests/test_whole_parameters.py::test_warn_accepts_a_partial_parameter_and_says_so",
    "MX_ROBUST_VERIFY_CONTENT": "tests/test_faults.py::test_flipped_data_bytes_are_caught_by_verify_all",
    "MX_ROBUST_READ_AHEAD_BYTES": "tests/test_read_ahead.py::test_no_read_ahead_when_it_is_switched_off",
    "MX_ROBUST_FILE_READER":
        "tests/test_file_reader.py::test_auto_reads_warm_files_from_the_page_cache_and_cold_ones_with_runai",
    "MX_ROBUST_PROGRESS_INTERVAL_S": "tests/test_progress.py::test_lines_on_rank_zero_only_and_an_interval_of_zero_turns_them_off",
    "MX_ROBUST_DRAFT_CONVENTIONS": "tests/test_draft.py::test_only_the_configured_conventions_are_tried",
    "MX_ROBUST_DRAFT_EXTRA_PREFIXES": "tests/test_mtp_drafts.py::test_mtp_layers_convention_and_extra_prefixes",
    "MX_ROBUST_DRAFT_SHARED_WEIGHTS": "tests/test_mtp_drafts.py::test_shared_weights_policy",
    "MX_ROBUST_TARGET_SELECTION": "tests/test_mtp_architectures.py::test_target_selection_all_streams_the_whole_checkpoint",
    "MX_ROBUST_DRY_RUN_TIMEOUT_S": "tests/test_settings.py::test_a_dry_run_over_its_time_bound_leaves_the_module_unanswered",
    "MX_ROBUST_READS_CACHE_DIR": "tests/test_module_reads.py::test_the_answer_is_kept_and_a_restart_asks_nothing",
    "MX_ROBUST_STREAMER_CONCURRENCY": "tests/test_streaming.py::test_streamer_settings_apply_during_the_load_only",
    "MX_ROBUST_STREAMER_MEMORY_LIMIT": "tests/test_streaming.py::test_streamer_settings_apply_during_the_load_only",
    "MX_ROBUST_STREAMER_CHUNK_BYTESIZE": "tests/test_streaming.py::test_streamer_settings_apply_during_the_load_only",
    "MX_ROBUST_STREAMER_S3_MAX_RETRIES": "tests/test_faults.py::test_retry_setting_changes_between_loads_in_one_process",
    "MX_ROBUST_STREAMER_S3_RETRY_TIMEOUT_S":
        "tests/test_faults.py::test_retry_timeout_setting_lets_runai_outlast_a_longer_burst",
}  # fmt: skip


def test_every_setting_has_a_test_that_shows_what_it_changes():
    assert set(SHOWN_BY) == ALL_ENVS, "a setting was added or retired: update SHOWN_BY"
    for env, node in SHOWN_BY.items():
        path, _, function = node.partition("::")
        tree = ast.parse((REPO / path).read_text(encoding="utf-8"))
        defined = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        assert function in defined, f"{env}: {node} names no test"
        assert env in (REPO / path).read_text(encoding="utf-8") or path.endswith("test_settings.py") or \
            _field_of(env) in (REPO / path).read_text(encoding="utf-8"), f"{env}: {path} never sets it"  # fmt: skip


def test_every_setting_says_who_would_set_it():
    properties = RobustSettings.model_json_schema()["properties"]
    assert {env for env, prop in properties.items() if prop.get("who")} == ALL_ENVS


def test_a_header_over_max_header_bytes_is_a_named_problem(monkeypatch, tmp_path):
    from mx_strategies.inspect.sources import Candidate, probe

    folder = tmp_path / "ckpt"
    folder.mkdir()
    write_shard(str(folder / "model.safetensors"), {f"layer.{i}.weight": torch.ones(2) for i in range(8)})
    assert probe(Candidate("explicit", str(folder)), load_settings()).problems == []
    monkeypatch.setenv("MX_ROBUST_MAX_HEADER_BYTES", "64")
    (problem,) = probe(Candidate("explicit", str(folder)), load_settings()).problems
    assert problem.kind == "corrupt_header" and "over MX_ROBUST_MAX_HEADER_BYTES=64" in problem.message


def test_a_dry_run_over_its_time_bound_leaves_the_module_unanswered(monkeypatch, tmp_path):
    from mx_strategies.inspect.sources import Candidate, probe
    from mx_strategies.select import module_reads

    class Slow(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = torch.nn.Parameter(torch.zeros(2))

        def load_weights(self, weights):
            for name, tensor in weights:
                time.sleep(0.05)
                self.norm.data.copy_(tensor)
            return {"norm"}

    folder = tmp_path / "ckpt"
    folder.mkdir()
    write_shard(str(folder / "model.safetensors"), {f"n{i}": torch.ones(2) for i in range(20)})
    checkpoint = probe(Candidate("explicit", str(folder)), load_settings())
    assert not isinstance(module_reads.ask(Slow(), checkpoint, load_settings()), module_reads.Unanswered)
    monkeypatch.setenv("MX_ROBUST_DRY_RUN_TIMEOUT_S", "0.2")
    started = time.perf_counter()
    answer = module_reads.ask(Slow(), checkpoint, load_settings())
    assert isinstance(answer, module_reads.Unanswered) and "took longer than its time bound" in answer.reason
    assert time.perf_counter() - started < 5

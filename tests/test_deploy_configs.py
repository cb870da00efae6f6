"""The deployment examples set only variables something reads, and switch our strategy on.

configs/vllm-mtp-s3.env (docker --env-file) and configs/k8s/vllm-mtp-s3.yaml
(Kubernetes) run vLLM + ModelExpress with an MTP draft from S3. A variable
nobody reads is a silent misconfiguration (ModelExpress's own examples set
VLLM_RPC_TIMEOUT, which vLLM 0.32 no longer reads), so every variable they
set must be one of:

* ours: RobustSettings' variables, MX_STRATEGY, MX_STRATEGIES_CONFIG;
* ModelExpress's: the keys of ``modelexpress.envs.environment_variables``;
* vLLM's: the keys of ``vllm.envs.environment_variables`` (the installed
  vLLM's source, parsed without importing vLLM), else VLLM_FALLBACK;
* runai-model-streamer's (RUNAI_STREAMER_*) and the AWS SDK's (AWS_*).

The mx_strategies settings they set are validated by ``load_settings``
itself, and the vLLM arguments must load the model through ModelExpress with
an MTP draft.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import logging
import os
import re
import subprocess
import sys
from importlib.metadata import entry_points

import pytest
import torch
import yaml

from mx_strategies.activation import STRATEGY_ENV
from mx_strategies.releases import chain_takes_plugins
from mx_strategies import settings as settings_module
from mx_strategies.settings import CONFIG_FILE_ENV, RobustSettings, load_settings

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ENV_FILE = os.path.join(REPO, "configs", "vllm-mtp-s3.env")
MANIFEST = os.path.join(REPO, "configs", "k8s", "vllm-mtp-s3.yaml")
MANIFEST_08 = os.path.join(REPO, "configs", "k8s", "vllm-mtp-s3-modelexpress-08.yaml")
FOREIGN_PREFIXES = ("RUNAI_STREAMER_", "AWS_")
# vLLM variables the examples may use, for environments without vLLM (checked against vLLM 0.32's envs.py).
VLLM_FALLBACK = {"VLLM_PLUGINS", "VLLM_ENGINE_READY_TIMEOUT_S", "VLLM_ASSETS_CACHE", "VLLM_CACHE_ROOT", "VLLM_LOGGING_LEVEL"}
ASSIGNMENT = re.compile(r"^(?P<commented>#\s*)?(?P<name>[A-Z][A-Z0-9_]*)=(?P<value>.*)$")


def dict_keys_in_source(package: str, module_file: str, variable: str) -> set[str]:
    """String keys of the dict literal assigned to ``variable`` in ``package/module_file``, read with ast."""
    spec = importlib.util.find_spec(package)  # a top-level package: nothing is imported
    if spec is None or not spec.submodule_search_locations:
        return set()
    path = os.path.join(list(spec.submodule_search_locations)[0], module_file)
    with open(path) as handle:
        tree = ast.parse(handle.read())
    for node in ast.walk(tree):
        target = getattr(node, "target", None) or (getattr(node, "targets", None) or [None])[0]
        if isinstance(target, ast.Name) and target.id == variable and isinstance(getattr(node, "value", None), ast.Dict):
            return {k.value for k in node.value.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)}
    return set()


def ours() -> set[str]:
    return {str(field.validation_alias) for field in RobustSettings.model_fields.values()} | {
        STRATEGY_ENV,
        CONFIG_FILE_ENV,
    }


def modelexpress_variables() -> set[str]:
    return dict_keys_in_source("modelexpress", "envs.py", "environment_variables")


def vllm_variables() -> set[str]:
    return dict_keys_in_source("vllm", "envs.py", "environment_variables") or VLLM_FALLBACK


def known(name: str) -> bool:
    return name in ours() or name in modelexpress_variables() or name in vllm_variables() or name.startswith(
        FOREIGN_PREFIXES
    )


def env_file_assignments(text: str, *, commented: bool) -> dict[str, str]:
    """``KEY=VALUE`` lines (and, with ``commented``, ``# KEY=VALUE`` ones too)."""
    found = {}
    for line in text.splitlines():
        match = ASSIGNMENT.match(line.strip())
        if match and (commented or not match["commented"]):
            found[match["name"]] = match["value"]
    return found


def manifest_documents(path: str = MANIFEST) -> list[dict]:
    with open(path) as handle:
        return [doc for doc in yaml.safe_load_all(handle) if doc]


def pod_spec(path: str = MANIFEST) -> dict:
    (deployment,) = [d for d in manifest_documents(path) if d["kind"] == "Deployment"]
    return deployment["spec"]["template"]["spec"]


def vllm_container(path: str = MANIFEST) -> dict:
    (container,) = [c for c in pod_spec(path)["containers"] if c["name"] == "vllm"]
    return container


def settings_file_from_configmap() -> str:
    (configmap,) = [d for d in manifest_documents() if d["kind"] == "ConfigMap"]
    (text,) = configmap["data"].values()
    return text


# -- the allow-list itself ---------------------------------------------------


def test_allow_list_is_read_from_the_installed_packages():
    renamed = "MX_MODEL_NAME_OVERRIDE" if chain_takes_plugins() else "MODEL_NAME"  # 0.8 renamed MODEL_NAME
    assert {"MX_MODEL_URI", "MX_SERVER_ADDRESS", renamed, "MX_MS_DISTRIBUTED"} <= modelexpress_variables()
    assert len(modelexpress_variables()) > 50
    if importlib.util.find_spec("vllm") is not None:
        assert {"VLLM_PLUGINS", "VLLM_ASSETS_CACHE"} <= vllm_variables()
        assert len(vllm_variables()) > 200
        assert VLLM_FALLBACK <= vllm_variables()  # the fallback is still true of the installed vLLM
    assert not known("VLLM_RPC_TIMEOUT") or "VLLM_RPC_TIMEOUT" in vllm_variables()
    assert not known("MX_ROBUST_COMPLETNESS")  # a typo is caught


# -- configs/vllm-mtp-s3.env -------------------------------------------------


# The ModelExpress 0.7 examples set MODEL_NAME, which 0.8 renamed MX_MODEL_NAME_OVERRIDE: checked against 0.7's
# variables (the main venv); the 0.8 example has tests of its own below.
for_07 = pytest.mark.skipif(chain_takes_plugins(), reason="a ModelExpress 0.7 example; the main venv (0.7.0) runs this")


@for_07
def test_env_file_sets_only_variables_something_reads():
    with open(ENV_FILE) as handle:
        assignments = env_file_assignments(handle.read(), commented=True)

    unknown = sorted(name for name in assignments if not known(name))
    assert assignments and not unknown, f"variables nobody reads: {unknown}"


def test_env_file_switches_the_strategy_on_with_valid_settings(monkeypatch):
    with open(ENV_FILE) as handle:
        active = env_file_assignments(handle.read(), commented=False)

    assert active[STRATEGY_ENV] == "mx_strategies.robust"
    assert active["MX_MODEL_URI"].startswith("s3://")
    assert "mx_strategies" in active["VLLM_PLUGINS"].split(",")
    for name, value in active.items():
        if name in ours():
            monkeypatch.setenv(name, value)
    settings = load_settings()
    assert settings.model_uri == active["MX_MODEL_URI"]
    assert settings.completeness == active["MX_ROBUST_COMPLETENESS"]


def test_env_file_values_need_no_shell_quoting():
    # docker --env-file keeps quotes and does no expansion; a value that needs either would break there.
    with open(ENV_FILE) as handle:
        active = env_file_assignments(handle.read(), commented=False)

    assert not [n for n, v in active.items() if re.search(r"[\"'$\s`]", v)]


# -- configs/k8s/vllm-mtp-s3.yaml --------------------------------------------


@for_07
def test_manifest_sets_only_variables_something_reads():
    container = vllm_container()
    names = [entry["name"] for entry in container["env"]]
    names += list(env_file_assignments(settings_file_from_configmap(), commented=True))

    unknown = sorted(name for name in names if not known(name))
    assert names and not unknown, f"variables nobody reads: {unknown}"


def test_manifest_switches_the_strategy_on_and_lists_it_as_a_plugin():
    env = {entry["name"]: entry.get("value") for entry in vllm_container()["env"]}

    assert env[STRATEGY_ENV] == "mx_strategies.robust"
    assert env["MX_MODEL_URI"].startswith("s3://")
    plugins = env["VLLM_PLUGINS"].split(",")
    assert "mx_strategies" in plugins
    # Every listed name is a vLLM plugin installed here (ours from pyproject, ModelExpress's from its package).
    installed = {ep.name for ep in entry_points(group="vllm.general_plugins")}
    assert set(plugins) <= installed


def test_manifest_settings_file_is_valid(tmp_path, monkeypatch, caplog):
    env = {entry["name"]: entry.get("value") for entry in vllm_container()["env"]}
    mounts = {m["name"]: m["mountPath"] for m in vllm_container()["volumeMounts"]}
    (configmap,) = [d for d in manifest_documents() if d["kind"] == "ConfigMap"]
    (file_name,) = configmap["data"]
    assert env[CONFIG_FILE_ENV] == f"{mounts['mx-strategies-settings']}/{file_name}"
    settings_file = tmp_path / file_name
    settings_file.write_text(settings_file_from_configmap())
    monkeypatch.setenv(CONFIG_FILE_ENV, str(settings_file))
    monkeypatch.setenv("MX_MODEL_URI", env["MX_MODEL_URI"])

    monkeypatch.setattr(settings_module, "_warned", set())  # the retired-variable warnings this process gave
    with caplog.at_level(logging.WARNING):
        settings = load_settings()

    assert settings.verify_content == "sample"
    assert not [r.getMessage() for r in caplog.records if "is retired" in r.getMessage()]  # no retired variable set


def test_manifest_vllm_args_load_through_modelexpress_with_an_mtp_draft():
    container = vllm_container()
    args = [str(a) for a in container["args"]]
    env = {entry["name"] for entry in container["env"]}

    def value_of(flag):
        assert flag in args, f"{flag} missing from {args}"
        return args[args.index(flag) + 1]

    assert value_of("--load-format") == "modelexpress"
    speculative = json.loads(value_of("--speculative-config"))
    assert speculative["method"] == "mtp" and speculative["num_speculative_tokens"] >= 1
    assert value_of("--model") == "$(MX_MODEL_URI)"  # the same URI ModelExpress streams from
    referenced = {m for a in args for m in re.findall(r"\$\(([A-Z0-9_]+)\)", a)}
    assert referenced <= env  # Kubernetes expands only variables the container defines
    limits = container["resources"]["limits"]
    assert int(limits["nvidia.com/gpu"]) == int(value_of("--tensor-parallel-size"))


# -- configs/k8s/vllm-mtp-s3-modelexpress-08.yaml: robust through ModelExpress 0.8's plugin folder --------

needs_08_plugins = pytest.mark.skipif(
    not chain_takes_plugins(), reason="ModelExpress 0.7 has no plugin folder; the 0.8 venv (scripts/test.sh) runs this"
)


@needs_08_plugins
def test_08_manifest_sets_only_variables_something_reads():
    names = [entry["name"] for entry in vllm_container(MANIFEST_08)["env"]]
    unknown = sorted(name for name in names if not known(name))
    assert names and not unknown, f"variables nobody reads: {unknown}"


@needs_08_plugins
def test_08_manifest_puts_robust_where_model_streamer_stood(tmp_path, monkeypatch, caplog):
    """The init container's command, run for real, and ModelExpress 0.8's chain run with the pod's variables."""
    import modelexpress.plugins as plugins
    from helpers.checkpoints import reference_tensors
    from helpers.engine import CHAIN_LOGGER, assert_got, messages, model_config, run_chain

    from mx_strategies.testing import synthetic

    spec = pod_spec(MANIFEST_08)
    (init,) = spec["initContainers"]
    (mount,) = init["volumeMounts"]
    folder = tmp_path / "plugins"
    command = [str(part).replace(mount["mountPath"], str(folder)) for part in init["command"]]
    assert command[0] == "mx-strategies"
    done = subprocess.run([sys.executable, "-m", "mx_strategies.cli", *command[1:]], capture_output=True, text=True,
                          timeout=60)  # fmt: skip
    assert done.returncode == 0, done.stderr
    env = {entry["name"]: entry.get("value") for entry in vllm_container(MANIFEST_08)["env"]}
    assert env["MX_PLUGIN_DIR"] == mount["mountPath"]
    ckpt = synthetic.mtp_checkpoint(str(tmp_path / "ckpt"), style="deepseek", hidden=16, vocab=32, dtype=torch.float32)
    for name in ("MX_LOAD_PLUGIN", "MX_LOAD_PLUGIN_BEFORE", "MX_ROBUST_VERIFY_CONTENT"):
        monkeypatch.setenv(name, env[name])
    monkeypatch.setenv("MX_PLUGIN_DIR", str(folder))
    monkeypatch.setenv("MX_MODEL_URI", ckpt.path)  # the pod's s3:// address, here a local copy
    monkeypatch.setenv("MX_ROBUST_TARGET_SELECTION", "all")
    monkeypatch.setattr(plugins, "plugins", {})
    monkeypatch.setattr(plugins, "_loaded_directories", {})
    caplog.set_level("INFO")

    model, adapter = run_chain(model_config(model=ckpt.path), ckpt.tensors)

    (eligible,) = [m for m in messages(caplog, CHAIN_LOGGER) if m.startswith("Eligible loaders: ")]
    assert eligible == "Eligible loaders: ['robust_model_streamer']"  # model_streamer left the chain
    assert adapter.after_load_calls == 1
    assert_got(model, ckpt.tensors, reference_tensors(ckpt.path))


@pytest.mark.parametrize("path", [ENV_FILE, MANIFEST, MANIFEST_08])
def test_examples_hold_no_credentials(path):
    with open(path) as handle:
        text = handle.read()
    assert not re.search(r"AKIA[0-9A-Z]{16}", text)
    assert not re.search(r"^\s*AWS_SECRET_ACCESS_KEY=\S", text, re.M)

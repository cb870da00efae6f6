"""Activation through ModelExpress 0.7.0's real ``LoadStrategyChain.run``.

The chain, runai-model-streamer and the safetensors checkpoint are real; the
engine side is ``helpers.engine``'s ``RecordingModel`` and an
``EngineAdapter`` subclass (vLLM needs a GPU). ``NativeAdapter`` adds the
engine's native loader so ``default`` is eligible too, which gives the
"Eligible loaders" line an order to check.
"""

from __future__ import annotations

import ast
import logging
import os
import sys
import types

import modelexpress.load_strategy as chain_module
import pytest
import torch
from helpers.engine import CHAIN_LOGGER, STRATEGY_LOGGER, CountingAdapter, RecordingModel, make_context, messages
from helpers.engine import InstantTensorAdapter, model_config
from modelexpress.load_strategy import LoadResult, LoadStrategyChain
from safetensors.torch import load_file

import mx_strategies
from mx_strategies import activation
from mx_strategies.errors import ActivationError, ConfigurationError
from mx_strategies.robust import RobustModelStreamerStrategy
from mx_strategies.testing import synthetic
from mx_strategies.verify.tensor_bytes import same_bytes

INSTALLED = "mx-strategies: MX_STRATEGY="


class NativeAdapter(CountingAdapter):
    """Also loads like the engine's own disk loader (makes ``default`` eligible)."""

    def __init__(self, make_model, checkpoint: synthetic.SyntheticCheckpoint) -> None:
        super().__init__(make_model)
        self.checkpoint = checkpoint
        self.native_calls = 0

    def load_via_native(self, result: LoadResult) -> LoadResult:
        self.native_calls += 1
        for shard in self.checkpoint.shard_names:
            result.model.load_weights(iter(load_file(os.path.join(self.checkpoint.path, shard)).items()))
        return result


@pytest.fixture
def checkpoint(tmp_path, monkeypatch):
    """A small real safetensors checkpoint that MX_MODEL_URI points at."""
    ckpt = synthetic.mtp_checkpoint(str(tmp_path / "ckpt"), hidden=16, vocab=32, dtype=torch.float32)
    monkeypatch.setenv("MX_MODEL_URI", ckpt.path)
    return ckpt


def _load(ckpt: synthetic.SyntheticCheckpoint, run=LoadStrategyChain.run) -> tuple[RecordingModel, NativeAdapter]:
    make = lambda: RecordingModel(ckpt.tensors)  # noqa: E731
    adapter = NativeAdapter(make, ckpt)
    model = run(make(), make_context(model_config(model=ckpt.path), adapter))
    return model, adapter


def _messages(caplog, logger: str) -> list[str]:
    return messages(caplog, logger, level=logging.NOTSET)


def _eligible(caplog) -> list[str]:
    (line,) = [m for m in _messages(caplog, CHAIN_LOGGER) if m.startswith("Eligible loaders: ")]
    return ast.literal_eval(line[len("Eligible loaders: ") :])


def _tried(caplog) -> list[str]:
    marker = "Trying strategy: "
    return [m.split(marker, 1)[1] for m in _messages(caplog, CHAIN_LOGGER) if marker in m]


def _assert_weights_from_checkpoint(
    model: RecordingModel, ckpt: synthetic.SyntheticCheckpoint, *, upstream: bool = False
) -> None:
    """Every tensor, each once; robust leaves the MTP draft's own (Qwen3-Next's mtp.*) to the draft."""
    expected: dict[str, torch.Tensor] = {}
    for shard in ckpt.shard_names:
        expected.update(load_file(os.path.join(ckpt.path, shard)))
    if not upstream:
        assert ckpt.draft_names and ckpt.draft_names <= set(expected)
        expected = {n: t for n, t in expected.items() if n not in ckpt.draft_names}
    assert sorted(model.order) == sorted(expected)
    for name, tensor in expected.items():
        assert same_bytes(model.weights[name], tensor), name


# -- MX_STRATEGY set -------------------------------------------------------------


def test_robust_takes_model_streamers_place_in_the_real_chain(checkpoint, monkeypatch, caplog):
    caplog.set_level(logging.INFO)
    _load(checkpoint)
    upstream = _eligible(caplog)
    assert upstream == ["model_streamer", "default"]

    caplog.clear()
    monkeypatch.setenv("MX_STRATEGY", "mx_strategies.robust")
    activation.register()
    model, adapter = _load(checkpoint)

    assert _eligible(caplog) == ["robust_model_streamer" if n == "model_streamer" else n for n in upstream]
    assert _tried(caplog) == ["robust_model_streamer"]
    assert adapter.native_calls == 0 and adapter.reinit_calls == 0
    _assert_weights_from_checkpoint(model, checkpoint)


def test_mx_strategy_alone_switches_robust_on(checkpoint, monkeypatch, caplog):
    """The README's one variable: no MX_MODEL_URI, the engine's own model folder; robust loads it, the engine's
    native loader is not called, and every tensor equals safetensors' own load."""
    caplog.set_level(logging.INFO)
    monkeypatch.delenv("MX_MODEL_URI")
    monkeypatch.setenv("MX_STRATEGY", "mx_strategies.robust")
    activation.register()
    model, adapter = _load(checkpoint)

    assert _eligible(caplog) == ["robust_model_streamer", "default"]
    assert _tried(caplog) == ["robust_model_streamer"]
    assert adapter.native_calls == 0
    _assert_weights_from_checkpoint(model, checkpoint)


def test_the_gate_kept_by_setting_is_said_at_load(checkpoint, monkeypatch, caplog):
    """MX_ROBUST_REQUIRE_MODEL_URI=true (upstream's gate) without MX_MODEL_URI: robust is not offered, one warning
    line says why and what to set, and the engine's own loader loads as before."""
    caplog.set_level(logging.INFO)
    monkeypatch.delenv("MX_MODEL_URI")
    monkeypatch.setenv("MX_ROBUST_REQUIRE_MODEL_URI", "true")
    monkeypatch.setenv("MX_STRATEGY", "mx_strategies.robust")
    activation.register()
    model, adapter = _load(checkpoint)

    assert _tried(caplog) == ["default"] and adapter.native_calls == 1
    assert messages(caplog, STRATEGY_LOGGER, logging.WARNING) == [
        "[Worker 0] robust_model_streamer is switched on but not offered: MX_ROBUST_REQUIRE_MODEL_URI=true and "
        "MX_MODEL_URI is unset: set MX_MODEL_URI to the checkpoint, or unset MX_ROBUST_REQUIRE_MODEL_URI; "
        "ModelExpress's next strategy loads without robust's checks"
    ]
    _assert_weights_from_checkpoint(model, checkpoint, upstream=True)


def test_a_refusal_at_load_says_what_to_do(checkpoint, tmp_path, monkeypatch, caplog):
    """A copy missing a shard its index names: robust refuses it before the model is touched, and its hint line
    is the remedy doctor prints for that problem kind (mx_strategies.inspect.remedies)."""
    import shutil

    from mx_strategies.inspect.remedies import _REMEDIES

    broken = str(tmp_path / "broken")
    shutil.copytree(checkpoint.path, broken)
    os.remove(os.path.join(broken, checkpoint.shard_names[0]))
    monkeypatch.setenv("MX_MODEL_URI", broken)
    monkeypatch.setenv("MX_STRATEGY", "mx_strategies.robust")
    activation.register()
    make = lambda: RecordingModel(checkpoint.tensors)  # noqa: E731
    adapter = NativeAdapter(make, checkpoint)  # the engine's own loader reads the whole copy
    with caplog.at_level(logging.INFO):
        model = LoadStrategyChain.run(make(), make_context(model_config(model=broken), adapter))

    warnings = messages(caplog, STRATEGY_LOGGER, logging.WARNING)
    assert any(f"is inconsistent, not loading it: {broken}/{checkpoint.shard_names[0]}: named by " in w for w in warnings)
    assert warnings[-1] == f"[Worker 0] robust_model_streamer: what to do: {_REMEDIES['missing_shard']}"
    assert _tried(caplog) == ["robust_model_streamer", "default"] and adapter.reinit_calls == 0
    _assert_weights_from_checkpoint(model, checkpoint, upstream=True)


def test_module_colon_class_names_the_strategy(checkpoint, monkeypatch, caplog):
    caplog.set_level(logging.INFO)
    monkeypatch.setenv("MX_STRATEGY", "mx_strategies.robust:RobustModelStreamerStrategy")
    activation.register()
    assert activation.installed_strategy() is RobustModelStreamerStrategy
    model, _ = _load(checkpoint)
    assert _tried(caplog) == ["robust_model_streamer"]
    _assert_weights_from_checkpoint(model, checkpoint)


def test_activate_for_hosts_without_vllm_plugins(checkpoint, caplog):
    caplog.set_level(logging.INFO)
    assert "MX_STRATEGY" not in os.environ
    assert mx_strategies.activate("mx_strategies.robust") is RobustModelStreamerStrategy
    model, _ = _load(checkpoint)
    assert _tried(caplog) == ["robust_model_streamer"]
    _assert_weights_from_checkpoint(model, checkpoint)


def test_entry_point_twice_changes_nothing_more(checkpoint, monkeypatch, caplog):
    caplog.set_level(logging.INFO)
    monkeypatch.setenv("MX_STRATEGY", "mx_strategies.robust")
    activation.register()
    wrapped = chain_module.execute_load_strategies
    activation.register()
    activation.register()
    assert chain_module.execute_load_strategies is wrapped
    installs = [m for m in _messages(caplog, activation._logger.name) if m.startswith(INSTALLED)]
    assert installs == [
        "mx-strategies: MX_STRATEGY=mx_strategies.robust installed 'robust_model_streamer' "
        "in place of 'model_streamer' in the ModelExpress chain"
    ]
    # Still substituted once, not nested: one robust entry, tried once.
    model, _ = _load(checkpoint)
    assert _eligible(caplog) == ["robust_model_streamer", "default"]
    assert _tried(caplog) == ["robust_model_streamer"]
    _assert_weights_from_checkpoint(model, checkpoint)


# -- MX_STRATEGY unset or empty: ModelExpress exactly as it is --------------------


@pytest.mark.parametrize("value", [None, "", "   "])
def test_unset_leaves_modelexpress_untouched(checkpoint, monkeypatch, caplog, value):
    caplog.set_level(logging.INFO)
    original = chain_module.execute_load_strategies
    assert not hasattr(original, "__wrapped__")  # upstream's own function
    if value is not None:
        monkeypatch.setenv("MX_STRATEGY", value)

    activation.register()

    assert chain_module.execute_load_strategies is original
    assert activation.installed_strategy() is None
    model, adapter = _load(checkpoint)
    assert _eligible(caplog) == ["model_streamer", "default"]
    assert _tried(caplog) == ["model_streamer"]
    assert _messages(caplog, activation._logger.name) == []
    assert _messages(caplog, STRATEGY_LOGGER) == []
    _assert_weights_from_checkpoint(model, checkpoint, upstream=True)


def test_uninstall_gives_the_chain_back(monkeypatch):
    original = chain_module.execute_load_strategies
    monkeypatch.setenv("MX_STRATEGY", "mx_strategies.robust")
    activation.register()
    assert chain_module.execute_load_strategies is not original
    activation.uninstall()
    assert chain_module.execute_load_strategies is original


# -- bad values: an error naming MX_STRATEGY and the value -----------------------


@pytest.mark.parametrize(
    "spec, message",
    [
        (
            "mx_strategies.no_such_module",
            "MX_STRATEGY='mx_strategies.no_such_module': cannot import 'mx_strategies.no_such_module': "
            "No module named 'mx_strategies.no_such_module'",
        ),
        (
            "json",
            "MX_STRATEGY='json': expected the module to define exactly one LoadStrategy subclass, "
            "found none; name one as module:Class",
        ),
        (
            "mx_strategies.errors:StoreError",
            "MX_STRATEGY='mx_strategies.errors:StoreError': mx_strategies.errors.StoreError "
            "is not a LoadStrategy subclass (it is a class); it defines no LoadStrategy subclass",
        ),
        (
            "mx_strategies.robust:_logger",
            "MX_STRATEGY='mx_strategies.robust:_logger': mx_strategies.robust._logger "
            "is not a LoadStrategy subclass (it is a Logger); its LoadStrategy subclasses: RobustModelStreamerStrategy",
        ),
        (  # issue 46: a missing attribute is named as missing, with what the module offers
            "mx_strategies.robust:Nope",
            "MX_STRATEGY='mx_strategies.robust:Nope': module 'mx_strategies.robust' has no attribute 'Nope'; "
            "its LoadStrategy subclasses: RobustModelStreamerStrategy",
        ),
        (
            "json:Nope",
            "MX_STRATEGY='json:Nope': module 'json' has no attribute 'Nope'; it defines no LoadStrategy subclass",
        ),
    ],
)
def test_unusable_strategy_is_an_error_naming_the_value(monkeypatch, spec, message):
    original = chain_module.execute_load_strategies
    monkeypatch.setenv("MX_STRATEGY", spec)
    with pytest.raises(ActivationError) as caught:
        activation.register()
    assert str(caught.value) == message
    assert chain_module.execute_load_strategies is original


def test_module_with_two_strategies_must_name_one(monkeypatch, tmp_path):
    (tmp_path / "two_strategies.py").write_text(
        "from modelexpress.load_strategy.model_streamer_strategy import ModelStreamerStrategy\n"
        "class First(ModelStreamerStrategy):\n    name = 'first'\n"
        "class Second(ModelStreamerStrategy):\n    name = 'second'\n",
        encoding="utf-8",
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("MX_STRATEGY", "two_strategies")
    with pytest.raises(ActivationError) as caught:
        activation.register()
    assert str(caught.value) == (
        "MX_STRATEGY='two_strategies': expected the module to define exactly one LoadStrategy subclass, "
        "found First, Second; name one as module:Class"
    )
    monkeypatch.setenv("MX_STRATEGY", "two_strategies:Second")
    try:
        activation.register()
        assert activation.installed_strategy().name == "second"
    finally:
        sys.modules.pop("two_strategies", None)


def test_invalid_setting_fails_at_activation(monkeypatch):
    original = chain_module.execute_load_strategies
    monkeypatch.setenv("MX_STRATEGY", "mx_strategies.robust")
    monkeypatch.setenv("MX_ROBUST_COMPLETENESS", "maybe")
    with pytest.raises(ConfigurationError) as caught:
        activation.register()
    assert str(caught.value) == "MX_ROBUST_COMPLETENESS='maybe' is invalid: Input should be 'fail' or 'warn'"
    assert chain_module.execute_load_strategies is original


def test_missing_config_file_fails_at_activation(monkeypatch, tmp_path):
    monkeypatch.setenv("MX_STRATEGY", "mx_strategies.robust")
    monkeypatch.setenv("MX_STRATEGIES_CONFIG", str(tmp_path / "robust.toml"))
    with pytest.raises(ConfigurationError, match=r"^MX_STRATEGIES_CONFIG='.*robust\.toml' is invalid: no such file"):
        activation.register()


# -- substitution independent of import order ------------------------------------------

# A chain that imported the executor by name before activation, as ModelExpress's RL
# chain (modelexpress_rl.inference.load_strategy) does: ``from modelexpress.load_strategy
# import execute_load_strategies`` binds the function object of that moment.
EARLY_CHAIN = """
from modelexpress.load_strategy import execute_load_strategies
from modelexpress.load_strategy.default_strategy import DefaultStrategy
from modelexpress.load_strategy.model_streamer_strategy import ModelStreamerStrategy


def run(model, ctx):
    return execute_load_strategies(model, ctx, [ModelStreamerStrategy(), DefaultStrategy()])
"""


def _chain_module(monkeypatch, name: str) -> types.ModuleType:
    module = types.ModuleType(name)
    monkeypatch.setitem(sys.modules, name, module)
    exec(EARLY_CHAIN, module.__dict__)
    return module


def test_a_chain_that_imported_the_executor_before_activation_gets_the_substitution(checkpoint, monkeypatch, caplog):
    """A stand-in for the RL chain's import (the next test runs the real one where it is installed)."""
    caplog.set_level(logging.INFO)
    early = _chain_module(monkeypatch, "early_chain")
    original = early.execute_load_strategies
    assert original is chain_module.execute_load_strategies

    assert activation.activate("mx_strategies.robust") is RobustModelStreamerStrategy

    assert early.execute_load_strategies is chain_module.execute_load_strategies is not original
    model, adapter = _load(checkpoint, run=early.run)
    assert _eligible(caplog) == ["robust_model_streamer", "default"]
    assert _tried(caplog) == ["robust_model_streamer"]
    assert adapter.native_calls == 0
    _assert_weights_from_checkpoint(model, checkpoint)

    late = _chain_module(monkeypatch, "late_chain")  # imported after activation: the package's wrapper
    assert late.execute_load_strategies is chain_module.execute_load_strategies

    activation.uninstall()
    assert early.execute_load_strategies is original and late.execute_load_strategies is original


def test_modelexpress_rl_chain_gets_the_substitution(checkpoint, monkeypatch, caplog):
    """ModelExpress's own RL chain (MX_LOAD_STRATEGY_CHAIN=RL), imported before activation.

    modelexpress_rl ships in the modelexpress wheel here; where it is not
    installed the stand-in test above covers the import-order case. 0.7's
    base loader runs it for MX_LOAD_STRATEGY_CHAIN=RL; 0.8's refuses RL there
    (``validate_load_strategy_chain``) and leaves it to the RL integration,
    which runs ``RLLoadStrategyChain.run``: the test enters where each does.
    """
    rl = pytest.importorskip("modelexpress_rl.inference.load_strategy")
    from modelexpress.load_strategy import run_load_strategy_chain

    if hasattr(chain_module, "validate_load_strategy_chain"):  # 0.8
        with pytest.raises(ValueError, match="requires its engine integration plugin"):
            monkeypatch.setenv("MX_LOAD_STRATEGY_CHAIN", "RL")
            chain_module.validate_load_strategy_chain()
        run_load_strategy_chain = rl.RLLoadStrategyChain.run

    caplog.set_level(logging.INFO)
    monkeypatch.setenv("MX_LOAD_STRATEGY_CHAIN", "RL")
    monkeypatch.delenv("MX_REFIT_DESIRED_VERSION_UID", raising=False)  # no desired version: ModelStreamer, default

    activation.activate("mx_strategies.robust")

    assert rl.execute_load_strategies is chain_module.execute_load_strategies
    model, adapter = _load(checkpoint, run=run_load_strategy_chain)
    assert _eligible(caplog) == ["robust_model_streamer", "default"]
    assert _tried(caplog) == ["robust_model_streamer"]
    _assert_weights_from_checkpoint(model, checkpoint)


# -- robust's say over the chain's local-folder readers (mx_strategies.chain_guard) ----------------------------


def test_an_object_store_model_is_kept_from_instant_tensor(monkeypatch, caplog):
    """robust told to stream an ``s3://`` model without MX_MODEL_URI (MX_ROBUST_REQUIRE_MODEL_URI=false): ModelExpress
    0.8 skips InstantTensor only for an object-store MX_MODEL_URI, 0.7 never; robust keeps it off either way."""
    from mx_strategies.testing.loopback import S3_ENV, free_port

    for key, value in S3_ENV.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")  # nothing listens: robust fails to list
    monkeypatch.setenv("MX_ROBUST_PROBE_TIMEOUT_S", "1")
    monkeypatch.setattr("mx_strategies.inspect.object_stores.PROBE_MAX_ATTEMPTS", 1)
    monkeypatch.delenv("MX_MODEL_URI", raising=False)
    monkeypatch.setenv("MX_ROBUST_REQUIRE_MODEL_URI", "false")
    activation.install(RobustModelStreamerStrategy)
    make = lambda: RecordingModel({"w": torch.ones(2)})  # noqa: E731
    adapter = InstantTensorAdapter(make)
    with caplog.at_level(logging.INFO):
        with pytest.raises(RuntimeError, match="No loading strategy succeeded"):
            LoadStrategyChain.run(make(), make_context(model_config(model="s3://bucket/ckpt/"), adapter))

    assert adapter.instanttensor_calls == 0 and adapter.reinit_calls == 0
    (line,) = messages(caplog, "modelexpress.mx_strategies.chain_guard", logging.WARNING)
    assert line == (
        "[Worker 0] instant_tensor kept off s3://bucket/ckpt/: robust would refuse it: the engine's model is the "
        "object-store URI s3://bucket/ckpt/, which the engine's own readers take for a hub id; robust streams it; "
        "robust_model_streamer decides this load (MX_ROBUST_GUARD_CHAIN=off lets instant_tensor read it)"
    )


def test_without_robust_the_chains_readers_are_not_wrapped(checkpoint):
    """Nothing of the guard where robust is not in the chain: ModelExpress's instances, untouched."""
    from modelexpress.load_strategy.default_strategy import DefaultStrategy
    from modelexpress.load_strategy.instant_tensor_strategy import InstantTensorStrategy
    from modelexpress.load_strategy.model_streamer_strategy import ModelStreamerStrategy

    from mx_strategies.chain_guard import guarded

    chain = [InstantTensorStrategy(), ModelStreamerStrategy(), DefaultStrategy()]
    assert guarded(chain, RobustModelStreamerStrategy.name) is chain
    assert all("load" not in vars(strategy) for strategy in chain)
    robust_chain = [InstantTensorStrategy(), RobustModelStreamerStrategy(), DefaultStrategy()]
    guarded(robust_chain, RobustModelStreamerStrategy.name)
    # The folder reader (judged before, checked after) and the default loader (checked after, for a quantized model).
    assert ["load" in vars(strategy) for strategy in robust_chain] == [True, False, True]


def test_which_links_robust_checks_after_they_load():
    """The folder readers always; the default loader only for a quantized model (vLLM checks the rest itself);
    none on a layerwise reload of a live model (ModelExpress 0.8's is_reload), which a cold load's check cannot judge."""
    from types import SimpleNamespace

    from mx_strategies.chain_guard import _checks_after

    plain, fp8 = SimpleNamespace(model_config=model_config()), SimpleNamespace(model_config=model_config())
    fp8.model_config.quantization = "fp8"
    assert [_checks_after(n, plain) for n in ("instant_tensor", "gds", "default", "rdma")] == [True, True, False, False]
    assert _checks_after("default", fp8) is True
    fp8.is_reload = True
    assert [_checks_after(n, fp8) for n in ("instant_tensor", "gds", "default")] == [False, False, False]


def test_one_ranks_broken_copy_keeps_every_ranks_folder_reader_off(tmp_path):
    """Two ranks (gloo, world 2), each with its own copy of the engine's folder: rank 1's lacks a shard the index
    names. Their readers load together (InstantTensor's iterator uses the ranks' group), so rank 0's whole copy is
    kept from it too, saying whose copy; neither rank's InstantTensor runs, and no rank hangs."""
    from helpers.checkpoints import delete_file, tiny_shards, write_checkpoint
    from helpers.ranks import run_ranks

    from mx_strategies.testing.loopback import free_port

    whole = write_checkpoint(str(tmp_path / "rank0"), tiny_shards(3))
    broken = write_checkpoint(str(tmp_path / "rank1"), tiny_shards(3))
    delete_file(broken.files[1])
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MX_")}
    env.update(MX_ROBUST_FILE_READER="runai", PYTHONPATH=os.pathsep.join(sys.path))
    envs = [dict(env, MX_MODEL_URI=whole.path), dict(env, MX_MODEL_URI=broken.path)]
    args = [dict(rank=0, port=port, folder=whole.path, whole=whole.path),
            dict(rank=1, port=port, folder=broken.path, whole=whole.path)]  # fmt: skip
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "chain_guard", "rank.py")

    rank0, rank1 = run_ranks(script, tmp_path, args, envs, timeout=120)

    assert rank0["instanttensor_calls"] == rank1["instanttensor_calls"] == 0
    missing = f"{broken.files[1]}: named by model.safetensors.index.json for 3 tensor(s) but not found"
    (line1,) = rank1["kept_off"]
    assert line1.startswith(f"[Worker 1] instant_tensor kept off {broken.path}: robust would refuse it: ") and missing in line1
    (line0,) = rank0["kept_off"]
    assert line0.startswith(f"[Worker 0] instant_tensor kept off {broken.path}: robust would refuse it: another rank's copy: ")
    assert rank0["outcome"] == "loaded"  # rank 0's robust loads its whole copy; rank 1's refuses its own
    assert "No loading strategy succeeded" in rank1["outcome"]


def test_a_guard_that_cannot_judge_leaves_the_reader_as_modelexpress_has_it(tmp_path, monkeypatch, caplog):
    """robust's own failure to judge (here an inspection that raises what no checkpoint raises) never stops a load
    ModelExpress would make: one line, and InstantTensor reads the folder."""
    from helpers.checkpoints import tiny_shards, write_checkpoint

    from mx_strategies import chain_guard

    def broken(*args, **kwargs):
        raise KeyError("inspection bug")

    monkeypatch.setattr(chain_guard, "folder_verdict", broken)
    ckpt = write_checkpoint(str(tmp_path / "ckpt"), tiny_shards(2))
    monkeypatch.setenv("MX_MODEL_URI", ckpt.path)
    activation.install(RobustModelStreamerStrategy)
    make = lambda: RecordingModel(ckpt.reference)  # noqa: E731
    adapter = InstantTensorAdapter(make)
    with caplog.at_level(logging.INFO):
        LoadStrategyChain.run(make(), make_context(model_config(model=ckpt.path), adapter))

    assert adapter.instanttensor_calls == 1
    (line,) = messages(caplog, "modelexpress.mx_strategies.chain_guard", logging.WARNING)
    assert line == ("[Worker 0] robust could not judge the engine's folder (KeyError: 'inspection bug'); "
                    "ModelExpress's readers read it unjudged")

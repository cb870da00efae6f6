"""One architecture of the target-load conformance sweep, in a process of its own.

``python tests/conformance/child.py ARCH WORKDIR RESULT.json``

1. transformers' own class for ARCH writes a tiny random checkpoint
   (``save_pretrained``, several shards and an index);
2. vLLM's own class for it (native, or vLLM's Transformers backend with
   ``model_impl="transformers"``) is built twice on the CPU;
3. vLLM's ``DefaultModelLoader`` loads the folder into the first: the reference
   (its own completeness check on: "Following weights were not initialized");
4. ModelExpress's real chain with ``MX_STRATEGY=mx_strategies.robust`` and
   ``MX_ROBUST_MODEL_COMPLETENESS=fail`` loads it into the second, through
   ModelExpress's real ``VllmAdapter`` (its post-load step left out: vLLM's
   ``process_weights_after_loading`` targets cuda:0 in ModelExpress);
5. every parameter and persistent buffer of the two is compared bit for bit.

RESULT (JSON): ``{"arch", "class", "reference": "loaded" | error, "robust":
"loaded" | error, "mutated", "compared", "differ": [...], "report": ...}``.
"""

from __future__ import annotations

import json
import os
import sys
import traceback

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")

def tiny_config(arch: str):
    import transformers

    from conformance.archs import ARCHS

    spec = ARCHS[arch]
    cls = getattr(transformers, spec["config"])
    config = cls(**spec["kwargs"])
    config.architectures = [spec["hf_class"]]
    config.torch_dtype = "bfloat16"
    return spec, config


def write_checkpoint(arch: str, folder: str) -> str:
    import torch
    import transformers

    spec, config = tiny_config(arch)
    torch.manual_seed(0)
    model = getattr(transformers, spec["hf_class"])(config).to(torch.bfloat16)
    with torch.no_grad():  # a persistent buffer or zero-init parameter gets values a wrong load would show
        for _, tensor in list(model.named_parameters()) + list(model.named_buffers()):
            if tensor.is_floating_point() and tensor.numel():
                tensor.copy_(torch.randn_like(tensor, dtype=torch.float32).to(tensor.dtype))
    model.save_pretrained(folder, max_shard_size=spec.get("shard_size", "100KB"), safe_serialization=True)
    if spec.get("drop"):
        _drop(folder, spec["drop"])
    return folder


def _drop(folder: str, name: str) -> None:
    """Remove tensor ``name`` from the written checkpoint (its shard and the index)."""
    from helpers.checkpoints import write_shard
    from safetensors.torch import load_file

    index_path = os.path.join(folder, "model.safetensors.index.json")
    if os.path.exists(index_path):
        with open(index_path) as handle:
            index = json.load(handle)
        shard = index["weight_map"].pop(name)
        with open(index_path, "w") as handle:
            json.dump(index, handle)
    else:
        shard = "model.safetensors"
    path = os.path.join(folder, shard)
    tensors = load_file(path)
    del tensors[name]
    write_shard(path, tensors, metadata={"format": "pt"})


def run(arch: str, workdir: str) -> dict:
    from conformance.archs import ARCHS

    spec = ARCHS[arch]
    folder = write_checkpoint(arch, os.path.join(workdir, "ckpt"))
    shards = sorted(n for n in os.listdir(folder) if n.endswith(".safetensors"))

    from modelexpress.engines.vllm import adapter as vllm_adapter_module
    from helpers.cpu_vllm import cpu_vllm_adapter
    from modelexpress.engines.vllm.adapter import build_vllm_load_context
    from modelexpress.load_strategy import LoadStrategyChain
    from vllm.config import LoadConfig, ModelConfig, ParallelConfig, VllmConfig, set_current_vllm_config
    from vllm.distributed import ensure_model_parallel_initialized, init_distributed_environment
    from vllm.model_executor.model_loader.default_loader import DefaultModelLoader
    from vllm.model_executor.model_loader.utils import initialize_model
    from vllm.utils.torch_utils import set_default_torch_dtype

    from mx_strategies.verify.tensor_bytes import same_bytes
    from mx_strategies.testing.loopback import free_port

    mc = ModelConfig(model=folder, dtype="bfloat16", max_model_len=128, model_impl=spec.get("impl", "auto"))

    def engine_config() -> VllmConfig:  # one per model: vLLM registers each layer's name once per config
        load = LoadConfig(load_format="modelexpress", device="cuda:0")  # VllmAdapter accepts CUDA/XPU only
        return VllmConfig(model_config=mc, parallel_config=ParallelConfig(), load_config=load)

    vc = engine_config()
    with set_current_vllm_config(vc):
        init_distributed_environment(
            world_size=1, rank=0, local_rank=0, backend="gloo", distributed_init_method=f"tcp://127.0.0.1:{free_port()}"
        )
        ensure_model_parallel_initialized(1, 1)

    def build(vc):
        with set_current_vllm_config(vc), set_default_torch_dtype(mc.dtype):
            return initialize_model(vllm_config=vc, model_config=mc)

    result: dict = {"arch": arch, "shards": len(shards)}
    reference = build(vc)
    result["class"] = type(reference).__name__
    try:
        with set_current_vllm_config(vc):
            DefaultModelLoader(LoadConfig(load_format="safetensors")).load_weights(reference, mc)
        result["reference"] = "loaded"
    except Exception as exc:  # noqa: BLE001 - the reference refused: reported, the sweep decides
        result["reference"] = f"{type(exc).__name__}: {exc}"

    # The real adapter, less vLLM's post-load pass (it targets cuda:0 in ModelExpress); its re-initialization kept.
    vllm_adapter_module.VllmAdapter = cpu_vllm_adapter()
    os.environ.update(MX_STRATEGY="mx_strategies.robust", MX_MODEL_URI=folder, MX_ROBUST_MODEL_COMPLETENESS="fail")
    import mx_strategies
    from mx_strategies.observe.report import recent_reports

    mx_strategies.activate()
    vc = engine_config()
    candidate = build(vc)
    try:
        with set_current_vllm_config(vc):
            ctx = build_vllm_load_context(vc, mc)
            ctx.p2p_enabled = False
            loaded = LoadStrategyChain.run(candidate, ctx)
        # After a failed strategy ModelExpress rebuilds the model: the first object is gone.
        result["robust"] = "loaded" if loaded is candidate else "re-initialized"
        candidate = loaded
    except Exception as exc:  # noqa: BLE001
        result["robust"] = f"{type(exc).__name__}: {exc}"
    reports = recent_reports()
    result["report"] = reports[0] if reports else None  # robust's own: the chain's first strategy
    if result["robust"] != "loaded":
        return result

    def tensors(model):
        keep = dict(model.named_parameters(remove_duplicate=False))
        for module_name, module in model.named_modules(remove_duplicate=False):
            skip = getattr(module, "_non_persistent_buffers_set", set())
            for name, buffer in module.named_buffers(recurse=False):
                if name not in skip:
                    keep[f"{module_name}.{name}" if module_name else name] = buffer
        return keep

    if result["reference"] != "loaded":
        return result
    ref, got = tensors(reference), tensors(candidate)
    result["compared"] = len(ref)
    result["differ"] = sorted(n for n in ref if n not in got or not same_bytes(ref[n], got[n]))
    result["buffers"] = sum(1 for n in ref if n not in dict(reference.named_parameters(remove_duplicate=False)))
    return result


def main(argv: list[str]) -> int:
    arch, workdir, out = argv
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    try:
        result = run(arch, workdir)
    except BaseException as exc:  # noqa: BLE001
        result = {"arch": arch, "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
    with open(out, "w") as handle:
        json.dump(result, handle, indent=1, default=str)
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1:])

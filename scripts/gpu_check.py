"""Device check: mx_strategies.robust loading into CUDA tensors through the real chain.

Runs on a machine with an NVIDIA GPU and no internet (no vLLM needed): it
generates a DeepSeek-style checkpoint with an MTP head on local disk, loads
the target and then its MTP draft through ModelExpress's real
``LoadStrategyChain.run`` with ``MX_STRATEGY=mx_strategies.robust``, into a
model whose parameters live on ``cuda:0``, and compares every parameter with
``safetensors.torch.load_file(..., device="cuda:0")``. It also times the
target load against raw runai-model-streamer (+ copy to the GPU) on a larger
checkpoint. The engine's model is a stand-in (vLLM is not installed there).

Prints one JSON line and a one-line verdict; exit 0 on PASS.
Usage: python scripts/gpu_check.py [--size-mb 2048] [--reps 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import torch
from mx_strategies.verify.tensor_bytes import same_bytes


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size-mb", type=int, default=2048)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--device", default="cuda:0", help="cpu for a dry run of the script itself")
    args = parser.parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("gpu-check: SKIP no CUDA device")
        return 2

    from modelexpress import p2p_pb2
    from modelexpress.adapter import EngineAdapter
    from modelexpress.load_strategy import LoadContext, LoadResult, LoadStrategyChain
    from runai_model_streamer import SafetensorsStreamer
    from safetensors.torch import load_file

    import mx_strategies
    from mx_strategies.testing.synthetic import config_only_copy, mtp_checkpoint

    device = torch.device(args.device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    class CudaModel(torch.nn.Module):
        supports_dry_run = False  # a stand-in that takes every tensor it is handed: the plan decides, not it

        def __init__(self, shapes: dict[str, torch.Tensor], names) -> None:
            super().__init__()
            self.weights = {n: torch.empty_like(shapes[n], device=device) for n in names}
            self.loaded: list[str] = []

        def load_weights(self, weights):
            for name, tensor in weights:
                self.weights[name].copy_(tensor)  # KeyError on a stranger, as a strict engine would
                self.loaded.append(name)

    class Adapter(EngineAdapter):
        def __init__(self, make, vllm_config=None):
            self.make, self.vllm_config, self.reinit_calls = make, vllm_config, 0

        def apply_weight_iter(self, result, weights_iter):
            result.model.load_weights(weights_iter)
            sync()
            return result

        def reinit_for_retry(self, result):
            self.reinit_calls += 1
            model = self.make()
            return LoadResult(value=model, model=model)

    class Cfg:
        def __init__(self, **kw):
            self.__dict__.update(kw)

    def run(mc, reference, names, vcfg=None, draft=False):
        make = lambda: CudaModel(reference, names)  # noqa: E731
        adapter = Adapter(make, vcfg)
        ctx = LoadContext(
            model_config=mc, load_config=Cfg(), target_device=device, global_rank=0, worker_rank=0,
            local_rank=0, device_id=0, identity=p2p_pb2.SourceIdentity(model_name="gpu-check"),
            mx_client=None, worker_id="gpu-check", adapter=adapter, p2p_enabled=not draft,
        )  # fmt: skip
        model = LoadStrategyChain.run(make(), ctx)
        return model, adapter

    def equal(model, path, names) -> bool:
        ref = {}
        for name in sorted(os.listdir(path)):
            if name.endswith(".safetensors"):
                ref.update(load_file(os.path.join(path, name), device=args.device))
        return sorted(model.loaded) == sorted(names) and all(same_bytes(model.weights[n], ref[n]) for n in names)

    os.environ["MX_STRATEGY"] = "mx_strategies.robust"
    mx_strategies.activate()
    # The checkpoints live in a folder of the check's own, removed when it ends, however it ends.
    with tempfile.TemporaryDirectory(prefix="mx-gpu-check-") as work:
        figures: dict = {"device": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu", "torch": torch.__version__}
        ok = True

        # 1. correctness: target and draft into CUDA tensors
        ck = mtp_checkpoint(os.path.join(work, "small"), style="deepseek", hidden=256, empty_shards=(1,))
        os.environ["MX_MODEL_URI"] = ck.path
        from mx_strategies.engine import EngineView
        from mx_strategies.plan.planning import plan_of
        from mx_strategies.select.built_module import BuiltModule
        from mx_strategies.select.selection import select_resolved
        from mx_strategies.settings import load_settings
        from mx_strategies.inspect.sources import Candidate, resolve

        target_view = EngineView(False, None, (), 1, 1, None, {})

        def planned(uri: str):
            """A target load's selection and plan from ``uri``, as the strategy makes them."""
            settings = load_settings()
            resolution = resolve([Candidate("explicit", uri)], settings)
            selection = select_resolved(resolution, BuiltModule(target_view), settings)
            return selection, plan_of(resolution.checkpoint, selection.names, settings)

        model, adapter = run(Cfg(model=ck.path, model_weights=None, runner_type="generate", hf_config=None), ck.tensors, ck.tensors)
        # The target gets what the strategy plans for it: everything but the MTP layer, which the draft streams.
        target_selection, target_plan = planned(ck.path)
        assert target_selection.of_kind("left_to_draft"), "the target selection should leave the MTP layer to the draft"
        figures["target_ok"] = equal(model, ck.path, set(target_plan.expected)) and adapter.reinit_calls == 0
        cache = config_only_copy(ck.path, os.path.join(work, "cache"))
        vcfg = Cfg(speculative_config=Cfg(method="mtp", target_model_config=None), parallel_config=Cfg(tensor_parallel_size=1, pipeline_parallel_size=1))
        model, adapter = run(Cfg(model=cache, model_weights=None, runner_type="draft", hf_config=None), ck.tensors, ck.draft_names, vcfg, True)
        figures["draft_ok"] = equal(model, ck.path, ck.draft_names) and adapter.reinit_calls == 0
        ok &= figures["target_ok"] and figures["draft_ok"]

        # 2. throughput: robust through the chain vs raw runai + .to(cuda), interleaved
        layers = max(2, args.size_mb // 34)
        big = mtp_checkpoint(os.path.join(work, "big"), style="deepseek", hidden=2048, num_hidden_layers=layers,
                             layers_per_shard=max(1, layers // 8), empty_shards=(3,))  # fmt: skip
        size = big.nbytes(big.tensors)
        os.environ["MX_MODEL_URI"] = big.path
        # Like for like with raw runai, which streams whole files: the target streams every tensor here.
        os.environ["MX_ROBUST_TARGET_SELECTION"] = "all"
        # The files a target load streams, as the strategy plans them (empty shards left out).
        _, plan = planned(big.path)
        files = [shard.uri for shard in plan.shards]
        raw_t, robust_t = [], []
        for rep in range(args.reps + 1):
            t = time.perf_counter()
            with SafetensorsStreamer() as streamer:
                streamer.stream_files(files)
                for _, tensor in streamer.get_tensors():
                    tensor.to(device)
            sync()
            if rep:
                raw_t.append(time.perf_counter() - t)
            t = time.perf_counter()
            model, adapter = run(Cfg(model=big.path, model_weights=None, runner_type="generate", hf_config=None), big.tensors, big.tensors)
            if rep:
                robust_t.append(time.perf_counter() - t)
            del model
        figures.update(
            bytes=size,
            raw_runai_s=statistics.median(raw_t),
            robust_s=statistics.median(robust_t),
            raw_gbps=size / statistics.median(raw_t) / 1e9,
            robust_gbps=size / statistics.median(robust_t) / 1e9,
            ratio=statistics.median(raw_t) / statistics.median(robust_t),
        )
        print(json.dumps(figures))
        print(f"gpu-check: {'PASS' if ok else 'FAIL'} target={figures['target_ok']} draft={figures['draft_ok']} "
              f"robust/raw throughput={figures['ratio']:.2f}")  # fmt: skip
        return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

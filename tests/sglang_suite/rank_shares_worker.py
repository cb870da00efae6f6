"""TEST ONLY: one rank of tests/sglang_suite/test_sglang_rank_shares.py (not collected: no test_ prefix).

``python rank_shares_worker.py ARGS.json``; ARGS: ``rank``, ``model_path`` (config.json only: robust
streams MX_MODEL_URI), ``full`` (the same checkpoint on disk, for SGLang's own loader), ``out`` (result
JSON) and ``layouts``, run in turn in this one process (SGLang's imports take most of a run's time): each
with ``name``, ``init_method`` (gloo on 127.0.0.1), ``tp``, ``pp``, ``ep`` (SGLang's ``--tp-size``,
``--pp-size``, ``--ep-size``), ``server`` (other ServerArgs), ``spec`` (the published ``speculative_algorithm``, or null), ``env`` (set
for the layout: MX_MS_DISTRIBUTED, the reads cache) and ``loads``: one entry per load, ``sources`` for
``module_reads.SELECTION_ORDER`` and ``endpoint``, the S3 endpoint this rank reaches for it.

What a worker of SGLang 0.5.23 does at each layout, on the CPU, as tests/sglang_support/builders.py's
``sglang_runtime`` does for TP (that helper publishes no pp/ep widths): publish the ``ServerArgs`` with
this rank's ``SpawnRanks``, ``init_distributed_environment`` (gloo, world ``tp * pp``),
``initialize_model_parallel``, ``initialize_dp_attention``; then, as ``ModelRunner`` does for a target
before loading (model_runner.py:708 then :715), the global expert-location metadata
(``maybe_init_expert_location_metadata``: ``compute_initial_expert_location_metadata``, trivial by
default). Then, per load: SGLang's target built at this layout, what the built module says before it
is touched (``rank_share.share_of``, and for the first load the dry run ``module_reads.ask`` on the
local checkpoint), the load through ModelExpress's real ``MxModelLoader`` with robust, and a bit-for-bit
comparison with the same class loaded by SGLang's own ``DefaultModelLoader`` (whose trace says which
checkpoint names this rank's class reads). At the end of a layout everything is torn down as
``sglang_runtime`` does, and the next layout starts afresh.
"""

from __future__ import annotations

import json
import os
import sys
import traceback
import warnings
from contextlib import contextmanager

warnings.simplefilter("ignore")


@contextmanager
def runtime(rank: int, layout: dict):
    import sglang.srt.layers.rotary_embedding.base as rope_base
    from sglang.srt import runtime_context
    from sglang.srt.distributed import parallel_state
    from sglang.srt.layers.dp_attention import initialize_dp_attention
    from sglang.srt.server_args import ServerArgs

    rope_base._is_cpu = True  # builders.sglang_runtime's reason: SGLang's CPU mode needs sgl_kernel's CPU build
    server_args = ServerArgs(model_path="dummy", device="cpu", tp_size=layout["tp"], pp_size=layout["pp"],
                             ep_size=layout["ep"], speculative_algorithm=layout["spec"], **layout["server"])  # fmt: skip
    runtime_context.reset_context()
    runtime_context.publish(server_args, role="scheduler", ranks=runtime_context.SpawnRanks(world_rank=rank))
    parallel_state.init_distributed_environment(world_size=layout["tp"] * layout["pp"], rank=rank, local_rank=rank,
                                                backend="gloo", distributed_init_method=layout["init_method"])  # fmt: skip
    try:
        parallel_state.initialize_model_parallel(backend="gloo")
        initialize_dp_attention(server_args=server_args)
        yield
    finally:
        parallel_state.destroy_model_parallel()
        parallel_state.destroy_distributed_environment()
        runtime_context.reset_context()


def run(args: dict) -> dict:
    import modelexpress.engines.sglang.adapter as adapter_module
    from mx_cpu_shim import CpuAcceleratorBackend  # TEST ONLY: ModelExpress 0.7.0 has no cpu backend

    from mx_strategies import activation

    adapter_module.accelerator_backend_for = lambda device: CpuAcceleratorBackend()
    activation.register_sglang()
    found = {}
    for layout in args["layouts"]:
        os.environ.update(layout["env"])
        with runtime(args["rank"], layout):
            found[layout["name"]] = run_layout(args, layout)
    return found


def run_layout(args: dict, layout: dict) -> dict:
    from sglang.srt.eplb.expert_location import (
        compute_initial_expert_location_metadata,
        set_global_expert_location_metadata,
    )
    from sglang.srt.runtime_context import get_parallel

    from mx_strategies.select import module_reads, rank_share
    from mx_strategies.engine import declared_unused
    from mx_strategies.observe.report import clear_reports, recent_reports
    from mx_strategies.settings import load_settings
    from mx_strategies.inspect.sources import Candidate, probe
    from sglang_support import builders as sb
    from sglang_support.loads import delivered_names, mx_load

    parallel = get_parallel()
    tp_rank = parallel.tp_rank
    set_global_expert_location_metadata(compute_initial_expert_location_metadata(
        model_config=sb.model_config_for(args["model_path"], draft=False), moe_ep_rank=parallel.moe_ep_rank),
        allow_overwrite=True)  # fmt: skip
    found: dict = {
        "rank": args["rank"],
        "parallel": {k: getattr(parallel, k) for k in ("tp_rank", "pp_rank", "pp_size", "moe_ep_rank", "moe_ep_size")},
        "loads": [],
    }

    reference = sb.build_model(args["full"], draft=False, tp_rank=tp_rank)
    trace = sb.trace_native_load(reference)
    found["native_consumed"] = sorted(trace.consumed)

    for index, load in enumerate(layout["loads"]):
        module_reads.SELECTION_ORDER = tuple(load["sources"].split(","))
        os.environ["AWS_ENDPOINT_URL"] = load["endpoint"]
        built = sb.build_model(args["model_path"], draft=False, tp_rank=tp_rank)
        share = rank_share.share_of(built.model)
        entry: dict = {
            "sources": load["sources"],
            "share": {"missing_layers": list(share.missing_layers),
                      "local_experts": {k: sorted(v) for k, v in share.local_experts.items()}},  # fmt: skip
        }
        if index == 0:
            settings = load_settings()
            checkpoint = probe(Candidate("explicit", args["full"]), settings)
            answer = module_reads.ask(built.model, checkpoint, settings, unused=declared_unused(built.model))
            found["asked"] = (sorted(answer.names) if isinstance(answer, module_reads.ModuleReads)
                              else f"unanswered: {answer.reason}")  # fmt: skip
        fed = delivered_names(built.model)
        clear_reports()
        try:
            loaded = mx_load(built)
            entry["robust"] = "loaded" if loaded is built.model else "another module"
        except Exception as exc:  # noqa: BLE001 - reported; the test decides
            entry["robust"] = f"{type(exc).__name__}: {exc}"
        entry["reports"] = recent_reports()
        entry["fed"] = sorted(set(fed))
        entry["fed_count"] = len(fed)
        try:
            sb.assert_same_parameters(built.model, reference.model)
            entry["same"] = True
        except AssertionError as exc:
            entry["same"] = str(exc)[:2000]
        found["loads"].append(entry)
    set_global_expert_location_metadata(None, allow_overwrite=True)
    return found


def main() -> None:
    with open(sys.argv[1]) as handle:
        args = json.load(handle)
    try:
        result = run(args)
    except Exception:  # noqa: BLE001 - the whole failure goes to the test
        result = {"rank": args.get("rank"), "error": traceback.format_exc()}
    with open(args["out"], "w") as handle:
        json.dump(result, handle, indent=1, default=str)
    sys.stdout.flush()
    os._exit(0)  # runai's and gloo's threads must not keep the rank alive


if __name__ == "__main__":
    main()

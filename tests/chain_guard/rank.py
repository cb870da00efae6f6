"""One rank of a two-rank chain whose ranks see different copies of the engine's folder, in a process of its own.

``python tests/chain_guard/rank.py ARGS.json``; ARGS: ``rank``, ``port`` (the gloo rendezvous on 127.0.0.1),
``folder`` (this rank's copy of the engine's ``model``), ``out`` (result JSON). ModelExpress's real chain with
robust installed; the engine side is the stand-in adapter with ModelExpress's InstantTensor hooks (CUDA-like, a
reader that only counts its calls: InstantTensor's own needs CUDA) and rank collectives over torch.distributed,
as vLLM's adapter has them.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import traceback

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))


def main(args: dict) -> dict:
    import torch
    import torch.distributed as dist
    from helpers.checkpoints import reference_tensors
    from helpers.engine import InstantTensorAdapter
    from modelexpress.load_strategy import LoadStrategyChain

    from mx_strategies import activation
    from mx_strategies.robust import RobustModelStreamerStrategy
    from mx_strategies.testing.standin import StandInModel, load_context, model_config

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args['port']}", rank=args["rank"], world_size=2)

    class RankAdapter(InstantTensorAdapter):
        def all_gather_state(self, state):
            states = [None, None]
            dist.all_gather_object(states, state)
            return tuple(states)

    records: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())

    logging.getLogger("modelexpress.mx_strategies.chain_guard").addHandler(Keep())
    activation.install(RobustModelStreamerStrategy)
    reference = {n: t for n, t in reference_tensors(args["whole"]).items()}
    make = lambda: StandInModel(reference)  # noqa: E731
    adapter = RankAdapter(make)
    outcome = "loaded"
    ctx = load_context(model_config(model=args["folder"]), adapter, name="tiny", p2p_enabled=False)
    ctx.global_rank = args["rank"]
    try:
        LoadStrategyChain.run(make(), ctx)
    except RuntimeError as exc:
        outcome = str(exc)
    dist.destroy_process_group()
    del torch
    return {"instanttensor_calls": adapter.instanttensor_calls, "kept_off": records, "outcome": outcome}


if __name__ == "__main__":
    with open(sys.argv[1]) as handle:
        arguments = json.load(handle)
    try:
        result = main(arguments)
    except BaseException:  # noqa: BLE001 - the test reads the traceback from the result
        result = {"error": traceback.format_exc()}
    with open(arguments["out"], "w") as handle:
        json.dump(result, handle)

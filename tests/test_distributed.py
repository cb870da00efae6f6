"""Ranks agree on one plan: mx_strategies.distributed over a real gloo process group.

Two processes on 127.0.0.1 form a real torch.distributed group (gloo, as
vLLM on CPUs uses). The adapter's broadcast_state/all_gather_state are the
same calls ModelExpress's VllmAdapter makes, on the default group instead of
vLLM's world group (no vLLM engine here; the real-engine TP tests run it
through vLLM). Every case checks what each rank ends with, and that no rank
waits for ever (pytest timeout).
"""

from __future__ import annotations

import json
import os
from datetime import timedelta

import pytest
import torch.distributed as dist
import torch.multiprocessing as mp

from mx_strategies.errors import DraftPlanError, RanksDisagree
from mx_strategies.distributed import agreed_plan
from mx_strategies.testing.loopback import free_port

WORLD = 2


class GroupAdapter:
    """broadcast_state / all_gather_state as VllmAdapter implements them, on the default group."""

    def broadcast_state(self, state):
        box = [state]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def all_gather_state(self, state):
        states = [None] * dist.get_world_size()
        dist.all_gather_object(states, state)
        return tuple(states)


def _plan_on_rank(rank: int, case: str):
    if case == "rank0_fails" and rank == 0:
        raise DraftPlanError("no draft tensor found among 7 tensors")
    return {"source": f"s3://models/from-rank-{rank}", "shards": ["model-00001.safetensors"]}


def _check_on_rank(rank: int, case: str):
    def check(plan):
        if case == "rank1_refuses" and rank == 1:
            return "s3://models/x: listing shows model-00001.safetensors at 96 bytes, the plan says 128"
        return None

    return check


CASES = ("agree", "rank0_fails", "rank1_refuses")


def _worker(rank: int, port: int, out: str) -> None:
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD, timeout=timedelta(seconds=60)
    )
    outcomes = {}
    try:
        for case in CASES:  # one group for every case: each starts only after the last ended on all ranks
            try:
                plan = agreed_plan(GroupAdapter(), rank, lambda: _plan_on_rank(rank, case), _check_on_rank(rank, case))
                outcomes[case] = {"ok": True, "plan": plan}
            except RanksDisagree as exc:
                outcomes[case] = {"ok": False, "error": str(exc), "mutated": exc.mutated}
    finally:
        dist.destroy_process_group()
    with open(os.path.join(out, f"rank{rank}.json"), "w") as handle:
        json.dump(outcomes, handle)


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory) -> dict[str, list[dict]]:
    """Each case's outcome on every rank, from one run of two real processes."""
    out = tmp_path_factory.mktemp("ranks")
    mp.start_processes(_worker, args=(free_port(), str(out)), nprocs=WORLD, join=True, start_method="spawn")
    per_rank = [json.loads((out / f"rank{r}.json").read_text()) for r in range(WORLD)]
    return {case: [rank[case] for rank in per_rank] for case in CASES}


@pytest.mark.timeout(120)
def test_every_rank_streams_rank_zeros_plan(outcomes):
    assert outcomes["agree"] == [
        {"ok": True, "plan": {"source": "s3://models/from-rank-0", "shards": ["model-00001.safetensors"]}},
    ] * WORLD


@pytest.mark.timeout(120)
def test_rank_zero_failing_to_plan_fails_every_rank_unmutated(outcomes):
    expected = "rank 0 could not plan the load, so no rank streams it: no draft tensor found among 7 tensors"
    assert outcomes["rank0_fails"] == [{"ok": False, "error": expected, "mutated": False}] * WORLD


@pytest.mark.timeout(120)
def test_one_rank_refusing_the_plan_fails_every_rank_naming_it(outcomes):
    expected = (
        "1 of 2 ranks cannot stream rank 0's plan, so none does: rank 1: s3://models/x: listing shows "
        "model-00001.safetensors at 96 bytes, the plan says 128"
    )
    assert outcomes["rank1_refuses"] == [{"ok": False, "error": expected, "mutated": False}] * WORLD


def test_an_adapter_that_cannot_broadcast_is_refused():
    class NoBroadcast:
        def broadcast_state(self, state):  # ModelExpress's EngineAdapter default: no group
            return state

    with pytest.raises(RanksDisagree, match=r"^rank 1: the engine adapter did not share rank 0's load plan"):
        agreed_plan(NoBroadcast(), 1, lambda: "plan")

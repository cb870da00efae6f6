"""Ranks agree on one plan: mx_strategies.plan.distributed over a real gloo process group.

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
from mx_strategies.plan.distributed import _agreed_plan, _agreed_shares
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

# agreed_shares: a checkpoint of six tensors; rank r's share, its host, and what else differs per case.
UNIVERSE = ["embed", "layer0", "layer1.experts.0", "layer1.experts.1", "layer2", "head"]
SIZES = [100, 10, 20, 30, 40, 5]
SHARE_CASES = {
    # pipeline stages on one host: disjoint shares, the host streams their union
    "stages_one_host": ({0: {"embed", "layer0"}, 1: {"layer2", "head"}}, {0: "node-a", 1: "node-a"}),
    # expert-parallel ranks on two hosts: each host holds one rank, so each streams its own share
    "experts_two_hosts": ({0: {"embed", "layer1.experts.0"}, 1: {"embed", "layer1.experts.1"}},
                          {0: "node-a", 1: "node-b"}),
    "equal_shares": ({0: set(UNIVERSE), 1: set(UNIVERSE)}, {0: "node-a", 1: "node-a"}),
}
SHARE_FAULTS = ("share_rank1_refuses", "share_other_checkpoint")


def _share_on_rank(rank: int, case: str) -> dict:
    try:
        if case in SHARE_CASES:
            shares, hosts = SHARE_CASES[case]
            got = _agreed_shares(GroupAdapter(), rank, UNIVERSE, SIZES, frozenset(shares[rank]), host=hosts[rank])
        elif case == "share_rank1_refuses":
            own, why = (None, "draft load from s3://m: no draft tensor found") if rank == 1 else (frozenset(UNIVERSE), None)
            got = _agreed_shares(GroupAdapter(), rank, UNIVERSE, SIZES, own, why, host="node-a")
        else:  # rank 1 planned against another checkpoint (another list of tensors)
            universe = UNIVERSE + (["extra"] if rank == 1 else [])
            got = _agreed_shares(GroupAdapter(), rank, universe, SIZES + [1] * (rank == 1), frozenset(UNIVERSE),
                                host="node-a")  # fmt: skip
    except RanksDisagree as exc:
        return {"ok": False, "error": str(exc), "mutated": exc.mutated}
    return {"ok": True, "own": sorted(got.own), "carried": sorted(got.carried), "host_ranks": list(got.host_ranks),
            "ranks": [[r.rank, r.host, r.tensors, r.bytes] for r in got.ranks], "differ": got.shares_differ}  # fmt: skip


def _worker(rank: int, port: int, out: str) -> None:
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD, timeout=timedelta(seconds=60)
    )
    outcomes = {}
    try:
        for case in CASES:  # one group for every case: each starts only after the last ended on all ranks
            try:
                plan = _agreed_plan(GroupAdapter(), rank, lambda: _plan_on_rank(rank, case), _check_on_rank(rank, case))
                outcomes[case] = {"ok": True, "plan": plan}
            except RanksDisagree as exc:
                outcomes[case] = {"ok": False, "error": str(exc), "mutated": exc.mutated}
        for case in (*SHARE_CASES, *SHARE_FAULTS):
            outcomes[case] = _share_on_rank(rank, case)
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
    return {case: [rank[case] for rank in per_rank] for case in (*CASES, *SHARE_CASES, *SHARE_FAULTS)}


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
        _agreed_plan(NoBroadcast(), 1, lambda: "plan")


# -- agreed_shares: ranks that read different tensors ------------------------------------------


@pytest.mark.timeout(120)
def test_stages_on_one_host_stream_their_union_and_keep_their_own(outcomes):
    rank0, rank1 = outcomes["stages_one_host"]
    table = [[0, "node-a", 2, 110], [1, "node-a", 2, 45]]  # who reads what: the same on every rank
    union = sorted({"embed", "layer0", "layer2", "head"})
    assert rank0 == {"ok": True, "own": ["embed", "layer0"], "carried": union, "host_ranks": [0, 1],
                     "ranks": table, "differ": True}  # fmt: skip
    assert rank1 == {"ok": True, "own": ["head", "layer2"], "carried": union, "host_ranks": [0, 1],
                     "ranks": table, "differ": True}  # fmt: skip


@pytest.mark.timeout(120)
def test_ranks_alone_on_their_hosts_stream_only_their_own(outcomes):
    rank0, rank1 = outcomes["experts_two_hosts"]
    assert (rank0["carried"], rank0["host_ranks"], rank0["differ"]) == (["embed", "layer1.experts.0"], [0], False)
    assert (rank1["carried"], rank1["host_ranks"], rank1["differ"]) == (["embed", "layer1.experts.1"], [1], False)
    assert rank0["ranks"] == rank1["ranks"] == [[0, "node-a", 2, 120], [1, "node-b", 2, 130]]


@pytest.mark.timeout(120)
def test_equal_shares_stream_exactly_the_plan(outcomes):
    for result in outcomes["equal_shares"]:
        assert result["differ"] is False and result["carried"] == result["own"] == sorted(UNIVERSE)


@pytest.mark.timeout(120)
def test_a_rank_that_cannot_plan_its_share_fails_every_rank_unmutated(outcomes):
    expected = ("1 of 2 ranks cannot take their share of rank 0's plan, so none streams: "
                "rank 1: draft load from s3://m: no draft tensor found")  # fmt: skip
    assert outcomes["share_rank1_refuses"] == [{"ok": False, "error": expected, "mutated": False}] * WORLD


@pytest.mark.timeout(120)
def test_ranks_that_planned_against_other_tensors_fail_every_rank_unmutated(outcomes):
    for rank, result in enumerate(outcomes["share_other_checkpoint"]):
        assert result["ok"] is False and result["mutated"] is False
        other = 1 - rank
        assert f"rank {other}: planned against another list of tensors than rank {rank}" in result["error"]


# -- a stream only some ranks make (an MTP draft at pipeline parallel 2) -----------------------------------


def _lone_stream_worker(rank: int, port: int, out: str, checkpoint: str) -> None:
    """Rank 0 streams a checkpoint on its own while rank 1 of the same gloo world waits at a barrier, as a draft
    on the last pipeline stage loads: runai must not try to discover the world's ranks (it would wait for rank 1)."""
    import inspect as inspect_module

    from runai_model_streamer.distributed_streamer.distributed_streamer import DistributedStreamer

    from mx_strategies.stream import runai_plan
    from mx_strategies.inspect.index import inspect
    from mx_strategies.plan.planning import plan_of
    from mx_strategies.select.built_module import BuiltModule
    from mx_strategies.select.selection import select_tensors
    from mx_strategies.settings import load_settings
    from mx_strategies.inspect.storage import LocalStore
    from mx_strategies.stream.streaming import VerifiedStream
    from mx_strategies.verify.tensor_bytes import same_bytes
    from helpers.checkpoints import reference_of
    from helpers.engine import TARGET

    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD, timeout=timedelta(seconds=30)
    )
    result = {"rank": rank}
    try:
        if rank == 0:
            workaround = []
            real = runai_plan._no_rank_discovery
            runai_plan._no_rank_discovery = lambda streamer: (workaround.append(1), real(streamer))[1]
            settings = load_settings()
            inspected = inspect(LocalStore(checkpoint), settings.discovery_depth)
            selection = select_tensors(inspected, BuiltModule(TARGET), settings, source_is_target=True)
            plan = plan_of(inspected, selection.names, settings)
            reference = reference_of([os.path.join(checkpoint, shard.key) for shard in plan.shards])
            delivered = {}
            with VerifiedStream(plan, settings) as stream:
                for name, tensor in stream.tensors():
                    delivered[name] = same_bytes(tensor, reference[name])
            result.update(
                delivered=delivered,
                expected=sorted(reference),
                workaround_calls=len(workaround),
                public=("discover_ranks" in inspect_module.signature(DistributedStreamer.stream_files).parameters),
            )
        dist.barrier()
    finally:
        dist.destroy_process_group()
    with open(os.path.join(out, f"lone{rank}.json"), "w") as handle:
        json.dump(result, handle)


@pytest.mark.timeout(120)
def test_a_stream_only_rank_zero_makes_never_waits_for_the_other_ranks(tmp_path):
    """runai >= 0.17.1: its public ``discover_ranks=False`` keeps discovery off and our workaround is not used;
    runai 0.17.0: the workaround (``runai_plan._no_rank_discovery``) does. Either way rank 0's tensors are
    safetensors' own and no rank waits."""
    import sys

    from helpers.checkpoints import tiny_shards, write_checkpoint

    from mx_strategies.releases import installed_release

    ckpt = write_checkpoint(str(tmp_path / "ckpt"), tiny_shards(3))
    out = tmp_path / "out"
    out.mkdir()
    sys.path.insert(0, os.path.dirname(__file__))  # the spawned workers import tests/helpers
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (os.path.dirname(__file__), os.environ.get("PYTHONPATH")) if p)
    mp.start_processes(_lone_stream_worker, args=(free_port(), str(out), ckpt.path), nprocs=WORLD, join=True,
                       start_method="spawn")  # fmt: skip
    rank0 = json.loads((out / "lone0.json").read_text())
    assert json.loads((out / "lone1.json").read_text()) == {"rank": 1}
    assert sorted(rank0["delivered"]) == rank0["expected"] and all(rank0["delivered"].values()), rank0
    public = installed_release("runai-model-streamer") >= (0, 17, 1)
    assert rank0["public"] is public
    assert rank0["workaround_calls"] == (0 if public else 1)

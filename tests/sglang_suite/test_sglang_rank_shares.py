"""Each rank reads only its share, on SGLang 0.5.23's real classes: pipeline stages and expert-parallel ranks.

A tiny DeepSeek-V3 (three decoder layers: layer 0 dense, layers 1-2 MoE with eight routed experts; its
NextN layer 3) on moto S3 (127.0.0.1); each rank reaches it through a byte-counting proxy of its own, one
per load, so the bytes S3 served are known per rank and per load. Two processes
(``rank_shares_worker.py``) form SGLang's own parallel groups (gloo, world 2) at the layout, set SGLang's
expert-location metadata as its ModelRunner does before loading, build SGLang's real
``DeepseekV3ForCausalLM`` and load it through ModelExpress's real ``MxModelLoader`` with robust. No SGLang
engine runs on this CPU: the classes, groups and ModelExpress's chain are real. Every load is compared bit
for bit with SGLang's own ``DefaultModelLoader`` on the same classes at the same layout.

What SGLang does (sglang/srt/..., 0.5.23):

* pipeline parallel: ``make_pp_layers`` (utils/common.py:1680) splits the layers with ``get_pp_indices``
  (distributed/utils.py:110: the remainder goes to the last stages, so 3 layers over 2 stages are [0] and
  [1, 2]) and pads the others with ``PPMissingLayer`` (layers/utils/common.py:109); the embedding lives on
  the first stage, and on the last one too when a speculative algorithm is set (deepseek_v2.py:2918-2949,
  ``pp_stage_needs_embedding``), the final norm and ``lm_head`` on the last (:3004-3007, :3287-3300). Its
  ``load_weights`` skips other stages' layers by ``get_layer_id`` against ``start_layer``/``end_layer``
  (deepseek_common/deepseek_weight_loader.py:300-310) and the rest by absence from ``params_dict`` (:436-437,
  :527-531).
* expert parallel: ``FusedMoE`` holds ``num_experts / ep_size`` routed experts from ``moe_ep_rank`` on
  (layers/moe/fused_moe_triton/layer.py:390-416) and its ``weight_loader`` drops the others
  (``_map_global_expert_id_to_local_expert_id``, :1153-1194, through the expert-location metadata at
  :1196-1233). There is no ``expert_map`` tensor; ``rank_share._expert_map`` reads that method.

Layouts, all run by one pair of processes in turn: ``pp2`` (``--pp-size 2``), ``pp2-eagle`` (the same with a speculative algorithm published: the
last stage holds the embedding too), ``ep2`` (``--tp-size 2 --ep-size 2``, each rank streaming its own
experts), ``ep2-dist`` (the same with ``MX_MS_DISTRIBUTED=1``: the host streams the ranks' union once) and
``ep2-redundant`` (``--ep-num-redundant-experts 2``: experts no longer sit in the slots of their ids; the dry
run still answers each rank's exact experts, the structure reads them all).
Each rank loads twice: with the dry run (the default sources), and with ``module_reads.SELECTION_ORDER=
table,convention``, where the whole checkpoint (no table row for DeepSeek's classes, which build here) is
narrowed by the module's structure (``rank_share``): the NextN layer then streams too, and SGLang's target
drops it itself (deepseek_weight_loader.py:301).
"""

from __future__ import annotations

import os

import pytest

from helpers.ranks import run_ranks
from helpers.shares import expert_of, layer_of, probe_bytes

from mx_strategies.testing.loopback import CountingProxy
from sglang_support import builders as sb
from sglang_support.loads import Checkpoint

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(HERE)
REPO = os.path.dirname(TESTS)  # this checkout's mx_strategies, as in-process (the venv holds an installed copy)
WORKER = os.path.join(HERE, "rank_shares_worker.py")
WORKER_TIMEOUT = 360
HTTP_OVERHEAD = 1024  # per request: status line and headers
N_LAYERS, EXPERTS = 3, 8
CONFIG = dict(sb.TINY["deepseek_v3"], num_hidden_layers=N_LAYERS, n_routed_experts=EXPERTS)
_SOURCES = ("dry_run,table,convention", "table,convention")

LAYOUTS = {
    "pp2": dict(tp=1, pp=2, ep=1, spec=None, server={}, env={}),
    "pp2-eagle": dict(tp=1, pp=2, ep=1, spec="EAGLE", server={}, env={}),
    "ep2": dict(tp=2, pp=1, ep=2, spec=None, server={}, env={"MX_MS_DISTRIBUTED": "0"}),
    "ep2-dist": dict(tp=2, pp=1, ep=2, spec=None, server={}, env={"MX_MS_DISTRIBUTED": "1"}),
    # Two redundant expert slots: SGLang's trivial placement puts physical slots 8 and 9 on rank 1 and gives
    # them logical experts 0 and 1 (expert_location.py init_trivial: arange(10) % 8), so rank 1 loads experts
    # 5, 6, 7, 0 and 1. The dry run sees it; the structure has no map of it and reads every expert.
    "ep2-redundant": dict(tp=2, pp=1, ep=2, spec=None, server={"ep_num_redundant_experts": 2},
                          env={"MX_MS_DISTRIBUTED": "0"}),
}


@pytest.fixture(scope="module")
def runs(s3_server, tmp_path_factory):
    """Every layout, run by one pair of processes (SGLang's imports cost most of a run), once for the module:
    {layout: {"ranks": [rank0, rank1], "served": [[bytes per load], ...], "requests": ...}, "ckpt": ...}."""
    s3_server.bucket = "rank-shares"
    s3_server.create_bucket(s3_server.bucket)
    root = tmp_path_factory.mktemp("sglang-rank-shares")
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(sb.TINY, "deepseek_v3", CONFIG)  # the writer's config: 3 layers, 8 routed experts
        ckpt = Checkpoint(root, "deepseek_v3", s3_server)
    port = int(s3_server.direct.rsplit(":", 1)[1])
    # One counting proxy per layout, rank and load.
    proxies = {name: [[CountingProxy(port).start() for _ in _SOURCES] for _ in range(2)] for name in LAYOUTS}
    try:
        yield dict(ckpt=ckpt, **run_all(root, ckpt, proxies))
    finally:
        for per_rank in proxies.values():
            for pair in per_rank:
                for proxy in pair:
                    proxy.stop()


def run_all(root, ckpt, proxies) -> dict:
    layouts = {
        rank: [dict(LAYOUTS[name], name=name, init_method=f"tcp://127.0.0.1:{ports[name]}",
                    env=dict(LAYOUTS[name]["env"], MX_ROBUST_READS_CACHE_DIR=str(root / name / "reads")),
                    loads=[dict(sources=s, endpoint=proxies[name][rank][i].endpoint) for i, s in enumerate(_SOURCES)])
               for name in LAYOUTS]
        for ports in [{name: sb.free_port() for name in LAYOUTS}] for rank in range(2)
    }  # fmt: skip
    args, envs = [], []
    for rank in range(2):
        args.append(dict(rank=rank, model_path=ckpt.config_only, full=ckpt.full, layouts=layouts[rank]))
        env = {k: v for k, v in os.environ.items() if not k.startswith(("MX_", "SGLANG_", "RUNAI_"))}
        env.update(MX_STRATEGY="mx_strategies.robust", MX_MODEL_URI=ckpt.uri, MX_ROBUST_MODEL_COMPLETENESS="fail",
                   RUNAI_STREAMER_DIST_TIMEOUT="120",
                   PYTHONPATH=os.pathsep.join([REPO, TESTS, os.path.join(TESTS, "stubs", "sglang"), env.get("PYTHONPATH", "")]))  # fmt: skip
        envs.append(env)
    found = run_ranks(WORKER, root, args, envs, WORKER_TIMEOUT)
    return {
        name: {
            "ranks": [found[rank][name] for rank in range(2)],
            "served": [[proxy.to_client for proxy in pair] for pair in proxies[name]],
            "requests": [[max(len(proxy.requests), 1) for proxy in pair] for pair in proxies[name]],
        }
        for name in LAYOUTS
    }


# -- the checkpoint's names, and each rank's share of them --------------------------------------------


def target_names(ckpt) -> set[str]:
    """What SGLang's target reads at TP=1, PP=1: every tensor but the NextN layer's."""
    return {n for n in ckpt.tensors if layer_of(n) != N_LAYERS}


def stage_share(ckpt, stage: int, *, eagle: bool) -> set[str]:
    """SGLang's split of 3 layers over 2 stages (get_pp_indices: stage 0 layer 0, stage 1 layers 1-2)."""
    layers = {0} if stage == 0 else {1, 2}
    names = {n for n in target_names(ckpt) if layer_of(n) in layers}
    if stage == 0 or eagle:
        names.add("model.embed_tokens.weight")
    if stage == 1:
        names |= {"model.norm.weight", "lm_head.weight"}
    return names


def expert_share(ckpt, rank: int, experts=None) -> set[str]:
    """Linear placement: 8 routed experts over 2 EP ranks, rank r holds 4r..4r+3; everything else is dense."""
    mine = set(range(4 * rank, 4 * rank + 4)) if experts is None else experts
    return {n for n in target_names(ckpt) if expert_of(n) is None or expert_of(n) in mine}


def expected_share(name: str, ckpt, rank: int) -> set[str]:
    """What this rank's module reads (SGLang's own loader, and the dry run)."""
    if name.startswith("pp2"):
        return stage_share(ckpt, rank, eagle=name == "pp2-eagle")
    if name == "ep2-redundant":
        return expert_share(ckpt, rank, {0, 1, 2, 3, 4} if rank == 0 else {5, 6, 7, 0, 1})
    return expert_share(ckpt, rank)


def structure_share(name: str, ckpt, rank: int) -> set[str]:
    """What the module's structure (rank_share) keeps of the table's target plan: under a placement that is not
    the checkpoint's expert ids (redundant slots) every expert, as vLLM's filter under EPLB."""
    return target_names(ckpt) if name == "ep2-redundant" else expected_share(name, ckpt, rank)


def nextn_names(ckpt) -> set[str]:
    """The NextN layer: the draft's. Without the module, no table row leaves it out of a target's plan."""
    return set(ckpt.tensors) - target_names(ckpt)


def fallback_share(name: str, ckpt, rank: int) -> set[str]:
    """What a rank streams without its module's answer: the whole checkpoint narrowed by the structure."""
    return structure_share(name, ckpt, rank) | nextn_names(ckpt)


def only_report(load: dict) -> dict:
    loaded = [r for r in load["reports"] if r["outcome"] == "loaded"]
    assert len(loaded) == 1, load["reports"]
    return loaded[0]


def headers_bytes(ckpt) -> int:
    return probe_bytes(ckpt.full)


# -- the tests -------------------------------------------------------------------------------------------


@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_the_module_answers_its_rank_share_and_its_structure_says_the_same(name, runs):
    """(a) the dry run of a rank's built module answers exactly that rank's share, which is what SGLang's own
    loader reads there; (b) ``rank_share.share_of`` reads the same share from the module's structure."""
    run, ckpt = runs[name], runs["ckpt"]
    for rank, result in enumerate(run["ranks"]):
        share = expected_share(name, ckpt, rank)
        assert set(result["native_consumed"]) == share, (name, rank, sorted(set(result["native_consumed"]) ^ share))
        assert result["asked"] == sorted(share), (name, rank, result["asked"])
        structure = result["loads"][0]["share"]
        if name.startswith("pp2"):
            stage = result["parallel"]["pp_rank"]
            assert stage == rank and result["parallel"]["pp_size"] == 2
            missing = ["model.layers.1.", "model.layers.2.", "model.norm.", "lm_head."] if stage == 0 else (
                ["model.layers.0."] if name == "pp2-eagle" else ["model.embed_tokens.", "model.layers.0."])  # fmt: skip
            assert sorted(structure["missing_layers"]) == sorted(missing), structure
            assert structure["local_experts"] == {}
        else:
            assert result["parallel"]["moe_ep_rank"] == rank and result["parallel"]["moe_ep_size"] == 2
            assert structure["missing_layers"] == []
            mine = list(range(4 * rank, 4 * rank + 4))
            local = {} if name == "ep2-redundant" else {f"model.layers.{i}.mlp.experts.": mine for i in (1, 2)}
            assert structure["local_experts"] == local, structure
        # The structure's share, applied to the checkpoint's target layers (the NextN layer is the draft's), is
        # the module's answer.
        from mx_strategies.select.rank_share import RankShare

        rebuilt = RankShare(tuple(structure["missing_layers"]),
                            {k: frozenset(v) for k, v in structure["local_experts"].items()})  # fmt: skip
        assert {n for n in target_names(ckpt) if rebuilt.why_not_held(n) is None} == structure_share(name, ckpt, rank)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("sources", _SOURCES, ids=["dry-run", "table-and-structure"])
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_each_rank_streams_exactly_its_share_bit_identical_to_sglangs_loader(name, sources, runs):
    run, ckpt = runs[name], runs["ckpt"]
    index = _SOURCES.index(sources)
    distributed = name == "ep2-dist"
    reports = []
    for rank, result in enumerate(run["ranks"]):
        load = result["loads"][index]
        assert load["sources"] == sources
        assert load["robust"] == "loaded", (name, rank, load["robust"])
        assert load["same"] is True, (name, rank, load["same"])
        share = (expected_share if index == 0 else fallback_share)(name, ckpt, rank)
        report = only_report(load)
        reports.append(report)
        assert report["source"] == ckpt.uri and report["role"] == "target"
        assert set(load["fed"]) == share and load["fed_count"] == len(share), sorted(set(load["fed"]) ^ share)
        assert report["tensors"] == len(share), (name, rank, report["tensors"], len(share))
        assert report["bytes_streamed"] == ckpt.nbytes(share), (name, rank, report["bytes_streamed"])
        assert report["distributed"] is distributed
        whole = target_names(ckpt)
        if index == 0:
            assert report["selection_source"] == "dry_run" and report["not_held"] == 0
        else:  # the whole checkpoint (no table row), narrowed by the module's structure
            assert report["selection_source"] == "whole" and not report["left_to_draft"]
            assert report["not_held"] == len(whole - share)
            assert report["not_held_bytes"] == ckpt.nbytes(whole - share)
        if distributed:
            union = (expert_share(ckpt, 0) | expert_share(ckpt, 1)) | (nextn_names(ckpt) if index else set())
            assert union == whole | (nextn_names(ckpt) if index else set())
            assert report["bytes_carried"] == ckpt.nbytes(union)
            assert report["host_ranks"] == [0, 1]
            assert report["bytes_from_peers"] == report["bytes_carried"] - report["bytes_from_storage"]
            mine = [expert_share(ckpt, r) | (nextn_names(ckpt) if index else set()) for r in (0, 1)]
            assert [list(r)[2:] for r in report["ranks"]] == [[len(m), ckpt.nbytes(m)] for m in mine]
        else:
            assert report["bytes_carried"] in (None, report["bytes_streamed"])
            # S3 served this rank its share (plus the probe's header reads), not the whole checkpoint.
            served, share_bytes = run["served"][rank][index], report["bytes_streamed"]
            limit = 1.02 * share_bytes + headers_bytes(ckpt) + HTTP_OVERHEAD * run["requests"][rank][index]
            assert share_bytes <= served <= limit, (name, rank, served, share_bytes, limit)
    if distributed:
        # runai split the host's union between the two ranks: storage served it once.
        union = target_names(ckpt) | (nextn_names(ckpt) if index else set())
        assert sum(r["bytes_from_storage"] for r in reports) == ckpt.nbytes(union)
        assert all(r["bytes_from_storage"] > 0 for r in reports)
        total = sum(run["served"][r][index] for r in (0, 1))
        limit = 1.02 * ckpt.nbytes(union) + 2 * headers_bytes(ckpt) + HTTP_OVERHEAD * sum(
            run["requests"][r][index] for r in (0, 1))  # fmt: skip
        assert ckpt.nbytes(union) <= total <= limit, (total, limit)
    else:
        # Together the ranks read the checkpoint's target tensors once (PP) or the dense ones twice (EP).
        shares = [(expected_share if index == 0 else fallback_share)(name, ckpt, r) for r in (0, 1)]
        assert sum(r["bytes_streamed"] for r in reports) == sum(ckpt.nbytes(s) for s in shares)
        shares = [s - nextn_names(ckpt) for s in shares]  # both stages stream the NextN layer without the module
        if name == "pp2":
            assert shares[0] | shares[1] == target_names(ckpt) and not shares[0] & shares[1]

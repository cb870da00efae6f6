"""What each rank reads of DeepSeek-V3, names only (``python -m benchmarks --rank-shares``).

No data: DeepSeek-V3's released checkpoint (61 layers + 1 MTP layer, 256
routed experts, fp8 weights with 128x128-block ``weight_scale_inv``, bf16
embeddings, norms and router) is written down as names, shapes and dtypes,
in 163 shards as released. robust's own selection (``selection.select_tensors``, less
the MTP layer as DeepseekV3ForCausalLM's own answer leaves it out, and less
what the rank's module does not hold, then ``planning.plan_of``) decides
each rank's share from what that rank's module holds
(``rank_share.RankShare``), built with vLLM's own rules: ``get_pp_indices``
for the layers of a stage (embedding on the first, final norm and head on
the last), ``compute_local_expert_ids`` for an expert-parallel rank's
experts. On the real classes the module's answer is the same share
(tests/test_rank_shares.py); here no 8-rank module can be built.

Compared, per rank and for what storage serves a deployment:

* ``runai``: vLLM's runai loader (and ModelExpress's ``model_streamer``):
  every rank streams the whole checkpoint;
* ``default``: vLLM's default loader: reads every tensor, less the experts of
  other ranks under expert parallel (``ep_weight_filter``: ``.weight`` only,
  scales kept);
* ``robust before``: robust before this change: the whole checkpoint less the
  MTP layer, on every rank;
* ``robust``: each rank's share. With ``MX_MS_DISTRIBUTED`` the ranks of one
  node stream their union once, so storage serves each node its share once.

Layouts: PP=2 (one node per stage, TP=8 inside it), EP=8 (TP=8 with
``enable_expert_parallel`` on one node), DP=8 x EP=8 (eight engines of one
rank each, every engine its own world: nothing is shared between them).
"""

from __future__ import annotations


HIDDEN, VOCAB, LAYERS, DENSE, EXPERTS, MOE_INTER, DENSE_INTER = 7168, 129280, 61, 3, 256, 2048, 18432
HEADS, Q_LORA, KV_LORA, NOPE, ROPE, V_HEAD = 128, 1536, 512, 128, 64, 128
SHARDS = 163
SIZES = {"BF16": 2, "F32": 4, "F8_E4M3": 1}
CONFIG = dict(model_type="deepseek_v3", architectures=["DeepseekV3ForCausalLM"], num_hidden_layers=LAYERS,
              num_nextn_predict_layers=1, n_routed_experts=EXPERTS, first_k_dense_replace=DENSE)  # fmt: skip


def _fp8(out: dict, name: str, rows: int, cols: int) -> None:
    out[f"{name}.weight"] = ((rows, cols), "F8_E4M3")
    out[f"{name}.weight_scale_inv"] = ((-(-rows // 128), -(-cols // 128)), "F32")


def _layer(out: dict, i: int, moe: bool) -> None:
    p = f"model.layers.{i}"
    _fp8(out, f"{p}.self_attn.q_a_proj", Q_LORA, HIDDEN)
    out[f"{p}.self_attn.q_a_layernorm.weight"] = ((Q_LORA,), "BF16")
    _fp8(out, f"{p}.self_attn.q_b_proj", HEADS * (NOPE + ROPE), Q_LORA)
    _fp8(out, f"{p}.self_attn.kv_a_proj_with_mqa", KV_LORA + ROPE, HIDDEN)
    out[f"{p}.self_attn.kv_a_layernorm.weight"] = ((KV_LORA,), "BF16")
    _fp8(out, f"{p}.self_attn.kv_b_proj", HEADS * (NOPE + V_HEAD), KV_LORA)
    _fp8(out, f"{p}.self_attn.o_proj", HIDDEN, HEADS * V_HEAD)
    out[f"{p}.input_layernorm.weight"] = ((HIDDEN,), "BF16")
    out[f"{p}.post_attention_layernorm.weight"] = ((HIDDEN,), "BF16")
    if not moe:
        for proj, rows, cols in (("gate_proj", DENSE_INTER, HIDDEN), ("up_proj", DENSE_INTER, HIDDEN),
                                 ("down_proj", HIDDEN, DENSE_INTER)):  # fmt: skip
            _fp8(out, f"{p}.mlp.{proj}", rows, cols)
        return
    out[f"{p}.mlp.gate.weight"] = ((EXPERTS, HIDDEN), "BF16")
    out[f"{p}.mlp.gate.e_score_correction_bias"] = ((EXPERTS,), "F32")
    for expert in [f"experts.{e}" for e in range(EXPERTS)] + ["shared_experts"]:
        for proj, rows, cols in (("gate_proj", MOE_INTER, HIDDEN), ("up_proj", MOE_INTER, HIDDEN),
                                 ("down_proj", HIDDEN, MOE_INTER)):  # fmt: skip
            _fp8(out, f"{p}.mlp.{expert}.{proj}", rows, cols)


def deepseek_v3_names() -> dict[str, tuple[tuple[int, ...], str]]:
    """name -> (shape, dtype) of DeepSeek-V3's released checkpoint (target and its MTP layer 61)."""
    out: dict = {"model.embed_tokens.weight": ((VOCAB, HIDDEN), "BF16")}
    for i in range(LAYERS + 1):
        _layer(out, i, moe=i >= DENSE)
    mtp = f"model.layers.{LAYERS}"
    out.update({f"{mtp}.enorm.weight": ((HIDDEN,), "BF16"), f"{mtp}.hnorm.weight": ((HIDDEN,), "BF16"),
                f"{mtp}.eh_proj.weight": ((HIDDEN, 2 * HIDDEN), "BF16"),
                f"{mtp}.embed_tokens.weight": ((VOCAB, HIDDEN), "BF16"),
                f"{mtp}.shared_head.norm.weight": ((HIDDEN,), "BF16"),
                f"{mtp}.shared_head.head.weight": ((VOCAB, HIDDEN), "BF16"),
                "model.norm.weight": ((HIDDEN,), "BF16"), "lm_head.weight": ((VOCAB, HIDDEN), "BF16")})  # fmt: skip
    return out


def checkpoint():
    """The names as robust's Checkpoint, in SHARDS shards of about equal size, as released."""
    from mx_strategies.inspect.checkpoint import Checkpoint, Shard, TensorInfo

    names = deepseek_v3_names()
    infos = []
    for name, (shape, dtype) in names.items():
        count = 1
        for s in shape:
            count *= s
        infos.append(TensorInfo(name, dtype, shape, count * SIZES[dtype]))
    total = sum(t.nbytes for t in infos)
    shards, current, size = [], {}, 0
    for info in infos:
        current[info.name] = info
        size += info.nbytes
        if size >= total / SHARDS and len(shards) < SHARDS - 1:
            shards.append(current)
            current, size = {}, 0
    shards.append(current)
    out = []
    for i, tensors in enumerate(shards):
        key = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        out.append(Shard(key, f"s3://models/DeepSeek-V3/{key}", sum(t.nbytes for t in tensors.values()),
                         tensors=tensors, readable=True))  # fmt: skip
    return Checkpoint("s3://models/DeepSeek-V3", "", out, None, dict(CONFIG), [])


def _share(pp_rank: int, pp_size: int, ep_rank: int, ep_size: int):
    """The RankShare vLLM's module holds at this place, by vLLM's own rules."""
    from vllm.distributed.utils import get_pp_indices
    from vllm.model_executor.model_loader.ep_weight_filter import compute_local_expert_ids

    from mx_strategies.select.rank_share import RankShare

    start, end = get_pp_indices(LAYERS, pp_rank, pp_size)
    missing = [f"model.layers.{i}." for i in range(LAYERS) if not start <= i < end]
    if pp_rank > 0:
        missing.append("model.embed_tokens.")
    if pp_rank < pp_size - 1:
        missing += ["model.norm.", "lm_head."]
    local = compute_local_expert_ids(EXPERTS, ep_size, ep_rank)
    experts = {} if local is None else {f"model.layers.{i}.mlp.experts.": frozenset(local) for i in range(DENSE, LAYERS)}
    return RankShare(tuple(missing), experts)


def _default_loader_bytes(ckpt, ep_rank: int, ep_size: int) -> int:
    from vllm.model_executor.model_loader.ep_weight_filter import compute_local_expert_ids, should_skip_weight

    local = compute_local_expert_ids(EXPERTS, ep_size, ep_rank)
    return sum(t.nbytes for s in ckpt.shards for n, t in s.tensors.items() if not should_skip_weight(n, local))


def run_rank_shares() -> dict:
    from mx_strategies.engine import EngineView
    from mx_strategies.plan.planning import plan_of
    from mx_strategies.select.built_module import BuiltModule
    from mx_strategies.select.selection import select_tensors
    from mx_strategies.settings import load_settings

    ckpt = checkpoint()
    settings = load_settings()
    whole = ckpt.data_bytes
    target = EngineView(False, None, (), 1, 1, dict(CONFIG), {})
    # The target's module answers at a load: DeepseekV3ForCausalLM does not read its MTP layer (tests/test_module_reads.py;
    # no table row, its class builds). No module of this size is built here: that answer, by the MTP layer's name.
    from mx_strategies.select.rank_share import RankShare

    mtp = f"model.layers.{LAYERS}."

    def planned(share: RankShare):
        selection = select_tensors(ckpt, BuiltModule(target, share=share), settings, source_is_target=True)
        return plan_of(ckpt, selection.names, settings)

    before = planned(RankShare((mtp,), {}))

    def robust(pp_rank=0, pp_size=1, ep_rank=0, ep_size=1):
        share = _share(pp_rank, pp_size, ep_rank, ep_size)
        return planned(RankShare(share.missing_layers + (mtp,), share.local_experts))

    def union_bytes(plans) -> int:
        names = set().union(*(p.expected for p in plans))
        return sum(t.nbytes for s in ckpt.shards for n, t in s.tensors.items() if n in names)

    layouts = {}
    # PP=2: two nodes, one stage each (TP=8 inside a node, all ranks of a stage read the stage's share).
    stage = [robust(pp_rank=r, pp_size=2).bytes for r in range(2)]
    layouts["PP=2 (2 nodes x TP=8)"] = dict(
        ranks=16, nodes=2, per_rank={"robust": stage, "robust before": [before.bytes] * 2, "runai": [whole] * 2,
                                     "default": [whole] * 2},
        storage={"runai": 2 * whole, "default": 16 * whole, "robust before": 2 * before.bytes, "robust": sum(stage)},
        note="per stage; distributed streaming splits a stage's share between the node's 8 ranks",
    )  # fmt: skip
    # EP=8: one node, TP=8 with expert parallel.
    ep_plans = [robust(ep_rank=r, ep_size=8) for r in range(8)]
    ep = [p.bytes for p in ep_plans]
    default_ep = [_default_loader_bytes(ckpt, r, 8) for r in range(8)]
    layouts["EP=8 (1 node, TP=8)"] = dict(
        ranks=8, nodes=1, per_rank={"robust": ep, "robust before": [before.bytes] * 8, "runai": [whole] * 8,
                                    "default": default_ep},
        storage={"runai": whole, "default": sum(default_ep), "robust before": before.bytes,
                 "robust": union_bytes(ep_plans)},  # the node's union, once
        note="distributed streaming: the node's ranks stream their union (the target) once",
    )  # fmt: skip
    # DP=8 x EP=8: eight engines of one rank, nothing shared between them.
    layouts["DP=8 x EP=8 (8 engines)"] = dict(
        ranks=8, nodes=8, per_rank={"robust": ep, "robust before": [before.bytes] * 8, "runai": [whole] * 8,
                                    "default": default_ep},
        storage={"runai": 8 * whole, "default": sum(default_ep), "robust before": 8 * before.bytes, "robust": sum(ep)},
        note="each replica its own world: every rank reads from storage what it keeps",
    )  # fmt: skip
    return {"checkpoint_bytes": whole, "tensors": ckpt.tensor_count, "shards": len(ckpt.shards),
            "target_bytes": before.bytes, "layouts": layouts}  # fmt: skip


def _gb(value: int) -> str:
    return f"{value / 1e9:.1f}"


def render_rank_shares(result: dict) -> str:
    lines = [
        f"DeepSeek-V3: {result['tensors']} tensors, {_gb(result['checkpoint_bytes'])} GB in {result['shards']} shards; "
        f"the target less its MTP layer {_gb(result['target_bytes'])} GB",
        "",
        "| layout | loader | GB per rank (min-max) | storage serves (GB) | x checkpoint |",
        "|---|---|---|---|---|",
    ]
    for name, layout in result["layouts"].items():
        for loader in ("runai", "default", "robust before", "robust"):
            per_rank = layout["per_rank"][loader]
            served = layout["storage"][loader]
            span = f"{_gb(min(per_rank))}-{_gb(max(per_rank))}" if min(per_rank) != max(per_rank) else _gb(per_rank[0])
            lines.append(f"| {name} | {loader} | {span} | {_gb(served)} | {served / result['checkpoint_bytes']:.2f} |")
    return "\n".join(lines)


__all__ = ["deepseek_v3_names", "checkpoint", "render_rank_shares", "run_rank_shares"]

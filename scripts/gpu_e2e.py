"""Helpers for scripts/gpu-e2e.sh: a tiny MTP model, a loopback S3 server, the verdict.

The GPU check serves a real vLLM-loadable model with an MTP head from an S3
server on 127.0.0.1 through ``--load-format modelexpress`` with
``MX_STRATEGY=mx_strategies.robust``. Three parts of it run anywhere and are
kept here so they can be tested on a CPU:

``make-model``
    Builds a tiny random-weight checkpoint with a real architecture:
    transformers builds the model from a config (random init) and writes it
    with ``save_pretrained``, so every target tensor has the name and shape
    vLLM's model class expects. The MTP head transformers does not model is
    added with vLLM's names and the shapes of a real decoder layer of the
    same model. A byte-level BPE tokenizer is trained offline (no hub
    access). Writes a manifest (tensor names, draft names, bytes) for the
    verdict.
``serve-s3``
    moto on 127.0.0.1 (``mx_strategies.testing.loopback.LoopbackS3``), the model
    uploaded, the client environment written to a file for the shell to
    source; serves until SIGTERM, then records the bytes it served.
``verdict``
    Reads vLLM's log and the completion response and prints one line,
    ``PASS: ...`` or ``FAIL: <reason>``; exit status 0 or 1.

Architectures (``--arch``):

* ``deepseek_v3`` (default): DeepSeek-V3 layout with DeepSeek-V2-Lite's MLA
  head sizes (kv_lora_rank 512, rope 64, nope 128, v 128, 16 heads), the
  sizes vLLM's MLA kernels are built and tested for; everything else tiny.
  The MTP layer is ``model.layers.{num_hidden_layers}.*`` (the
  ``nextn_layers`` convention), as in the real checkpoint.
* ``qwen3_next``: Qwen3-Next layout (gated delta-net + full attention, MoE)
  with the real head sizes; the MTP head is ``mtp.*`` (``mtp`` convention).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

TOKENIZER_SPECIAL = "<|endoftext|>"
TOKENIZER_CORPUS = [
    "ModelExpress streams model weights from object storage into vLLM.",
    "A speculative draft reads only its own tensors from the shared checkpoint.",
    "The quick brown fox jumps over the lazy dog while the model loads.",
    "Multi-token prediction adds a small head to a large language model.",
    "hello world, hello vLLM, hello S3 on the loopback interface 127.0.0.1",
] * 4

# Tiny configs with the architecture's real head sizes (see the module docstring).
ARCH_CONFIGS: dict[str, dict[str, Any]] = {
    "deepseek_v3": dict(
        model_type="deepseek_v3",
        architectures=["DeepseekV3ForCausalLM"],
        hidden_size=256,
        intermediate_size=512,
        moe_intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=16,
        num_key_value_heads=16,
        n_routed_experts=8,
        n_shared_experts=1,
        num_experts_per_tok=2,
        n_group=1,
        topk_group=1,
        first_k_dense_replace=1,
        kv_lora_rank=512,
        q_lora_rank=64,
        qk_nope_head_dim=128,
        qk_rope_head_dim=64,
        v_head_dim=128,
        vocab_size=512,
        max_position_embeddings=512,
        num_nextn_predict_layers=1,
        # Keys of the released config.json that vLLM reads and transformers' class lacks.
        topk_method="noaux_tc",
        scoring_func="sigmoid",
        moe_layer_freq=1,
        routed_scaling_factor=2.5,
        norm_topk_prob=True,
        tie_word_embeddings=False,
    ),
    "qwen3_next": dict(
        model_type="qwen3_next",
        architectures=["Qwen3NextForCausalLM"],
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=256,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=128,
        linear_value_head_dim=128,
        linear_conv_kernel_dim=4,
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=128,
        shared_expert_intermediate_size=128,
        decoder_sparse_step=1,
        full_attention_interval=2,
        vocab_size=512,
        max_position_embeddings=512,
        mtp_num_hidden_layers=1,
        tie_word_embeddings=False,
    ),
}

SHARD_COUNT = 3

# What the verdict reads. Our strategy's report line (mx_strategies.robust):
#   [Worker 0] draft loaded from model_weights='s3://b/m', convention nextn_layers:
#   17 tensors verified, 1 of 9 checkpoint bytes streamed (11.1%) in 0.10s
LOADED_LINE = re.compile(
    r"\[Worker (?P<rank>\d+)\] (?P<role>target|draft) loaded from (?P<label>[\w.]+)='(?P<source>[^']*)'"
    r"(?:, convention (?P<convention>[\w+]+))?: (?P<tensors>\d+) tensors verified, "
    r"(?P<streamed>\d+) of (?P<total>\d+) checkpoint bytes streamed"
)
REINIT_MARK = "Re-initializing vLLM model after failed strategy"
# The same report line, with what a tensor-parallel run adds: the share and ", distributed".
LOAD_SHARE = re.compile(
    r"\[Worker (?P<rank>\d+)\] (?P<role>target|draft) loaded from [^\n]*? checkpoint bytes streamed "
    r"\([\d.]+%\)(?P<distributed>, distributed)?"
)
# A distributed load reads each byte once per node: S3 serves less than this many times what one
# rank loads (not distributed, it serves tensor_parallel_size times as much).
TP_ONCE_FACTOR = 1.5
STRATEGY_FAILED = re.compile(r"Strategy (?P<name>\S+) failed, trying next: (?P<why>.*)")
INSTALLED_MARK = "installed 'robust_model_streamer' in place of 'model_streamer'"
# An exception line: "ValueError: ...", "torch.OutOfMemoryError: ..." (not a bare "Error: ...").
WRAPPER_MARKS = ("See root cause above", "Engine core initialization failed")
ERROR_LINE = re.compile(r"(^|[\s)\]])((?:\w+\.)*[A-Z]\w*(?:Error|Exception)): \S")


# -- model -----------------------------------------------------------------


def make_tokenizer(out_dir: str, vocab_size: int) -> int:
    """Train a byte-level BPE offline and save it as a transformers tokenizer; returns the special id."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[TOKENIZER_SPECIAL],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(TOKENIZER_CORPUS, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=TOKENIZER_SPECIAL,
        eos_token=TOKENIZER_SPECIAL,
        pad_token=TOKENIZER_SPECIAL,
    )
    if len(fast) > vocab_size:
        raise RuntimeError(f"tokenizer has {len(fast)} tokens, the model only {vocab_size}")
    fast.save_pretrained(out_dir)
    return int(fast.convert_tokens_to_ids(TOKENIZER_SPECIAL))


def _renamed_layer(state: dict, source_prefix: str, dest_prefix: str, generator) -> dict:
    """Fresh random tensors with the names and shapes of one decoder layer, under a new prefix.

    Norm weights keep the template's values (their init is architecture
    specific: ones, or zeros for Qwen3-Next's offset RMSNorm).
    """
    import torch

    layer = {}
    for name, tensor in state.items():
        if not name.startswith(source_prefix):
            continue
        new_name = dest_prefix + name[len(source_prefix) :]
        if tensor.ndim >= 2:
            value = (torch.randn(tensor.shape, generator=generator) * 0.02).to(tensor.dtype)
        else:
            value = tensor.clone()
        layer[new_name] = value
    if not layer:
        raise RuntimeError(f"no tensor named {source_prefix}* to copy the MTP layer's shapes from")
    return layer


def _matrix(shape, generator, dtype):
    import torch

    return (torch.randn(shape, generator=generator) * 0.02).to(dtype)


def deepseek_mtp_tensors(state: dict, config: dict, generator) -> dict:
    """DeepSeek-V3's MTP layer as vLLM's DeepSeekMTP reads it: model.layers.{N}.*"""
    import torch

    n = config["num_hidden_layers"]
    hidden, vocab = config["hidden_size"], config["vocab_size"]
    dtype = state["model.embed_tokens.weight"].dtype
    # Layer N is a MoE layer (N >= first_k_dense_replace), like the last target layer.
    tensors = _renamed_layer(state, f"model.layers.{n - 1}.", f"model.layers.{n}.", generator)
    prefix = f"model.layers.{n}."
    tensors[prefix + "enorm.weight"] = torch.ones(hidden, dtype=dtype)
    tensors[prefix + "hnorm.weight"] = torch.ones(hidden, dtype=dtype)
    tensors[prefix + "eh_proj.weight"] = _matrix((hidden, 2 * hidden), generator, dtype)
    tensors[prefix + "shared_head.norm.weight"] = torch.ones(hidden, dtype=dtype)
    # The released checkpoint carries copies of the embedding and head in the MTP layer too.
    tensors[prefix + "shared_head.head.weight"] = _matrix((vocab, hidden), generator, dtype)
    tensors[prefix + "embed_tokens.weight"] = _matrix((vocab, hidden), generator, dtype)
    return tensors


def qwen3_next_mtp_tensors(state: dict, config: dict, generator) -> dict:
    """Qwen3-Next's MTP head as vLLM's Qwen3NextMTP reads it: mtp.*"""
    n = config["num_hidden_layers"]
    hidden = config["hidden_size"]
    dtype = state["model.embed_tokens.weight"].dtype
    # The MTP layer is a full-attention MoE layer; take the shapes of the last one.
    layer_types = config.get("layer_types") or [
        "full_attention" if (i + 1) % config["full_attention_interval"] == 0 else "linear_attention" for i in range(n)
    ]
    full = max(i for i, kind in enumerate(layer_types) if kind == "full_attention")
    tensors = _renamed_layer(state, f"model.layers.{full}.", "mtp.layers.0.", generator)
    norm = state["model.norm.weight"]
    tensors["mtp.fc.weight"] = _matrix((hidden, 2 * hidden), generator, dtype)
    tensors["mtp.pre_fc_norm_embedding.weight"] = norm.clone()
    tensors["mtp.pre_fc_norm_hidden.weight"] = norm.clone()
    tensors["mtp.norm.weight"] = norm.clone()
    return tensors


MTP_BUILDERS: dict[str, Callable[[dict, dict, Any], dict]] = {
    "deepseek_v3": deepseek_mtp_tensors,
    "qwen3_next": qwen3_next_mtp_tensors,
}
DRAFT_CONVENTION = {"deepseek_v3": "nextn_layers", "qwen3_next": "mtp"}
# Draft tensors the strategy does not stream at pipeline parallel 1: the MTP layer's copies of the
# embedding and head, which vLLM's proposer replaces with the target's (mx_strategies/mtp_table.py).
DRAFT_REPLACED_AT_PP1 = {"deepseek_v3": (".embed_tokens.weight", ".shared_head.head.weight"), "qwen3_next": ()}


def _split_shards(target: dict, draft: dict, arch: str) -> list[dict]:
    """Target tensors in SHARD_COUNT shards; the MTP head as the exporters place it."""
    names = list(target)
    size = -(-len(names) // SHARD_COUNT)
    shards = [{n: target[n] for n in names[i : i + size]} for i in range(0, len(names), size)]
    if arch == "qwen3_next":
        shards.append(dict(draft))  # Qwen: mtp.* in a shard of its own
    else:
        shards[-1].update(draft)  # DeepSeek: the MTP layer mixed into the last shard
    return shards


def write_shards(out_dir: str, shards: list[dict]) -> list[str]:
    """``model-0000i-of-0000n.safetensors`` plus ``model.safetensors.index.json``.

    Kept free of mx_strategies imports so that make-model needs only torch,
    safetensors, tokenizers and transformers.
    """
    from safetensors.torch import save_file

    count = len(shards)
    names = [f"model-{i + 1:05d}-of-{count:05d}.safetensors" for i in range(count)]
    weight_map = {}
    for name, shard in zip(names, shards):
        save_file({k: v.contiguous() for k, v in shard.items()}, os.path.join(out_dir, name), metadata={"format": "pt"})
        weight_map.update({tensor: name for tensor in shard})
    total = sum(t.numel() * t.element_size() for shard in shards for t in shard.values())
    with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as handle:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, handle, indent=1)
    return names


def make_model(arch: str, out_dir: str, manifest_path: str, seed: int = 0) -> dict:
    """Write the tiny checkpoint with its MTP head; return (and save) the manifest."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM

    if arch not in ARCH_CONFIGS:
        raise SystemExit(f"--arch must be one of {sorted(ARCH_CONFIGS)}, not {arch!r}")
    spec = dict(ARCH_CONFIGS[arch])
    os.makedirs(out_dir, exist_ok=True)
    special_id = make_tokenizer(out_dir, spec["vocab_size"])

    torch.manual_seed(seed)
    model_type = spec.pop("model_type")
    architectures = spec.pop("architectures")
    config = AutoConfig.for_model(
        model_type, bos_token_id=special_id, eos_token_id=special_id, pad_token_id=special_id, **spec
    )
    config.architectures = architectures
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(out_dir, safe_serialization=True)
    del model

    # Re-read what transformers wrote (its on-disk names: per-expert tensors
    # etc.), then lay it out in shards with the MTP head added.
    written = sorted(f for f in os.listdir(out_dir) if f.endswith(".safetensors"))
    target: dict = {}
    for name in written:
        target.update(load_file(os.path.join(out_dir, name)))
        os.remove(os.path.join(out_dir, name))
    index = os.path.join(out_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        os.remove(index)
    with open(os.path.join(out_dir, "config.json")) as handle:
        config_dict = json.load(handle)
    draft = MTP_BUILDERS[arch](target, config_dict, torch.Generator().manual_seed(seed + 1))
    overlap = set(draft) & set(target)
    if overlap:
        raise RuntimeError(f"MTP tensor names collide with target tensors: {sorted(overlap)[:5]}")
    shard_names = write_shards(out_dir, _split_shards(target, draft, arch))

    every = {**target, **draft}
    manifest = {
        "arch": arch,
        "architectures": architectures,
        "model_dir": os.path.abspath(out_dir),
        "shards": shard_names,
        "tensor_count": len(every),
        "draft_tensor_count": len(draft),
        "draft_tensors": sorted(draft),
        "draft_streamed_count": sum(1 for n in draft if not n.endswith(DRAFT_REPLACED_AT_PP1[arch] or ("\0",))),
        "draft_convention": DRAFT_CONVENTION[arch],
        "checkpoint_bytes": sum(t.numel() * t.element_size() for t in every.values()),
        "draft_bytes": sum(t.numel() * t.element_size() for t in draft.values()),
        "shapes": {name: list(every[name].shape) for name in sorted(every)},
    }
    with open(manifest_path, "w") as handle:
        json.dump(manifest, handle, indent=1)
    return manifest


# -- S3 --------------------------------------------------------------------


def serve_s3(folder: str, bucket: str, prefix: str, env_file: str, stats_file: Optional[str]) -> None:
    """Upload ``folder`` to moto on 127.0.0.1 and serve it until SIGTERM/SIGINT."""
    from mx_strategies.testing.loopback import S3_ENV, LoopbackS3

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    with LoopbackS3() as s3:
        uri = s3.upload(folder, bucket, prefix)
        s3.proxy.reset()  # count what the engine reads, not the upload
        env = dict(S3_ENV, AWS_ENDPOINT_URL=s3.endpoint, MODEL_URI=uri)
        tmp = env_file + ".tmp"
        with open(tmp, "w") as handle:
            for key, value in env.items():
                handle.write(f"export {key}={value}\n")
        os.replace(tmp, env_file)  # the shell waits for this file to appear
        print(f"serve-s3: {uri} at {s3.endpoint}", flush=True)
        stop.wait()
        if stats_file:
            with open(stats_file, "w") as handle:
                json.dump({"bytes_served": s3.bytes_served, "uri": uri}, handle)


# -- verdict ---------------------------------------------------------------


@dataclass
class Verdict:
    ok: bool
    reason: str
    details: dict = field(default_factory=dict)

    def line(self) -> str:
        return f"{'PASS' if self.ok else 'FAIL'}: {self.reason}"


def parse_loaded_lines(log: str) -> list[dict]:
    return [m.groupdict() for m in LOADED_LINE.finditer(log)]


def _completion_tokens(completion: Optional[dict]) -> tuple[Optional[int], str]:
    if not completion:
        return None, "no completion response"
    if "error" in completion:
        return None, f"completion returned an error: {completion['error']}"
    choices = completion.get("choices") or []
    if not choices or not isinstance(choices[0].get("text"), str):
        return None, "completion response has no choices[0].text"
    tokens = (completion.get("usage") or {}).get("completion_tokens")
    if not isinstance(tokens, int) or tokens <= 0:
        return None, f"completion produced no tokens (usage={completion.get('usage')})"
    return tokens, ""


def last_error(log: str) -> str:
    """The last exception line of a log (``SomeError: message``), if any.

    vLLM ends a failed start with a wrapper ("Engine core initialization
    failed. See root cause above."); the line before it says what happened.
    """
    lines = []
    for line in log.splitlines():
        match = ERROR_LINE.search(line)
        if match:
            lines.append(line[match.start(2) :].strip())  # without vLLM's "(Worker pid=..) ERROR date [file]" prefix
    causes = [line for line in lines if not any(mark in line for mark in WRAPPER_MARKS)]
    chosen = causes or lines
    return chosen[-1][:300] if chosen else ""


def judge(log: str, completion: Optional[dict], manifest: dict, server_problem: str = "") -> Verdict:
    """PASS when both loads went through our strategy from S3, the draft
    streamed exactly its own tensors, nothing was re-initialized and a
    completion came back.

    ``server_problem`` is what the shell saw go wrong with ``vllm serve``
    (exited early, never healthy); it fails the run after the load checks,
    so the line still says how far the loads got.
    """
    loaded = parse_loaded_lines(log)
    targets = [d for d in loaded if d["role"] == "target"]
    drafts = [d for d in loaded if d["role"] == "draft"]
    details = {"loaded": loaded}

    if REINIT_MARK in log:
        return Verdict(False, f"the model was re-initialized ('{REINIT_MARK}' in the log)", details)
    failed = STRATEGY_FAILED.search(log)
    if failed:
        return Verdict(False, f"strategy {failed['name']} failed: {failed['why'].strip()[:300]}", details)
    if not targets:
        # The activation line is logged before ModelExpress attaches vLLM's handlers, so it may be missing
        # even when activation worked; its absence only helps explain a missing load line.
        error = last_error(log)
        quiet = not (server_problem or error or INSTALLED_MARK in log)
        hint = " (was mx_strategies installed and listed in VLLM_PLUGINS?)" if quiet else ""
        why = f"; {server_problem}" if server_problem else ""
        why += f"; last error: {error}" if error else ""
        return Verdict(False, f"no 'target loaded from' line: the target did not load through the strategy{hint}{why}", details)
    if not drafts:
        return Verdict(False, "no 'draft loaded from' line: the MTP draft did not load through the strategy", details)
    for entry in targets + drafts:
        if not entry["source"].startswith("s3://"):
            return Verdict(False, f"{entry['role']} loaded from {entry['source']!r}, not from S3", details)
    draft = drafts[-1]
    expected = manifest.get("draft_streamed_count", manifest["draft_tensor_count"])
    if draft["convention"] != manifest["draft_convention"]:
        return Verdict(
            False,
            f"draft convention {draft['convention']!r}, expected {manifest['draft_convention']!r} "
            f"({draft['tensors']} tensors: streamed the whole checkpoint?)",
            details,
        )
    if int(draft["tensors"]) != expected:
        return Verdict(False, f"draft verified {draft['tensors']} tensors, expected exactly its own {expected}", details)
    if int(targets[-1]["tensors"]) != manifest["tensor_count"]:
        return Verdict(
            False, f"target verified {targets[-1]['tensors']} tensors, the checkpoint has {manifest['tensor_count']}", details
        )
    loads = f"target {targets[-1]['tensors']} and draft {draft['tensors']} own tensors loaded from S3"
    if server_problem:
        error = last_error(log)
        return Verdict(False, f"{loads}, but {server_problem}" + (f"; last error: {error}" if error else ""), details)
    tokens, problem = _completion_tokens(completion)
    if tokens is None:
        return Verdict(False, f"{loads}, but {problem}", details)
    share = 100.0 * int(draft["streamed"]) / int(draft["total"]) if int(draft["total"]) else 0.0
    return Verdict(
        True,
        f"{manifest['arch']} from {draft['source']}: target {targets[-1]['tensors']} tensors, "
        f"draft {draft['tensors']} own tensors ({draft['convention']}, {share:.1f}% of the checkpoint bytes), "
        f"no re-initialization, completion of {tokens} tokens",
        details,
    )


def tp_problem(log: str, manifest: dict, tp: int, stats: Optional[dict]) -> str:
    """For ``--tp N`` (N > 1): what is wrong with the tensor-parallel load, or "" when nothing is.

    Every rank 0..N-1 logged a target and a draft load, each ``distributed``;
    and when the S3 server's count is there, it served each byte about once:
    less than ``TP_ONCE_FACTOR`` times what one rank loads (the checkpoint
    plus the draft's tensors), where a load that is not distributed serves N
    times that.
    """
    loads = {(int(m["rank"]), m["role"]): bool(m["distributed"]) for m in LOAD_SHARE.finditer(log)}
    for rank in range(tp):
        for role in ("target", "draft"):
            if (rank, role) not in loads:
                return f"tensor parallel {tp}: no '{role} loaded from' line for rank {rank}"
            if not loads[(rank, role)]:
                return f"tensor parallel {tp}: rank {rank}'s {role} load was not distributed (MX_MS_DISTRIBUTED=1?)"
    if stats and "bytes_served" in stats:
        once = manifest["checkpoint_bytes"] + manifest["draft_bytes"]
        if stats["bytes_served"] >= TP_ONCE_FACTOR * once:
            return (
                f"tensor parallel {tp}: S3 served {stats['bytes_served']} bytes, {stats['bytes_served'] / once:.2f}x "
                f"what one rank loads ({once}): the ranks did not share the reads"
            )
    return ""


def _read(path: Optional[str]) -> str:
    if not path or not os.path.exists(path):
        return ""
    with open(path, errors="replace") as handle:
        return handle.read()


def _read_json(path: Optional[str]) -> Optional[dict]:
    text = _read(path)
    if not text.strip():
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return {"error": f"not JSON: {text[:200]!r}"}


# -- command line ----------------------------------------------------------


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="gpu_e2e.py", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("make-model", help="write the tiny MTP checkpoint and its manifest")
    p.add_argument("--arch", default="deepseek_v3", choices=sorted(ARCH_CONFIGS))
    p.add_argument("--out", required=True)
    p.add_argument("--manifest", required=True)

    p = sub.add_parser("serve-s3", help="serve a folder from moto on 127.0.0.1 until SIGTERM")
    p.add_argument("--folder", required=True)
    p.add_argument("--bucket", default="mx-e2e")
    p.add_argument("--prefix", default="tiny-mtp")
    p.add_argument("--env-file", required=True)
    p.add_argument("--stats-file")

    p = sub.add_parser("verdict", help="judge a vLLM log and completion; print one line")
    p.add_argument("--log", required=True)
    p.add_argument("--completion")
    p.add_argument("--manifest", required=True)
    p.add_argument("--stats-file")
    p.add_argument("--server-problem", default="", help="what went wrong with vllm serve, if anything")
    p.add_argument("--tp", type=int, default=1, help="tensor parallel size of the run (above 1: distributed checks)")

    args = parser.parse_args(argv)
    if args.command == "make-model":
        manifest = make_model(args.arch, args.out, args.manifest)
        print(
            f"make-model: {manifest['arch']} in {manifest['model_dir']}: {manifest['tensor_count']} tensors "
            f"({manifest['draft_tensor_count']} MTP, convention {manifest['draft_convention']}), "
            f"{manifest['checkpoint_bytes']} bytes in {len(manifest['shards'])} shards"
        )
        return 0
    if args.command == "serve-s3":
        serve_s3(args.folder, args.bucket, args.prefix, args.env_file, args.stats_file)
        return 0
    with open(args.manifest) as handle:
        manifest = json.load(handle)
    verdict = judge(_read(args.log), _read_json(args.completion), manifest, args.server_problem)
    stats = _read_json(args.stats_file)
    if verdict.ok and args.tp > 1:
        problem = tp_problem(_read(args.log), manifest, args.tp, stats)
        if problem:
            verdict = Verdict(False, problem, verdict.details)
        else:
            verdict.reason += f"; tensor parallel {args.tp}, every rank's loads distributed"
    line = verdict.line()
    if verdict.ok and stats and "bytes_served" in stats:
        line += f"; S3 served {stats['bytes_served']} bytes for a {manifest['checkpoint_bytes']}-byte checkpoint"
    print(line)
    return 0 if verdict.ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""What asking the module costs: the dry run on DeepSeek-V3's full name set (``python -m benchmarks --question``).

vLLM's real ``DeepseekV3ForCausalLM`` (61 layers, 256 routed experts, first 3 dense, fp8 block
quantization as the released checkpoint has it) and its ``DeepSeekMTP`` draft are built on the meta
device at tiny widths: the names and their count are the real checkpoint's (~94k, ``weight`` and
``weight_scale_inv`` for every linear), the bytes are nobody's. The checkpoint's names and header
shapes are made from the built modules by DeepSeek-V3's naming (fused q_a/kv_a, gate/up and the
experts split back into the checkpoint's tensors).

STAND-IN: vLLM picks an fp8 GEMM kernel while it builds each linear layer, and this CPU offers none
(vLLM's CPU fp8 kernels need AMX); kernel selection is told every kernel fits. No kernel runs: the
dry run only follows names into parameters.

Measured: the question's time (exact dry run), its peak of Python allocations (tracemalloc), a
restart's (the answer kept, :mod:`mx_strategies.select.reads_cache`), and the top of a cProfile: where the
time goes. Reported against the target's share of a DeepSeek-V3 load at 2 GB/s (689 GB, 344 s).
"""

from __future__ import annotations

import cProfile
import io
import json
import os
import pstats
import shutil
import statistics
import sys
import tempfile
import time
import tracemalloc
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Iterator

CHECKPOINT_BYTES = 689e9
LOAD_GBPS = 2.0
NODE_GBPS = 10.0  # a single 100 GbE node's rate
TARGET_SHARE = 0.01  # of the load's time, what the question may add
WATCH_TENSORS = 4000  # tensors of the write watch's micro-measure

CONFIG = dict(
    model_type="deepseek_v3", architectures=["DeepseekV3ForCausalLM"], num_hidden_layers=61, n_routed_experts=256,
    first_k_dense_replace=3, num_experts_per_tok=8, n_group=8, topk_group=4, n_shared_experts=1,
    num_nextn_predict_layers=1, hidden_size=256, intermediate_size=256, moe_intermediate_size=128, kv_lora_rank=128,
    q_lora_rank=128, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, num_attention_heads=2,
    num_key_value_heads=2, vocab_size=256, max_position_embeddings=256, rms_norm_eps=1e-6, torch_dtype="bfloat16",
    tie_word_embeddings=False, hidden_act="silu", routed_scaling_factor=2.5, norm_topk_prob=True,
    quantization_config={"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": [128, 128]},
)  # fmt: skip


def checkpoint_names(model, draft) -> dict[str, tuple[tuple[int, ...], str]]:
    """name -> (shape, safetensors dtype) of DeepSeek-V3's checkpoint, from the built target and draft."""
    import torch

    dtypes = {torch.bfloat16: "BF16", torch.float32: "F32", torch.float8_e4m3fn: "F8_E4M3"}
    out: dict[str, tuple[tuple[int, ...], str]] = {}

    def put(name, shape, dtype):
        out[name] = (tuple(int(s) for s in shape), dtypes[dtype])

    def split_rows(name, param, parts, sizes):
        stem, leaf = name.rsplit(".", 1)[0].rsplit(".", 1)[0], name.rsplit(".", 1)[1]
        scale = leaf.endswith("scale_inv")
        rows = [-(-s // 128) for s in sizes] if scale else sizes
        for part, count in zip(parts, rows):
            put(f"{stem}.{part}.{leaf}", (count, *param.shape[1:]), param.dtype)

    for module_name, params in (("target", model.named_parameters()), ("draft", draft.named_parameters())):
        for name, param in params:
            if module_name == "draft":
                name = name.replace(".mtp_block.", ".")
                if name.startswith(("model.embed_tokens.", "lm_head.")):
                    continue
            if ".experts.routed_experts." in name or (".experts." in name and "_weight" in name):
                base, leaf = name.split(".experts.", 1)[0] + ".experts", name.rsplit(".", 1)[1]
                suffix = leaf.split("_", 1)[1]  # weight / weight_scale_inv
                for expert in range(param.shape[0]):
                    if leaf.startswith("w13"):
                        half = (param.shape[1] // 2, *param.shape[2:])
                        put(f"{base}.{expert}.gate_proj.{suffix}", half, param.dtype)
                        put(f"{base}.{expert}.up_proj.{suffix}", half, param.dtype)
                    else:
                        put(f"{base}.{expert}.down_proj.{suffix}", param.shape[1:], param.dtype)
            elif ".fused_qkv_a_proj." in name:
                split_rows(name, param, ("q_a_proj", "kv_a_proj_with_mqa"), (128, 128 + 64))
            elif ".gate_up_proj." in name:
                half = param.shape[0] // 2 if not name.endswith("scale_inv") else param.shape[0] // 2
                stem, leaf = name.rsplit(".gate_up_proj.", 1)
                put(f"{stem}.gate_proj.{leaf}", (half, *param.shape[1:]), param.dtype)
                put(f"{stem}.up_proj.{leaf}", (half, *param.shape[1:]), param.dtype)
            else:
                put(name, param.shape, param.dtype)
    layer = CONFIG["num_hidden_layers"]
    put(f"model.layers.{layer}.embed_tokens.weight", (CONFIG["vocab_size"], CONFIG["hidden_size"]), torch.bfloat16)
    return out


def build(folder: str):
    """vLLM's DeepSeek-V3 target and MTP draft on the meta device (fp8, the kernel choice stood in)."""
    import torch
    import vllm.model_executor.kernels.linear as linear_kernels

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
    from mtp_arch import builders

    with open(os.path.join(folder, "config.json"), "w") as handle:
        json.dump(CONFIG, handle)
    linear_kernels.is_supported_and_can_implement_kernel = lambda kernel, config, capability: (True, None)
    with builders.in_process_inspection():
        target_config, spec, draft_config = builders.configs_for(folder, "deepseek_v3", trust_remote_code=False)
        vc = builders.engine_config(target_config, spec)
        context = builders.distributed_env(vc)
        context.__enter__()
        with torch.device("meta"):
            target = builders.build_module(vc, target_config)
            draft = builders.build_module(vc, draft_config)
    return SimpleNamespace(target=target, draft=draft, vllm_config=vc, context=context)


def measure(model, checkpoint, settings, vllm_config, unused=None, replaced=lambda name: False) -> dict:
    from vllm.config import set_current_vllm_config

    from mx_strategies.select import module_reads

    with set_current_vllm_config(vllm_config):
        times = []
        for _ in range(3):
            started = time.perf_counter()
            answer = module_reads.ask(model, checkpoint, settings, unused=unused, replaced=replaced)
            times.append(time.perf_counter() - started)
        seconds = sorted(times)[1]  # the median of three
        tracemalloc.start()  # a run of its own: tracemalloc slows Python several times over
        module_reads.ask(model, checkpoint, settings, unused=unused, replaced=replaced)
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        profile = cProfile.Profile()
        profile.enable()
        module_reads.ask(model, checkpoint, settings, unused=unused, replaced=replaced)
        profile.disable()
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(8)
    from mx_strategies.select.twin import make_twin

    twin_times = []
    for _ in range(3):
        twin_times.append(make_twin(model).seconds)
    tracemalloc.start()
    make_twin(model)
    _, twin_peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return {
        "seconds": round(seconds, 3),
        "twin_s": round(sorted(twin_times)[1], 3),
        "twin_peak_python_mib": round(twin_peak / 2**20, 1),
        "judged": getattr(answer, "judged", 0),
        "gaps": len(getattr(answer, "gaps", ())),
        "peak_python_mib": round(peak / 2**20, 1),
        "answered": type(answer).__name__,
        "source": getattr(answer, "source", None),
        "names_read": len(getattr(answer, "names", ())),
        "left_out": len(getattr(answer, "left_out", {})),
        "reason": getattr(answer, "reason", ""),
        "profile_top": [line for line in text.getvalue().splitlines() if line.strip()][-10:],
    }


OVERLAP_SHARDS = 8
OVERLAP_SHARD_BYTES = 256 << 20  # 2 GiB of real safetensors in all
STORAGE_BPS = 500_000_000  # the storage-bound run's cap on this process's disk reads
REPEATS = 5
BLKIO = "/sys/fs/cgroup/blkio"  # cgroup v1's block-I/O controller


@contextmanager
def storage_bound(path: str, bytes_per_s: int) -> Iterator[bool]:
    """This process's disk reads capped at ``bytes_per_s`` (cgroup v1 ``blkio.throttle``, as root), so a stream is
    bound by storage, as a node's is by its network, not by this machine's two CPUs and its memory; every thread
    moves back when it ends. Yields False (nothing changed) where the machine does not allow it."""
    device = os.stat(path).st_dev
    group = os.path.join(BLKIO, f"mx-benchmark-{os.getpid()}")
    try:
        os.makedirs(group, exist_ok=True)
        with open(os.path.join(group, "blkio.throttle.read_bps_device"), "w") as handle:
            handle.write(f"{os.major(device)}:{os.minor(device)} {bytes_per_s}")
        with open(os.path.join(group, "cgroup.procs"), "w") as handle:
            handle.write(str(os.getpid()))
    except OSError:
        yield False
        return
    try:
        yield True
    finally:
        with open(os.path.join(BLKIO, "cgroup.procs"), "w") as handle:
            handle.write(str(os.getpid()))
        os.rmdir(group)


def overlap(folder: str, ask) -> dict:
    """What the question adds to a load: a real checkpoint (OVERLAP_SHARDS shards of real safetensors, local
    files) streamed by :class:`VerifiedStream` alone; after the question (robust before the read-ahead); and
    with runai reading ahead (:class:`ReadAhead`, three quarters of the load, then the rest after it; and the
    whole load) while the question runs. Interleaved, medians of REPEATS.

    Twice: from the page cache as this machine has it, where the stream and the question share two CPUs and
    the question's freed memory makes runai's later buffers fault their pages in anew (system time); and
    storage-bound (:func:`storage_bound`, the files dropped from the page cache before each run), as a node
    reading at its network's rate is."""
    import torch
    from safetensors.torch import save_file

    from mx_strategies.inspect.sources import Candidate, resolve
    from mx_strategies.plan.planning import plan_of
    from mx_strategies.settings import load_settings
    from mx_strategies.stream.read_ahead import ReadAhead, plan_head
    from mx_strategies.stream.streaming import VerifiedStream
    from mx_strategies.testing.page_cache import cold

    data = os.path.join(folder, "bytes")
    os.makedirs(data)
    per_tensor = OVERLAP_SHARD_BYTES // 16 // 4
    paths = [os.path.join(data, f"model-{shard + 1:05d}-of-{OVERLAP_SHARDS:05d}.safetensors") for shard in range(OVERLAP_SHARDS)]
    for shard, path in enumerate(paths):
        save_file({f"model.layers.{shard}.w{j}": torch.full((per_tensor,), float(j)) for j in range(16)}, path)
    settings = load_settings()
    checkpoint = resolve([Candidate("explicit", data)], settings).checkpoint
    plan = plan_of(checkpoint, None, settings)
    budgets = {"three quarters": plan.bytes * 3 // 4, "whole": plan.bytes}

    def uncached() -> None:
        cold(paths)

    def stream(ahead=None) -> None:
        with VerifiedStream(plan, settings, read_ahead=ahead) as verified:
            for _ in verified.tensors():
                pass

    def read_ahead_then_stream(budget: int):
        def run() -> None:
            with ReadAhead(plan_head(plan, budget), settings) as ahead:
                ask()
                stream(ahead)

        return run

    def measure(before) -> dict:
        def timed(step) -> float:
            before()
            started = time.perf_counter()
            step()
            return time.perf_counter() - started

        alone, asked, after, ahead = [], [], [], {name: [] for name in budgets}
        for _ in range(REPEATS):
            alone.append(timed(stream))
            asked.append(timed(ask))
            after.append(timed(lambda: (ask(), stream())))
            for name, budget in budgets.items():
                ahead[name].append(timed(read_ahead_then_stream(budget)))
        alone_s, question_s, after_s = (statistics.median(t) for t in (alone, asked, after))
        return {
            "stream_s": round(alone_s, 3),
            "rate_gbps": round(plan.bytes / alone_s / 1e9, 2),
            "question_s": round(question_s, 3),
            "question_then_stream_s": round(after_s, 3),
            "added_before_s": round(after_s - alone_s, 3),
            "read_ahead": {
                name: {"bytes": budgets[name], "s": round(statistics.median(t), 3),
                       "added_s": round(statistics.median(t) - alone_s, 3)}
                for name, t in ahead.items()
            },  # fmt: skip
        }

    try:
        stream()  # the page cache, warm for the first runs
        runs = {"page cache": measure(lambda: None)}
        with storage_bound(data, STORAGE_BPS) as bound:
            if bound:
                runs[f"storage-bound ({STORAGE_BPS / 1e9:g} GB/s cap)"] = measure(uncached)
    finally:
        shutil.rmtree(data, ignore_errors=True)
    return {"bytes": plan.bytes, "repeats": REPEATS, "runs": runs}


def run_question(workdir: str) -> dict:
    """The measurements of the module docstring, as one dict (``question`` in the benchmark's JSON)."""
    from mx_strategies.select import module_reads
    from mx_strategies.inspect.checkpoint import Checkpoint, Shard, TensorInfo
    from mx_strategies.engine import declared_unused
    from mx_strategies.settings import load_settings

    folder = tempfile.mkdtemp(prefix="question-", dir=workdir)
    started = time.perf_counter()
    built = build(folder)
    build_s = time.perf_counter() - started
    try:
        names = checkpoint_names(built.target, built.draft)
        tensors = {n: TensorInfo(n, dtype, shape, 0) for n, (shape, dtype) in names.items()}
        shard = Shard("model.safetensors", os.path.join(folder, "model.safetensors"), 0, tensors=tensors, readable=True)
        checkpoint = Checkpoint(folder, "", [shard], None, CONFIG, [])
        settings = load_settings()
        target = measure(built.target, checkpoint, settings, built.vllm_config, declared_unused(built.target))
        draft = measure(built.draft, checkpoint, settings, built.vllm_config, declared_unused(built.draft))
        # A restart: the same class, parameters, layout and names; the answer is kept.
        os.environ["MX_ROBUST_READS_CACHE_DIR"] = os.path.join(folder, "kept")
        kept_settings = load_settings()
        context = ("vllm", "bench", "target", 1, 1, 0, True, module_reads.SELECTION_ORDER)
        from vllm.config import set_current_vllm_config

        with set_current_vllm_config(built.vllm_config):
            module_reads.ask_cached(built.target, checkpoint, kept_settings, context)
            again = time.perf_counter()
            answer = module_reads.ask_cached(built.target, checkpoint, kept_settings, context)
            restart_s = time.perf_counter() - again
        del os.environ["MX_ROBUST_READS_CACHE_DIR"]

        def ask() -> None:
            with set_current_vllm_config(built.vllm_config):
                module_reads.ask(built.target, checkpoint, settings, unused=declared_unused(built.target))

        streamed = overlap(folder, ask)
    finally:
        built.context.__exit__(None, None, None)
    load_s = CHECKPOINT_BYTES / (LOAD_GBPS * 1e9)
    node_s = CHECKPOINT_BYTES / (NODE_GBPS * 1e9)
    watch = watch_overhead()
    return {
        "overlap": streamed,
        "load_s_at_10gbps": round(node_s, 1),
        "target_share_at_10gbps": round(target["seconds"] / node_s, 5),
        "budget_s_at_10gbps": round(TARGET_SHARE * node_s, 2),
        "watch": watch,
        "watch_share_at_10gbps": round(watch["extra_us_per_tensor"] * 1e-6 * len(names) / node_s, 5),
        "names": len(names),
        "build_s": round(build_s, 2),
        "target": target,
        "draft": draft,
        "restart_s": round(restart_s, 3),
        "restart_cached": answer.cached,
        "load_s_at_2gbps": round(load_s, 1),
        "target_share_of_load": round(target["seconds"] / load_s, 5),
        "restart_share_of_load": round(restart_s / load_s, 6),
        "budget_s": round(TARGET_SHARE * load_s, 2),
    }


def watch_overhead() -> dict:
    """What the write watch adds to a load's ``load_weights``: a module of WATCH_TENSORS small parameters loaded
    by copy, with and without :func:`mx_strategies.verify.after.watched`, interleaved; medians of five."""
    import torch

    from mx_strategies.verify.after import watched
    from mx_strategies.verify.kept import judged_parameters

    class Many(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weights = torch.nn.ParameterList(torch.nn.Parameter(torch.zeros(8, 8)) for _ in range(WATCH_TENSORS))

        def load_weights(self, weights):
            params = dict(self.named_parameters())
            for name, tensor in weights:
                params[name].data.copy_(tensor)

    model = Many()
    tensors = [(n, torch.ones(8, 8)) for n, _ in model.named_parameters()]
    judged = judged_parameters(model, lambda name: False)
    plain, watched_s = [], []
    for _ in range(5):
        started = time.perf_counter()
        model.load_weights(iter(tensors))
        plain.append(time.perf_counter() - started)
        started = time.perf_counter()
        with watched(model, judged) as written:
            model.load_weights(iter(tensors))
        watched_s.append(time.perf_counter() - started)
    assert len(written.writes) == WATCH_TENSORS
    a, b = sorted(plain)[2], sorted(watched_s)[2]
    return {"tensors": WATCH_TENSORS, "plain_s": round(a, 4), "watched_s": round(b, 4),
            "extra_us_per_tensor": round((b - a) / WATCH_TENSORS * 1e6, 1)}  # fmt: skip


def render_question(result: dict) -> str:
    lines = [
        f"\n== Asking the module (DeepSeek-V3 names, {result['names']} tensors; built on meta in {result['build_s']} s)",
        "| role | seconds | peak Python MiB | twin s | twin peak MiB | answered by | names read | left out | "
        "parameters judged | gaps |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for role in ("target", "draft"):
        r = result[role]
        lines.append(f"| {role} | {r['seconds']} | {r['peak_python_mib']} | {r['twin_s']} | {r['twin_peak_python_mib']} | "
                     f"{r['source'] or r['reason']} | {r['names_read']} | {r['left_out']} | {r['judged']} | {r['gaps']} |")  # fmt: skip
    budget = result["budget_s_at_10gbps"]
    lines.append(
        "budget at 10 GB/s (1% of the load, " + f"{budget} s): "
        + "; ".join(f"{role} {result[role]['seconds']} s {'met' if result[role]['seconds'] <= budget else 'NOT met'}"
                    for role in ("target", "draft"))
    )  # fmt: skip
    lines.append(
        f"target: {100 * result['target_share_of_load']:.2f}% of a {result['load_s_at_2gbps']} s load at 2 GB/s "
        f"(budget 1%: {result['budget_s']} s), {100 * result['target_share_at_10gbps']:.2f}% of a "
        f"{result['load_s_at_10gbps']} s load at 10 GB/s (budget 1%: {result['budget_s_at_10gbps']} s); "
        f"a restart: {result['restart_s']} s (kept answer: {result['restart_cached']})"
    )
    o = result["overlap"]
    for name, run in o["runs"].items():
        lines.append(
            f"the question in a load, {name}: {o['bytes'] / 2**30:.1f} GiB of safetensors streamed in {run['stream_s']} s "
            f"({run['rate_gbps']} GB/s), the question alone {run['question_s']} s (medians of {o['repeats']}); streamed "
            f"after the question {run['question_then_stream_s']} s (+{run['added_before_s']} s); with runai reading ahead "
            "while it runs: " + "; ".join(f"{k} ({r['bytes'] / 2**30:.1f} GiB) {r['s']} s (+{r['added_s']} s)"
                                          for k, r in run["read_ahead"].items())
        )  # fmt: skip
    w = result["watch"]
    lines.append(
        f"write watch: {w['tensors']} tensors loaded in {w['plain_s']} s plain, {w['watched_s']} s watched: "
        f"{w['extra_us_per_tensor']} us per tensor, {100 * result['watch_share_at_10gbps']:.2f}% of the 10 GB/s load "
        f"for {result['names']} tensors"
    )
    lines.append("where the target's time goes (cProfile, tottime):")
    lines += [f"    {line}" for line in result["target"]["profile_top"]]
    return "\n".join(lines)


__all__ = ["render_question", "run_question"]

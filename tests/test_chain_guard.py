"""No link of ModelExpress's chain ahead of robust loads a folder robust would refuse (mx_strategies.chain_guard).

ModelExpress's ``instant_tensor`` strategy runs ahead of robust on every CUDA node: ModelExpress's own
``VllmAdapter.build_instanttensor_weight_iter`` (vLLM's ``DefaultModelLoader.get_all_weights`` with
``load_format="instanttensor"``: the engine's own folder, its index filter, its glob) fed to
``apply_weight_iter``, with none of the checks of the default loader's ``load_weights``. Here everything is
real, on vLLM 0.32's ``DeepseekV3ForCausalLM`` and the installed ModelExpress's real chain and strategy classes
(0.7.0 in the main venv, 0.8 in ``.venv-vllm-mx08``), but two things a CPU cannot run, stood in for and no more:

- InstantTensor's reader, ``instanttensor_weights_iterator`` (CUDA only), by vLLM's own
  ``safetensors_weights_iterator`` over the very files vLLM chose, recording them;
- the adapter's ``is_cuda_alike()`` answers True (ModelExpress's gate for InstantTensor), and its post-load
  pass is skipped (it moves layers to ``cuda:0``: ``helpers.cpu_vllm``).

Three folders as partial downloads and mounts leave them: an index naming a shard that is not there, a shard cut
short, and some shards without an index. With robust switched on InstantTensor never reads them and robust's
verdict ends the load; without robust, InstantTensor reads them as ModelExpress does today; a whole folder still
goes to InstantTensor.
"""

from __future__ import annotations

import importlib.util
import os

import pytest

if importlib.util.find_spec("vllm") is None:
    pytest.skip("vLLM is not installed", allow_module_level=True)

import torch  # noqa: E402
from helpers.checkpoints import cut_tail  # noqa: E402
from helpers.cpu_vllm import cpu_vllm_adapter  # noqa: E402
from modelexpress.adapter import StrategyFailed  # noqa: E402
from modelexpress.engines.vllm import adapter as vllm_adapter_module  # noqa: E402
from modelexpress.engines.vllm.adapter import build_vllm_load_context  # noqa: E402
from modelexpress.load_strategy import LoadResult, LoadStrategyChain  # noqa: E402
from mtp_arch.checkpoints import write_checkpoint  # noqa: E402
from test_mtp_architectures import (  # noqa: E402,F401 - fixtures and helpers of the draft matrix
    no_modelexpress_server,
    target_and_draft_checkpoint,
    vllm_cpu,
)

from mx_strategies import activation  # noqa: E402
from mx_strategies.observe.report import clear_reports, recent_reports  # noqa: E402
from mx_strategies.robust import RobustModelStreamerStrategy  # noqa: E402
from mx_strategies.verify.tensor_bytes import same_bytes  # noqa: E402

GUARD_LOGGER = "modelexpress.mx_strategies.chain_guard"
KEPT_OFF = "instant_tensor kept off {folder}: robust would refuse it: "


class CudaAlikeAdapter(cpu_vllm_adapter()):
    """ModelExpress's VllmAdapter, CUDA-like for InstantTensor's gate (the one answer changed); a rebuild is counted
    and keeps the model (vLLM would build a new one: the test reads what the failed strategies left)."""

    reinits = 0

    def is_cuda_alike(self) -> bool:
        return True

    def reinit_for_retry(self, result):
        type(self).reinits += 1
        return result


@pytest.fixture
def instanttensor_reads(monkeypatch):
    """InstantTensor's reader stood in by vLLM's safetensors iterator; the files each call was given."""
    from vllm.model_executor.model_loader import default_loader
    from vllm.model_executor.model_loader.weight_utils import safetensors_weights_iterator

    calls: list[list[str]] = []

    def read(hf_weights_files, use_tqdm_on_load, **_):
        calls.append(sorted(os.path.basename(f) for f in hf_weights_files))
        yield from safetensors_weights_iterator(hf_weights_files, False)

    monkeypatch.setattr(default_loader, "instanttensor_weights_iterator", read)
    return calls


@pytest.fixture(scope="module")
def target(tmp_path_factory, vllm_cpu):  # noqa: F811
    """vLLM's real DeepseekV3ForCausalLM and its whole checkpoint (3 shards and an index), built once."""
    folder, _, _, (model, vc, config, truth, tensors), mtp = target_and_draft_checkpoint(
        "deepseek_v3", tmp_path_factory.mktemp("guard")
    )
    return folder, model, vc, config, {**tensors, **mtp}, truth


def _shards(folder: str) -> list[str]:
    return sorted(f for f in os.listdir(folder) if f.endswith(".safetensors"))


def missing_shard(folder: str) -> str:
    """The index names a shard that is not there (a download cut off between files)."""
    shard = _shards(folder)[1]
    os.remove(os.path.join(folder, shard))
    return f"{folder}/{shard}: named by model.safetensors.index.json for "


def cut_short(folder: str) -> str:
    """A shard shorter than its header says (a copy stopped mid-file)."""
    shard = _shards(folder)[1]
    cut_tail(os.path.join(folder, shard))
    return f"{folder}/{shard}: truncated: "


def no_index(folder: str) -> str:
    """Some shards and no index (a mount of part of the files): robust's question finds parameters no tensor writes."""
    os.remove(os.path.join(folder, "model.safetensors.index.json"))
    os.remove(os.path.join(folder, _shards(folder)[1]))
    return f"target load from {folder} refused before streaming: "


DAMAGE = {"missing_shard": missing_shard, "cut_short": cut_short, "no_index": no_index}


def _copy(target, folder: str) -> str:
    write_checkpoint(folder, target[4], shards=3)
    return folder


def _scramble(model: torch.nn.Module) -> None:
    """The module is shared by this file's tests: values no checkpoint holds, before a load that should write it."""
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.fill_(0.5)


def _chain(monkeypatch, target, folder: str, *, model_weights=None):
    """ModelExpress's real chain loading the target with the engine's model at ``folder``."""
    _, model, vc, config, _, _ = target
    monkeypatch.setattr(vllm_adapter_module, "VllmAdapter", CudaAlikeAdapter)
    monkeypatch.setattr(CudaAlikeAdapter, "reinits", 0)
    monkeypatch.setattr(config, "model", folder)
    monkeypatch.setattr(config, "model_weights", model_weights or "", raising=False)
    ctx = build_vllm_load_context(vc, config)
    ctx.p2p_enabled = False
    clear_reports()
    from vllm.config import set_current_vllm_config

    with set_current_vllm_config(vc):  # as in the engine: vLLM's default loader, last in the chain, reads it
        return LoadStrategyChain.run(model, ctx)


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_with_robust_instant_tensor_never_reads_a_folder_robust_refuses(
    damage, target, tmp_path, monkeypatch, caplog, robust, instanttensor_reads
):
    folder = _copy(target, str(tmp_path / "ckpt"))
    says = DAMAGE[damage](folder)
    monkeypatch.setenv("MX_MODEL_URI", folder)

    with pytest.raises(RuntimeError, match="No loading strategy succeeded"):
        _chain(monkeypatch, target, folder)

    assert instanttensor_reads == []  # InstantTensor's reader never ran
    (kept_off,) = [r.getMessage() for r in caplog.records if r.name == GUARD_LOGGER]
    assert KEPT_OFF.format(folder=folder) in kept_off and says in kept_off
    assert "(MX_ROBUST_GUARD_CHAIN=off lets instant_tensor read it)" in kept_off
    # robust's own verdict, the same refusal, before the model was touched; no rebuild
    (robust_failed,) = [r for r in recent_reports() if r["role"] == "target"]
    assert robust_failed["outcome"] == "failed" and robust_failed["mutated"] is False and says in robust_failed["error"]
    # Nothing was rebuilt before vLLM's default loader, after robust, read the folder and refused it by its own check.
    failed = [r.getMessage() for r in caplog.records if "failed, trying next" in r.getMessage()]
    assert [m.split(" failed")[0].split()[-1] for m in failed] == ["instant_tensor", "robust_model_streamer", "default"]
    assert CudaAlikeAdapter.reinits == 1  # default's failure only


def test_with_robust_a_broken_model_folder_loads_whole_from_the_next_source(
    target, tmp_path, monkeypatch, caplog, robust, instanttensor_reads
):
    broken = _copy(target, str(tmp_path / "partial"))
    missing_shard(broken)
    whole = _copy(target, str(tmp_path / "whole"))
    monkeypatch.setenv("MX_MODEL_URI", whole)
    _scramble(target[1])

    loaded = _chain(monkeypatch, target, broken, model_weights=whole)

    assert instanttensor_reads == []
    (report,) = [r for r in recent_reports() if r["role"] == "target"]
    assert report["outcome"] == "loaded" and (report["source_label"], report["source"]) == ("model_weights", whole)
    truth = target[5]
    assert not [n for n, p in loaded.named_parameters() if not same_bytes(p.data, truth[n])]


# What ModelExpress's InstantTensor does with each folder on vLLM 0.32, robust off: vLLM's own index check fails
# the missing shard inside ``apply_weight_iter`` and the cut shard fails as it is read (both ``mutated=True``:
# the model rebuilt), and the folder of some shards serves a model whose missing tensors keep their init values.
WITHOUT_ROBUST = {
    "missing_shard": ("InstantTensor loading failed, falling through: Weight files referenced in index but missing", None),
    "cut_short": ("InstantTensor loading failed, falling through: ", 3),
    "no_index": ("InstantTensor weight loading complete", 2),
}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_without_robust_instant_tensor_reads_the_folder_as_modelexpress_does(
    damage, target, tmp_path, monkeypatch, caplog, instanttensor_reads
):
    activation.uninstall()
    folder = _copy(target, str(tmp_path / "ckpt"))
    DAMAGE[damage](folder)
    monkeypatch.setenv("MX_MODEL_URI", folder)
    says, files_read = WITHOUT_ROBUST[damage]

    try:
        _chain(monkeypatch, target, folder)
    except RuntimeError:
        pass  # nothing else loads it here either

    assert "Attempting InstantTensor loading" in caplog.text and says in caplog.text
    assert "kept off" not in caplog.text
    assert [len(files) for files in instanttensor_reads[:1]] == ([files_read] if files_read else [])
    if damage != "no_index":
        assert CudaAlikeAdapter.reinits >= 1  # mutated: ModelExpress rebuilds the model after InstantTensor


def test_a_whole_folder_still_goes_to_instant_tensor(target, tmp_path, monkeypatch, caplog, robust, instanttensor_reads):
    folder = _copy(target, str(tmp_path / "ckpt"))
    monkeypatch.setenv("MX_MODEL_URI", folder)
    _scramble(target[1])

    loaded = _chain(monkeypatch, target, folder)

    assert instanttensor_reads == [_shards(folder)]
    assert "InstantTensor weight loading complete" in caplog.text and "kept off" not in caplog.text
    assert not [r for r in recent_reports() if r["role"] == "target"]  # robust did not run
    truth = target[5]
    assert not [n for n, p in loaded.named_parameters() if not same_bytes(p.data, truth[n])]


def test_the_setting_lets_instant_tensor_read_any_folder(target, tmp_path, monkeypatch, robust, instanttensor_reads):
    folder = _copy(target, str(tmp_path / "ckpt"))
    absent = no_index(folder)
    monkeypatch.setenv("MX_MODEL_URI", folder)
    monkeypatch.setenv("MX_ROBUST_GUARD_CHAIN", "off")
    _scramble(target[1])

    loaded = _chain(monkeypatch, target, folder)  # ModelExpress's way: InstantTensor serves the shards there

    assert instanttensor_reads == [_shards(folder)] and absent
    truth = target[5]
    assert [n for n, p in loaded.named_parameters() if not same_bytes(p.data, truth[n])]  # and leaves the rest


def test_an_index_that_omits_a_tensor_the_model_needs_is_caught_when_the_module_is_asked(
    target, tmp_path, monkeypatch, caplog, robust, instanttensor_reads
):
    """A consistent folder whose index and files both lack one member of a stacked parameter (an exporter's slip).
    ``auto`` (the default) takes the index's word, as the headers agree with it, and InstantTensor reads it;
    ``module`` asks the module, as robust's own load does, and keeps InstantTensor off naming the part."""
    missing = "model.layers.0.mlp.up_proj.weight"
    folder = str(tmp_path / "ckpt")
    write_checkpoint(folder, {n: t for n, t in target[4].items() if n != missing}, shards=3)
    monkeypatch.setenv("MX_MODEL_URI", folder)
    monkeypatch.setenv("MX_ROBUST_GUARD_CHAIN", "module")

    with pytest.raises(RuntimeError, match="No loading strategy succeeded"):
        _chain(monkeypatch, target, folder)

    assert instanttensor_reads == []
    (kept_off,) = [r.getMessage() for r in caplog.records if r.name == GUARD_LOGGER]
    assert f"target load from {folder} refused before streaming: 1 parameter(s) the checkpoint fills only in part" in kept_off
    assert f"the checkpoint lacks {missing}" in kept_off

    monkeypatch.setenv("MX_ROBUST_GUARD_CHAIN", "auto")
    _chain(monkeypatch, target, folder)
    assert instanttensor_reads == [_shards(folder)]


# -- checked after: what robust cannot judge before a reader runs -------------------------------------------------


def test_a_folder_robust_cannot_judge_is_checked_after_instant_tensor_reads_it(
    target, tmp_path, monkeypatch, caplog, robust, instanttensor_reads
):
    """Some shards and no index, under a module robust may not ask (module_reads.SELECTION_ORDER without dry_run):
    the guard cannot see what is missing and lets InstantTensor read the folder. What vLLM's ``load_weights``
    reported is then held against what the model keeps: InstantTensor's load fails ``mutated=True`` naming the
    link and the parameters, before the post-load pass; ModelExpress rebuilds and robust loads the whole copy."""
    broken = _copy(target, str(tmp_path / "partial"))
    no_index(broken)
    whole = _copy(target, str(tmp_path / "whole"))
    monkeypatch.setenv("MX_MODEL_URI", whole)
    monkeypatch.setattr("mx_strategies.select.module_reads.SELECTION_ORDER", ("table", "convention"))
    _scramble(target[1])

    loaded = _chain(monkeypatch, target, broken, model_weights=whole)

    assert instanttensor_reads == [_shards(broken)]  # the guard could not judge: InstantTensor read the folder
    assert "kept off" not in caplog.text
    (after,) = [r.getMessage() for r in caplog.records if r.name == GUARD_LOGGER]
    assert after.startswith(f"[Worker 0] instant_tensor loaded {broken} and robust's check after it failed: target "
                            f"model incomplete: ")  # fmt: skip
    assert " it keeps were not written from the checkpoint: " in after and "model.layers.1." in after
    failed = [r.getMessage() for r in caplog.records if "failed, trying next" in r.getMessage()]
    assert [m.split(" failed")[0].split()[-1] for m in failed] == ["instant_tensor"]
    assert CudaAlikeAdapter.reinits == 1  # mutated: ModelExpress rebuilt the model before robust
    (report,) = [r for r in recent_reports() if r["role"] == "target"]
    assert report["outcome"] == "loaded" and (report["source_label"], report["source"]) == ("model_weights", whole)
    truth = target[5]
    assert not [n for n, p in loaded.named_parameters() if not same_bytes(p.data, truth[n])]


def test_a_whole_folder_passes_the_check_after_instant_tensor(
    target, tmp_path, monkeypatch, caplog, robust, instanttensor_reads
):
    """The same module robust may not ask, a whole folder: InstantTensor serves it, checked, with no line."""
    folder = _copy(target, str(tmp_path / "ckpt"))
    monkeypatch.setenv("MX_MODEL_URI", folder)
    monkeypatch.setattr("mx_strategies.select.module_reads.SELECTION_ORDER", ("table", "convention"))
    _scramble(target[1])

    loaded = _chain(monkeypatch, target, folder)

    assert instanttensor_reads == [_shards(folder)]
    assert not [r for r in caplog.records if r.name == GUARD_LOGGER]
    assert not [r for r in recent_reports() if r["role"] == "target"]  # robust did not run
    truth = target[5]
    assert not [n for n, p in loaded.named_parameters() if not same_bytes(p.data, truth[n])]


@pytest.mark.parametrize("switched_on", [True, False])
def test_the_default_loader_is_checked_after_it_loads_a_quantized_model(
    switched_on, target, tmp_path, monkeypatch, caplog, instanttensor_reads
):
    """vLLM's ``DefaultModelLoader.load_weights`` holds what ``load_weights`` reported against the model only when
    ``model_config.quantization`` is unset. Here it is set (``fp8``, on the config alone: the class is built bf16, the
    one thing stood in), and the folder holds some shards and no index: robust's own load fails over
    (``mutated=True``), vLLM's default loader reads what is there and checks nothing. With robust on, its check after
    the default loader fails the link naming the parameters, and the chain fails loudly; without robust, ModelExpress
    serves the model with the missing layers at whatever values they held."""
    if switched_on:
        monkeypatch.setenv("MX_STRATEGY", "mx_strategies.robust")
        activation.register()
    else:
        activation.uninstall()
    folder = _copy(target, str(tmp_path / "partial"))
    no_index(folder)
    monkeypatch.setattr(target[3], "quantization", "fp8")
    _scramble(target[1])

    try:
        if switched_on:
            with pytest.raises(RuntimeError, match="No loading strategy succeeded"):
                _chain(monkeypatch, target, folder)
        else:
            loaded = _chain(monkeypatch, target, folder)
    finally:
        activation.uninstall()

    after = [r.getMessage() for r in caplog.records if r.name == GUARD_LOGGER and "check after it failed" in r.getMessage()]
    truth = target[5]
    if switched_on:
        (line,) = after
        assert line.startswith(f"[Worker 0] default loaded {folder} and robust's check after it failed: target model "
                               f"incomplete: ")  # fmt: skip
        assert "model.layers.1." in line
    else:
        assert after == []
        assert [n for n, p in loaded.named_parameters() if not same_bytes(p.data, truth[n])]  # served, partly wrong

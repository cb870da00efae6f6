"""The module's kept answers (``MX_ROBUST_READS_CACHE_DIR``, :mod:`mx_strategies.select.reads_cache`) over restarts.

Issue 55: a kept answer edited to leave out two tensors the module reads (a stale or corrupted cache on a
shared volume) was caught by robust's model-side check, and the load failed over to the chain's next strategy,
rightly; but the answer stayed, and every later start failed over the same way (three starts, three
fail-overs, each rebuilding the model). Now the load that proves it wrong drops it: one failed load, then the
next start asks the module again and loads whole through robust, and the one after uses the new kept answer.

Every part is real but the engine: ModelExpress's chain (robust, then its ``default`` strategy, which loads with
safetensors), runai's stream, safetensors files; the model is a torch module with real parameters whose
``load_weights`` reports what it loaded, as vLLM's models do.
"""

from __future__ import annotations

import json
import logging
import os

import pytest
import torch
from helpers.checkpoints import reference_tensors, tiny_shards, write_checkpoint
from helpers.engine import CHAIN_LOGGER, STRATEGY_LOGGER, FolderNativeAdapter, make_context, messages, model_config
from modelexpress.load_strategy import LoadStrategyChain

from mx_strategies.observe.report import clear_reports, recent_reports
from mx_strategies.select import module_reads, reads_cache
from mx_strategies.settings import load_settings
from mx_strategies.verify.tensor_bytes import same_bytes

DROPPED = "was proven wrong by this load (the model-side check failed) and was dropped: the next load asks the module again"


class ReadingModel(torch.nn.Module):
    """Real parameters, one per checkpoint tensor; ``load_weights`` copies each and returns the parameter names it
    wrote, as vLLM's models do (a tensor it does not hold fails the load). robust can ask it what it reads."""

    def __init__(self, reference: dict[str, torch.Tensor]) -> None:
        super().__init__()
        self.held = torch.nn.ParameterDict(
            {self.key(n): torch.nn.Parameter(torch.zeros_like(t), requires_grad=False) for n, t in reference.items()}
        )

    @staticmethod
    def key(name: str) -> str:
        return name.replace(".", "__")

    def load_weights(self, weights) -> set[str]:
        loaded = set()
        for name, tensor in weights:
            self.held[self.key(name)].data.copy_(tensor)
            loaded.add(f"held.{self.key(name)}")
        return loaded


@pytest.fixture
def checkpoint(tmp_path, monkeypatch):
    """Two real safetensors shards (six tensors of mixed dtypes) that MX_MODEL_URI points at, and a kept-answers
    folder of the test's own."""
    ckpt = write_checkpoint(str(tmp_path / "ckpt"), tiny_shards(2))
    monkeypatch.setenv("MX_MODEL_URI", ckpt.path)
    monkeypatch.setenv("MX_ROBUST_READS_CACHE_DIR", str(tmp_path / "kept"))
    return ckpt


def start(ckpt):
    """One start of the engine: a model built, ModelExpress's chain run; (the model loaded, adapter, robust's report)."""
    make = lambda: ReadingModel(ckpt.reference)  # noqa: E731
    adapter = FolderNativeAdapter(make, ckpt.path)
    clear_reports()
    model = LoadStrategyChain.run(make(), make_context(model_config(model=ckpt.path), adapter))
    (report,) = recent_reports()
    return model, adapter, report


def assert_whole(model: ReadingModel, ckpt) -> None:
    """Every weight equal to safetensors' own load of the checkpoint."""
    truth = reference_tensors(ckpt.path)
    assert len(model.held) == len(truth) == 6
    for name, expected in truth.items():
        held = model.held[ReadingModel.key(name)]
        assert held.dtype == expected.dtype and same_bytes(held.data, expected), name


def kept_files(tmp_path) -> list:
    return sorted((tmp_path / "kept").glob("*.json"))


def test_a_kept_answer_the_load_proves_wrong_costs_one_failed_load(checkpoint, tmp_path, robust, caplog):
    caplog.set_level(logging.INFO)
    model, adapter, report = start(checkpoint)  # the first start ever: the module is asked, its answer kept
    assert report["outcome"] == "loaded" and report["selection_source"] == "dry_run" and not report["selection_cached"]
    (kept,) = kept_files(tmp_path)
    answer = json.loads(kept.read_text())
    assert answer["left_out"] == {} and answer["module_class"].endswith(".ReadingModel")
    # The answer, edited on the shared volume to leave out two tensors the module reads.
    left_out = sorted(checkpoint.reference)[:2]
    answer["left_out"] = {name: module_reads._FED_NOT_READ for name in left_out}
    kept.write_text(json.dumps(answer))

    # Start 1: robust streams what the kept answer says, the model-side check finds the two parameters unwritten,
    # the chain rebuilds the model and its next strategy loads it. The kept answer is gone, and the log says so.
    caplog.clear()
    model, adapter, report = start(checkpoint)
    assert report["outcome"] == "failed" and report["mutated"] is True
    assert report["error"].startswith("target model incomplete: 2 of 6 parameters it keeps were not written")
    assert adapter.reinit_calls == 1 and adapter.native_calls == 1
    assert any("Strategy robust_model_streamer failed, trying next" in m for m in messages(caplog, CHAIN_LOGGER))
    assert_whole(model, checkpoint)  # ModelExpress's default strategy loaded it
    assert kept_files(tmp_path) == []
    assert [r.getMessage() for r in caplog.records if r.name == STRATEGY_LOGGER and "proven wrong" in r.getMessage()] == [
        f"[Worker 0] kept answer {kept} ({answer['module_class']}) {DROPPED}"
    ]
    assert [r.levelno for r in caplog.records if DROPPED in r.getMessage()] == [logging.WARNING]

    # Start 2: robust asks the module again and loads whole, without a rebuild; the answer is kept anew.
    caplog.clear()
    model, adapter, report = start(checkpoint)
    assert report["outcome"] == "loaded" and report["selection_source"] == "dry_run" and not report["selection_cached"]
    assert adapter.reinit_calls == 0 and adapter.native_calls == 0 and report["tensors"] == 6
    assert_whole(model, checkpoint)
    assert kept_files(tmp_path) == [kept] and json.loads(kept.read_text())["left_out"] == {}

    # Start 3: the new kept answer, whole again.
    model, adapter, report = start(checkpoint)
    assert report["outcome"] == "loaded" and report["selection_cached"]
    assert adapter.reinit_calls == 0 and adapter.native_calls == 0 and report["tensors"] == 6
    assert_whole(model, checkpoint)
    assert DROPPED not in caplog.text


def test_a_kept_answer_that_cannot_be_read_is_ignored_and_written_again(checkpoint, tmp_path, robust):
    start(checkpoint)
    (kept,) = kept_files(tmp_path)
    kept.write_text('{"format": 1, "key": "')  # cut short: a pod that died mid-write on a volume without rename
    model, adapter, report = start(checkpoint)
    assert report["outcome"] == "loaded" and not report["selection_cached"] and adapter.reinit_calls == 0
    assert_whole(model, checkpoint)
    assert json.loads(kept.read_text())["left_out"] == {}  # asked, and kept whole again


def _kept_answer(tmp_path, checkpoint) -> module_reads.ModuleReads:
    """What the module answers for ``checkpoint``, read back from its kept file (the module asked first)."""
    from mx_strategies.inspect.sources import Candidate, probe

    settings = load_settings()
    ckpt = probe(Candidate("explicit", checkpoint.path), settings)
    model = ReadingModel(checkpoint.reference)
    context = ("stand-in", 0, "target", 1, 1, 0)
    assert not module_reads.ask_cached(model, ckpt, settings, context).cached
    answer = module_reads.ask_cached(model, ckpt, settings, context)
    assert answer.cached and answer.kept_key and kept_files(tmp_path) == [reads_cache._path_of(tmp_path / "kept", answer.kept_key)]
    return answer


def test_a_kept_answer_that_cannot_be_dropped_is_named_and_the_load_goes_on(checkpoint, tmp_path):
    """Never raises: a file gone already is gone; a folder that cannot be written is named, with what to do."""
    answer = _kept_answer(tmp_path, checkpoint)
    warnings: list[str] = []
    module_reads.drop_disproved(answer, load_settings(), warnings.append)
    assert kept_files(tmp_path) == [] and len(warnings) == 1 and warnings[0].endswith(DROPPED)
    warnings.clear()
    module_reads.drop_disproved(answer, load_settings(), warnings.append)  # another pod dropped it first
    assert len(warnings) == 1 and warnings[0].endswith(DROPPED)

    # The folder is not one this process can remove a file from (a file where the folder should be: root can
    # write any directory, so a read-only mode would not stop this test's user).
    (tmp_path / "kept").rmdir()
    (tmp_path / "kept").write_text("not a folder")
    path, why = reads_cache.drop(tmp_path / "kept", answer.kept_key)
    assert path == tmp_path / "kept" / f"{answer.kept_key}.json" and why.startswith("NotADirectoryError")
    warnings.clear()
    module_reads.drop_disproved(answer, load_settings(), warnings.append)
    assert len(warnings) == 1 and "but could not be dropped (NotADirectoryError" in warnings[0]
    assert "delete the file, or point MX_ROBUST_READS_CACHE_DIR at a folder this process can write" in warnings[0]


def test_an_answer_asked_by_the_load_or_no_answer_drops_nothing(checkpoint, tmp_path):
    """Only a kept answer is proven wrong by a load: the module asked again would answer the same."""
    answer = _kept_answer(tmp_path, checkpoint)
    warnings: list[str] = []
    for asked in (None, module_reads.Unanswered("x", "declined"), module_reads.ModuleReads(answer.names, "dry_run")):
        module_reads.drop_disproved(asked, load_settings(), warnings.append)
    assert warnings == [] and len(kept_files(tmp_path)) == 1
    assert reads_cache.drop(None, answer.kept_key) == (None, None)  # the cache is off

"""runai reads ahead while the module is asked; nothing reaches the model before the answer admits it.

vLLM 0.32's real ``DeepseekV3ForCausalLM`` and ``DeepSeekMTP`` load through ModelExpress's real chain with
robust, from real safetensors files, with real runai. The read-ahead starts on the head of the load the
engine's rules foresee (doctor's plan: for DeepSeek-V3's target, which has no table row, the whole
checkpoint) before the module is asked. What the user checks:

- the model receives exactly the answered plan's tensors, with safetensors' own values, whether the
  read-ahead held all of them or some of them (the rest streamed after it); a layer the module does not
  hold (the target's MTP layer) is not read ahead (what the answer drops of a read-ahead:
  tests/test_streaming.py);
- a load refused on the answer (a stacked parameter filled in part) is refused with a read-ahead
  running, ``mutated=False``, the model untouched, and the read-ahead closed;
- ``MX_ROBUST_READ_AHEAD_BYTES=0`` reads nothing ahead.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

pytest.importorskip("vllm")

from modelexpress.adapter import StrategyFailed  # noqa: E402
from modelexpress.engines.vllm import adapter as vllm_adapter_module  # noqa: E402
from modelexpress.engines.vllm.adapter import build_vllm_load_context  # noqa: E402
from modelexpress.load_strategy import LoadResult  # noqa: E402
from mtp_arch.checkpoints import write_checkpoint  # noqa: E402
from test_mtp_architectures import (  # noqa: E402
    CpuVllmAdapter,
    load_draft,
    load_target,
    nbytes,
    observe,
    target_and_draft_checkpoint,
    vllm_cpu,  # noqa: F401 - the module's fixture
)

from mx_strategies.robust import RobustModelStreamerStrategy  # noqa: E402
from mx_strategies.stream import read_ahead as read_ahead_module  # noqa: E402
from mx_strategies.verify.tensor_bytes import same_bytes  # noqa: E402


@pytest.fixture
def read_aheads(monkeypatch):
    """Every ReadAhead a load makes: its head's names, whether it started, and whether it was closed."""
    made = []
    real_enter, real_close = read_ahead_module.ReadAhead.__enter__, read_ahead_module.ReadAhead.close

    def entering(self):
        entered = real_enter(self)
        made.append({"ahead": self, "names": list(self.plan.expected) if self.plan else [], "started": self.live,
                     "closed": False})  # fmt: skip
        return entered

    def closing(self):
        real_close(self)
        for entry in made:
            if entry["ahead"] is self:
                entry["closed"] = True

    monkeypatch.setattr(read_ahead_module.ReadAhead, "__enter__", entering)
    monkeypatch.setattr(read_ahead_module.ReadAhead, "close", closing)
    return made


def plan_order(folder: str) -> list[tuple[str, int]]:
    """The checkpoint's tensors in load order (shards in natural order, tensors by offset), with their bytes,
    read from the safetensors headers themselves."""
    order = []
    for path in sorted(Path(folder).glob("*.safetensors")):
        with open(path, "rb") as handle:
            header = json.loads(handle.read(struct.unpack("<Q", handle.read(8))[0]))
        header.pop("__metadata__", None)
        for name, entry in sorted(header.items(), key=lambda item: item[1]["data_offsets"][0]):
            order.append((name, entry["data_offsets"][1] - entry["data_offsets"][0]))
    return order


def test_the_target_reads_ahead_the_layers_it_holds_and_not_its_drafts(
    tmp_path, robust, monkeypatch, vllm_cpu, read_aheads  # noqa: F811
):
    """Foreseen without the question, DeepSeek-V3's target (no table row) would stream the whole checkpoint;
    its own parameters hold no layer N (the MTP layer), so that layer is not read ahead, and what is read
    ahead is exactly what its module then reads."""
    folder, _, _, (target, vc, config, truth, tensors), mtp = target_and_draft_checkpoint("deepseek_v3", tmp_path)
    loaded, seen, report = load_target(monkeypatch, folder, target, vc, config)
    assert loaded is target and report["outcome"] == "loaded"
    (entry,) = read_aheads
    assert entry["started"] and entry["closed"]
    assert sorted(entry["names"]) == sorted(tensors) == sorted(seen["names"])
    assert report["read_ahead_bytes"] == report["bytes_streamed"] == sum(nbytes(t) for t in tensors.values())
    assert report["read_ahead_discarded_bytes"] == 0
    assert report["left_out"] == len(mtp)  # the MTP layer: the draft's, not streamed for the target
    wrong = [n for n, p in target.named_parameters() if not same_bytes(p.data, truth[n])]
    assert not wrong, wrong


def test_a_head_smaller_than_the_load_is_followed_by_the_rest(tmp_path, robust, monkeypatch, vllm_cpu, read_aheads):  # noqa: F811
    """One tensor read ahead (a budget smaller than the first tensor still reads that one), the rest after it."""
    monkeypatch.setenv("MX_ROBUST_READ_AHEAD_BYTES", "1")
    folder, _, _, (target, vc, config, truth, tensors), mtp = target_and_draft_checkpoint("deepseek_v3", tmp_path)
    (first, first_bytes), *_ = plan_order(folder)
    assert first in tensors  # read by the target
    loaded, seen, report = load_target(monkeypatch, folder, target, vc, config)
    assert loaded is target
    (entry,) = read_aheads
    assert entry["names"] == [first] and entry["started"]
    assert report["read_ahead_bytes"] == first_bytes and report["read_ahead_discarded_bytes"] == 0
    assert sorted(seen["names"]) == sorted(tensors) and len(seen["names"]) == len(set(seen["names"]))
    wrong = [n for n, p in target.named_parameters() if not same_bytes(p.data, truth[n])]
    assert not wrong, wrong


def test_the_draft_reads_ahead_its_own_layer_and_nothing_of_the_target(tmp_path, robust, monkeypatch, vllm_cpu, read_aheads):  # noqa: F811
    """DeepSeekMTP on the target's checkpoint: foreseen by the conventions (its class has no row), the same
    tensors its module answers; nothing read ahead is dropped."""
    built, ckpt, seen, loaded, reports = load_draft("deepseek_v3", tmp_path, monkeypatch)
    assert loaded is built.module
    (report,) = reports
    (entry,) = read_aheads
    assert sorted(entry["names"]) == sorted(seen["names"])
    assert report["read_ahead_bytes"] == report["bytes_streamed"] > 0
    assert report["read_ahead_discarded_bytes"] == 0
    assert report["bytes_streamed"] < report["checkpoint_bytes"]


def test_a_load_refused_on_the_answer_is_refused_untouched_with_the_read_ahead_closed(
    tmp_path, monkeypatch, vllm_cpu, read_aheads  # noqa: F811
):
    folder, _, _, (target, vc, config, truth, tensors), mtp = target_and_draft_checkpoint("deepseek_v3", tmp_path)
    missing = "model.layers.0.mlp.up_proj.weight"
    write_checkpoint(folder, {n: t for n, t in {**tensors, **mtp}.items() if n != missing}, shards=3)
    monkeypatch.setenv("MX_MODEL_URI", folder)
    monkeypatch.setattr(vllm_adapter_module, "VllmAdapter", CpuVllmAdapter)
    seen = observe(target)
    before = {n: p.detach().clone() for n, p in target.named_parameters()}
    with pytest.raises(StrategyFailed) as failure:
        RobustModelStreamerStrategy().load(LoadResult(value=target, model=target), build_vllm_load_context(vc, config))
    assert failure.value.mutated is False
    assert "rows 128-255 of model.layers.0.mlp.gate_up_proj.weight" in str(failure.value)
    (entry,) = read_aheads
    assert entry["started"] and entry["closed"] and sorted(entry["names"]) == sorted(n for n in tensors if n != missing)
    assert seen["names"] == []
    assert all(same_bytes(p.detach(), before[n]) for n, p in target.named_parameters())


def test_no_read_ahead_when_it_is_switched_off(tmp_path, robust, monkeypatch, vllm_cpu, read_aheads):  # noqa: F811
    monkeypatch.setenv("MX_ROBUST_READ_AHEAD_BYTES", "0")
    folder, _, _, (target, vc, config, truth, tensors), mtp = target_and_draft_checkpoint("deepseek_v3", tmp_path)
    loaded, seen, report = load_target(monkeypatch, folder, target, vc, config)
    assert loaded is target
    assert [entry["started"] for entry in read_aheads] == [False]
    assert report["read_ahead_bytes"] == 0 and report["read_ahead_discarded_bytes"] == 0
    assert sorted(seen["names"]) == sorted(tensors)

"""mx_strategies.verify.after: a tensor counts as written when any name it has was reported.

Plain torch modules built the ways vLLM's classes register tensors: a module
held by two parents (vLLM's Transformers backend holds a MoE block's
``gate`` as ``mlp.gate`` and ``mlp.experts.gate``), tied parameters, a
buffer registered twice, two parameters over one storage. The real classes
are in tests/test_target_conformance.py; these pin each case down.
"""

from __future__ import annotations

import pytest
import torch

from mx_strategies.verify.after import LoadedNames, check
from mx_strategies.verify.kept import _required_names, required_tensors
from mx_strategies.errors import IncompleteModel


def _check(model, names, **kwargs):
    return check(model, LoadedNames(names=set(names), calls=1), role="target", policy="fail", **kwargs)


class MoEBlock(torch.nn.Module):
    """As vLLM's Transformers backend leaves a MoE block: ``experts`` (registered first) holds the gate too."""

    def __init__(self) -> None:
        super().__init__()
        gate = torch.nn.Linear(4, 2, bias=False)
        self.experts = torch.nn.Module()
        self.experts.gate = gate
        self.experts.w = torch.nn.Parameter(torch.ones(2, 4))
        self.gate = gate


def test_a_module_held_by_two_parents_is_written_under_either_name():
    block = MoEBlock()
    # named_parameters() keeps the first name it meets; load_weights reports the other.
    assert "experts.gate.weight" in dict(block.named_parameters())
    (gate,) = [r for r in required_tensors(block) if r.name == "experts.gate.weight"]
    assert gate.aliases == ("experts.gate.weight", "gate.weight")
    assert _check(block, {"gate.weight", "experts.w"}).complete
    assert _check(block, {"experts.gate.weight", "experts.w"}).complete
    with pytest.raises(IncompleteModel, match=r"1 of 2 parameters .*: experts\.gate\.weight \("):
        _check(block, {"experts.w"})


def test_tied_parameters_are_one_tensor():
    model = torch.nn.Module()
    model.embed = torch.nn.Embedding(8, 4)
    model.head = torch.nn.Linear(4, 8, bias=False)
    model.head.weight = model.embed.weight
    assert _required_names(model) == {"embed.weight": "parameter"}
    assert _check(model, {"head.weight"}).complete
    assert _check(model, {"embed.weight"}).complete


def test_a_buffer_registered_twice_and_a_non_persistent_one():
    model = torch.nn.Module()
    model.a, model.b = torch.nn.Module(), torch.nn.Module()
    bias = torch.zeros(3)
    model.a.register_buffer("bias", bias)
    model.b.register_buffer("bias", bias)
    model.a.register_buffer("cache", torch.zeros(3), persistent=False)
    assert _required_names(model) == {"a.bias": "buffer"}
    assert _check(model, {"b.bias"}).complete
    # Persistent buffers are checked (vLLM's own check looks at parameters only): deliberate, a
    # checkpoint carries them (DeepSeek's e_score_correction_bias, Gemma-4's layer_scalar).
    with pytest.raises(IncompleteModel, match=r"1 of 1 buffers .*: a\.bias"):
        _check(model, set())


def test_two_parameters_over_one_storage():
    model = torch.nn.Module()
    fused = torch.zeros(6, 4)
    model.qkv = torch.nn.Parameter(fused)
    model.part = torch.nn.Module()
    model.part.q = torch.nn.Parameter(fused[:2])  # a view of the first rows
    # Writing the whole writes the part; writing the part does not write the whole.
    assert _check(model, {"qkv"}).complete
    with pytest.raises(IncompleteModel, match=r"1 of 2 parameters .*: qkv \("):
        _check(model, {"part.q"})


def test_what_the_engine_fills_is_exempt_under_any_alias():
    block = MoEBlock()
    result = _check(block, {"experts.w"}, filled_by_engine=lambda name: name == "gate.weight")
    assert result.complete and result.exempt == ["experts.gate.weight"]


def test_empty_placeholders_and_kv_scales_are_not_required():
    model = torch.nn.Module()
    model.w = torch.nn.Parameter(torch.ones(2))
    model.placeholder = torch.nn.Parameter(torch.empty(0))
    model.register_buffer("_k_scale", torch.ones(()))
    assert _required_names(model) == {"w": "parameter"}
    assert _check(model, {"w"}).complete


def test_a_missing_tensor_is_still_named():
    block = MoEBlock()
    with pytest.raises(IncompleteModel) as failure:
        _check(block, {"gate.weight"})
    assert str(failure.value) == (
        "target model incomplete: 1 of 2 parameters it keeps were not written from the checkpoint: experts.w "
        "(MX_ROBUST_MODEL_COMPLETENESS=warn accepts this)"
    )
    assert failure.value.mutated is True


def test_stricter_than_vllm_on_layers_with_a_quant_method_deliberately():
    """vLLM's default loader exempts every module with a quant method on an unquantized model (every
    linear layer has one: ``UnquantizedLinearMethod``), so it accepts a linear weight ``load_weights``
    never wrote. We require it: an unwritten linear weight is a wrong model (a LongCat draft's
    missed ``mtp`` weights kept their init values). Shown with vLLM's own check."""
    pytest.importorskip("vllm", reason="vLLM not installed (MX_TEST_SKIP_VLLM=1?)")
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod
    from vllm.model_executor.model_loader.default_loader import DefaultModelLoader
    from vllm.config import LoadConfig

    model = torch.nn.Module()
    model.proj = torch.nn.Linear(4, 4, bias=False)
    model.proj.quant_method = UnquantizedLinearMethod()
    model.norm = torch.nn.Module()
    model.norm.weight = torch.nn.Parameter(torch.ones(4))
    DefaultModelLoader(LoadConfig()).track_weights_loading(model, {"norm.weight"})  # vLLM: accepted
    with pytest.raises(IncompleteModel, match=r"1 of 2 parameters .*: proj\.weight"):
        _check(model, {"norm.weight"})

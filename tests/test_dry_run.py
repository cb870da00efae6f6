"""The dry run (mx_strategies.select.dry_run) on plain torch modules: what it records, and that it never touches the model.

vLLM's and SGLang's real classes are asked in tests/test_module_reads.py and tests/sglang_suite; these
modules are the smallest that show each rule (the loaders vLLM's classes use: a copy into the
parameter, a narrow into a stacked one, ``.item()`` for a scalar).
"""

from __future__ import annotations

import time

import pytest
import torch

from mx_strategies.select.dry_run import DryRunFailed, dry_run


class Stacked(torch.nn.Module):
    """q/k/v stacked into one parameter, a norm copied whole, a scalar through ``.item()``, one name skipped."""

    def __init__(self):
        super().__init__()
        self.qkv = torch.nn.Parameter(torch.arange(24, dtype=torch.float32).reshape(6, 4))
        self.norm = torch.nn.Parameter(torch.ones(4, dtype=torch.bfloat16))
        self.scale = torch.nn.Parameter(torch.tensor([2.0]))
        self.register_buffer("table", torch.arange(3))
        self.stale = None  # a reference a buggy loader keeps to a real tensor

    def load_weights(self, weights):
        loaded = set()
        params = dict(self.named_parameters())
        for name, tensor in weights:
            if name.startswith("skipped."):
                continue
            if name in ("q", "k", "v"):
                offset = "qkv".index(name) * 2
                params["qkv"].data.narrow(0, offset, 2).copy_(tensor)
                loaded.add("qkv")
            elif name == "scale":
                params["scale"].data.fill_(tensor.item())
                loaded.add(name)
            elif name == "stale" and self.stale is not None:
                self.stale.copy_(tensor)
            else:
                params[name].data.copy_(tensor)
                loaded.add(name)
        return loaded


HEADERS = {
    "q": ((2, 4), torch.float32),
    "k": ((2, 4), torch.float32),
    "v": ((2, 4), torch.float32),
    "norm": ((4,), torch.bfloat16),
    "scale": ((1,), torch.float32),
    "skipped.extra": ((0,), torch.float16),
}


def snapshot(model):
    """Every parameter and buffer: the object, its storage and its bytes."""
    return {
        name: (tensor, tensor.data_ptr(), tensor.detach().clone())
        for name, tensor in list(model.named_parameters()) + list(model.named_buffers())
    }


def assert_untouched(model, before):
    after = dict(list(model.named_parameters()) + list(model.named_buffers()))
    assert set(after) == set(before)
    for name, (tensor, pointer, data) in before.items():
        assert after[name] is tensor and tensor.data_ptr() == pointer and not tensor.is_meta, name
        assert torch.equal(tensor.detach().view(torch.uint8), data.view(torch.uint8)), name


def test_records_what_the_model_reads_and_where_it_goes_without_touching_it():
    model = Stacked()
    before = snapshot(model)
    run = dry_run(model, HEADERS, timeout_s=30)
    assert_untouched(model, before)
    assert run.read == {"q", "k", "v", "norm", "scale"}  # the skipped name was never used
    assert run.written == {"q": {"qkv"}, "k": {"qkv"}, "v": {"qkv"}, "norm": {"norm"}, "scale": {"scale"}}
    assert run.full == {"q": False, "k": False, "v": False, "norm": True, "scale": True}  # a third of qkv each
    assert run.returned == {"qkv", "norm", "scale"} and run.fed == len(HEADERS)


STALE: dict = {}  # a module-level reference to a real tensor, outside the module tree: the twin cannot reach it


def test_a_write_into_a_real_tensor_is_refused_before_it_happens():
    class Global(Stacked):
        def load_weights(self, weights):
            for _, tensor in weights:
                STALE["norm"].copy_(tensor)

    model = Global()
    STALE["norm"] = model.norm.data
    before = snapshot(model)
    with pytest.raises(DryRunFailed, match="wrote into a tensor that is not the twin's"):
        dry_run(model, {"stale": ((4,), torch.bfloat16)}, timeout_s=30)
    assert_untouched(model, before)


def test_a_reference_the_module_keeps_to_its_own_parameter_is_the_twins():
    """A loader that writes through an attribute holding its own parameter (outside ``_parameters``)
    writes into the twin: the question answers, and the model is as before."""
    model = Stacked()
    object.__setattr__(model, "stale", model.norm)
    before = snapshot(model)
    run = dry_run(model, {"stale": ((4,), torch.bfloat16)}, timeout_s=30)
    assert_untouched(model, before)
    assert run.read == {"stale"} and run.written == {"stale": {"norm"}}


class Keeps(Stacked):
    """A module that keeps state of what it was handed, in place (plugin models do; vLLM 0.34 marks shards)."""

    def __init__(self):
        super().__init__()
        self.seen: list[str] = []
        self.counts = {"calls": 0}
        self.qkv.loaded_shard_ids = {}  # vLLM 0.34's per-shard marks live on the parameter
        self.qkv.weight_loader = self.mark  # a bound method of the module, as vLLM's parameters hold

    def mark(self, param, tensor, shard):
        param.loaded_shard_ids.setdefault("weight", []).append(shard)
        param.data.narrow(0, "qkv".index(shard) * 2, 2).copy_(tensor)
        self.seen.append(shard)

    def load_weights(self, weights):
        self.counts["calls"] += 1
        for name, tensor in weights:
            if name in ("q", "k", "v"):
                self.qkv.weight_loader(self.qkv, tensor, name)
            elif name == "norm":
                self.norm.data.copy_(tensor)
        return {"qkv", "norm"}


def test_what_load_weights_changes_in_place_stays_on_the_twin():
    from helpers.state import differences, module_state

    model = Keeps()
    before, state = snapshot(model), module_state(model)
    run = dry_run(model, HEADERS, timeout_s=30)
    assert_untouched(model, before)
    assert module_state(model) == state, differences(state, module_state(model))
    assert model.seen == [] and model.counts == {"calls": 0} and model.qkv.loaded_shard_ids == {}
    assert model.qkv.weight_loader.__self__ is model  # the parameter's loader is still bound to the model
    assert run.written["q"] == {"qkv"} and run.read >= {"q", "k", "v", "norm"}


def test_the_state_check_sees_what_a_load_changes_in_place():
    """The check the sweeps use (tests/helpers/state.py) fails on each trace a real load_weights leaves."""
    from helpers.state import module_state

    model = Keeps()
    state = module_state(model)
    model.load_weights((name, torch.ones(shape, dtype=dtype)) for name, (shape, dtype) in HEADERS.items())
    assert module_state(model) != state
    for change in (lambda m: m.seen.append("q"), lambda m: m.counts.update(calls=1),
                   lambda m: m.qkv.loaded_shard_ids.setdefault("weight", []).append("q")):  # fmt: skip
        fresh = Keeps()
        state = module_state(fresh)
        change(fresh)
        assert module_state(fresh) != state


def test_each_write_records_the_region_it_fills():
    from mx_strategies.verify.coverage import Layout, Write

    run = dry_run(Stacked(), HEADERS, timeout_s=30)
    assert run.layouts["qkv"] == Layout((6, 4), (4, 1), 0)
    qkv = sorted((w for w in run.writes if w.param == "qkv"), key=lambda w: w.view.offset)
    assert qkv == [
        Write("qkv", Layout((2, 4), (4, 1), 0), frozenset({"q"})),
        Write("qkv", Layout((2, 4), (4, 1), 8), frozenset({"k"})),
        Write("qkv", Layout((2, 4), (4, 1), 16), frozenset({"v"})),
    ]
    assert Write("scale", Layout((1,), (1,), 0), frozenset({"scale"})) in run.writes  # through .item() and fill_


def test_an_indexed_assignment_records_the_element_it_fills_not_the_parameter():
    """``param.data[expert] = scale`` (ModelOpt NVFP4's per-expert scales in vLLM's FusedMoE): each write is its
    own element, so no expert's scale stands for the others' and a missing one leaves a gap; an advanced index
    (a list) selects no view and counts as the whole parameter, as before."""
    from mx_strategies.verify.after import watched
    from mx_strategies.verify.coverage import Layout, Write, gaps

    class PerExpert(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.scales = torch.nn.Parameter(torch.zeros(4, 2))

        def load_weights(self, weights):
            for name, tensor in weights:
                expert, shard = (int(part) for part in name.split(".")[1:3])
                if shard == 9:
                    self.scales.data[[expert]] = tensor
                else:
                    self.scales.data[expert][shard] = tensor
            return {"scales"}

    headers = {f"experts.{e}.{s}": ((), torch.float32) for e in range(4) for s in range(2) if (e, s) != (2, 1)}
    run = dry_run(PerExpert(), headers, timeout_s=30)
    assert Write("scales", Layout((), (), 3), frozenset({"experts.1.1"})) in run.writes
    assert run.read == frozenset(headers)  # none stands for another
    (gap,) = gaps(run.layouts, run.writes, streamed=lambda name: True)
    assert (gap.param, gap.missing, gap.missing_elements) == ("scales", ("[2, 1:2]",), 1)
    advanced = dry_run(PerExpert(), {"experts.0.9": ((2,), torch.float32)}, timeout_s=30)
    assert advanced.writes == (Write("scales", Layout((4, 2), (2, 1), 0), frozenset({"experts.0.9"})),)

    # What the load really writes (verify.after.watched): the same regions.
    model = PerExpert()
    with watched(model, {"scales": Layout((4, 2), (2, 1), 0)}) as written:
        model.load_weights((name, torch.ones(())) for name in headers)
    assert sorted(w.view.offset for w in written.writes) == [0, 1, 2, 3, 4, 6, 7]
    assert gaps(run.layouts, written.writes, streamed=lambda name: True)[0].missing == ("[2, 1:2]",)


def test_a_module_that_cannot_be_copied_is_not_asked():
    class Locked(Stacked):
        def __init__(self, path):
            super().__init__()
            self.lock = open(path, "rb")  # an open file: no copy of it can be made

    model = Locked(__file__)
    before = snapshot(model)
    with pytest.raises(DryRunFailed, match=r"no isolated copy of the module could be made to ask: Locked\.lock"):
        dry_run(model, HEADERS, timeout_s=30)
    assert_untouched(model, before)
    model.lock.close()


def test_a_class_that_needs_real_values_fails_and_the_model_is_as_before():
    class NeedsValues(Stacked):
        def load_weights(self, weights):
            for _, tensor in weights:
                self.norm.data.copy_(torch.from_numpy(tensor.float().numpy()))

    model = NeedsValues()
    before = snapshot(model)
    with pytest.raises(DryRunFailed):
        dry_run(model, {"norm": ((4,), torch.bfloat16)}, timeout_s=30)
    assert_untouched(model, before)


def test_it_is_bounded_in_time():
    class Slow(Stacked):
        def load_weights(self, weights):
            for _, tensor in weights:
                time.sleep(0.05)
                self.norm.data.copy_(tensor)

    model = Slow()
    before = snapshot(model)
    started = time.perf_counter()
    with pytest.raises(DryRunFailed, match="took longer than its time bound"):
        dry_run(model, {f"n{i}": ((4,), torch.bfloat16) for i in range(1000)}, timeout_s=0.2)
    assert time.perf_counter() - started < 5
    assert_untouched(model, before)


def test_a_tied_parameter_stays_tied_and_both_names_are_known():
    class Tied(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(8, 4)
            self.head = torch.nn.Linear(4, 8, bias=False)
            self.head.weight = self.embed.weight

        def load_weights(self, weights):
            params = dict(self.named_parameters(remove_duplicate=False))
            for name, tensor in weights:
                assert params["head.weight"] is params["embed.weight"]  # the tie holds inside the dry run
                params[name].data.copy_(tensor)

    model = Tied()
    before = snapshot(model)
    run = dry_run(model, {"embed.weight": ((8, 4), torch.float32)}, timeout_s=30)
    assert_untouched(model, before)
    assert model.head.weight is model.embed.weight
    assert run.written == {"embed.weight": {"embed.weight", "head.weight"}}


def test_no_load_weights_nothing_to_ask():
    with pytest.raises(DryRunFailed, match="no load_weights"):
        dry_run(torch.nn.Linear(2, 2), {}, timeout_s=1)


def test_tensors_a_load_weights_derives_onto_its_modules_are_put_back():
    """SGLang's DeepSeek keeps w_kc / w_vc, made from kv_b_proj, as module attributes: after a dry run they
    must be what they were (here: absent), not meta tensors."""

    class Derives(Stacked):
        def load_weights(self, weights):
            for _, tensor in weights:
                self.norm.data.copy_(tensor)
            self.derived = self.norm.data * 2  # a bare tensor attribute, as post_load_weights makes them

    model = Derives()
    before = snapshot(model)
    dry_run(model, {"norm": ((4,), torch.bfloat16)}, timeout_s=30)
    assert_untouched(model, before)
    assert "derived" not in model.__dict__


def test_the_question_holds_the_garbage_collector_off_and_leaves_it_as_it_was():
    """module_reads.ask runs with the cyclic collector off (a full collection over an engine's heap cost the
    question up to a second, at random), and leaves it as it found it, also when the question raises."""
    import gc

    from mx_strategies.select.module_reads import _collector_paused

    seen = []

    def question(fail=False):
        seen.append(gc.isenabled())
        if fail:
            raise RuntimeError("the question failed")

    paused = _collector_paused(question)
    try:
        for enabled in (True, False):
            (gc.enable if enabled else gc.disable)()
            paused()
            assert gc.isenabled() is enabled
            with pytest.raises(RuntimeError):
                paused(fail=True)
            assert gc.isenabled() is enabled
    finally:
        gc.enable()
    assert seen == [False] * 4

"""mx_strategies.verify.coverage: which elements of a parameter a set of writes reaches, against torch's own indexing.

Each case writes into views of a parameter made by torch itself (slices, ``narrow``, a transpose, an
expert's rows of a 3-D ``w13``) and compares what :func:`coverage.unwritten` says is left with a boolean
mask torch fills through the very same views. The descriptions a user reads are checked on the layouts
vLLM uses.
"""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from mx_strategies.verify import coverage
from mx_strategies.verify.coverage import Layout, Write


def layout_of(tensor: torch.Tensor) -> Layout:
    return Layout(tuple(tensor.shape), tuple(tensor.stride()), tensor.storage_offset())


@st.composite
def parameter_and_views(draw):
    shape = tuple(draw(st.lists(st.integers(1, 5), min_size=1, max_size=3)))
    views = []
    for _ in range(draw(st.integers(0, 4))):
        index = []
        for size in shape:
            start = draw(st.integers(0, size - 1))
            stop = draw(st.integers(start, size))
            index.append(slice(start, stop))
        views.append((tuple(index), draw(st.booleans())))
    return shape, views


@settings(max_examples=300, deadline=None)
@given(parameter_and_views())
def test_what_is_left_unwritten_is_what_torch_leaves_unwritten(case):
    shape, views = case
    param = torch.zeros(shape, dtype=torch.int32)
    mask = torch.zeros(shape, dtype=torch.bool)
    written = []
    for index, transposed in views:
        view = param[index]
        if transposed and view.dim() >= 2:
            view = view.transpose(0, 1)  # the same elements, through other strides
        written.append(layout_of(view))
        flat = mask.view(-1)
        torch.as_strided(flat, view.shape, view.stride(), view.storage_offset()).fill_(True)
    left = coverage._unwritten(layout_of(param), written)
    expected = [i for i, done in enumerate(mask.view(-1).tolist()) if not done]
    assert [i for a, b in left for i in range(a, b)] == expected


def test_a_stacked_parameter_missing_its_second_member_names_its_rows():
    gate_up = torch.empty(64, 16)
    gate = Write("mlp.gate_up_proj.weight", layout_of(gate_up.narrow(0, 0, 32)), frozenset({"mlp.gate_proj.weight"}))
    (gap,) = coverage.gaps({"mlp.gate_up_proj.weight": layout_of(gate_up)}, [gate], streamed=lambda n: True,
                           present=lambda n: n == "mlp.gate_proj.weight")  # fmt: skip
    assert gap.describe() == (
        "rows 32-63 of mlp.gate_up_proj.weight [64, 16] (512 element(s)) would keep init values; the checkpoint lacks "
        "mlp.up_proj.weight (written only by mlp.gate_proj.weight)"
    )


def test_one_experts_missing_half_of_w13_is_named_by_its_index():
    w13 = torch.empty(4, 8, 3)
    writes = [
        Write("experts.w13_weight", layout_of(w13[e].narrow(0, half * 4, 4)), frozenset({f"experts.{e}.{proj}.weight"}))
        for e in range(4)
        for half, proj in enumerate(("gate_proj", "up_proj"))
        if (e, proj) != (2, "up_proj")
    ]
    (gap,) = coverage.gaps({"experts.w13_weight": layout_of(w13)}, writes, streamed=lambda n: True,
                           present=lambda n: n != "experts.2.up_proj.weight")  # fmt: skip
    assert gap.missing == ("[2, 4:8, :]",) and gap.would_fill == ("experts.2.up_proj.weight",)


def test_a_write_of_a_name_that_does_not_stream_does_not_count():
    norm = torch.empty(4)
    write = Write("norm.weight", layout_of(norm), frozenset({"norm.weight"}))
    assert coverage.gaps({"norm.weight": layout_of(norm)}, [write], streamed=lambda n: True) == []
    (gap,) = coverage.gaps({"norm.weight": layout_of(norm)}, [write], streamed=lambda n: False)
    assert gap.missing == ("elements 0-3",) and gap.missing_elements == 4


def test_the_engines_own_fill_counts_as_written():
    """VocabParallelEmbedding zero-fills its padding rows with no checkpoint tensor: those rows are the engine's."""
    embed = torch.empty(10, 4)
    writes = [Write("embed.weight", layout_of(embed[:7]), frozenset({"embed.weight"})),
              Write("embed.weight", layout_of(embed[7:]), frozenset())]  # fmt: skip
    assert coverage.gaps({"embed.weight": layout_of(embed)}, writes, streamed=lambda n: n == "embed.weight") == []


def test_a_sampled_answer_is_judged_per_fed_expert():
    """Experts 0 and 1 fed (a sample), expert 1 without its up_proj: expert 1's rows are missing; the unfed experts
    2 and 3 are not judged (their names were never fed)."""
    w13 = torch.empty(4, 8, 3)
    writes = [
        Write("w13", layout_of(w13[0].narrow(0, 0, 4)), frozenset({"experts.0.gate_proj.weight"})),
        Write("w13", layout_of(w13[0].narrow(0, 4, 4)), frozenset({"experts.0.up_proj.weight"})),
        Write("w13", layout_of(w13[1].narrow(0, 0, 4)), frozenset({"experts.1.gate_proj.weight"})),
    ]
    unit = lambda name: tuple(int(p) for p in name.split(".") if p.isdigit()) or None  # noqa: E731
    (gap,) = coverage.gaps({"w13": layout_of(w13)}, writes, streamed=lambda n: True, unit=unit)
    assert gap.missing == ("[1, 4:8, :]",)

"""Which elements of each parameter a load writes: whole parameters, or no load.

vLLM stacks several checkpoint tensors into one parameter (``gate_proj`` +
``up_proj`` -> ``gate_up_proj``, ``q/k/v_proj`` -> ``qkv_proj``, per-expert
``w1``/``w3`` -> ``w13``). A checkpoint that carries only some of them leaves
the rest of the parameter at its init values, and a check by name
(``load_weights`` reported ``gate_up_proj`` loaded) cannot see it. vLLM 0.34's
default loader checks per shard (``StackedColumnParallelLinear.pop_missing_shards``);
this module checks per element, which covers every stacked, fused,
per-expert and tensor-parallel-sliced layout alike.

The dry run (:mod:`..select.dry_run`) records each write into a parameter as a
:class:`Write`: the view it wrote (storage offset, shape, stride, in
elements) and the checkpoint names whose values flowed into it. A write no
checkpoint name flowed into is the engine's own (VocabParallelEmbedding
zero-fills its padding rows): it counts as filled. :func:`gaps` turns a
parameter's writes into flat element intervals and reports what no write
reaches. Pure functions over shapes and strides; no torch, no model, no engine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Mapping, Optional, Sequence

from ..errors import listed

# Above this many intervals for one write (a transposed, element-strided view), the write is not
# expanded: its parameter is judged by the other writes only if they already cover it.
_MAX_INTERVALS = 1 << 16
_PARTS_SHOWN = 3
# Checkpoint tensors vLLM and SGLang stack into one parameter, beyond a model's packed_modules_mapping:
# the fused experts' w1/w3 (FusedMoE.make_expert_params_mapping) and their HF names.
_SIBLINGS = (("gate_proj", "up_proj"), ("w1", "w3"), ("q_proj", "k_proj", "v_proj"), ("q_a_proj", "kv_a_proj_with_mqa"))


def writes_in_place(func_name: str) -> bool:
    """Whether a torch function of this name writes into its first argument (``copy_``, ``fill_``,
    ``__setitem__``, ``x.data = ...``, ``+=``): the one rule the dry run and the write watch share."""
    return (
        (func_name.endswith("_") and not func_name.startswith("__"))
        or func_name in ("__setitem__", "__set__", "set_")
        or (func_name.startswith("__i") and func_name.endswith("__") and func_name not in ("__index__", "__int__"))
    )


def written_part(func_name: str, args: Sequence) -> object:
    """The tensor an in-place write changes: ``args[0]``, or for ``t[index] = value`` (``__setitem__``) with a
    basic index (ints, slices, ``...``, ``None``) the view ``t[index]``, not ``t`` whole: ModelOpt NVFP4's
    per-expert scales go in as ``param.data[expert] = scale``, one element of a parameter per expert. An
    advanced index (tensors, lists, bools) selects no view: ``t`` whole, as before."""
    target = args[0]
    if func_name != "__setitem__" or len(args) < 2:
        return target
    index = args[1]
    parts = index if isinstance(index, tuple) else (index,)
    if all((isinstance(p, (int, slice)) and not isinstance(p, bool)) or p is Ellipsis or p is None for p in parts):
        return target[index]
    return target


@dataclass(frozen=True)
class Layout:
    """A parameter's own view of its storage (elements)."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int = 0

    @property
    def numel(self) -> int:
        return _prod(self.shape)


@dataclass(frozen=True)
class Write:
    """One write into a parameter: the view written and the checkpoint names whose values it holds."""

    param: str  # the parameter's name (as named_parameters() gives it)
    view: Layout
    names: frozenset[str]  # empty: the engine's own constant (a padding row's fill)


@dataclass(frozen=True)
class Gap:
    """A parameter the load would leave in part (or whole) at its init values."""

    param: str
    shape: tuple[int, ...]
    missing: tuple[str, ...]  # the parts no write reaches, as index ranges ("rows 32-63", "[3, 64:128, :]")
    missing_elements: int
    filled_by: tuple[str, ...]  # the checkpoint names that do write into it
    would_fill: tuple[str, ...]  # the checkpoint names that would fill the rest (the stacked siblings)

    def describe(self, provenance: bool = True) -> str:
        """The part, the parameter and (``provenance``) which checkpoint names write it and which it lacks."""
        what = listed(self.missing, _PARTS_SHOWN)
        text = f"{what} of {self.param} {list(self.shape)} ({self.missing_elements} element(s)) would keep init values"
        if not provenance:
            return text
        if self.would_fill:
            text += f"; the checkpoint lacks {', '.join(self.would_fill)}"
        if self.filled_by:
            shown = ", ".join(self.filled_by[:_PARTS_SHOWN]) + (" ..." if len(self.filled_by) > _PARTS_SHOWN else "")
            text += f" (written only by {shown})"
        elif not self.would_fill:
            text += " (no checkpoint tensor writes it)"
        return text


def _intervals(view: Layout) -> Optional[list[tuple[int, int]]]:
    """The flat storage intervals ``[start, stop)`` a view covers, in storage order.

    None when the view would expand to more than :data:`_MAX_INTERVALS` intervals (a transposed,
    element-strided view of a large parameter).
    """
    if any(size == 0 for size in view.shape):
        return []
    dims = sorted(((size, stride) for size, stride in zip(view.shape, view.stride) if size != 1), key=lambda d: -d[1])
    run = 1  # the innermost contiguous run, in elements
    while dims and dims[-1][1] == run:
        size, _ = dims.pop()
        run *= size
    count = 1
    for size, _ in dims:
        count *= size
    if count > _MAX_INTERVALS:
        return None
    starts = [view.offset]
    for size, stride in dims:
        starts = [s + i * stride for s in starts for i in range(size)]
    return [(start, start + run) for start in starts]


def _union(parts: Iterable[list[tuple[int, int]]]) -> list[tuple[int, int]]:
    """The union of interval lists, merged and sorted."""
    spans = sorted(span for part in parts for span in part)
    merged: list[tuple[int, int]] = []
    for start, stop in spans:
        if merged and start <= merged[-1][1]:
            if stop > merged[-1][1]:
                merged[-1] = (merged[-1][0], stop)
        else:
            merged.append((start, stop))
    return merged


def _subtract(whole: list[tuple[int, int]], covered: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """``whole`` less ``covered`` (both merged and sorted)."""
    out: list[tuple[int, int]] = []
    j = 0
    for start, stop in whole:
        cursor = start
        while j < len(covered) and covered[j][1] <= cursor:
            j += 1
        k = j
        while k < len(covered) and covered[k][0] < stop:
            if covered[k][0] > cursor:
                out.append((cursor, covered[k][0]))
            cursor = max(cursor, covered[k][1])
            k += 1
        if cursor < stop:
            out.append((cursor, stop))
    return out


def _unwritten(layout: Layout, views: Iterable[Layout]) -> list[tuple[int, int]]:
    """The storage intervals of ``layout`` that none of ``views`` covers ([] when it is covered whole, or when a
    view or the layout is too scattered to expand: then it is not judged)."""
    whole = _intervals(layout)
    spans = [_intervals(v) for v in views]
    if whole is None or any(s is None for s in spans):
        return []
    return _subtract(_union([whole]), _union(spans))


def _unit_gaps(layout: Layout, done: list[Write], spans: list, unit: Callable[[str], Optional[tuple]]) -> list[tuple[int, int]]:
    """Per fed unit: the rows (first dimension) its writes touch, less what it and the unsampled writes fill."""
    row = layout.stride[0] if layout.shape else 1
    common = [s for w, s in zip(done, spans) if not any(unit(n) is not None for n in w.names)]
    by_unit: dict[tuple, list] = {}
    for w, s in zip(done, spans):
        for key in {unit(n) for n in w.names} - {None}:
            by_unit.setdefault(key, []).append(s)
    missing: set[tuple[int, int]] = set()
    for _, parts in sorted(by_unit.items()):
        merged = _union(parts)
        if not merged or row <= 0:
            continue
        rows = [
            ((a - layout.offset) // row * row + layout.offset, ((b - 1 - layout.offset) // row + 1) * row + layout.offset)
            for a, b in merged
        ]
        missing.update(_subtract(_union([rows]), _union(parts + common)))
    return sorted(missing)


def _index(flat: int, layout: Layout) -> list[int]:
    """The multi-index of storage element ``flat`` in a contiguous layout."""
    index = []
    rest = flat - layout.offset
    for size, stride in zip(layout.shape, layout.stride):
        index.append(rest // stride if stride else 0)
        rest -= index[-1] * stride
    return index


def _describe_part(start: int, stop: int, layout: Layout) -> str:
    """``rows 32-63`` for whole rows of a 2-D parameter, ``[3, 64:128, :]`` for a block, else element ranges."""
    shape = layout.shape
    contiguous = list(layout.stride) == [_prod(shape[i + 1 :]) for i in range(len(shape))] and layout.offset == 0
    if not contiguous or not shape:
        return f"elements {start}-{stop - 1}"
    # The deepest dimension whose blocks the range starts and ends on.
    for dim in range(len(shape)):
        block = _prod(shape[dim + 1 :])
        outer = _prod(shape[dim:])
        if start % block == 0 and stop % block == 0 and (start // outer) == ((stop - 1) // outer):
            lead = _index(start, layout)[:dim]
            first, last = (start % outer) // block, ((stop - 1) % outer) // block
            if len(shape) == 2 and dim == 0:
                return f"rows {first}-{last}" if first != last else f"row {first}"
            if len(shape) == 1:
                return f"elements {first}-{last}"
            parts = [str(i) for i in lead] + [f"{first}:{last + 1}"] + [":"] * (len(shape) - dim - 1)
            return "[" + ", ".join(parts) + "]"
    return f"elements {start}-{stop - 1}"


def _prod(sizes: Iterable[int]) -> int:
    n = 1
    for size in sizes:
        n *= size
    return n


def _would_fill(param: str, filled_by: Iterable[str], present: Callable[[str], bool], packed: Mapping[str, Sequence[str]]) -> list[str]:
    """Checkpoint names the writers' stacked siblings would have: the ones the checkpoint lacks."""
    groups = [tuple(members) for members in packed.values() if len(members) > 1] + list(_SIBLINGS)
    out: list[str] = []
    for name in filled_by:
        parts = name.split(".")
        for i, part in enumerate(parts):
            for group in groups:
                if part in group:
                    for other in group:
                        candidate = ".".join(parts[:i] + [other] + parts[i + 1 :])
                        if other != part and not present(candidate) and candidate not in out:
                            out.append(candidate)
    return out


def gaps(params: Mapping[str, Layout], writes: Iterable[Write], *, streamed: Callable[[str], bool],
         present: Callable[[str], bool] = lambda name: True, packed: Mapping[str, Sequence[str]] = {},
         unit: Optional[Callable[[str], Optional[tuple]]] = None) -> list[Gap]:  # fmt: skip
    """The parameters of ``params`` whose elements the writes of streamed names (and the engine's own) leave unwritten.

    ``streamed(name)``: the checkpoint name is part of the load (a write whose
    names are not all streamed does not happen); ``present(name)``: the
    checkpoint has it (to say which sibling it lacks); ``packed``: the
    module's ``packed_modules_mapping``; ``unit(name)``: for a dry run fed a
    sample of the names (:mod:`..select.name_sampling`), the unit a sampled name
    belongs to (None for a name every dry run is fed). A parameter written by
    sampled names is judged per unit: each fed unit must fill whole the rows
    (first dimension: an expert of ``w13``) it writes into.
    """
    by_param: dict[str, list[Write]] = {}
    for write in writes:
        by_param.setdefault(write.param, []).append(write)
    found: list[Gap] = []
    for name, layout in sorted(params.items()):
        if layout.numel == 0:
            continue
        done = [w for w in by_param.get(name, ()) if all(streamed(n) for n in w.names)]
        units = {unit(n) for w in done for n in w.names} - {None} if unit is not None else set()
        if units:
            spans = [_intervals(w.view) for w in done]
            if any(s is None for s in spans):
                continue  # a write too scattered to expand: not judged here (the names check still guards it)
            missing = _unit_gaps(layout, done, spans, unit)
        else:
            missing = _unwritten(layout, [w.view for w in done])
        if not missing:
            continue
        filled_by = sorted({n for w in done for n in w.names})
        parts = tuple(_describe_part(a, b, layout) for a, b in missing)
        found.append(Gap(name, layout.shape, parts, sum(b - a for a, b in missing), tuple(filled_by),
                         tuple(_would_fill(name, filled_by, present, packed))))  # fmt: skip
    return found


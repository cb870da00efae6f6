"""What may stream while the module is asked: the head of the load the engine's rules foresee.

Asking the built module what it reads (:mod:`..select.module_reads`) takes a
second or more on the largest checkpoints (DeepSeek-V3's 92k names), which
at a node's 10 GB/s is 10 GB not read. So the load does not wait for it:
before the question, planning foresees the load from what needs no question
(:func:`foreseen`: the module's declarations, its rank's share, the table row
or the conventions, exactly as doctor plans), and runai starts reading the
first bytes of that plan (:func:`head`, up to ``MX_ROBUST_READ_AHEAD_BYTES``).

Nothing read ahead reaches the model before the answer: the stream admits a
tensor read ahead only if the answered plan holds it, drops the others
(their bytes are counted), and streams what the answered plan holds beyond
the head afterwards (:func:`rest`). A refused plan closes the read-ahead
with the model untouched. The foresight decides only what is read early,
never what is delivered.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Callable, Optional

from ..errors import DraftPlanError, MxStrategiesError
from ..inspect.sources import Resolution
from ..select.built_module import BuiltModule
from ..select.draft import EMBEDDING_OR_HEAD_PATTERN, layer_layout, select_draft_tensors
from ..settings import RobustSettings
from .planning import LoadPlan, plan_resolved


_PER_EXPERT = re.compile(r"\.experts\.\d+\.")


def foreseen(resolution: Resolution, module: BuiltModule, settings: RobustSettings) -> Optional[LoadPlan]:
    """The plan of this load as it stands before the module is asked; None where it cannot be foreseen."""
    try:
        return plan_resolved(resolution, module.unasked(), settings)
    except MxStrategiesError:
        return None  # the answered plan says why, or does without


def layer_of(name: str) -> Optional[tuple[str, int]]:
    """The layer a name sits in, as (container, index): ``model.layers.3.mlp...`` -> ``("layers", 3)``; None
    for a name outside any numbered container (an embedding, a head, a final norm)."""
    parts = name.split(".")
    for position in range(1, len(parts)):
        part = parts[position]
        if part.isdigit() and part.isascii():
            return parts[position - 1], int(part)
    return None


def holds_layer(held: Optional[frozenset[str]]) -> Callable[[str], bool]:
    """Whether the built module holds the layer a checkpoint name sits in, by its own parameter and buffer
    names (``held``): a target holds no parameter under its MTP draft's layers, a pipeline stage none under
    another stage's. Layers are compared by container and index (``layers``, 3), not by the whole path, so a
    module that names its tree otherwise than its checkpoint still matches; a container the module does not
    number at all (or no names: ``held`` None) says nothing, and every name passes."""
    if not held:
        return lambda name: True
    layers = {layer for name in held if (layer := layer_of(name)) is not None}
    containers = {container for container, _ in layers}

    def holds(name: str) -> bool:
        layer = layer_of(name)
        return layer is None or layer[0] not in containers or layer in layers

    return holds


def head(
    plan: LoadPlan,
    limit_bytes: int,
    held: Optional[frozenset[str]] = None,
    *,
    uncertain: Callable[[str], bool] = lambda name: False,
) -> Optional[LoadPlan]:
    """The first tensors of ``plan`` in its order (shards in load order, tensors by offset), at most
    ``limit_bytes`` of them (at least one tensor, where the first alone is larger); None: nothing.

    A draft's embeddings and heads, and its weights shared with the target (``plan.shared``), are not read
    ahead: whether the module reads them or the engine fills them from the target's (vLLM's shared
    embedding, a replaced head) is the answer's to say, and they are the largest tensors of a draft's plan
    (1.85 GB each on DeepSeek-V3). Nor is a tensor of a layer the module does not hold (``held``: its
    parameter and buffer names, :func:`holds_layer`): a target's MTP draft's layers where no table row
    leaves them to the draft, another pipeline stage's. ``uncertain``: what else the caller cannot foresee
    (:func:`uncertain_names`)."""
    if limit_bytes <= 0 or not plan.shards:
        return None
    names, taken, shared, holds = [], 0, plan.shared, holds_layer(held)
    for shard in plan.shards:
        for name, info in shard.tensors.items():
            if (plan.names is not None and name not in plan.names) or name in shared or not holds(name) or (
                plan.role == "draft" and EMBEDDING_OR_HEAD_PATTERN.search(name)
            ) or uncertain(name):
                continue
            if names and taken + info.nbytes > limit_bytes:
                return _of(plan, frozenset(names))
            names.append(name)
            taken += info.nbytes
    return _of(plan, frozenset(names)) if names else None


def uncertain_names(resolution: Resolution, module: BuiltModule, settings: RobustSettings) -> Callable[[str], bool]:
    """The names of the chosen checkpoint whose reading only the module's answer can tell:

    - for a target, what the generic MTP conventions (:mod:`..select.draft`) take for its draft's own
      tensors (Qwen3-Next's ``mtp.*``, DeepSeek's NextN layers): a target with no table row would
      otherwise foresee them as its own;
    - per-expert tensors (``<...>.experts.<id>.``) where the engine runs more than one tensor-parallel rank
      and the module's structure maps no experts to ranks (SGLang's redundant expert slots, EPLB without
      the engine's rule): the rank may hold only some of them.
    """
    checks: list[Callable[[str], bool]] = []
    engine, checkpoint = module.engine, resolution.checkpoint
    if not engine.is_draft:
        layout = layer_layout(checkpoint.config, engine.hf_config)
        try:
            selection = select_draft_tensors(set(checkpoint.tensors()), settings, layout, share_with_target=True)
            drafts = frozenset(selection.names) - frozenset(selection.shared)
            checks.append(drafts.__contains__)
        except DraftPlanError:
            pass  # no MTP tensors by any convention: nothing of a draft's to leave out
    if engine.tensor_parallel_size > 1 and not (module.share is not None and module.share.local_experts):
        checks.append(lambda name: _PER_EXPERT.search(name) is not None)
    return lambda name: any(check(name) for check in checks)


def rest(plan: LoadPlan, streamed: frozenset[str]) -> Optional[LoadPlan]:
    """What ``plan`` holds beyond the names ``streamed`` already; None: nothing."""
    names = frozenset(n for n in plan.expected if n not in streamed)
    return _of(plan, names) if names else None


def _of(plan: LoadPlan, names: frozenset[str]) -> LoadPlan:
    return replace(plan, names=names, shards=tuple(s for s in plan.shards if any(n in names for n in s.tensors)))


__all__ = ["foreseen", "head", "holds_layer", "layer_of", "rest", "uncertain_names"]

"""runai reading the head of a load while the module is asked: what it reads, and how the stream takes it over.

The strategy starts it (:func:`start_read_ahead`) before the question: the
head of the selection made without asking, less what only the module's
answer can settle (a draft's embeddings and heads, weights shared with the
target, layers the module holds nothing under, ...). runai's ring fills
without Python (its buffers, bounded by ``RUNAI_STREAMER_MEMORY_LIMIT``, wait
for a consumer). Nothing is taken from it until the stream has the answered
plan (:meth:`ReadAhead.then`): it admits what that plan holds, drops the
rest, then streams the plan's other tensors. A read-ahead is only ever a
head start: one that cannot start is logged and the load streams as it
would have; one never used is closed with the model untouched.
"""

from __future__ import annotations

import re
import time
from contextlib import ExitStack, suppress
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Mapping, Optional

import torch

from ..errors import DraftPlanError, MxStrategiesError
from ..inspect.checkpoint import Checkpoint
from ..inspect.sources import Resolution
from ..select.built_module import BuiltModule
from ..select.mtp_rows import EMBEDDING_OR_HEAD_PATTERN
from ..select.mtp_table import convention_tensors, conventions_layout
from ..select.name_sampling import is_index
from ..select.selection import Selection, select_resolved
from ..settings import RobustSettings
from .runai_env import claim_backend, streamer_environment, streamer_variables

if TYPE_CHECKING:  # the plan is handed in: the stream imports nothing of planning
    from ..plan.planning import LoadPlan

_PER_EXPERT = re.compile(r"\.experts\.\d+\.")


def start_read_ahead(
    early: ExitStack, whole: LoadPlan, resolution: Resolution, module: BuiltModule, settings: RobustSettings,
    on_info: Callable[[str], None],
) -> ReadAhead:
    """runai reading ahead, in ``early``, while ``module`` is asked: the head of ``whole`` (every tensor of the
    loaded shards) that the selection made without asking takes, less what only the answer settles
    (:func:`_uncertain`), at most ``MX_ROBUST_READ_AHEAD_BYTES``; what is read early, never what is delivered.
    One that cannot start says why through ``on_info``."""
    head = None
    if settings.read_ahead_bytes:
        with suppress(MxStrategiesError):  # the answered selection says why, or does without
            foreseen = select_resolved(resolution, module, settings, ask=False)
            taken = whole if foreseen.names is None else whole.narrowed(foreseen.names)
            leave = frozenset() if module.question is None else _uncertain(
                foreseen, resolution.checkpoint, whole.expected, module, settings)
            head = plan_head(taken, settings.read_ahead_bytes, leave)
    ahead = early.enter_context(ReadAhead(head, settings, loader_extra_config=module.engine.loader_extra_config))
    if ahead.failed:
        on_info(f"{module.engine.role}: runai did not read ahead while the module was asked ({ahead.failed}); "
                f"streaming after its answer")  # fmt: skip
    return ahead


def plan_head(plan: LoadPlan, limit_bytes: int, leave: frozenset[str] = frozenset()) -> Optional[LoadPlan]:
    """``plan``'s first tensors in plan order, at most ``limit_bytes`` of them (at least one tensor, where the
    first alone is larger), none of ``leave``; None: nothing."""
    if limit_bytes <= 0:
        return None
    names, taken = [], 0
    for shard in plan.shards:
        for name, info in shard.tensors.items():
            if (plan.names is not None and name not in plan.names) or name in leave:
                continue
            if names and taken + info.nbytes > limit_bytes:
                return plan.narrowed(names)
            names.append(name)
            taken += info.nbytes
    return plan.narrowed(names) if names else None


def _rest(plan: LoadPlan, streamed: Iterable[str]) -> Optional[LoadPlan]:
    """What ``plan`` holds beyond ``streamed``; None: nothing."""
    done = frozenset(streamed)
    rest = plan.narrowed(n for n in plan.expected if n not in done)
    return rest if rest.names else None


# -- what only the answer can settle (the read-ahead leaves it alone) --------------


def _layer_of(name: str) -> Optional[tuple[str, int]]:
    """The layer a name sits in, as (container, index): ``model.layers.3.mlp...`` -> ``("layers", 3)``; None
    for a name outside any numbered container (an embedding, a head, a final norm)."""
    parts = name.split(".")
    return next(((parts[at - 1], int(parts[at])) for at in range(1, len(parts)) if is_index(parts[at])), None)


def _holds_layer(held: Optional[Iterable[str]]) -> Callable[[str], bool]:
    """Whether the built module holds the layer a checkpoint name sits in, by its own parameter and buffer
    names (``held``): a target holds no parameter under its MTP draft's layers, a pipeline stage none under
    another stage's. Layers are compared by container and index (``layers``, 3), not by the whole path, so a
    module that names its tree otherwise than its checkpoint still matches; a container the module does not
    number at all (or no names: ``held`` None) says nothing, and every name passes."""
    if not held:
        return lambda name: True
    layers = {layer for name in held if (layer := _layer_of(name)) is not None}
    containers = {container for container, _ in layers}

    def holds(name: str) -> bool:
        layer = _layer_of(name)
        return layer is None or layer[0] not in containers or layer in layers

    return holds


def _uncertain(
    selection: Selection, checkpoint: Checkpoint, full: list[str], module: BuiltModule, settings: RobustSettings
) -> frozenset[str]:
    """The names of ``selection`` (made without asking; ``full``: every name of the loaded shards) whose reading
    only the module's answer can tell:

    - a draft's embeddings and heads, and its weights shared with the target: the module may read them or
      the engine fill them from the target's (vLLM's shared embedding, a replaced head), and they are the
      largest tensors of a draft (1.85 GB each on DeepSeek-V3);
    - a tensor of a layer the module holds nothing under (:func:`_holds_layer`): a target's MTP layers where
      no table row leaves them to the draft, another pipeline stage's;
    - for a target, what the generic MTP conventions (:mod:`..select.mtp_rows`) take for its draft's own tensors
      (Qwen3-Next's ``mtp.*``, DeepSeek's NextN layers);
    - per-expert tensors (``<...>.experts.<id>.``) where the engine runs more than one tensor-parallel rank
      and the module's structure maps no experts to ranks (SGLang's redundant expert slots): the rank may
      hold only some of them.
    """
    engine = module.engine
    checks: list[Callable[[str], bool]] = [selection.shared.__contains__]
    holds = _holds_layer(module.held)
    checks.append(lambda name: not holds(name))
    if engine.is_draft:
        checks.append(lambda name: EMBEDDING_OR_HEAD_PATTERN.search(name) is not None)
    else:
        layout = conventions_layout(checkpoint.config, engine.hf_config)
        try:
            picked = convention_tensors(set(checkpoint.tensors()), settings, layout, share_with_target=True)
            checks.append(frozenset(picked.own).__contains__)
        except DraftPlanError:
            pass  # no MTP tensors by any convention: nothing of a draft's to leave out
    if engine.tensor_parallel_size > 1 and not (module.share is not None and module.share.local_experts):
        checks.append(lambda name: _PER_EXPERT.search(name) is not None)
    return frozenset(
        n for n in full if (selection.names is None or n in selection.names) and any(check(n) for check in checks)
    )


# -- the read-ahead itself ---------------------------------------------------------


class ReadAhead:
    """A runai stream of ``head`` started now and taken over later by the stream, once; a context manager
    owning it, and the stream of the plan's rest after it."""

    def __init__(
        self,
        head: Optional[LoadPlan],
        settings: RobustSettings,
        *,
        loader_extra_config: Optional[Mapping[str, Any]] = None,
    ) -> None:
        self.plan = head
        self.variables = streamer_variables(settings, loader_extra_config)  # the stream warns of overrides
        self.failed: Optional[str] = None  # why it did not start
        self.started_at: Optional[float] = None
        self.discarded = 0  # bytes read ahead, then not in the answered plan: never delivered
        self.from_storage = 0  # bytes read from storage: the head, then the rest once it streams
        self._env = None
        self._streamer = None
        self._iter: Optional[Iterator[tuple[str, torch.Tensor]]] = None

    @property
    def live(self) -> bool:
        """Started, and not yet taken or closed."""
        return self._iter is not None

    @property
    def bytes(self) -> int:
        """The tensor bytes it reads (0: none, it did not start)."""
        return self.plan.bytes if self.started_at is not None and self.plan is not None else 0

    def __enter__(self) -> "ReadAhead":
        if self.plan is None or not self.plan.shards:
            return self
        from .runai_plan import PlannedStreamer  # imports runai, which a plan-only caller never needs

        try:
            claim_backend(self.plan.source, self.plan.uris)
            self._env = streamer_environment(self.variables)
            self._env.__enter__()
            self._streamer = PlannedStreamer().__enter__()
            self._streamer.stream_plan(self.plan, device="cpu")
            self._iter = self._streamer.get_tensors()
            self.started_at = time.perf_counter()
            self.from_storage = self.plan.bytes
        except Exception as exc:  # noqa: BLE001 - a head start only: the load streams without it
            self.failed = f"{type(exc).__name__}: {exc}"
            self.close()
        return self

    def then(self, plan: LoadPlan, device: str = "cpu") -> Iterator[tuple[str, torch.Tensor]]:
        """The head's tensors that the answered ``plan`` holds, in arrival order (the others dropped, never
        delivered), then the rest of ``plan``; taken once, by the stream that admits them."""
        if self._iter is None:
            raise RuntimeError("ReadAhead is not started, or already taken")
        tensors, self._iter = self._iter, None
        from .runai_plan import PlannedStreamer

        wanted = frozenset(plan.expected)
        for name, tensor in tensors:
            if name in wanted:
                yield name, tensor
            else:
                self.discarded += tensor.numel() * tensor.element_size()
        self.close()  # its buffers go before the rest's are taken
        rest = _rest(plan, self.plan.expected)
        if rest is None:
            return
        self._streamer = PlannedStreamer().__enter__()
        self._streamer.stream_plan(rest, device=device)
        self.from_storage += rest.bytes
        yield from self._streamer.get_tensors()

    def close(self) -> None:
        """Stop runai's reads and free its buffers (the runai variables stay set until the context ends,
        so a stream started inside it keeps them)."""
        self._iter = None
        if self._streamer is not None:
            streamer, self._streamer = self._streamer, None
            streamer.__exit__(None, None, None)

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            self.close()
        finally:
            if self._env is not None:
                self._env.__exit__(None, None, None)
                self._env = None

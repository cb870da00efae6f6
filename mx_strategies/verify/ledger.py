"""What the stream delivered is what was planned: every tensor once, as its header said, with its stored bytes.

A :class:`DeliveryLedger` checks every name off as it reaches the model; a
shortfall, a duplicate or a stranger fails the load instead of serving a
model with a weight missing (vLLM #38991: 335 of 447 tensors silently
dropped). A tensor whose dtype, shape or size differs from its inspected
header (a file rewritten under the load) never reaches the model.

runai-model-streamer hands the model whatever bytes its reads returned. A
store, proxy or cache that answers a ranged read with the wrong bytes (an
off-by-N range, a flipped bit in a body of the right length) goes unnoticed:
the load succeeds with a wrong weight (see docs/faults.md). With
``MX_ROBUST_VERIFY_CONTENT=sample`` or ``all``, each chosen tensor is hashed
(SHA-256) as delivered and compared with a direct ranged read of its byte
range through the probe's client (:func:`..inspect.object_stores.open_store`),
an independent read path (:class:`ContentCheck`). What it cannot catch:
bytes that are wrong in the store itself (both reads agree), and the reads
cost time (``all`` reads the checkpoint twice).
"""

from __future__ import annotations

import hashlib
from collections import Counter
from typing import Any, Callable, Iterable, Optional

import torch

from ..errors import ContentMismatch, IncompleteDelivery, StoreError
from ..inspect.checkpoint import Shard, TensorInfo
from ..inspect.object_stores import open_store
from ..inspect.storage import ObjectInfo, Store
from ..settings import RobustSettings
from .tensor_bytes import sha256 as tensor_sha256

# How many tensors MX_ROBUST_VERIFY_CONTENT=sample checks per load (it was MX_ROBUST_VERIFY_SAMPLE).
_SAMPLE_SIZE = 8
_NAMES_SHOWN = 10


class DeliveryLedger:
    """Checks every expected tensor of one plan off exactly once, each checked as it arrives."""

    def __init__(self, plan: Any, settings: RobustSettings) -> None:
        """``plan``: a :class:`..plan.planning.LoadPlan` (its source, shards and expected names)."""
        self.expected: list[str] = plan.expected
        self._expected_set = frozenset(plan.expected)
        self._source = plan.source
        self._policy = settings.completeness
        self._planned = {n: (shard, info) for shard in plan.shards for n, info in shard.tensors.items()}
        self._content = None if settings.verify_content == "off" else _ContentCheck(plan.source, plan.shards,
                                                                                 plan.expected, settings)  # fmt: skip
        self.delivered: Counter[str] = Counter()
        self.strangers: list[str] = []
        self._settled = False

    def check_in(self, name: str, tensor: torch.Tensor) -> Optional[str]:
        """Check ``tensor`` against its header and (where chosen) its stored bytes, then off; returns the file it came
        from (None: a name the plan does not know). Raises ContentMismatch, ``mutated`` once a tensor reached the model."""
        mutated = bool(self.delivered)
        where = self._planned.get(name)
        if where is not None:
            # What arrived must be what the inspected header promised: a file rewritten under the
            # load with the same names but another dtype or shape never reaches the model.
            shard, info = where
            wrong = _delivery_mismatch(info, tensor)
            if wrong:
                raise ContentMismatch(
                    f"tensor {name!r} from {shard.uri} arrived as {wrong}, but its header said "
                    f"{info.dtype}{list(info.shape)} ({info.nbytes} bytes) when inspected: the file changed "
                    "under the load, or the streamer misread it",
                    mutated=mutated,
                )
        if self._content is not None:
            try:
                self._content.check(name, tensor)  # wrong bytes never reach the model
            except ContentMismatch as exc:
                exc.mutated = mutated
                raise
        if name not in self._expected_set:
            self.strangers.append(name)
        self.delivered[name] += 1
        return where[0].uri if where is not None else None

    def settle(self, exhausted: bool, on_warning: Optional[Callable[[str], None]]) -> None:
        """Apply the completeness policy (``MX_ROBUST_COMPLETENESS``) once the engine stopped reading (``exhausted``:
        the stream ended); safe to call more than once. Raises IncompleteDelivery under ``fail``."""
        if self._settled:
            return
        self._settled = True
        missing = [n for n in self.expected if self.delivered[n] == 0]
        duplicated = sorted(n for n, c in self.delivered.items() if c > 1)
        if exhausted and not (missing or duplicated or self.strangers):
            return
        parts = []
        if missing:
            parts.append(f"{len(missing)} of {len(self.expected)} expected tensors missing: {names_shown(missing)}")
        if duplicated:
            parts.append(f"{len(duplicated)} delivered more than once: {names_shown(duplicated)}")
        if self.strangers:
            parts.append(f"{len(self.strangers)} not expected: {names_shown(self.strangers)}")
        message = f"incomplete load from {self._source}: " + "; ".join(parts)
        if not exhausted:
            message += " (the engine stopped reading before the stream ended)"
        if self._policy == "fail":
            raise IncompleteDelivery(message, mutated=bool(self.delivered))
        if on_warning is not None:
            on_warning(message)


def names_shown(names: list[str]) -> str:
    """The first names of a list, then ``...``: how the stream's messages name files and tensors."""
    shown = ", ".join(names[:_NAMES_SHOWN])
    return shown + (", ..." if len(names) > _NAMES_SHOWN else "")


def _delivery_mismatch(info: TensorInfo, tensor: torch.Tensor) -> Optional[str]:
    """How ``tensor`` differs from its header entry ``info`` (dtype, shape, bytes), or None."""
    from ..inspect.headers import runai_dtypes, storage_shape

    expected = runai_dtypes().get(info.dtype)
    shape = tuple(tensor.shape)
    nbytes = tensor.numel() * tensor.element_size()
    # A packed dtype (F4 on runai 0.17.1) arrives with fewer elements than the header's values on its last axis.
    wanted = storage_shape(info.dtype, tuple(info.shape))
    if (expected is None or tensor.dtype == expected) and shape == wanted and nbytes == info.nbytes:
        return None
    return f"{tensor.dtype}{list(shape)} ({nbytes} bytes)"


def _chosen_for_check(names: Iterable[str], mode: str, sample: int, salt: str = "") -> frozenset[str]:
    """The tensors a load checks the bytes of: none (``off``), all, or ``sample`` of them.

    The sample is a fixed pseudo-random choice (ordered by a hash of the name
    and ``salt``), so it spreads over the shards and every load of the same
    checkpoint checks the same tensors: a reported mismatch reproduces.
    """
    names = list(names)
    if mode == "off":
        return frozenset()
    if mode == "all" or sample >= len(names):
        return frozenset(names)
    ranked = sorted(names, key=lambda n: hashlib.sha256(f"{salt}\0{n}".encode()).digest())
    return frozenset(ranked[:sample])


class _ContentCheck:
    """Checks the chosen tensors of one load against the store, one by one."""

    def __init__(self, source: str, shards: Iterable[Shard], names: Iterable[str], settings: RobustSettings) -> None:
        self.source = source
        self.settings = settings
        self._where: dict[str, tuple[Shard, TensorInfo]] = {
            name: (shard, info) for shard in shards for name, info in shard.tensors.items()
        }
        self.selected = _chosen_for_check(names, settings.verify_content, _SAMPLE_SIZE, salt=source)
        self._store: Optional[Store] = None

    def check(self, name: str, tensor: torch.Tensor) -> None:
        """Raise ContentMismatch unless ``tensor`` holds the stored bytes of ``name``.

        Tensors outside the selection (and names the plan does not know,
        which the delivery ledger reports) pass unchecked.
        """
        if name not in self.selected or name not in self._where:
            return
        shard, info = self._where[name]
        if info.start is None:
            raise ContentMismatch(f"cannot verify tensor {name!r} from {shard.uri}: its byte offset is unknown")
        where = f"tensor {name!r} from {shard.uri} (bytes {info.start}-{info.start + info.nbytes - 1})"
        delivered = tensor_sha256(tensor)  # its size matched the header already (the ledger's first check)
        try:
            stored_raw = self._read(shard, info)
        except StoreError as exc:
            raise ContentMismatch(f"content check of {where} could not read the stored bytes: {exc}") from exc
        stored = hashlib.sha256(stored_raw).hexdigest()
        if len(stored_raw) != info.nbytes:
            raise ContentMismatch(
                f"content check of {where}: the direct read returned {len(stored_raw)} of {info.nbytes} bytes"
            )
        if delivered != stored:
            raise ContentMismatch(
                f"content check failed: {where}: delivered SHA-256 {delivered[:16]}... differs from the "
                f"stored bytes' {stored[:16]}... (the streamer returned wrong bytes)"
            )

    def _read(self, shard: Shard, info: TensorInfo) -> bytes:
        if info.nbytes == 0:
            return b""
        if self._store is None:
            self._store = open_store(self.source, timeout_s=self.settings.probe_timeout_s)
        return self._store.read(ObjectInfo(key=shard.key, uri=shard.uri, size=shard.size), info.start, info.nbytes)

"""Optional content verification: delivered tensor bytes against the stored bytes.

runai-model-streamer hands the model whatever bytes its reads returned. A
store, proxy or cache that answers a ranged read with the wrong bytes (an
off-by-N range, a flipped bit in a body of the right length) goes unnoticed:
the load succeeds with a wrong weight (see docs/faults.md). With
``MX_ROBUST_VERIFY_CONTENT=sample`` or ``all``, each chosen tensor is hashed
(SHA-256) as delivered and compared with a direct ranged read of its byte
range through the probe's client (:func:`storage.open_store`), an
independent read path. A mismatch raises :class:`ContentMismatch` naming
the tensor, the file and the byte range.

What it cannot catch: bytes that are wrong in the store itself (both reads
agree), and the reads cost time (``all`` reads the checkpoint twice).
"""

from __future__ import annotations

import hashlib
from typing import Iterable, Optional

import torch

from ..inspect.checkpoint import Shard, TensorInfo
from ..errors import ContentMismatch
from ..settings import RobustSettings
from ..inspect.storage import ObjectInfo, Store, StoreError, open_store
from .tensor_bytes import sha256 as tensor_sha256

OFF = "off"
SAMPLE = "sample"
ALL = "all"


def select(names: Iterable[str], mode: str, sample: int, salt: str = "") -> frozenset[str]:
    """The tensors a load checks: none, all, or ``sample`` of them.

    The sample is a fixed pseudo-random choice (ordered by a hash of the name
    and ``salt``), so it spreads over the shards and every load of the same
    checkpoint checks the same tensors: a reported mismatch reproduces.
    """
    names = list(names)
    if mode == OFF:
        return frozenset()
    if mode == ALL or sample >= len(names):
        return frozenset(names)
    ranked = sorted(names, key=lambda n: hashlib.sha256(f"{salt}\0{n}".encode()).digest())
    return frozenset(ranked[:sample])


class ContentCheck:
    """Checks the selected tensors of one load against the store, one by one."""

    def __init__(self, source: str, shards: Iterable[Shard], names: Iterable[str], settings: RobustSettings) -> None:
        self.source = source
        self.settings = settings
        self._where: dict[str, tuple[Shard, TensorInfo]] = {
            name: (shard, info) for shard in shards for name, info in shard.tensors.items()
        }
        self.selected = select(names, settings.verify_content, settings.verify_sample, salt=source)
        self.checked: list[str] = []
        self.bytes_read = 0
        self._store: Optional[Store] = None

    @classmethod
    def for_load(
        cls, source: str, shards: Iterable[Shard], names: Iterable[str], settings: RobustSettings
    ) -> Optional["ContentCheck"]:
        """A checker, or None when verification is off."""
        if settings.verify_content == OFF:
            return None
        return cls(source, shards, names, settings)

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
        delivered = tensor_sha256(tensor)
        delivered_bytes = tensor.numel() * tensor.element_size()
        if delivered_bytes != info.nbytes:
            raise ContentMismatch(
                f"content check failed: {where}: {delivered_bytes} bytes delivered, the header says {info.nbytes}"
            )
        try:
            stored_raw = self._read(shard, info)
        except StoreError as exc:
            raise ContentMismatch(f"content check of {where} could not read the stored bytes: {exc}") from exc
        stored = hashlib.sha256(stored_raw).hexdigest()
        self.bytes_read += len(stored_raw)
        if len(stored_raw) != info.nbytes:
            raise ContentMismatch(
                f"content check of {where}: the direct read returned {len(stored_raw)} of {info.nbytes} bytes"
            )
        if delivered != stored:
            raise ContentMismatch(
                f"content check failed: {where}: delivered SHA-256 {delivered[:16]}... differs from the "
                f"stored bytes' {stored[:16]}... (the streamer returned wrong bytes)"
            )
        self.checked.append(name)

    def _read(self, shard: Shard, info: TensorInfo) -> bytes:
        if info.nbytes == 0:
            return b""
        if self._store is None:
            self._store = open_store(
                self.source,
                timeout_s=self.settings.probe_timeout_s,
                max_attempts=self.settings.probe_max_attempts,
            )
        obj = ObjectInfo(key=shard.key, uri=shard.uri, size=shard.size)
        return self._store.read(obj, info.start, info.nbytes)


__all__ = ["ContentCheck", "ContentMismatch", "select"]

"""What a probe learns of a checkpoint, as plain data: its shards, their tensors, and what is wrong with it.

A safetensors file starts with an 8-byte little-endian header length and a JSON header naming every tensor
with its dtype, shape and byte range. Reading only that (:mod:`.headers`) and the index (:mod:`.index`) tells
us, before the model is touched, which tensors a load must deliver, which shards are empty, and whether the
index and the files agree. Deciding what to do about a problem is the caller's job (the strategy fails,
``doctor`` reports).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any, Collection, Iterable, Optional

from .remedies import remedy

INDEX_NAME = "model.safetensors.index.json"
# The config.json keys that count a checkpoint's MTP layers: checked for plausibility here, read by draft selection.
NEXTN_COUNT_KEYS = ("num_nextn_predict_layers", "mtp_num_hidden_layers", "num_mtp_layers", "n_predict")
_QUOTE_CHARS = 200  # names and shapes quoted in a message are cut to this many characters

ERROR = "error"
WARNING = "warning"


def quote(value: Any) -> str:
    """``repr(value)`` for a message, cut to :data:`_QUOTE_CHARS`."""
    text = repr(value)
    return text if len(text) <= _QUOTE_CHARS else text[: _QUOTE_CHARS - 5] + "...]"


@dataclass(frozen=True)
class Problem:
    """Something wrong with a checkpoint, tied to the file/tensor it concerns."""

    kind: str
    severity: str
    file: Optional[str]
    tensor: Optional[str]
    message: str

    def as_dict(self) -> dict:
        return {**asdict(self), "remedy": remedy(self.kind)}


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    start: Optional[int] = None  # absolute offset of its data in the file, when read from a header


@dataclass
class Shard:
    """One safetensors file and what its header says it holds."""

    key: str
    uri: str
    size: int
    header_bytes: int = 0  # 8 + JSON length, once read
    identity: Optional[str] = None  # the file's identity when inspected (ObjectInfo.identity)
    tensors: dict[str, TensorInfo] = field(default_factory=dict)
    readable: bool = False

    @property
    def empty(self) -> bool:
        return self.readable and not self.tensors

    @property
    def data_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors.values())


@dataclass
class Checkpoint:
    """A source's shards in load order, its index and what is wrong with it."""

    uri: str
    root_key: str  # folder below the source holding the index or shards ("" = top)
    shards: list[Shard]
    index: Optional[dict]
    config: Optional[dict]
    problems: list[Problem]
    outside_index: list[Shard] = field(default_factory=list)  # shards next to an index that it does not name

    @property
    def loadable_shards(self) -> list[Shard]:
        """Readable shards holding at least one tensor, in load order."""
        return [s for s in self.shards if s.readable and s.tensors]

    @property
    def errors(self) -> list[Problem]:
        return [p for p in self.problems if p.severity == ERROR]

    @property
    def tensor_count(self) -> int:
        return sum(len(s.tensors) for s in self.loadable_shards)

    @property
    def data_bytes(self) -> int:
        return sum(s.data_bytes for s in self.loadable_shards)

    @property
    def metadata_bytes(self) -> int:
        """Bytes a probe reads: every header plus the index and config."""
        return sum(s.header_bytes for s in self.shards)

    def tensors(self) -> dict[str, TensorInfo]:
        return {name: info for s in self.loadable_shards for name, info in s.tensors.items()}


def loaded_shards(checkpoint: Checkpoint, settings: Any, names: Optional[Collection[str]] = None) -> list[Shard]:
    """The shards a load streams, in load order: readable, empty ones only where not skipped
    (``MX_ROBUST_SKIP_EMPTY_SHARDS``); given ``names``, only those holding at least one of them."""
    shards = [s for s in checkpoint.shards if s.readable and (s.tensors or not settings.skip_empty_shards)]
    return shards if names is None else shards_holding(shards, names)


def shards_holding(shards: Iterable[Shard], names: Collection[str]) -> list[Shard]:
    """The shards that hold at least one of ``names``, in their order: the only ones a narrowed load reads."""
    return [s for s in shards if any(n in names for n in s.tensors)]


def natural_key(name: str) -> list:
    """Sort key putting ``model-2`` before ``model-10``."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]

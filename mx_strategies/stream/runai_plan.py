"""Hand runai-model-streamer the plan, so no shard header is read twice.

runai's ``SafetensorsStreamer.stream_files`` starts by reading every file's
8-byte header length and JSON header (two ranged reads per shard, its
``prepare_request``), although our probe read exactly those bytes moments
before. On an object store that is two round trips per shard, every load
(163 shards on DeepSeek-V3). The plan already holds each tensor's dtype,
shape and absolute byte range, validated as strictly as runai validates
them, so :class:`PlannedStreamer` builds runai's read requests
(``FileChunks`` of explicit byte ranges) and tensor metadata from it and
hands them to runai's own distributed file streamer. Tensors come out of
runai's own ``get_tensors`` (alignment handling included), unchanged.

The price is that runai no longer re-reads the header at streaming time, so
a file rewritten between probe and stream would be read at the old offsets:
the stream checks each shard's identity (size and mtime, ETag) against the
probe's before it starts and after it ends.
"""

from __future__ import annotations

import inspect
import os
from timeit import default_timer as timer
from typing import TYPE_CHECKING, Optional

from runai_model_streamer import SafetensorsStreamer
from runai_model_streamer.file_streamer import FileChunks
from runai_model_streamer.safetensors_streamer.safetensors_pytorch import SafetensorMetadata

from ..inspect.checkpoint import Shard, TensorInfo

if TYPE_CHECKING:  # the plan is handed in: the stream imports nothing of planning
    from ..plan.planning import LoadPlan


def _metadata(info: TensorInfo, data_start: int) -> SafetensorMetadata:
    """runai's metadata for one tensor, from the probe's header entry."""
    start = info.start - data_start
    return SafetensorMetadata(
        info.name, {"dtype": info.dtype, "shape": list(info.shape), "data_offsets": [start, start + info.nbytes]}
    )


def _shard_request(index: int, shard: Shard, names: Optional[frozenset[str]]) -> tuple[FileChunks, list]:
    """One shard's read request (its tensors' byte ranges, in file order) and their runai metadata."""
    infos = [t for t in shard.tensors.values() if names is None or t.name in names]
    request = FileChunks(index, shard.uri, [t.start for t in infos], [t.nbytes for t in infos])
    return request, [_metadata(t, shard.header_bytes) for t in infos]


class PlannedStreamer(SafetensorsStreamer):
    """runai's ``SafetensorsStreamer``, started from a :class:`LoadPlan` instead of its files' headers."""

    def stream_plan(self, plan: LoadPlan, *, device: str = "cpu", is_distributed: bool = False) -> None:
        """Stream exactly the plan's tensors (as ``stream_files`` with ``tensor_names`` would)."""
        self.files_to_tensors_metadata = {}
        self.total_size = 0
        self.device_str = device
        self.unaligned_copies = 0
        self.start_time = timer()
        requests = []
        for index, shard in enumerate(plan.shards):
            request, metadata = _shard_request(index, shard, plan.names)
            requests.append(request)
            self.files_to_tensors_metadata[index] = metadata
            self.total_size += request.total_size()
        discovery = {}
        if _takes_discover_ranks(self.file_streamer):
            discovery = {"discover_ranks": is_distributed}  # runai >= 0.17.1, as its SafetensorsStreamer passes it
        elif not is_distributed:
            _no_rank_discovery(self.file_streamer)  # runai 0.17.0: no parameter; the answer set beforehand
        self.file_streamer.stream_files(requests, credentials=None, device=device, is_distributed=is_distributed,
                                        owned=True, **discovery)  # fmt: skip
        self._log_ring()

    def bytes_from_storage(self) -> Optional[int]:
        """The tensor bytes this process reads from storage itself: all of them unless runai streams
        distributed, then its share of runai's partition (the rest arrives from the other ranks).
        None when runai's internals (0.17's ``DistributedStreamer``) do not say."""
        streamer = self.file_streamer
        if not getattr(streamer, "is_distributed", False):
            return self.total_size
        inner = getattr(streamer, "distributed_streamer", None)
        chunks = getattr(inner, "rank_file_chunks_list", None)
        if chunks is None:
            return None
        if not getattr(inner, "reading_from_storage", True):
            return 0
        try:
            return sum(int(fc.total_size()) for fc in chunks)
        except Exception:  # noqa: BLE001 - an internal of runai; a figure, never a failed load
            return None


def _takes_discover_ranks(streamer) -> bool:
    """Whether the installed runai's ``stream_files`` has 0.17.1's public ``discover_ranks``."""
    try:
        return "discover_ranks" in inspect.signature(streamer.stream_files).parameters
    except (TypeError, ValueError):
        return False


def _no_rank_discovery(streamer) -> None:
    """Keep a stream that is not distributed from joining a collective of the whole world.

    runai 0.17's ``DistributedStreamer.stream_files`` calls
    ``_distributedStreamerParams.set_params`` before it looks at
    ``is_distributed``, and that finds the ranks of each host with
    ``new_group`` and ``all_gather_object`` over the whole torch.distributed
    world whenever one is initialized: every rank of the world must stream at
    that moment. A load that only some ranks make (an MTP draft at pipeline
    parallel > 1, built on the last stage only) then hangs there (or breaks,
    once the other ranks are gone). A stream of one rank needs no discovery:
    the answer is set beforehand, as runai's own "not initialized" branch
    gives it. ``RUNAI_STREAMER_PROCESS_GROUP_SIZE`` (what runai would set from
    it) keeps the operator's value, and is restored after the load
    (``streaming.streamer_environment``). An internal of runai: where it is
    shaped otherwise, nothing is changed.
    """
    params = getattr(streamer, "params", None)
    if params is None or not hasattr(params, "num_processes_on_node") or params.num_processes_on_node is not None:
        return
    try:
        import torch.distributed as dist

        rank = dist.get_rank() if dist.is_initialized() else 0
    except Exception:  # noqa: BLE001 - no process group to ask: runai's own default
        rank = 0
    params.num_processes_on_node = int(os.environ.get("RUNAI_STREAMER_PROCESS_GROUP_SIZE") or 1)
    params.my_global_rank = rank
    params.groups_by_ranks = [[rank]]

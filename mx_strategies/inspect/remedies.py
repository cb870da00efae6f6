"""What to do about each problem a checkpoint or a source chain can have: one line per problem kind.

A refusal that says only what is wrong leaves the operator to work out the fix at 3 a.m.; the fix is known the
moment the kind is. This table is the one place that says it: :class:`.checkpoint.Problem` carries it into
doctor's output and ``--json`` (``remedy``), and a load's refusal prints it as its hint line
(:func:`remedy_for`). ``docs/doctor-json.md`` lists the same lines; ``tests/test_remedies.py`` holds the two
together.
"""

from __future__ import annotations

from typing import Iterable, Optional

_REMEDIES: dict[str, str] = {
    # warnings: robust loads around them
    "empty_shard": "nothing with mx_strategies.robust (it skips the file); elsewhere upgrade runai-model-streamer "
    "to 0.17.0 or newer, or delete the empty file",
    "unindexed_shard": "nothing: the file is not loaded, as vLLM does not load it; delete it if it is a leftover",
    "unindexed_tensor": "nothing for the load (the tensor is still loaded); regenerate the index if it matters",
    # errors: robust refuses the checkpoint
    "missing_tensor": "the shard or the index is stale: re-export the checkpoint, or re-upload the shard and its index",
    "missing_shard": "upload the missing file (an upload was interrupted), or regenerate the index if the file "
    "was meant to go",
    "duplicate_tensor": "re-export the checkpoint: which copy wins would depend on the load order",
    "corrupt_header": "re-upload the file (compare its size and checksum with the original)",
    "truncated_shard": "re-upload the file: an upload was interrupted (compare its size with the original)",
    "corrupt_index": "regenerate or re-upload model.safetensors.index.json",
    "corrupt_config": "fix or re-upload config.json",
    "duplicate_key": "re-export the file: one JSON object names a key twice",
    "unknown_dtype": "re-export the shard with a dtype safetensors defines",
    "unsupported_dtype": "convert the tensor to a dtype runai-model-streamer streams, or load with another loader",
    "bad_shape": "re-export the shard",
    "bad_offsets": "re-export the shard",
    "offset_gap": "re-export the shard",
    "offset_overlap": "re-export the shard",
    "trailing_bytes": "re-export or re-upload the shard",
    "not_regular_file": "replace it with the real file",
    "too_many_entries": "point the URI at the checkpoint's own folder, or lower MX_ROBUST_DISCOVERY_DEPTH",
    "no_checkpoint": "point at the checkpoint itself (MX_MODEL_URI=s3://bucket/model), not a config-only copy; "
    "convert .bin weights to safetensors",
    # the source chain and the engine (doctor's own kinds)
    "no_streamable_source": "set MX_MODEL_URI to the checkpoint (s3://, gs://, az:// or a local folder), or point "
    "the engine's model at it",
    "strategy_not_offered": "load with that engine's own loaders; robust needs an adapter with apply_weight_iter",
}


def remedy(kind: str) -> str:
    """The one line that says what to do about a problem of ``kind`` (every kind robust reports has one)."""
    return _REMEDIES[kind]


def remedy_for(kinds: Iterable[str]) -> Optional[str]:
    """The hint for a refusal over problems of these ``kinds``: each distinct remedy once, in first-seen order."""
    seen: list[str] = []
    for kind in kinds:
        line = _REMEDIES.get(kind)
        if line is not None and line not in seen:
            seen.append(line)
    return "; ".join(seen) or None


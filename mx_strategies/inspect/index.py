"""Inspect a checkpoint: find it in a store's listing, read its index, config.json and every header at once,
and check them against each other (shards the index names but the store lacks, tensors in two shards, in a
shard but not in the index, ...). Linear in the number of files, index entries and tensors.
"""

from __future__ import annotations

import posixpath
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Iterable, Mapping, Optional

from ..errors import NoCheckpoint
from ..settings import RUNAI_MAX_HEADER_BYTES
from .checkpoint import ERROR, INDEX_NAME, NEXTN_COUNT_KEYS, WARNING, Checkpoint, Problem, natural_key, quote
from .headers import read_header
from .jsonread import JsonRejected, read_json
from .storage import ObjectInfo, Store

_CONFIG_NAME = "config.json"
_SUFFIX = ".safetensors"
# The largest index and config.json a probe reads (DeepSeek-V3's index is about 9 MB); a larger one is a
# corrupt_index / corrupt_config problem, not read. Fixed (they were MX_ROBUST_MAX_INDEX_BYTES and
# MX_ROBUST_MAX_CONFIG_BYTES); read when a checkpoint is inspected.
_MAX_INDEX_BYTES = 64 << 20
_MAX_CONFIG_BYTES = 16 << 20
_READ_WORKERS = 16
_MAX_LAYER_COUNT = 65_536  # a layer count in config.json above this is no model (draft selection enumerates them)
_WARNINGS = {"empty_shard", "unindexed_shard", "unindexed_tensor"}  # the kinds found here that do not fail a load


def _problem(kind: str, file: Optional[str], tensor: Optional[str], message: str) -> Problem:
    return Problem(kind, WARNING if kind in _WARNINGS else ERROR, file, tensor, message)


def _locate(objects: Iterable[ObjectInfo]) -> tuple[str, list[ObjectInfo], Optional[ObjectInfo], Optional[ObjectInfo]]:
    """Find the checkpoint folder among the listed files.

    The top wins when it holds shards or an index; otherwise the shallowest
    folder that does (vLLM's ``model_streamer/<hash>`` cache and HF's
    ``snapshots/<rev>`` put them below). Two such folders at the same depth
    are ambiguous and rejected rather than guessed.
    Returns (root key, all files, index file, config file).
    """
    objects = list(objects)
    folders: dict[str, list[ObjectInfo]] = {}
    for obj in objects:
        if obj.key.endswith(_SUFFIX) or posixpath.basename(obj.key) == INDEX_NAME:
            folders.setdefault(posixpath.dirname(obj.key), []).append(obj)
    if not folders:
        names = sorted(o.key for o in objects)
        held = ", ".join(names[:5]) + (", ..." if len(names) > 5 else "") if names else "nothing"
        raise NoCheckpoint(f"no *.safetensors file (holds {held})")

    depth = {f: 0 if f == "" else f.count("/") + 1 for f in folders}
    candidates = sorted(f for f in folders if depth[f] == min(depth.values()))
    if len(candidates) > 1:
        raise NoCheckpoint(f"several checkpoint folders at the same depth: {', '.join(candidates)}")
    root = candidates[0]
    by_key = {o.key: o for o in objects}
    return root, objects, by_key.get(posixpath.join(root, INDEX_NAME)), by_key.get(posixpath.join(root, _CONFIG_NAME))


def _read_json(store: Store, obj: Optional[ObjectInfo], kind: str, cap: int) -> tuple[Optional[dict], list[Problem]]:
    """The index or config.json (None: there is none) through the guarded reader, and the ``kind`` problem (or
    duplicate_key) when it fails."""
    if obj is None:
        return None, []
    if not obj.regular:
        return None, [_problem("not_regular_file", obj.key, None,
                               f"{obj.uri}: is a {obj.kind}, not a regular file; not opened")]  # fmt: skip
    if obj.size > cap:
        size = f"{cap >> 20} MiB" if cap % (1 << 20) == 0 else f"{cap} bytes"
        return None, [_problem(kind, obj.key, None, f"{obj.uri}: {obj.size} bytes, over the fixed limit of {size}; "
                                                    "not read")]  # fmt: skip
    try:
        return read_json(store.read(obj, 0, obj.size), max_bytes=cap, cap_name="the fixed limit"), []
    except JsonRejected as exc:
        return None, [_problem("duplicate_key" if exc.reason == "duplicate_key" else kind, obj.key, None,
                               f"{obj.uri}: {exc}")]  # fmt: skip


def _check_config(config: dict, obj: ObjectInfo, problems: list[Problem]) -> Optional[dict]:
    """Layer counts draft selection relies on must be plausible integers; else a corrupt_config problem."""
    scopes = [config, *([config["text_config"]] if isinstance(config.get("text_config"), dict) else [])]
    for scope in scopes:
        for key in ("num_hidden_layers", *NEXTN_COUNT_KEYS):
            value = scope.get(key)
            if isinstance(value, (int, float)) and not (type(value) is int and 0 <= value <= _MAX_LAYER_COUNT):
                problems.append(_problem("corrupt_config", obj.key, None, f"{obj.uri}: {key}={quote(value)} is not a "
                                         f"layer count (an integer from 0 to {_MAX_LAYER_COUNT})"))  # fmt: skip
                return None
    return config


def _why_missing(key: str, max_depth: int, unreadable: Mapping[str, str]) -> str:
    """Why a listed checkpoint lacks ``key``, when the listing can tell."""
    depth = key.count("/")
    if not depth:
        return ""
    folder = key
    while unreadable and "/" in folder:
        folder = folder.rsplit("/", 1)[0]
        if folder in unreadable:
            return f"; its folder {folder} could not be listed ({unreadable[folder]})"
    if depth > max_depth:
        return f"; it lies {depth} folder levels down, beyond MX_ROBUST_DISCOVERY_DEPTH={max_depth}"
    return ""


def inspect(store: Store, max_depth: int, header_bytes: int = RUNAI_MAX_HEADER_BYTES) -> Checkpoint:
    """List ``store`` and read every header; raise NoCheckpoint if it has no shard.

    ``header_bytes``: the longest shard header read (MX_ROBUST_MAX_HEADER_BYTES; runai's own limit when not
    given). StoreError (listing, access) propagates: the caller names the candidate.
    """
    root, objects, index_obj, config_obj = _locate(store.list(max_depth))
    # Index, config and every header beside them are read at once: on an object store each read
    # is a round trip, and none of them depends on another (the index only adds shards elsewhere).
    local_shards = [o for o in objects if posixpath.dirname(o.key) == root and o.key.endswith(_SUFFIX)]
    pool = ThreadPoolExecutor(max_workers=min(_READ_WORKERS, len(local_shards) + 2))
    try:
        index_read = pool.submit(_read_json, store, index_obj, "corrupt_index", _MAX_INDEX_BYTES)
        config_read = pool.submit(_read_json, store, config_obj, "corrupt_config", _MAX_CONFIG_BYTES)
        headers = {obj.key: pool.submit(read_header, store, obj, header_bytes) for obj in local_shards}
        (index, problems), (config, config_problems) = index_read.result(), config_read.result()
        problems += config_problems
        if config is not None:
            config = _check_config(config, config_obj, problems)
        shard_keys, weight_map = _index_shards(store, max_depth, root, objects, index_obj, index, problems)
        by_key = {o.key: o for o in objects}
        for key in shard_keys:  # shards the index names outside the checkpoint folder
            if key in by_key and key not in headers:
                headers[key] = pool.submit(read_header, store, by_key[key], header_bytes)
        read_shards = [headers[key].result() for key in sorted(headers, key=natural_key)]
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
    shards, outside_index = [], []
    for shard, shard_problems in read_shards:
        if index is None or shard.key in shard_keys:
            shards.append(shard)
            problems.extend(shard_problems)
        elif shard.empty:
            outside_index.append(shard)
            problems.append(_problem("empty_shard", shard.key, None, f"{shard.uri}: holds no tensor; skipped"))
        else:  # vLLM, too, loads only the files the index names (e.g. not consolidated.safetensors)
            outside_index.append(shard)
            problems.append(_problem("unindexed_shard", shard.key, None,
                                     f"{shard.uri}: not named by {INDEX_NAME}; not loaded"))  # fmt: skip
    _check_tensors(shards, weight_map, problems)
    return Checkpoint(store.root, root, shards, index, config, problems, outside_index)


def _index_shards(store: Store, max_depth: int, root: str, objects: list[ObjectInfo], index_obj: Optional[ObjectInfo],
                  index: Optional[dict], problems: list[Problem]) -> tuple[set[str], dict[str, str]]:
    """(the shards the index names, its weight_map with keys resolved below the source); a shard named but not
    listed is a missing_shard problem, an index naming none of the listed shards no checkpoint."""
    if index is None:
        return set(), {}
    weight_map: dict[str, str] = {}
    raw_map = index.get("weight_map")
    if not isinstance(raw_map, dict):
        problems.append(_problem("corrupt_index", index_obj.key, None, f"{index_obj.uri}: no weight_map"))
    elif (bad := next(((t, f) for t, f in raw_map.items() if not isinstance(f, str) or not f), None)) is not None:
        problems.append(_problem("corrupt_index", index_obj.key, bad[0], f"{index_obj.uri}: weight_map names "
                                 f"{quote(bad[1])} as the file of tensor {quote(bad[0])}, not a file name"))
    else:
        resolved = {f: posixpath.normpath(posixpath.join(root, f)) for f in set(raw_map.values())}  # each file once
        weight_map = {t: resolved[f] for t, f in raw_map.items()}
    shard_keys = set(weight_map.values())
    listed = {o.key for o in objects}
    if shard_keys and not shard_keys & listed:
        raise NoCheckpoint(f"holds {INDEX_NAME} but none of the {len(shard_keys)} shard(s) it names "
                           "(a config-only copy?)")
    counts = Counter(weight_map.values())
    unreadable = getattr(store, "unreadable", None) or {}
    for key in sorted(shard_keys - listed):
        problems.append(_problem("missing_shard", key, None, f"{store.root}/{key}: named by {INDEX_NAME} for "
                                 f"{counts[key]} tensor(s) but not found{_why_missing(key, max_depth, unreadable)}"))
    return shard_keys, weight_map


def _check_tensors(shards: list, weight_map: dict[str, str], problems: list[Problem]) -> None:
    """Empty shards, tensors in two shards, and (given an index) tensors the index and the headers disagree on."""
    owner: dict[str, str] = {}
    for shard in shards:
        if shard.empty:
            problems.append(_problem("empty_shard", shard.key, None, f"{shard.uri}: holds no tensor; skipped"))
        for name in shard.tensors:
            if name in owner:
                problems.append(_problem("duplicate_tensor", shard.key, name,
                                         f"tensor {name!r} is in both {owner[name]} and {shard.key}"))  # fmt: skip
            else:
                owner[name] = shard.key
    if not weight_map:
        return
    # A name in two shards is a duplicate_tensor already; only a header really lacking it is this.
    held = {s.key: s.tensors for s in shards if s.readable}
    for name, key in weight_map.items():
        if key in held and name not in held[key]:
            where = f"; it is in {owner[name]}" if name in owner else ""
            problems.append(_problem("missing_tensor", key, name, f"{INDEX_NAME} names tensor {name!r} in {key}, but "
                                     f"that shard's header lacks it{where}"))  # fmt: skip
    for name, key in owner.items():
        if name not in weight_map:
            problems.append(_problem("unindexed_tensor", key, name, f"tensor {name!r} in {key} is not in {INDEX_NAME}"))

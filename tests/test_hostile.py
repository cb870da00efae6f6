"""Hostile checkpoints: every bad input ends in a named, bounded failure, before the model is touched.

Each case builds a small checkpoint (three shards, an index, a config.json)
and damages one thing. It then asserts the exact outcome on both sides that
read checkpoints:

- ``mx-strategies doctor`` exits 1 and names the problem (kind, file), and its
  human output renders (no traceback, names printed as themselves);
- the strategy, run through ModelExpress's real chain with
  ``MX_STRATEGY=mx_strategies.robust``, fails with
  ``StrategyFailed(mutated=False)`` naming the file, the model untouched and
  not rebuilt; or, for a valid but unusual file, loads correctly.

Time is bounded by pytest-timeout; memory, for the cases that once grew
without bound, by running doctor in a child process under ``RLIMIT_AS``.
Cases that apply to object stores also run on moto S3 (fixture ``s3``).
A hypothesis property test feeds random bytes and random JSON as header,
index and config: nothing but the named problems (or ``NoCheckpoint``) comes
out. See docs/faults.md, "Hostile checkpoints".
"""

from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import pytest
import torch
from hypothesis import HealthCheck, given, settings as hsettings, strategies as st
from modelexpress.load_strategy import LoadStrategyChain

import mx_strategies.robust as robust_module
from mx_strategies import activation
from mx_strategies.inspect.checkpoint import INDEX_NAME
from mx_strategies.inspect.headers import _DTYPE_BITS, read_header
from mx_strategies.inspect.index import inspect
from mx_strategies.cli import main as cli_main
from mx_strategies.errors import ConfigurationError, ContentMismatch, MxStrategiesError
from mx_strategies.inspect.jsonread import JsonRejected, read_json
from mx_strategies.observe.report import clear_reports, recent_reports
from mx_strategies.settings import load_settings
from mx_strategies.inspect.storage import LocalStore, ObjectInfo
from mx_strategies.testing import synthetic
from mx_strategies.engine import EngineView
from mx_strategies.plan.planning import plan_of
from mx_strategies.select.built_module import BuiltModule
from mx_strategies.select.selection import select_tensors
from mx_strategies.stream.streaming import VerifiedStream
from helpers.checkpoints import write_shard
from helpers.engine import CountingAdapter, RecordingModel, make_context, model_config, vllm_config

REPO = Path(__file__).resolve().parents[1]
SHARDS = 3
SHARD2 = f"model-00002-of-{SHARDS:05d}.safetensors"
A = "model.layers.1.a.weight"  # F32[4,4], data bytes 0-64 of shard 2
B = "model.layers.1.b.weight"  # F32[4], data bytes 64-80 of shard 2
TARGET = EngineView(False, None, (), 1, 1, None, {})

pytestmark = pytest.mark.timeout(60)


# -- checkpoints -----------------------------------------------------------------


def shard_tensors(i: int) -> dict[str, torch.Tensor]:
    return {
        f"model.layers.{i}.a.weight": torch.arange(16, dtype=torch.float32).reshape(4, 4) + 100 * i,
        f"model.layers.{i}.b.weight": torch.arange(4, dtype=torch.float32) + 100 * i,
    }


def write_base(path: Path, config: Optional[dict] = None) -> dict[str, torch.Tensor]:
    """Three shards, an index and a config.json; returns every tensor."""
    shards = [shard_tensors(i) for i in range(SHARDS)]
    synthetic.write_shards(str(path), shards)
    (path / "config.json").write_text(json.dumps(config or {"num_hidden_layers": SHARDS}))
    return {name: t for shard in shards for name, t in shard.items()}


def read_st(path: Path) -> tuple[dict, bytes]:
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    return json.loads(raw[8 : 8 + n]), raw[8 + n :]


def write_st(path: Path, header, data: bytes) -> None:
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)


def with_raw(header: dict, name: str, field: str, text: str) -> bytes:
    """``header`` as JSON with ``header[name][field]`` written as the raw JSON ``text``."""
    header[name][field] = "@@RAW@@"
    return json.dumps(header).encode().replace(b'"@@RAW@@"', text.encode())


# -- outcomes --------------------------------------------------------------------


def doctor(uri: str, capsys, *extra: str) -> tuple[int, dict, str]:
    """doctor --json and the human output; returns (exit code, report, human text)."""
    capsys.readouterr()
    code = cli_main(["doctor", "--json", *extra, uri])
    captured = capsys.readouterr()
    report = json.loads(captured.out) if captured.out.strip() else {}
    human_code = cli_main(["doctor", *extra, uri])
    human = capsys.readouterr()
    assert human_code == code, human.err
    assert "Traceback" not in human.out + human.err
    return code, report, human.out


def problem(report: dict, kind: str, file: Optional[str] = None) -> dict:
    found = [p for p in report.get("problems", []) if p["kind"] == kind and (file is None or p["file"] == file)]
    assert found, f"no {kind} problem for {file}: {[(p['kind'], p['file']) for p in report.get('problems', [])]}"
    return found[0]


@dataclass
class ChainOutcome:
    model: RecordingModel
    adapter: CountingAdapter
    failure: Optional[dict]  # the strategy's LoadFailure as recorded, None if it loaded


def run_chain(reference: dict, *, names=None, draft: bool = False, hf_config=None) -> ChainOutcome:
    """ModelExpress's real chain with the robust strategy (fixture ``robust``) in place of model_streamer."""
    clear_reports()
    make = lambda: RecordingModel(reference, names)  # noqa: E731
    adapter = CountingAdapter(make, vllm_config=vllm_config("mtp") if draft else None)
    model = make()
    mc = model_config(runner_type="draft" if draft else "generate", hf_config=hf_config)
    try:
        LoadStrategyChain.run(model, make_context(mc, adapter, draft=draft))
    except RuntimeError as exc:  # no strategy left after ours (the stand-in engine has no default loader)
        assert "No loading strategy succeeded" in str(exc), exc
    failures = [r for r in recent_reports() if r["outcome"] == "failed"]
    assert len(failures) <= 1
    return ChainOutcome(model, adapter, failures[0] if failures else None)


def assert_refused(outcome: ChainOutcome, *fragments: str) -> str:
    """StrategyFailed(mutated=False) naming the fragments; the model untouched and not rebuilt."""
    assert outcome.failure is not None, "the hostile checkpoint was loaded"
    message = outcome.failure["error"]
    assert outcome.failure["mutated"] is False, message
    for fragment in fragments:
        assert fragment in message, (fragment, message)
    assert outcome.model.loaded == [] and outcome.adapter.reinit_calls == 0
    return message


def assert_loaded(outcome: ChainOutcome, reference: dict) -> None:
    assert outcome.failure is None, outcome.failure
    assert sorted(outcome.model.loaded) == sorted(reference)
    assert outcome.model.matching(reference) == len(reference)
    assert outcome.adapter.reinit_calls == 0


def place(kind: str, path: Path, request) -> str:
    """The checkpoint's URI: the folder itself, or an upload to moto S3."""
    if kind == "local":
        return str(path)
    s3 = request.getfixturevalue("s3")
    return s3.upload(str(path), s3.bucket, "ckpt")


# -- header cases ------------------------------------------------------------------


def _shape(text: str, name: str = A) -> Callable:
    return lambda h, d: (with_raw(h, name, "shape", text), d)


def _gap(h, d):
    h[B]["data_offsets"] = [68, 84]
    return h, d[:64] + b"\0" * 4 + d[64:]


def _first_not_at_zero(h, d):
    for name in (A, B):
        h[name]["data_offsets"] = [x + 8 for x in h[name]["data_offsets"]]
    return h, b"\0" * 8 + d


def _overlap(h, d):
    h[B]["data_offsets"] = [60, 76]
    return h, d[:76]


def _duplicate_key(h, d):
    raw = json.dumps(h).encode()
    entry = json.dumps(h[B]).encode()
    return raw[:-1] + b', "' + A.encode() + b'": ' + entry + b"}", d


def _unsupported(h, d):
    h[A] = {"dtype": "F8_E4M3FNUZ", "shape": [8, 8], "data_offsets": h[A]["data_offsets"]}
    return h, d


def _markup_name(h, d):
    h["[/bold]x[red]"] = h.pop(B)
    h["[/bold]x[red]"]["shape"] = [-4]
    return h, d


def _set(name: str, field: str, value) -> Callable:
    def change(h, d):
        h[name][field] = value
        return h, d

    return change


# name -> (change to shard 2's header and data, problem kind, message fragment)
HEADER_CASES = {
    "deeply_nested_json": (
        lambda h, d: (b'{"x":' + b"[" * 100_000 + b"]" * 100_000 + b"}", d), "corrupt_header", "nested deeper than"),
    "infinity_in_shape": (_shape("[Infinity, 4]"), "corrupt_header", "Infinity is not a JSON number"),
    "1e400_in_shape": (_shape("[1e400]"), "corrupt_header", "is not finite"),
    "5000_digit_int": (_shape("[" + "9" * 5000 + "]"), "corrupt_header", "an integer of 5000 digits"),
    "negative_shape": (_shape("[-1, -4]"), "bad_shape", "not a list of non-negative integers"),
    "float_shape": (_shape("[4.0]", B), "bad_shape", "not a list of non-negative integers"),
    "bool_in_shape": (_shape("[true, 4]"), "bad_shape", "not a list of non-negative integers"),
    "negative_shape_reversed_offsets": (
        lambda h, d: (with_raw(_set(A, "data_offsets", [64, 0])(h, d)[0], A, "shape", "[-4, -4]"), d),
        "bad_shape", "not a list of non-negative integers"),
    "reversed_offsets": (_set(A, "data_offsets", [64, 0]), "bad_offsets", "not two ordered non-negative"),
    "unknown_dtype": (_set(A, "dtype", "F33"), "unknown_dtype", "unknown dtype 'F33'"),
    "unsupported_dtype": (_unsupported, "unsupported_dtype", "runai-model-streamer cannot stream"),
    "size_mismatch": (_set(A, "shape", [4, 5]), "corrupt_header", "does not match F32[4, 5]"),
    "gap_between_tensors": (_gap, "offset_gap", "a gap of 4 bytes"),
    "first_tensor_not_at_0": (_first_not_at_zero, "offset_gap", "the data section starts"),
    "overlapping_tensors": (_overlap, "offset_overlap", "overlapping data"),
    "trailing_bytes": (lambda h, d: (h, d + b"\0" * 8), "trailing_bytes", "8 bytes after the last tensor"),
    "duplicate_key": (_duplicate_key, "duplicate_key", f"names tensor '{A}' twice"),
    "lone_surrogate_name": (
        lambda h, d: (json.dumps(h).encode().replace(A.encode(), b"\\ud800"), d), "corrupt_header", "lone surrogate"),
    "metadata_not_strings": (
        lambda h, d: ({"__metadata__": {"format": 1}, **h}, d), "corrupt_header", "__metadata__ is not an object"),
    "entry_not_an_object": (lambda h, d: ({**h, "x": 5}, d), "corrupt_header", "entry is not an object"),
    "markup_in_a_tensor_name": (_markup_name, "bad_shape", "[/bold]x[red]"),
}  # fmt: skip
S3_HEADER_CASES = ["negative_shape", "gap_between_tensors", "trailing_bytes", "duplicate_key", "deeply_nested_json"]


def damaged_header(tmp_path: Path, case: str) -> tuple[Path, dict]:
    folder = tmp_path / "ckpt"
    reference = write_base(folder)
    header, data = read_st(folder / SHARD2)
    assert header[A]["data_offsets"] == [0, 64] and header[B]["data_offsets"] == [64, 80]
    change, _, _ = HEADER_CASES[case]
    write_st(folder / SHARD2, *change(header, data))
    return folder, reference


@pytest.mark.parametrize(
    "kind, case",
    [("local", c) for c in HEADER_CASES] + [("s3", c) for c in S3_HEADER_CASES],
)
def test_hostile_header(kind, case, tmp_path, request, robust, monkeypatch, capsys):
    folder, reference = damaged_header(tmp_path, case)
    uri = place(kind, folder, request)
    _, problem_kind, fragment = HEADER_CASES[case]

    code, report, human = doctor(uri, capsys)
    assert code == 1
    found = problem(report, problem_kind, SHARD2)
    assert fragment in found["message"]
    assert found["severity"] == "error"
    assert problem_kind in human and SHARD2 in human

    monkeypatch.setenv("MX_MODEL_URI", uri)
    assert_refused(run_chain(reference), f"{uri}/{SHARD2}", fragment)


def test_markup_in_names_prints_as_itself(tmp_path, capsys):
    """A tensor named ``[/bold]x[red]`` and a file named ``model-[red].safetensors`` print literally."""
    folder, _ = damaged_header(tmp_path, "markup_in_a_tensor_name")
    odd = folder / "model-[red].safetensors"
    write_shard(str(odd), {"odd.weight": torch.ones(2)})
    code, report, human = doctor(str(folder), capsys)
    assert code == 1
    assert "[/bold]x[red]" in human
    assert "model-[red].safetensors" in human  # an unindexed shard, listed in the shards table
    problem(report, "unindexed_shard", "model-[red].safetensors")


@pytest.mark.parametrize("kind", ["local", "s3"])
def test_valid_c64_and_zero_size_tensors_load(kind, tmp_path, request, robust, monkeypatch):
    """C64 is valid safetensors that runai streams; so is a zero-size tensor sharing an offset."""
    folder = tmp_path / "ckpt"
    shards = [shard_tensors(i) for i in range(SHARDS)]
    shards[1][A] = torch.complex(torch.arange(8.0), torch.ones(8)).reshape(4, 2)
    shards[1]["model.layers.1.empty"] = torch.zeros(0, 4)
    synthetic.write_shards(str(folder), shards)
    reference = {name: t for shard in shards for name, t in shard.items()}
    uri = place(kind, folder, request)
    monkeypatch.setenv("MX_MODEL_URI", uri)
    assert_loaded(run_chain(reference), reference)


# -- index and config.json -----------------------------------------------------------


def _index(folder: Path) -> dict:
    return json.loads((folder / INDEX_NAME).read_text())


def _write_index(folder: Path, text: str) -> None:
    (folder / INDEX_NAME).write_text(text)


def _index_value_not_a_string(folder: Path) -> None:
    index = _index(folder)
    index["weight_map"][A] = 123
    _write_index(folder, json.dumps(index))


def _index_duplicate_key(folder: Path) -> None:
    text = json.dumps(_index(folder))
    _write_index(folder, text.replace('"weight_map": {', f'"weight_map": {{"{A}": "{SHARD2}", ', 1))


def _index_deep(folder: Path) -> None:
    _write_index(folder, '{"metadata": ' + "[" * 50_000 + "]" * 50_000 + ', "weight_map": {}}')


def _index_big_int(folder: Path) -> None:
    index = _index(folder)
    _write_index(folder, json.dumps(index).replace("{", '{"total_size": ' + "7" * 5000 + ", ", 1))


def _index_not_json(folder: Path) -> None:
    _write_index(folder, "{ not json")


def _config(text: str) -> Callable[[Path], None]:
    return lambda folder: (folder / "config.json").write_text(text)


# name -> (change, problem kind, file, message fragment)
FILE_CASES = {
    "index_value_not_a_string": (_index_value_not_a_string, "corrupt_index", INDEX_NAME, "not a file name"),
    "index_duplicate_key": (_index_duplicate_key, "duplicate_key", INDEX_NAME, "appears twice"),
    "index_deeply_nested": (_index_deep, "corrupt_index", INDEX_NAME, "nested deeper than"),
    "index_5000_digit_int": (_index_big_int, "corrupt_index", INDEX_NAME, "digits"),
    "index_not_json": (_index_not_json, "corrupt_index", INDEX_NAME, "not valid JSON"),
    "config_not_json": (_config("{ not json"), "corrupt_config", "config.json", "not valid JSON"),
    "config_deeply_nested": (_config("[" * 100_000), "corrupt_config", "config.json", "nested deeper than"),
    "config_infinity": (_config('{"rope_theta": Infinity}'), "corrupt_config", "config.json", "Infinity"),
    "config_not_an_object": (_config("[1, 2]"), "corrupt_config", "config.json", "not a JSON object"),
    "config_absurd_layer_count": (
        _config('{"num_hidden_layers": 3, "num_nextn_predict_layers": 10000000}'),
        "corrupt_config", "config.json", "num_nextn_predict_layers=10000000 is not a layer count"),
    "config_bool_layer_count": (
        _config('{"num_hidden_layers": true}'), "corrupt_config", "config.json", "not a layer count"),
}  # fmt: skip
S3_FILE_CASES = ["index_value_not_a_string", "index_deeply_nested", "config_not_json", "config_absurd_layer_count"]


@pytest.mark.parametrize("kind, case", [("local", c) for c in FILE_CASES] + [("s3", c) for c in S3_FILE_CASES])
def test_hostile_index_and_config(kind, case, tmp_path, request, robust, monkeypatch, capsys):
    folder = tmp_path / "ckpt"
    reference = write_base(folder)
    change, problem_kind, file, fragment = FILE_CASES[case]
    change(folder)
    uri = place(kind, folder, request)

    code, report, _ = doctor(uri, capsys)
    assert code == 1
    assert fragment in problem(report, problem_kind, file)["message"]

    monkeypatch.setenv("MX_MODEL_URI", uri)
    assert_refused(run_chain(reference), f"{uri}/{file}", fragment)


def test_absurd_layer_count_refuses_a_draft_load_quickly(tmp_path, robust, monkeypatch):
    """num_nextn_predict_layers=10,000,000 once took a draft load to 2.8 GB and 11 s."""
    folder = tmp_path / "ckpt"
    reference = write_base(folder, {"num_hidden_layers": 2, "num_nextn_predict_layers": 10_000_000})
    monkeypatch.setenv("MX_MODEL_URI", str(folder))
    outcome = run_chain(reference, names=[], draft=True)
    assert_refused(outcome, f"{folder}/config.json", "not a layer count")
    # Quickly: the module's hang guard (pytestmark); the memory bound is the child test below.


@pytest.mark.parametrize("kind", ["local", "s3"])
def test_index_over_its_cap_is_not_read(kind, tmp_path, request, robust, monkeypatch, capsys):
    folder = tmp_path / "ckpt"
    reference = write_base(folder)
    uri = place(kind, folder, request)
    monkeypatch.setattr("mx_strategies.inspect.index._MAX_INDEX_BYTES", 256)
    code, report, _ = doctor(uri, capsys)
    assert code == 1
    assert "over the fixed limit of 256 bytes; not read" in problem(report, "corrupt_index", INDEX_NAME)["message"]
    monkeypatch.setenv("MX_MODEL_URI", uri)
    assert_refused(run_chain(reference), f"{uri}/{INDEX_NAME}", "fixed limit of 256 bytes")


# -- local discovery ---------------------------------------------------------------------


def _fifo(name: str) -> Callable[[Path], str]:
    def make(folder: Path) -> str:
        (folder / name).unlink()
        os.mkfifo(folder / name)
        return name

    return make


def _socket(name: str) -> Callable[[Path], str]:
    def make(folder: Path) -> str:
        (folder / name).unlink()
        sock = socket.socket(socket.AF_UNIX)
        # Bound by a path relative to the folder: a socket's path may hold 107 bytes, and the test's
        # temporary folder may lie deeper than that (scripts/test.sh gives each run a folder of its own).
        here = os.getcwd()
        os.chdir(folder)
        try:
            sock.bind(name)
        finally:
            os.chdir(here)
            sock.close()
        return name

    return make


def _device(name: str) -> Callable[[Path], str]:
    def make(folder: Path) -> str:
        (folder / name).unlink()
        (folder / name).symlink_to("/dev/zero")
        return name

    return make


SPECIAL_FILES = {
    "fifo_config": (_fifo("config.json"), "FIFO"),
    "fifo_index": (_fifo(INDEX_NAME), "FIFO"),
    "fifo_shard": (_fifo(SHARD2), "FIFO"),
    "socket_index": (_socket(INDEX_NAME), "socket"),
    "device_config": (_device("config.json"), "character device"),
    "device_shard": (_device(SHARD2), "character device"),
}


@pytest.mark.timeout(30)
@pytest.mark.parametrize("case", sorted(SPECIAL_FILES))
def test_special_files_are_never_opened(case, tmp_path, robust, monkeypatch, capsys):
    """A FIFO named config.json once hung doctor and the load forever in open()."""
    folder = tmp_path / "c"
    reference = write_base(folder)
    make, what = SPECIAL_FILES[case]
    name = make(folder)
    code, report, _ = doctor(str(folder), capsys)
    assert code == 1
    assert f"is a {what}, not a regular file; not opened" in problem(report, "not_regular_file", name)["message"]
    monkeypatch.setenv("MX_MODEL_URI", str(folder))
    assert_refused(run_chain(reference), f"{folder}/{name}", "not a regular file")


def test_reading_a_special_file_never_blocks(tmp_path):
    os.mkfifo(tmp_path / "pipe")
    store = LocalStore(str(tmp_path))
    (listed,) = store.list(0)
    assert listed.kind == "FIFO" and not listed.regular
    with pytest.raises(MxStrategiesError, match="not a regular file"):
        store.read(listed, 0, 8)


def _loops(folder: Path, count: int, depth: int) -> None:
    """``count`` symlinks to ``.`` in each of ``depth`` nested folders."""
    here = folder
    for level in range(depth):
        for i in range(count):
            (here / f"loop{i}").symlink_to(".")
        if level + 1 < depth:
            here = here / "sub"
            here.mkdir()


@pytest.mark.timeout(30)
@pytest.mark.parametrize("count, depth, setting", [(100, 1, "3"), (6, 8, "8")])
def test_symlink_loops_are_walked_once(count, depth, setting, tmp_path, robust, monkeypatch, capsys):
    """100 ``-> .`` links at the default depth, or 6 per level at depth 8, once ran for minutes and GBs."""
    folder = tmp_path / "ckpt"
    reference = write_base(folder)
    _loops(folder, count, depth)
    monkeypatch.setenv("MX_ROBUST_DISCOVERY_DEPTH", setting)
    code, report, _ = doctor(str(folder), capsys)
    assert code == 0, report["problems"]
    assert report["summary"]["tensors"] == len(reference)
    monkeypatch.setenv("MX_MODEL_URI", str(folder))
    assert_loaded(run_chain(reference), reference)


def test_discovery_follows_symlinks_but_visits_each_folder_once(tmp_path):
    real = tmp_path / "root" / "snapshots" / "rev"
    write_base(real)
    (tmp_path / "root" / "latest").symlink_to(real)
    (real / "back").symlink_to(tmp_path / "root")
    keys = sorted(o.key for o in LocalStore(str(tmp_path / "root")).list(8))
    assert f"latest/{SHARD2}" in keys  # the shallowest way in wins
    assert not any(k.startswith("snapshots/rev/") for k in keys)
    assert len(keys) == len(set(keys)) == SHARDS + 2


def test_walk_past_its_entry_bound_is_a_named_failure(tmp_path, robust, monkeypatch, capsys):
    folder = tmp_path / "ckpt"
    reference = write_base(folder)
    for i in range(30):
        (folder / f"junk{i}.txt").write_text("x")
    monkeypatch.setattr("mx_strategies.inspect.storage._MAX_DISCOVERY_ENTRIES", 20)
    code, report, _ = doctor(str(folder), capsys)
    assert code == 1
    assert "more than 20 entries" in problem(report, "too_many_entries")["message"]
    monkeypatch.setenv("MX_MODEL_URI", str(folder))
    assert_refused(run_chain(reference), str(folder), "more than 20 entries", "a fixed limit")


@pytest.mark.parametrize("kind", ["local", "s3"])
def test_shard_beyond_the_discovery_depth_says_so(kind, tmp_path, request, robust, monkeypatch, capsys):
    folder = tmp_path / "ckpt"
    reference = write_base(folder)
    deep = folder / "a" / "b" / "c" / "d"
    deep.mkdir(parents=True)
    (folder / SHARD2).rename(deep / SHARD2)
    index = _index(folder)
    index["weight_map"] = {t: (f"a/b/c/d/{f}" if f == SHARD2 else f) for t, f in index["weight_map"].items()}
    _write_index(folder, json.dumps(index))
    uri = place(kind, folder, request)
    key = f"a/b/c/d/{SHARD2}"
    code, report, _ = doctor(uri, capsys)
    assert code == 1
    assert "beyond MX_ROBUST_DISCOVERY_DEPTH=3" in problem(report, "missing_shard", key)["message"]
    monkeypatch.setenv("MX_MODEL_URI", uri)
    assert_refused(run_chain(reference), f"{uri}/{key}", "beyond MX_ROBUST_DISCOVERY_DEPTH=3")


def test_shard_in_an_unreadable_folder_says_so(tmp_path, robust, monkeypatch, capsys):
    folder = tmp_path / "ckpt"
    reference = write_base(folder)
    (folder / "locked").mkdir()
    (folder / SHARD2).rename(folder / "locked" / SHARD2)
    index = _index(folder)
    index["weight_map"] = {t: (f"locked/{f}" if f == SHARD2 else f) for t, f in index["weight_map"].items()}
    _write_index(folder, json.dumps(index))
    real_scandir = os.scandir

    def scandir(path="."):  # the tests run as root, whom chmod does not stop
        if os.path.basename(str(path)) == "locked":
            raise PermissionError(13, "Permission denied", str(path))
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", scandir)
    code, report, _ = doctor(str(folder), capsys)
    assert code == 1
    message = problem(report, "missing_shard", f"locked/{SHARD2}")["message"]
    assert "its folder locked could not be listed (Permission denied)" in message
    monkeypatch.setenv("MX_MODEL_URI", str(folder))
    assert_refused(run_chain(reference), "could not be listed (Permission denied)")


# -- scale: no quadratic paths, a summarised report --------------------------------------


def _index_with_missing(folder: Path, missing: int) -> None:
    index = _index(folder)
    index["weight_map"].update({f"ghost.{i}.weight": f"ghost-{i:06d}.safetensors" for i in range(missing)})
    _write_index(folder, json.dumps(index))


@pytest.mark.timeout(180)  # a hang guard: quadratic work (33 s for 40k once) does not finish 100k
def test_index_naming_100k_absent_shards_is_linear_and_summarised(tmp_path, robust, monkeypatch):
    """40k absent shards once took 33 s and 100k did not finish; 100k problems took 49 s to print."""
    import io

    from mx_strategies.cli.doctor import console_for, diagnose, render

    folder = tmp_path / "ckpt"
    reference = write_base(folder)
    _index_with_missing(folder, 100_000)
    report = diagnose(str(folder))
    assert report.exit_code == 1
    assert sum(1 for p in report.as_dict()["problems"] if p["kind"] == "missing_shard") == 100_000
    out = io.StringIO()
    render(report, console_for(out))
    human = out.getvalue()
    assert "Problems by kind (100000 in all)" in human
    assert "`--json` lists all 100000 problems" in human
    assert human.count("ghost-") <= 10  # the first few, not all of them
    monkeypatch.setenv("MX_MODEL_URI", str(folder))
    assert_refused(run_chain(reference), "ghost-000000.safetensors", "(and 99995 more)")


# -- memory: bounded in a child process ----------------------------------------------------

CHILD = textwrap.dedent(
    """
    import json, resource, sys
    import torch  # noqa: F401  (imported before the limit: torch maps much address space)
    from mx_strategies.inspect.headers import runai_dtypes
    from mx_strategies.cli.doctor import diagnose

    runai_dtypes()
    def vm_bytes():
        with open("/proc/self/status") as status:
            return next(int(l.split()[1]) * 1024 for l in status if l.startswith("VmSize:"))
    cases, budget, small = json.loads(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    resource.setrlimit(resource.RLIMIT_AS, (vm_bytes() + budget, resource.RLIM_INFINITY))
    results = {}
    for name, uri in cases.items():
        try:
            report = diagnose(uri)
            results[name] = {"exit": report.exit_code, "kinds": sorted({p.kind for p in report.problems})}
            del report
        except MemoryError:
            results[name] = {"exit": None, "kinds": ["MemoryError"]}
    # The limit is real: with only a little room left, the 100 MiB header does not fit.
    resource.setrlimit(resource.RLIMIT_AS, (vm_bytes() + small, resource.RLIM_INFINITY))
    try:
        diagnose(cases["100MiB_header"])
        results["small_budget"] = "fitted"
    except MemoryError:
        results["small_budget"] = "MemoryError"
    print(json.dumps(results))
    """
)
CHILD_BUDGET = 768 * 1024 * 1024
SMALL_BUDGET = 64 * 1024 * 1024


def bounded_doctor(cases: dict[str, str]) -> dict:
    """doctor on each URI in one child under RLIMIT_AS (its size after imports + CHILD_BUDGET)."""
    child_env = {k: v for k, v in os.environ.items() if not k.startswith(("MX_ROBUST_", "MX_MODEL_URI"))}
    child_env.update({"PYTHONPATH": str(REPO), "MALLOC_ARENA_MAX": "2"})
    done = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(cases), str(CHILD_BUDGET), str(SMALL_BUDGET)],
        capture_output=True, text=True, env=child_env, timeout=55,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _sparse(path: Path, size: int, head: bytes = b"") -> None:
    with open(path, "wb") as handle:
        handle.write(head)
        handle.truncate(size)


def _huge_index(folder: Path) -> None:
    _sparse(folder / INDEX_NAME, 1 << 30, b'{"weight_map": {')


def _huge_config(folder: Path) -> None:
    _sparse(folder / "config.json", 1 << 30, b'{"a": "')


def _huge_header(folder: Path) -> None:
    length = 100 * 1024 * 1024 - 8
    _sparse(folder / SHARD2, 8 + length + 80, struct.pack("<Q", length) + b'{"a": {"dtype": "F32", "shape": [')


def _absurd_layers(folder: Path) -> None:
    (folder / "config.json").write_text('{"num_hidden_layers": 2, "num_nextn_predict_layers": 10000000}')


# name -> (damage, the problem doctor must name; None: a clean checkpoint)
MEMORY_CASES = {
    "1GiB_index": (_huge_index, "corrupt_index"),
    "1GiB_config": (_huge_config, "corrupt_config"),
    "100MiB_header": (_huge_header, "corrupt_header"),
    "absurd_nextn_layers": (_absurd_layers, "corrupt_config"),
    "symlink_loops": (lambda folder: _loops(folder, 100, 1), None),
    "symlink_loops_depth_8": (lambda folder: _loops(folder, 6, 8), None),
    "100k_absent_shards": (lambda folder: _index_with_missing(folder, 100_000), "missing_shard"),
}


@pytest.fixture(scope="module")
def bounded_results(tmp_path_factory) -> dict:
    """Every memory case, inspected by doctor in one child process under a memory limit."""
    cases = {}
    for name, (damage, _) in MEMORY_CASES.items():
        folder = tmp_path_factory.mktemp(name) / "ckpt"
        write_base(folder)
        damage(folder)
        cases[name] = str(folder)
    return bounded_doctor(cases)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("case", sorted(MEMORY_CASES))
def test_memory_is_bounded(case, bounded_results):
    """Under RLIMIT_AS = 768 MiB above the child's size after imports (a 1 GB index once took 2.1 GB)."""
    result = bounded_results[case]
    kind = MEMORY_CASES[case][1]
    if kind is None:
        assert result["exit"] == 0, result
    else:
        assert result["exit"] == 1 and kind in result["kinds"], result


def test_the_memory_limit_bites(bounded_results):
    """The child's limit is real: with 64 MiB of room, reading a 100 MiB header fails there."""
    assert bounded_results["small_budget"] == "MemoryError"


# -- delivered tensors match the plan; the source does not change under a load ---------------


def _rewrite(path: Path, dtype=None, shape=None, scale: float = 1.0) -> None:
    """Rewrite a shard with the same names: another dtype, another shape, or other values."""
    header, data = read_st(path)
    tensors = {}
    for name in header:
        if name == "__metadata__":
            continue
        t = shard_tensors(1)[name] * scale
        if dtype is not None:
            t = t.to(dtype)
        if shape is not None and t.numel() == 16:
            t = t.reshape(shape)
        tensors[name] = t
    write_shard(str(path), tensors)


WRONG = {"dtype": (torch.int32, (4, 4), "torch.int32[4, 4] (64 bytes)"),
         "shape": (torch.float32, (2, 8), "torch.float32[2, 8] (64 bytes)"),
         "bytes": (torch.float32, (4, 5), "torch.float32[4, 5] (80 bytes)")}  # fmt: skip


@pytest.mark.parametrize("change", sorted(WRONG))
def test_delivered_tensor_must_match_the_inspected_header(change, tmp_path):
    """A tensor whose dtype, shape or size differs from the inspected header never reaches the model."""
    folder = tmp_path / "ckpt"
    write_base(folder)
    settings = load_settings()
    checkpoint = inspect(LocalStore(str(folder)), settings.discovery_depth)
    plan = plan_of(checkpoint, select_tensors(checkpoint, BuiltModule(TARGET), settings, source_is_target=True).names, settings)
    stream = VerifiedStream(plan, settings)
    dtype, shape, arrived = WRONG[change]
    with pytest.raises(ContentMismatch) as caught:
        stream._check_in(A, torch.zeros(shape, dtype=dtype))
    assert str(caught.value).startswith(f"tensor '{A}' from {folder}/{SHARD2} arrived as {arrived}, but its header said F32[4, 4] (64 bytes)")
    assert caught.value.mutated is False and not stream.touched
    # Once a tensor reached the model, the same failure leaves it changed.
    stream._check_in(B, torch.zeros(4))
    with pytest.raises(ContentMismatch) as caught:
        stream._check_in(A, torch.zeros(shape, dtype=dtype))
    assert caught.value.mutated is True


def test_streamer_delivering_another_dtype_fails_the_load_naming_tensor_and_file(tmp_path, robust, monkeypatch):
    """The real chain, with runai told the wrong dtype for one tensor (as a misread header would)."""
    import mx_strategies.stream.runai_plan as runai_plan

    folder = tmp_path / "ckpt"
    reference = write_base(folder)
    real_metadata = runai_plan._metadata

    def misread(info, data_start):
        if info.name == A:
            info = type(info)(info.name, "I32", info.shape, info.nbytes, start=info.start)
        return real_metadata(info, data_start)

    monkeypatch.setattr(runai_plan, "_metadata", misread)
    monkeypatch.setenv("MX_MODEL_URI", str(folder))
    outcome = run_chain(reference)
    assert outcome.failure is not None
    assert f"tensor '{A}' from {folder}/{SHARD2} arrived as torch.int32[4, 4]" in outcome.failure["error"]
    assert A not in outcome.model.loaded
    # Tensors reach the model as runai's reads complete: whether others arrived before the misread one is the reads'
    # timing. What holds either way: a model that took a tensor is reported mutated (and rebuilt).
    assert outcome.failure["mutated"] or not outcome.model.loaded
    assert outcome.adapter.reinit_calls == int(outcome.failure["mutated"])


@pytest.mark.parametrize("kind", ["local", "s3"])
def test_shard_changed_after_inspection_is_refused_unmutated(kind, tmp_path, request, robust, monkeypatch):
    folder = tmp_path / "ckpt"
    reference = write_base(folder)
    uri = place(kind, folder, request)
    original = robust_module.select_resolved  # what a load of one rank selects after the chain, as runai reads ahead

    def plan_then_rewrite(*args, **kwargs):
        planned = original(*args, **kwargs)
        _rewrite(folder / SHARD2, scale=2.0)  # same names, dtypes and shapes; other values
        if kind == "s3":
            s3 = request.getfixturevalue("s3")
            s3.client().upload_file(str(folder / SHARD2), s3.bucket, f"ckpt/{SHARD2}")
        return planned

    monkeypatch.setattr(robust_module, "select_resolved", plan_then_rewrite)
    monkeypatch.setenv("MX_MODEL_URI", uri)
    assert_refused(run_chain(reference), "changed since they were inspected (before streaming)", f"{uri}/{SHARD2}")


class RewritingAdapter(CountingAdapter):
    """Rewrites shard 2 (other values) once the first tensor reached the model."""

    target: Path

    def apply_weight_iter(self, result, weights_iter):
        def rewritten():
            for i, item in enumerate(weights_iter):
                yield item
                if i == 0:
                    _rewrite(self.target, scale=3.0)

        result.model.load_weights(rewritten())
        return result


def test_shard_changed_during_streaming_fails_mutated(tmp_path, robust, monkeypatch):
    """Old and new values would mix: the load fails after streaming, and the chain rebuilds the model."""
    folder = tmp_path / "ckpt"
    reference = write_base(folder)
    monkeypatch.setenv("MX_MODEL_URI", str(folder))
    clear_reports()
    make = lambda: RecordingModel(reference)  # noqa: E731
    adapter = RewritingAdapter(make)
    adapter.target = folder / SHARD2
    with pytest.raises(RuntimeError, match="No loading strategy succeeded"):
        LoadStrategyChain.run(make(), make_context(model_config(), adapter))
    (failure,) = [r for r in recent_reports() if r["outcome"] == "failed"]
    assert failure["mutated"] is True
    assert "changed since they were inspected (after streaming)" in failure["error"]
    assert f"{folder}/{SHARD2}" in failure["error"]
    assert adapter.reinit_calls == 1


# -- settings: refused at activation ----------------------------------------------------------

SETTINGS_CASES = {
    "typo": ({"MX_ROBUST_COMPLETNESS": "warn"},
             "MX_ROBUST_COMPLETNESS is not a setting (did you mean MX_ROBUST_COMPLETENESS?)"),
    "unknown": ({"MX_ROBUST_FROBNICATE": "1"}, "MX_ROBUST_FROBNICATE is not a setting (the settings are MX_MODEL_URI"),
    "blank_uri": ({"MX_MODEL_URI": " "}, "MX_MODEL_URI=' ' is invalid: is blank"),
    "hf_uri": ({"MX_MODEL_URI": "hf://Qwen/Qwen3"}, "MX_MODEL_URI='hf://Qwen/Qwen3' is invalid: unsupported scheme hf://"),
    "file_uri": ({"MX_MODEL_URI": "file:///models/x"}, "unsupported scheme file://"),
    "bucketless_uri": ({"MX_MODEL_URI": "s3:///x"}, "names no bucket or container after s3://"),
    "chunk_2_64": ({"MX_ROBUST_STREAMER_CHUNK_BYTESIZE": str(2**64)},
                   "MX_ROBUST_STREAMER_CHUNK_BYTESIZE='18446744073709551616' is invalid"),
    "memory_limit_2_63": ({"MX_ROBUST_STREAMER_MEMORY_LIMIT": str(2**63)}, "MX_ROBUST_STREAMER_MEMORY_LIMIT="),
    "header_cap_0": ({"MX_ROBUST_MAX_HEADER_BYTES": "0"}, "MX_ROBUST_MAX_HEADER_BYTES='0' is invalid"),
    "header_cap_over_runai": ({"MX_ROBUST_MAX_HEADER_BYTES": str(200 * 1024 * 1024)},
                              "MX_ROBUST_MAX_HEADER_BYTES='209715200' is invalid"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(SETTINGS_CASES))
def test_bad_settings_are_refused_at_activation(case, monkeypatch):
    env, message = SETTINGS_CASES[case]
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(ConfigurationError) as caught:
        activation.activate("mx_strategies.robust")
    assert message in str(caught.value)


def test_concurrency_above_the_fd_limit_is_refused(monkeypatch):
    import mx_strategies.settings as settings_module

    monkeypatch.setattr(settings_module.resource, "getrlimit", lambda which: (64, 256))
    monkeypatch.setenv("MX_ROBUST_STREAMER_CONCURRENCY", "512")
    with pytest.raises(ConfigurationError, match=r"MX_ROBUST_STREAMER_CONCURRENCY='512' is invalid: above this "
                                                 r"process's hard open-file limit \(256; ulimit -Hn\)"):
        activation.activate("mx_strategies.robust")
    monkeypatch.setenv("MX_ROBUST_STREAMER_CONCURRENCY", "256")
    assert load_settings().streamer_concurrency == 256


def test_empty_model_uri_still_means_unset(monkeypatch):
    monkeypatch.setenv("MX_MODEL_URI", "")
    assert load_settings().model_uri is None


# -- properties: random bytes and random JSON never escape as anything but named problems ---------


class MemoryStore:
    """Files held in memory, listed and read like a store."""

    root = "mem://ckpt"

    def __init__(self, files: dict[str, bytes]) -> None:
        self.files = files

    def list(self, max_depth: int) -> list[ObjectInfo]:
        return [ObjectInfo(k, f"{self.root}/{k}", len(v), identity="1") for k, v in self.files.items()]

    def read(self, obj: ObjectInfo, start: int, length: int) -> bytes:
        return self.files[obj.key][start : start + length]


HEADER_BYTES = 1 << 20
GOOD_SHARD = (lambda h: struct.pack("<Q", len(h)) + h + b"\0" * 64)(
    json.dumps({"t": {"dtype": "F32", "shape": [4, 4], "data_offsets": [0, 64]}}).encode()
)
NAMED = (JsonRejected,)  # what read_json may raise; inspect and read_header raise nothing but NoCheckpoint

json_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(10**30), max_value=10**30),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8),
    st.sampled_from(sorted(_DTYPE_BITS) + ["F33", ""]),
)  # fmt: skip
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=20,
)
entries = st.fixed_dictionaries(
    {"dtype": st.sampled_from(sorted(_DTYPE_BITS) + ["F33"]) | json_values,
     "shape": st.lists(st.integers(-2, 6) | json_scalars, max_size=3) | json_values,
     "data_offsets": st.lists(st.integers(-8, 200), min_size=0, max_size=3) | json_values},
)  # fmt: skip
headers = st.dictionaries(st.text(max_size=6), entries | json_values, max_size=4)
PROPERTY = hsettings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))


def _shard_file(header: bytes, data: bytes) -> bytes:
    return struct.pack("<Q", len(header)) + header + data


@pytest.mark.timeout(120)
@PROPERTY
@given(header=st.binary(max_size=300) | headers.map(lambda h: json.dumps(h).encode()), data=st.binary(max_size=200))
def test_property_any_header_is_a_named_problem_or_a_valid_shard(header, data):
    store = MemoryStore({"m.safetensors": _shard_file(header, data)})
    (obj,) = store.list(0)
    shard, problems = read_header(store, obj, HEADER_BYTES)
    assert shard.readable != bool(problems)
    for found in problems:
        assert found.kind and found.file == "m.safetensors" and found.message.startswith("mem://ckpt/m.safetensors: ")
    if shard.readable:  # everything a valid header promises adds up to the file exactly
        assert sum(t.nbytes for t in shard.tensors.values()) == len(data)


@pytest.mark.timeout(120)
@PROPERTY
@given(
    index=st.binary(max_size=300) | json_values.map(lambda v: json.dumps({"weight_map": v}).encode()),
    config=st.binary(max_size=300) | json_values.map(lambda v: json.dumps(v).encode()),
)
def test_property_any_index_and_config_are_named_problems(index, config):
    from mx_strategies.errors import NoCheckpoint

    store = MemoryStore({"m.safetensors": GOOD_SHARD, INDEX_NAME: index, "config.json": config})
    try:
        checkpoint = inspect(store, 0, HEADER_BYTES)
    except NoCheckpoint:
        return  # a valid index naming no listed shard: a named refusal
    for found in checkpoint.problems:
        assert found.kind and found.message


@PROPERTY
@given(raw=st.binary(max_size=400))
def test_property_the_json_reader_raises_only_its_own_error(raw):
    try:
        read_json(raw, max_bytes=1 << 20)
    except NAMED as exc:
        assert exc.reason in {"too_large", "not_utf8", "invalid_json", "not_an_object", "too_deep", "bad_number",
                              "duplicate_key", "bad_key"}  # fmt: skip
        assert exc.mutated is False

"""``mx-strategies doctor``: what it reports, its exit codes, and that it reads headers only.

Every checkpoint here is real safetensors written by ``safetensors.torch``,
damaged the way exporters, interrupted uploads and hand edits damage them,
and inspected from a local folder and from a real S3 server on 127.0.0.1.
The tensors are 256 KiB each, so reading a single one of them would exceed
the byte bound the S3 tests put on what the server sent.
"""

from __future__ import annotations

import json
import os

import pytest
import torch
from helpers.checkpoints import edit_index, write_shard
from helpers.headers import metadata_bytes

from mx_strategies import cli
from mx_strategies.cli.doctor import REPORT_KEYS
from mx_strategies.inspect.checkpoint import INDEX_NAME
from mx_strategies.testing import synthetic
from mx_strategies.testing.loopback import free_port

TENSOR_SHAPE = (128, 512)  # float32: 256 KiB
TENSOR_BYTES = 128 * 512 * 4
# Listing, HTTP headers of a dozen responses: a few KiB; one tensor is 256 KiB.
HTTP_OVERHEAD_BYTES = 32 * 1024


def _tensor(seed: int) -> torch.Tensor:
    return torch.randn(*TENSOR_SHAPE, generator=torch.Generator().manual_seed(seed))


def _base_shards() -> list[dict[str, torch.Tensor]]:
    return [
        {"model.embed_tokens.weight": _tensor(0), "model.layers.0.mlp.weight": _tensor(1)},
        {"model.layers.1.mlp.weight": _tensor(2), "lm_head.weight": _tensor(3)},
    ]


def _shard(i: int, n: int) -> str:
    return f"model-{i:05d}-of-{n:05d}.safetensors"


def _write_config(path: str) -> None:
    with open(os.path.join(path, "config.json"), "w") as handle:
        json.dump({"model_type": "llama", "num_hidden_layers": 2}, handle)


def build_case(kind: str, path: str) -> tuple[int, list[tuple[str, str, str | None]]]:
    """Write a checkpoint with one problem of ``kind``.

    Returns (expected exit code, expected (kind, file, tensor) problems).
    """
    shards = _base_shards()
    if kind == "healthy":
        synthetic.write_shards(path, shards)
        expected = (0, [])
    elif kind == "empty_shard":
        synthetic.write_shards(path, [shards[0], {}, shards[1]])
        expected = (0, [("empty_shard", _shard(2, 3), None)])
    elif kind == "missing_tensor":
        synthetic.write_shards(path, shards)
        edit_index(path, lambda wm: wm.update({"model.layers.9.mlp.weight": _shard(1, 2)}))
        expected = (1, [("missing_tensor", _shard(1, 2), "model.layers.9.mlp.weight")])
    elif kind == "missing_shard":
        synthetic.write_shards(path, shards)
        os.remove(os.path.join(path, _shard(2, 2)))
        expected = (1, [("missing_shard", _shard(2, 2), None)])
    elif kind == "duplicate_tensor":
        shards[1]["model.layers.0.mlp.weight"] = _tensor(9)
        synthetic.write_shards(path, shards)
        # The index names the first copy; the header of the second still holds one.
        edit_index(path, lambda wm: wm.update({"model.layers.0.mlp.weight": _shard(1, 2)}))
        expected = (1, [("duplicate_tensor", _shard(2, 2), "model.layers.0.mlp.weight")])
    elif kind == "corrupt_header":
        synthetic.write_shards(path, shards)
        shard_path = os.path.join(path, _shard(2, 2))
        with open(shard_path, "r+b") as handle:
            header_len = int.from_bytes(handle.read(8), "little")
            handle.write(b"#" * header_len)  # same length, not JSON
        expected = (1, [("corrupt_header", _shard(2, 2), None)])
    elif kind == "truncated_shard":
        synthetic.write_shards(path, shards)
        shard_path = os.path.join(path, _shard(2, 2))
        os.truncate(shard_path, os.path.getsize(shard_path) - TENSOR_BYTES // 2)
        expected = (1, [("truncated_shard", _shard(2, 2), None)])
    elif kind == "unindexed_tensor":
        synthetic.write_shards(path, shards)
        edit_index(path, lambda wm: wm.pop("lm_head.weight"))
        expected = (0, [("unindexed_tensor", _shard(2, 2), "lm_head.weight")])
    elif kind == "unindexed_shard":
        synthetic.write_shards(path, shards)
        write_shard(os.path.join(path, "consolidated.safetensors"), {"extra.weight": _tensor(5)})
        expected = (0, [("unindexed_shard", "consolidated.safetensors", None)])
    elif kind == "corrupt_index":
        synthetic.write_shards(path, shards)
        with open(os.path.join(path, INDEX_NAME), "w") as handle:
            handle.write('{"weight_map": ')
        expected = (1, [("corrupt_index", INDEX_NAME, None)])
    else:
        raise ValueError(kind)
    _write_config(path)
    return expected


KINDS = [
    "healthy",
    "empty_shard",
    "missing_tensor",
    "missing_shard",
    "duplicate_tensor",
    "corrupt_header",
    "truncated_shard",
    "unindexed_tensor",
    "unindexed_shard",
    "corrupt_index",
]


def run_doctor(capsys, *args: str) -> tuple[int, str, str]:
    code = cli.main(["doctor", *args])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def run_json(capsys, *args: str) -> tuple[int, dict]:
    code, out, err = run_doctor(capsys, *args, "--json")
    assert err == "", err
    return code, json.loads(out)


def _problems(report: dict) -> list[tuple[str, str, str | None]]:
    return [(p["kind"], p["file"], p["tensor"]) for p in report["problems"]]


@pytest.mark.parametrize("kind", KINDS)
def test_local_checkpoint_problem_kinds(tmp_path, capsys, kind):
    path = str(tmp_path / "ckpt")
    exit_code, expected = build_case(kind, path)

    code, report = run_json(capsys, path)

    assert code == exit_code
    assert report["ok"] is (exit_code == 0)
    assert _problems(report) == expected
    severities = {p["kind"]: p["severity"] for p in report["problems"]}
    for problem_kind, _, _ in expected:
        assert severities[problem_kind] == ("warning" if exit_code == 0 else "error")
    assert report["source"]["uri"] == path
    assert report["source"]["label"] == "argument"


@pytest.mark.parametrize("kind", KINDS)
def test_s3_checkpoint_problem_kinds_read_no_tensor_data(tmp_path, capsys, s3, kind):
    path = str(tmp_path / "ckpt")
    exit_code, expected = build_case(kind, path)
    uri = s3.upload(path, s3.bucket, "model")
    s3.proxy.reset()

    code, report = run_json(capsys, uri)

    assert code == exit_code
    assert _problems(report) == expected
    assert report["source"]["uri"] == uri
    bound = metadata_bytes(path) + HTTP_OVERHEAD_BYTES
    assert bound < TENSOR_BYTES  # the bound itself rules out reading any tensor
    assert 0 < s3.bytes_served < bound


def test_healthy_checkpoint_lists_shards_in_load_order(tmp_path, capsys):
    ckpt = synthetic.mtp_checkpoint(str(tmp_path / "ckpt"), style="qwen", num_hidden_layers=4, empty_shards=(1,))
    # Qwen3.5's naming (mtp.*), whose draft class is not built on these CPUs: a table row says what the target
    # leaves to it without a module. (Qwen3-Next's builds here: doctor alone streams its checkpoint whole.)
    with open(os.path.join(ckpt.path, "config.json"), "w") as handle:
        json.dump(dict(ckpt.config, model_type="qwen3_5_text", architectures=["Qwen3_5ForCausalLM"]), handle)

    code, report = run_json(capsys, ckpt.path)

    assert code == 0 and report["ok"] is True
    files = [row["file"] for row in report["shards"]]
    assert files == ckpt.shard_names  # natural order, the empty one included
    # The last shard holds only the mtp.* tensors: the draft's, which the target leaves to it.
    assert [row["status"] for row in report["shards"]] == ["load", "empty", "load", "load", "draft"]
    assert [row["load_order"] for row in report["shards"]] == [1, None, 2, 3, None]
    assert report["target"]["left_to_draft"] == len(ckpt.draft_names)
    assert report["target"]["tensors"] == len(ckpt.tensors) - len(ckpt.draft_names)
    assert sum(row["tensors"] for row in report["shards"]) == len(ckpt.tensors)
    assert report["summary"]["tensors"] == len(ckpt.tensors)
    assert report["summary"]["tensor_bytes"] == ckpt.nbytes(ckpt.tensors)
    assert sum(row["tensor_bytes"] or 0 for row in report["shards"]) == ckpt.nbytes(ckpt.tensors)
    assert _problems(report) == [("empty_shard", ckpt.shard_names[1], None)]


@pytest.mark.parametrize("style, convention", [("qwen", "mtp"), ("deepseek", "nextn_layers")])
def test_draft_view_names_the_mtp_head(tmp_path, capsys, style, convention):
    ckpt = synthetic.mtp_checkpoint(str(tmp_path / "ckpt"), style=style)

    code, report = run_json(capsys, ckpt.path)

    draft = report["draft"]
    assert code == 0
    assert draft["found"] is True
    assert draft["convention"] == convention
    assert set(draft["names"]) == ckpt.draft_names
    assert draft["tensors"] == len(ckpt.draft_names)
    assert draft["bytes"] == ckpt.nbytes(ckpt.draft_names)
    assert draft["checkpoint_bytes"] == ckpt.nbytes(ckpt.tensors)
    assert draft["shards"] == [ckpt.shard_names[-1]]
    assert draft["shared_weights"] == []  # the engine shares embed/lm_head at PP=1


def test_draft_view_says_none_found_and_what_was_tried(tmp_path, capsys):
    path = str(tmp_path / "ckpt")
    build_case("healthy", path)

    code, report = run_json(capsys, path)

    assert code == 0
    assert report["draft"]["found"] is False
    tried = report["draft"]["conventions_tried"]
    assert "mtp (mtp.*)" in tried and "nextn_layers" in tried and "mtp_layers" in tried


def test_chain_passes_over_the_config_only_copy_to_mx_model_uri(tmp_path, capsys, s3, monkeypatch):
    ckpt = synthetic.mtp_checkpoint(str(tmp_path / "ckpt"), style="deepseek", empty_shards=(1,))
    cache = synthetic.config_only_copy(ckpt.path, str(tmp_path / "model_streamer" / "d7905c16"))
    uri = s3.upload(ckpt.path, s3.bucket, "glm")
    monkeypatch.setenv("MX_MODEL_URI", uri)

    code, report = run_json(capsys, "--model", cache)

    assert code == 0
    chain = report["chain"]
    assert chain["chosen"] == {"label": "MX_MODEL_URI", "uri": uri}
    assert [(r["label"], r["uri"]) for r in chain["rejected"]] == [("model", cache)]
    indexed_shards = len(ckpt.shard_names) - 1  # the empty one is not in the index
    assert f"none of the {indexed_shards} shard(s) it names" in chain["rejected"][0]["reason"]
    assert chain["eligible"] is True
    assert report["source"] == {
        "uri": uri, "label": "MX_MODEL_URI", "root": uri, "checkpoint_folder": "", "index": True, "config": True,
    }  # fmt: skip
    assert report["draft"]["convention"] == "nextn_layers"
    assert set(report["draft"]["names"]) == ckpt.draft_names


def test_chain_takes_model_weights_first_and_probes_no_further(tmp_path, capsys, s3, monkeypatch):
    ckpt = synthetic.mtp_checkpoint(str(tmp_path / "ckpt"), style="qwen")
    cache = synthetic.config_only_copy(ckpt.path, str(tmp_path / "cache"))
    uri = s3.upload(ckpt.path, s3.bucket, "qwen")
    monkeypatch.setenv("MX_MODEL_URI", str(tmp_path / "does-not-exist"))

    code, report = run_json(capsys, "--model-weights", uri, "--model", cache)

    assert code == 0
    assert report["chain"]["chosen"] == {"label": "model_weights", "uri": uri}
    assert report["chain"]["rejected"] == []
    assert report["source"]["uri"] == uri


def test_chain_follows_mx_robust_source_order(tmp_path, capsys, monkeypatch):
    first = synthetic.mtp_checkpoint(str(tmp_path / "a"), style="qwen")
    second = synthetic.mtp_checkpoint(str(tmp_path / "b"), style="deepseek")
    monkeypatch.setenv("MX_MODEL_URI", second.path)
    monkeypatch.setenv("MX_ROBUST_SOURCE_ORDER", "MX_MODEL_URI,model")

    code, report = run_json(capsys, "--model", first.path)

    assert code == 0
    assert report["chain"]["order"] == ["MX_MODEL_URI", "model"]
    assert report["chain"]["chosen"]["label"] == "MX_MODEL_URI"
    assert report["draft"]["convention"] == "nextn_layers"


def test_chain_passes_over_an_object_store_it_cannot_open(tmp_path, capsys, monkeypatch):
    """A client that cannot start (no azure extra, no credentials) is a rejection, not a crash."""
    for key in [k for k in os.environ if k.startswith("AZURE_")]:
        monkeypatch.delenv(key)
    ckpt = synthetic.mtp_checkpoint(str(tmp_path / "ckpt"), style="qwen")
    monkeypatch.setenv("MX_MODEL_URI", ckpt.path)

    code, report = run_json(capsys, "--model-weights", "az://container/model")

    assert code == 0
    assert report["chain"]["chosen"] == {"label": "MX_MODEL_URI", "uri": ckpt.path}
    (rejected,) = report["chain"]["rejected"]
    assert rejected["label"] == "model_weights" and rejected["reason"].startswith("az://container/model: ")


def test_chain_without_any_streamable_source_is_an_error(tmp_path, capsys, monkeypatch):
    ckpt = synthetic.mtp_checkpoint(str(tmp_path / "ckpt"), style="qwen")
    cache = synthetic.config_only_copy(ckpt.path, str(tmp_path / "cache"))
    monkeypatch.setenv("MX_ROBUST_REQUIRE_MODEL_URI", "true")  # upstream's gate, kept by the setting

    code, report = run_json(capsys, "--model", cache)

    assert code == 1
    assert report["ok"] is False
    assert report["source"] is None and report["draft"] is None and report["shards"] == []
    assert report["chain"]["chosen"] is None
    assert report["chain"]["eligible"] is False  # MX_MODEL_URI unset: ModelExpress would not offer it
    assert "MX_MODEL_URI is unset" in report["chain"]["eligibility"]
    (problem,) = report["problems"]
    assert problem["kind"] == "no_streamable_source"
    assert problem["remedy"] == "set MX_MODEL_URI to the checkpoint (s3://, gs://, az:// or a local folder), or " \
        "point the engine's model at it"
    assert f"model={cache!r}" in problem["message"] and "config-only copy" in problem["message"]


def test_config_only_copy_given_directly_is_no_checkpoint(tmp_path, capsys):
    ckpt = synthetic.mtp_checkpoint(str(tmp_path / "ckpt"), style="qwen")
    cache = synthetic.config_only_copy(ckpt.path, str(tmp_path / "cache"))

    code, report = run_json(capsys, cache)

    assert code == 1
    (problem,) = report["problems"]
    assert problem["kind"] == "no_checkpoint"
    assert "config-only copy" in problem["message"]


def test_human_output_names_shards_problems_and_verdict(tmp_path, capsys):
    path = str(tmp_path / "ckpt")
    build_case("missing_shard", path)

    code, out, err = run_doctor(capsys, path)

    assert code == 1 and err == ""
    assert "Shards in load order" in out
    assert _shard(1, 2) in out
    assert "missing_shard" in out and _shard(2, 2) in out
    assert "1 error: mx_strategies.robust would refuse this load" in out


def test_human_output_shows_the_chain(tmp_path, capsys, monkeypatch):
    ckpt = synthetic.mtp_checkpoint(str(tmp_path / "ckpt"), style="qwen")
    cache = synthetic.config_only_copy(ckpt.path, str(tmp_path / "cache"))
    monkeypatch.setenv("MX_MODEL_URI", ckpt.path)

    code, out, _ = run_doctor(capsys, "--model", cache)

    assert code == 0
    assert "Source chain" in out and "passed over" in out and "chosen" in out
    assert "convention mtp" in out
    assert "OK: nothing here stops a load" in out


# -- usage and access errors: exit 2, one line on stderr (and with --json the error object on stdout) -----


def assert_usage_error(capsys, args: list[str], *fragments: str) -> None:
    code, out, err = run_doctor(capsys, *args)
    assert code == 2
    assert len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in out + err
    for fragment in fragments:
        assert fragment in err
    if "--json" in args:
        # Every key a report has, so a script reads the same keys on every exit status; nothing inspected.
        assert json.loads(out) == {**dict.fromkeys(REPORT_KEYS), "schema": 1, "ok": False, "exit_status": 2,
                                   "shards": [], "problems": [],
                                   "error": err.strip().removeprefix("mx-strategies doctor: ")}  # fmt: skip
    else:
        assert out == ""


def test_missing_local_folder_exits_2(tmp_path, capsys):
    missing = str(tmp_path / "nowhere")
    assert_usage_error(capsys, [missing, "--json"], missing, "no such local folder")


def test_hub_id_exits_2_and_says_so(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert_usage_error(capsys, ["deepseek-ai/DeepSeek-V3"], "deepseek-ai/DeepSeek-V3", "hub id", "--local-dir")


def test_missing_bucket_exits_2(capsys, s3, monkeypatch):
    monkeypatch.setattr("mx_strategies.inspect.object_stores.PROBE_MAX_ATTEMPTS", 1)
    assert_usage_error(capsys, ["s3://no-such-bucket/model"], "s3://no-such-bucket/model", "NoSuchBucket")


def test_empty_prefix_is_no_checkpoint(capsys, s3):
    """Reached, and nothing to stream: exit 1, as a folder of .bin weights (tests/test_doctor_first_hour.py)."""
    uri = f"s3://{s3.bucket}/nothing-here"
    code, report = run_json(capsys, uri)
    assert code == 1
    assert [(p["kind"], p["message"]) for p in report["problems"]] == [
        ("no_checkpoint", f"{uri}: no safetensors here (nothing under this prefix)")
    ]


def test_unreachable_endpoint_exits_2(capsys, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setattr("mx_strategies.inspect.object_stores.PROBE_MAX_ATTEMPTS", 1)
    monkeypatch.setenv("MX_ROBUST_PROBE_TIMEOUT_S", "2")
    assert_usage_error(capsys, ["s3://models/glm"], "s3://models/glm", "listing failed", "Could not connect")


def test_azure_without_client_or_credentials_exits_2(capsys, monkeypatch):
    """Offline either way: without the azure extra, or with it and no credentials."""
    for key in [k for k in os.environ if k.startswith("AZURE_")]:
        monkeypatch.delenv(key)
    assert_usage_error(capsys, ["az://container/model"], "az://container/model")


def test_folder_that_is_a_file_exits_2(tmp_path, capsys):
    path = tmp_path / "model.safetensors"
    path.write_bytes(b"\0" * 16)
    assert_usage_error(capsys, [str(path)], "a file, not a folder", str(tmp_path))


def test_nothing_to_inspect_exits_2(capsys):
    assert_usage_error(capsys, [], "nothing to inspect", "MX_MODEL_URI")


def test_invalid_setting_exits_2(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("MX_ROBUST_SOURCE_ORDER", "model,bogus")
    assert_usage_error(capsys, [str(tmp_path)], "MX_ROBUST_SOURCE_ORDER", "bogus")


def test_unknown_command_and_no_command_exit_2(capsys):
    assert cli.main(["frobnicate"]) == 2
    assert "invalid choice" in capsys.readouterr().err
    assert cli.main([]) == 2
    assert "choose a command" in capsys.readouterr().err


def test_help_exits_0(capsys):
    assert cli.main(["doctor", "--help"]) == 0
    out = capsys.readouterr().out
    assert "--model-weights" in out and "--json" in out



# -- ModelExpress's strategy chain, as a deployment will run it (mx_strategies.cli.strategy_chain) --------------

# The installed ModelExpress's chain (0.7.0 and 0.8 alike), robust in model_streamer's place.
CHAIN = ["rdma", "server-cache", "instant_tensor", "robust_model_streamer", "gds", "default"]


@pytest.fixture
def switched_on(monkeypatch):
    """robust switched on as the README says: MX_STRATEGY alone."""
    monkeypatch.setenv("MX_STRATEGY", "mx_strategies.robust")
    monkeypatch.delenv("VLLM_PLUGINS", raising=False)


def test_doctor_shows_the_chain_and_keeps_the_folder_readers_off_a_broken_folder(tmp_path, capsys, monkeypatch, switched_on):
    from helpers.checkpoints import delete_file, tiny_shards, write_checkpoint

    monkeypatch.setenv("MX_INSTANT_TENSOR", "1")
    ckpt = write_checkpoint(str(tmp_path / "ckpt"), tiny_shards(3))
    delete_file(ckpt.files[1])
    missing = f"{ckpt.files[1]}: named by model.safetensors.index.json for 3 tensor(s) but not found"

    code, report = run_json(capsys, "--model", ckpt.path)

    view = report["strategies"]
    assert view["order"] == CHAIN and view["error"] is None and view["folder"] == ckpt.path
    rows = {row["name"]: row for row in view["strategies"]}
    for reader in ("instant_tensor", "gds"):
        assert rows[reader]["robust"].startswith(f"kept off: checkpoint {ckpt.path} is inconsistent") and missing in rows[reader]["robust"]
    assert rows["instant_tensor"]["available"] is False and rows["instant_tensor"]["why"] == "no CUDA device"
    assert rows["default"]["robust"] == "not asked (reads no local folder unchecked)"
    assert rows["instant_tensor"]["checked_after"] == rows["gds"]["checked_after"] == (
        "always: what load_weights reported against what the model keeps, before the post-load pass")
    assert rows["default"]["checked_after"].startswith("where the model is quantized")
    assert [r["name"] for r in view["strategies"] if r["checked_after"]] == ["instant_tensor", "gds", "default"]
    assert code == 1

    code, out, _ = run_doctor(capsys, "--model", ckpt.path)
    assert "ModelExpress's strategy chain, in order" in out and "kept off" in out


def test_doctor_says_a_whole_folder_is_allowed_and_the_setting_turns_the_guard_off(tmp_path, capsys, monkeypatch, switched_on):
    from helpers.checkpoints import tiny_shards, write_checkpoint

    ckpt = write_checkpoint(str(tmp_path / "ckpt"), tiny_shards(2))
    _, report = run_json(capsys, "--model", ckpt.path)
    rows = {row["name"]: row for row in report["strategies"]["strategies"]}
    assert rows["instant_tensor"]["robust"] == "allowed: the folder is consistent"  # its index vouches (auto)
    monkeypatch.setenv("MX_ROBUST_GUARD_CHAIN", "module")
    _, report = run_json(capsys, "--model", ckpt.path)
    rows = {row["name"]: row for row in report["strategies"]["strategies"]}
    assert rows["instant_tensor"]["robust"] == "allowed: the folder is consistent (the module's answer is asked at load)"

    monkeypatch.setenv("MX_INSTANT_TENSOR", "0")
    monkeypatch.setenv("MX_ROBUST_GUARD_CHAIN", "off")
    _, report = run_json(capsys, "--model", ckpt.path)
    rows = {row["name"]: row for row in report["strategies"]["strategies"]}
    assert (rows["instant_tensor"]["available"], rows["instant_tensor"]["why"]) == (False, "MX_INSTANT_TENSOR disabled")
    assert rows["instant_tensor"]["robust"] == "not asked: MX_ROBUST_GUARD_CHAIN=off"
    assert not [r for r in report["strategies"]["strategies"] if r["checked_after"]]  # off: neither before nor after


def test_doctor_reads_each_strategy_by_modelexpress_own_rule_for_the_engine(tmp_path, capsys, switched_on):
    """SGLang's adapter in ModelExpress has no InstantTensor iterator: never offered there, whatever the node."""
    from helpers.checkpoints import tiny_shards, write_checkpoint

    ckpt = write_checkpoint(str(tmp_path / "ckpt"), tiny_shards(2))
    _, report = run_json(capsys, "--model", ckpt.path, "--engine", "sglang")
    rows = {row["name"]: row for row in report["strategies"]["strategies"]}
    assert report["strategies"]["order"] == CHAIN
    assert (rows["instant_tensor"]["available"], rows["instant_tensor"]["why"]) == (
        False, "ModelExpress's sglang adapter does not override build_instanttensor_weight_iter")  # fmt: skip


# -- whether robust runs on this node: the first line, text and --json ------------------------------------------


def test_doctor_says_first_whether_robust_runs_on_this_node(tmp_path, capsys, monkeypatch):
    """Unset: not switched on, and the chain is ModelExpress's own (model_streamer, no robust verdicts); MX_STRATEGY
    alone: it runs; a vLLM plugin filter without mx_strategies, or the kept gate: said, with what to set."""
    from helpers.checkpoints import tiny_shards, write_checkpoint

    ckpt = write_checkpoint(str(tmp_path / "ckpt"), tiny_shards(2))
    for key in ("MX_STRATEGY", "VLLM_PLUGINS", "MX_MODEL_URI"):
        monkeypatch.delenv(key, raising=False)

    _, report = run_json(capsys, "--model", ckpt.path)
    view = report["strategies"]
    assert view["robust"] == {
        "switched_on": False, "door": None, "offered": None, "runs": False,
        "why": "MX_STRATEGY is unset and ModelExpress's chain holds no plugin named robust_model_streamer: set "
               "MX_STRATEGY=mx_strategies.robust",
        "line": "robust will not run on this node: MX_STRATEGY is unset and ModelExpress's chain holds no plugin "
                "named robust_model_streamer: set MX_STRATEGY=mx_strategies.robust",
    }  # fmt: skip
    assert view["order"] == [n if n != "robust_model_streamer" else "model_streamer" for n in CHAIN]
    assert {row["robust"] for row in view["strategies"]} == {"not asked: robust is not switched on"}
    assert {row["checked_after"] for row in view["strategies"]} == {None}
    _, out, _ = run_doctor(capsys, "--model", ckpt.path)
    assert out.splitlines()[0] == view["robust"]["line"]

    monkeypatch.setenv("MX_STRATEGY", "mx_strategies.robust")
    _, report = run_json(capsys, "--model", ckpt.path)
    assert report["strategies"]["order"] == CHAIN
    assert report["strategies"]["robust"]["line"] == (
        "robust will run on this node: switched on by MX_STRATEGY=mx_strategies.robust; offered: streams the "
        "engine's own model_weights/model"
    )
    _, out, _ = run_doctor(capsys, "--model", ckpt.path)
    assert out.splitlines()[0] == report["strategies"]["robust"]["line"]

    monkeypatch.setenv("VLLM_PLUGINS", "modelexpress")
    _, report = run_json(capsys, "--model", ckpt.path)
    assert report["strategies"]["robust"]["runs"] is False
    assert report["strategies"]["robust"]["why"] == (
        "MX_STRATEGY is set, but VLLM_PLUGINS='modelexpress' keeps vLLM from loading mx_strategies' plugin: add "
        "mx_strategies to VLLM_PLUGINS"
    )
    monkeypatch.setenv("VLLM_PLUGINS", "modelexpress,mx_strategies")
    monkeypatch.setenv("MX_ROBUST_REQUIRE_MODEL_URI", "true")
    _, report = run_json(capsys, "--model", ckpt.path)
    assert (report["strategies"]["robust"]["switched_on"], report["strategies"]["robust"]["runs"]) == (True, False)
    assert report["strategies"]["robust"]["line"] == (
        "robust is switched on by MX_STRATEGY=mx_strategies.robust but will not run on this node: "
        "MX_ROBUST_REQUIRE_MODEL_URI=true and MX_MODEL_URI is unset: set MX_MODEL_URI to the checkpoint, or unset "
        "MX_ROBUST_REQUIRE_MODEL_URI"
    )


def test_every_problem_carries_its_remedy_in_json_and_text(tmp_path, capsys):
    """The JSON's ``remedy`` per problem, and one "What to do" line per kind under the problems table."""
    from helpers.checkpoints import delete_file, tiny_shards, write_checkpoint

    from mx_strategies.inspect.remedies import _REMEDIES

    ckpt = write_checkpoint(str(tmp_path / "ckpt"), tiny_shards(3))
    delete_file(ckpt.files[1])
    code, report = run_json(capsys, ckpt.path)
    assert code == 1
    assert [(p["kind"], p["remedy"]) for p in report["problems"]] == [("missing_shard", _REMEDIES["missing_shard"])]
    assert report["problems"][0]["remedy"].startswith("upload the missing file")
    _, out, _ = run_doctor(capsys, ckpt.path)
    lines = out.splitlines()
    at = lines.index("What to do:")
    assert lines[at + 1] == f"  missing_shard: {_REMEDIES['missing_shard']}"

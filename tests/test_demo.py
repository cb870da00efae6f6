"""``mx-strategies demo`` runs end to end: real chain, real streamer, real S3 on 127.0.0.1.

Only the engine side is simulated (vLLM cannot run a model on CPU): the
demo's own model and adapter, as its docstring says. One run goes through
the installed console script as a user types it; one runs in-process with
``--json`` so the figures can be checked one by one.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from types import SimpleNamespace

from mx_strategies import activation, cli
from mx_strategies.cli.demo import ReadsCache, bytes_column, reads_cache_line

DEMO_TIMEOUT_S = 240  # 36 to 71 s measured on two busy cores; the bound only stops a hang
# A size in decimal units (rich's default, or "700 GB" in prose): the demo prints binary units only.
DECIMAL_SIZE = re.compile(r"\d\s?(?:kB|KB|MB|GB|TB)\b")


def _console_script() -> list[str]:
    script = os.path.join(os.path.dirname(sys.executable), "mx-strategies")
    found = script if os.path.exists(script) else shutil.which("mx-strategies")
    assert found, "the mx-strategies console script is not installed next to this Python"
    return [found]


def test_console_script_demo_names_each_chosen_source(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MX_", "AWS_"))}
    # A user's stale settings must not change the demo's story.
    env["MX_ROBUST_SOURCE_ORDER"] = "model"
    env["MX_MODEL_URI"] = "s3://somewhere-else/model"
    # Where the module's answers are kept is the user's to choose, and the demo follows it.
    reads = tmp_path / "reads"
    env["MX_ROBUST_READS_CACHE_DIR"] = str(reads)

    done = subprocess.run(
        _console_script() + ["demo"],
        env=env,
        capture_output=True,
        text=True,
        timeout=DEMO_TIMEOUT_S,
    )

    out = " ".join(done.stdout.split())  # undo rich's line folding
    assert done.returncode == 0, done.stdout + done.stderr
    for name in ("qwen3-next-tiny", "deepseek-v3-tiny"):
        uri = f"s3://mx-demo/{name}"
        assert f"{name} target: chose model_weights='{uri}'" in out
        assert f"{name} draft: passed over model=" in out
        assert f"(a config-only copy?); chose MX_MODEL_URI='{uri}'" in out
    assert out.count("Cannot find any safetensors model weights with") >= 2
    assert "plain ModelExpress 0.7.0 pulled" in out and "plain ModelExpress 0.8 pulled" in out
    # The 1.0x row says why there is nothing to save: 0.7.0's shard for the Qwen-style draft holds only mtp.*.
    assert (
        "qwen3-next-tiny draft: plain ModelExpress 0.7.0 pulled" in out
        and "1.0x what mx_strategies pulled" in out
        and "nothing to save here. The shards it chose hold only the draft's own tensors "
        "(Qwen3-Next style: mtp.* in a shard of its own)" in out
    )
    assert "every tensor it streamed is the draft's own: nothing to save over robust here" in out
    # One unit style: binary units from one function in the tables, the step lines and the final lines.
    assert "MiB" in out and "KiB" in out
    assert DECIMAL_SIZE.findall(out) == []
    # The folder it wrote the module's answers into, and the setting that moves it.
    assert f"Kept the module's answers (what each model reads) in {reads}/: 4 file(s), 4 written by this run" in out
    assert "MX_ROBUST_READS_CACHE_DIR moves the folder; empty turns the cache off" in out
    assert len(list(reads.glob("*.json"))) == 4
    assert "demo finished in" in out


def test_progress_counts_bytes_in_the_tables_units():
    column = bytes_column()
    assert column.render(SimpleNamespace(completed=1536, total=7654321)).plain == "1.5 KiB of 7.3 MiB"
    assert column.render(SimpleNamespace(completed=100, total=None)).plain == "100 B"


def test_reads_cache_line_says_where_and_how_to_change_it():
    on = reads_cache_line(ReadsCache("/home/u/.cache/mx-strategies/reads", answers=4, written=0))
    assert "in /home/u/.cache/mx-strategies/reads/: 4 file(s), 0 written by this run" in on
    assert "MX_ROBUST_READS_CACHE_DIR" in on
    off = reads_cache_line(ReadsCache(None))
    assert "not kept: MX_ROBUST_READS_CACHE_DIR is empty" in off and "~/.cache/mx-strategies/reads/" in off
    assert reads_cache_line(None) == ""


def test_demo_json_figures(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("MX_ROBUST_READS_CACHE_DIR", str(tmp_path / "reads"))
    environment_before = dict(os.environ)

    code = cli.main(["demo", "--json"])

    captured = capsys.readouterr()
    result, progress = json.loads(captured.out), captured.err
    assert code == 0 and result["ok"] is True
    checkpoints = {c["name"]: c for c in result["checkpoints"]}
    assert set(checkpoints) == {"qwen3-next-tiny", "deepseek-v3-tiny"}
    for c in checkpoints.values():
        assert c["empty_shards"] == 2
        assert 0 < c["draft_bytes"] < c["bytes"] / 5

    loads = {(o["checkpoint"], o["role"], o["loader"]): o for o in result["loads"]}
    assert len(loads) == 10
    for name, c in checkpoints.items():
        target = loads[(name, "target", "mx_strategies.robust")]
        draft = loads[(name, "draft", "mx_strategies.robust")]
        upstream = loads[(name, "draft", "ModelExpress 0.7.0")]
        upstream_08 = loads[(name, "draft", "ModelExpress 0.8")]
        runai = loads[(name, "draft", "vLLM runai_streamer")]

        # The target: from model_weights, every tensor checked off, every weight exact.
        assert target["ok"] and (target["source_label"], target["source"]) == ("model_weights", c["uri"])
        # It leaves the MTP layers (the draft's own tensors, and DeepSeek's per-layer copies) to the draft.
        assert target["tensors_left_to_draft"] >= c["draft_tensors"] > 0
        assert target["tensors_verified"] + target["tensors_left_to_draft"] == c["tensors"]
        assert target["tensors_matching"] == target["tensors_expected"] == target["tensors_verified"]
        assert target["tensors_skipped"] == 0  # nothing streamed that the model throws away
        assert target["bytes_streamed"] + target["bytes_left_to_draft"] == c["bytes"]
        assert target["bytes_streamed"] <= target["bytes_served"] < target["bytes_streamed"] * 1.05
        # Target and draft together: the checkpoint's bytes once, not once plus the draft's.
        assert target["bytes_served"] + draft["bytes_served"] < c["bytes"] * 1.05

        # The draft: past the config-only copy to MX_MODEL_URI, its own tensors only.
        assert draft["ok"] and (draft["source_label"], draft["source"]) == ("MX_MODEL_URI", c["uri"])
        assert c["config_only_copy"] in draft["why"] and "config-only copy" in draft["why"]
        assert draft["tensors_verified"] == draft["tensors_matching"] == c["draft_tensors"]
        assert draft["bytes_streamed"] == c["draft_bytes"]
        assert c["draft_bytes"] <= draft["bytes_served"] < c["draft_bytes"] + 64 * 1024

        # Plain ModelExpress: MX_MODEL_URI, and whole shards for the draft. 0.7.0 takes the shards naming mtp.*,
        # else every shard (DeepSeek-V3's names); 0.8 the shards its class's rule needs (Qwen3-Next: also
        # embed_tokens' and lm_head's), always more than the draft's own tensors.
        for plain in (upstream, upstream_08):
            assert plain["ok"] and plain["source"] == c["uri"]
            assert plain["tensors_verified"] is None and plain["tensors_matching"] == c["draft_tensors"]
            assert plain["bytes_served"] >= c["draft_bytes"]
        if name == "deepseek-v3-tiny":
            assert upstream["bytes_served"] >= c["bytes"]
            assert upstream["tensors_skipped"] == c["tensors"] - c["draft_tensors"]
            assert c["draft_bytes"] < upstream_08["bytes_served"] < c["bytes"] / 2
            assert "3 of 7 for this draft" in upstream_08["why"]
        else:
            assert upstream["tensors_skipped"] == 0 and upstream["bytes_served"] < c["draft_bytes"] + 64 * 1024
            assert upstream_08["bytes_served"] > 3 * draft["bytes_served"]
            assert upstream_08["tensors_skipped"] > 0  # embed_tokens' and lm_head's shards, streamed and dropped

        # vLLM's runai loader on the draft's model: the config-only copy.
        assert not runai["ok"] and runai["source"] == c["config_only_copy"]
        assert runai["error"] == f"Cannot find any safetensors model weights with `{c['config_only_copy']}`"
        assert runai["bytes_served"] == 0

    assert result["reads_cache"] == {"folder": str(tmp_path / "reads"), "answers": 4, "written": 4}

    assert "qwen3-next-tiny draft with mx_strategies.robust" in progress
    assert DECIMAL_SIZE.findall(progress) == [] and "MiB" in progress
    # The process is left as it was found: environment, ModelExpress's chain.
    assert dict(os.environ) == environment_before
    assert activation.installed_strategy() is None

"""``mx-strategies demo`` runs end to end: real chain, real streamer, real S3 on 127.0.0.1.

Only the engine side is simulated (vLLM cannot run a model on CPU): the
demo's own model and adapter, as its docstring says. One run goes through
the installed console script as a user types it; one runs in-process with
``--json`` so the figures can be checked one by one.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
from importlib.metadata import version
from types import SimpleNamespace

from rich.console import Console

from mx_strategies import activation, cli
from mx_strategies.cli.demo import DemoResult, LoadOutcome, ReadsCache, bytes_column, reads_cache_line, render

DEMO_TIMEOUT_S = 240  # 36 to 71 s measured on two busy cores; the bound only stops a hang
# A size in decimal units (rich's default, or "700 GB" in prose): the demo prints binary units only.
DECIMAL_SIZE = re.compile(r"\d\s?(?:kB|KB|MB|GB|TB)\b")


# What the tables print, as a user reads them (issue 56): every column says what its figures count, and a
# share what it is a share of; the titles name the releases the README names; ModelExpress 0.8 is simulated.
MX = version("modelexpress")  # the installed ModelExpress, whose chain every load runs through
CHECKPOINT_HEADERS = ["checkpoint", "naming", "shards", "tensors", "tensor bytes", "MTP draft's own tensors"]
LOAD_HEADERS = [
    "load",
    "source chosen",
    "tensors verified",
    "weights equal to checkpoint",
    "bytes streamed to the model (% of checkpoint tensor bytes)",
    "bytes served by S3 (% of checkpoint tensor bytes)",
    "load time",
]
TITLES = [
    "Checkpoints (served from the local S3 server)",
    f"With MX_STRATEGY=mx_strategies.robust, through ModelExpress {MX}'s chain",
    "Same drafts with plain ModelExpress 0.7.0 (MX_STRATEGY unset, MX_MODEL_URI set)",
    "Same drafts as plain ModelExpress 0.8 (simulated: its shard selection, whole shards)",
    "Same drafts with vLLM's runai_streamer loader (no ModelExpress)",
]
SIMULATED_08 = (
    "Simulated: ModelExpress 0.8 does not run here. ModelExpress 0.8's vLLM adapter's shard choice (as "
    "mx_strategies.testing.plain_modelexpress writes it down, checked against 0.8's code in the tests) runs "
    f"through the installed ModelExpress {MX}'s chain."
)
NAMES = ("qwen3-next-tiny", "deepseek-v3-tiny")
URIS = [f"s3://mx-demo/{name}" for name in NAMES]
SHARE = re.compile(r"^\d+(?:\.\d)? (?:B|KiB|MiB) \(\d+%\)$")  # "7.3 MiB (101%)": bytes, then their share


def _tables(text: str) -> list[SimpleNamespace]:
    """The tables in a demo's output as a user sees them: each one's title, its headers (each column's header
    lines joined), its rows line by line (cells split at the rules; a wrapped cell continues on a line whose
    first cell is empty) and what prints directly under it (the footnote, joined)."""
    lines = text.splitlines()
    tables = []
    for i, line in enumerate(lines):
        if not line.startswith("┏"):
            continue
        cells = lambda row, rule: [c.strip() for c in row.strip()[1:-1].split(rule)]  # noqa: E731
        head = i + 1 + next(k for k, row in enumerate(lines[i + 1:]) if row.startswith("┡"))
        end = head + 1 + next(k for k, row in enumerate(lines[head + 1:]) if row.startswith("└"))
        under = []
        for row in lines[end + 1:]:
            if not row.strip() or row.startswith("  "):  # a blank line, or the indented lines saying why
                break
            under.append(row.strip())
        title = []
        for row in reversed(lines[:i]):  # the title: the lines above, up to a blank one
            if not row.strip():
                break
            title.insert(0, row.strip())
        header_columns = zip(*(cells(row, "┃") for row in lines[i + 1:head]))
        tables.append(SimpleNamespace(
            title=" ".join(title),
            headers=[" ".join(part for part in column if part) for column in header_columns],
            rows=[cells(row, "│") for row in lines[head + 1:end]],
            under=" ".join(under),
        ))  # fmt: skip
    return tables


def _assert_tables_say_what_they_show(text: str, full_width: bool) -> None:
    """The titles, headers and footnotes a user reads, and names never wrapped (issue 56). ``full_width``:
    120 columns (the demo's width when piped), where every header reads whole and no figure wraps either."""
    tables = _tables(text)
    assert [t.title for t in tables] == TITLES
    checkpoints, robust, plain_07, plain_08, runai = tables
    if full_width:
        assert checkpoints.headers == CHECKPOINT_HEADERS
    # Each checkpoint's URI whole on one line (it was "s3://mx-demo/deepseek-v3-tin" and "y").
    assert [row[0] for row in checkpoints.rows if row[0]] == URIS
    for table in (robust, plain_07, plain_08, runai):
        loads = [row[0] for row in table.rows if row[0]]
        roles = ("target", "draft") if table is robust else ("draft",)
        assert loads == [f"{name} {role}" for name in NAMES for role in roles]  # whole names, in order
        assert {row[1] for row in table.rows} <= {"model_weights", "MX_MODEL_URI", "model", ""}  # sources, whole
        if full_width:  # every header whole, and no figure wraps: a row is one line
            assert table.headers == LOAD_HEADERS
            assert all(row[0] for row in table.rows)
            for row in table.rows:
                assert row[5] and SHARE.match(row[5]), row  # bytes served by S3, and their share
                assert (row[4] == "-") if table is runai else SHARE.match(row[4]), row  # bytes to the model
    # Directly under each plain table, what runs; under 0.8's, that it is simulated.
    assert plain_08.under == SIMULATED_08
    assert plain_07.under.startswith(f"The installed ModelExpress {MX}'s chain runs these loads, with "
                                     "ModelExpress 0.7.0's vLLM adapter's shard choice")  # fmt: skip
    assert "--engine vllm runs vLLM itself" in runai.under
    # Every other mention of ModelExpress 0.8 (step lines, the lines under the table, the last lines) says so.
    rest = " ".join(text.split()).replace(SIMULATED_08, "")
    assert "ModelExpress 0.8" in rest
    assert re.findall(r"ModelExpress 0\.8(?! \(simulated)", rest) == []
    assert "0.4.1" not in text


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
    # What the tables say, as printed (piped: 120 columns): labelled columns, the releases named, 0.8 simulated.
    _assert_tables_say_what_they_show(done.stdout, full_width=True)
    assert "0.4.1" not in done.stderr
    assert "Over 100%: S3 also serves the shards' headers, the index and config.json." in out
    for name in ("qwen3-next-tiny", "deepseek-v3-tiny"):
        uri = f"s3://mx-demo/{name}"
        assert f"{name} target: chose model_weights='{uri}'" in out
        assert f"{name} draft: passed over model=" in out
        assert f"(a config-only copy?); chose MX_MODEL_URI='{uri}'" in out
    assert out.count("Cannot find any safetensors model weights with") >= 2
    assert "plain ModelExpress 0.7.0 pulled" in out and "plain ModelExpress 0.8 (simulated) pulled" in out
    assert "qwen3-next-tiny draft with ModelExpress 0.8 (simulated): 7/7 weights equal to the checkpoint" in out
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

        # Only 0.8 is simulated, and its loads say so in --json too.
        assert upstream_08["simulated"] and upstream_08["simulated"].startswith("Simulated: ModelExpress 0.8 does not")
        assert upstream["simulated"] is None and draft["simulated"] is None and runai["simulated"] is None

        # vLLM's runai loader on the draft's model: the config-only copy.
        assert not runai["ok"] and runai["source"] == c["config_only_copy"]
        assert runai["error"] == f"Cannot find any safetensors model weights with `{c['config_only_copy']}`"
        assert runai["bytes_served"] == 0

    assert result["reads_cache"] == {"folder": str(tmp_path / "reads"), "answers": 4, "written": 4}

    assert "qwen3-next-tiny draft with mx_strategies.robust" in progress
    assert "deepseek-v3-tiny draft with ModelExpress 0.8 (simulated)" in progress
    assert DECIMAL_SIZE.findall(progress) == [] and "MiB" in progress
    # The process is left as it was found: environment, ModelExpress's chain.
    assert dict(os.environ) == environment_before
    assert activation.installed_strategy() is None


def _result() -> DemoResult:
    """A demo's figures as the loads leave them (qwen3-next-tiny and deepseek-v3-tiny, each 7.3 MiB)."""
    size, draft = 7_654_321, 787_968
    checkpoints = [dict(name=n, style=style, uri=f"s3://mx-demo/{n}", config_only_copy="/tmp/x", shards=8,
                        empty_shards=2, tensors=58, bytes=size, draft_tensors=7, draft_bytes=draft)
                   for n, style in zip(NAMES, ("Qwen3-Next style: mtp.* in a shard of its own",
                                               "DeepSeek-V3 style: model.layers.{N}.* in the last shard"))]  # fmt: skip
    loads = []
    for n in NAMES:
        for role, owned in (("target", 51), ("draft", 7)):
            streamed = size - draft if role == "target" else draft
            loads.append(LoadOutcome(n, role, "mx_strategies.robust", True, source_label="model_weights",
                                     tensors_verified=owned, tensors_expected=owned, tensors_loaded=owned,
                                     tensors_matching=owned, bytes_streamed=streamed, bytes_served=streamed + 30_000,
                                     checkpoint_bytes=size, seconds=0.3, why="chose"))  # fmt: skip
    for n in NAMES:
        for loader, served in (("ModelExpress 0.7.0", size + 60_000), ("ModelExpress 0.8", 3 * draft)):
            loads.append(LoadOutcome(n, "draft", loader, True, source_label="MX_MODEL_URI", tensors_expected=7,
                                     tensors_loaded=7, tensors_matching=7, bytes_streamed=served - 30_000,
                                     bytes_served=served, checkpoint_bytes=size, seconds=0.2,
                                     why="whole shards"))  # fmt: skip
        loads.append(LoadOutcome(n, "draft", "vLLM runai_streamer", False, source_label="model", tensors_expected=7,
                                 checkpoint_bytes=size,
                                 error="Cannot find any safetensors model weights with `x`"))  # fmt: skip
    return DemoResult(checkpoints=checkpoints, loads=loads, seconds=9.0, reads_cache=ReadsCache(None))


def test_tables_label_every_figure_and_keep_names_whole_at_any_width():
    """The tables as a terminal of 80, 100 or 120 columns shows them: a narrow one wraps figures, never a name
    (the checkpoints' URIs, the loads, the sources), and the labels and the 0.8 footnote stay."""
    for width in (120, 100, 80):
        stream = io.StringIO()
        render(_result(), Console(file=stream, width=width, highlight=False, color_system=None))
        text = stream.getvalue()
        _assert_tables_say_what_they_show(text, full_width=width == 120)

"""``mx-strategies doctor`` in a user's first hour (issue 46): never a traceback, one line for each failure.

Exit statuses: 0 nothing is an error, 1 robust would refuse the load, 2 usage or access error, 3 --ask-module
could not ask a module. Every checkpoint here is real safetensors on disk; the ``--ask-module`` tests build
vLLM's real classes (the venv's vLLM CPU build) on the meta device in this process. One stand-in, said where it
is: vLLM's CUDA wheel on a machine without a GPU cannot run here (this venv has the CPU build).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import pytest
import torch

from mx_strategies import cli
from mx_strategies.cli import module_build
from mx_strategies.testing import synthetic

PREFIX = "mx-strategies doctor: "


def run_doctor(capsys, *args: str) -> tuple[int, str, str]:
    code = cli.main(["doctor", *args])
    captured = capsys.readouterr()
    assert "Traceback" not in captured.out + captured.err
    return code, captured.out, captured.err


def one_line_on_stderr(err: str) -> str:
    lines = err.splitlines()
    assert len(lines) == 1, err
    return lines[0]


# -- exit 2: one line on stderr, and with --json one object on stdout ---------------------------------------


def error_object(error: str) -> dict:
    """Exit 2's object: every key a report has (nothing inspected), the reason in ``error``."""
    keys = ("source", "summary", "target", "draft", "settings", "engine", "chain", "modules", "strategies")
    return {**dict.fromkeys(keys), "schema": 1, "ok": False, "shards": [], "problems": [], "exit_status": 2,
            "error": error}  # fmt: skip


def test_a_safetensors_file_given_for_a_folder_names_its_folder(tmp_path, capsys):
    shard = tmp_path / "model.safetensors"
    synthetic.write_shards(str(tmp_path), [{"w": torch.zeros(2)}], index=False)
    shard = next(tmp_path.glob("*.safetensors"))
    expected = f"{shard}: a file, not a folder; doctor reads the checkpoint's folder: {tmp_path}"

    code, out, err = run_doctor(capsys, str(shard))
    assert code == 2 and out == ""
    assert one_line_on_stderr(err) == PREFIX + expected

    code, out, err = run_doctor(capsys, str(shard), "--json")
    assert code == 2
    assert json.loads(out) == error_object(expected)
    assert one_line_on_stderr(err) == PREFIX + expected


def test_an_argument_error_with_json_is_still_one_object(capsys):
    code, out, err = run_doctor(capsys, "--json", "--bogus")
    assert code == 2
    assert json.loads(out) == error_object("unrecognized arguments: --bogus")
    assert err.splitlines()[-1] == "mx-strategies: error: unrecognized arguments: --bogus"


def test_ask_module_with_another_engine_is_a_usage_error(tmp_path, capsys):
    synthetic.mtp_checkpoint(str(tmp_path), style="qwen")
    expected = "--ask-module builds vLLM's classes; it cannot be combined with --engine sglang"
    code, out, err = run_doctor(capsys, str(tmp_path), "--ask-module", "--engine", "sglang", "--json")
    assert code == 2
    assert json.loads(out)["error"] == expected
    assert one_line_on_stderr(err) == PREFIX + expected


# -- no safetensors here: an empty folder and a folder of .bin weights, both exit 1 -------------------------


def test_an_empty_folder_and_a_folder_of_bin_weights_say_the_same(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    bins = tmp_path / "bins"
    bins.mkdir()
    torch.save({"w": torch.zeros(2)}, bins / "pytorch_model.bin")
    (bins / "config.json").write_text("{}")

    for folder, why in (
        (empty, "(the folder is empty)"),
        (bins, "(holds config.json, pytorch_model.bin); mx_strategies.robust streams *.safetensors only"),
    ):
        code, out, err = run_doctor(capsys, str(folder), "--json")
        assert code == 1 and err == ""
        report = json.loads(out)
        assert [(p["kind"], p["message"]) for p in report["problems"]] == [
            ("no_checkpoint", f"{folder}: no safetensors here {why}")
        ]
        assert report["error"] is None and report["exit_status"] == 1
        code, out, err = run_doctor(capsys, str(folder))
        assert code == 1 and err == ""
        assert out.splitlines()[-1] == (
            "1 error: mx_strategies.robust would refuse this load; other loaders may drop or miss weights."
        )


# -- counts: singular and plural --------------------------------------------------------------------------


def test_one_tensor_is_a_tensor(tmp_path, capsys):
    synthetic.write_shards(str(tmp_path), [{"w": torch.zeros(4)}])
    code, out, _ = run_doctor(capsys, str(tmp_path))
    assert code == 0
    assert "  index: yes, config.json: no; 1 tensor, 16 B in 1 of 1 shard; read " in out
    assert "  1 tensor, 16 B (100.0% of the checkpoint) in 1 shard\n" in out
    assert "1 tensors" not in out and "shard(s)" not in out


# -- the draft view says what the user can do, not where vLLM's source is -----------------------------------


def test_the_draft_view_names_no_vllm_source_path(tmp_path, capsys):
    synthetic.mtp_checkpoint(str(tmp_path), style="qwen")
    code, out, _ = run_doctor(capsys, str(tmp_path))
    assert code == 0
    assert (
        "  architecture row qwen3_5_mtp (Qwen3.5, Qwen3.5-MoE, Intern-S2 (Qwen3.5 naming)): the engine builds the "
        "draft as Qwen3_5MTP; 2 tensors the engine skips or replaces not streamed (--json lists them: "
        "draft.architecture.skipped)\n"
    ) in out
    assert "vllm/" not in out


# -- one line for any exception -----------------------------------------------------------------------------


def test_an_exception_without_a_message_is_named_by_where_it_was_raised():
    def check(value: int) -> None:
        if value != 1:  # a bare `assert` as vLLM's classes use them (pytest rewrites this file's own asserts)
            raise AssertionError

    try:
        check(2)
    except AssertionError as exc:
        line = module_build.one_line(exc)
    where = f"{__file__}:{check.__code__.co_firstlineno + 2}"
    assert line == f"AssertionError raised at {where} in check: `raise AssertionError`"


def test_vllm_without_a_device_says_what_to_set():
    """Stand-in: vLLM's CUDA wheel on a machine without a GPU cannot run here (this venv has vLLM's CPU build),
    so the RuntimeError its VllmConfig raises there (vllm/config/device.py) is made here with its message."""
    exc = RuntimeError("Failed to infer device type, please set the environment variable `VLLM_LOGGING_LEVEL=DEBUG`")
    assert module_build._platform_reason(exc, None) == (
        "vLLM found no device here (RuntimeError: Failed to infer device type, please set the environment variable "
        "`VLLM_LOGGING_LEVEL=DEBUG`); on a machine without a GPU run doctor with VLLM_TARGET_DEVICE=cpu "
        "CUDA_VISIBLE_DEVICES="
    )
    assert module_build._platform_reason(exc, "cpu").startswith("vLLM found no device here even with VLLM_TARGET_DEVICE=cpu")
    assert module_build._platform_reason(ValueError("other"), None) is None


def test_without_a_visible_gpu_vllm_resolves_its_cpu_platform_and_the_setting_is_given_back(tmp_path):
    """A fresh interpreter (vLLM resolves its platform once per process) with no CUDA device visible."""
    code = (
        "import os\n"
        "from mx_strategies.cli.module_build import cpu_platform_unless_gpu\n"
        "with cpu_platform_unless_gpu() as chosen:\n"
        "    during = os.environ.get('VLLM_TARGET_DEVICE')\n"
        "    from vllm.platforms import current_platform\n"
        "    device = current_platform.device_type\n"
        "with cpu_platform_unless_gpu() as again:\n"
        "    pass\n"
        "print(chosen, during, device, os.environ.get('VLLM_TARGET_DEVICE'), again)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "VLLM_TARGET_DEVICE"}
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env.update(CUDA_VISIBLE_DEVICES="", PYTHONPATH=os.pathsep.join([root, env.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "cpu cpu cpu None cpu"


# -- --ask-module: real vLLM classes, exit 3 and one line when a module cannot be asked ---------------------

vllm = pytest.importorskip("vllm")
on_cpu = pytest.mark.skipif(torch.cuda.is_available(), reason="the text is the one vLLM's CPU platform gives")


def _engine_handlers() -> dict:
    return {name: list(logging.getLogger(name).handlers) for name in module_build.QUIET_LOGGERS}


@on_cpu
def test_the_packages_deepseek_checkpoint_is_asked_and_says_why_not_in_one_line(tmp_path, capsys):
    """synthetic.mtp_checkpoint(style="deepseek") names DeepSeek-V3.2, whose config vLLM asserts on
    (index_topk); its config now has it, so vLLM builds the class until V3.2's sparse attention, which
    its CPU platform refuses: exit 3, one line."""
    synthetic.mtp_checkpoint(str(tmp_path), style="deepseek")
    with module_build.quiet_engine():  # transformers installs its handler on first use; that one stays
        pass
    before = _engine_handlers()
    expected = (
        "could not ask the module: target and draft: cannot build it here: NotImplementedError: Sparse Attention "
        "is not supported on CPU."
    )
    code, out, err = run_doctor(capsys, str(tmp_path), "--ask-module")
    assert code == 3
    assert one_line_on_stderr(err) == PREFIX + expected
    assert "  target: not asked: cannot build it here: NotImplementedError: Sparse Attention is not supported on CPU.\n" in out
    assert out.splitlines()[-1] == (
        "Not asked: nothing in the checkpoint stops a load, but doctor could not ask the module (exit status 3)."
    )
    assert _engine_handlers() == before  # the engine's loggers given back

    code, out, err = run_doctor(capsys, str(tmp_path), "--ask-module", "--json")
    assert code == 3
    report = json.loads(out)  # exactly one object
    assert report["error"] == expected and report["exit_status"] == 3 and report["ok"] is True
    assert report["modules"]["target"]["failed"] is True and report["modules"]["draft"]["failed"] is True
    assert one_line_on_stderr(err) == PREFIX + expected
    # vLLM's config loader set DeepseekV3Config.model_type = "deepseek_v32" for the process while it was asked;
    # doctor gives it back, or a DeepSeek-V3 loaded later in this process would get V3.2's MTP draft class.
    from transformers.models.deepseek_v3 import DeepseekV3Config

    assert DeepseekV3Config.model_type == "deepseek_v3"


def test_shards_that_do_not_fit_the_config_name_what_failed_and_vllm_stays_quiet(tmp_path, capsys):
    """A DeepSeek-V3 config vLLM builds here over the package's synthetic shards, which do not fit it. A bare
    ``assert`` in vLLM's class (an embedding of another vocabulary) is named by its type and place, never
    "AssertionError: " and nothing. With the vocabulary right and float32 tensors for a bfloat16 model, vLLM
    warns "Attempted to load weight ... with dtype torch.float32" while it loads them (shown with
    VLLM_LOGGING_LEVEL=DEBUG); that stays out of doctor's output."""
    sys.path.insert(0, os.path.dirname(__file__))
    from mtp_arch import builders

    other_vocab, float32 = str(tmp_path / "vocab"), str(tmp_path / "float32")
    synthetic.mtp_checkpoint(other_vocab, style="deepseek", num_hidden_layers=2)
    synthetic.mtp_checkpoint(float32, style="deepseek", num_hidden_layers=2, vocab=128, dtype=torch.float32)
    for folder in (other_vocab, float32):
        builders.write_config(folder, "deepseek_v3")
    refused = "vLLM's class refused the checkpoint's tensors (do they fit config.json?)"

    code, out, err = run_doctor(capsys, other_vocab, "--ask-module")
    assert code == 3
    assert one_line_on_stderr(err) == PREFIX + (
        f"could not ask the module: target (DeepseekV3ForCausalLM) and draft (DeepSeekMTP): {refused}: "
        "AssertionError raised at vllm/model_executor/layers/vocab_parallel_embedding.py:515 in weight_loader: "
        "`assert loaded_weight.shape[output_dim] == self.org_vocab_size`"
    )
    assert "AssertionError: \n" not in out

    code, out, err = run_doctor(capsys, float32, "--ask-module")
    assert code == 3
    assert one_line_on_stderr(err) == PREFIX + (
        f"could not ask the module: target (DeepseekV3ForCausalLM): {refused}: KeyError: "
        f"'layers.0.self_attn.q_proj.weight'; draft (DeepSeekMTP): {refused}: KeyError: "
        "'model.layers.2.mtp_block.mlp.down_proj.weight'"
    )
    assert "Attempted to load weight" not in out + err

"""The parts of the GPU check (scripts/gpu-e2e.sh) that run without a GPU.

The verdict parser reads canned vLLM logs in vLLM's own format, holding our
strategy's real report lines; a good log passes and each way a run can go
wrong fails with a reason that names it. The S3 step serves a real
checkpoint from moto on 127.0.0.1. The shell script is syntax-checked and
its no-GPU exit is exercised (the full run needs a GPU and vLLM's CUDA
build; docs/gpu-e2e.md). The model generator is exercised by
tests/test_vllm_configs.py, which loads its output into vLLM's model classes.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from helpers.scripts import load_gpu_e2e

from mx_strategies.testing.synthetic import mtp_checkpoint

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "scripts", "gpu-e2e.sh")
HELPER = os.path.join(REPO, "scripts", "gpu_e2e.py")

gpu_e2e = load_gpu_e2e()

URI = "s3://mx-e2e/tiny-mtp"
CACHE = "/tmp/mx-gpu-e2e.x1/vllm-assets/model_streamer/d2d17456"
MANIFEST = {
    "arch": "deepseek_v3",
    "tensor_count": 97,
    "draft_tensor_count": 44,
    "draft_convention": "nextn_layers",
    "checkpoint_bytes": 23544224,
    "draft_bytes": 8527504,
}
W = "(VllmWorker-0 pid=11066) INFO 11-30 01:19:10"
HEAD = f"""\
(APIServer pid=9060) INFO 11-30 01:18:32 [model.py:733] Resolved architecture: DeepseekV3ForCausalLM
(APIServer pid=9060) INFO 11-30 01:18:32 [model.py:733] Resolved architecture: DeepSeekMTPModel
(EngineCore pid=10213) INFO 11-30 01:18:48 [core.py:133] Initializing a V1 LLM engine (v0.32.0) with config: model='{CACHE}', speculative_config=SpeculativeConfig(method='mtp', model='{URI}', num_spec_tokens=1)
{W} [loader.py:121] [Worker 0] MxModelLoader starting (model={CACHE}, p2p_enabled=True)
{W} [__init__.py:113] Eligible loaders: ['robust_model_streamer', 'default']
{W} [__init__.py:122] [Worker 0] Trying strategy: robust_model_streamer
{W} [robust.py:150] [Worker 0] target source: chose model_weights='{URI}'
"""
TARGET_OK = (
    f"{W} [robust.py:256] [Worker 0] target loaded from model_weights='{URI}': 97 tensors verified, "
    "23544224 of 23544224 checkpoint bytes streamed (100.0%) in 0.41s\n"
    f"{W} [loader.py:196] [Worker 0] MxModelLoader.load_model() COMPLETE in 3.10s\n"
    f"{W} [loader.py:121] [Worker 0] MxModelLoader starting (model={CACHE}, p2p_enabled=False)\n"
    f"{W} [robust.py:150] [Worker 0] draft source: chose model_weights='{URI}'\n"
)
DRAFT_OK = (
    f"{W} [robust.py:256] [Worker 0] draft loaded from model_weights='{URI}', convention nextn_layers: "
    "44 tensors verified, 8527504 of 23544224 checkpoint bytes streamed (36.2%) in 0.12s\n"
)
TAIL = """\
(VllmWorker-0 pid=11066) INFO 11-30 01:19:11 [llm_base_proposer.py:1458] Detected MTP model. Sharing target model embedding weights with the draft model.
(APIServer pid=9060) INFO 11-30 01:20:02 [api_server.py:1001] Starting vLLM server on http://127.0.0.1:34175
(APIServer pid=9060) INFO:     127.0.0.1:51234 - "POST /v1/completions HTTP/1.1" 200 OK
"""
GOOD_LOG = HEAD + TARGET_OK + DRAFT_OK + TAIL
COMPLETION = {
    "id": "cmpl-1",
    "object": "text_completion",
    "model": "tiny-mtp",
    "choices": [{"index": 0, "text": " lazy fox model", "finish_reason": "length"}],
    "usage": {"prompt_tokens": 9, "completion_tokens": 16, "total_tokens": 25},
}


def judge(log, completion=COMPLETION, server_problem=""):
    return gpu_e2e.judge(log, completion, MANIFEST, server_problem)


def test_good_run_passes_with_the_figures():
    verdict = judge(GOOD_LOG)

    assert verdict.ok, verdict.reason
    assert verdict.line() == (
        f"PASS: deepseek_v3 from {URI}: target 97 tensors, draft 44 own tensors "
        "(nextn_layers, 36.2% of the checkpoint bytes), no re-initialization, completion of 16 tokens"
    )


def test_draft_that_streamed_the_whole_checkpoint_fails():
    whole = DRAFT_OK.replace(", convention nextn_layers", "").replace("44 tensors", "97 tensors").replace(
        "8527504 of", "23544224 of"
    )

    verdict = judge(HEAD + TARGET_OK + whole + TAIL)

    assert not verdict.ok
    assert verdict.reason == (
        "draft convention None, expected 'nextn_layers' (97 tensors: streamed the whole checkpoint?)"
    )


def test_draft_with_the_wrong_tensor_count_fails():
    verdict = judge(HEAD + TARGET_OK + DRAFT_OK.replace("44 tensors", "40 tensors") + TAIL)

    assert not verdict.ok
    assert verdict.reason == "draft verified 40 tensors, expected exactly its own 44"


def test_reinitialized_model_fails():
    log = (
        HEAD
        + "(VllmWorker-0 pid=11066) WARNING 11-30 01:19:10 [__init__.py:132] [Worker 0] Strategy robust_model_streamer "
        "failed, trying next: stream broke after 12 tensors\n"
        + f"{W} [adapter.py:398] [Worker 0] Re-initializing vLLM model after failed strategy\n"
        + TAIL
    )

    verdict = judge(log)

    assert not verdict.ok
    assert verdict.reason == (
        "the model was re-initialized ('Re-initializing vLLM model after failed strategy' in the log)"
    )


def test_strategy_failure_with_fallback_fails():
    log = (
        HEAD
        + "(VllmWorker-0 pid=11066) WARNING 11-30 01:19:10 [__init__.py:132] [Worker 0] Strategy robust_model_streamer "
        "failed, trying next: no candidate source holds streamable safetensors: model='/x': no shard\n"
        + f"{W} [default_strategy.py:28] [Worker 0] Loading weights from disk...\n"
    )

    verdict = judge(log)

    assert not verdict.ok
    assert verdict.reason == (
        "strategy robust_model_streamer failed: no candidate source holds streamable safetensors: model='/x': no shard"
    )


def test_missing_draft_line_fails():
    verdict = judge(HEAD + TARGET_OK + TAIL)

    assert not verdict.ok
    assert verdict.reason == "no 'draft loaded from' line: the MTP draft did not load through the strategy"


def test_load_from_the_local_cache_dir_is_not_from_s3():
    log = HEAD + TARGET_OK.replace(f"model_weights='{URI}'", f"model='{CACHE}'") + DRAFT_OK + TAIL

    verdict = judge(log)

    assert not verdict.ok
    assert verdict.reason == f"target loaded from '{CACHE}', not from S3"


def test_crashed_server_reports_the_root_cause_not_the_wrapper():
    log = HEAD + (
        "(VllmWorker-0 pid=11066) ERROR 11-30 01:19:09 [multiproc_executor.py:953] torch.OutOfMemoryError: "
        "CUDA out of memory. Tried to allocate 2.00 GiB\n"
        "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {'EngineCore': 1}\n"
    )

    verdict = judge(log, completion=None, server_problem="vllm serve exited with status 1 before it was ready")

    assert not verdict.ok
    assert verdict.reason == (
        "no 'target loaded from' line: the target did not load through the strategy; vllm serve exited with "
        "status 1 before it was ready; last error: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
    )


def test_silent_missing_load_line_points_at_the_plugin():
    verdict = judge(HEAD.replace("robust_model_streamer", "model_streamer") + TAIL)

    assert not verdict.ok
    assert verdict.reason == (
        "no 'target loaded from' line: the target did not load through the strategy "
        "(was mx_strategies installed and listed in VLLM_PLUGINS?)"
    )


def test_loads_fine_but_server_never_ready_fails():
    verdict = judge(GOOD_LOG, completion=None, server_problem="vllm serve was not ready after 392s (budget 450s)")

    assert not verdict.ok
    assert verdict.reason == (
        "target 97 and draft 44 own tensors loaded from S3, but vllm serve was not ready after 392s (budget 450s)"
    )


@pytest.mark.parametrize(
    "completion, problem",
    [
        (None, "no completion response"),
        ({"error": {"message": "boom"}}, "completion returned an error: {'message': 'boom'}"),
        ({"choices": []}, "completion response has no choices[0].text"),
        (
            dict(COMPLETION, usage={"completion_tokens": 0}),
            "completion produced no tokens (usage={'completion_tokens': 0})",
        ),
    ],
)
def test_bad_completion_fails(completion, problem):
    verdict = judge(GOOD_LOG, completion=completion)

    assert not verdict.ok
    assert verdict.reason == f"target 97 and draft 44 own tensors loaded from S3, but {problem}"


# -- the command line --------------------------------------------------------


def _write(path, text):
    with open(path, "w") as handle:
        handle.write(text)
    return str(path)


@pytest.mark.parametrize("good", [True, False])
def test_verdict_command_prints_one_line_and_sets_the_status(tmp_path, good):
    log = _write(tmp_path / "vllm.log", GOOD_LOG if good else HEAD + TARGET_OK + TAIL)
    completion = _write(tmp_path / "completion.json", json.dumps(COMPLETION))
    manifest = _write(tmp_path / "manifest.json", json.dumps(MANIFEST))
    stats = _write(tmp_path / "stats.json", json.dumps({"bytes_served": 32173000, "uri": URI}))

    run = subprocess.run(
        [sys.executable, HELPER, "verdict", "--log", log, "--completion", completion, "--manifest", manifest,
         "--stats-file", stats],
        capture_output=True,
        text=True,
        timeout=60,
    )

    lines = run.stdout.splitlines()
    assert len(lines) == 1, run.stdout + run.stderr
    if good:
        assert run.returncode == 0
        assert lines[0].startswith("PASS: deepseek_v3 from s3://mx-e2e/tiny-mtp")
        assert lines[0].endswith("; S3 served 32173000 bytes for a 23544224-byte checkpoint")
    else:
        assert run.returncode == 1
        assert lines[0] == "FAIL: no 'draft loaded from' line: the MTP draft did not load through the strategy"


def test_serve_s3_serves_the_folder_on_loopback_until_sigterm(tmp_path):
    import boto3

    checkpoint = mtp_checkpoint(str(tmp_path / "model"), style="deepseek", num_hidden_layers=2, hidden=16, vocab=32)
    env_file = tmp_path / "s3.env"
    stats_file = tmp_path / "stats.json"
    server = subprocess.Popen(
        [sys.executable, HELPER, "serve-s3", "--folder", checkpoint.path, "--env-file", str(env_file),
         "--stats-file", str(stats_file)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while not env_file.exists() and server.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert env_file.exists(), server.stdout.read() if server.poll() is not None else "no env file in 60 s"
        env = dict(
            line.removeprefix("export ").split("=", 1) for line in env_file.read_text().splitlines() if line
        )
        assert env["MODEL_URI"] == "s3://mx-e2e/tiny-mtp"
        assert env["AWS_ENDPOINT_URL"].startswith("http://127.0.0.1:")
        client = boto3.client(
            "s3",
            endpoint_url=env["AWS_ENDPOINT_URL"],
            aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
            region_name=env["AWS_DEFAULT_REGION"],
        )
        listed = sorted(o["Key"] for o in client.list_objects_v2(Bucket="mx-e2e")["Contents"])
        local = sorted(f"tiny-mtp/{name}" for name in os.listdir(checkpoint.path))
        assert listed == local
        shard = checkpoint.shard_names[-1]
        body = client.get_object(Bucket="mx-e2e", Key=f"tiny-mtp/{shard}")["Body"].read()
        with open(os.path.join(checkpoint.path, shard), "rb") as handle:
            assert body == handle.read()
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)
    assert server.returncode == 0
    stats = json.loads(stats_file.read_text())
    assert stats["uri"] == "s3://mx-e2e/tiny-mtp"
    assert stats["bytes_served"] >= len(body)  # counted after the upload, so this is what we read


# -- the shell script --------------------------------------------------------


def test_script_syntax_and_helper_compile():
    subprocess.run(["bash", "-n", SCRIPT], check=True, timeout=30)
    subprocess.run([sys.executable, "-m", "py_compile", HELPER], check=True, timeout=30)


def _run_script(tmp_path, **env):
    return subprocess.run(
        ["bash", SCRIPT],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "GPU_E2E_WORKDIR": str(tmp_path / "work"), **env},
    )


def test_script_without_a_gpu_says_so_in_one_line(tmp_path):
    run = _run_script(tmp_path, GPU_E2E_NVIDIA_SMI=str(tmp_path / "no-such-nvidia-smi"))

    assert run.returncode == 77
    assert run.stdout.splitlines() == [
        f"SKIP: no NVIDIA GPU on this machine ({tmp_path / 'no-such-nvidia-smi'} not found); scripts/gpu-e2e.sh needs one"
    ]


def test_script_with_nvidia_smi_but_no_gpu_says_so(tmp_path):
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed because it could not communicate with the driver' >&2\nexit 9\n")
    fake.chmod(0o755)

    run = _run_script(tmp_path, GPU_E2E_NVIDIA_SMI=str(fake))

    assert run.returncode == 77
    assert run.stdout.splitlines() == [f"SKIP: {fake} lists no usable NVIDIA GPU; scripts/gpu-e2e.sh needs one"]


def test_script_with_a_gpu_but_no_python_fails_as_a_prerequisite(tmp_path):
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho 'NVIDIA H200, 143771 MiB'\n")
    fake.chmod(0o755)

    run = _run_script(tmp_path, GPU_E2E_NVIDIA_SMI=str(fake), PYTHON=str(tmp_path / "no-python"))

    assert run.returncode == 2
    assert run.stdout.splitlines() == [f"FAIL: no python at '{tmp_path / 'no-python'}' (set PYTHON)"]

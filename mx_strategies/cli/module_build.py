"""doctor's modules: vLLM's target and MTP draft for a checkpoint's config.json, built on the meta device, asked.

``mx-strategies doctor --ask-module`` builds what vLLM's engine would build for the checkpoint
(``ModelConfig``; ``SpeculativeConfig(method="mtp")`` where the config has MTP layers; the target's
``VllmConfig``; ``initialize_model``), in this process and without data: the parameters live on
the meta device, vLLM's class inspection runs here instead of in a child, and a one-process gloo
group on 127.0.0.1 stands for the engine's. Then :func:`mx_strategies.select.module_reads.ask` asks each
module what it reads, as a load does. Where vLLM is not installed, or the class cannot be built
here (a kernel this CPU lacks, a configuration module the checkpoint ships), the role says why, in one
line, with ``failed`` set: doctor then exits 3. Nothing here raises, and nothing the engine logs while it is
asked reaches doctor's output (its loggers are captured for the question and restored after).
"""

from __future__ import annotations

import json
import linecache
import logging
import os
import socket
import sys
import tempfile
import warnings
from contextlib import ExitStack, contextmanager
from typing import Any, Callable, Iterator, Optional

from ..inspect.checkpoint import Checkpoint
from ..select.module_reads import ModuleReads, ask, left_out_summary
from ..settings import RobustSettings


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def _vllm_process(vllm_config: Any) -> Iterator[None]:
    """vLLM's world and model-parallel groups for one process (gloo, 127.0.0.1)."""
    from vllm.config import set_current_vllm_config
    from vllm.distributed import cleanup_dist_env_and_memory, ensure_model_parallel_initialized, init_distributed_environment
    from vllm.distributed import parallel_state

    owned = parallel_state._WORLD is None
    try:
        if owned:
            with set_current_vllm_config(vllm_config):
                init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                             distributed_init_method=f"tcp://127.0.0.1:{_free_port()}")  # fmt: skip
                ensure_model_parallel_initialized(1, 1)
        yield
    finally:
        if owned:
            cleanup_dist_env_and_memory()


@contextmanager
def _inspect_in_process() -> Iterator[None]:
    """vLLM's class inspection in this process (it spawns a Python child per class otherwise)."""
    import vllm.model_executor.models.registry as registry

    original = registry._run_in_subprocess
    registry._run_in_subprocess = lambda fn: fn()
    try:
        yield
    finally:
        registry._run_in_subprocess = original


@contextmanager
def _config_class_kept(model_type: Any) -> Iterator[None]:
    """The config class vLLM registers for ``model_type`` keeps its own ``model_type`` after the ask.

    vLLM's config loader registers the class of a model type it maps (``_CONFIG_REGISTRY``) by setting the
    class attribute: asking a DeepSeek-V3.2 checkpoint sets ``DeepseekV3Config.model_type = "deepseek_v32"``
    for the whole process (vllm/transformers_utils/config.py, ``_register_config_class``), and every later
    DeepSeek-V3 config there reads as V3.2 (its MTP draft becomes ``DeepseekV32MTPModel``). doctor asks in
    the caller's process, so it gives the attribute back.
    """
    try:
        from vllm.transformers_utils.config import _CONFIG_REGISTRY

        config_class = _CONFIG_REGISTRY[model_type] if isinstance(model_type, str) and model_type in _CONFIG_REGISTRY else None
    except Exception:  # noqa: BLE001 - a vLLM without this registry: nothing to keep
        config_class = None
    if config_class is None:
        yield
        return
    own = config_class.__dict__.get("model_type", _UNSET)
    try:
        yield
    finally:
        if own is _UNSET:
            if "model_type" in config_class.__dict__:
                delattr(config_class, "model_type")
        else:
            config_class.model_type = own


_UNSET = object()


# -- the platform: a machine without a GPU asks on the CPU -------------------------------------------------------

CPU_SETTING = "VLLM_TARGET_DEVICE=cpu CUDA_VISIBLE_DEVICES="


def cuda_visible() -> bool:
    """Whether a CUDA device is visible to this process (torch asked without creating a context)."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return False
    try:
        import torch

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return bool(torch.cuda.is_available())
    except Exception:  # noqa: BLE001 - no usable torch.cuda: no device
        return False


def _gpu_build() -> bool:
    """torch built for CUDA (and so, here, vLLM's CUDA wheel rather than its CPU build)."""
    torch = sys.modules.get("torch")
    return torch is not None and getattr(getattr(torch, "version", None), "cuda", None) is not None


def _platform_resolved() -> bool:
    platforms = sys.modules.get("vllm.platforms")
    return platforms is not None and getattr(platforms, "_current_platform", None) is not None


@contextmanager
def cpu_platform_unless_gpu() -> Iterator[Optional[str]]:
    """``VLLM_TARGET_DEVICE=cpu`` while vLLM resolves its platform, when no CUDA device is visible.

    vLLM's CUDA wheel on a machine without a GPU detects no platform and ``VllmConfig`` then fails with
    ``RuntimeError: Failed to infer device type``; ``VLLM_TARGET_DEVICE=cpu`` makes vLLM pick its CPU platform
    first (``vllm/platforms/__init__.py``, ``resolve_current_platform_cls_qualname``). ``CUDA_VISIBLE_DEVICES=``
    too where it is unset: vLLM 0.34's CPU platform refuses a config on x86 without Triton ("requires Triton
    (triton-cpu)"), and counts the CUDA wheel's Triton present without a driver only where that variable is set
    and empty (``vllm/triton_utils/importing.py``). Only set when unset and the platform is not resolved yet;
    restored on exit (vLLM keeps the platform it resolved). Yields the value set (also when an earlier call set
    it while vLLM resolved its platform), or None.
    """
    global _chose_cpu
    if _platform_resolved() or "VLLM_TARGET_DEVICE" in os.environ or cuda_visible():
        yield "cpu" if _chose_cpu and _platform_resolved() else None
        return
    added = {"VLLM_TARGET_DEVICE": "cpu", **({} if "CUDA_VISIBLE_DEVICES" in os.environ else {"CUDA_VISIBLE_DEVICES": ""})}
    os.environ.update(added)
    try:
        yield "cpu"
    finally:
        for name in added:
            os.environ.pop(name, None)
        _chose_cpu = _chose_cpu or _platform_resolved()


_chose_cpu = False  # cpu_platform_unless_gpu set VLLM_TARGET_DEVICE=cpu when vLLM resolved its platform


# -- the engine's output stays out of doctor's -----------------------------------------------------------------

QUIET_LOGGERS = ("vllm", "transformers", "torch", "")


class _Captured(logging.Handler):
    """Keeps what the engine logs while it is asked; shows none of it."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno >= logging.WARNING:
            self.records.append(record)

    def last_error(self) -> Optional[BaseException]:
        """The exception the engine last logged (vLLM logs a class it cannot inspect, then says 'check the logs')."""
        for record in reversed(self.records):
            if record.exc_info and isinstance(record.exc_info[1], BaseException):
                return record.exc_info[1]
        return None


def _configure_engine_logging() -> None:
    """Let each library install its own handlers now (vLLM, transformers and torch do it on first import), so
    that those are what :func:`quiet_engine` sets aside and gives back, not handlers installed while quiet."""
    for module in ("torch", "vllm.logger", "transformers.utils.logging"):
        try:
            __import__(module)
        except Exception:  # noqa: BLE001 - not installed: nothing of it to quiet
            continue
    hf_logging = sys.modules.get("transformers.utils.logging")
    if hf_logging is not None:
        try:
            hf_logging.get_logger("transformers")  # its root handler is added on the first get_logger
        except Exception:  # noqa: BLE001
            pass


@contextmanager
def quiet_engine() -> Iterator[_Captured]:
    """vLLM's, transformers' and torch's log records and Python warnings kept out of doctor's output.

    Each of those loggers (and the root, where records without a handler would reach ``logging.lastResort``)
    gets one capturing handler instead of its own for the question, and its handlers and level back after;
    with ``VLLM_LOGGING_LEVEL=DEBUG`` nothing changes, so a person debugging still sees everything.
    """
    captured = _Captured()
    if os.environ.get("VLLM_LOGGING_LEVEL", "").upper() == "DEBUG":
        yield captured
        return
    _configure_engine_logging()
    saved = []
    for name in QUIET_LOGGERS:
        logger = logging.getLogger(name)
        saved.append((logger, list(logger.handlers)))
        logger.handlers = [captured]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield captured
    finally:
        for logger, handlers in saved:
            # A handler a library installed meanwhile (its first import) stays, after its own.
            added = [h for h in logger.handlers if h is not captured and h not in handlers]
            logger.handlers = handlers + added


# -- one line for any failure ----------------------------------------------------------------------------------

REASON_CHARS = 400


def _where(exc: BaseException) -> str:
    """The innermost frame of ``exc``'s traceback: ``path:line in function: `source` ``, path from the package."""
    tb = exc.__traceback__
    if tb is None:
        return ""
    while tb.tb_next is not None:
        tb = tb.tb_next
    code = tb.tb_frame.f_code
    path = code.co_filename.replace(os.sep, "/")
    for marker in ("/site-packages/", "/dist-packages/"):
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    source = linecache.getline(code.co_filename, tb.tb_lineno).strip()
    return f"{path}:{tb.tb_lineno} in {code.co_name}" + (f": `{source}`" if source else "")


def one_line(exc: BaseException, logged: Optional[BaseException] = None) -> str:
    """``exc`` as one line that names its type and a reason, never empty.

    A pydantic ``ValidationError`` (vLLM's configs are pydantic dataclasses) is replaced by the exception its
    validator raised; an exception without a message (a bare ``assert``) is named by where it was raised;
    vLLM's "check the logs" is replaced by the exception it logged (``logged``).
    """
    if type(exc).__name__ == "ValidationError" and callable(getattr(exc, "errors", None)):
        try:
            first = exc.errors()[0]
        except Exception:  # noqa: BLE001 - not pydantic's after all
            first = None
        if first:
            inner = (first.get("ctx") or {}).get("error")
            if isinstance(inner, BaseException):
                return one_line(inner, logged)
            message = str(first.get("msg") or "")
            if message:
                return _clip(f"{type(exc).__name__}: {message}", logged)
    text = " ".join(str(exc).split())
    if text:
        return _clip(f"{type(exc).__name__}: {text}", logged)
    where = _where(exc)
    return _clip(f"{type(exc).__name__} raised at {where}" if where else f"{type(exc).__name__} (no message)", None)


def _clip(line: str, logged: Optional[BaseException]) -> str:
    hint = "Please check the logs for more details."
    if hint in line:
        line = line.replace(hint, "").rstrip()
        if logged is not None:
            line = f"{line} ({one_line(logged)})"
    line = " ".join(line.split())
    return line if len(line) <= REASON_CHARS else line[: REASON_CHARS - 3] + "..."


def _unspecified_platform() -> bool:
    platforms = sys.modules.get("vllm.platforms")
    current = getattr(platforms, "_current_platform", None) if platforms is not None else None
    return current is not None and type(current).__name__ == "UnspecifiedPlatform"


def _platform_reason(exc: BaseException, cpu_set: Optional[str]) -> Optional[str]:
    """vLLM found no device to build for (its CUDA wheel without a GPU): what to set, or that it was set."""
    text = str(exc)
    if "infer device type" not in text and "UnspecifiedPlatform" not in text and not _unspecified_platform():
        return None
    if cpu_set:
        return (f"vLLM found no device here even with VLLM_TARGET_DEVICE=cpu ({one_line(exc)}); "
                f"this vLLM build cannot build its classes on a CPU")  # fmt: skip
    return (f"vLLM found no device here ({one_line(exc)}); on a machine without a GPU run doctor with "
            f"{CPU_SETTING}")  # fmt: skip


def _failed(reason: str, module_class: str = "") -> dict:
    return {"built": False, "module_class": module_class, "selection_source": None, "reason": reason, "failed": True}


def _not_asked(reason: str) -> dict:
    """Not asked, and not a failure (no MTP draft in this config)."""
    return {"built": False, "module_class": "", "selection_source": None, "reason": reason, "failed": False}


def _view(answer: Any, module: Any, raised: Optional[BaseException] = None) -> dict:
    if isinstance(answer, ModuleReads):
        return {
            "built": True, "module_class": answer.module_class, "selection_source": answer.source,
            "tensors": len(answer.names), "left_out": len(answer.left_out),
            "left_out_summary": _counted(left_out_summary(answer.left_out)), "seconds": round(answer.seconds, 3),
            "failed": False,
        }  # fmt: skip
    reason = " ".join(str(getattr(answer, "reason", answer)).split())
    if raised is not None:
        # The dry run's "AssertionError: " says nothing: the exception load_weights raised, and where.
        reason = f"vLLM's class refused the checkpoint's tensors (do they fit config.json?): {one_line(raised)}"
    elif not reason or reason.endswith(":"):
        reason = f"{reason or 'the dry run failed'} (no reason given)"
    declined = bool(getattr(answer, "declined", False))
    return {"built": module is not None, "module_class": getattr(answer, "module_class", ""), "selection_source": None,
            "reason": reason, "failed": not declined}  # fmt: skip


def _counted(summary: str) -> str:
    """``1 tensor left out``, ``2 tensors left out`` for module_reads' ``N tensor(s) left out``."""
    count, sep, rest = summary.partition(" tensor(s)")
    if sep and count.isdigit():
        return f"{count} {'tensor' if count == '1' else 'tensors'}{rest}"
    return summary


def _recording_call() -> tuple[Callable[[Any, Any], Any], list]:
    """``call`` for :func:`ask`: ``load_weights`` as the engine calls it, keeping what it raised (the dry run's
    own message drops the traceback, which is what says where a bare ``assert`` failed)."""
    raised: list = []

    def call(model: Any, weights: Any) -> Any:
        try:
            return model.load_weights(weights)
        except Exception as exc:
            raised.append(exc)
            raise

    return call, raised


def ask_modules(checkpoint: Checkpoint, settings: RobustSettings, *, expect_draft: bool = True) -> dict[str, dict]:
    """``{"target": {...}, "draft": {...}}``: what each module vLLM builds for ``checkpoint`` reads of it.

    Never raises: every failure is a role's one-line ``reason`` with ``failed`` true. ``expect_draft``: the
    checkpoint has an MTP draft (doctor's draft view found one), so vLLM refusing to make one is a failure.
    """
    with cpu_platform_unless_gpu() as cpu_set, quiet_engine() as logged:
        try:
            return _ask_modules(checkpoint, settings, expect_draft, cpu_set, logged)
        except Exception as exc:  # noqa: BLE001 - whatever vLLM raised, said in one line
            reason = _platform_reason(exc, cpu_set) or f"vLLM failed while asked: {one_line(exc, logged.last_error())}"
            draft = _failed(reason) if expect_draft else _not_asked("no MTP draft in this checkpoint")
            return {"target": _failed(reason), "draft": draft}


def _ask_modules(checkpoint: Checkpoint, settings: RobustSettings, expect_draft: bool, cpu_set: Optional[str],
                 logged: _Captured) -> dict[str, dict]:  # fmt: skip
    def both(reason: str) -> dict[str, dict]:
        draft = _failed(reason) if expect_draft else _not_asked("no MTP draft in this checkpoint")
        return {"target": _failed(reason), "draft": draft}

    try:
        import torch
        from vllm.config import LoadConfig, ModelConfig, ParallelConfig, SpeculativeConfig, VllmConfig, set_current_vllm_config
        from vllm.model_executor.model_loader.utils import initialize_model
        from vllm.utils.torch_utils import set_default_torch_dtype
    except Exception as exc:  # noqa: BLE001 - no vLLM here: nothing to build
        return both(f"vLLM cannot be imported here ({one_line(exc)})")
    from ..select.built_module import BuiltModule
    from ..engine import EngineView, declared_unused, model_identity

    if not isinstance(checkpoint.config, dict):
        return both("the checkpoint has no readable config.json")

    # A GPU build of torch and vLLM asked on vLLM's CPU platform (doctor chose it: no GPU visible): said, as the
    # CPU platform refuses things the GPU one does not (vLLM 0.34 on x86 without triton-cpu, sparse attention).
    on_cpu = " (asked on vLLM's CPU platform: no GPU is visible here)" if cpu_set and _gpu_build() else ""

    def refused(what: str, exc: BaseException) -> str:
        platform = _platform_reason(exc, cpu_set)
        if platform:
            return platform
        err = logged.last_error()
        if isinstance(err, ImportError) and "inspect" in str(exc):
            # vLLM could not import the class (it logs why, then says "failed to be inspected").
            archs = ", ".join(checkpoint.config.get("architectures") or []) or "this config's class"
            install = f"; install {err.name} to ask it" if isinstance(err, ModuleNotFoundError) and err.name else ""
            return f"vLLM cannot import {archs} here: {one_line(err)}{install}"
        return f"{what}: {one_line(exc, err)}{on_cpu}"

    out: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="mx-doctor-") as folder, ExitStack() as stack:
        with open(os.path.join(folder, "config.json"), "w") as handle:
            json.dump(checkpoint.config, handle)
        stack.enter_context(_inspect_in_process())
        stack.enter_context(_config_class_kept(checkpoint.config.get("model_type")))
        try:
            target = ModelConfig(model=folder, max_model_len=256, trust_remote_code=False)
        except Exception as exc:  # noqa: BLE001 - a config vLLM refuses: said, not raised
            return both(refused("vLLM refuses the config", exc))
        spec: Optional[Any] = None
        try:
            spec = SpeculativeConfig(method="mtp", num_speculative_tokens=1, target_model_config=target,
                                     target_parallel_config=ParallelConfig())  # fmt: skip
        except Exception as exc:  # noqa: BLE001 - no MTP draft for this config
            reason = refused("vLLM makes no MTP draft of this config", exc)
            out["draft"] = _failed(reason) if expect_draft else _not_asked(f"no MTP draft: {reason}")
        try:
            vllm_config = VllmConfig(model_config=target, speculative_config=spec, parallel_config=ParallelConfig(),
                                     load_config=LoadConfig(load_format="auto"))  # fmt: skip
        except Exception as exc:  # noqa: BLE001 - the architecture's own config check (vLLM's VerifyAndUpdateConfig)
            reason = refused(f"vLLM refuses the config ({', '.join(target.architectures)})", exc)
            return {role: out.get(role) or _failed(reason) for role in ("target", "draft")}
        try:
            stack.enter_context(_vllm_process(vllm_config))
        except Exception as exc:  # noqa: BLE001 - no process group here
            reason = refused("vLLM's one-process group could not start here", exc)
            return {role: out.get(role) or _failed(reason) for role in ("target", "draft")}
        roles = [("target", target, False)] + ([("draft", spec.draft_model_config, True)] if spec is not None else [])
        for role, model_config, is_draft in roles:
            module = None
            try:
                with set_current_vllm_config(vllm_config), set_default_torch_dtype(model_config.dtype), torch.device("meta"):
                    module = initialize_model(vllm_config=vllm_config, model_config=model_config)
            except Exception as exc:  # noqa: BLE001 - a class this machine cannot build
                out[role] = _failed(refused("cannot build it here", exc))
                continue
            architectures, model_type = model_identity(model_config.hf_config)
            engine = EngineView(is_draft=is_draft, speculative_method="mtp" if is_draft else None, target_uris=(),
                                tensor_parallel_size=1, pipeline_parallel_size=1, hf_config=model_config.hf_config,
                                architectures=architectures, model_type=model_type,
                                target_hf_config=target.hf_config if is_draft else None)  # fmt: skip
            call, raised = _recording_call()
            with set_current_vllm_config(vllm_config):
                answer = ask(module, checkpoint, settings, unused=declared_unused(module),
                             replaced=BuiltModule(engine).filled_by_engine, call=call)  # fmt: skip
            out[role] = _view(answer, module, raised[-1] if raised and not isinstance(answer, ModuleReads) else None)
    out.setdefault("draft", _not_asked("no MTP draft"))
    return out


def failure(modules: Optional[dict]) -> Optional[str]:
    """One line saying why a module could not be asked (doctor's exit 3), or None when every one was."""
    if not modules:
        return None
    failed = [(role, view) for role, view in modules.items() if view.get("failed")]
    if not failed:
        return None
    reasons: dict[str, list[str]] = {}
    for role, view in failed:
        cls = (view.get("module_class") or "").rsplit(".", 1)[-1]
        reasons.setdefault(view.get("reason") or "no reason given", []).append(f"{role} ({cls})" if cls else role)
    return "; ".join(f"{' and '.join(roles)}: {reason}" for reason, roles in reasons.items())


__all__ = ["CPU_SETTING", "ask_modules", "cpu_platform_unless_gpu", "failure", "one_line", "quiet_engine"]

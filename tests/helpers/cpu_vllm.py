"""ModelExpress's real ``VllmAdapter`` on a CPU: the one adapter every vLLM-class test loads through.

ModelExpress's ``VllmAdapter.after_weight_iter_load`` runs vLLM's
``process_weights_after_loading`` on the load device, ``cuda:0``: it moves
every layer with a quant method there and repacks the weights with vLLM's
compiled kernels (``torch.ops._C.*``, which the CUDA wheel lacks on a CPU).
:func:`cpu_vllm_adapter` makes a subclass that changes only that step, and
optionally refuses a re-initialization; everything else (``apply_weight_iter``,
identity, ranks) is the real adapter's.

Imports ModelExpress's vLLM adapter when called, so a module may import this
one before it has set ``VLLM_TARGET_DEVICE`` or checked that vLLM is installed.
"""

from __future__ import annotations

from typing import Optional

POST_LOAD_SKIPPED = "skip"  # after_weight_iter_load returns the result untouched (counted in ``post_load_calls``)
POST_LOAD_ON_CPU = "cpu"  # vLLM's process_weights_after_loading runs, on the CPU instead of cuda:0


def cpu_vllm_adapter(*, post_load: str = POST_LOAD_SKIPPED, refuse_reinit: Optional[str] = None) -> type:
    """A new ``VllmAdapter`` subclass for a CPU (each call its own class, with its own counters).

    ``post_load``: :data:`POST_LOAD_SKIPPED` (the default) overrides
    ``after_weight_iter_load`` to return the result as it is, counting each
    call in the class's ``post_load_calls``; :data:`POST_LOAD_ON_CPU` keeps
    ModelExpress's ``after_weight_iter_load`` and overrides only
    ``_process_weights_after_loading`` (0.7.0 and 0.8 alike), which then calls
    vLLM's ``process_weights_after_loading`` on the CPU, without its CUDA
    tensor-attribute capture.

    ``refuse_reinit``: None (the default) leaves ModelExpress's
    ``reinit_for_retry`` as it is (a failed strategy rebuilds the model);
    a role name (``"draft"``, ``"model"``) makes it count the call in the
    class's ``reinits`` and raise ``AssertionError("the <role> was re-initialized")``.
    """
    if post_load not in (POST_LOAD_SKIPPED, POST_LOAD_ON_CPU):
        raise ValueError(f"post_load={post_load!r}: {POST_LOAD_SKIPPED!r} or {POST_LOAD_ON_CPU!r}")
    from modelexpress.engines.vllm.adapter import VllmAdapter

    class CpuVllmAdapter(VllmAdapter):
        post_load_calls = 0
        reinits = 0

        if post_load == POST_LOAD_SKIPPED:

            def after_weight_iter_load(self, result):
                type(self).post_load_calls += 1
                return result

        else:

            def _process_weights_after_loading(self, result):
                import torch
                from vllm.model_executor.model_loader.utils import process_weights_after_loading

                process_weights_after_loading(result.model, self.model_config, torch.device("cpu"))
                return result

        if refuse_reinit is not None:

            def reinit_for_retry(self, result):
                type(self).reinits += 1
                raise AssertionError(f"the {refuse_reinit} was re-initialized")

    CpuVllmAdapter.__doc__ = (
        f"ModelExpress's VllmAdapter on a CPU (post_load={post_load!r}, refuse_reinit={refuse_reinit!r}); "
        "see helpers.cpu_vllm.cpu_vllm_adapter."
    )
    return CpuVllmAdapter

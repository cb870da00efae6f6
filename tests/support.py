"""The engine-side helpers moved to the :mod:`helpers` package; this name stays for existing imports."""

from helpers.checkpoints import reference_tensors
from helpers.engine import CountingAdapter, RecordingModel, make_context, model_config, run_chain, vllm_config
from helpers.scripts import load_script

__all__ = [
    "CountingAdapter",
    "load_script",
    "RecordingModel",
    "make_context",
    "model_config",
    "reference_tensors",
    "run_chain",
    "vllm_config",
]

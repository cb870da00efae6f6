"""A model's ``skip_checkpoint_weight(name)`` is read as ``is_unused_checkpoint_weight`` is: never streamed, never missing.

vLLM PR #58016 (open; forks ship it) lets a model name checkpoint tensors its loader drops before reading them;
in those forks a model may raise when such a name reaches its ``load_weights`` (DeepSeek-V4.1's engram table). Here
a user's model class, registered the way a vLLM general plugin registers one (``ModelRegistry.register_model``),
subclasses vLLM 0.32's real ``DeepseekV3ForCausalLM``: its checkpoint also holds a vision tower it does not load,
which it names in ``skip_checkpoint_weight`` and refuses in ``load_weights``. Built by vLLM from a config naming that
architecture, loaded through ModelExpress's real chain with robust: the load succeeds, not one vision tensor (nor
byte) is streamed or read, and every parameter holds the checkpoint's values.
"""

from __future__ import annotations

import importlib.util
import os

import pytest

if importlib.util.find_spec("vllm") is None:
    pytest.skip("vLLM is not installed", allow_module_level=True)

import torch  # noqa: E402
from mtp_arch import builders  # noqa: E402
from mtp_arch.checkpoints import write_checkpoint  # noqa: E402
from test_mtp_architectures import (  # noqa: E402,F401 - fixtures and helpers of the draft matrix
    load_target,
    no_modelexpress_server,
    target_and_draft_checkpoint,
    vllm_cpu,
)

from mx_strategies.verify.tensor_bytes import same_bytes  # noqa: E402

ARCHITECTURE = "VisionSkippingDeepseekV3ForCausalLM"
VISION = "vision_tower."


def register() -> None:
    """What a user's ``vllm.general_plugins`` entry point does to add a model class."""
    from vllm import ModelRegistry
    from vllm.model_executor.models.deepseek_v2 import DeepseekV3ForCausalLM

    class VisionSkippingDeepseekV3ForCausalLM(DeepseekV3ForCausalLM):
        """DeepSeek-V3 whose checkpoint carries a vision tower it never loads (asks the loader to skip it)."""

        def skip_checkpoint_weight(self, name: str) -> bool:
            return name.startswith(VISION)

        def load_weights(self, weights):
            def refused():
                for name, tensor in weights:
                    if self.skip_checkpoint_weight(name):
                        raise ValueError(f"{name}: must be skipped by skip_checkpoint_weight")
                    yield name, tensor

            return super().load_weights(refused())

    ModelRegistry.register_model(ARCHITECTURE, VisionSkippingDeepseekV3ForCausalLM)


@pytest.fixture
def registered(monkeypatch):
    register()
    config = dict(builders.TARGET_CONFIGS["deepseek_v3"], architectures=[ARCHITECTURE])
    monkeypatch.setitem(builders.TARGET_CONFIGS, "deepseek_v3", config)


def test_names_the_model_skips_are_never_streamed(tmp_path, robust, monkeypatch, vllm_cpu, registered):  # noqa: F811
    folder, _, _, (target, vc, config, truth, tensors), mtp = target_and_draft_checkpoint("deepseek_v3", tmp_path)
    assert type(target).__name__ == ARCHITECTURE and target.skip_checkpoint_weight("vision_tower.x")
    generator = torch.Generator().manual_seed(7)
    vision = {f"{VISION}blocks.{i}.weight": torch.randn(64, 256, generator=generator) for i in range(4)}
    write_checkpoint(folder, {**tensors, **mtp, **vision}, shards=3)
    vision_bytes = sum(t.numel() * t.element_size() for t in vision.values())

    loaded, seen, report = load_target(monkeypatch, folder, target, vc, config)

    assert loaded is target and report["outcome"] == "loaded"
    assert not [n for n in seen["names"] if n.startswith(VISION)]
    assert report["bytes_streamed"] == seen["bytes"]
    everything = sum(t.numel() * t.element_size() for t in {**tensors, **mtp, **vision}.values())
    assert report["bytes_streamed"] <= everything - vision_bytes  # the vision tower's bytes were not read
    assert report["left_out_bytes"] >= vision_bytes  # and the report counts them among what was left unread
    wrong = [n for n, p in loaded.named_parameters() if not same_bytes(p.data, truth[n])]
    assert not wrong

"""An SGLang draft on the server's own local ``--model-path``, with no MX_MODEL_URI.

SGLang defaults ``speculative_draft_model_path`` to the target's ``--model-path`` for DeepSeek
(arg_groups/speculative_hook.py:1120), so the draft's ModelConfig names the target's folder. robust
takes the target's sources from SGLang's ServerArgs (mx_strategies/engine/sglang.py): the draft
streams its own tensors only, not the whole checkpoint, and is not published for peer-to-peer
transfer under the target's identity. Real SGLang classes, ModelExpress's real SglangAdapter and
chain; the cpu accelerator backend is the test-only shim (ModelExpress 0.7.0 has none).
"""

from __future__ import annotations

import pytest
import torch

from mx_strategies import activation
from mx_strategies.releases import chain_finalizes
from mx_strategies.observe.report import clear_reports, recent_reports
from sglang_support import builders as sb
from sglang_support.loads import delivered_names, mx_load


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A server started with --model-path on a local DeepSeek-V3 checkpoint."""
    full = str(tmp_path_factory.mktemp("served") / "deepseek_v3")
    tensors = sb.write_target_checkpoint(full, "deepseek_v3")
    with sb.sglang_runtime(model_path=full):
        yield full, tensors


def test_the_draft_streams_its_own_tensors_from_the_servers_model_path(served, monkeypatch, caplog):
    import modelexpress.engines.sglang.adapter as adapter_module
    import modelexpress.engines.sglang.loader as loader_module
    from mx_cpu_shim import CpuAcceleratorBackend

    full, tensors = served
    monkeypatch.setattr(adapter_module, "accelerator_backend_for", lambda device: CpuAcceleratorBackend())
    contexts = []
    real_build = loader_module.build_sglang_load_context

    def build(*args, **kwargs):  # the context MxModelLoader builds (p2p_enabled by default)
        contexts.append(real_build(*args, **kwargs))
        return contexts[-1]

    monkeypatch.setattr(loader_module, "build_sglang_load_context", build)
    monkeypatch.setenv("MX_STRATEGY", "mx_strategies.robust")
    monkeypatch.setenv("MX_ROBUST_REQUIRE_MODEL_URI", "false")
    activation.register_sglang()
    clear_reports()

    draft = sb.build_model(full, draft=True)
    fed = delivered_names(draft.model)
    with caplog.at_level("WARNING", logger="modelexpress.strategy_robust_model_streamer"):
        mx_load(draft)
    (report,) = [r for r in recent_reports() if r["role"] == "draft"]
    assert report["outcome"] == "loaded" and report["source_label"] == "model" and report["source"] == full
    assert report["architecture"] is None  # no table row: the module answers
    own = {n for n in tensors if n.startswith("model.layers.2.")}
    assert set(fed) == own - {"model.layers.2.embed_tokens.weight", "model.layers.2.shared_head.head.weight"}
    assert report["bytes_streamed"] == sum(tensors[n].numel() * tensors[n].element_size() for n in fed)
    reference = sb.build_model(full, draft=True)
    sb.native_load(reference)
    sb.assert_same_parameters(draft.model, reference.model)
    (ctx,) = contexts
    assert ctx.p2p_enabled is False
    if not chain_finalizes():  # 0.7: robust withholds the draft itself; 0.8's MxModelLoader already did (no namespace)
        assert any("SGLang draft: not published for peer-to-peer transfer" in r.getMessage() for r in caplog.records)
    assert torch.distributed.is_initialized()  # the runtime's gloo group, which robust did not touch

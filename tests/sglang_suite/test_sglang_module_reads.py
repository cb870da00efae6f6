"""The question asked of SGLang 0.5.23's real classes (mx_strategies.select.module_reads): targets and MTP/NextN drafts.

For each class the SGLang suite builds (DeepSeek-V3, Qwen3-Next, GLM-4.5, MiMo-V2-Flash; target and draft),
the module's own answer (a dry run of its ``load_weights`` on data-less tensors) is compared with the
names SGLang's own ``DefaultModelLoader`` makes that very class read (``trace_native_load``: the
ground truth), and with the table's row where one remains (MiMo-V2's). The dry run leaves the module as it was: the same objects,
storage and bytes (every parameter holds the builder's NaN sentinel, compared by its bits), and
no attribute added (SGLang's DeepSeek stores w_kc / w_vc on its attention modules while loading).
"""

from __future__ import annotations

import pytest

from helpers.state import differences, module_state
from sglang_support import builders as sb

from mx_strategies.select import module_reads, mtp_table
from mx_strategies.select.built_module import BuiltModule
from mx_strategies.engine import SGLANG, EngineView, declared_unused
from mx_strategies.select.selection import _row_layout_for
from mx_strategies.settings import load_settings
from mx_strategies.inspect.sources import Candidate, probe
from mx_strategies.verify.tensor_bytes import same_bytes

ARCHS = ("deepseek_v3", "qwen3_next", "glm4_moe", "mimo_v2_flash")


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """Each architecture's tiny target checkpoint (its MTP layer in it), once for the module."""
    out = {}
    for name in ARCHS:
        folder = str(tmp_path_factory.mktemp(name))
        out[name] = (folder, sb.write_target_checkpoint(folder, name))
    return out


def snapshot(model):
    return {
        name: (tensor, tensor.data_ptr(), tensor.detach().clone())
        for name, tensor in list(model.named_parameters(remove_duplicate=False)) + list(model.named_buffers(remove_duplicate=False))
    }


def assert_untouched(model, before, attributes):
    after = dict(list(model.named_parameters(remove_duplicate=False)) + list(model.named_buffers(remove_duplicate=False)))
    assert set(after) == set(before)
    changed = [n for n, (t, p, d) in before.items() if after[n] is not t or t.data_ptr() != p or not same_bytes(t.detach(), d)]
    assert not changed, changed
    now = {name: set(module.__dict__) for name, module in model.named_modules()}
    assert now == attributes, {n: now[n] ^ attributes[n] for n in now if now[n] != attributes.get(n)}


def engine_for(built, draft: bool) -> EngineView:
    from mx_strategies.engine.sglang import _is_mtp_draft, _method_of
    from mx_strategies.engine.view import model_identity

    architectures, model_type = model_identity(built.model_config.hf_config)
    method = _method_of(built.model_config) if draft else None
    return EngineView(
        is_draft=draft, speculative_method=method, target_uris=(), tensor_parallel_size=1, pipeline_parallel_size=1,
        hf_config=built.model_config.hf_config, architectures=architectures, model_type=model_type, engine=SGLANG,
        mtp=_is_mtp_draft(draft, method, architectures),
    )  # fmt: skip


@pytest.mark.parametrize("draft", [False, True], ids=["target", "draft"])
@pytest.mark.parametrize("name", ARCHS)
def test_the_modules_answer_is_what_sglangs_own_loader_reads(name, draft, runtime, checkpoints):
    if name == "mimo_v2_flash" and draft:
        pytest.skip(
            "not a question for the module: SGLang's weight iterator, not MiMoV2MTP.load_weights, picks each draft "
            "runner's MTP layer (draft_model_idx), so the table's row decides "
            "(test_sglang_more_drafts.py loads every runner through the chain)"
        )
    folder, tensors = checkpoints[name]
    settings = load_settings()
    checkpoint = probe(Candidate("explicit", folder), settings)
    built = sb.build_model(folder, draft=draft)
    engine = engine_for(built, draft)
    before = snapshot(built.model)
    attributes = {n: set(m.__dict__) for n, m in built.model.named_modules()}
    state = module_state(built.model)
    answer = module_reads.ask(
        built.model, checkpoint, settings, unused=declared_unused(built.model), replaced=BuiltModule(engine).filled_by_engine
    )
    assert_untouched(built.model, before, attributes)
    after = module_state(built.model)
    assert after == state, differences(state, after)  # every attribute, container and parameter attribute as it was
    assert answer.judged > 0 and answer.gaps == (), [g.describe() for g in answer.gaps]
    assert isinstance(answer, module_reads.ModuleReads), answer
    assert answer.source == "dry_run" and answer.module_class.endswith(sb.ARCHITECTURES[name][int(draft)])

    reference = sb.build_model(folder, draft=draft)
    consumed = sb.trace_native_load(reference).consumed
    replaced = {n for n, why in answer.left_out.items() if why == module_reads._REPLACED}
    assert replaced <= consumed  # copies SGLang's class reads and its draft worker replaces afterwards
    assert set(answer.names) == consumed - replaced, (sorted(set(answer.names) - consumed), sorted(consumed - set(answer.names)))

    # The table agrees where a row remains: MiMo-V2's (an engine rule, one MTP layer per draft runner), whose
    # target leaves every MTP layer to the runners. The other classes build here: no row, the module answers.
    if draft:
        assert mtp_table.match(engine.architectures, engine.model_type, engine.speculative_method, engine=SGLANG) is None
    else:
        row = mtp_table.match_target(built.model_config.hf_config, engine=SGLANG)
        assert (row.key if row is not None else None) == ("sglang_mimo_v2_mtp" if name == "mimo_v2_flash" else None)
        if row is not None:
            layout = _row_layout_for(row, checkpoint, engine)
            assert set(answer.names) == set(tensors) - mtp_table.draft_only(row, layout, tensors)

"""The one answerer for a draft whose module cannot be asked gives the answers the two old ones gave.

Before issue 53 two modules answered "which tensors does a draft that cannot be
asked read?": the table (``select/mtp_table.py``: a row per engine class) and
the naming conventions (``select/draft.py``: ``mtp``, ``nextn_layers``,
``mtp_layers``, ``MX_ROBUST_DRAFT_EXTRA_PREFIXES``). Now the conventions are
rows of the one table (``select/mtp_rows.py``) read by one algorithm
(``select/mtp_table.py``). The old modules are kept, as test-only code, in
``tests/helpers/old_answerers/`` (never imported by the runtime), and every
case here runs old and new and compares: every row of every engine release
(vLLM's and SGLang's), every name fixture of the draft suites (test_draft.py,
test_mtp_architectures.py's names-only rows, the synthetic qwen/deepseek
checkpoints of test_mtp_drafts.py, each row's own naming), every target config
the vLLM suites build (tests/mtp_arch/builders.py), under every shared-weights
policy, pipeline parallel 1 and 2, checked and unchecked loads, the engine's
word on the heads, and the convention settings.

Where old and new disagree (only on the conventions; the class rows give the
same answers, skipped reasons included):

1. A draft no row matches, whose engine says it keeps its own head
   (``heads_replaced=False``: vLLM's ``has_own_lm_head``), at pipeline
   parallel 1 under ``auto``: the old conventions left the target's
   ``lm_head.weight`` out (they ignored the engine's word); the new streams it.
   The new is right: completeness (``mtp_table.filled_by_engine(None,
   heads_replaced=False)``) requires the head from the checkpoint, as the
   engine does not fill it, so the old answer failed that load's check.
2. ``rotary_emb.inv_freq`` under a convention's layers: the old streamed it,
   the new leaves it out, as the table rows always did. The new is right:
   every vLLM MTP class skips it in ``load_weights`` (``AutoWeightsLoader``'s
   ``rotary_emb.inv_freq`` rule, DeepSeekMTP's explicit ``continue``), so the
   old streamed bytes nobody reads.
3. The conventions' answer now says why each embedding/head copy it does not
   stream is left out (``RowSelection.skipped``, as the rows always did); the
   old said nothing. The selection does not report these (a convention load's
   ``Selection.left_out`` is unchanged), so no report field moves.
"""

from __future__ import annotations

import importlib.util
import itertools
import re
from types import SimpleNamespace

import pytest

from helpers.old_answerers import draft as old_draft
from helpers.old_answerers import mtp_table as old_table
from mx_strategies.errors import DraftPlanError
from mx_strategies.select import mtp_table
from mx_strategies.select.mtp_rows import TABLE

RELEASES = [None, (0, 32), (0, 33), (0, 34), (0, 5, 23)]
POLICIES = ("auto", "always", "never")
CONVENTION_SETTINGS = [
    (("mtp", "nextn_layers", "mtp_layers"), ()),
    (("mtp",), ()),
    (("nextn_layers", "mtp"), ()),
    (("mtp_layers",), ("language_model.mtp_head.", "extra.")),
    ((), ("mtp.",)),
]
TARGET = ["model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight", "model.layers.1.mlp.gate.weight",
          "model.norm.weight", "lm_head.weight", "model.language_model.embed_tokens.weight",
          "language_model.lm_head.weight", "model.language_model.layers.0.mlp.gate.weight"]  # fmt: skip
LEAVES = ("eh_proj.weight", "enorm.weight", "embed_tokens.weight", "shared_head.head.weight",
          "shared_head.output.weight", "shared_head.norm.weight", "emb.tok_emb.weight", "head.weight",
          "self_attn.q_proj.weight", "rotary_emb.inv_freq", "hyper_connection_mixer.block_inject_weight.weight",
          "tok_embeddings.weight", "mlp_res_norm.weight")  # fmt: skip


def _row_names(row) -> list[str]:
    """Names under each of a row's prefixes, for layers 0..4 (nextn/indexed) or directly, plus the row's copies."""
    names = set(TARGET)
    for prefix in row.prefixes + row.also:
        for leaf in LEAVES:
            names.add(prefix + leaf)
            names.update(f"{prefix}{i}.{leaf}" for i in range(5))
    names.update({"model.mtp.embed_tokens.weight", "mtp.embed_tokens.weight", "model.layers.2.embed_tokens.weight"})
    return sorted(names)


def _suite_name_sets(tmp_path_factory) -> list[tuple[str, list[str], dict]]:
    """(label, names, config.json) of the draft suites' fixtures."""
    from mx_strategies.testing.synthetic import mtp_checkpoint

    qwen_head = ["mtp.fc.weight", "mtp.layers.0.self_attn.q_proj.weight", "mtp.norm.weight"]
    deepseek_head = ["model.layers.2.eh_proj.weight", "model.layers.2.enorm.weight",
                     "model.layers.2.shared_head.norm.weight"]  # fmt: skip
    small = {"num_hidden_layers": 2, "num_nextn_predict_layers": 1}
    sets = [
        ("test_draft qwen", TARGET[:5] + qwen_head, small),
        ("test_draft deepseek", TARGET[:5] + deepseek_head, small),
        ("test_draft both", TARGET[:5] + qwen_head + deepseek_head, small),
        ("test_draft mtp_layers", TARGET[:5] + ["model.mtp.layers.0.fc.weight", "language_model.mtp_head.fc.weight"],
         small),
        ("no draft tensors", TARGET, small),
        ("zero layers", TARGET[:5] + deepseek_head + ["model.layers.0.eh_proj.weight"], {"num_hidden_layers": 0}),
    ]
    for style, layers in itertools.product(("qwen", "deepseek"), (1, 2)):
        ck = mtp_checkpoint(str(tmp_path_factory.mktemp(style)), style=style, num_nextn_layers=layers)
        sets.append((f"synthetic {style} x{layers}", sorted(ck.tensors), ck.config))
    if importlib.util.find_spec("vllm") is not None:  # the names-only rows of the vLLM matrix
        import test_mtp_architectures as matrix

        for spec_set in ("NAMES_ONLY", "NAMES_ONLY_033", "NAMES_ONLY_034"):
            for key, (config, *groups) in getattr(matrix, spec_set, {}).items():
                sets.append((f"{spec_set} {key}", sorted(set().union(*groups)), config))
    return sets


@pytest.fixture(scope="module")
def name_sets(tmp_path_factory):
    return _suite_name_sets(tmp_path_factory)


def _rows():
    return [row for row in TABLE]


# -- the class rows: one algorithm gives the old table's answers ---------------------------------------


@pytest.mark.parametrize("row", _rows(), ids=lambda row: row.key)
def test_every_row_answers_as_the_old_table(row, name_sets):
    (old_row,) = [r for r in old_table.TABLE if r.key == row.key]
    configs = [("the target's hf_config", {"num_hidden_layers": 2, "num_nextn_predict_layers": 2, "n_mtp_layers": 2,
                                           "num_mtp_modules": 2, "mtp_num_hidden_layers": 1})]  # fmt: skip
    cases = [(f"{row.key} naming", _row_names(row), configs)] + [
        (label, names, [("the checkpoint's config.json", config)]) for label, names, config in name_sets
    ]
    compared = 0
    for (label, names, configs), shares, policy, checks, heads in itertools.product(
        cases, (True, False), POLICIES, (True, False), (None, False, True)
    ):
        layout = mtp_table.row_layout(row, *configs)
        assert layout == old_table.row_layout(old_row, *configs), label
        for which in (layout, layout.for_runner(1)):
            kwargs = dict(shares_target_weights=shares, shared_policy=policy, load_checks_parameters=checks,
                          heads_replaced=heads)  # fmt: skip
            new, old = mtp_table.row_tensors(row, names, which, **kwargs), old_table.select(old_row, names, which, **kwargs)
            assert (new.own, new.shared, new.skipped) == (old.own, old.shared, old.skipped), (label, kwargs)
            compared += 1
        assert mtp_table._draft_roots(row, layout) == old_table._draft_roots(old_row, layout)
        held = [n for n in names if n.startswith("model.layers.0.")]
        assert mtp_table.draft_only(row, layout, names, held) == old_table.draft_only(old_row, layout, names, held)
        assert mtp_table.describe(row, layout) == old_table.describe(old_row, layout)
    assert mtp_table.convention_name(row) == old_table.convention_name(old_row)
    assert mtp_table.describe(row) == old_table.describe(old_row)
    for shares, heads in itertools.product((True, False), (None, False, True)):
        new = mtp_table.filled_by_engine(row, shares_target_weights=shares, heads_replaced=heads)
        old = old_table.filled_by_engine(old_row, shares_target_weights=shares, heads_replaced=heads)
        assert [new(n) for n in _row_names(row)] == [old(n) for n in _row_names(row)]
    assert compared


def test_every_row_is_matched_as_the_old_table_matched_it():
    """Drafts by architecture, model type and method; targets by config; on every release of both engines."""
    methods = ("mtp", "MTP", "deepseek_mtp", "dspark", "eagle", "nextn", "eagle3", None)
    architectures = {a for row in TABLE for a in row.draft_architectures} | {"SomeFutureMTPModel", "DeepSeekMTP"}
    model_types = {t for row in TABLE for t in row.model_types} | {"deepseek_mtp", None}
    targets = [{"architectures": [t], "model_type": "x"} for row in TABLE for t in row.targets]
    targets += [{"model_type": t} for row in TABLE for t in row.targets] + [None, {}, {"architectures": "x"}]
    if importlib.util.find_spec("vllm") is not None:
        from mtp_arch import builders

        targets += list(builders.TARGET_CONFIGS.values())
    for release, engine in itertools.product(RELEASES, ("vllm", "sglang")):
        assert [r.key for r in mtp_table._rows_for(release, engine=engine)] == [
            r.key for r in old_table._rows_for(release, engine=engine)
        ]
        for arch, model_type, method in itertools.product(sorted(architectures) + [None], model_types, methods):
            new = mtp_table.match([arch] if arch else [], model_type, method, vllm=release, engine=engine)
            old = old_table.match([arch] if arch else [], model_type, method, vllm=release, engine=engine)
            assert (new and new.key) == (old and old.key), (arch, model_type, method, release, engine)
        for config in targets:
            new = mtp_table.match_target(config, vllm=release, engine=engine)
            old = old_table.match_target(config, vllm=release, engine=engine)
            assert (new and new.key) == (old and old.key), config
    assert mtp_table._installed_vllm() == old_table._installed_vllm()


# -- the conventions: rows of the same table, read by the same algorithm ---------------------------------


def _documented_difference(old_names, old_shared, names, layout, settings, shares, heads):
    """The old conventions' answer with the two documented disagreements (the module docstring) applied."""
    placed = layout if layout.first else None
    rows = [r for r in mtp_table._convention_rows(settings).values() if placed is not None or r.layout != "nextn"]
    own_prefixes = tuple(p for r in rows for p in mtp_table._roots(r, placed.indices() if placed else []))
    own = {n for n in old_names - old_shared if not re.search(r"(^|\.)rotary_emb\.inv_freq$", n)}  # 2.
    shared = set(old_shared)
    if heads is False and shares and settings.draft_shared_weights == "auto":  # 1.
        shared |= {n for n in names if re.search(r"(^|\.)lm_head\.weight$", n) and not n.startswith(own_prefixes)}
    return own, shared - own


def test_the_conventions_answer_as_the_old_conventions(name_sets):
    compared = 0
    cases = [(label, names, config) for label, names, config in name_sets]
    cases += [(f"{row.key} naming", _row_names(row), {"num_hidden_layers": 2, "num_nextn_predict_layers": 2})
              for row in TABLE]  # fmt: skip
    for (label, names, config), (conventions, extra), policy, shares, heads in itertools.product(
        cases, CONVENTION_SETTINGS, POLICIES, (True, False), (None, False, True)
    ):
        settings = SimpleNamespace(draft_conventions=conventions, draft_extra_prefixes=extra,
                                   draft_shared_weights=policy)  # fmt: skip
        for configs in ((config,), (None, config), (config, {"num_hidden_layers": 61})):
            layout = mtp_table.conventions_layout(*configs)
            assert layout == old_draft.layer_layout(*configs)
            assert mtp_table.describe_conventions(settings, layout) == old_draft.describe_conventions(settings, layout)
            try:
                old = old_draft.select_draft_tensors(set(names), settings, layout, share_with_target=shares)
            except DraftPlanError as exc:
                with pytest.raises(DraftPlanError) as caught:
                    mtp_table.convention_tensors(set(names), settings, layout, share_with_target=shares,
                                                 heads_replaced=heads)  # fmt: skip
                assert str(caught.value) == str(exc)
                continue
            new = mtp_table.convention_tensors(set(names), settings, layout, share_with_target=shares,
                                               heads_replaced=heads)  # fmt: skip
            own, shared = _documented_difference(old.names, old.shared, names, layout, settings, shares, heads)
            assert (new.own, new.shared, new.convention) == (own, shared, old.convention), (label, settings, heads)
            if heads is not False and not any("rotary_emb" in n for n in names):
                assert (new.names, new.shared) == (old.names, old.shared)  # no difference at all
            compared += 1
    assert compared > 1000

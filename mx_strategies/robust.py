"""Robust ModelStreamer strategy: verified streaming, source chain, MTP drafts.

Switched on with ``MX_STRATEGY=mx_strategies.robust``: the activation plugin
puts :class:`RobustModelStreamerStrategy` in the place of ModelExpress's
``model_streamer`` in the load-strategy chain.
"""

from __future__ import annotations

import importlib.util
import logging
import time
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace
from typing import ClassVar, Iterator, Optional

from modelexpress import envs
from modelexpress.adapter import EngineAdapter, StrategyFailed
from modelexpress.load_strategy.base import LoadContext, LoadStrategy, _as_load_result, register_tensors
from modelexpress.load_strategy.context import LoadResult
from modelexpress.load_strategy.model_streamer_strategy import ModelStreamerStrategy

from .stream import completeness, write_watch
from .select import kept
from .observe import progress, telemetry
from .select.built_module import BuiltModule
from .engine import SGLANG, EngineView, engine_view
from .errors import ConfigurationError, IncompleteModel, MxStrategiesError
from .plan.distributed import RankShares, agreed_plan, agreed_shares, distributes, sees_same_files
from .plan import read_ahead
from .plan.planning import LoadPlan, PlanDescription, carrier_plan, plan_load, plan_resolved, share_universe
from .releases import chain_finalizes
from .observe.report import METADATA_KEY, LoadFailure, LoadReport, Rejected, record
from .settings import RobustSettings, load_settings
from .inspect.sources import Candidate, Resolution, candidates, resolve
from .stream.read_ahead import ReadAhead
from .stream.streaming import VerifiedStream

logger = logging.getLogger("modelexpress.strategy_robust_model_streamer")


@dataclass(frozen=True)
class _Streamed:
    """A streamed load waiting for its post-load processing, and the figures its report needs."""

    resolution: Resolution
    described: PlanDescription  # the plan's own account of itself: the report's selection fields
    stream: VerifiedStream
    shares: "Optional[RankShares]"
    engine: EngineView
    started: float
    planned: float
    streamed: float


class RobustModelStreamerStrategy(ModelStreamerStrategy):
    """Stream safetensors with runai-model-streamer, losing no weight.

    Activated by ``MX_STRATEGY=mx_strategies.robust`` in the place of
    ``model_streamer``; eligible, like it, when ``MX_MODEL_URI`` is set
    (``MX_ROBUST_REQUIRE_MODEL_URI=false`` widens this) and
    runai-model-streamer is importable.

    Unlike the parent it resolves the source through a chain
    (``model_weights``, ``model``, ``MX_MODEL_URI`` by default) probing
    headers only, orders shards naturally, skips empty ones, streams an MTP
    draft's own tensors only, and checks every expected tensor off. Anything
    that fails before the first tensor reaches the model raises
    ``StrategyFailed(mutated=False)``; a shortfall after that raises
    ``mutated=True`` so the chain rebuilds the model.
    """

    name = "robust_model_streamer"
    replaces: ClassVar[str] = "model_streamer"
    # What load() streamed, kept for post_process (ModelExpress 0.8 calls it from finalize, after load).
    _streamed: "Optional[_Streamed]" = None
    # We stream ourselves: only the adapter's weight application is needed.
    requires = (EngineAdapter.apply_weight_iter,)

    @classmethod
    def validate_settings(cls) -> RobustSettings:
        """Read the settings now, so a bad value fails at activation."""
        return load_settings()

    def supports_explicit_uri(self, ctx: LoadContext) -> bool:
        if not LoadStrategy.is_available(self, ctx):
            return False
        if importlib.util.find_spec("runai_model_streamer") is None:
            logger.info(f"[Worker {ctx.global_rank}] runai_model_streamer not installed, skipping")
            return False
        return True

    def is_available(self, ctx: LoadContext) -> bool:
        """Eligible like ``model_streamer``; never raises (a bad setting skips the strategy)."""
        if not self.supports_explicit_uri(ctx):
            return False
        try:
            settings = load_settings()
        except ConfigurationError as exc:
            logger.warning(f"[Worker {ctx.global_rank}] {self.name} skipped: {exc}")
            return False
        if settings.require_model_uri and not settings.model_uri:
            logger.info(f"[Worker {ctx.global_rank}] MX_MODEL_URI not set, skipping {self.name}")
            return False
        return True

    def load(self, result: LoadResult, ctx: LoadContext) -> LoadResult:
        with self._recorded_failure(ctx):
            settings = self._settings()
            vllm_config = getattr(getattr(ctx, "adapter", None), "vllm_config", None)  # a sub-folder draft's target
            return self._load_from(result, ctx, candidates(ctx.model_config, settings, vllm_config), settings)

    def load_uri(self, result: LoadResult, ctx: LoadContext, model_uri: str) -> LoadResult:
        """Load from an explicit URI (no chain), with the same checks."""
        with self._recorded_failure(ctx):
            return self._load_from(result, ctx, [Candidate("explicit", model_uri)], self._settings())

    @contextmanager
    def _recorded_failure(self, ctx: LoadContext) -> Iterator[None]:
        """Keep a failed load in the load reports (and metrics and traces), as the chain is told of it."""
        started = time.perf_counter()
        try:
            yield
        except StrategyFailed as exc:
            record(LoadFailure(engine_view(ctx).role, ctx.global_rank, str(exc), exc.mutated))
            telemetry.record_failure(exc, engine_view(ctx).role, ctx.global_rank, mutated=exc.mutated, started=started)
            raise

    @staticmethod
    def _settings() -> RobustSettings:
        try:
            return load_settings()
        except ConfigurationError as exc:
            raise StrategyFailed(str(exc), mutated=False) from exc

    # -- steps ---------------------------------------------------------------

    def _load_from(
        self,
        result: LoadResult,
        ctx: LoadContext,
        cands: list[Candidate],
        settings: RobustSettings,
    ) -> LoadResult:
        started = time.perf_counter()
        result = _as_load_result(result)
        rank = ctx.global_rank
        engine = engine_view(ctx)
        distributed, not_distributed = distributes(engine, envs.MX_MS_DISTRIBUTED)
        if envs.MX_MS_DISTRIBUTED and not distributed:
            logger.info(f"[Worker {rank}] {engine.role} streams on its own, not distributed: {not_distributed}")
        module = BuiltModule.of(result.model, engine, settings, rank)
        shares: "RankShares | None" = None
        if module.bypassed:
            message = f"{engine.role} load not started: {'; '.join(module.bypassed)}"
            logger.warning(f"[Worker {rank}] {self.name} {message}")
            raise StrategyFailed(message, mutated=False)
        with ExitStack() as early:  # a read-ahead lives from before the question to the end of the stream
            ahead: Optional[ReadAhead] = None
            try:
                if distributed:
                    resolution, plan = agreed_plan(
                        ctx.adapter, rank, lambda: plan_load(cands, module, settings), sees_same_files(settings)
                    )
                    plan, shares = self._take_shares(
                        ctx.adapter, rank, resolution, plan, lambda: plan_resolved(resolution, module, settings), settings
                    )
                else:
                    resolution = resolve(cands, settings)
                    ahead = early.enter_context(self._read_ahead(resolution, module, settings))
                    if ahead.failed:
                        logger.info(f"[Worker {rank}] {engine.role}: runai did not read ahead while the module was "
                                    f"asked ({ahead.failed}); streaming after its answer")  # fmt: skip
                    plan = plan_resolved(resolution, module, settings)  # the question, while runai reads ahead
            except MxStrategiesError as exc:
                logger.warning(f"[Worker {rank}] {self.name} {engine.role} load not started: {exc}")
                raise StrategyFailed(str(exc), mutated=False) from exc
            logger.info(f"[Worker {rank}] {engine.role} source: {resolution.trail()}")
            for problem in resolution.checkpoint.problems:
                logger.info(f"[Worker {rank}] {problem.kind}: {problem.message}")
            described = plan.describe()
            for level, line in described.lines:
                logger.log(level, f"[Worker {rank}] {line}")
            carrier = None
            if shares is not None and shares.shares_differ:
                carrier = carrier_plan(plan, resolution.checkpoint, settings, shares.carried)
                logger.info(
                    f"[Worker {rank}] {engine.role}: the ranks of this host ({list(shares.host_ranks)}) read different "
                    f"shares; streaming their union once ({len(carrier.expected)} tensors, {carrier.bytes} bytes) "
                    f"and feeding this rank's model its own {len(plan.expected)} ({plan.bytes} bytes)"
                )
            planned = time.perf_counter()
            result, stream = self._stream(result, ctx, plan, settings, module, distributed, carrier, ahead)
        self._streamed = _Streamed(resolution, described, stream, shares, engine, started, planned, time.perf_counter())
        if not chain_finalizes():
            # ModelExpress 0.7: the strategy finishes its own load; 0.8's chain calls finalize() for that.
            result = self.post_process(result, ctx)
            self._publish_07(result, ctx)
        return result

    # -- the load's end: once, whichever ModelExpress runs it -----------------

    def prepare(self, result: LoadResult, ctx: LoadContext) -> None:
        """ModelExpress 0.8 calls this before :meth:`load`: a reload of a live model is not ours to do.

        A layerwise reload (``ctx.is_reload``) puts the live model's parameters on
        the meta device and materializes each layer as its weights arrive; what
        robust checks (the module's answer against a built model, every write
        of the load, whole parameters) assumes a cold load into a built model.
        Refused before anything is touched, so the chain's next strategy reloads.
        """
        if getattr(ctx, "is_reload", False):
            message = (
                f"{engine_view(ctx).role} reload refused before it started: {self.name} loads cold models only, "
                f"not a layerwise reload of a live one; ModelExpress's next strategy reloads it"
            )
            logger.info(f"[Worker {ctx.global_rank}] {self.name} {message}")
            raise StrategyFailed(message, mutated=False)
        super_prepare = getattr(super(), "prepare", None)
        if super_prepare is not None:
            super_prepare(result, ctx)

    def finalize(self, result: LoadResult, ctx: LoadContext) -> None:
        """ModelExpress 0.8 calls this after :meth:`load`: post-load processing and registration, once each."""
        with self._recorded_failure(ctx):
            super().finalize(result, ctx)

    def post_process(self, result: LoadResult, ctx: LoadContext) -> LoadResult:
        """The engine's post-load processing, exactly once, then the load's report.

        ModelExpress 0.8 calls it from ``finalize``; on 0.7, :meth:`load` does.
        Twice would repack or requantize weights already processed (seed 003).
        """
        streamed = self._streamed
        if streamed is None:  # nothing streamed: nothing of ours to finish
            return result
        self._streamed = None
        try:
            processed = ctx.adapter.after_weight_iter_load(result)
        except Exception as exc:
            raise StrategyFailed(f"post-load processing failed: {exc}", mutated=True) from exc
        finished = time.perf_counter()
        timings = {
            "resolve": streamed.planned - streamed.started,
            "stream": streamed.streamed - streamed.planned,
            "post_load": finished - streamed.streamed,  # on 0.8 from the end of load() to the end of finalize()
            "total": finished - streamed.started,
            "verify": streamed.stream.verify_seconds,  # verify and completeness lie inside stream
            "completeness": streamed.streamed - (streamed.stream.closed_at or streamed.streamed),
        }
        report = self._report(
            ctx.global_rank, streamed.resolution, streamed.described, streamed.stream, timings, streamed.shares
        )
        entry = record(report)
        # The chain's envelope carries the report; so does the adapter's result where it made a new one (0.7).
        envelopes = [result] + [processed] if isinstance(processed, LoadResult) and processed is not result else [result]
        for envelope in envelopes:
            envelope.metadata[METADATA_KEY] = entry
        telemetry.record_load(report, ctx, engine=streamed.engine.engine, ended=finished)
        logger.info(f"[Worker {ctx.global_rank}] {report.summary()}")
        return envelopes[-1]

    def _publish_07(self, result: LoadResult, ctx: LoadContext) -> None:
        """ModelExpress 0.7: register the loaded tensors for peer-to-peer transfer, as its strategies do."""
        engine = engine_view(ctx)
        if engine.engine == SGLANG and engine.is_draft and getattr(ctx, "p2p_enabled", False):
            # ModelExpress 0.7 builds an SGLang draft's identity from its model_path, the target's: published,
            # its tensors would be offered to peers as the target's. 0.8 publishes drafts under a namespace.
            ctx.p2p_enabled = False
            logger.warning(
                f"[Worker {ctx.global_rank}] SGLang draft: not published for peer-to-peer transfer (ModelExpress "
                f"gives it the target's identity, model_path {getattr(ctx.model_config, 'model_path', None)!r})"
            )
        register_tensors(result, ctx)

    @staticmethod
    def _read_ahead(resolution: Resolution, module: BuiltModule, settings: RobustSettings) -> ReadAhead:
        """runai reading the head of the foreseen load while the module is asked (:mod:`.plan.read_ahead`)."""
        foreseen = read_ahead.foreseen(resolution, module, settings) if settings.read_ahead_bytes else None
        head = None
        if foreseen is not None:
            uncertain = read_ahead.uncertain_names(resolution, module, settings)
            head = read_ahead.head(foreseen, settings.read_ahead_bytes, module.held, uncertain=uncertain)
        return ReadAhead(head, settings, loader_extra_config=module.engine.loader_extra_config)

    @staticmethod
    def _take_shares(adapter, rank: int, resolution: Resolution, rank0_plan: LoadPlan, own_plan, settings):
        """This rank's own plan of rank 0's checkpoint, and every rank's share (:func:`.distributed.agreed_shares`).

        Rank 0's plan is rank 0's share; every other rank plans its own
        (``own_plan``: its module's answer) and checks the files only it
        reads. A rank that cannot plan still joins the exchange, so all
        refuse together (``mutated=False``), never a hang.
        """
        own, refusal = (rank0_plan, None) if rank == 0 else (None, None)
        if rank != 0:
            try:
                own = own_plan()
                planned = {s.key for s in rank0_plan.shards}
                extra = [s for s in own.shards if s.key not in planned]
                refusal = sees_same_files(settings)((resolution, replace(own, shards=tuple(extra)))) if extra else None
            except MxStrategiesError as exc:
                refusal = str(exc)
        universe, sizes = share_universe(resolution.checkpoint, settings)
        if own is not None and not refusal:
            outside = set(own.expected) - set(universe)
            if outside:
                refusal = f"plans {len(outside)} tensor(s) outside the checkpoint's loaded shards: {sorted(outside)[:3]}"
        shares = agreed_shares(adapter, rank, universe, sizes, None if own is None or refusal else frozenset(own.expected),
                               refusal)  # fmt: skip
        return own, shares

    @staticmethod
    def _report(
        rank: int,
        resolution: Resolution,
        described: PlanDescription,
        stream: VerifiedStream,
        timings: dict[str, float],
        shares: "RankShares | None" = None,
    ) -> LoadReport:
        checkpoint = resolution.checkpoint
        return LoadReport(
            **described.report_fields,
            rank=rank,
            source=resolution.candidate.uri,
            source_label=resolution.candidate.label,
            rejected=tuple(Rejected(r.candidate.label, r.candidate.uri, r.reason) for r in resolution.rejected),
            checkpoint_bytes=checkpoint.data_bytes,
            metadata_bytes=checkpoint.metadata_bytes,
            distributed=stream.distributed,
            delivery_order=stream.delivery_order,
            held_peak_bytes=stream.held_peak_bytes,
            timings=timings,
            bytes_from_storage=stream.bytes_from_storage,
            bytes_carried=None if shares is None else stream.bytes_carried,
            read_ahead_bytes=stream.read_ahead_bytes,
            read_ahead_discarded_bytes=stream.bytes_discarded,
            host_ranks=() if shares is None else shares.host_ranks,
            ranks=() if shares is None else tuple((r.rank, r.host, r.tensors, r.bytes) for r in shares.ranks),
        )

    def _stream(
        self,
        result: LoadResult,
        ctx: LoadContext,
        plan: LoadPlan,
        settings: RobustSettings,
        module: BuiltModule,
        distributed: bool,
        carrier: Optional[LoadPlan] = None,
        ahead: Optional[ReadAhead] = None,
    ) -> tuple[LoadResult, VerifiedStream]:
        rank, engine = ctx.global_rank, module.engine
        stream = VerifiedStream(
            plan,
            settings,
            device=str(ctx.target_device) if distributed else "cpu",
            distributed=distributed,
            loader_extra_config=engine.loader_extra_config,
            on_warning=lambda message: logger.warning(f"[Worker {rank}] {message}"),
            progress=progress.for_load(plan, settings, ctx, engine.role),
            carrier=carrier,
            read_ahead=ahead,
        )
        filled_by_engine = module.filled_by_engine
        judged = kept.judged_parameters(result.model, filled_by_engine) if result.model is not None else {}
        warn = lambda message: logger.warning(f"[Worker {rank}] {message}")  # noqa: E731
        try:
            with stream:  # entering starts the stream and fetches the first tensor
                with completeness.capture_loaded(result.model) as loaded, write_watch.watched(result.model, judged) as written:
                    result = ctx.adapter.apply_weight_iter(result, stream.tensors())
                stream.settle()
            completeness.check(
                result.model,
                loaded,
                role=engine.role,
                policy=settings.model_completeness,
                filled_by_engine=filled_by_engine,
                on_warning=warn,
            )
            completeness.check_written(
                result.model, judged, written.writes, role=engine.role, policy=settings.model_completeness, on_warning=warn
            )
            completeness.check_engine_marks(
                result.model, role=engine.role, policy=settings.model_completeness, on_warning=warn
            )
        except Exception as exc:
            # Our errors know whether the model was touched; the engine's own happen while it is written.
            mutated = exc.mutated if isinstance(exc, MxStrategiesError) else stream.touched
            touched = "after the model was touched" if mutated else "before any tensor reached the model"
            logger.warning(f"[Worker {rank}] {self.name} failed {touched}: {exc}")
            if isinstance(exc, IncompleteModel):
                # Every tensor streamed, and the model still lacks some: the user loses robust's streaming
                # (ModelExpress rebuilds the model for its next strategy) and must know what to do.
                logger.error(
                    f"[Worker {rank}] {self.name} refused the {engine.role} load it streamed from {plan.source}: "
                    f"the model reported weights it keeps as not written. ModelExpress now rebuilds the model "
                    f"and tries its next strategy, without robust. If the model is right as loaded, "
                    f"MX_ROBUST_MODEL_COMPLETENESS=warn accepts it; `mx-strategies doctor {plan.source}` shows "
                    f"what robust plans for this checkpoint."
                )
            raise StrategyFailed(str(exc), mutated=mutated) from exc
        return result, stream


__all__ = ["RobustModelStreamerStrategy"]

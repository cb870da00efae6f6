"""Robust ModelStreamer strategy: verified streaming, source chain, MTP drafts.

Switched on with ``MX_STRATEGY=mx_strategies.robust``: the activation plugin
puts :class:`RobustModelStreamerStrategy` in the place of ModelExpress's
``model_streamer`` in the load-strategy chain.
"""

from __future__ import annotations

import importlib.util
import logging
import time
from dataclasses import dataclass
from typing import ClassVar

from modelexpress.adapter import EngineAdapter, StrategyFailed
from modelexpress.load_strategy.base import LoadContext, LoadStrategy, _as_load_result, register_tensors
from modelexpress.load_strategy.context import LoadResult
from modelexpress.load_strategy.model_streamer_strategy import ModelStreamerStrategy

from .checkpoint import Checkpoint
from .draft import NoDraftTensors, layer_layout, select_draft_tensors
from .engine import EngineView, engine_view
from .settings import RobustSettings, load_settings
from .sources import Candidate, NoStreamableSource, Resolution, candidates, normalize, resolve
from .content_check import ContentMismatch
from .streaming import (
    IncompleteDelivery,
    LoadPlan,
    StreamBroken,
    StreamStartError,
    VerifiedStream,
    plan_full,
    plan_subset,
)

logger = logging.getLogger("modelexpress.strategy_robust_model_streamer")

PROBLEMS_SHOWN = 5


@dataclass(frozen=True)
class LoadReport:
    """What one load did; kept in ``LoadResult.metadata['robust_model_streamer']``."""

    role: str  # "target" or "draft"
    source: str
    source_label: str
    convention: str | None
    tensors: int
    bytes_streamed: int
    checkpoint_bytes: int
    seconds: float

    def as_dict(self) -> dict:
        return dict(self.__dict__)


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
        if not self.supports_explicit_uri(ctx):
            return False
        settings = load_settings()
        if settings.require_model_uri and not settings.model_uri:
            logger.info(f"[Worker {ctx.global_rank}] MX_MODEL_URI not set, skipping {self.name}")
            return False
        return True

    def load(self, result: LoadResult, ctx: LoadContext) -> LoadResult:
        settings = load_settings()
        return self._load_from(result, ctx, candidates(ctx.model_config, settings), settings)

    def load_uri(self, result: LoadResult, ctx: LoadContext, model_uri: str) -> LoadResult:
        """Load from an explicit URI (no chain), with the same checks."""
        settings = load_settings()
        return self._load_from(result, ctx, [Candidate("explicit", model_uri)], settings)

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
        role = "draft" if engine.is_draft else "target"

        resolution = self._resolve(cands, settings, rank, role)
        checkpoint = resolution.checkpoint
        if checkpoint.errors:
            raise StrategyFailed(self._describe_errors(checkpoint), mutated=False)
        for problem in checkpoint.problems:
            logger.info(f"[Worker {rank}] {problem.kind}: {problem.message}")

        plan, convention = self._plan(checkpoint, resolution, engine, settings, rank)
        result = self._stream(result, ctx, plan, settings, engine)

        report = LoadReport(
            role=role,
            source=resolution.candidate.uri,
            source_label=resolution.candidate.label,
            convention=convention,
            tensors=len(plan.expected),
            bytes_streamed=plan.bytes,
            checkpoint_bytes=checkpoint.data_bytes,
            seconds=time.perf_counter() - started,
        )
        result.metadata[self.name] = report.as_dict()
        self._log_report(rank, report)
        register_tensors(result, ctx)
        return result

    def _resolve(self, cands: list[Candidate], settings: RobustSettings, rank: int, role: str) -> Resolution:
        try:
            resolution = resolve(cands, settings)
        except NoStreamableSource as exc:
            raise StrategyFailed(str(exc), mutated=False) from exc
        logger.info(f"[Worker {rank}] {role} source: {resolution.trail()}")
        return resolution

    @staticmethod
    def _describe_errors(checkpoint: Checkpoint) -> str:
        errors = checkpoint.errors
        shown = "; ".join(p.message for p in errors[:PROBLEMS_SHOWN])
        more = f" (and {len(errors) - PROBLEMS_SHOWN} more)" if len(errors) > PROBLEMS_SHOWN else ""
        return f"checkpoint {checkpoint.uri} is inconsistent, not loading it: {shown}{more}"

    def _plan(
        self,
        checkpoint: Checkpoint,
        resolution: Resolution,
        engine: EngineView,
        settings: RobustSettings,
        rank: int,
    ) -> tuple[LoadPlan, str | None]:
        if not engine.is_draft:
            return plan_full(checkpoint, settings), None
        is_target_checkpoint = self._is_target_checkpoint(resolution, engine, settings)
        if not (engine.is_mtp or (engine.speculative_method is None and is_target_checkpoint)):
            if is_target_checkpoint:
                # EAGLE and separate draft models have weights of their own.
                raise StrategyFailed(
                    f"draft (method {engine.speculative_method}) has a checkpoint of its own, but only the "
                    f"target's checkpoint {resolution.candidate.uri} holds weights; not feeding it the target's "
                    f"tensors ({resolution.trail()})",
                    mutated=False,
                )
            return plan_full(checkpoint, settings), None
        layout = layer_layout(checkpoint.config, engine.hf_config)
        try:
            selection = select_draft_tensors(
                set(checkpoint.tensors()),
                settings,
                layout,
                share_with_target=engine.pipeline_parallel_size == 1,
            )
        except NoDraftTensors as exc:
            raise StrategyFailed(f"draft load from {resolution.candidate.uri}: {exc}", mutated=False) from exc
        if selection.shared:
            logger.info(f"[Worker {rank}] draft also streams shared weights: {sorted(selection.shared)}")
        return plan_subset(checkpoint, selection.names), selection.convention

    @staticmethod
    def _is_target_checkpoint(resolution: Resolution, engine: EngineView, settings: RobustSettings) -> bool:
        """Whether the chosen source is the target's checkpoint (MX_MODEL_URI or a target source).

        An MTP draft (vLLM method "mtp", or an unknown method on such a
        source) takes its own tensors out of it; any other draft has a
        checkpoint of its own and must not be fed the target's.
        """
        shared = {normalize(u) for u in engine.target_uris}
        if settings.model_uri:
            shared.add(normalize(settings.model_uri))
        return normalize(resolution.candidate.uri) in shared

    def _stream(
        self,
        result: LoadResult,
        ctx: LoadContext,
        plan: LoadPlan,
        settings: RobustSettings,
        engine: EngineView,
    ) -> LoadResult:
        rank = ctx.global_rank
        distributed = engine.tensor_parallel_size > 1 and settings.distributed
        device = str(ctx.target_device) if distributed else "cpu"
        stream = VerifiedStream(
            plan,
            settings,
            device=device,
            distributed=distributed,
            on_warning=lambda message: logger.warning(f"[Worker {rank}] {message}"),
        )
        try:
            with stream:  # entering starts the stream and fetches the first tensor
                result = ctx.adapter.apply_weight_iter(result, stream.tensors())
                stream.settle()
        except StreamStartError as exc:
            raise StrategyFailed(str(exc), mutated=False) from exc
        except Exception as exc:
            # The stream failing before it handed out a tensor leaves the model as it was.
            mutated = not (isinstance(exc, (StreamBroken, ContentMismatch)) and not stream.ledger.delivered)
            touched = "after the model was touched" if mutated else "before any tensor reached the model"
            logger.warning(f"[Worker {rank}] {self.name} failed {touched}: {exc}")
            raise StrategyFailed(str(exc), mutated=mutated) from exc
        try:
            return ctx.adapter.after_weight_iter_load(result)
        except Exception as exc:
            raise StrategyFailed(f"post-load processing failed: {exc}", mutated=True) from exc

    def _log_report(self, rank: int, report: LoadReport) -> None:
        share = 100.0 * report.bytes_streamed / report.checkpoint_bytes if report.checkpoint_bytes else 0.0
        convention = f", convention {report.convention}" if report.convention else ""
        logger.info(
            f"[Worker {rank}] {report.role} loaded from {report.source_label}={report.source!r}{convention}: "
            f"{report.tensors} tensors verified, {report.bytes_streamed} of {report.checkpoint_bytes} "
            f"checkpoint bytes streamed ({share:.1f}%) in {report.seconds:.2f}s"
        )


__all__ = ["RobustModelStreamerStrategy", "IncompleteDelivery"]

"""Activation: put the strategy named by ``MX_STRATEGY`` into ModelExpress's chain.

ModelExpress 0.7.0 has no plugin mechanism: ``LoadStrategyChain.run`` builds
a fixed list and hands it to the module-level ``execute_load_strategies``.
We wrap that function once, substituting our strategy for the built-in one it
``replaces`` (same position), so ``--load-format modelexpress`` and any
other caller of the chain use it. With ``MX_STRATEGY`` unset or empty nothing
is touched.

ModelExpress 0.8 has an entry of its own: a plugin file in ``MX_PLUGIN_DIR``
named by ``MX_LOAD_PLUGIN`` (:mod:`mx_strategies.modelexpress_plugin`). A
chain that holds our strategy already keeps it where the plugin put it, and
the strategy it replaces leaves the chain (:func:`follow_plugin`);
``MX_STRATEGY`` beside the plugin never adds a second copy.

Two entry points call :func:`activate` in every engine process: vLLM's
``vllm.general_plugins`` (:func:`register`) and SGLang's
``sglang.srt.plugins`` (:func:`register_sglang`, loaded by SGLang's
``load_plugins()`` in each scheduler process it spawns). SGLang's also
applies the compatibility patches ModelExpress's SGLang adapter needs on the
SGLang installed (:mod:`mx_strategies.patches`). Engines call plugins in
every process, sometimes more than once, so everything here is idempotent
and logs once per process.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import logging
import os
import sys
from typing import Any, Optional

from .errors import ActivationError, listed

_logger = logging.getLogger("modelexpress.mx_strategies")

STRATEGY_ENV = "MX_STRATEGY"
_WRAPPED_MARK = "__mx_strategies_original__"


def resolve_strategy_class(spec: str) -> type:
    """``module`` or ``module:Class`` -> the LoadStrategy subclass it exports."""
    from modelexpress.load_strategy import LoadStrategy

    module_name, _, class_name = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise ActivationError(f"{STRATEGY_ENV}={spec!r}: cannot import {module_name!r}: {exc}") from exc
    exported = [obj for obj in vars(module).values()
                if inspect.isclass(obj) and issubclass(obj, LoadStrategy)
                and obj.__module__ == module.__name__ and not inspect.isabstract(obj)]  # fmt: skip
    if class_name:
        if not hasattr(module, class_name):
            raise ActivationError(
                f"{STRATEGY_ENV}={spec!r}: module {module_name!r} has no attribute {class_name!r}; "
                f"{_offers(exported)}"
            )
        cls = getattr(module, class_name)
        if not (inspect.isclass(cls) and issubclass(cls, LoadStrategy)):
            raise ActivationError(
                f"{STRATEGY_ENV}={spec!r}: {module_name}.{class_name} is not a LoadStrategy subclass "
                f"(it is {_kind(cls)}); {_offers(exported)}"
            )
        return cls
    if len(exported) != 1:
        found = ", ".join(c.__name__ for c in exported) or "none"
        raise ActivationError(
            f"{STRATEGY_ENV}={spec!r}: expected the module to define exactly one LoadStrategy subclass, "
            f"found {found}; name one as module:Class"
        )
    return exported[0]


# How many LoadStrategy classes an activation error names before "(and N more)".
_OFFERS_SHOWN = 5


def _offers(exported: list) -> str:
    """What a module offers as ``MX_STRATEGY``'s ``:Class``, for an error that named something else."""
    if not exported:
        return "it defines no LoadStrategy subclass"
    names = sorted(c.__name__ for c in exported)
    return f"its LoadStrategy subclasses: {listed(names, _OFFERS_SHOWN)}"


def _kind(obj: object) -> str:
    """What an attribute is, in a few words (never its value)."""
    if inspect.isclass(obj):
        return "a class"
    if inspect.ismodule(obj):
        return "a module"
    if callable(obj):
        return "a function"
    return f"a {type(obj).__name__}"


def _substitute(strategies: list, cls: type) -> list:
    """The chain with ``cls`` in the place of the strategy it replaces, and in one place only.

    Where the chain holds ``cls`` already (ModelExpress 0.8 put it there from
    ``MX_PLUGIN_DIR``), it stays where the plugin put it and the strategy it
    replaces leaves the chain: a load robust refused must not fall through to
    the plain streamer robust exists to replace.
    """
    replaces = getattr(cls, "replaces", None)
    if any(getattr(s, "name", None) == cls.name for s in strategies):
        return [s for s in strategies if not (replaces and getattr(s, "name", None) == replaces)]
    if replaces:
        return [cls() if getattr(s, "name", None) == replaces else s for s in strategies]
    # No declared replacement: try it just before the engine's native loader.
    names = [getattr(s, "name", None) for s in strategies]
    position = names.index("default") if "default" in names else len(strategies)
    return strategies[:position] + [cls()] + strategies[position:]


def offered(settings: Any) -> tuple[bool, str]:
    """Whether robust, switched on, may run in ModelExpress's chain, and why: ``MX_STRATEGY`` alone is enough;
    ``MX_ROBUST_REQUIRE_MODEL_URI=true`` keeps upstream ``model_streamer``'s gate on ``MX_MODEL_URI``. The one
    rule the load (``is_available``) and doctor both ask."""
    if settings.require_model_uri and not settings.model_uri:
        return False, ("MX_ROBUST_REQUIRE_MODEL_URI=true and MX_MODEL_URI is unset: set MX_MODEL_URI to the "
                       "checkpoint, or unset MX_ROBUST_REQUIRE_MODEL_URI")  # fmt: skip
    return True, ("MX_MODEL_URI is set" if settings.model_uri else "streams the engine's own model_weights/model")


def installed_strategy() -> Optional[type]:
    """The strategy class currently installed in ModelExpress's chain, if any."""
    import modelexpress.load_strategy as chain_module

    return getattr(chain_module.execute_load_strategies, "__mx_strategies_class__", None)


def _rebind_aliases(old_functions: set, new) -> None:
    """Point every loaded module's name for the chain executor at ``new``.

    Other chains import the executor by name (ModelExpress's RL chain does
    ``from modelexpress.load_strategy import execute_load_strategies``). A
    module imported before activation holds the old function; rebinding
    those aliases makes the substitution independent of import order. A
    module imported afterwards gets ``new`` from the package itself.
    """
    for module in list(sys.modules.values()):
        try:
            current = getattr(module, "execute_load_strategies", None)
        except Exception:  # lazy modules may raise on attribute access
            continue
        if current is not None and current is not new and any(current is f for f in old_functions):
            try:
                setattr(module, "execute_load_strategies", new)
            except Exception:
                continue


def install(cls: type) -> bool:
    """Make ModelExpress's chains use ``cls``; False when they already do."""
    import modelexpress.load_strategy as chain_module

    current = chain_module.execute_load_strategies
    if getattr(current, "__mx_strategies_class__", None) is cls:
        return False
    original = getattr(current, _WRAPPED_MARK, current)  # never wrap a wrapper

    @functools.wraps(original)
    def execute_load_strategies(model, ctx, strategies):
        chain = _substitute(list(strategies), cls)
        shape = getattr(cls, "shape_chain", None)  # the strategy's say over the rest of the chain (robust's guard)
        return original(model, ctx, shape(chain) if shape is not None else chain)

    setattr(execute_load_strategies, _WRAPPED_MARK, original)
    execute_load_strategies.__mx_strategies_class__ = cls
    _rebind_aliases({current, original}, execute_load_strategies)
    return True


def uninstall() -> None:
    """Give ModelExpress back its own chain (for tests and scripts)."""
    import modelexpress.load_strategy as chain_module

    current = chain_module.execute_load_strategies
    original = getattr(current, _WRAPPED_MARK, None)
    if original is not None:
        _rebind_aliases({current}, original)


def activate(spec: Optional[str] = None, *, engine: Optional[str] = None) -> Optional[type]:
    """Install the strategy named by ``spec`` (default: ``$MX_STRATEGY``).

    Returns the installed class, or None when nothing was asked for (then
    nothing is touched, patches included). ``engine="sglang"`` also applies
    the SGLang compatibility patches. Hosts without either plugin mechanism
    (scripts) call this before loading.
    """
    spec = (os.environ.get(STRATEGY_ENV, "") if spec is None else spec).strip()
    if not spec:
        return None
    if engine == "sglang":
        from .patches import apply_sglang_patches

        apply_sglang_patches()
    cls = resolve_strategy_class(spec)
    validate = getattr(cls, "validate_settings", None)
    if validate is not None:
        validate()
    if install(cls):
        replaces = getattr(cls, "replaces", None)
        where = f"in place of {replaces!r}" if replaces else "before 'default'"
        _logger.info(f"mx-strategies: {STRATEGY_ENV}={spec} installed {cls.name!r} {where} in the ModelExpress chain")
    return cls


def follow_plugin(cls: type) -> type:
    """``cls`` entered ModelExpress 0.8's chain as a plugin: keep the strategy it replaces out of that chain.

    Called by the plugin file when 0.8 imports it (:mod:`mx_strategies.modelexpress_plugin`),
    before the chain runs; the chain keeps the plugin's place. Under SGLang (imported by
    then) the compatibility patches ModelExpress's SGLang adapter needs are applied too, as
    the SGLang entry point does: without the collectives patch, ranks cannot share a plan.
    Returns ``cls``.
    """
    if "sglang" in sys.modules:
        from .patches import apply_sglang_patches

        apply_sglang_patches()
    if install(cls):
        replaces = getattr(cls, "replaces", None)
        _logger.info(
            f"mx-strategies: {cls.name!r} entered the ModelExpress chain as a plugin (MX_LOAD_PLUGIN); "
            + (f"{replaces!r} leaves the chain" if replaces else "the chain is otherwise unchanged")
        )
    return cls


def register() -> None:
    """vLLM ``vllm.general_plugins`` entry point."""
    activate(engine="vllm")


def register_sglang() -> None:
    """SGLang ``sglang.srt.plugins`` entry point: the strategy, and the patches ModelExpress needs there."""
    activate(engine="sglang")

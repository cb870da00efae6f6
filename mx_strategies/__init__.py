"""mx-strategies: ModelExpress load strategies that lose no weight.

Switch on with ``MX_STRATEGY=mx_strategies.robust`` (vLLM loads our
``vllm.general_plugins`` entry point), or call :func:`activate` in hosts
without vLLM plugins.
"""

from .activation import ActivationError, activate
from .settings import RobustSettings, SettingsError, load_settings

__version__ = "0.1.0"

__all__ = ["ActivationError", "RobustSettings", "SettingsError", "activate", "load_settings", "__version__"]

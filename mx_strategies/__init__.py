"""mx-strategies: ModelExpress load strategies that lose no weight.

Switch on with ``MX_STRATEGY=mx_strategies.robust`` (vLLM loads our
``vllm.general_plugins`` entry point), or call :func:`activate` in hosts
without vLLM plugins. :func:`recent_reports` gives this process's load reports
(in a vLLM worker, read them back with ``collective_rpc``).
"""

from .activation import activate
from .errors import ActivationError, ConfigurationError, MxStrategiesError
from .observe.report import recent_reports
from .settings import RobustSettings, load_settings

__version__ = "0.2.0"

__all__ = [
    "ActivationError",
    "ConfigurationError",
    "MxStrategiesError",
    "RobustSettings",
    "activate",
    "load_settings",
    "recent_reports",
    "__version__",
]

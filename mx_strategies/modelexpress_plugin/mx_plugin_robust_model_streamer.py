"""ModelExpress 0.8 plugin: ``MX_LOAD_PLUGIN=robust_model_streamer`` loads with mx-strategies' robust streamer.

Put this file in ``MX_PLUGIN_DIR`` (``mx-strategies plugin --write``, or mount
it from the installed package) and set ``MX_LOAD_PLUGIN=robust_model_streamer``
and ``MX_LOAD_PLUGIN_BEFORE=model_streamer``: robust then runs after RDMA,
the server cache and InstantTensor, and ModelExpress's plain ``model_streamer``
leaves the chain (a load robust refused must not fall through to it).
Settings are read from the environment (``MX_ROBUST_*``) when the chain runs.
"""

from mx_strategies.activation import follow_plugin
from mx_strategies.robust import RobustModelStreamerStrategy


def register_plugin():
    """What ModelExpress 0.8's plugin loader asks for: a no-argument LoadStrategy class named like the file."""
    return follow_plugin(RobustModelStreamerStrategy)

"""The package's shape: a runtime that needs no tooling, tooling that says what it needs.

Production images install the runtime only. These tests check, in fresh
interpreters, that loading the strategy imports nothing from the CLI, the
testing tools or the demo's server, and that the demo without its extra
says in one line what to install instead of failing with a traceback.
"""

from __future__ import annotations

import json
import os
import pkgutil
import subprocess
import sys

import mx_strategies

RUNTIME_MODULES = sorted(
    f"mx_strategies.{m.name}"
    for m in pkgutil.iter_modules(mx_strategies.__path__)
    if m.name not in ("cli", "testing")
)


def _python(code: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **env},
        cwd=os.path.dirname(os.path.dirname(mx_strategies.__file__)),
    )


def test_the_runtime_modules_are_the_ones_a_load_needs():
    assert RUNTIME_MODULES == [
        "mx_strategies.activation",
        "mx_strategies.checkpoint",
        "mx_strategies.completeness",
        "mx_strategies.content_check",
        "mx_strategies.coverage",
        "mx_strategies.distributed",
        "mx_strategies.draft",
        "mx_strategies.dry_run",
        "mx_strategies.engine",
        "mx_strategies.errors",
        "mx_strategies.jsonread",
        "mx_strategies.modelexpress_plugin",  # ModelExpress 0.8's entry: the plugin file a load imports
        "mx_strategies.module_reads",
        "mx_strategies.mtp_table",
        "mx_strategies.name_sampling",
        "mx_strategies.patches",
        "mx_strategies.planning",
        "mx_strategies.progress",
        "mx_strategies.rank_share",
        "mx_strategies.reads_cache",
        "mx_strategies.releases",
        "mx_strategies.report",
        "mx_strategies.robust",
        "mx_strategies.runai_plan",
        "mx_strategies.s3_ranged",
        "mx_strategies.settings",
        "mx_strategies.sources",
        "mx_strategies.storage",
        "mx_strategies.streaming",
        "mx_strategies.telemetry",
        "mx_strategies.tensor_bytes",
        "mx_strategies.thread_pools",
        "mx_strategies.twin",
        "mx_strategies.write_watch",
    ], "a runtime module was added or removed: is it something a production load needs?"


def test_runtime_imports_no_tooling():
    code = (
        "import importlib, json, sys\n"
        f"for name in {RUNTIME_MODULES!r}: importlib.import_module(name)\n"
        "import mx_strategies\n"
        "mx_strategies.activate('mx_strategies.robust')\n"
        f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {{'moto', 'rich', 'scripts', 'benchmarks'}} "
        "or m.startswith(('mx_strategies.cli', 'mx_strategies.testing')))))\n"
    )
    done = _python(code)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []


_HIDE_DEMO_EXTRA = """
import sys

class Hidden:
    # The [demo] extra is installed in the test environment; this hides moto, as in an image without it.
    def __init__(self, finder):
        self.finder = finder

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "moto":
            return None
        find = getattr(self.finder, "find_spec", None)
        return find(name, path, target) if find else None

sys.meta_path[:] = [Hidden(f) for f in sys.meta_path]
from mx_strategies.cli import main
sys.exit(main(["demo"]))
"""


def test_demo_without_its_extra_prints_one_line_saying_what_to_install():
    done = _python(_HIDE_DEMO_EXTRA)
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.strip().splitlines() == [
        "mx-strategies demo: mx-strategies demo needs the demo extra (moto missing): "
        "pip install 'mx-strategies[demo]'"
    ]

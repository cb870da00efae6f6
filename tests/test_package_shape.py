"""The package's shape: a runtime that needs no tooling, tooling that says what it needs.

Production images install the runtime only. These tests check, in fresh
interpreters, that loading the strategy imports nothing from the CLI, the
testing tools or the demo's server, and that the demo without its extra
says in one line what to install instead of failing with a traceback.
"""

from __future__ import annotations

import importlib.util
import json
import os
import pkgutil
import subprocess
import sys
from pathlib import Path

import mx_strategies

RUNTIME_MODULES = sorted(
    m.name
    for m in pkgutil.walk_packages(mx_strategies.__path__, "mx_strategies.")
    if not m.name.startswith(("mx_strategies.cli", "mx_strategies.testing"))
)
REPO = Path(__file__).resolve().parent.parent
STRUCTURE = REPO / "scripts" / "structure.py"


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
    """The runtime by stage of a load (scripts/structure.py draws it): a module added or removed is a question."""
    below = lambda stage: sorted(m.rsplit(".", 1)[1] for m in RUNTIME_MODULES if m.startswith(f"mx_strategies.{stage}."))  # noqa: E731
    top = sorted(m.split(".", 1)[1] for m in RUNTIME_MODULES if m.count(".") == 1)
    assert top == [
        "activation", "chain_guard", "engine", "errors", "inspect", "modelexpress_plugin", "observe", "patches", "plan", "refit",
        "releases", "robust", "select", "settings", "settings_errors", "stream", "thread_pools", "verify",
    ]  # fmt: skip
    assert below("inspect") == ["access_hints", "checkpoint", "headers", "index", "jsonread", "object_stores", "remedies",
                                "s3_ranged", "sources", "storage"]
    assert below("select") == [
        "built_module", "dry_run", "module_reads", "mtp_rows", "mtp_table", "name_sampling",
        "rank_share", "reads_cache", "selection", "twin",
    ]  # fmt: skip
    assert below("plan") == ["distributed", "planning", "rank_checks"]
    assert below("stream") == ["file_reader", "read_ahead", "runai_env", "runai_plan", "streaming"]
    assert below("verify") == ["after", "coverage", "kept", "ledger", "tensor_bytes"]  # was a weight lost?
    assert below("observe") == ["failures", "progress", "report", "selection_log", "telemetry"]
    assert below("engine") == ["config", "layerwise", "sglang", "view", "vllm", "vllm_rules"]
    assert below("patches") == ["_versions", "sglang_adapter_state", "sglang_parallel_getters"]
    assert below("modelexpress_plugin") == ["mx_plugin_robust_model_streamer"]  # ModelExpress 0.8's entry


def _structure():
    spec = importlib.util.spec_from_file_location("structure", STRUCTURE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _imports(path: Path) -> list[tuple[str, tuple[str, ...], bool]]:
    """(module, names, only for type checking) for every ``from ... import`` of a file, resolved to absolute."""
    import ast

    tree = ast.parse(path.read_text())
    package = "mx_strategies." + ".".join(path.relative_to(Path(mx_strategies.__file__).parent).parts[:-1])
    typing_only = {
        id(node)
        for block in ast.walk(tree)
        if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test)
        for node in ast.walk(block)
    }
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
            module = f"{base}.{node.module}" if node.level and node.module else (node.module or base)
            found.append((module, tuple(a.name for a in node.names), id(node) in typing_only))
    return found


def test_planning_asks_the_selection_nothing_and_the_stream_imports_no_planning():
    """The plan takes the selection's type and nothing else of select/ (no callback into the table, the
    conventions or the module); the stream is handed its plan (planning's type only for type checking)."""
    root = Path(mx_strategies.__file__).parent
    for path in sorted((root / "plan").glob("*.py")):
        for module, names, _ in _imports(path):
            if module.startswith("mx_strategies.select"):
                assert (module, names) == ("mx_strategies.select.selection", ("Selection",)), (path.name, module, names)
    for path in sorted((root / "stream").glob("*.py")):
        for module, names, typing_only in _imports(path):
            if module.startswith("mx_strategies.plan"):
                assert typing_only, (path.name, module, names)


def test_no_import_cycle_and_no_import_up_the_load_order():
    """Every import points down the stages (inspect, select, plan, stream, observe, the strategy, the tools),
    and none closes a cycle: what ``python scripts/structure.py`` prints as zero, for every module."""
    structure = _structure()
    figure = structure.figure(STRUCTURE.parent.parent)
    assert figure["cycles"] == []
    assert figure["upward"] == []
    assert {structure.stage_of(m.split(".", 1)[1]) for m in RUNTIME_MODULES} <= {
        "base", "engine", "inspect", "verify", "select", "plan", "stream", "observe", "strategy"
    }  # fmt: skip


def test_the_structure_script_sees_an_import_up_the_order_and_a_cycle(tmp_path):
    """The check above can fail: a stream module imported by an inspect one, and two modules importing each other."""
    package = tmp_path / "mx_strategies"
    for folder in ("inspect", "stream"):
        (package / folder).mkdir(parents=True)
        (package / folder / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "inspect" / "checkpoint.py").write_text("from ..stream.streaming import x\n")
    (package / "stream" / "streaming.py").write_text("from . import ledger\nx = 1\n")
    (package / "stream" / "ledger.py").write_text("from .streaming import x\n")
    figure = _structure().figure(tmp_path)
    assert figure["upward"] == [["inspect.checkpoint", "stream.streaming"]]
    assert figure["cycles"] == [["stream.ledger", "stream.streaming"]]


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
        "pip install '.[demo]' in a clone of mx-strategies (or its wheel with [demo])"
    ]


def test_the_runtime_is_within_issue_53s_limits():
    """scripts/count_runtime.py's figures, held: no module over 450 lines, robust.py at most 315, at most 255 public
    names and none defined in two modules, at most 25 settings and 6,650 lines of code (issue 53's limits, with what
    issue 54's refit added)."""
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "count_runtime.py"), "--check"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "over the limit" not in done.stdout


def test_the_runtime_count_sees_a_module_over_its_limit(tmp_path, monkeypatch):
    """The count is not blind: a module of 451 lines, a second `logger` and a 26th setting are each named."""
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import count_runtime
    finally:
        sys.path.remove(str(REPO / "scripts"))
    package = tmp_path / "mx_strategies"
    package.mkdir()
    fields = "".join(f"    s{i}: int = 0\n" for i in range(26))
    (package / "settings.py").write_text(f"logger = 1\nclass RobustSettings:\n{fields}")
    (package / "robust.py").write_text("logger = 2\n" + "x = 1\n" * 450)
    monkeypatch.setattr(count_runtime, "ROOT", package)
    figures = count_runtime.weigh()
    assert figures["over 450 lines"] == {"mx_strategies/robust.py": 451}
    assert figures["defined twice"] == {"logger": ["mx_strategies/robust.py", "mx_strategies/settings.py"]}
    assert figures["settings"] == 26
    assert figures["code lines"] == 1 + 1 + 26 + 451

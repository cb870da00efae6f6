"""The package's structure, from its own imports: stages, files, imports, cycles, and imports against the load order.

    python scripts/structure.py [ROOT] [--json]

A load reads top down: inspect the source, select what the module reads,
plan, stream, observe. The package is laid out by those stages, and an
import may only point down that order (a stage uses the stages under it,
never one above). This script reads every ``import`` of ``mx_strategies``
under ROOT (default: this checkout) with :mod:`ast`, nothing is imported
or run, and prints, per stage, its modules and lines; then the import
cycles and every import that points up the order. ``tests/test_package_shape.py``
holds the package to none of either.

``FLAT`` places the modules of the flat layout (up to commit 97bcbb4) in the
same stages, so the figure of that layout can be drawn again from a checkout
of it (``docs/architecture.md`` shows both).
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from pathlib import Path

PACKAGE = "mx_strategies"

# Stages from the bottom up; a module may import its own stage's modules and those of lower stages only.
STAGES = (
    ("base", "errors, settings, releases, thread pools: what every stage uses"),
    ("engine", "what the engine is and says (engine/), and the patches to it (patches/)"),
    ("inspect", "storage, ranged reads, the checkpoint's headers, the source chain (inspect/)"),
    ("verify", "was a weight lost? before streaming (coverage, what the model keeps), after (ledger, model-side) (verify/)"),
    ("select", "what the module reads: the question on a twin, kept answers, rank share, table, conventions (select/)"),
    ("plan", "the load plan, and the agreement between ranks (plan/)"),
    ("stream", "runai's plan, the verified stream (stream/)"),
    ("observe", "the load report, progress, telemetry (observe/)"),
    ("strategy", "the strategy, its activation and ModelExpress's plugin entry"),
    ("tools", "the CLI and the testing tools, outside the runtime (cli/, testing/)"),
)
RANK = {name: rank for rank, (name, _) in enumerate(STAGES)}

# A module's stage: by its sub-package, else by its name at the top of the package.
PACKAGES = {
    "engine": "engine", "patches": "engine", "inspect": "inspect", "verify": "verify", "select": "select", "plan": "plan",
    "stream": "stream", "observe": "observe", "cli": "tools", "testing": "tools", "modelexpress_plugin": "strategy",
}  # fmt: skip
TOP = {"": "strategy", "activation": "strategy", "robust": "strategy", "errors": "base", "settings": "base",
       "settings_errors": "base", "releases": "base", "thread_pools": "base"}  # fmt: skip
# The flat layout's modules (commit 97bcbb4 and before), in the stages they hold now.
FLAT = {
    "storage": "inspect", "s3_ranged": "inspect", "jsonread": "inspect", "checkpoint": "inspect", "sources": "inspect",
    "built_module": "select", "module_reads": "select", "twin": "select", "dry_run": "select",
    "name_sampling": "select", "reads_cache": "select", "kept": "select", "coverage": "select", "rank_share": "select",
    "mtp_table": "select", "draft": "select", "planning": "plan", "distributed": "plan", "runai_plan": "stream",
    "streaming": "stream", "content_check": "stream", "tensor_bytes": "stream", "completeness": "stream",
    "write_watch": "stream", "report": "observe", "progress": "observe", "telemetry": "observe",
}  # fmt: skip


def stage_of(module: str) -> str:
    """``module``'s stage (a dotted name below the package, "" for the package itself)."""
    head = module.split(".", 1)[0]
    if "." in module or head in PACKAGES:
        return PACKAGES.get(head, "strategy")
    return TOP.get(module) or FLAT.get(module) or "strategy"


def modules(root: Path) -> dict[str, Path]:
    """Every module of the package under ``root``: dotted name below the package -> file."""
    base = root / PACKAGE
    found = {}
    for path in sorted(base.rglob("*.py")):
        parts = list(path.relative_to(base).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def imports(root: Path) -> dict[str, set[str]]:
    """module -> the package's modules it imports (at the top or inside a function), by ast."""
    known = modules(root)
    edges: dict[str, set[str]] = {name: set() for name in known}
    for name, path in known.items():
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package[: len(package) - node.level + 1] if node.level > 1 else package
                    stem = ".".join(base + ([node.module] if node.module else []))
                elif node.module and (node.module == PACKAGE or node.module.startswith(PACKAGE + ".")):
                    stem = node.module[len(PACKAGE) + 1 :]
                else:
                    continue
                # ``from . import a, b`` imports modules a and b; ``from .a import f`` imports module a.
                named = [t for t in (f"{stem}.{a.name}".strip(".") for a in node.names) if t in known]
                targets = named or [stem]
            elif isinstance(node, ast.Import):
                targets = [a.name[len(PACKAGE) + 1 :] for a in node.names if a.name.startswith(PACKAGE + ".")]
            edges[name].update(t for t in targets if t in known and t not in (name, ""))
    return edges


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles: strongly connected groups of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return sorted(found)


def upward(edges: dict[str, set[str]]) -> list[tuple[str, str]]:
    """The imports that point up the load order: (importer, imported), the imported module's stage higher."""
    return sorted(
        (a, b) for a, targets in edges.items() for b in targets if RANK[stage_of(b)] > RANK[stage_of(a)]
    )


def figure(root: Path) -> dict:
    """The whole figure as data."""
    known = modules(root)
    edges = imports(root)
    stages = {name: {"modules": [], "lines": 0} for name, _ in STAGES}
    for name, path in known.items():
        stage = stages[stage_of(name)]
        stage["modules"].append(name or "(package)")
        stage["lines"] += len(path.read_text().splitlines())
    return {
        "modules": len(known),
        "folders": len({p.parent for p in known.values()}),
        "imports": sum(len(t) for t in edges.values()),
        "stages": stages,
        "cycles": cycles(edges),
        "upward": [list(pair) for pair in upward(edges)],
    }


def render(data: dict) -> str:
    lines = [f"{data['modules']} modules in {data['folders']} folders, {data['imports']} imports between them"]
    for (name, what), stage in zip(STAGES, data["stages"].values()):
        lines.append(f"  {name:9} {len(stage['modules']):3} modules {stage['lines']:6} lines  {what}")
    lines.append(f"import cycles: {len(data['cycles'])}")
    lines += [f"  {' <-> '.join(group)}" for group in data["cycles"]]
    lines.append(f"imports up the load order: {len(data['upward'])}")
    lines += [f"  {a} ({stage_of(a)}) imports {b} ({stage_of(b)})" for a, b in data["upward"]]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("root", nargs="?", default=str(Path(__file__).resolve().parent.parent))
    parser.add_argument("--json", action="store_true", help="print the figure as JSON")
    args = parser.parse_args(argv)
    data = figure(Path(args.root))
    print(json.dumps(data, indent=1) if args.json else render(data))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""Weigh the runtime users install: modules, lines, code lines, public names, settings.

The runtime is ``mx_strategies/`` without ``cli/`` and ``testing/`` (those ship apart from a load's code).
Code lines leave out blank lines, comments and docstrings (module, class and function docstrings).
A public name is a top-level ``def``, ``class`` or assignment whose name does not start with ``_``.

The limits are issue 53's; ``--check`` exits 1 when one is passed, naming it.

Usage: python scripts/count_runtime.py [--check] [--json]
"""

from __future__ import annotations

import ast
import collections
import io
import json
import pathlib
import sys
import tokenize

ROOT = pathlib.Path(__file__).resolve().parent.parent / "mx_strategies"
LEFT_OUT = ("cli", "testing")
LIMITS = {
    "lines of the largest module": 450,
    "lines of robust.py": 315,  # issue 53 cut it to 243; issue 54's refit lifecycle (prepare, its stream) added 72
    "public names": 255,  # issue 53: 250 (246 after it); issue 54's refit added 7 (refit.py, engine/layerwise.py, as_built)
    "names defined in two modules": 0,
    "settings": 25,
    "code lines": 6650,  # issue 53: 6,500 (6,437 after it); issue 54's refit added 191
}


def runtime_modules() -> list[pathlib.Path]:
    return sorted(p for p in ROOT.rglob("*.py") if p.relative_to(ROOT).parts[0] not in LEFT_OUT)


def _docstring_lines(tree: ast.Module) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) \
                    and isinstance(body[0].value.value, str):
                lines.update(range(body[0].lineno, body[0].end_lineno + 1))
    return lines


def code_lines(source: str) -> int:
    """Lines holding a token that is not a comment, outside docstrings."""
    docstrings = _docstring_lines(ast.parse(source))
    lines: set[int] = set()
    skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
            tokenize.ENCODING, tokenize.ENDMARKER}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type in skip:
            continue
        lines.update(n for n in range(token.start[0], token.end[0] + 1) if n not in docstrings)
    return len(lines)


def public_names(tree: ast.Module) -> list[str]:
    names: list[str] = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.append(node.name)
        elif isinstance(node, ast.Assign):
            names.extend(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.append(node.target.id)
    return [n for n in names if not n.startswith("_") and n != "__all__"]


def settings_count() -> int:
    tree = ast.parse((ROOT / "settings.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "RobustSettings":
            return sum(isinstance(s, ast.AnnAssign) for s in node.body)
    raise SystemExit("settings.py holds no RobustSettings")


def weigh() -> dict:
    modules = {}
    defined: dict[str, list[str]] = collections.defaultdict(list)
    for path in runtime_modules():
        source = path.read_text()
        tree = ast.parse(source)
        rel = str(path.relative_to(ROOT.parent))
        names = public_names(tree)
        for name in set(names):
            defined[name].append(rel)
        modules[rel] = {"lines": len(source.splitlines()), "code lines": code_lines(source), "public names": len(names)}
    twice = {name: where for name, where in sorted(defined.items()) if len(where) > 1}
    largest = max(modules, key=lambda m: modules[m]["lines"])
    return {
        "modules": len(modules),
        "lines": sum(m["lines"] for m in modules.values()),
        "code lines": sum(m["code lines"] for m in modules.values()),
        "public names": sum(m["public names"] for m in modules.values()),
        "names defined in two modules": len(twice),
        "settings": settings_count(),
        "lines of the largest module": modules[largest]["lines"],
        "largest module": largest,
        "lines of robust.py": modules["mx_strategies/robust.py"]["lines"],
        "over 450 lines": {m: v["lines"] for m, v in modules.items() if v["lines"] > 450},
        "defined twice": twice,
        "per module": modules,
    }


def main(argv: list[str]) -> int:
    figures = weigh()
    if "--json" in argv:
        print(json.dumps(figures, indent=2))
    else:
        print(f"runtime: {figures['modules']} modules, {figures['lines']} lines, {figures['code lines']} of code, "
              f"{figures['public names']} public names, {figures['settings']} settings")
        print(f"largest module: {figures['largest module']} ({figures['lines of the largest module']} lines); "
              f"robust.py {figures['lines of robust.py']} lines")
        for module, lines in figures["over 450 lines"].items():
            print(f"  over 450 lines: {module} ({lines})")
        for name, where in figures["defined twice"].items():
            print(f"  defined in two modules: {name}: {', '.join(where)}")
    over = [f"{key}: {figures[key]} (at most {limit})" for key, limit in LIMITS.items() if figures[key] > limit]
    for line in over:
        print(f"over the limit: {line}")
    return 1 if over and "--check" in argv else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

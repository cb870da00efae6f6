"""Count the suite's tests and assertions, as the CI budget's "no check lost" rule counts them.

Tests: ``def test_*`` functions under tests/ (parametrized cases are counted by pytest's own summary).
Assertions: ``assert`` statements, ``pytest.raises`` / ``pytest.fail`` calls, under tests/.

Usage: python scripts/count_checks.py [TESTS_DIR]
"""

from __future__ import annotations

import ast
import pathlib
import sys


def count(root: pathlib.Path) -> dict[str, int]:
    files = tests = asserts = raises = 0
    for path in sorted(root.rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        files += 1
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test_"):
                tests += 1
            elif isinstance(node, ast.Assert):
                asserts += 1
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                  and node.func.attr in ("raises", "fail") and getattr(node.func.value, "id", "") == "pytest"):
                raises += 1
    return {"files": files, "test functions": tests, "assert statements": asserts, "pytest.raises/fail": raises}


if __name__ == "__main__":
    for key, value in count(pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "tests")).items():
        print(f"{key}: {value}")

"""vLLM finds the plugin through ``importlib.metadata`` entry points.

vLLM's ``load_general_plugins`` loads every entry point of the
``vllm.general_plugins`` group (filtered by ``VLLM_PLUGINS`` when that is
set). These tests check the installed metadata the same way, both for the
install the suite runs against (scripts/test.sh installs the wheel that
scripts/build-dist.sh built, not the tree and not editable:
tests/test_installed_wheel.py checks that) and for a wheel built from this
checkout and installed into a directory of its own.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from importlib.metadata import entry_points
from pathlib import Path

from helpers.wheel import PIP

from mx_strategies import activation

GROUP = "vllm.general_plugins"
VALUE = "mx_strategies.activation:register"


def test_installed_distribution_exposes_the_plugin():
    (plugin,) = [ep for ep in entry_points(group=GROUP) if ep.name == "mx_strategies"]
    assert plugin.value == VALUE
    assert plugin.dist is not None and plugin.dist.name.replace("_", "-") == "mx-strategies"
    assert plugin.load() is activation.register


def test_installed_distribution_exposes_the_sglang_plugin():
    """SGLang's load_plugins() reads this group in every scheduler process (tests/sglang_suite runs it)."""
    (plugin,) = [ep for ep in entry_points(group="sglang.srt.plugins") if ep.name == "mx_strategies"]
    assert plugin.value == "mx_strategies.activation:register_sglang"
    assert plugin.load() is activation.register_sglang


def test_wheel_built_from_this_checkout_registers_the_plugin(tmp_path, built_wheel):
    assert importlib.util.find_spec("setuptools") is not None, (
        "building the wheel without isolation needs setuptools (and wheel) from the `test` extra"
    )
    wheel, target = built_wheel, tmp_path / "site"
    subprocess.run(
        PIP + ["install", "--no-deps", "--no-compile", "--target", str(target), str(wheel)],
        check=True,
        cwd=tmp_path,
        timeout=120,
    )

    # A fresh interpreter with the wheel's directory first on the path, as a
    # user's environment would have it. Dependencies (modelexpress, pydantic)
    # still come from this environment's site-packages, which may also hold
    # an editable install of this checkout: hence the checks that both the
    # entry point and the code come from the wheel's directory.
    probe = textwrap.dedent(
        f"""
        import json
        from importlib.metadata import entry_points
        from pathlib import Path

        target = Path({str(target)!r}).resolve()
        (plugin,) = [
            ep for ep in entry_points(group={GROUP!r})
            if ep.name == "mx_strategies" and Path(str(ep.dist.locate_file(""))).resolve() == target
        ]
        register = plugin.load()
        import mx_strategies.activation as module
        print(json.dumps({{
            "value": plugin.value,
            "dist": plugin.dist.name,
            "is_register": register is module.register,
            "qualname": f"{{register.__module__}}.{{register.__qualname__}}",
            "module_file": module.__file__,
        }}))
        """
    )
    environment = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    environment["PYTHONPATH"] = str(target)
    completed = subprocess.run(
        [sys.executable, "-c", probe],
        check=True,
        capture_output=True,
        text=True,
        cwd=tmp_path,  # not the checkout, whose mx_strategies/ would shadow the wheel's
        env=environment,
        timeout=60,
    )
    found = json.loads(completed.stdout.strip().splitlines()[-1])
    assert found["value"] == VALUE
    assert found["dist"].replace("_", "-") == "mx-strategies"
    assert found["is_register"] is True
    assert found["qualname"] == "mx_strategies.activation.register"
    assert Path(found["module_file"]).resolve().is_relative_to(target.resolve())

"""Every problem kind robust reports carries its remedy, and docs/doctor-json.md lists the same line per kind.

The kinds are read from what doctor finds on real damaged checkpoints (tests/test_cli_doctor.py and
tests/test_hostile.py damage them every way the docs list) and from the docs' table; the remedies from
:mod:`mx_strategies.inspect.remedies`, the one place that says them.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from mx_strategies.errors import InconsistentCheckpoint, NoStreamableSource
from mx_strategies.inspect.checkpoint import Problem
from mx_strategies.inspect.remedies import _REMEDIES, remedy, remedy_for

DOC = Path(__file__).resolve().parent.parent / "docs" / "doctor-json.md"
ROW = re.compile(r"^\| `([a-z_]+)` \| (warning|error) \| .* \| (.*) \|$")


def _doc_rows() -> dict[str, str]:
    rows = {}
    for line in DOC.read_text(encoding="utf-8").splitlines():
        match = ROW.match(line)
        if match:
            rows[match.group(1)] = match.group(3)
    return rows


def test_the_docs_list_every_kind_with_its_remedy():
    rows = _doc_rows()
    assert len(rows) >= 20  # the table was found
    assert rows == _REMEDIES


def test_a_problem_carries_its_kinds_remedy():
    problem = Problem("truncated_shard", "error", "model-00002-of-00004.safetensors", None, "s3://m/x: cut short")
    assert problem.as_dict()["remedy"] == _REMEDIES["truncated_shard"]
    with pytest.raises(KeyError):
        remedy("no_such_kind")  # a new kind without a line fails here, not silently in a user's report


def test_a_refusal_names_each_distinct_remedy_once():
    assert remedy_for(["missing_shard", "missing_shard", "corrupt_index"]) == (
        f"{_REMEDIES['missing_shard']}; {_REMEDIES['corrupt_index']}"
    )
    assert remedy_for(["bad_shape", "offset_gap"]) == "re-export the shard"  # the same line, said once
    assert remedy_for([]) is None
    assert InconsistentCheckpoint("x", remedy=remedy_for(["missing_tensor"])).remedy == _REMEDIES["missing_tensor"]
    assert NoStreamableSource("x", [], _REMEDIES["no_streamable_source"]).remedy.startswith("set MX_MODEL_URI")

"""Two (or more) rank processes of one distributed load, each a script of its own, for the rank-share tests.

Each rank gets ``ARGS.json`` (its arguments, with ``out``: where it writes its
result as JSON) and its own environment; the processes run at once, so their
collectives meet. One deadline for all: a rank still running then is a hang,
and every rank is killed. A rank's result must not hold ``error`` (its
traceback); the log tail goes into the failure message.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest


def run_ranks(script: str, folder: Path, args: list[dict], envs: list[dict], timeout: float) -> list[dict]:
    """Run ``script`` once per rank (``args[r]``, ``envs[r]``) in ``folder``; every rank's result, in rank order."""
    processes = []
    for rank, (arguments, env) in enumerate(zip(args, envs)):
        arguments = dict(arguments, out=str(folder / f"rank{rank}.json"))
        (folder / f"args{rank}.json").write_text(json.dumps(arguments))
        log = open(folder / f"rank{rank}.log", "w")
        process = subprocess.Popen([sys.executable, script, str(folder / f"args{rank}.json")], env=env,
                                   stdout=log, stderr=subprocess.STDOUT, cwd=str(folder))  # fmt: skip
        processes.append((process, log))
    deadline = time.monotonic() + timeout
    for process, log in processes:
        try:
            process.wait(timeout=max(deadline - time.monotonic(), 1))
        except subprocess.TimeoutExpired:
            for other, _ in processes:
                other.kill()
            pytest.fail(f"a rank did not finish in {timeout:.0f}s (a hang); logs in {folder}")
        finally:
            log.close()
    results = []
    for rank in range(len(processes)):
        out = folder / f"rank{rank}.json"
        tail = (folder / f"rank{rank}.log").read_text()[-3000:]
        assert out.exists(), f"rank {rank}: no result; log tail:\n{tail}"
        result = json.loads(out.read_text())
        assert "error" not in result, f"rank {rank}: {result['error']}\nlog tail:\n{tail}"
        results.append(result)
    return results

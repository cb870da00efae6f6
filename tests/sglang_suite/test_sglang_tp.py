"""robust at tensor parallel 2 in SGLang: two ranks over gloo, distributed streaming, each byte read once.

Two processes (tests/sglang_suite/tp_worker.py) join one gloo group through SGLang's
own ``init_distributed_environment``; each builds SGLang's DeepSeek-V3 target
and NextN draft at TP=2 and loads them through ModelExpress's real chain with
``MX_MS_DISTRIBUTED=1``. Rank 0 plans, the plan reaches rank 1 through the
SglangAdapter collectives mx-strategies adds (``patches/sglang_adapter_state``),
and runai splits the reads. The S3 server (moto, 127.0.0.1) counts the bytes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from sglang_support import builders as sb
from sglang_support.loads import HTTP_OVERHEAD, Checkpoint

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(HERE)


@pytest.mark.timeout(600)
def test_tp2_loads_target_and_draft_reading_each_byte_once(s3, tmp_path):
    ckpt = Checkpoint(tmp_path, "deepseek_v3", s3)
    init_method = f"tcp://127.0.0.1:{sb.free_port()}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("MX_")}
    env.update(
        MX_STRATEGY="mx_strategies.robust",
        MX_MODEL_URI=ckpt.uri,
        MX_MS_DISTRIBUTED="1",
        PYTHONPATH=os.pathsep.join([TESTS, os.path.join(TESTS, "stubs", "sglang"), env.get("PYTHONPATH", "")]),
    )
    s3.proxy.reset()
    outs = [str(tmp_path / f"rank{r}.json") for r in (0, 1)]
    ranks = [
        subprocess.Popen(
            [sys.executable, os.path.join(HERE, "tp_worker.py"), str(r), init_method, "deepseek_v3", ckpt.full,
             ckpt.config_only, outs[r]],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        for r in (0, 1)
    ]
    logs = [p.communicate(timeout=540)[0] for p in ranks]
    for r, p in enumerate(ranks):
        assert p.returncode == 0, f"rank {r}:\n{logs[r][-4000:]}"
    found = [json.load(open(o)) for o in outs]
    served = s3.bytes_served
    for rank in found:
        assert rank["target_same"] is True and rank["draft_same"] is True, rank
        loaded = {r["role"]: r for r in rank["reports"] if r["outcome"] == "loaded"}
        assert set(loaded) == {"target", "draft"}
        assert all(r["distributed"] for r in loaded.values())
        assert loaded["draft"]["architecture"] is None  # no table row: the module answers
    # Each rank read its share from storage; together, each planned byte once.
    for role in ("target", "draft"):
        reports = [next(r for r in rank["reports"] if r.get("role") == role and r["outcome"] == "loaded") for rank in found]
        planned = reports[0]["bytes_streamed"]
        assert sum(r["bytes_from_storage"] for r in reports) == planned
        assert all(r["bytes_from_storage"] < planned for r in reports)
    metadata = found[0]["reports"][0]["metadata_bytes"]
    assert served <= 1.02 * ckpt.data_bytes + 4 * (metadata + HTTP_OVERHEAD), (served, ckpt.data_bytes)

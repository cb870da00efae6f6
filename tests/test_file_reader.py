"""Who reads a local checkpoint's files (issue 48): the page cache where it holds them, runai where it does not.

Real safetensors files and ModelExpress's real chain. Warm and cold are made for real: a file just written is
in the page cache; ``posix_fadvise(DONTNEED)`` after an ``fsync`` drops it, as the benchmark does before a cold
run. A file system that keeps every page in memory (tmpfs) cannot drop them, so the checkpoints go to a folder
on a file system that can (:func:`disk_folder`).
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import time

import pytest
import torch
from helpers.checkpoints import reference_of, write_shard
from helpers.engine import chain_load, direct_load, model_config, robust_messages

from mx_strategies import recent_reports
from mx_strategies.stream.file_reader import _PAGE_CACHE, RUNAI, PageCacheReader, choose_reader, _resident_pages
from mx_strategies.verify.tensor_bytes import same_bytes
from mx_strategies.testing.page_cache import cold, warm

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Every dtype runai hands out, an empty tensor and a scalar: what the page-cache reader must build as runai does.
TENSORS = {
    "f32": torch.randn(64, 33),
    "bf16": torch.randn(17, 8).to(torch.bfloat16),
    "f16": torch.randn(5, 3).to(torch.float16),
    "f64": torch.randn(4),
    "i64": torch.arange(-5, 6, dtype=torch.int64),
    "i32": torch.arange(7, dtype=torch.int32),
    "i16": torch.arange(9, dtype=torch.int16),
    "i8": torch.arange(-4, 4, dtype=torch.int8),
    "u8": torch.arange(200, 211, dtype=torch.uint8),
    "bool": torch.tensor([True, False, True]),
    "empty": torch.zeros(0, 4),
    "scalar": torch.tensor(3.5),
}


def _memory_backed(path: str) -> bool:
    """Whether ``path`` lies on a file system whose pages cannot leave memory (tmpfs, ramfs)."""
    best, kind = "", ""
    with open("/proc/mounts") as mounts:
        for line in mounts:
            fields = line.split()
            if len(fields) > 2 and path.startswith(fields[1].rstrip("/") + "/") and len(fields[1]) >= len(best):
                best, kind = fields[1], fields[2]
    return kind in ("tmpfs", "ramfs")


@pytest.fixture
def disk_folder(tmp_path):
    """A folder whose files the kernel can drop from its page cache: pytest's, or one beside the repository."""
    if not _memory_backed(str(tmp_path.resolve())):
        yield str(tmp_path)
        return
    folder = tempfile.mkdtemp(prefix=".file-reader-", dir=REPO)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def checkpoint(folder: str) -> list[str]:
    """Two shards: the dtypes in one, a larger tensor (several pages) in the other."""
    os.makedirs(folder, exist_ok=True)
    first = write_shard(os.path.join(folder, "model-00001-of-00002.safetensors"), TENSORS)
    second = write_shard(os.path.join(folder, "model-00002-of-00002.safetensors"), {"big": torch.randn(512, 1024)})
    return [first, second]


def test_the_kernel_says_which_files_it_holds(disk_folder):
    paths = checkpoint(os.path.join(disk_folder, "ckpt"))
    warm(paths)
    for path in paths:
        cached, asked = _resident_pages(path)
        assert asked > 0 and cached == asked, path
    assert choose_reader(paths, "auto").reader == _PAGE_CACHE
    assert choose_reader(paths, "auto").why == "the files are in the page cache (100% of the pages sampled)"

    cold(paths)
    assert _resident_pages(paths[1])[0] == 0
    choice = choose_reader(paths, "auto")
    assert choice.reader == RUNAI
    assert choice.why.startswith("the files are not in the page cache (") and choice.why.endswith("direct reads")
    # The setting decides where it names a reader; an object store is runai's whatever the setting.
    assert choose_reader(paths, "page_cache").reader == _PAGE_CACHE
    warm(paths)
    assert choose_reader(paths, "runai").reader == RUNAI  # warm files too, when the setting says runai
    assert choose_reader(paths, "runai").why == "MX_ROBUST_FILE_READER=runai"
    s3 = choose_reader(["s3://bucket/model/model-00001-of-00002.safetensors"], "page_cache")
    assert (s3.reader, s3.why) == (RUNAI, "an object store (s3://)")


@pytest.mark.parametrize("state", ["warm", "cold"])
def test_auto_reads_warm_files_from_the_page_cache_and_cold_ones_with_runai(monkeypatch, caplog, disk_folder, state):
    """Through ModelExpress's chain: every tensor equal to what safetensors reads, the reader named in the log
    and the report."""
    folder = os.path.join(disk_folder, "ckpt")
    paths = checkpoint(folder)
    reference = reference_of(paths)
    (warm if state == "warm" else cold)(paths)
    monkeypatch.setenv("MX_ROBUST_FILE_READER", "auto")
    caplog.set_level(logging.INFO)

    model, _ = chain_load(monkeypatch, folder, reference)

    assert sorted(model.order) == sorted(reference)
    for name, tensor in reference.items():
        assert same_bytes(model.weights[name], tensor), name
        assert model.weights[name].dtype == tensor.dtype and model.weights[name].shape == tensor.shape, name
    reader = _PAGE_CACHE if state == "warm" else RUNAI
    (report,) = [r for r in recent_reports() if r["outcome"] == "loaded"][-1:]
    assert report["reader"] == reader
    assert f"target files read by {reader}: " in robust_messages(caplog)
    assert f", read by {reader} in " in robust_messages(caplog)
    if reader == _PAGE_CACHE:
        assert report["read_ahead_bytes"] == 0  # nothing to gain from reading ahead what memory holds
        assert report["files_mapped"] == (2 if leases_here(disk_folder) else 0)  # both shards, under a lease
    else:
        assert report["files_mapped"] == 0


def leases_here(folder: str) -> bool:
    """Whether this file system grants this process a read lease (ext4, xfs, tmpfs do; NFS does not)."""
    import fcntl

    probe = os.path.join(folder, ".lease-probe")
    with open(probe, "wb"):
        pass
    fd = os.open(probe, os.O_RDONLY)
    try:
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_RDLCK)
        fcntl.fcntl(fd, fcntl.F_SETLEASE, fcntl.F_UNLCK)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)
        os.unlink(probe)


def _plan(folder: str):
    from mx_strategies.inspect.sources import Candidate, resolve
    from mx_strategies.plan.planning import plan_of
    from mx_strategies.settings import load_settings

    settings = load_settings()
    return plan_of(resolve([Candidate("explicit", folder)], settings).checkpoint, None, settings)


def _read_all(plan) -> tuple[dict[str, torch.Tensor], int]:
    with PageCacheReader() as reader:
        reader.stream_plan(plan)
        got = {name: tensor.clone() for name, tensor in reader.get_tensors()}
    return got, reader.mapped_files


@pytest.mark.parametrize("thread", ["main", "other"])
def test_the_page_cache_reader_maps_under_a_lease_in_the_main_thread_and_reads_elsewhere(disk_folder, thread):
    """A mapping under a read lease where the main thread can take the lease's signal; preadv anywhere else.
    The tensors are what safetensors reads either way, in plan order."""
    import threading

    folder = os.path.join(disk_folder, "ckpt")
    paths = checkpoint(folder)
    plan = _plan(folder)
    if thread == "main":
        got, mapped = _read_all(plan)
    else:
        out = {}
        worker = threading.Thread(target=lambda: out.update(result=_read_all(plan)))
        worker.start()
        worker.join()
        got, mapped = out["result"]
    assert mapped == (2 if thread == "main" and leases_here(disk_folder) else 0)
    assert list(got) == plan.expected
    for name, tensor in reference_of(paths).items():
        assert same_bytes(got[name], tensor) and got[name].dtype == tensor.dtype and got[name].shape == tensor.shape


def test_a_file_cut_short_before_it_is_read_is_a_clean_error(disk_folder):
    """Cut after inspection (the load's identity re-check would stop it first; the reader alone here): the
    error names the file and the tensor, nothing is read past the end, no SIGBUS."""
    folder = os.path.join(disk_folder, "ckpt")
    paths = checkpoint(folder)
    plan = _plan(folder)
    os.truncate(paths[1], os.path.getsize(paths[1]) - 1000)
    with PageCacheReader() as reader:
        reader.stream_plan(plan)
        with pytest.raises(OSError) as raised:
            for _ in reader.get_tensors():
                pass
    assert str(raised.value).startswith(f"{paths[1]}: ends before tensor big does (")


def test_a_writer_waits_for_the_load_and_the_load_stops_at_the_next_tensor(disk_folder):
    """Another process truncating a file while it is read under the mapping: the kernel makes it wait (the read
    lease) and tells this process, whose next tensor is an error naming the file; the writer goes on once the
    reader let go. The process is alive to say so: no SIGBUS."""
    import subprocess
    import sys

    if not leases_here(disk_folder):
        pytest.skip("this file system grants no read lease: the reader reads with preadv (the test above)")
    folder = os.path.join(disk_folder, "ckpt")
    paths = checkpoint(folder)
    plan = _plan(folder)
    with PageCacheReader() as reader:
        reader.stream_plan(plan)
        tensors = reader.get_tensors()
        next(tensors)  # the first file is mapped, under its lease
        writer = subprocess.Popen([sys.executable, "-c", f"import os; os.truncate({paths[0]!r}, 100)"])
        deadline = time.monotonic() + 30
        while not reader._broken and time.monotonic() < deadline:
            time.sleep(0.05)  # the lease's signal is handled here
        assert writer.poll() is None  # still waiting for the lease
        assert os.path.getsize(paths[0]) > 100
        with pytest.raises(OSError) as raised:
            next(tensors)
    assert writer.wait(timeout=30) == 0
    assert os.path.getsize(paths[0]) == 100
    assert str(raised.value) == (
        f"{paths[0]}: another process opened a file of the load for writing or truncated it while it was read "
        "(its read lease was broken); not loading a file that changes"
    )


def test_a_distributed_load_is_not_the_page_cache_readers(disk_folder):
    folder = os.path.join(disk_folder, "ckpt")
    checkpoint(folder)
    with PageCacheReader() as reader, pytest.raises(ValueError, match="for one rank"):
        reader.stream_plan(None, is_distributed=True)


def test_a_model_lacking_a_tensor_fails_the_same_under_the_page_cache_reader(monkeypatch, disk_folder):
    """A model that lacks a tensor fails the load the same way under the page-cache reader (mutated: it was
    touched), and the chain's verdict does not depend on the reader."""
    folder = os.path.join(disk_folder, "ckpt")
    paths = checkpoint(folder)
    reference = reference_of(paths)
    monkeypatch.setenv("MX_MODEL_URI", folder)
    monkeypatch.setenv("MX_ROBUST_FILE_READER", "page_cache")
    names = [n for n in reference if n != "big"]
    attempt = direct_load(model_config(), reference, names=names)
    assert attempt.error is not None and attempt.error.mutated is True
    assert "big" in str(attempt.error)

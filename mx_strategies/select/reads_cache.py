"""Where the module's answers are kept between restarts (``MX_ROBUST_READS_CACHE_DIR``).

A dry run of a large target costs the Python time of the engine's own
loading loop (seconds for DeepSeek-V3's ~94k names). A pod that restarts
asks the same module the same question; the answer is kept in one JSON file
per key. The key is a SHA-256 over everything the answer depends on:

- the engine and its release, mx-strategies' release and the code that asks (a digest of
  :data:`_QUESTION_CODE`: the dry run, the sampler, the twin, the coverage, the question);
- the module's class and every parameter and buffer it holds (name, shape,
  dtype): the config, the parallel layout and the quantization all show there;
- the parallel layout and rank the load runs at, and the role;
- the checkpoint's tensor names, shapes and dtypes (a new index or new
  headers are a new key).

Nothing is ever invalidated in place: a change of any of these is a new
key. A file that cannot be read or does not match is ignored (and
rewritten); a cache that cannot be written is skipped with no error.
The whole answer is kept but its names read, which are the checkpoint's less those left out.

One thing ends a kept answer under its own key: a load that used it and failed
the model-side check (:mod:`..verify.after`: the model keeps parameters it
left unwritten) proves it wrong (a stale or hand-edited file on a shared volume),
and :func:`drop` removes its file (:func:`.module_reads.drop_disproved`), so the
next load asks the module again instead of failing the same way.

Writes and removals are atomic (a temporary file then ``os.replace``; ``unlink``):
pods storing the same key at once leave one whole file, and a reader sees a
whole file or none.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional

_FORMAT = 1
# The modules of this stage whose code decides an answer (their files are digested into the key).
_QUESTION_CODE = ("built_module", "../verify/coverage", "dry_run", "../verify/kept", "module_reads", "name_sampling", "twin")


def _code_digest() -> str:
    """The code that computes an answer: a changed dry run, sampler, twin or question is a new key.

    Read as files beside this one (this stage's), not imported: the question imports this module."""
    digest = hashlib.sha256()
    for name in _QUESTION_CODE:
        path = Path(__file__).parent / f"{name}.py"
        try:
            digest.update(path.read_bytes())
        except OSError:
            digest.update(name.encode())
    return digest.hexdigest()[:16]


def cache_key(model: Any, tensors: Mapping[str, Any], context: Iterable[Any]) -> str:
    """The key of ``model``'s answer for a checkpoint with ``tensors`` (name -> TensorInfo) in ``context``."""
    from importlib.metadata import PackageNotFoundError, version

    digest = hashlib.sha256()

    def add(*parts: Any) -> None:
        digest.update(repr(parts).encode())
        digest.update(b"\0")

    try:
        ours = version("mx-strategies")
    except PackageNotFoundError:
        ours = "source"
    add(_FORMAT, ours, _code_digest(), f"{type(model).__module__}.{type(model).__qualname__}", *context)
    for name, tensor in model.named_parameters(remove_duplicate=False):
        add("p", name, tuple(tensor.shape), str(tensor.dtype))
    for name, tensor in model.named_buffers(remove_duplicate=False):
        add("b", name, tuple(tensor.shape), str(tensor.dtype))
    for name, info in tensors.items():
        add("t", name, info.dtype, tuple(info.shape))
    return digest.hexdigest()


def _path_of(folder: Path, key: str) -> Path:
    """The file that keeps the answer for ``key`` in ``folder``."""
    return Path(folder).expanduser() / f"{key}.json"


def load(folder: Optional[Path], key: str) -> Optional[dict]:
    """The kept answer for ``key`` (the fields of :class:`.module_reads.ModuleReads` that :func:`store` keeps),
    or None (no cache, no file, or one that does not fit)."""
    if folder is None:
        return None
    try:
        data = json.loads(_path_of(folder, key).read_text())
        if data.get("format") != _FORMAT or data.get("key") != key:
            return None
        return {
            "source": str(data["source"]),
            "module_class": str(data.get("module_class", "")),
            "left_out": {str(k): str(v) for k, v in data["left_out"].items()},
            "judged": int(data.get("judged", 0)),
        }
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def store(folder: Optional[Path], key: str, answer: Any) -> Optional[Path]:
    """Keep ``answer`` (a :class:`.module_reads.ModuleReads` without gaps) under ``key``, atomically: the whole
    answer but the names read (the checkpoint's less those left out) and the question's own time. None when the
    cache is off or cannot be written."""
    if folder is None:
        return None
    path = _path_of(folder, key)
    data = {
        "format": _FORMAT,
        "key": key,
        "source": answer.source,
        "module_class": answer.module_class,
        "left_out": dict(sorted(answer.left_out.items())),
        "judged": answer.judged,
    }
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=".reads-", suffix=".json")
        with os.fdopen(handle, "w") as out:
            json.dump(data, out)
        os.replace(temporary, path)
    except OSError:
        return None
    return path


def drop(folder: Optional[Path], key: str) -> tuple[Optional[Path], Optional[str]]:
    """Forget the kept answer for ``key``: a load proved it wrong. Its file is unlinked (atomic: a pod reading or
    storing the key at that moment sees, or leaves, a whole file or none).

    Returns (the file, None) once no file is there (removed now, or gone already); (the file, why) where it could
    not be removed (a folder this process cannot write); (None, None) when the cache is off. Never raises. A pod
    that stored a fresh answer under the key just before loses it too: its next load asks the module again.
    """
    if folder is None:
        return None, None
    try:
        path = _path_of(folder, key)
    except RuntimeError as exc:  # a ~ with no home to expand it to
        return Path(folder) / f"{key}.json", str(exc)
    try:
        path.unlink()
    except FileNotFoundError:
        pass
    except OSError as exc:
        return path, f"{type(exc).__name__}: {exc.strerror or exc}"
    return path, None

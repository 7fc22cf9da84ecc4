"""``decode``: the logical NumPy value of an encoded initializer, after full validation.

Validation (layout, payload extent, backing file) always precedes decoding, so no decoder ever sees a
payload whose bounds were not checked.
"""

from __future__ import annotations

import math
import os

import numpy as np

from reference_impl import affine, dtypes
from reference_impl.decoders import DecoderRegistry, default_registry
from reference_impl.errors import ErrorCode as E
from reference_impl.errors import violation
from reference_impl.payload import open_payload
from reference_impl.records import check_budget, compile_layout
from reference_impl.structs import Catalogue, struct_kind
from reference_impl.tensors import array_shape, to_array
from reference_impl.verifier import logical_tensor_shape, verify_encoded_value, verify_model

_DEFAULT_REGISTRY: DecoderRegistry | None = None


def _registry(registry: DecoderRegistry | None) -> DecoderRegistry:
    global _DEFAULT_REGISTRY
    if registry is not None:
        return registry
    if _DEFAULT_REGISTRY is None:
        _DEFAULT_REGISTRY = default_registry()
    return _DEFAULT_REGISTRY


def decode(model, name: str, base_dir: str | os.PathLike | None = None,
           registry: DecoderRegistry | None = None, out: np.ndarray | None = None) -> np.ndarray:
    """Verify ``model`` and decode the root-graph encoded initializer called ``name`` (into ``out``, when
    given: see ``decode_value``)."""
    verified = verify_model(model, base_dir=base_dir)
    for index, value in enumerate(verified.model.graph.encoded_initializer):
        if value.name == name:
            extra = {} if out is None else {"out": out}
            return decode_value(value, verified.catalogue, base_dir, registry,
                                path=f"model.graph.encoded_initializer[{index}]", **extra)
    raise violation(E.VALUE_NOT_FOUND, "model.graph.encoded_initializer", f"no encoded value named {name!r}")


def payload_array(value, catalogue: Catalogue, base_dir=None, path: str = "value") -> np.ndarray:
    """The validated payload bytes (memory-mapped for external data; the array keeps the mapping)."""
    info = verify_encoded_value(value, path, catalogue, base_dir)
    return open_payload(value, info.extent, base_dir, path)


def decode_value(value, catalogue: Catalogue, base_dir=None, registry: DecoderRegistry | None = None,
                 path: str = "value", out: np.ndarray | None = None) -> np.ndarray:
    """Decode one EncodedValueProto against a catalogue; the result has the exact logical type/shape.

    With ``out`` (a caller's buffer, e.g. reused across calls) the values are written there and ``out``
    is returned. It must be a C-contiguous, writable array of exactly the result's dtype and shape that
    shares no memory with the payload; anything else is a ContractError, raised before the buffer is
    touched (``affine.check_out``). Affine values are decoded straight into it; a registered decoder's
    result is copied in."""
    info = verify_encoded_value(value, path, catalogue, base_dir)
    payload = open_payload(value, info.extent, base_dir, path)
    if value.WhichOneof("layout") == "affine":
        return _decode_affine(value, payload, info.logical_count, path, out)
    st = value.struct_type
    if struct_kind(st) != "type_ref":
        raise violation(E.CONSUMER_MISSING, f"{path}.struct_type",
                        "an inline layout has no registered decoder; use generic field access (read_fields)")
    layout = compile_layout(st, catalogue, f"{path}.struct_type")
    declaration, _ = catalogue.lookup(st.type_ref, f"{path}.struct_type.type_ref")
    decoder = _registry(registry).bind(st.type_ref, layout, f"{path}.struct_type", declaration)
    result = _check_logical(value, decoder.decode(layout, payload), path)
    if out is None:
        return result
    affine.check_out(out, result.shape, result.dtype, (payload,))
    np.copyto(out, result)
    return out


def read_fields(value, catalogue: Catalogue, base_dir=None, path: str = "value") -> dict[str, np.ndarray]:
    """Generic field access: every leaf of every record (shape (records, ...)) plus the constants."""
    payload = payload_array(value, catalogue, base_dir, path)
    layout = compile_layout(value.struct_type, catalogue, f"{path}.struct_type")
    fields = {leaf_path: layout.read(payload, leaf_path) for leaf_path in layout.leaves}
    fields.update({const_path: layout.constant(const_path) for const_path in layout.constants})
    return fields


def _decode_affine(value, payload: np.ndarray, count: int, path: str, out: np.ndarray | None) -> np.ndarray:
    layout = value.affine
    elem_type, shape = logical_tensor_shape(value, path)
    check_budget(count, affine.decode_cost(layout.scale.data_type), path)  # bytes, before allocating
    array_shape(shape, dtypes.NUMPY_DTYPE[layout.scale.data_type].itemsize, f"{path}.logical_type")
    bits = count * dtypes.BIT_WIDTH[layout.storage_type]
    if bits % 8 and payload[-1] >> (bits % 8):
        raise violation(E.AFFINE_PADDING_NONZERO, path, "unused final high bits must be zero")
    scale = to_array(layout.scale, f"{path}.affine.scale")
    zero_point = None
    if layout.HasField("zero_point"):
        zero_point = to_array(layout.zero_point, f"{path}.affine.zero_point")
    axis = affine.normalize_axis(layout.axis, len(shape), f"{path}.affine.axis") \
        if layout.HasField("axis") else None
    block = layout.block_size if layout.HasField("block_size") else None
    extra = {} if out is None else {"out": out}  # the call stays the same without a buffer
    return affine.dequantize(payload, layout.storage_type, scale, zero_point, axis, block, shape,
                             output_dtype=dtypes.NUMPY_DTYPE[elem_type], **extra)


def _check_logical(value, result: np.ndarray, path: str) -> np.ndarray:
    """Decoders produce flat element runs; the logical type fixes their exact dtype and shape."""
    if not value.HasField("logical_type"):
        return result
    logical = value.logical_type
    if logical.WhichOneof("value") != "tensor_type":
        raise violation(E.LOGICAL_SHAPE_MISMATCH, f"{path}.logical_type",
                        "the decoder produced a tensor but logical_type is not a tensor type")
    tensor = logical.tensor_type
    expected_dtype = dtypes.NUMPY_DTYPE.get(tensor.elem_type)
    if expected_dtype is None or result.dtype != expected_dtype:
        raise violation(E.LOGICAL_SHAPE_MISMATCH, f"{path}.logical_type",
                        f"decoder produced {result.dtype}, logical type is {dtypes.type_name(tensor.elem_type)}")
    if not tensor.HasField("shape"):
        return result
    dims = [d.dim_value if d.WhichOneof("value") == "dim_value" else None for d in tensor.shape.dim]
    if None in dims:
        if len(dims) == 1:
            return result
        raise violation(E.LOGICAL_SHAPE_MISMATCH, f"{path}.logical_type",
                        "a multi-dimensional logical shape must be concrete to be decoded")
    if math.prod(dims) != result.size:
        raise violation(E.LOGICAL_SHAPE_MISMATCH, f"{path}.logical_type",
                        f"decoder produced {result.size} elements, logical shape is {dims}")
    return result.reshape(array_shape(dims, result.itemsize, f"{path}.logical_type"))

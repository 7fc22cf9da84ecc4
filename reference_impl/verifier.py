"""``verify_model``: every representation rule of the contract, without running any codec.

Checks run in a fixed order (catalogue, graph types, initializer names, encoded values) so the first
violation found, and therefore the reported code, is deterministic.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, replace
from typing import Any

from google.protobuf.message import DecodeError

from reference_impl import affine, dtypes, schema
from reference_impl.errors import ContractError, violation
from reference_impl.errors import ErrorCode as E
from reference_impl.payload import Extent, check_file, payload_extent
from reference_impl.structs import (
    MAX_TYPE_NODES,
    Catalogue,
    NotFixedSize,
    check_struct,
    check_type,
    checked_mul,
    struct_kind,
)
from reference_impl.tensors import check_tensor_data, element_count


@dataclass
class EncodedInfo:
    """What verification established about one encoded value."""

    path: str
    extent: Extent
    element_bytes: int | None = None  # struct branch: bytes per record
    record_count: int | None = None
    logical_count: int | None = None  # affine branch: logical elements


@dataclass
class VerifiedModel:
    model: Any  # the extended ModelProto (a message class built at import time)
    catalogue: Catalogue
    base_dir: str | None = None
    encoded: dict[str, EncodedInfo] = field(default_factory=dict)


def load_model(model_or_bytes) -> object:
    """An extended ModelProto from bytes, an extended message, or a plain onnx ModelProto."""
    if isinstance(model_or_bytes, (bytes, bytearray, memoryview)):
        try:
            return schema.parse_model(bytes(model_or_bytes))
        except (DecodeError, RecursionError, ValueError) as error:
            raise violation(E.MODEL_PARSE_ERROR, "model", f"not a parseable ModelProto: {error}") from None
    if isinstance(model_or_bytes, schema.ModelProto):
        return model_or_bytes
    descriptor = getattr(model_or_bytes, "DESCRIPTOR", None)
    if descriptor is not None and descriptor.full_name == "onnx.ModelProto":
        return schema.from_onnx(model_or_bytes)
    raise violation(E.MODEL_PARSE_ERROR, "model",
                    f"expected model bytes or a ModelProto, got {type(model_or_bytes).__name__}")


def verify_model(model_or_bytes, base_dir: str | os.PathLike | None = None) -> VerifiedModel:
    """Validate a model against the representation contract; raise ContractError on the first violation.

    With ``base_dir``, external payload files are also checked to exist and cover their extents.
    """
    model = load_model(model_or_bytes)
    catalogue = Catalogue(model.struct_types, node_budget=MAX_TYPE_NODES)
    try:
        catalogue.check_all()
        verified = VerifiedModel(model, catalogue, str(base_dir) if base_dir is not None else None)
        _verify_graph(model.graph, "model.graph", verified)
        for index, function in enumerate(model.functions):
            for node_index, node in enumerate(function.node):
                _verify_subgraphs(node, f"model.functions[{index}].node[{node_index}]", verified)
    except RecursionError:
        raise violation(E.NESTING_TOO_DEEP, "model", "nesting exceeds the implementation limit") from None
    finally:
        catalogue.end_budget()
    return verified


def contains_struct(tp) -> bool:
    """True when a TypeProto is, or nests through sequence/map/optional, a struct type."""
    which = tp.WhichOneof("value")
    if which == "struct_type":
        return True
    if which == "sequence_type":
        return contains_struct(tp.sequence_type.elem_type)
    if which == "map_type":
        return contains_struct(tp.map_type.value_type)
    if which == "optional_type":
        return contains_struct(tp.optional_type.elem_type)
    return False


def _verify_graph(graph, path: str, verified: VerifiedModel) -> None:
    catalogue = verified.catalogue
    for group in ("input", "output", "value_info"):
        for index, info in enumerate(getattr(graph, group)):
            if info.HasField("type") and contains_struct(info.type):
                check_type(info.type, f"{path}.{group}[{index}].type", catalogue)
    _check_initializer_names(graph, path)
    for index, value in enumerate(graph.encoded_initializer):
        value_path = f"{path}.encoded_initializer[{index}]"
        info = verify_encoded_value(value, value_path, catalogue, verified.base_dir)
        if path == "model.graph" and value.name not in verified.encoded:
            verified.encoded[value.name] = replace(info, extent=info.extent.detached())  # keeps no payload copy
    for index, node in enumerate(graph.node):
        _verify_subgraphs(node, f"{path}.node[{index}]", verified)


def _verify_subgraphs(node, path: str, verified: VerifiedModel) -> None:
    for index, attribute in enumerate(node.attribute):
        if attribute.HasField("g"):
            _verify_graph(attribute.g, f"{path}.attribute[{index}].g", verified)
        for sub_index, subgraph in enumerate(attribute.graphs):
            _verify_graph(subgraph, f"{path}.attribute[{index}].graphs[{sub_index}]", verified)


def _check_initializer_names(graph, path: str) -> None:
    _check_names_unique(_initializer_names(graph, path))


def _initializer_names(graph, path: str) -> list[tuple[str, str]]:
    """(path, name) of every dense, sparse and encoded initializer of one graph; a sparse initializer is
    named by its values tensor."""
    named = [(f"{path}.initializer[{i}]", t.name) for i, t in enumerate(graph.initializer)]
    named += [(f"{path}.sparse_initializer[{i}]", s.values.name) for i, s in enumerate(graph.sparse_initializer)]
    named += [(f"{path}.encoded_initializer[{i}]", v.name) for i, v in enumerate(graph.encoded_initializer)]
    return named


def _check_names_unique(named: list[tuple[str, str]]) -> None:
    """Names are unique across all initializers of a graph; an encoded one must have a name."""
    seen: dict[str, str] = {}
    for item_path, name in named:
        if not name and ".encoded_initializer[" in item_path:
            raise violation(E.INITIALIZER_NAME_EMPTY, f"{item_path}.name", "encoded initializers must be named")
        if name in seen:
            raise violation(E.INITIALIZER_NAME_DUPLICATE, f"{item_path}.name",
                            f"name {name!r} is already used by {seen[name]}")
        seen[name] = item_path


def verify_encoded_value(value, path: str, catalogue: Catalogue, base_dir=None) -> EncodedInfo:
    """Validate one EncodedValueProto: layout, payload fields and sizes (and files, given base_dir)."""
    layout = value.WhichOneof("layout")
    if layout is None:
        raise violation(E.LAYOUT_MISSING, path, "an encoded value selects affine or struct_type")
    extent = payload_extent(value, path)
    if layout == "affine":
        info = _verify_affine(value, path, extent)
    else:
        info = _verify_struct_layout(value, path, extent, catalogue)
    if base_dir is not None:
        check_file(extent, base_dir, path)
    return info


def _verify_struct_layout(value, path: str, extent: Extent, catalogue: Catalogue) -> EncodedInfo:
    layout_path = f"{path}.struct_type"
    st = value.struct_type
    if struct_kind(st) is None:
        raise violation(E.KINDLESS_MISPLACED, layout_path, "a kind-less StructTypeProto is never a payload layout")
    check_struct(st, layout_path, catalogue, role="layout")
    bits = catalogue.bit_size(st, layout_path)
    if isinstance(bits, NotFixedSize):
        raise violation(E.NOT_FIXED_SIZE, bits.path, f"not byte-encodable: {bits.reason}")
    if bits == 0:
        raise violation(E.ROOT_SIZE_ZERO, layout_path,
                        "an encoding root needs a positive size (constant-only structs cannot be roots)")
    if bits % 8:
        raise violation(E.ROOT_SIZE_NOT_BYTES, layout_path, f"root size {bits} bits is not a whole byte count")
    element_bytes = bits // 8
    if extent.length % element_bytes:
        raise violation(E.PAYLOAD_PARTIAL_RECORD, path,
                        f"{extent.length} payload bytes is not a whole number of {element_bytes}-byte records")
    if value.HasField("logical_type"):
        check_type(value.logical_type, f"{path}.logical_type", catalogue)
    return EncodedInfo(path, extent, element_bytes=element_bytes, record_count=extent.length // element_bytes)


def logical_tensor_shape(value, path: str) -> tuple[int, tuple[int, ...]]:
    """Element type and concrete dims of an affine value's logical_type (LOGICAL_TYPE_INVALID otherwise)."""
    if not value.HasField("logical_type") or value.logical_type.WhichOneof("value") != "tensor_type":
        raise violation(E.LOGICAL_TYPE_INVALID, f"{path}.logical_type", "the affine branch needs a tensor type")
    tensor = value.logical_type.tensor_type
    if tensor.elem_type not in affine.SCALE_TYPES:
        raise violation(E.LOGICAL_TYPE_INVALID, f"{path}.logical_type.tensor_type.elem_type",
                        f"{dtypes.type_name(tensor.elem_type)} is not a floating type")
    if not tensor.HasField("shape"):
        raise violation(E.LOGICAL_TYPE_INVALID, f"{path}.logical_type.tensor_type",
                        "the affine branch needs concrete dimensions")
    dims = []
    for index, dim in enumerate(tensor.shape.dim):
        if dim.WhichOneof("value") != "dim_value" or dim.dim_value < 0:
            raise violation(E.LOGICAL_TYPE_INVALID, f"{path}.logical_type.tensor_type.shape.dim[{index}]",
                            "the affine branch needs concrete dimensions")
        dims.append(dim.dim_value)
    return tensor.elem_type, tuple(dims)


def _verify_affine(value, path: str, extent: Extent) -> EncodedInfo:
    layout = value.affine
    layout_path = f"{path}.affine"
    if layout.storage_type not in affine.STORAGE_TYPES:
        raise violation(E.AFFINE_STORAGE_INVALID, f"{layout_path}.storage_type",
                        f"{dtypes.type_name(layout.storage_type)} is not INT8/UINT8/INT4/UINT4/INT2/UINT2")
    elem_type, shape = logical_tensor_shape(value, path)
    count = element_count(shape, f"{path}.logical_type")
    if not layout.HasField("scale"):
        raise violation(E.AFFINE_SCALE_INVALID, layout_path, "scale is required")
    scale = layout.scale
    if scale.data_type not in affine.SCALE_TYPES:
        raise violation(E.AFFINE_SCALE_INVALID, f"{layout_path}.scale.data_type",
                        f"{dtypes.type_name(scale.data_type)} is not a floating type")
    if scale.data_type != elem_type and not {scale.data_type, elem_type} <= affine.OUTPUT_DTYPES:
        raise violation(E.AFFINE_SCALE_INVALID, f"{layout_path}.scale.data_type",
                        f"DequantizeLinear cannot produce {dtypes.type_name(elem_type)} from a "
                        f"{dtypes.type_name(scale.data_type)} scale")
    if any(d < 0 for d in scale.dims):
        raise violation(E.AFFINE_PARAM_SHAPE, f"{layout_path}.scale.dims", "negative dimension")
    check_tensor_data(scale, f"{layout_path}.scale")
    axis = None
    if layout.HasField("block_size") and not layout.HasField("axis"):
        raise violation(E.AFFINE_BLOCK_WITHOUT_AXIS, f"{layout_path}.block_size",
                        "block_size is valid only with an axis")
    if layout.HasField("axis"):
        axis = affine.normalize_axis(layout.axis, len(shape), f"{layout_path}.axis")
    block = None
    if layout.HasField("block_size"):
        if layout.block_size == 0:
            raise violation(E.AFFINE_BLOCK_INVALID, f"{layout_path}.block_size", "block_size must be > 0")
        block = layout.block_size
    expected = affine.parameter_shape(shape, axis, block)
    if tuple(scale.dims) != expected:
        granularity = "per-tensor" if axis is None else ("blocked" if block else "per-axis")
        raise violation(E.AFFINE_PARAM_SHAPE, f"{layout_path}.scale.dims",
                        f"{granularity} scale needs shape {list(expected)}, got {list(scale.dims)}")
    if layout.HasField("zero_point"):
        zero_point = layout.zero_point
        if zero_point.data_type != layout.storage_type:
            raise violation(E.AFFINE_ZERO_POINT_INVALID, f"{layout_path}.zero_point.data_type",
                            f"zero_point has {dtypes.type_name(zero_point.data_type)}, storage is "
                            f"{dtypes.type_name(layout.storage_type)}")
        if tuple(zero_point.dims) != expected:
            raise violation(E.AFFINE_PARAM_SHAPE, f"{layout_path}.zero_point.dims",
                            f"zero_point needs the scale's shape {list(expected)}, got {list(zero_point.dims)}")
        check_tensor_data(zero_point, f"{layout_path}.zero_point")
    bits = checked_mul(count, dtypes.BIT_WIDTH[layout.storage_type], f"{path}.logical_type")
    needed = (bits + 7) // 8
    if extent.length != needed:
        raise violation(E.AFFINE_PAYLOAD_SIZE, path,
                        f"{count} codes need exactly {needed} payload bytes, found {extent.length}")
    if not extent.external and bits % 8 and \
            (extent.inline if extent.inline is not None else value.raw_data)[-1] >> (bits % 8):
        raise violation(E.AFFINE_PADDING_NONZERO, f"{path}.raw_data", "unused final high bits must be zero")
    return EncodedInfo(path, extent, logical_count=count)


def is_contract_error(error: BaseException) -> bool:
    return isinstance(error, ContractError)

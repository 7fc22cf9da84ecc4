"""Bounds-checked, vectorized record reading for byte-encodable struct layouts.

A resolved struct compiles to a flat list of leaves. Each leaf is a fixed-width scalar type at a bit
offset inside the record, repeated over a list of (count, stride) dimensions contributed by arrays,
bit packings and tensor shapes. Reading a leaf over N records is one gather of bit positions
``record * record_bits + offset + sum(i_k * stride_k)``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from reference_impl import dtypes
from reference_impl.bits import read_bits, unpack_sub_byte, unsigned_to_leaf
from reference_impl.errors import ErrorCode as E
from reference_impl.errors import violation
from reference_impl.structs import Catalogue, NotFixedSize, struct_kind, type_bit_size
from reference_impl.tensors import array_shape, to_array

#: Upper bound on leaves, constants and visited type nodes per layout: a diamond-shaped catalogue
#: expands once per path, so without a bound its layout could take 2**depth time and memory.
MAX_LEAVES = 4096
#: Upper bound on elements materialized by one read; larger requests fail with RESOURCE_LIMIT.
MAX_READ_ELEMENTS = 1 << 31
#: Upper bound on the bytes one decode or field read allocates (output plus working arrays), checked
#: before anything is allocated: counting elements alone let a wide element type exhaust memory.
MAX_DECODE_BYTES = 1 << 31
#: Working bytes per element of the three read paths (output included): strided byte views, the packed
#: 4/2-bit fast path, and the general bit gather (positions, byte window and shifts, all 64-bit).
_VIEW_BYTES, _PACKED_BYTES, _GATHER_BYTES = 2, 6, 64


def check_budget(elements: int, bytes_per_element: int, path: str) -> None:
    """RESOURCE_LIMIT unless ``elements`` (each costing ``bytes_per_element`` while being produced) stay
    within MAX_READ_ELEMENTS and MAX_DECODE_BYTES."""
    if elements > MAX_READ_ELEMENTS or elements * bytes_per_element > MAX_DECODE_BYTES:
        raise violation(E.RESOURCE_LIMIT, path, f"producing {elements} elements needs about "
                        f"{elements * bytes_per_element} bytes, over the decode limit of {MAX_DECODE_BYTES}")


class Leaf(NamedTuple):
    """One fixed-width scalar field of a record (a tuple: layouts of many leaves are built often)."""

    path: str
    elem_type: int | None  # None: an unsigned bit-packing component of ``width`` bits
    width: int
    offset: int
    dims: tuple[tuple[int, int], ...]  # (count, stride in bits), outermost first

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(count for count, _ in self.dims)


@dataclass
class RecordLayout:
    """The physical layout of one record of a resolved, byte-encodable struct type."""

    record_bits: int
    leaves: dict[str, Leaf] = field(default_factory=dict)
    constants: dict[str, object] = field(default_factory=dict)  # path -> TensorProto
    nodes_visited: int = 0

    @property
    def record_bytes(self) -> int:
        return self.record_bits // 8

    def constant(self, path: str) -> np.ndarray:
        if path not in self.constants:
            raise violation(E.FIELD_NOT_FOUND, path, "no constant field at this path")
        return to_array(self.constants[path], path)

    def signature(self) -> tuple:
        """Identity of the layout: leaf paths, types and bit positions, and every constant's type, shape
        and values (changing a constant requires a new type ID, so a binding must notice)."""
        leaves = tuple((leaf.path, leaf.elem_type, leaf.width, leaf.offset, leaf.dims)
                       for leaf in self.leaves.values())
        consts = tuple((path, tensor.data_type, tuple(tensor.dims), _constant_bytes(tensor, path))
                       for path, tensor in self.constants.items())
        return (self.record_bits, leaves, consts)

    def read(self, payload: np.ndarray, path: str) -> np.ndarray:
        """The leaf at ``path`` for every record: shape (records, *leaf.shape)."""
        leaf = self.leaves.get(path)
        if leaf is None:
            raise violation(E.FIELD_NOT_FOUND, path, f"no field {path!r}; fields are {sorted(self.leaves)}")
        return read_leaf(payload, self.record_bits, leaf)


def _constant_bytes(tensor, path: str) -> bytes:
    values = to_array(tensor, path)
    if values.dtype == object:
        return repr(values.tolist()).encode()
    return np.ascontiguousarray(values).tobytes()


def compile_layout(st, catalogue: Catalogue, path: str = "layout") -> RecordLayout:
    """Flatten a byte-encodable struct (already verified) into leaves and constants."""
    bits = catalogue.bit_size(st, path)
    if isinstance(bits, NotFixedSize):
        raise violation(E.NOT_FIXED_SIZE, bits.path, bits.reason)
    layout = RecordLayout(record_bits=bits)
    _compile_struct(st, catalogue, "", 0, (), layout, path, {})
    return layout


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def _add_leaf(layout: RecordLayout, leaf: Leaf, path: str) -> None:
    if len(layout.leaves) >= MAX_LEAVES:
        raise violation(E.RESOURCE_LIMIT, path, f"layout has more than {MAX_LEAVES} leaves")
    layout.leaves[leaf.path] = leaf


def _add_constant(layout: RecordLayout, name: str, constant, path: str) -> None:
    if len(layout.constants) >= MAX_LEAVES:
        raise violation(E.RESOURCE_LIMIT, path, f"layout has more than {MAX_LEAVES} constants")
    layout.constants[name] = constant


def _visit(layout: RecordLayout, path: str, nodes: int = 1) -> None:
    layout.nodes_visited += nodes
    if layout.nodes_visited > 4 * MAX_LEAVES:
        raise violation(E.RESOURCE_LIMIT, path, f"layout expands to more than {4 * MAX_LEAVES} type nodes")


def _compile_struct(st, catalogue, prefix, offset, dims, layout, path, expanded) -> None:
    """Leaves and constants of ``st`` at ``offset`` below ``prefix``. A referenced declaration is
    compiled once per layout (``expanded``, by type_id) and then placed wherever it is referenced: a
    catalogue sharing a type along many paths (a diamond) costs one placement per path, not one walk.
    Placement counts the same leaves, constants and type nodes against the limits as a walk would."""
    _visit(layout, path)
    if struct_kind(st) == "type_ref":
        relative = expanded.get(st.type_ref)
        if relative is None:
            decl, decl_path = catalogue.lookup(st.type_ref, f"{path}.type_ref")
            relative = RecordLayout(record_bits=0)
            _compile_body(decl, catalogue, "", 0, (), relative, decl_path, expanded)
            expanded[st.type_ref] = relative
        _place(relative, prefix, offset, dims, layout, path)
        return
    _compile_body(st, catalogue, prefix, offset, dims, layout, path, expanded)


def _place(relative: RecordLayout, prefix: str, offset: int, dims: tuple, layout: RecordLayout, path: str) -> None:
    """Copy a declaration's relative leaves and constants into ``layout`` at ``offset`` below ``prefix``."""
    _visit(layout, path, relative.nodes_visited)
    leaves, constants = layout.leaves, layout.constants
    if len(leaves) + len(relative.leaves) <= MAX_LEAVES and len(constants) + len(relative.constants) <= MAX_LEAVES:
        # within the limits whatever the paths: copied without a check per entry (names may be bytes:
        # proto2 does not validate strings, so paths are joined exactly as a walk joins them)
        for leaf in relative.leaves.values():
            placed = _join(prefix, leaf.path) if leaf.path else prefix
            leaves[placed] = Leaf(placed, leaf.elem_type, leaf.width, offset + leaf.offset, dims + leaf.dims)
        for name, constant in relative.constants.items():
            constants[_join(prefix, name)] = constant
        return
    for leaf in relative.leaves.values():
        placed = _join(prefix, leaf.path) if leaf.path else prefix
        _add_leaf(layout, Leaf(placed, leaf.elem_type, leaf.width, offset + leaf.offset, dims + leaf.dims), path)
    for name, constant in relative.constants.items():
        _add_constant(layout, _join(prefix, name), constant, path)


def _compile_body(st, catalogue, prefix, offset, dims, layout, path, expanded) -> None:
    kind = struct_kind(st)
    if kind == "array":
        element_bits = type_bit_size(st.array.element_type, path, catalogue)
        _compile_type(st.array.element_type, catalogue, prefix, offset,
                      dims + ((st.array.dimension, element_bits),), layout, f"{path}.array.element_type", expanded)
    elif kind == "bit_packing":
        stride = sum(c.bit_width for c in st.bit_packing.component)
        running = 0
        for component in st.bit_packing.component:
            _add_leaf(layout, Leaf(_join(prefix, component.name), None, component.bit_width, offset + running,
                                   dims + ((st.bit_packing.dimension, stride),)), path)
            running += component.bit_width
    else:
        running = 0
        for index, fld in enumerate(st.structure.field):
            name = _join(prefix, fld.name)
            if fld.WhichOneof("content") == "constant":
                _add_constant(layout, name, fld.constant, path)
                continue
            field_path = f"{path}.structure.field[{index}].type"
            _compile_type(fld.type, catalogue, name, offset + running, dims, layout, field_path, expanded)
            running += type_bit_size(fld.type, field_path, catalogue)


def _compile_type(tp, catalogue, prefix, offset, dims, layout, path, expanded) -> None:
    _visit(layout, path)
    if tp.WhichOneof("value") == "struct_type":
        _compile_struct(tp.struct_type, catalogue, prefix, offset, dims, layout, f"{path}.struct_type", expanded)
        return
    tensor = tp.tensor_type
    width = dtypes.BIT_WIDTH[tensor.elem_type]
    shape = [d.dim_value for d in tensor.shape.dim]
    strides = []
    stride = width
    for count in reversed(shape):
        strides.append(stride)
        stride *= count
    tensor_dims = tuple(zip(shape, reversed(strides)))
    _add_leaf(layout, Leaf(prefix, tensor.elem_type, width, offset, dims + tensor_dims), path)


def _leaf_positions(record_count: int, record_bits: int, leaf: Leaf) -> np.ndarray:
    positions = (np.arange(record_count, dtype=np.uint64) * np.uint64(record_bits) + np.uint64(leaf.offset))
    for count, stride in leaf.dims:
        step = np.arange(count, dtype=np.uint64) * np.uint64(stride)
        positions = positions[..., None] + step
    return positions


def read_leaf(payload: np.ndarray, record_bits: int, leaf: Leaf) -> np.ndarray:
    record_bytes = record_bits // 8
    record_count = len(payload) // record_bytes if record_bytes else 0
    total = record_count
    for count in leaf.shape:
        total *= count
    dtype = dtypes.NUMPY_DTYPE[leaf.elem_type] if leaf.elem_type else np.dtype(np.uint64)
    check_budget(total, _read_cost(leaf, dtype.itemsize), leaf.path)
    out_shape = array_shape((record_count,) + leaf.shape, dtype.itemsize, leaf.path)
    if total == 0:
        return np.zeros(out_shape, dtype=dtype)
    last = (record_count - 1) * record_bits + leaf.offset + sum((c - 1) * s for c, s in leaf.dims) + leaf.width
    if last > len(payload) * 8:  # every read is bounds-checked
        raise violation(E.PAYLOAD_PARTIAL_RECORD, leaf.path, "field extends beyond the payload")
    matrix = payload[: record_count * record_bytes].reshape(record_count, record_bytes)
    fast = _read_aligned(matrix, leaf)
    if fast is not None:
        return fast.reshape(out_shape)
    positions = _leaf_positions(record_count, record_bits, leaf)
    if leaf.elem_type in (dtypes.COMPLEX64, dtypes.COMPLEX128):
        # A complex leaf is its real then imaginary float, each read as a bit field of half the width and
        # reassembled by bit pattern (arithmetic would turn inf parts into NaN and quiet signaling NaNs).
        half = leaf.width // 2
        storage = np.uint32 if half == 32 else np.uint64
        parts = np.stack([read_bits(payload, positions, half).astype(storage),
                          read_bits(payload, positions + np.uint64(half), half).astype(storage)], axis=-1)
        return np.ascontiguousarray(parts).view(dtypes.NUMPY_DTYPE[leaf.elem_type])[..., 0]
    raw = read_bits(payload, positions, leaf.width)
    if leaf.elem_type is None:
        return raw
    return unsigned_to_leaf(raw, leaf.elem_type)


def _read_cost(leaf: Leaf, itemsize: int) -> int:
    """Working bytes per element of the path ``read_leaf`` takes for this leaf."""
    if leaf.offset % 8 == 0 and all(stride % 8 == 0 or count <= 1 for count, stride in leaf.dims) and \
            leaf.elem_type is not None and leaf.width % 8 == 0:
        return _VIEW_BYTES * itemsize
    if leaf.elem_type in (dtypes.INT4, dtypes.UINT4, dtypes.INT2, dtypes.UINT2) and leaf.offset % 8 == 0 \
            and _is_dense_run(leaf):
        return _PACKED_BYTES
    halves = 2 if leaf.elem_type in (dtypes.COMPLEX64, dtypes.COMPLEX128) else 1  # read as two halves
    return halves * _GATHER_BYTES + 2 * itemsize


def _read_aligned(matrix: np.ndarray, leaf: Leaf) -> np.ndarray | None:
    """Strided byte views for byte-aligned leaves, and the nibble/crumb fast path for packed codes."""
    if leaf.offset % 8 or any(stride % 8 and count > 1 for count, stride in leaf.dims):
        if leaf.elem_type in (dtypes.INT4, dtypes.UINT4, dtypes.INT2, dtypes.UINT2) and \
                leaf.offset % 8 == 0 and _is_dense_run(leaf):
            count = int(np.prod(leaf.shape, dtype=np.int64))
            nbytes = -(-count * leaf.width // 8)
            start = leaf.offset // 8
            block = matrix[:, start:start + nbytes]
            per_byte = 8 // leaf.width
            codes = unpack_sub_byte(block.reshape(-1), leaf.width, block.size * per_byte,
                                    leaf.elem_type in dtypes.SIGNED_INTEGERS)
            return codes.reshape(len(matrix), -1)[:, :count]
        return None
    if leaf.elem_type is None or leaf.width % 8:
        return None
    itemsize = leaf.width // 8
    start = leaf.offset // 8
    shape = (matrix.shape[0],) + leaf.shape + (itemsize,)
    strides = (matrix.strides[0],) + tuple(stride // 8 for _, stride in leaf.dims) + (1,)
    view = np.lib.stride_tricks.as_strided(matrix[:, start:], shape=shape, strides=strides, writeable=False)
    contiguous = np.ascontiguousarray(view).reshape(-1)
    if leaf.elem_type == dtypes.BOOL:
        return contiguous != 0
    return contiguous.view(dtypes.NUMPY_DTYPE[leaf.elem_type])


def _is_dense_run(leaf: Leaf) -> bool:
    """True when the leaf's elements are consecutive (row-major, stride == width) within a record."""
    expected = leaf.width
    for count, stride in reversed(leaf.dims):
        if count > 1 and stride != expected:
            return False
        expected *= count
    return True

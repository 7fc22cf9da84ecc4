"""The generators' own model of struct types: sizes, leaf positions and record packing.

Expected values in properties and fuzz targets come from here, not from the oracle: this module
re-derives the spec's size table and bit placement ("arrays and bit packings are tight, fields follow
declaration order, bits run least-to-most-significant, multi-byte values little-endian") on a small
tree of nodes, then renders the nodes as StructTypeProto messages. Leaf values are carried as raw bit
patterns (little-endian bytes), so any element type, NaN payloads included, compares exactly.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from reference_impl import dtypes, schema


# ------------------------------------------------------------------------------------------- nodes
@dataclass
class Tensor:
    """A tensor_type leaf. ``dims`` None: no shape; entries may be str (dim_param) for dynamic types."""

    elem_type: int
    dims: tuple | None = ()


@dataclass
class Dynamic:
    """A TypeProto with no fixed inline size: sequence/map/optional of a tensor, or a kind-less struct."""

    form: str  # "sequence" | "map" | "optional" | "category"
    elem_type: int = dtypes.FLOAT


@dataclass
class Constant:
    tensor: object  # TensorProto (extended schema)
    expected: np.ndarray


@dataclass
class Array:
    element: object  # Tensor | struct kind node
    count: int


@dataclass
class Packing:
    components: list[tuple[str, int]]
    count: int


@dataclass
class Structure:
    fields: list[tuple[str, object]]  # (name, Tensor | Dynamic | Constant | struct kind node)


@dataclass
class Ref:
    type_id: int


StructNode = Array | Packing | Structure | Ref


@dataclass
class Declaration:
    type_id: int
    node: StructNode
    name: str = ""
    doc: str = ""
    codec: bool = False  # carries a (never executed) decoder FunctionProto


@dataclass
class Catalogue:
    """Declarations by ID, in the order they were generated (references point backwards)."""

    declarations: dict[int, Declaration] = field(default_factory=dict)
    #: Declarations other generators must not reference: a shaped block sits at the nesting limit, so
    #: one more enclosing level would make the "valid" model invalid.
    reserved: set[int] = field(default_factory=set)
    #: Per declaration: bit size (None when not fixed-size) and whether a string tensor is inside.
    #: References fan out, so without these the walks would be exponential in the catalogue depth.
    sizes: dict[int, int | None] = field(default_factory=dict)
    strings: dict[int, bool] = field(default_factory=dict)

    def node(self, type_id: int) -> StructNode:
        return self.declarations[type_id].node


class TooLarge(Exception):
    """A layout with more leaves than a generator should pack (references multiply paths)."""


# ------------------------------------------------------------------------------------------- sizes
class Unsized(Exception):
    """The type has no fixed inline size (a valid runtime type, not byte-encodable)."""


def bits(node, catalogue: Catalogue) -> int:
    """Size in bits of one element, per the spec's table (raises Unsized for dynamic types)."""
    if isinstance(node, Tensor):
        if node.dims is None or any(not isinstance(d, int) for d in node.dims):
            raise Unsized
        return int(np.prod(node.dims, dtype=object)) * dtypes.BIT_WIDTH[node.elem_type]
    if isinstance(node, Dynamic):
        raise Unsized
    if isinstance(node, Constant):
        return 0
    if isinstance(node, Array):
        return node.count * bits(node.element, catalogue)
    if isinstance(node, Packing):
        return node.count * sum(width for _, width in node.components)
    if isinstance(node, Structure):
        return sum(bits(f, catalogue) for _, f in node.fields)
    if isinstance(node, Ref):
        if node.type_id not in catalogue.sizes:
            catalogue.sizes[node.type_id] = fixed_bits(catalogue.node(node.type_id), catalogue)
        size = catalogue.sizes[node.type_id]
        if size is None:
            raise Unsized
        return size
    raise TypeError(node)


def fixed_bits(node, catalogue: Catalogue) -> int | None:
    try:
        return bits(node, catalogue)
    except Unsized:
        return None


def has_string(node, catalogue: Catalogue) -> bool:
    """Whether a string tensor appears anywhere in the type (fields, constants, through references)."""
    if isinstance(node, Tensor):
        return node.elem_type == dtypes.STRING
    if isinstance(node, Dynamic):
        return node.elem_type == dtypes.STRING
    if isinstance(node, Constant):
        return node.tensor.data_type == dtypes.STRING
    if isinstance(node, Array):
        return has_string(node.element, catalogue)
    if isinstance(node, Structure):
        return any(has_string(item, catalogue) for _, item in node.fields)
    if isinstance(node, Ref):
        if node.type_id not in catalogue.strings:
            catalogue.strings[node.type_id] = has_string(catalogue.node(node.type_id), catalogue)
        return catalogue.strings[node.type_id]
    return False


# ------------------------------------------------------------------------------------------ leaves
@dataclass(frozen=True)
class LeafSpec:
    """One physical leaf: bit ``offset`` in the record, repeated over (count, stride) dims."""

    path: str
    elem_type: int | None  # None: unsigned bit-packing component
    width: int
    offset: int
    dims: tuple

    @property
    def shape(self) -> tuple:
        return tuple(c for c, _ in self.dims)


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def leaves(node, catalogue: Catalogue, prefix: str = "", offset: int = 0, dims: tuple = (),
           max_items: int = 512):
    """Leaves and constants of a byte-encodable node: (list[LeafSpec], {path: expected array}).

    Raises TooLarge beyond ``max_items`` leaves and constants."""
    found: list[LeafSpec] = []
    constants: dict[str, np.ndarray] = {}
    _walk(node, catalogue, prefix, offset, dims, found, constants, max_items)
    return found, constants


def _walk(node, catalogue, prefix, offset, dims, found, constants, max_items=512) -> None:
    if len(found) + len(constants) > max_items:
        raise TooLarge
    if isinstance(node, Ref):
        node = catalogue.node(node.type_id)
    if isinstance(node, Tensor):
        width = dtypes.BIT_WIDTH[node.elem_type]
        strides, stride = [], width
        for count in reversed(node.dims):
            strides.append(stride)
            stride *= count
        found.append(LeafSpec(prefix, node.elem_type, width, offset,
                              dims + tuple(zip(node.dims, reversed(strides)))))
    elif isinstance(node, Array):
        _walk(node.element, catalogue, prefix, offset, dims + ((node.count, bits(node.element, catalogue)),),
              found, constants, max_items)
    elif isinstance(node, Packing):
        stride = sum(width for _, width in node.components)
        running = 0
        for name, width in node.components:
            found.append(LeafSpec(_join(prefix, name), None, width, offset + running,
                                  dims + ((node.count, stride),)))
            running += width
    elif isinstance(node, Structure):
        running = 0
        for name, item in node.fields:
            path = _join(prefix, name)
            if isinstance(item, Constant):
                constants[path] = item.expected
                continue
            _walk(item, catalogue, path, offset + running, dims, found, constants, max_items)
            running += bits(item, catalogue)
    else:
        raise TypeError(node)


# ----------------------------------------------------------------------------------------- packing
def pattern_bytes(width: int) -> int:
    return (width + 7) // 8


def random_patterns(rng: np.random.Generator, leaf: LeafSpec, records: int) -> np.ndarray:
    """Random raw bit patterns for a leaf: uint8 array (records, *shape, bytes), high bits masked."""
    nbytes = pattern_bytes(leaf.width)
    out = rng.integers(0, 256, size=(records,) + leaf.shape + (nbytes,), dtype=np.uint8)
    if leaf.width % 8:
        out[..., -1] &= np.uint8((1 << (leaf.width % 8)) - 1)
    return out


def pack_records(record_bits: int, records: int, values: list[tuple[LeafSpec, np.ndarray]]) -> bytes:
    """Place each leaf's bit patterns at their positions in ``records`` consecutive records."""
    bitbuf = np.zeros(record_bits * records, dtype=np.uint8)
    for leaf, patterns in values:
        if patterns.size == 0:
            continue
        pattern_bits = np.unpackbits(patterns, axis=-1, bitorder="little")[..., : leaf.width]
        base = np.arange(records, dtype=np.int64) * record_bits + leaf.offset
        positions = base.reshape((records,) + (1,) * len(leaf.dims))
        for axis, (count, stride) in enumerate(leaf.dims):
            shape = [1] * (len(leaf.dims) + 1)
            shape[axis + 1] = count
            positions = positions + (np.arange(count, dtype=np.int64) * stride).reshape(shape)
        starts = positions[..., None] + np.arange(leaf.width, dtype=np.int64)
        bitbuf[starts.reshape(-1)] = pattern_bits.reshape(-1)
    return np.packbits(bitbuf, bitorder="little").tobytes()


def as_patterns(leaf: LeafSpec, actual: np.ndarray) -> np.ndarray:
    """An oracle-read leaf array converted back to raw bit patterns, comparable with ``random_patterns``."""
    nbytes = pattern_bytes(leaf.width)
    array = np.asarray(actual)
    if leaf.elem_type is None:
        raw = array.astype("<u8").view(np.uint8).reshape(array.shape + (8,))[..., :nbytes]
    elif leaf.elem_type == dtypes.BOOL:
        raw = array.astype(np.uint8).reshape(array.shape + (1,))
    else:
        itemsize = array.dtype.itemsize
        raw = np.ascontiguousarray(array).view(np.uint8).reshape(array.shape + (itemsize,))[..., :nbytes]
    raw = raw.copy()
    if leaf.width % 8:
        raw[..., -1] &= np.uint8((1 << (leaf.width % 8)) - 1)
    return raw


def expected_for_compare(leaf: LeafSpec, patterns: np.ndarray) -> np.ndarray:
    """Patterns as the oracle can represent them (BOOL leaves read as 0/1)."""
    if leaf.elem_type == dtypes.BOOL:
        return (patterns != 0).astype(np.uint8)
    return patterns


# ----------------------------------------------------------------------------------------- protos
def tensor_type(elem_type: int, dims) -> object:
    tp = schema.TypeProto()
    tensor = tp.tensor_type
    tensor.elem_type = elem_type
    if dims is not None:
        tensor.shape.SetInParent()
        for dim in dims:
            if isinstance(dim, str):
                tensor.shape.dim.add(dim_param=dim)
            else:
                tensor.shape.dim.add(dim_value=dim)
    return tp


def type_proto(node) -> object:
    """The TypeProto of a field type or array element."""
    if isinstance(node, Tensor):
        return tensor_type(node.elem_type, node.dims)
    if isinstance(node, Dynamic):
        tp = schema.TypeProto()
        elem = tensor_type(node.elem_type, None)
        if node.form == "sequence":
            tp.sequence_type.elem_type.CopyFrom(elem)
        elif node.form == "map":
            tp.map_type.key_type = dtypes.INT64
            tp.map_type.value_type.CopyFrom(elem)
        elif node.form == "optional":
            tp.optional_type.elem_type.CopyFrom(elem)
        else:
            tp.struct_type.SetInParent()  # kind-less: an unconstrained category, valid inside TypeProto
        return tp
    tp = schema.TypeProto()
    tp.struct_type.CopyFrom(struct_proto(node))
    return tp


def struct_proto(node) -> object:
    """A StructTypeProto for a struct kind node (inline, no type_id)."""
    st = schema.StructTypeProto()
    if isinstance(node, Ref):
        st.type_ref = node.type_id
    elif isinstance(node, Array):
        st.array.element_type.CopyFrom(type_proto(node.element))
        st.array.dimension = node.count
    elif isinstance(node, Packing):
        for name, width in node.components:
            st.bit_packing.component.add(name=name, bit_width=width)
        st.bit_packing.dimension = node.count
    elif isinstance(node, Structure):
        st.structure.SetInParent()
        for name, item in node.fields:
            fld = st.structure.field.add(name=name)
            if isinstance(item, Constant):
                fld.constant.CopyFrom(item.tensor)
            else:
                fld.type.CopyFrom(type_proto(item))
    else:
        raise TypeError(node)
    return st


def declaration_proto(decl: Declaration) -> object:
    st = struct_proto(decl.node)
    st.type_id = decl.type_id
    if decl.name:
        st.name = decl.name
    if decl.doc:
        st.doc_string = decl.doc
    if decl.codec:
        st.decoder.name = f"Decode{decl.type_id}"
        st.decoder.domain = "local.codecs"
    return st

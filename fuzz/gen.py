"""Valid inputs with independently known meaning, built from a ``Source``.

``gen_plain_model`` yields a ``Generated`` (``fuzz.models.gen_model`` adds near-duplicates and caller
layouts): a model that satisfies every representation rule, the external
payload files it refers to, and for each encoded value what a correct implementation must report
(record size and count, every field's bit patterns and constants, or the decoded tensor). Expected
values are computed here with plain NumPy arithmetic from the spec's formulas, never by calling the
oracle.

Sizes stay small on purpose (a few records, short arrays, shallow nesting): fuzzing wants many
distinct shapes per second, not big payloads.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from fuzz import dimensions
from fuzz import layouts as L
from fuzz.known_issues import probe_known
from fuzz.source import Source
from reference_impl import dtypes, examples, schema

SPEC_IDS = (1002, 1003, 1101, 1102, 2001)
#: IDs for generated declarations: small ones, and the edges of the uint64 range.
ID_POOL = tuple(range(1, 41)) + (255, 256, 65535, 2**32 + 7, 2**63, dtypes.UINT64_MAX)

PAYLOAD_LEAVES = (
    dtypes.INT8, dtypes.UINT8, dtypes.INT16, dtypes.UINT16, dtypes.INT32, dtypes.UINT32, dtypes.INT64,
    dtypes.UINT64, dtypes.INT4, dtypes.UINT4, dtypes.INT2, dtypes.UINT2, dtypes.BOOL, dtypes.FLOAT,
    dtypes.FLOAT16, dtypes.DOUBLE, dtypes.BFLOAT16, dtypes.FLOAT8E4M3FN, dtypes.FLOAT8E4M3FNUZ,
    dtypes.FLOAT8E5M2, dtypes.FLOAT8E5M2FNUZ, dtypes.FLOAT8E8M0, dtypes.FLOAT4E2M1, dtypes.FLOAT6E2M3,
    dtypes.FLOAT6E3M2,
)
#: Complex leaves, also at unaligned bit offsets (once an oracle issue; FUZZ_PROBE_KNOWN=0 leaves them out).
COMPLEX_LEAVES = (dtypes.COMPLEX64, dtypes.COMPLEX128)
FIELD_NAMES = ("codes", "scale", "zero_point", "keys", "values", "length", "index", "pad", "hi", "lo",
               "w", "meta", "block", "ÿ", "with space", "back\\slash")
STORAGE_TYPES = (dtypes.INT8, dtypes.UINT8, dtypes.INT4, dtypes.UINT4, dtypes.INT2, dtypes.UINT2)
SCALE_TYPES = (dtypes.FLOAT, dtypes.FLOAT16, dtypes.DOUBLE, dtypes.BFLOAT16)
SCALE_TABLE = np.array([0.5, 0.25, 1.0, 2.0, 0.125, 3.0, -1.5, 0.0625, 1024.0, 0.0, 7.0, -0.5,
                        0.1, 1e-3, 65504.0, 6e-5], dtype=np.float64)
CODE_RANGE = {dtypes.INT8: (-128, 127), dtypes.UINT8: (0, 255), dtypes.INT4: (-8, 7),
              dtypes.UINT4: (0, 15), dtypes.INT2: (-2, 1), dtypes.UINT2: (0, 3)}
EXTERNAL_FILE = "weights.bin"
#: Records larger than this get a small layout instead (fuzzing wants many shapes, not big payloads).
MAX_RECORD_BITS = 1 << 16
#: Largest payload a value with a large record count gets (bytes): every decode stays well under 1 ms.
MAX_LARGE_PAYLOAD = 8192


# ------------------------------------------------------------------------------------ expectations
@dataclass
class Expected:
    """What a correct implementation reports for one encoded value."""

    name: str
    kind: str  # "fields" (generic record access), "decoded" (registered decoder), "affine"
    record_bytes: int | None = None
    records: int | None = None
    leaves: list = field(default_factory=list)  # [(LeafSpec, patterns)]
    constants: dict = field(default_factory=dict)
    decoded: np.ndarray | None = None
    logical_count: int | None = None
    #: an affine value's parts (codes, zero_point, scale, axis, block, shape, dtype), so a twin's
    #: expectation is computed from the spec's formula as the value's own is
    affine: dict | None = None
    #: a size with a remainder on purpose (``dimensions.remainder_size``): elements or records
    large: bool = False


@dataclass
class Generated:
    model: object
    files: dict[str, bytes] = field(default_factory=dict)
    values: dict[str, Expected] = field(default_factory=dict)
    catalogue: L.Catalogue = field(default_factory=L.Catalogue)
    bindings: list[tuple[str, str]] = field(default_factory=list)
    #: the dimensions chosen on purpose (``fuzz.dimensions``): "size:remainder", "twin:axis", ...
    tags: list[str] = field(default_factory=list)
    #: value name -> the ``dimensions.LAYOUTS`` entry of the caller buffer it is decoded into (``out=``)
    out_layouts: dict[str, str] = field(default_factory=dict)


# ------------------------------------------------------------------------------------------ pieces
def _unique_names(src: Source, count: int) -> list[str]:
    names: list[str] = []
    for index in range(count):
        base = src.choice(FIELD_NAMES)
        names.append(base if base not in names else f"{base}{index}")
    return names


def gen_leaf_tensor(src: Source, allow_complex: bool | None = None) -> L.Tensor:
    if allow_complex is None:
        allow_complex = probe_known()
    pool = PAYLOAD_LEAVES + (COMPLEX_LEAVES if allow_complex else ())
    rank = src.choice((0, 0, 1, 1, 2))
    dims = tuple(src.integer(1, 4) for _ in range(rank))
    return L.Tensor(src.choice(pool), dims)


def tensor_with_raw(array: np.ndarray, elem_type: int) -> object:
    tensor = schema.TensorProto(data_type=elem_type, dims=list(array.shape))
    tensor.raw_data = np.ascontiguousarray(array).tobytes()
    return tensor


def gen_constant(src: Source) -> L.Constant:
    """A field constant: concrete dims and matching data, in a typed field or raw_data."""
    rank = src.choice((0, 0, 1, 2))
    dims = tuple(src.integer(0 if rank else 1, 4) for _ in range(rank))
    count = int(np.prod(dims, dtype=np.int64)) if dims else 1
    raw = src.byte_array(count)
    form = src.integer(0, 5)
    tensor = schema.TensorProto(dims=list(dims))
    if form == 0:
        tensor.data_type = dtypes.FLOAT
        values = (raw.astype(np.float32) - 128) / 8
        tensor.float_data.extend(values.tolist())
        expected = values.reshape(dims)
    elif form == 1:
        tensor.data_type = dtypes.INT64
        values = raw.astype(np.int64) - 100
        tensor.int64_data.extend(values.tolist())
        expected = values.reshape(dims)
    elif form == 2:
        tensor.data_type = dtypes.INT32
        values = raw.astype(np.int32) * 1000 - 77
        tensor.int32_data.extend(values.tolist())
        expected = values.reshape(dims)
    elif form == 3:
        tensor.data_type = dtypes.DOUBLE
        values = raw.astype(np.float64) / 3
        tensor.double_data.extend(values.tolist())
        expected = values.reshape(dims)
    elif form == 4:
        values = raw.astype(np.uint8)
        tensor = tensor_with_raw(values.reshape(dims), dtypes.UINT8)
        expected = values.reshape(dims)
    else:
        tensor.data_type = dtypes.STRING
        values = [bytes([65 + b % 26]) * (1 + b % 3) for b in raw.tolist()]
        tensor.string_data.extend(values)
        expected = np.array(values, dtype=object).reshape(dims)
    return L.Constant(tensor, expected)


def gen_struct_node(src: Source, catalogue: L.Catalogue, depth: int, refs: list[int],
                    dynamic: bool = False) -> L.StructNode:
    """A concrete struct kind (array, bit_packing, structure) or, inside types, a reference."""
    kinds = ["structure", "structure", "array", "packing"]
    if refs:
        kinds += ["ref"]
    kind = src.choice(kinds) if depth < 3 else src.choice(["packing"] + (["ref"] if refs else []))
    if kind == "ref":
        return L.Ref(src.choice(refs))
    if kind == "packing":
        count = src.integer(1, 3)
        names = _unique_names(src, count)
        widths = [src.choice((1, 2, 3, 4, 5, 7, 8, 9, 12, 16, 31, 32, 33, 63, 64)) for _ in names]
        return L.Packing(list(zip(names, widths)), src.integer(1, 5))
    if kind == "array":
        if src.boolean() and depth < 3:
            element = gen_struct_node(src, catalogue, depth + 1, refs, dynamic)
        else:
            element = gen_leaf_tensor(src)
        return L.Array(element, src.integer(1, 4))
    count = src.integer(1, 4)
    fields = []
    for name in _unique_names(src, count):
        which = src.integer(0, 9)
        if which <= 4:
            item = gen_leaf_tensor(src)
        elif which <= 6:
            item = gen_constant(src)
        elif which == 7 and dynamic:
            item = L.Dynamic(src.choice(("sequence", "map", "optional", "category")))
        elif which == 7:
            item = L.Tensor(src.choice((dtypes.FLOAT, dtypes.INT8)), (src.integer(1, 3),))
        else:
            item = gen_struct_node(src, catalogue, depth + 1, refs, dynamic)
        fields.append((name, item))
    return L.Structure(fields)


def gen_catalogue(src: Source, max_declarations: int = 5) -> L.Catalogue:
    """Declarations forming a DAG: each may reference earlier ones, so subtypes are shared and
    diamonds appear whenever two paths reach the same declaration."""
    catalogue = L.Catalogue()
    for _ in range(src.integer(0, max_declarations)):
        available = [i for i in ID_POOL if i not in catalogue.declarations]
        type_id = src.choice(available)
        refs = list(catalogue.declarations)
        node = gen_struct_node(src, catalogue, 0, refs, dynamic=src.chance(1, 6))
        if isinstance(node, L.Ref):  # a declaration is concrete; wrap the reference in a structure
            node = L.Structure([("inner", node)])
        catalogue.declarations[type_id] = L.Declaration(
            type_id, node, name=src.choice(("", "Block", f"T{type_id}")), doc=src.choice(("", "doc")),
            codec=src.chance(1, 5))
    return catalogue


# ----------------------------------------------------------------------------------- struct values
def _pad_to_bytes(node: L.StructNode, size: int) -> L.StructNode:
    """Explicit padding: wrap the root so its size is positive and a whole number of bytes."""
    missing = (-size) % 8 if size else 8
    if missing == 0:
        return node
    return L.Structure([("body", node), ("pad", L.Packing([("bits", missing)], 1))])


def gen_struct_value(src: Source, catalogue: L.Catalogue, name: str):
    """An encoded value whose layout is a catalogue reference or an inline declaration, with records
    packed from random bit patterns. Returns (EncodedValueProto, Expected, payload bytes)."""
    fixed = [tid for tid in catalogue.declarations
             if tid not in catalogue.reserved and L.fixed_bits(L.Ref(tid), catalogue) is not None]
    if fixed and src.chance(2, 3):
        root: L.StructNode = L.Ref(src.choice(fixed))
    else:
        root = gen_struct_node(src, catalogue, 1, fixed)
    size = L.bits(root, catalogue)
    if size == 0 or size % 8:
        root = _pad_to_bytes(root, size)
        size = L.bits(root, catalogue)
    try:
        if size > MAX_RECORD_BITS:
            raise L.TooLarge
        leaves, constants = L.leaves(root, catalogue)
    except L.TooLarge:  # references multiplied the layout: use a small one instead
        root = L.Packing([("bits", 8)], src.integer(1, 4))
        size = L.bits(root, catalogue)
        leaves, constants = L.leaves(root, catalogue)
    record_bytes = size // 8
    records = src.choice((0, 1, 1, 2, 3))
    large = src.chance(1, 6)
    if large:  # past a tile of records, with a partial last tile; the payload stays within MAX_LARGE_PAYLOAD
        records = max(1, min(dimensions.remainder_size(src), MAX_LARGE_PAYLOAD // max(record_bytes, 1)))
        large = records > dimensions.TILES[0] and any(records % tile for tile in dimensions.TILES)
    values = []
    for leaf in leaves:
        count = records * int(np.prod(leaf.shape, dtype=np.int64)) if leaf.shape else records
        nbytes = count * L.pattern_bytes(leaf.width)
        blob = src.data(nbytes).ljust(nbytes, b"\0")
        patterns = np.frombuffer(blob, dtype=np.uint8).reshape((records,) + leaf.shape +
                                                              (L.pattern_bytes(leaf.width),)).copy()
        if leaf.width % 8:
            patterns[..., -1] &= np.uint8((1 << (leaf.width % 8)) - 1)
        values.append((leaf, patterns))
    payload = L.pack_records(size, records, values)
    value = schema.EncodedValueProto(name=name)
    value.struct_type.CopyFrom(L.struct_proto(root))
    if src.chance(1, 4):
        value.doc_string = "generated"
    expected = Expected(name, "fields", record_bytes=record_bytes, records=records, leaves=values,
                        constants=constants, large=large)
    return value, expected, payload


# ------------------------------------------------------------------------------ spec decoder values
def gen_spec_value(src: Source, name: str):
    """A value of one of the spec's registered types (2001, 1002, 1003, 1102) with its decoded tensor."""
    type_id = src.choice((2001, 1002, 1003, 1102))
    records = src.choice((0, 1, 1, 2, 3))
    per_record = {2001: 32, 1002: 128, 1003: 128, 1102: 32}[type_id]
    count = records * per_record
    raw = src.byte_array(count)
    scales = SCALE_TABLE[src.byte_array(records) % 16]
    scales32 = scales.astype(np.float32)
    scale_bytes = scales32.astype("<f4").reshape(-1, 1).view(np.uint8)
    if type_id == 1102:
        index = raw.astype(np.int64) % 4
        packed = np.frombuffer(pack_codes(index, dtypes.UINT2), np.uint8).reshape(records, 8)
        payload = np.hstack([packed, scale_bytes]).tobytes()
        table = np.array([-1.0, -0.25, 0.25, 1.0])
        decoded = (scales32[:, None].astype(np.float64) * table[index.reshape(records, 32)]).astype(np.float32)
    else:
        codes = ((raw.astype(np.int64) % 16) - 8).reshape(records, per_record)
        packed = np.frombuffer(pack_codes(codes, dtypes.INT4), np.uint8).reshape(records, per_record // 2)
        if type_id == 2001:
            payload = np.hstack([packed, scale_bytes]).tobytes()
            decoded = (codes * scales32[:, None].astype(np.float64)).astype(np.float32)
        elif type_id == 1003:
            payload = packed.tobytes()
            decoded = ((codes + 2) * 0.25).astype(np.float32)
        else:
            zps = np.array([src.integer(-(2**20), 2**20) for _ in range(records)], dtype="<i8")
            zp_bytes = zps.reshape(-1, 1).view(np.uint8)
            payload = np.hstack([packed, scale_bytes, zp_bytes]).tobytes()
            decoded = ((codes - zps[:, None]) * scales32[:, None].astype(np.float64)).astype(np.float32)
    decoded = decoded.reshape(-1)
    dims: list = [count]
    if count and src.chance(1, 3):
        dims = [records, per_record]
    elif src.chance(1, 5):
        dims = ["n"]
    value = schema.EncodedValueProto(name=name)
    value.struct_type.type_ref = type_id
    value.logical_type.CopyFrom(L.tensor_type(dtypes.FLOAT, dims))
    if "n" not in dims:
        decoded = decoded.reshape(dims)
    record_bytes = {2001: 20, 1002: 76, 1003: 64, 1102: 12}[type_id]
    return value, Expected(name, "decoded", record_bytes=record_bytes, records=records, decoded=decoded), payload


# ------------------------------------------------------------------------------------ affine values
def _scale_array(src: Source, shape: tuple, elem_type: int) -> np.ndarray:
    count = int(np.prod(shape, dtype=np.int64)) if shape else 1
    picks = src.byte_array(count) % len(SCALE_TABLE)
    return SCALE_TABLE[picks].astype(dtypes.NUMPY_DTYPE[elem_type]).reshape(shape)


def _scale_tensor(src: Source, array: np.ndarray, elem_type: int) -> object:
    """The scale in one of its legal encodings: typed field or raw_data."""
    if src.boolean():
        return tensor_with_raw(array, elem_type)
    tensor = schema.TensorProto(data_type=elem_type, dims=list(array.shape))
    if elem_type == dtypes.FLOAT:
        tensor.float_data.extend(array.reshape(-1).tolist())
    elif elem_type == dtypes.DOUBLE:
        tensor.double_data.extend(array.reshape(-1).tolist())
    else:  # FLOAT16 / BFLOAT16 travel as bit patterns in int32_data
        tensor.int32_data.extend(array.reshape(-1).view(np.uint16).astype(np.int32).tolist())
    return tensor


def pack_codes(codes: np.ndarray, storage_type: int) -> bytes:
    """Row-major codes in TensorProto.raw_data packing: low bits first, final high bits zero."""
    width = dtypes.BIT_WIDTH[storage_type]
    flat = np.asarray(codes, dtype=np.int64).reshape(-1) & ((1 << width) - 1)
    if width == 8:
        return flat.astype(np.uint8).tobytes()
    bits = ((flat[:, None] >> np.arange(width)) & 1).astype(np.uint8).reshape(-1)
    return np.packbits(bits, bitorder="little").tobytes()


def _zero_point_tensor(src: Source, zp: np.ndarray, storage_type: int) -> object:
    tensor = schema.TensorProto(data_type=storage_type, dims=list(zp.shape))
    if dtypes.BIT_WIDTH[storage_type] == 8 and src.boolean():
        tensor.int32_data.extend(zp.reshape(-1).astype(np.int32).tolist())
    else:
        tensor.raw_data = pack_codes(zp, storage_type)
    return tensor


def expected_dequantize(codes, zp, scale, axis, block, shape, out_dtype) -> np.ndarray:
    """(code - zero_point) * scale with parameters broadcast per granularity, exact in float64."""
    codes = np.asarray(codes, dtype=np.float64).reshape(shape)
    zp64 = np.zeros(np.shape(scale)) if zp is None else np.asarray(zp, dtype=np.float64)
    s64 = np.asarray(scale).astype(np.float64)
    if axis is not None:
        if block:
            s64 = np.repeat(s64, block, axis=axis).take(np.arange(shape[axis]), axis=axis)
            zp64 = np.repeat(zp64, block, axis=axis).take(np.arange(shape[axis]), axis=axis)
        else:
            bshape = [1] * len(shape)
            bshape[axis] = shape[axis]
            s64, zp64 = s64.reshape(bshape), zp64.reshape(bshape)
    with np.errstate(over="ignore", invalid="ignore"):
        return ((codes - zp64) * s64).astype(out_dtype)


def gen_affine_value(src: Source, name: str, storage_type: int | None = None,
                     granularity: str | None = None):
    """An affine value of any storage type and granularity. Returns (proto, Expected, payload)."""
    storage = storage_type if storage_type is not None else src.choice(STORAGE_TYPES)
    granularity = granularity or src.choice(("tensor", "axis", "blocked"))
    rank = src.integer(0, 3) if granularity == "tensor" else src.integer(1, 3)
    shape = tuple(src.integer(1, 5) if not src.chance(1, 12) else 0 for _ in range(rank))
    elem_type = src.choice(SCALE_TYPES)
    axis = block = None
    if granularity != "tensor":
        axis = src.integer(0, rank - 1)
    if granularity == "blocked":
        block = src.integer(1, max(1, shape[axis]) + 1)
    large = src.chance(1, 4)
    if large:
        shape, axis, block = _large_shape(src, shape, axis, block)
        rank = len(shape)
    param_shape: tuple = ()
    if axis is not None:
        param_shape = (shape[axis],) if block is None else tuple(
            -(-d // block) if i == axis else d for i, d in enumerate(shape))
    scale = _scale_array(src, param_shape, elem_type)
    lo, hi = CODE_RANGE[storage]
    count = int(np.prod(shape, dtype=np.int64)) if shape else 1
    raw = src.byte_array(count).astype(np.int64)
    codes = lo + raw % (hi - lo + 1)
    zp = None
    value = schema.EncodedValueProto(name=name)
    layout = value.affine
    layout.storage_type = storage
    layout.scale.CopyFrom(_scale_tensor(src, scale, elem_type))
    if src.boolean():
        pcount = int(np.prod(param_shape, dtype=np.int64)) if param_shape else 1
        zraw = src.byte_array(pcount).astype(np.int64)
        zp = (lo + zraw % (hi - lo + 1)).reshape(param_shape)
        layout.zero_point.CopyFrom(_zero_point_tensor(src, zp, storage))
    if axis is not None:
        layout.axis = axis - rank if src.boolean() else axis  # negative axes normalize
    if block is not None:
        layout.block_size = block
    value.logical_type.CopyFrom(L.tensor_type(elem_type, shape))
    payload = pack_codes(codes, storage)
    decoded = expected_dequantize(codes, zp, scale, axis, block, shape, dtypes.NUMPY_DTYPE[elem_type])
    parts = {"codes": codes, "zero_point": zp, "scale": scale, "axis": axis, "block": block, "shape": shape,
             "elem_type": elem_type, "storage": storage, "granularity": granularity, "large": large}
    return value, Expected(name, "affine", decoded=decoded, logical_count=count, affine=parts,
                           large=large), payload


def _large_shape(src: Source, shape: tuple, axis: int | None, block: int | None):
    """``shape`` with one axis (``axis``, or the last) of a remainder size (``dimensions.remainder_size``)
    and every other axis 1, so the value crosses a tile with a partial last one; blocked values get a
    block of a tile size that leaves a partial last block. Returns (shape, axis, block)."""
    dims = list(shape) or [1]
    along = len(dims) - 1 if axis is None else axis
    size = dimensions.remainder_size(src)
    dims = [size if index == along else 1 for index in range(len(dims))]
    if block is not None:
        block = src.choice([tile for tile in dimensions.TILES if tile < size and size % tile])
    return tuple(dims), axis, block


# ------------------------------------------------------------------------------------------ payloads
def attach_payload(src: Source, value, payload: bytes, files: dict[str, bytes], large: bool = False) -> None:
    """Inline raw_data, or an extent inside the shared external file (with junk around it); a large value
    is external one time in two."""
    if not src.chance(1, 2 if large else 4):
        if payload or src.boolean():
            value.raw_data = payload
        return
    blob = files.get(EXTERNAL_FILE, b"")
    blob += bytes(src.integer(0, 9))  # unrelated bytes before the extent
    offset = len(blob)
    blob += payload
    files[EXTERNAL_FILE] = blob
    value.data_location = 1
    entries = [("location", EXTERNAL_FILE), ("length", str(len(payload)))]
    if offset or src.boolean():
        entries.append(("offset", str(offset)))
    for key, text in src.permutation(entries):
        value.external_data.add(key=key, value=text)


# -------------------------------------------------------------------------------------------- models
def value_info(name: str, tp) -> object:
    vi = schema.ValueInfoProto(name=name)
    vi.type.CopyFrom(tp)
    return vi


def _state_type(src: Source, catalogue: L.Catalogue) -> object:
    """The declared type of a persistent input/output pair: a tensor, a struct reference, a sequence."""
    retainable = [tid for tid in catalogue.declarations if not L.has_string(L.Ref(tid), catalogue)]
    if retainable and src.chance(1, 3):  # string tensors cannot be persistent
        tp = schema.TypeProto()
        tp.struct_type.type_ref = src.choice(retainable)
        return tp
    if src.chance(1, 5):
        tp = schema.TypeProto()
        tp.sequence_type.elem_type.CopyFrom(L.tensor_type(dtypes.FLOAT, ("n", 4)))
        return tp
    dims = tuple(src.choice((1, 2, 4, "batch", "past")) for _ in range(src.integer(0, 3)))
    return L.tensor_type(src.choice((dtypes.FLOAT, dtypes.INT64, dtypes.FLOAT16)), dims)


def gen_graph_io(src: Source, generated: Generated) -> None:
    """Inputs, outputs, Identity nodes and persistent bindings (each binding pairs equal types)."""
    graph = generated.model.graph
    graph.input.append(value_info("tokens", L.tensor_type(dtypes.INT64, ("batch", "seq"))))
    graph.output.append(value_info("logits", L.tensor_type(dtypes.INT64, ("batch", "seq"))))
    graph.node.add(op_type="Identity", input=["tokens"], output=["logits"], name="logits_node")
    for index in range(src.integer(0, 3)):
        stem = src.choice(("cache", "past", "kv", "a.b", "s\\t"))
        in_name, out_name = f"{stem}_in{index}", f"{stem}_out{index}"
        tp = _state_type(src, generated.catalogue)
        graph.input.append(value_info(in_name, tp))
        graph.output.append(value_info(out_name, tp))
        graph.node.add(op_type="Identity", input=[in_name], output=[out_name], name=f"state_node{index}")
        if src.chance(3, 4):
            graph.persistent_bindings.add(input_name=in_name, output_name=out_name)
            generated.bindings.append((in_name, out_name))


#: Deepest shaped block: its top declaration reaches 2 * levels - 1 nesting levels, and a graph value
#: typed by it two more (the TypeProto and the type_ref), 63 at most: within the limit of 64.
MAX_SHAPED_LEVELS = 31
#: IDs of shaped blocks: clear of ID_POOL, the spec's IDs and the mutators' blocks (from 1,000,000).
SHAPED_IDS = 9_000_000


def gen_shaped_block(src: Source, generated: Generated) -> int | None:
    """A chain of declarations where each level references the one below ``fan`` times (a diamond when
    fan > 1: fan**levels paths through a catalogue of ``levels`` entries), bound as a whole-struct
    state. Expanding it path by path is exponential, so every consumer must memoize by type_id.
    Returns the top type_id, or None when the source chooses no block."""
    if not src.chance(1, 3):
        return None
    levels = src.choice((2, 8, 20, MAX_SHAPED_LEVELS)) if src.boolean() else src.integer(2, MAX_SHAPED_LEVELS)
    fan = src.integer(1, 3)
    catalogue = generated.catalogue
    used = {decl.type_id for decl in generated.model.struct_types}
    first = SHAPED_IDS
    while any(first + k in used for k in range(levels)):
        first += 1000
    catalogue.declarations[first] = L.Declaration(first, L.Structure([("v", gen_leaf_tensor(src, False))]))
    for type_id in range(first + 1, first + levels):
        fields = [(f"p{index}", L.Ref(type_id - 1)) for index in range(fan)]
        if src.boolean():
            fields.append(("own", gen_leaf_tensor(src, False)))
        catalogue.declarations[type_id] = L.Declaration(type_id, L.Structure(fields), name=f"Level{type_id - first}")
    top = first + levels - 1
    catalogue.reserved.update(range(first, top + 1))
    model = generated.model
    for type_id in range(first, top + 1):
        model.struct_types.insert(src.integer(0, len(model.struct_types)),
                                  L.declaration_proto(catalogue.declarations[type_id]))
    tp = schema.TypeProto()
    tp.struct_type.type_ref = top
    graph = model.graph
    graph.input.append(value_info("shaped_in", tp))
    graph.output.append(value_info("shaped_out", tp))
    graph.node.add(op_type="Identity", input=["shaped_in"], output=["shaped_out"], name="shaped_node")
    graph.persistent_bindings.add(input_name="shaped_in", output_name="shaped_out")
    generated.bindings.append(("shaped_in", "shaped_out"))
    return top


def gen_plain_model(src: Source, max_values: int = 6) -> Generated:
    """A valid model: catalogue (optionally with the spec's declarations), encoded initializers of
    every branch, dense initializers, graph inputs/outputs with persistent bindings, and last (so that
    recorded seeds replay unchanged) possibly a deep or diamond-shaped block bound as state."""
    model = schema.ModelProto(ir_version=10, producer_name="fuzz")
    model.opset_import.add(domain="", version=23)
    generated = Generated(model)
    generated.catalogue = gen_catalogue(src)
    with_spec = src.chance(1, 3)
    declarations = [L.declaration_proto(d) for d in generated.catalogue.declarations.values()]
    if with_spec:
        declarations += examples.spec_struct_types()
    model.struct_types.extend(src.permutation(declarations))
    graph = model.graph
    graph.name = "fuzz"
    for index in range(src.integer(0, 2)):
        dense = schema.TensorProto(name=f"dense{index}", data_type=dtypes.FLOAT, dims=[2])
        dense.float_data.extend([1.0, float(index)])
        graph.initializer.append(dense)
    for index in range(src.integer(0, max_values)):
        name = src.choice(("w", "v", "cache.k", "b\\c")) + str(index)
        branch = src.integer(0, 2)
        if branch == 0:
            value, expected, payload = gen_affine_value(src, name)
        elif branch == 1 and with_spec:
            value, expected, payload = gen_spec_value(src, name)
        else:
            value, expected, payload = gen_struct_value(src, generated.catalogue, name)
        attach_payload(src, value, payload, generated.files, expected.large)
        if expected.large:
            kind = expected.affine["granularity"] if expected.affine else "records"
            generated.tags += ["size:remainder", f"size:{kind}"] + (["size:external"] * value.data_location)
        graph.encoded_initializer.append(value)
        generated.values[name] = expected
    gen_graph_io(src, generated)
    gen_shaped_block(src, generated)
    return generated


# ------------------------------------------------------------------------------- runtime values
def runtime_value(tp, declarations: dict, memo: dict | None = None):
    """A value of TypeProto ``tp`` for a graph input: zero tensors (dim_params and unknown dims are 1),
    empty sequences and maps, absent optionals, and structs built field by field. A referenced
    declaration is built once and shared by every parent (``memo``, by type_id), as a runtime holds
    shared sub-structures: a diamond-typed value stays linear in the catalogue's size."""
    from reference_impl.values import StructValue, numpy_dtype

    memo = {} if memo is None else memo
    which = tp.WhichOneof("value")
    if which == "tensor_type":
        tensor = tp.tensor_type
        dims = [d.dim_value if d.WhichOneof("value") == "dim_value" else 1 for d in tensor.shape.dim]
        if tensor.elem_type == dtypes.STRING:
            return np.full(dims, "s", dtype=object)
        return np.zeros(dims, dtype=numpy_dtype(tensor.elem_type))
    if which == "sequence_type":
        return []
    if which == "map_type":
        return {}
    if which in ("optional_type", None):
        return None
    st = tp.struct_type
    kind = st.WhichOneof("kind")
    if kind is None:
        return StructValue({})
    if kind == "type_ref":
        if st.type_ref not in memo:
            memo[st.type_ref] = _struct_value(declarations[st.type_ref], st.type_ref, declarations, memo)
        return memo[st.type_ref]
    return _struct_value(st, None, declarations, memo)


def _struct_value(st, type_id, declarations: dict, memo: dict):
    from reference_impl.values import StructValue

    fields = {}
    if st.WhichOneof("kind") == "structure":  # arrays and bit packings carry no fields of their own
        for item in st.structure.field:
            if item.WhichOneof("content") == "type":
                fields[item.name] = runtime_value(item.type, declarations, memo)
    return StructValue(fields, type_id)



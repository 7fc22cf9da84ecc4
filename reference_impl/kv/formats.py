"""Block representations for paged K/V caches.

A block of K (or V) is logically FLOAT[tokens, heads, head_size] (token-major, so a growing dense
block is a contiguous byte prefix). It is stored as one of:

* ``dense``: the FLOAT tensor itself (no encoding);
* ``int8``/``uint8``/``int4``/``uint4``/``int2``/``uint2``: an encoded value in the built-in affine branch,
  blocked along head_size (``int4/32``: one scale, and for unsigned types one zero point, per 32 values);
* ``codebook2``: an encoded value of the spec's SCALED_CODEBOOK2_BLOCK_32 (1102 -> 1101), 32 two-bit
  indices and a scale per record.

The block struct declares its ``key`` and ``value`` fields as FLOAT tensors: an encoded value stands for
the tensor its logical type names (logical meaning and physical representation are independent).

``BlockCodec`` is bound once per value (layout checked against the payload size) and decodes one block
into a fresh float32 array; nothing here ever decodes more than one block.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from reference_impl import affine, dtypes, schema
from reference_impl.bits import pack_sub_byte
from reference_impl.decoders import DecoderRegistry, default_registry
from reference_impl.errors import ErrorCode as E
from reference_impl.errors import violation
from reference_impl.records import compile_layout
from reference_impl.structs import Catalogue
from reference_impl.tensors import to_array
from reference_impl.values import EncodedValue

KV_BLOCK = 3100
KV_PAGED_CACHE = 3101
SCALED_CODEBOOK2_BLOCK_32 = 1102
CODEBOOK_TABLE = np.array([-1.0, -0.25, 0.25, 1.0], np.float32)  # type 1101's constant

_BLOCK_TENSOR = 'tensor_type {{ elem_type: 1 shape {{ dim {{ dim_param: "tokens" }} dim {{ dim_param: "kv_heads" }} ' \
    'dim {{ dim_param: "{size}" }} }} }}'
KV_CATALOGUE_TEXT = f"""
struct_types {{
  type_id: 3100
  name: "KV_BLOCK"
  doc_string: "One K/V block: first token position, valid tokens, K and V as FLOAT[tokens, kv_heads, head_size]."
  structure {{
    field {{ name: "start" type {{ tensor_type {{ elem_type: 7 shape {{ }} }} }} }}
    field {{ name: "valid_length" type {{ tensor_type {{ elem_type: 7 shape {{ }} }} }} }}
    field {{ name: "key" type {{ {_BLOCK_TENSOR.format(size="head_size")} }} }}
    field {{ name: "value" type {{ {_BLOCK_TENSOR.format(size="v_head_size")} }} }}
  }}
}}
struct_types {{
  type_id: 3101
  name: "KV_PAGED_CACHE"
  doc_string: "The block table in logical order, and the number of valid tokens."
  structure {{
    field {{ name: "blocks" type {{ sequence_type {{ elem_type {{ struct_type {{ type_ref: 3100 }} }} }} }} }}
    field {{ name: "length" type {{ tensor_type {{ elem_type: 7 shape {{ }} }} }} }}
  }}
}}
"""

_AFFINE = {"int8": dtypes.INT8, "uint8": dtypes.UINT8, "int4": dtypes.INT4, "uint4": dtypes.UINT4,
           "int2": dtypes.INT2, "uint2": dtypes.UINT2}
NAMES = ("dense", *_AFFINE, "codebook2")


def kv_struct_types() -> list:
    """The paged-cache declarations plus the spec's codebook types they use (1101, 1102)."""
    from reference_impl.examples import spec_struct_types

    codebook = [st for st in spec_struct_types() if st.type_id in (1101, 1102)]
    return codebook + list(schema.parse_text(KV_CATALOGUE_TEXT).struct_types)


def kv_catalogue() -> Catalogue:
    catalogue = Catalogue(kv_struct_types())
    catalogue.check_all()
    return catalogue


def kv_registry() -> DecoderRegistry:
    """The decoders blocks are read with (the default registry: the codebook's)."""
    return default_registry()


# ----------------------------------------------------------------------------- formats
@dataclass(frozen=True)
class BlockFormat:
    """A block representation: ``dense``, an affine type with an optional group, or ``codebook2``."""

    name: str
    group: int | None = None

    @classmethod
    def parse(cls, text: str | BlockFormat) -> BlockFormat:
        if isinstance(text, BlockFormat):
            return text
        name, _, group = str(text).partition("/")
        if name not in NAMES or (group and (name not in _AFFINE or not group.isdigit() or int(group) <= 0)):
            raise violation(E.KV_BLOCK_INVALID, "kv.format", f"unknown block format {text!r}; use one of {NAMES}"
                            " (affine types may add /group)")
        return cls(name, int(group) if group else None)

    @property
    def storage_type(self) -> int | None:
        return _AFFINE.get(self.name)

    def __str__(self) -> str:
        return self.name if self.group is None else f"{self.name}/{self.group}"

    def check_block(self, tokens: int, heads: int, head_size: int, path: str) -> None:
        """Whether a full block of this geometry can be encoded, checked before anything is written:
        the codebook packs whole 32-value records (affine formats pad their last group)."""
        values = tokens * heads * head_size
        if self.name == "codebook2" and values % 32:
            raise violation(E.KV_BLOCK_INVALID, path,
                            f"codebook2 needs a multiple of 32 values per block; {tokens} tokens x {heads} heads x "
                            f"{head_size} = {values}")


DENSE = BlockFormat("dense")


def _header(layout_setter, shape: tuple[int, ...]):
    header = schema.EncodedValueProto()
    layout_setter(header)
    tensor = header.logical_type.tensor_type
    tensor.elem_type = dtypes.FLOAT
    tensor.shape.SetInParent()
    for dim in shape:
        tensor.shape.dim.add(dim_value=dim)
    return header


def _struct_value(type_id: int, payload: bytes | np.ndarray, shape: tuple[int, ...]) -> EncodedValue:
    header = _header(lambda h: setattr(h.struct_type, "type_ref", type_id), shape)
    if isinstance(payload, (bytes, bytearray)):
        payload = np.frombuffer(payload, np.uint8)
    return EncodedValue(header, payload)


def _affine_parameters(groups: np.ndarray, storage_type: int) -> tuple[np.ndarray, np.ndarray | None]:
    """Per-group scale (and zero point for unsigned types) covering each group's range."""
    low, high = affine.code_range(storage_type)
    if storage_type in dtypes.SIGNED_INTEGERS:
        amax = np.max(np.abs(groups), axis=-1)
        return np.where(amax > 0, amax / high, 1.0).astype(np.float32), None
    lo = np.minimum(np.min(groups, axis=-1), 0.0)
    hi = np.maximum(np.max(groups, axis=-1), 0.0)
    scale = np.where(hi > lo, (hi - lo) / (high - low), 1.0).astype(np.float32)
    zero_point = np.clip(np.rint(low - lo / scale), low, high).astype(np.int64)
    return scale, zero_point


def encode_block(x: np.ndarray, fmt: BlockFormat | str) -> EncodedValue | np.ndarray:
    """A FLOAT[tokens, heads, head_size] block in the given format (``dense``: the float32 tensor)."""
    fmt = BlockFormat.parse(fmt)
    x = np.ascontiguousarray(x, dtype=np.float32)
    shape = x.shape
    if fmt.name == "dense":
        return x
    if fmt.storage_type is not None:
        head = shape[2]
        group = min(fmt.group or head, head)
        padded_head = -(-head // group) * group
        padded = np.zeros(shape[:2] + (padded_head,), np.float32)
        padded[..., :head] = x
        scale, zero_point = _affine_parameters(padded.reshape(shape[:2] + (-1, group)), fmt.storage_type)
        proto = affine.make_affine_value(x, fmt.storage_type, scale, zero_point, axis=2, block_size=group)
        payload = np.frombuffer(proto.raw_data, np.uint8)
        proto.ClearField("raw_data")
        return EncodedValue(proto, payload)
    flat = x.reshape(-1)
    if flat.size % 32:
        raise violation(E.KV_BLOCK_INVALID, "kv.format", f"codebook2 needs a multiple of 32 values, got {flat.size}")
    groups = flat.reshape(-1, 32)
    scale = np.max(np.abs(groups), axis=1).astype(np.float32)
    normalized = groups / np.where(scale > 0, scale, 1.0)[:, None]
    index = np.argmin(np.abs(normalized[:, :, None] - CODEBOOK_TABLE[None, None, :]), axis=2)
    codes = np.frombuffer(pack_sub_byte(index.reshape(-1), 2), np.uint8).reshape(-1, 8)
    records = np.hstack([codes, scale.astype("<f4").reshape(-1, 1).view(np.uint8)])
    return _struct_value(SCALED_CODEBOOK2_BLOCK_32, records.tobytes(), shape)


# ----------------------------------------------------------------------------- decoding
class BlockCodec:
    """Decodes one block value (a float32 tensor or an encoded value) to float32 [tokens, heads, head_size];
    bound once per value."""

    def __init__(self, value: EncodedValue | np.ndarray, heads: int, head_size: int, catalogue: Catalogue,
                 registry: DecoderRegistry, path: str):
        self.path = path
        self.parameter_bytes = 0  # affine scales and zero points carried in the header
        if isinstance(value, np.ndarray):
            self._bind_dense(value, heads, head_size)
            return
        header = value.header
        tensor = header.logical_type.tensor_type
        dims = tuple(d.dim_value for d in tensor.shape.dim)
        if header.logical_type.WhichOneof("value") != "tensor_type" or tensor.elem_type != dtypes.FLOAT \
                or len(dims) != 3 or dims[1:] != (heads, head_size) or dims[0] <= 0:
            raise violation(E.KV_BLOCK_INVALID, f"{path}.logical_type",
                            f"a block is FLOAT[tokens, {heads}, {head_size}], got {dims}")
        self.shape = dims
        self.count = dims[0] * heads * head_size
        layout = header.WhichOneof("layout")
        if layout == "affine":
            self._bind_affine(header.affine, value.payload.nbytes)
        elif layout == "struct_type" and header.struct_type.WhichOneof("kind") == "type_ref":
            self.kind = "struct"
            self.layout = compile_layout(header.struct_type, catalogue, f"{path}.struct_type")
            self.decoder = registry.bind(header.struct_type.type_ref, self.layout, f"{path}.struct_type")
            if value.payload.nbytes % self.layout.record_bytes:
                raise violation(E.PAYLOAD_PARTIAL_RECORD, path, "payload is not a whole number of records")
        else:
            raise violation(E.CONSUMER_MISSING, f"{path}.struct_type", "a block needs an affine layout or a type_ref")

    def _bind_dense(self, value: np.ndarray, heads: int, head_size: int) -> None:
        if value.dtype != np.float32 or value.ndim != 3 or value.shape[1:] != (heads, head_size) \
                or value.shape[0] <= 0:
            raise violation(E.KV_BLOCK_INVALID, self.path,
                       f"a dense block is float32[tokens, {heads}, {head_size}], got {value.dtype}{list(value.shape)}")
        self.kind = "dense"
        self.shape = value.shape
        self.count = value.size

    def _bind_affine(self, layout, nbytes: int) -> None:
        self.kind = "affine"
        self.storage_type = layout.storage_type
        if self.storage_type not in affine.STORAGE_TYPES:
            raise violation(E.AFFINE_STORAGE_INVALID, f"{self.path}.affine.storage_type", "not an affine type")
        self.scale = to_array(layout.scale, f"{self.path}.affine.scale").astype(np.float32)
        self.zero_point = to_array(layout.zero_point, f"{self.path}.affine.zero_point").astype(np.int64) \
            if layout.HasField("zero_point") else None
        self.axis = affine.normalize_axis(layout.axis, 3, f"{self.path}.affine.axis") \
            if layout.HasField("axis") else None
        self.block_size = layout.block_size if layout.HasField("block_size") else None
        expected = affine.parameter_shape(self.shape, self.axis, self.block_size)
        if self.scale.shape != expected or (self.zero_point is not None and self.zero_point.shape != expected):
            raise violation(E.AFFINE_PARAM_SHAPE, f"{self.path}.affine", f"parameters need shape {expected}")
        self.parameter_bytes = self.scale.nbytes + (0 if self.zero_point is None else affine.payload_bytes(
            self.storage_type, self.zero_point.size))
        if nbytes != affine.payload_bytes(self.storage_type, self.count):
            raise violation(E.AFFINE_PAYLOAD_SIZE, self.path, f"{nbytes} payload bytes for {self.count} codes")

    @property
    def signature(self) -> tuple | None:
        """Blocks whose codecs share a signature decode together (``decode_many``): the payloads and
        parameters of full blocks concatenate along the token axis. None: this block decodes alone."""
        found = self.__dict__.get("_signature", False)
        if found is False:
            found = self._signature = self._make_signature()
        return found

    def _make_signature(self) -> tuple | None:
        if self.kind == "dense":
            return ("dense", self.shape)
        if self.kind == "affine":
            bits = dtypes.BIT_WIDTH[self.storage_type]
            if self.axis != 2 or not self.block_size or (self.count * bits) % 8:
                return None  # per-tensor or per-channel parameters do not stack along the tokens
            return ("affine", self.shape, self.storage_type, self.block_size, self.scale.shape,
                    self.zero_point is None)
        return ("struct", self.shape, id(self.decoder), self.layout.record_bytes)

    @property
    def decode_cost(self) -> int:
        """Bytes of scratch decoding this block takes: its float32 values, four times that for a
        registered decoder (the codebook's gathers through wide bit windows)."""
        return self.count * 4 * (4 if self.kind == "struct" else 1)

    def decode(self, value: EncodedValue | np.ndarray) -> np.ndarray:
        """The block's float32 [tokens, heads, head_size] values (a dense block is returned as is)."""
        if self.kind == "dense":
            return value
        payload = value.payload
        if self.kind == "affine":
            if self.axis == 2 and self.block_size:
                return _dequantize_heads(payload, self.storage_type, self.scale, self.zero_point, self.shape,
                                         self.block_size)
            return affine.dequantize(payload, self.storage_type, self.scale, self.zero_point, self.axis,
                                     self.block_size, self.shape)
        flat = self.decoder.decode(self.layout, payload)
        if flat.size != self.count:
            raise violation(E.LOGICAL_SHAPE_MISMATCH, self.path, f"decoder produced {flat.size} of {self.count} values")
        return flat.astype(np.float32, copy=False).reshape(self.shape)


def decode_many(codecs: list[BlockCodec], values: list) -> np.ndarray:
    """The blocks' values stacked along the token axis, decoded in one pass; every codec must have the
    same (non-None) ``signature``. Dense blocks are copied into one array, encoded ones decoded once."""
    first = codecs[0]
    if len(codecs) == 1:
        return first.decode(values[0])
    tokens = first.shape[0] * len(codecs)
    shape = (tokens,) + first.shape[1:]
    if first.kind == "dense":
        return np.concatenate(values, axis=0)
    payload = np.concatenate([value.payload for value in values])
    if first.kind == "affine":
        scale = np.concatenate([codec.scale for codec in codecs], axis=0)
        zero_point = None if first.zero_point is None else np.concatenate([c.zero_point for c in codecs], axis=0)
        return _dequantize_heads(payload, first.storage_type, scale, zero_point, shape, first.block_size)
    flat = first.decoder.decode(first.layout, payload)
    if flat.size != first.count * len(codecs):
        raise violation(E.LOGICAL_SHAPE_MISMATCH, first.path,
                        f"decoder produced {flat.size} values for {len(codecs)} blocks")
    return flat.astype(np.float32, copy=False).reshape(shape)


def _dequantize_heads(payload: np.ndarray, storage_type: int, scale: np.ndarray, zero_point, shape: tuple,
                      group: int) -> np.ndarray:
    """DequantizeLinear of FLOAT[tokens, heads, head_size] codes blocked along head_size (axis 2) by
    ``group``: (code - zero_point) * scale with the parameters broadcast over each group. When the group
    does not divide head_size, the general ``affine.dequantize`` handles the short last group."""
    tokens, heads, size = shape
    if size % group:
        return affine.dequantize(payload, storage_type, scale, zero_point, 2, group, shape)
    codes = affine.codes_as_float(payload, storage_type, tokens * heads * size, np.float32)
    blocks = codes.reshape(tokens, heads, size // group, group)
    if zero_point is not None:
        blocks -= zero_point[..., None].astype(np.float32)
    blocks *= scale[..., None]
    return codes.reshape(shape)


def decode_factored(codecs: list[BlockCodec], values: list) -> tuple[np.ndarray, np.ndarray | None]:
    """Like ``decode_many``, but for symmetric affine blocks with one scale per token and head (the group is
    the whole head) returns the codes as floats and the scales apart, (codes [t, H, D], scale [t, H]):
    the values are codes * scale[..., None], and attention applies the scale to the t scores (or weights)
    instead of the t x D values. Any other representation: (decoded values, None)."""
    first = codecs[0]
    if first.kind != "affine" or first.zero_point is not None or first.axis != 2 \
            or first.block_size != first.shape[2] or first.signature is None:
        return decode_many(codecs, values), None
    tokens = first.shape[0] * len(codecs)
    payload = values[0].payload if len(values) == 1 else np.concatenate([value.payload for value in values])
    scale = first.scale if len(codecs) == 1 else np.concatenate([codec.scale for codec in codecs], axis=0)
    codes = affine.codes_as_float(payload, first.storage_type, tokens * first.shape[1] * first.shape[2], np.float32)
    return codes.reshape((tokens,) + first.shape[1:]), scale.reshape(tokens, first.shape[1])

"""Paged K/V caches: a block table of immutable blocks, each K and V in its own representation.

A ``PagedKVCache`` is a value: ``append`` and ``convert`` return a new cache that shares every
unchanged block with the old one, so a retained state or returned output is never disturbed. Blocks
(``KVBlock``) carry their token range as data: ``start`` (absolute position of the first token) and
``valid`` (tokens in use; the payload may hold more physical slots). Consecutive blocks cover
consecutive positions.

The last block may be *open*: a dense block whose payload is a prefix of a fixed-capacity allocation
(``KVStorage``), so appending writes only the new tokens behind it. When it fills it is sealed:
kept as is for ``dense`` or encoded into the cache's key/value formats.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from reference_impl.errors import ErrorCode as E
from reference_impl.errors import fail
from reference_impl.kv import contiguous
from reference_impl.kv.formats import (
    DENSE,
    KV_BLOCK,
    KV_PAGED_CACHE,
    BlockCodec,
    BlockFormat,
    decode_many,
    encode_block,
    kv_catalogue,
    kv_registry,
)
from reference_impl.kv.storage import KVCounters, KVStorage, check_cancel, check_capacity, record, storage_of
from reference_impl.values import EncodedValue, StructValue

_CATALOGUE = None
_REGISTRY = None


def _bindings():
    """The catalogue and registry blocks are decoded with (built once, read-only afterwards)."""
    global _CATALOGUE, _REGISTRY
    if _REGISTRY is None:
        _CATALOGUE, _REGISTRY = kv_catalogue(), kv_registry()
    return _CATALOGUE, _REGISTRY


@dataclass(frozen=True)
class KVBlock:
    """Positions [start, start + valid) of K and V; ``key``/``value`` are FLOAT[tokens, H, D] tensors (dense
    blocks) or encoded values of that logical type."""

    start: int
    valid: int
    key: EncodedValue | np.ndarray
    value: EncodedValue | np.ndarray
    key_codec: BlockCodec = field(repr=False, compare=False)
    value_codec: BlockCodec = field(repr=False, compare=False)

    @property
    def tokens(self) -> int:
        """Physical token slots of the payload (>= valid)."""
        return self.key_codec.shape[0]

    def decode(self) -> tuple[np.ndarray, np.ndarray]:
        """This block's valid K and V as float32 [valid, H, D] (one block of workspace)."""
        k = self.key_codec.decode(self.key)[: self.valid]
        v = self.value_codec.decode(self.value)[: self.valid]
        return k, v


#: A group of blocks decoded together holds at most this many bytes of decoded keys and this many tokens
#: (or one block): the attention workspace is bounded by a group, whatever the context.
GROUP_BYTES = 1 << 18
GROUP_TOKENS = 256


@dataclass(frozen=True)
class BlockGroup:
    """Consecutive blocks read together: positions [start, stop) of the cache, all valid tokens."""

    blocks: tuple[KVBlock, ...]

    @property
    def start(self) -> int:
        return self.blocks[0].start

    @property
    def stop(self) -> int:
        return self.blocks[-1].start + self.blocks[-1].valid

    @property
    def allocates(self) -> bool:
        """Whether decoding allocates (a lone dense block is read in place)."""
        return len(self.blocks) > 1 or "dense" not in (self.blocks[0].key_codec.kind, self.blocks[0].value_codec.kind)

    def decode(self) -> tuple[np.ndarray, np.ndarray]:
        """The group's valid K and V as float32 [tokens, H, D] (one group of workspace)."""
        if len(self.blocks) == 1:
            return self.blocks[0].decode()
        keys = decode_many([b.key_codec for b in self.blocks], [b.key for b in self.blocks])
        values = decode_many([b.value_codec for b in self.blocks], [b.value for b in self.blocks])
        return keys, values


def block_groups(blocks, budget: int = GROUP_BYTES):
    """The blocks in order, in groups that decode together: consecutive full blocks whose key codecs and
    value codecs share signatures, until the decoded keys would exceed ``budget`` bytes. A partial block
    (payload slots beyond its valid tokens) or one without a signature forms its own group."""
    group: list[KVBlock] = []
    signature = None
    for block in blocks:
        mine = (block.key_codec.signature, block.value_codec.signature)
        full = block.valid == block.tokens and None not in mine
        size = block.key_codec.decode_cost
        if group and (not full or mine != signature or (len(group) + 1) * size > budget
                      or (len(group) + 1) * block.tokens > GROUP_TOKENS):
            yield BlockGroup(tuple(group))
            group = []
        if full:
            group.append(block)
            signature = mine
        else:
            yield BlockGroup((block,))
    if group:
        yield BlockGroup(tuple(group))


def make_block(start: int, valid: int, key: EncodedValue | np.ndarray, value: EncodedValue | np.ndarray,
               geometry: tuple[int, int, int], path: str = "kv.block") -> KVBlock:
    """Bind and check one block (layouts against payload sizes, token range against slots)."""
    heads, head_size, v_head_size = geometry
    catalogue, registry = _bindings()
    for name, item in (("key", key), ("value", value)):
        if not isinstance(item, (EncodedValue, np.ndarray)):
            raise fail(E.KV_BLOCK_INVALID, f"{path}.{name}",
                       f"expected a float tensor or an encoded value, got {type(item).__name__}")
    key_codec = BlockCodec(key, heads, head_size, catalogue, registry, f"{path}.key")
    value_codec = BlockCodec(value, heads, v_head_size, catalogue, registry, f"{path}.value")
    if key_codec.shape[0] != value_codec.shape[0]:
        raise fail(E.KV_BLOCK_INVALID, path, "key and value blocks hold different token counts")
    if not 0 < valid <= key_codec.shape[0] or start < 0:
        raise fail(E.KV_BLOCK_INVALID, path,
                   f"token range start={start} valid={valid} does not fit {key_codec.shape[0]} slots")
    return KVBlock(int(start), int(valid), key, value, key_codec, value_codec)


def _open_prefix(value: EncodedValue | np.ndarray, valid: int, row: int) -> np.ndarray | None:
    """The growable (1, 1, valid, row) float view behind an open dense block, if any."""
    if not isinstance(value, np.ndarray):
        return None
    storage = storage_of(value)
    if storage is None or storage.token_major or storage.heads != 1 or storage.data.shape[3] != row:
        return None
    if value.__array_interface__["data"][0] != storage.address or value.nbytes != valid * row * storage.data.itemsize:
        return None
    return storage.view(valid)


@dataclass(frozen=True)
class PagedKVCache:
    """One sequence's K/V as a block table. Geometry: ``kv_heads``, ``head_size``, ``v_head_size``."""

    kv_heads: int
    head_size: int
    v_head_size: int
    block_size: int
    blocks: tuple[KVBlock, ...] = ()

    def __post_init__(self):
        check_capacity(self.block_size, "kv.paged.block_size")
        previous = None
        for index, block in enumerate(self.blocks):
            if previous is not None and block.start != previous.start + previous.valid:
                raise fail(E.KV_BLOCK_INVALID, f"kv.paged.blocks[{index}].start",
                           f"starts at {block.start}, the previous block ends at {previous.start + previous.valid}")
            if block.tokens > self.block_size:
                raise fail(E.KV_BLOCK_INVALID, f"kv.paged.blocks[{index}]",
                           f"{block.tokens} slots exceed the block size {self.block_size}")
            previous = block

    @property
    def geometry(self) -> tuple[int, int, int]:
        return self.kv_heads, self.head_size, self.v_head_size

    @property
    def count(self) -> int:
        """Valid tokens in the cache."""
        return sum(block.valid for block in self.blocks)

    @property
    def end(self) -> int:
        """Absolute position after the last token."""
        return self.blocks[-1].start + self.blocks[-1].valid if self.blocks else 0

    @property
    def formats(self) -> list[tuple[str, str]]:
        return [(_format_name(b.key_codec), _format_name(b.value_codec)) for b in self.blocks]

    # ------------------------------------------------------------------------- append
    def append(self, key: np.ndarray, value: np.ndarray, key_format: BlockFormat | str = DENSE,
               value_format: BlockFormat | str = DENSE, cancel=None) -> PagedKVCache:
        """A cache with ``key``/``value`` [H, n, D] appended; full blocks are sealed in the formats.

        Everything is checked, and cancellation observed, before the first write; once writing starts
        the append completes, so a cancelled append leaves no reservation behind in any open block.
        """
        key_format, value_format = self.check_formats(key_format, value_format)
        key, value = self._check_tokens(key, value)
        blocks = list(self.blocks)
        check_cancel(cancel, "kv.paged.append")  # the only checkpoint: an append is all or nothing
        position, total = 0, key.shape[0]
        while position < total:
            last = blocks[-1] if blocks else None
            prefixes = self._open_prefixes(last)
            if prefixes is None:
                take = min(self.block_size, total - position)
                start = last.start + last.valid if last is not None else 0
                prefixes = tuple(contiguous.empty_cache(1, 1, row, self.block_size)
                                 for row in (self.kv_heads * self.head_size, self.kv_heads * self.v_head_size))
                blocks.append(None)
            else:
                take = min(self.block_size - last.valid, total - position)
                start = last.start
            chunk = slice(position, position + take)
            grown = (contiguous.append(prefixes[0], key[chunk].reshape(1, 1, take, -1)),
                     contiguous.append(prefixes[1], value[chunk].reshape(1, 1, take, -1)))
            block = self._dense_block(start, grown)
            if block.valid == self.block_size:
                block = seal(block, key_format, value_format, self.geometry)
            blocks[-1] = block
            position += take
        return replace(self, blocks=tuple(blocks))

    def check_formats(self, key_format: BlockFormat | str, value_format: BlockFormat | str,
                      path: str = "kv.paged") -> tuple[BlockFormat, BlockFormat]:
        """Parse the formats full blocks are sealed in and check they fit this cache's block geometry."""
        key_format, value_format = BlockFormat.parse(key_format), BlockFormat.parse(value_format)
        key_format.check_block(self.block_size, self.kv_heads, self.head_size, f"{path}.key_format")
        value_format.check_block(self.block_size, self.kv_heads, self.v_head_size, f"{path}.value_format")
        return key_format, value_format

    def _check_tokens(self, key, value) -> tuple[np.ndarray, np.ndarray]:
        """[H, n, D] (or [1, H, n, D]) float32 -> token-major [n, H, D] (copies only the new tokens)."""
        out = []
        for name, x, size in (("key", key, self.head_size), ("value", value, self.v_head_size)):
            x = np.asarray(x)
            if x.ndim == 4 and x.shape[0] == 1:
                x = x[0]
            if x.ndim != 3 or x.shape[0] != self.kv_heads or x.shape[2] != size or x.dtype != np.float32:
                raise fail(E.KV_SHAPE_MISMATCH, f"kv.paged.append.{name}",
                           f"expected float32 [{self.kv_heads}, n, {size}], got {x.dtype}{list(x.shape)}")
            out.append(np.ascontiguousarray(x.transpose(1, 0, 2)))
        if out[0].shape[0] != out[1].shape[0]:
            raise fail(E.KV_SHAPE_MISMATCH, "kv.paged.append", "key and value token counts differ")
        return out[0], out[1]

    def _open_prefixes(self, block: KVBlock | None):
        if block is None or block.valid >= self.block_size or block.valid != block.tokens:
            return None
        key = _open_prefix(block.key, block.valid, self.kv_heads * self.head_size)
        value = _open_prefix(block.value, block.valid, self.kv_heads * self.v_head_size)
        return None if key is None or value is None else (key, value)

    def _dense_block(self, start: int, grown: tuple[np.ndarray, np.ndarray]) -> KVBlock:
        valid = grown[0].shape[2]
        key = grown[0].reshape(valid, self.kv_heads, self.head_size)
        value = grown[1].reshape(valid, self.kv_heads, self.v_head_size)
        return make_block(start, valid, key, value, self.geometry)

    # ------------------------------------------------------------------------- conversion
    def convert(self, indices: Sequence[int], key_format: BlockFormat | str | None = None,
                value_format: BlockFormat | str | None = None) -> PagedKVCache:
        """Re-encode the selected blocks (one at a time); the other blocks are shared unchanged."""
        blocks = list(self.blocks)
        for index in indices:
            if not -len(blocks) <= index < len(blocks):
                raise fail(E.KV_BLOCK_INVALID, f"kv.paged.blocks[{index}]", f"no block {index}")
            block = blocks[index]
            k, v = block.key_codec.decode(block.key), block.value_codec.decode(block.value)
            new_key = block.key if key_format is None else _encode(k, key_format)
            new_value = block.value if value_format is None else _encode(v, value_format)
            blocks[index] = make_block(block.start, block.valid, new_key, new_value, self.geometry)
        return replace(self, blocks=tuple(blocks))

    def dequantized(self) -> tuple[np.ndarray, np.ndarray]:
        """The dense (1, H, count, D) equivalent. For tests and comparisons only: this materializes
        the whole cache, which attention over the cache never does."""
        keys, values = zip(*(block.decode() for block in self.blocks)) if self.blocks else ((), ())
        k = np.concatenate(keys, axis=0) if keys else np.zeros((0, self.kv_heads, self.head_size), np.float32)
        v = np.concatenate(values, axis=0) if values else np.zeros((0, self.kv_heads, self.v_head_size),
                                                                    np.float32)
        return k.transpose(1, 0, 2)[None], v.transpose(1, 0, 2)[None]

    def payload_bytes(self) -> int:
        """Bytes of the blocks' payloads (codes or records)."""
        return sum(b.key.nbytes + b.value.nbytes for b in self.blocks)

    def stored_bytes(self) -> int:
        """Payload bytes plus per-value affine parameters (scales and zero points) in the headers."""
        return self.payload_bytes() + sum(c.parameter_bytes for b in self.blocks
                                          for c in (b.key_codec, b.value_codec))

    # ------------------------------------------------------------------------- struct form
    def to_struct(self) -> StructValue:
        """The cache as a KV_PAGED_CACHE struct value (shares every block payload)."""
        blocks = [StructValue({"start": np.array(b.start, np.int64), "valid_length": np.array(b.valid, np.int64),
                               "key": b.key, "value": b.value}, KV_BLOCK) for b in self.blocks]
        return StructValue({"blocks": blocks, "length": np.array(self.count, np.int64)}, KV_PAGED_CACHE)

    @classmethod
    def from_struct(cls, value, kv_heads: int, head_size: int, v_head_size: int, block_size: int,
                    path: str = "cache") -> PagedKVCache:
        """Adopt a KV_PAGED_CACHE struct value, checking every block's layout and token range."""
        if not isinstance(value, StructValue) or value.type_id != KV_PAGED_CACHE:
            raise fail(E.KV_BLOCK_INVALID, path, "expected a KV_PAGED_CACHE struct value")
        geometry = (kv_heads, head_size, v_head_size)
        blocks = []
        for index, item in enumerate(value["blocks"]):
            where = f"{path}.blocks[{index}]"
            if not isinstance(item, StructValue) or item.type_id != KV_BLOCK:
                raise fail(E.KV_BLOCK_INVALID, where, "expected a KV_BLOCK struct value")
            blocks.append(make_block(_scalar(item["start"], f"{where}.start"),
                                     _scalar(item["valid_length"], f"{where}.valid_length"),
                                     item["key"], item["value"], geometry, where))
        cache = cls(kv_heads, head_size, v_head_size, block_size, tuple(blocks))
        if _scalar(value["length"], f"{path}.length") != cache.count:
            raise fail(E.KV_BLOCK_INVALID, f"{path}.length", f"length is not the {cache.count} valid tokens")
        return cache


def struct_geometry(value, path: str = "cache") -> tuple[int, int, int] | None:
    """(kv_heads, head_size, v_head_size) of a KV_PAGED_CACHE struct value, read from its first block's
    logical types; None when it has no blocks yet. ``from_struct`` then checks every block against it."""
    if not isinstance(value, StructValue) or value.type_id != KV_PAGED_CACHE:
        raise fail(E.KV_BLOCK_INVALID, path, "expected a KV_PAGED_CACHE struct value")
    blocks = value["blocks"]
    if not blocks:
        return None
    first, where = blocks[0], f"{path}.blocks[0]"
    if not isinstance(first, StructValue) or first.type_id != KV_BLOCK:
        raise fail(E.KV_BLOCK_INVALID, where, "expected a KV_BLOCK struct value")
    dims = []
    for name in ("key", "value"):
        item = first[name]
        if isinstance(item, np.ndarray):
            shape = item.shape
        elif isinstance(item, EncodedValue):
            logical = item.header.logical_type
            shape = tuple(d.dim_value for d in logical.tensor_type.shape.dim) \
                if logical.WhichOneof("value") == "tensor_type" else ()
        else:
            raise fail(E.KV_BLOCK_INVALID, f"{where}.{name}",
                       f"expected a float tensor or an encoded value, got {type(item).__name__}")
        if len(shape) != 3 or min(shape) <= 0:
            raise fail(E.KV_BLOCK_INVALID, f"{where}.{name}.logical_type",
                       f"a block is FLOAT[tokens, heads, head_size] with positive sizes, got {shape}")
        dims.append(shape)
    if dims[0][1] != dims[1][1]:
        raise fail(E.KV_BLOCK_INVALID, f"{where}.value.logical_type",
                   f"the value block has {dims[1][1]} heads, the key block {dims[0][1]}")
    return dims[0][1], dims[0][2], dims[1][2]


def _scalar(value, path: str) -> int:
    array = np.asarray(value)
    if array.shape != () or array.dtype != np.int64:
        raise fail(E.KV_BLOCK_INVALID, path, "expected an int64 scalar")
    return int(array)


def _format_name(codec: BlockCodec) -> str:
    if codec.kind == "affine":
        from reference_impl import dtypes

        return dtypes.type_name(codec.storage_type).lower()
    return {"dense": "dense", "struct": "codebook2"}[codec.kind]


def _encode(x: np.ndarray, fmt) -> EncodedValue | np.ndarray:
    fmt = BlockFormat.parse(fmt)
    encoded = encode_block(x, fmt)
    if fmt.name != "dense":
        record(KVCounters(encoded_bytes=encoded.nbytes))
    return encoded


def seal(block: KVBlock, key_format: BlockFormat, value_format: BlockFormat,
         geometry: tuple[int, int, int]) -> KVBlock:
    """A full block in its final formats; dense stays on the same payload (no copy)."""
    key, value = block.key, block.value
    if key_format.name != "dense":
        key = _encode(block.key_codec.decode(key), key_format)
    if value_format.name != "dense":
        value = _encode(block.value_codec.decode(value), value_format)
    if key is block.key and value is block.value:
        return block
    return make_block(block.start, block.valid, key, value, geometry)


def empty(kv_heads: int, head_size: int, block_size: int, v_head_size: int | None = None) -> PagedKVCache:
    return PagedKVCache(kv_heads, head_size, head_size if v_head_size is None else v_head_size, block_size)


__all__ = ["BlockGroup", "KVBlock", "KVStorage", "PagedKVCache", "block_groups", "empty", "make_block", "seal",
           "struct_geometry"]

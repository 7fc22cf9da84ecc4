"""Paged K/V caches: a block table of immutable blocks, each K and V in its own representation.

A ``PagedKVCache`` is a value: ``append`` and ``convert`` return a new cache that shares every
unchanged block with the old one, so a retained state or returned output is never disturbed. Blocks
(``KVBlock``) carry their token range as data: ``start`` (absolute position of the first token) and
``valid`` (tokens in use; the payload may hold more physical slots). Consecutive blocks cover
consecutive positions.

The last block may be *open*: a dense block living in a ``KVStorage`` allocation with room behind it,
so appending writes only the new tokens there. When it fills it is sealed: kept as is for ``dense`` or
encoded into the cache's key/value formats. Dense blocks are carved out of shared allocations of
``SLAB_TOKENS`` tokens, one after the other, so attention reads a run of them as one view; blocks that
will be encoded get an allocation of their own (released once sealed).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from reference_impl.errors import ErrorCode as E
from reference_impl.errors import violation
from reference_impl.kv.formats import (
    DENSE,
    KV_BLOCK,
    KV_PAGED_CACHE,
    BlockCodec,
    BlockFormat,
    decode_factored,
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


#: Dense blocks share allocations of this many tokens; attention reads adjacent ones as one view.
SLAB_TOKENS = 1024


@dataclass(frozen=True)
class _Place:
    """A dense block's allocation and the slot of its first token there."""

    storage: KVStorage
    offset: int


class _BlockStruct(StructValue):
    """A KV_BLOCK struct value made from a ``KVBlock``, which it keeps: adopting it again is free."""

    __slots__ = ("block",)


@dataclass(frozen=True, eq=False)
class KVBlock:
    """Positions [start, start + valid) of K and V; ``key``/``value`` are FLOAT[tokens, H, D] tensors (dense
    blocks) or encoded values of that logical type. Blocks compare by identity: a block is one retained
    buffer, and two blocks holding equal numbers are still two blocks."""

    start: int
    valid: int
    key: EncodedValue | np.ndarray
    value: EncodedValue | np.ndarray
    key_codec: BlockCodec = field(repr=False, compare=False)
    value_codec: BlockCodec = field(repr=False, compare=False)
    key_place: _Place | None = field(default=None, repr=False, compare=False)  # where a dense key lives
    value_place: _Place | None = field(default=None, repr=False, compare=False)

    @property
    def end(self) -> int:
        """Absolute position after the block's last valid token."""
        return self.start + self.valid

    @property
    def signature(self) -> tuple | None:
        """(key, value) codec signatures, or None when either decodes alone (cached)."""
        found = self.__dict__.get("_signature", False)
        if found is False:
            pair = (self.key_codec.signature, self.value_codec.signature)
            found = None if None in pair else pair
            object.__setattr__(self, "_signature", found)
        return found

    @property
    def tokens(self) -> int:
        """Physical token slots of the payload (>= valid)."""
        return self.key_codec.shape[0]

    def decode(self) -> tuple[np.ndarray, np.ndarray]:
        """This block's valid K and V as float32 [valid, H, D] (one block of workspace)."""
        k = self.key_codec.decode(self.key)[: self.valid]
        v = self.value_codec.decode(self.value)[: self.valid]
        return k, v


#: A group of blocks decoded (or copied) together holds at most this many bytes of decoded keys and this
#: many tokens (or one block); a run of dense blocks adjacent in one allocation is read in place, up to
#: ``SLAB_TOKENS``. The attention workspace is bounded by a group, whatever the context.
GROUP_BYTES = 1 << 19
GROUP_TOKENS = 1024


@dataclass(frozen=True)
class BlockGroup:
    """Consecutive blocks read together: positions [start, stop) of the cache, all valid tokens."""

    blocks: tuple[KVBlock, ...]
    in_place: bool = False  # dense blocks adjacent in their allocations: read as one view, no copy

    @property
    def start(self) -> int:
        return self.blocks[0].start

    @property
    def stop(self) -> int:
        return self.blocks[-1].end

    @property
    def allocates(self) -> bool:
        """Whether decoding allocates (dense blocks read in place do not)."""
        if self.in_place:
            return False
        return len(self.blocks) > 1 or "dense" not in (self.blocks[0].key_codec.kind, self.blocks[0].value_codec.kind)

    def decode(self) -> tuple[np.ndarray, np.ndarray]:
        """The group's valid K and V as float32 [tokens, H, D]."""
        return self.keys(), self.values()

    def keys(self) -> np.ndarray:
        """The group's valid K as float32 [tokens, H, D] (a view when read in place)."""
        return self._side("key")

    def values(self) -> np.ndarray:
        """The group's valid V as float32 [tokens, H, Dv] (a view when read in place)."""
        return self._side("value")

    def factored(self, name: str) -> tuple[np.ndarray, np.ndarray | None]:
        """``name`` ("key" or "value") as (codes or values [tokens, H, D], per-token-and-head scale or None):
        symmetric per-head affine blocks leave their scale to be applied to scores or weights."""
        if self.in_place:
            return self._side(name), None
        first = self.blocks[0]
        codecs = [getattr(b, f"{name}_codec") for b in self.blocks]
        values = [getattr(b, name) for b in self.blocks]
        if len(self.blocks) == 1 and first.valid != first.tokens:
            return self._side(name), None
        return decode_factored(codecs, values)

    def _side(self, name: str) -> np.ndarray:
        first, last = self.blocks[0], self.blocks[-1]
        codec = getattr(first, f"{name}_codec")
        if len(self.blocks) == 1:
            return codec.decode(getattr(first, name))[:first.valid]
        if self.in_place:
            a, b = getattr(first, f"{name}_place"), getattr(last, f"{name}_place")
            return a.storage.window(a.offset, b.offset + last.valid)[0, 0].reshape((-1,) + codec.shape[1:])
        return decode_many([getattr(b, f"{name}_codec") for b in self.blocks], [getattr(b, name) for b in self.blocks])


def block_groups(blocks, budget: int = GROUP_BYTES):
    """The blocks in order, in groups read together: a run of dense blocks adjacent in their allocations
    (read in place as one view, up to ``SLAB_TOKENS``), or consecutive full blocks whose key and value
    codecs share a signature, until their decoded keys would exceed ``budget`` bytes or ``GROUP_TOKENS``
    tokens. Any other block (partial, or without a signature) is a group of its own.

    A group that ended before the last block is remembered on its first block, so the next call over the
    same blocks (the next decode step) skips straight past it.
    """
    blocks = tuple(blocks)
    limits = (budget, GROUP_TOKENS, SLAB_TOKENS)
    index, count = 0, len(blocks)
    while index < count:
        known = blocks[index].__dict__.get("_group")
        if known is not None and known[0] == limits:
            group = known[1]
            stop = index + len(group.blocks)
            if stop < count and all(a is b for a, b in zip(blocks[index:stop], group.blocks)):
                yield group
                index = stop
                continue
        group_blocks = [blocks[index]]
        in_place = blocks[index].key_place is not None and blocks[index].value_place is not None
        stop = index + 1
        while stop < count and _extends(group_blocks, in_place, blocks[stop], budget):
            group_blocks.append(blocks[stop])
            stop += 1
        group = BlockGroup(tuple(group_blocks), in_place and len(group_blocks) > 1)
        if stop < count:  # closed: a later block did not fit, so the same blocks always group this way
            object.__setattr__(blocks[index], "_group", (limits, group))
        yield group
        index = stop


def _extends(group: list[KVBlock], in_place: bool, block: KVBlock, budget: int) -> bool:
    previous = group[-1]
    if previous.valid != previous.tokens:
        return False  # only a group's last block may be partial
    if in_place:
        return _adjacent(previous, block) and (len(group) + 1) * block.tokens <= SLAB_TOKENS
    signature = block.signature
    return (signature is not None and block.valid == block.tokens and signature == previous.signature
            and (len(group) + 1) * block.key_codec.decode_cost <= budget
            and (len(group) + 1) * block.tokens <= GROUP_TOKENS)


def make_block(start: int, valid: int, key: EncodedValue | np.ndarray, value: EncodedValue | np.ndarray,
               geometry: tuple[int, int, int], path: str = "kv.block",
               places: tuple[_Place | None, _Place | None] = (None, None)) -> KVBlock:
    """Bind and check one block (layouts against payload sizes, token range against slots)."""
    heads, head_size, v_head_size = geometry
    catalogue, registry = _bindings()
    for name, item in (("key", key), ("value", value)):
        if not isinstance(item, (EncodedValue, np.ndarray)):
            raise violation(E.KV_BLOCK_INVALID, f"{path}.{name}",
                            f"expected a float tensor or an encoded value, got {type(item).__name__}")
    key_codec = BlockCodec(key, heads, head_size, catalogue, registry, f"{path}.key")
    value_codec = BlockCodec(value, heads, v_head_size, catalogue, registry, f"{path}.value")
    if key_codec.shape[0] != value_codec.shape[0]:
        raise violation(E.KV_BLOCK_INVALID, path, "key and value blocks hold different token counts")
    if not 0 < valid <= key_codec.shape[0] or start < 0:
        raise violation(E.KV_BLOCK_INVALID, path,
                        f"token range start={start} valid={valid} does not fit {key_codec.shape[0]} slots")
    if places == (None, None):
        places = (_place_of(key, heads * head_size), _place_of(value, heads * v_head_size))
    return KVBlock(int(start), int(valid), key, value, key_codec, value_codec, *places)


def _place_of(value, row: int) -> _Place | None:
    """Where a dense block lives when it is a run of tokens of one of these allocations (a block this
    module wrote, handed back by a state or a caller); None for anything else."""
    if not isinstance(value, np.ndarray) or not value.flags.c_contiguous:
        return None
    storage = storage_of(value)
    if storage is None or storage.token_major or storage.heads != 1 or storage.data.shape[3] != row:
        return None
    offset, rest = divmod(value.__array_interface__["data"][0] - storage.address, row * storage.data.itemsize)
    if rest or not 0 <= offset <= storage.capacity - value.size // row:
        return None
    return _Place(storage, offset)


def _adjacent(previous: KVBlock, block: KVBlock) -> bool:
    """Whether ``block``'s dense K and V directly follow ``previous``'s in the same allocations."""
    for a, b in ((previous.key_place, block.key_place), (previous.value_place, block.value_place)):
        if a is None or b is None or a.storage is not b.storage or b.offset != a.offset + previous.tokens:
            return False
    return True


def _grow(place: _Place | None, valid: int, new: np.ndarray, capacity: int, path: str) -> tuple[np.ndarray, _Place]:
    """Write ``new`` (n, row) behind the ``valid`` tokens at ``place`` (None: a new block) and return the
    block's tokens as a read-only (valid + n, row) view with its place. Appends in place when nothing
    live reaches beyond the block's tokens; otherwise the block moves to a fresh allocation (a copy of
    its own tokens only)."""
    count, row = new.shape
    if place is not None:
        storage, offset = place.storage, place.offset
        if storage.reserve(offset + valid, offset + valid + count):
            slots = storage.slots()
            slots[0, 0, offset + valid:offset + valid + count] = new
            record(KVCounters(appended_bytes=new.nbytes, in_place_appends=1))
            return storage.publish(offset + valid + count)[0, 0, offset:], place
    storage = KVStorage(1, 1, capacity, row, np.float32, False, path)
    slots = storage.slots()
    moved = 0
    if place is not None and valid:
        slots[0, 0, :valid] = place.storage.slots()[0, 0, place.offset:place.offset + valid]
        moved = valid * row * 4
    slots[0, 0, valid:valid + count] = new
    record(KVCounters(appended_bytes=new.nbytes, relocated_bytes=moved))
    return storage.publish(valid + count)[0, 0, :], _Place(storage, 0)


def _next_place(previous: _Place | None, block_size: int) -> _Place | None:
    """Where a new dense block goes: right after the previous one in its allocation when it fits there
    (``_grow`` then claims it, or moves on if something live already reaches there); None otherwise."""
    if previous is None or previous.offset + 2 * block_size > previous.storage.capacity:
        return None
    return _Place(previous.storage, previous.offset + block_size)


@dataclass(frozen=True)
class PagedKVCache:
    """One sequence's K/V as a block table. Geometry: ``kv_heads``, ``head_size``, ``v_head_size``."""

    kv_heads: int
    head_size: int
    v_head_size: int
    block_size: int
    blocks: tuple[KVBlock, ...] = ()
    _checked: bool = field(default=False, repr=False, compare=False)  # built by append: blocks known valid

    def __post_init__(self):
        check_capacity(self.block_size, "kv.paged.block_size")
        if self._checked:
            return
        previous = None
        for index, block in enumerate(self.blocks):
            if previous is not None and block.start != previous.start + previous.valid:
                raise violation(E.KV_BLOCK_INVALID, f"kv.paged.blocks[{index}].start",
                           f"starts at {block.start}, the previous block ends at {previous.start + previous.valid}")
            if block.tokens > self.block_size:
                raise violation(E.KV_BLOCK_INVALID, f"kv.paged.blocks[{index}]",
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
        capacities = tuple(_capacity(fmt, self.block_size) for fmt in (key_format, value_format))
        while position < total:
            last = blocks[-1] if blocks else None
            if last is not None and last.valid < self.block_size and last.valid == last.tokens \
                    and last.key_place is not None and last.value_place is not None:
                take = min(self.block_size - last.valid, total - position)
                start, valid, places = last.start, last.valid, (last.key_place, last.value_place)
            else:
                take = min(self.block_size, total - position)
                start = last.end if last is not None else 0
                valid = 0
                places = (None, None) if last is None else \
                    (_next_place(last.key_place, self.block_size), _next_place(last.value_place, self.block_size))
                blocks.append(None)
            chunk = slice(position, position + take)
            grown = [_grow(place, valid, x[chunk].reshape(take, -1), capacity, "kv.paged.append")
                     for place, x, capacity in zip(places, (key, value), capacities)]
            block = make_block(start, valid + take, grown[0][0].reshape(valid + take, self.kv_heads, self.head_size),
                               grown[1][0].reshape(valid + take, self.kv_heads, self.v_head_size), self.geometry,
                               places=(grown[0][1], grown[1][1]))
            if block.valid == self.block_size:
                block = seal(block, key_format, value_format, self.geometry)
            blocks[-1] = block
            position += take
        return PagedKVCache(self.kv_heads, self.head_size, self.v_head_size, self.block_size, tuple(blocks),
                            _checked=True)

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
                raise violation(E.KV_SHAPE_MISMATCH, f"kv.paged.append.{name}",
                                f"expected float32 [{self.kv_heads}, n, {size}], got {x.dtype}{list(x.shape)}")
            out.append(np.ascontiguousarray(x.transpose(1, 0, 2)))
        if out[0].shape[0] != out[1].shape[0]:
            raise violation(E.KV_SHAPE_MISMATCH, "kv.paged.append", "key and value token counts differ")
        return out[0], out[1]

    # ------------------------------------------------------------------------- conversion
    def convert(self, indices: Sequence[int], key_format: BlockFormat | str | None = None,
                value_format: BlockFormat | str | None = None) -> PagedKVCache:
        """Re-encode the selected blocks (one at a time); the other blocks are shared unchanged."""
        blocks = list(self.blocks)
        for index in indices:
            if not -len(blocks) <= index < len(blocks):
                raise violation(E.KV_BLOCK_INVALID, f"kv.paged.blocks[{index}]", f"no block {index}")
            block = blocks[index]
            k, v = block.key_codec.decode(block.key), block.value_codec.decode(block.value)
            new_key = block.key if key_format is None else _encode(k, key_format)
            new_value = block.value if value_format is None else _encode(v, value_format)
            blocks[index] = make_block(block.start, block.valid, new_key, new_value, self.geometry)
        return PagedKVCache(self.kv_heads, self.head_size, self.v_head_size, self.block_size, tuple(blocks))

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
        """The cache as a KV_PAGED_CACHE struct value (shares every block payload, and every block's struct
        value with the caches it came from)."""
        blocks = [_block_struct(b) for b in self.blocks]
        return StructValue({"blocks": blocks, "length": np.array(self.count, np.int64)}, KV_PAGED_CACHE)

    @classmethod
    def from_struct(cls, value, kv_heads: int, head_size: int, v_head_size: int, block_size: int,
                    path: str = "cache") -> PagedKVCache:
        """Adopt a KV_PAGED_CACHE struct value, checking every block's layout and token range (a block
        value this module made from a checked block of the same geometry is not checked again)."""
        if not isinstance(value, StructValue) or value.type_id != KV_PAGED_CACHE:
            raise violation(E.KV_BLOCK_INVALID, path, "expected a KV_PAGED_CACHE struct value")
        geometry = (kv_heads, head_size, v_head_size)
        blocks = []
        for index, item in enumerate(value["blocks"]):
            if type(item) is _BlockStruct and _same_geometry(item.block, geometry):
                blocks.append(item.block)
                continue
            where = f"{path}.blocks[{index}]"
            if not isinstance(item, StructValue) or item.type_id != KV_BLOCK:
                raise violation(E.KV_BLOCK_INVALID, where, "expected a KV_BLOCK struct value")
            blocks.append(make_block(_scalar(item["start"], f"{where}.start"),
                                     _scalar(item["valid_length"], f"{where}.valid_length"),
                                     item["key"], item["value"], geometry, where))
        cache = cls(kv_heads, head_size, v_head_size, block_size, tuple(blocks))
        if _scalar(value["length"], f"{path}.length") != cache.count:
            raise violation(E.KV_BLOCK_INVALID, f"{path}.length", f"length is not the {cache.count} valid tokens")
        return cache


def _block_struct(block: KVBlock) -> _BlockStruct:
    """The block's KV_BLOCK struct value, made once per block."""
    made = block.__dict__.get("_struct")
    if made is None:
        made = _BlockStruct({"start": np.array(block.start, np.int64), "valid_length": np.array(block.valid, np.int64),
                             "key": block.key, "value": block.value}, KV_BLOCK)
        made.block = block
        object.__setattr__(block, "_struct", made)
    return made


def _same_geometry(block: KVBlock, geometry: tuple[int, int, int]) -> bool:
    heads, head_size, v_head_size = geometry
    return block.key_codec.shape[1:] == (heads, head_size) and block.value_codec.shape[1:] == (heads, v_head_size)


def struct_geometry(value, path: str = "cache") -> tuple[int, int, int] | None:
    """(kv_heads, head_size, v_head_size) of a KV_PAGED_CACHE struct value, read from its first block's
    logical types; None when it has no blocks yet. ``from_struct`` then checks every block against it."""
    if not isinstance(value, StructValue) or value.type_id != KV_PAGED_CACHE:
        raise violation(E.KV_BLOCK_INVALID, path, "expected a KV_PAGED_CACHE struct value")
    blocks = value["blocks"]
    if not blocks:
        return None
    first, where = blocks[0], f"{path}.blocks[0]"
    if not isinstance(first, StructValue) or first.type_id != KV_BLOCK:
        raise violation(E.KV_BLOCK_INVALID, where, "expected a KV_BLOCK struct value")
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
            raise violation(E.KV_BLOCK_INVALID, f"{where}.{name}",
                            f"expected a float tensor or an encoded value, got {type(item).__name__}")
        if len(shape) != 3 or min(shape) <= 0:
            raise violation(E.KV_BLOCK_INVALID, f"{where}.{name}.logical_type",
                            f"a block is FLOAT[tokens, heads, head_size] with positive sizes, got {shape}")
        dims.append(shape)
    if dims[0][1] != dims[1][1]:
        raise violation(E.KV_BLOCK_INVALID, f"{where}.value.logical_type",
                        f"the value block has {dims[1][1]} heads, the key block {dims[0][1]}")
    return dims[0][1], dims[0][2], dims[1][2]


def _scalar(value, path: str) -> int:
    array = np.asarray(value)
    if array.shape != () or array.dtype != np.int64:
        raise violation(E.KV_BLOCK_INVALID, path, "expected an int64 scalar")
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
    places = (block.key_place if key is block.key else None, block.value_place if value is block.value else None)
    return make_block(block.start, block.valid, key, value, geometry, places=places)


def _capacity(fmt: BlockFormat, block_size: int) -> int:
    """Tokens of a fresh allocation for a block sealed in ``fmt``: a slab of blocks when dense (they stay
    there), one block otherwise (its allocation is released once the block is encoded)."""
    return max(1, SLAB_TOKENS // block_size) * block_size if fmt.name == "dense" else block_size


def empty(kv_heads: int, head_size: int, block_size: int, v_head_size: int | None = None) -> PagedKVCache:
    return PagedKVCache(kv_heads, head_size, head_size if v_head_size is None else v_head_size, block_size)


__all__ = ["BlockGroup", "KVBlock", "KVStorage", "PagedKVCache", "block_groups", "empty", "make_block", "seal",
           "struct_geometry"]

"""Faults in paged KV caches: formats, page ranges and block tables."""

from __future__ import annotations

import dataclasses

import numpy as np

from conformance.audit.fault import Patch, fault, name_faults
from conformance.audit.faults.encoding import around
from conformance.audit.faults.shared import attention_module, paged_attention_module
from reference_impl.kv import formats, paged


def _first_block_zero_point(codecs, values):
    first = codecs[0] if len(codecs) > 1 else None
    if first is not None and first.kind == "affine" and first.zero_point is not None:
        payload = np.concatenate([value.payload for value in values])
        scale = np.concatenate([codec.scale for codec in codecs], axis=0)
        zero_point = np.concatenate([first.zero_point] * len(codecs), axis=0)  # the group's first block's
        return formats._dequantize_heads(payload, first.storage_type, scale, zero_point,
                                         (first.shape[0] * len(codecs),) + first.shape[1:], first.block_size)


def _signature_without_type(self):
    if self.kind == "affine" and self.axis == 2 and self.block_size:
        # the layout's geometry, not its element type: INT8, INT4 and INT2 blocks look alike
        return ("affine", self.shape, self.block_size, self.scale.shape, self.zero_point is None)


def _extends_after_partial(group, in_place, block, budget):
    """paged._extends without its first check: a partial block may be followed in its group."""
    previous = group[-1]
    if in_place:
        return paged._adjacent(previous, block) and (len(group) + 1) * block.tokens <= paged.SLAB_TOKENS
    signature = block.signature
    return (signature is not None and block.valid == block.tokens and signature == previous.signature
            and (len(group) + 1) * block.key_codec.decode_cost <= budget
            and (len(group) + 1) * block.tokens <= paged.GROUP_TOKENS)


def _key_signature(self):
    found = self.__dict__.get("_signature", False)
    if found is False:
        key = self.key_codec.signature
        found = None if key is None or self.value_codec.signature is None else (key, key)
        object.__setattr__(self, "_signature", found)
    return found


def _scaled_interleaved(x, scale):
    """paged_attention._scaled with query head h reading the scale of KV head h % Hkv."""
    if scale is None:
        return x
    hq, hkv = x.shape[1], scale.shape[1]
    heads = np.arange(hq) % hkv
    return x * scale.T[heads][None, :, None, :]


def _add_scaled_normalizer(self, logits, v, bias, v_scale=None):
    """OnlineSoftmax.add with the value blocks' factored scale folded into the weights before their sum:
    the normalizer sums scale-weighted weights."""
    A = attention_module
    f32 = np.dtype(np.float32)
    if bias is None:
        self.attended[...] = True
    else:
        self.attended |= ~np.isneginf(bias.max(axis=-1, keepdims=True))
    new_max = logits.max(axis=-1, keepdims=True)
    first = self.normalizer is None
    if not first:
        new_max = np.maximum(self.row_max, new_max)
    safe_max = new_max if bias is None else np.where(np.isneginf(new_max), f32.type(0), new_max)
    weights = paged_attention_module._scaled(np.exp(logits - safe_max), v_scale)
    part = A.grouped_values(weights, v)
    if first:
        self.normalizer, self.acc = weights.sum(axis=-1, keepdims=True), part
    else:
        correction = np.exp(self.row_max - safe_max)
        self.normalizer = self.normalizer * correction + weights.sum(axis=-1, keepdims=True)
        self.acc = self.acc * correction + part
    self.row_max = new_max
    return weights


def _head_size_axis(layout, **_):
    if layout.HasField("axis"):
        layout = type(layout).FromString(layout.SerializeToString())
        layout.axis = 2  # per-axis and blocked parameters are taken to run along head_size
        return {"layout": layout}


def _paged_append(start_after_slots: bool = False, lazy_seal: bool = False):
    """PagedKVCache.append as a runtime with one of two bugs writes it: a new block after a partial one
    starts behind the partial block's physical slots (``start_after_slots``), or a full block is sealed
    only when the next block is started (``lazy_seal``), so a block filled by a call's last token stays
    open (dense) in the cache that call returns."""
    def append(self, key, value, key_format=paged.DENSE, value_format=paged.DENSE, cancel=None):
        key_format, value_format = self.check_formats(key_format, value_format)
        key, value = self._check_tokens(key, value)
        blocks = list(self.blocks)
        paged.check_cancel(cancel, "kv.paged.append")
        position, total = 0, key.shape[0]
        capacities = tuple(paged._capacity(fmt, self.block_size) for fmt in (key_format, value_format))
        while position < total:
            last = blocks[-1] if blocks else None
            if last is not None and last.valid < self.block_size and last.valid == last.tokens \
                    and last.key_place is not None and last.value_place is not None:
                take = min(self.block_size - last.valid, total - position)
                start, valid, places = last.start, last.valid, (last.key_place, last.value_place)
            else:
                if lazy_seal and last is not None and last.valid == self.block_size:
                    blocks[-1] = last = paged.seal(last, key_format, value_format, self.geometry)
                take = min(self.block_size, total - position)
                start = 0 if last is None else last.start + last.tokens if start_after_slots else last.end
                valid = 0
                places = (None, None) if last is None else \
                    (paged._next_place(last.key_place, self.block_size),
                     paged._next_place(last.value_place, self.block_size))
                blocks.append(None)
            chunk = slice(position, position + take)
            grown = [paged._grow(place, valid, x[chunk].reshape(take, -1), capacity, "kv.paged.append")
                     for place, x, capacity in zip(places, (key, value), capacities)]
            block = paged.make_block(start, valid + take,
                                     grown[0][0].reshape(valid + take, self.kv_heads, self.head_size),
                                     grown[1][0].reshape(valid + take, self.kv_heads, self.v_head_size),
                                     self.geometry, places=(grown[0][1], grown[1][1]))
            if block.valid == self.block_size and not lazy_seal:
                block = paged.seal(block, key_format, value_format, self.geometry)
            blocks[-1] = block
            position += take
        return paged.PagedKVCache(self.kv_heads, self.head_size, self.v_head_size, self.block_size, tuple(blocks),
                                  _checked=True)
    return append


PayloadSlotsAsValidTokens = fault("KV-PAGED-RANGE.slots-as-valid-tokens", ("KV-PAGED-RANGE",),
    """Takes a block's token count from its payload's physical slots instead of its valid_length, so a partially filled
    block contributes its unused slots too.""", patches=lambda: [around(
        paged, "make_block", after=lambda block, **_: dataclasses.replace(block, valid=block.tokens))])
KVZeroPointsDropped = fault("KV-PAGED-FORMATS.zero-points-dropped", ("KV-PAGED-FORMATS",),
    """Decodes affine K/V blocks as if they were symmetric (codes times scale), ignoring the zero point each block
    carries: only the per-block formats without a zero point decode right.""",
    patches=lambda: [around(formats, "_dequantize_heads", before=lambda **_: {"zero_point": None})])
GroupZeroPointFromFirstBlock = fault("KV-PAGED-FORMATS.group-zero-point-from-first-block", ("KV-PAGED-FORMATS",),
    """Decodes a run of blocks of one affine format together with each block's scale but the first block's zero point
    for all of them (the zero point is taken as a format constant, not block data).""", boundary=True,
    patches=lambda: [around(formats, "decode_many", instead=_first_block_zero_point)])
PartialBlockGrouped = fault("KV-PAGED-RANGE.partial-block-grouped", ("KV-PAGED-RANGE",),
    """Decodes a partial block together with the next blocks of the same format: its unused slots are read as tokens, so
    every later token of the group sits at the wrong position (a partial block is only safe at the end of a group).""",
    boundary=True, patches=lambda: [Patch(paged, "_extends", _extends_after_partial)])
GroupSignatureWithoutElementType = fault("KV-PAGED-FORMATS.group-signature-without-type", ("KV-PAGED-FORMATS",),
    """Groups consecutive affine blocks by their geometry and parameter shapes but not their storage type: an INT4 block
    following an INT8 one (both symmetric) is decoded with the INT8 block's code width.""",
    patches=lambda: [around(formats.BlockCodec, "_make_signature", instead=_signature_without_type)])
GroupedByKeyFormatOnly = fault("KV-PAGED-FORMATS.grouped-by-key-format", ("KV-PAGED-FORMATS",),
    """Groups consecutive blocks when their key formats agree, without comparing the value formats: a block whose values
    use another layout is decoded with the first block's value codec.""",
    patches=lambda: [Patch(paged.KVBlock, "signature", property(_key_signature))])
PagedQueriesPlacedByCount = fault("KV-PAGED-RANGE.queries-placed-by-count", ("KV-PAGED-RANGE", "KV-ATTENTION"),
    """Places the queries of a paged call at positions ``count - S + i`` (counting the cache's valid tokens from 0)
    while the keys keep the absolute positions of their blocks: when the first block does not start at 0, the causal
    frontier hides keys the queries should see.""", boundary=True,
    patches=lambda: [around(paged_attention_module, "_attend_row", before=lambda q, cache, offset, **_:
                            {"offset": cache.count - q.shape[2]} if offset is None else None)])
PagedMaskIndexedByPosition = fault("KV-PAGED-RANGE.mask-indexed-by-position", ("KV-PAGED-RANGE", "KV-ATTENTION"),
    """Indexes the attention mask of a paged call by the keys' absolute positions instead of their order in the cache:
    when the first block starts beyond 0, the mask is read shifted (and keys beyond its width are masked).""",
    boundary=True, patches=lambda: [around(paged_attention_module, "_group_bias", before=lambda **_: {"first": 0})])
FactoredScaleHeadsInterleaved = fault("KV-PAGED-FORMATS.factored-scale-heads-interleaved",
    ("KV-PAGED-FORMATS", "KV-ATTENTION"), """Applies the per-token, per-KV-head scale of symmetric affine blocks
    (factored out of the decoded keys and values, onto the scores and weights) with query head h reading KV head ``h %
    kv_heads`` while the codes are read with ``h // (q_heads / kv_heads)``: grouped-query Attention over such blocks
    mixes heads' scales; dense blocks and the other formats stay right.""",
    patches=lambda: [Patch(paged_attention_module, "_scaled", _scaled_interleaved)])
ValueScaleInNormalizer = fault("KV-PAGED-FORMATS.value-scale-in-normalizer", ("KV-PAGED-FORMATS", "KV-ATTENTION"),
    """Folds the factored per-token scale of symmetric affine value blocks into the softmax weights before the weights
    are summed, so the normalizer is sum(w * scale) instead of sum(w): Y is off whenever the value scales of the
    attended tokens differ.""",
    patches=lambda: [Patch(paged_attention_module.OnlineSoftmax, "add", _add_scaled_normalizer)])
BlockAxisAssumedHeadSize = fault("KV-PAGED-FORMATS.block-axis-assumed-head-size", ("KV-PAGED-FORMATS", "AFF-AXIS"),
    """Reads every per-axis or blocked affine K/V block as if its parameters ran along head_size (the axis of the
    runtime's own block formats), whatever its axis field says: a caller's block with one scale per token (axis 0) or
    per head (axis 1) is refused for its parameter shape, or decoded along the wrong axis.""",
    patches=lambda: [around(formats.BlockCodec, "_bind_affine", before=_head_size_axis)])
NewBlockAfterPartialSlots = fault("KV-PAGED-RANGE.new-block-after-partial-slots", ("KV-PAGED-RANGE",),
    """Starts the block that follows a partial block (a caller's block whose payload holds more slots than valid tokens)
    at the partial block's start plus its physical slots, not its valid length: the cache it returns has a gap in its
    token range, which the next call refuses.""", boundary=True,
    patches=lambda: [Patch(paged.PagedKVCache, "append", _paged_append(start_after_slots=True))])
FilledBlockLeftOpen = fault("KV-PAGED-FORMATS.filled-block-left-open", ("KV-PAGED-FORMATS",),
    """Seals a full block into the cache's key/value formats only when the next block is started: a block filled by a
    call's last token is returned (and retained) dense, and Attention in that call reads its unencoded values.""",
    boundary=True, patches=lambda: [Patch(paged.PagedKVCache, "append", _paged_append(lazy_seal=True))])


name_faults(globals())

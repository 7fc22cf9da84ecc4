"""More faults in KV caches and external payloads, each in a path the happy decode traces rarely reach:
batch rows beyond the first (per-row nonpad lengths, masks and TensorScatter write indices), masks of rank
2 and 3, TensorScatter's axis and circular mode, an explicit scale of 0, qk_matmul_output under grouped
heads, 3-D (packed-head) inputs, paged caches whose first block does not start at position 0, symmetric
per-head block scales factored out of the scores and weights, blocks with parameters along other axes,
max_tokens against partial blocks, blocks sealed late, and external extents whose offset and length each
fit the file but not together, wrap uint64 or 32 bits, sit in a subdirectory, are empty or unaligned."""

from __future__ import annotations

import dataclasses
import importlib
import os

import numpy as np

from conformance.audit.fault import Fault, Patch, wrap
from reference_impl import payload
from reference_impl.dtypes import INT64_MAX, UINT64_MAX
from reference_impl.errors import ContractError, violation
from reference_impl.errors import ErrorCode as E
from reference_impl.kv import contiguous, formats, kernels, paged

# the modules (``reference_impl.kv`` re-exports functions of the same names)
attention_module = importlib.import_module("reference_impl.kv.attention")
paged_attention_module = importlib.import_module("reference_impl.kv.paged_attention")


# ------------------------------------------------------------------------------ batch rows
def _first_row_nonpad(original):
    def check_nonpad(nonpad, batch, total):
        checked = original(nonpad, batch, total)
        if checked is None or not checked.size:
            return checked
        return np.full_like(checked, checked[0])
    return check_nonpad


class NonpadFirstRowForAll(Fault):
    """Reads ``nonpad_kv_seqlen`` as one length (its first element) for the whole batch: every batch row
    is padded, and its causal frontier placed, as if it held the first row's number of valid tokens."""

    fault_id = "KV-ATTENTION.nonpad-first-row-for-all"
    clauses = ("KV-ATTENTION",)
    boundary = True

    def patches(self):
        return [wrap(attention_module, "check_nonpad", _first_row_nonpad)]


def _first_batch_mask(original):
    def check_mask(mask, q_dtype, target):
        checked = original(mask, q_dtype, target)
        if checked is not None and checked.ndim == 4 and checked.shape[0] > 1:
            return checked[:1]  # the batch row of the mask is never advanced
        return checked
    return check_mask


class MaskFirstBatchRowForAll(Fault):
    """Indexes a 4-D attention mask with batch row 0 for every batch row (the mask pointer is not advanced
    by the batch stride): each row is masked with the first row's mask."""

    fault_id = "KV-ATTENTION.mask-first-batch-row-for-all"
    clauses = ("KV-ATTENTION",)
    boundary = True

    def patches(self):
        return [wrap(attention_module, "check_mask", _first_batch_mask)]


def _key_padding_mask(original):
    def check_mask(mask, q_dtype, target):
        if mask is not None and np.ndim(mask) == 2:
            mask = np.asarray(mask)
            if mask.shape[0] != target[0]:
                raise violation(E.ATTENTION_INPUT_INVALID, "Attention.attn_mask",
                                f"a 2-D key padding mask needs {target[0]} rows (the batch), got {mask.shape[0]}")
            mask = mask.reshape(target[0], 1, 1, mask.shape[1])
        return original(mask, q_dtype, target)
    return check_mask


class TwoDimensionalMaskAsKeyPadding(Fault):
    """Takes a 2-D attention mask for a (batch, total_sequence) key padding mask (the convention of older
    contrib attention operators) instead of broadcasting it as (q_sequence, total_sequence): a mask with one
    row per query is refused unless it happens to have one row per batch entry, and then every query of a
    batch row gets that row."""

    fault_id = "KV-ATTENTION.two-d-mask-as-key-padding"
    clauses = ("KV-ATTENTION",)
    boundary = True

    def patches(self):
        return [wrap(attention_module, "check_mask", _key_padding_mask)]


def _batch_first_mask(original):
    def check_mask(mask, q_dtype, target):
        if mask is not None and np.ndim(mask) == 3:
            mask = np.asarray(mask)
            if mask.shape[0] != target[0]:
                raise violation(E.ATTENTION_INPUT_INVALID, "Attention.attn_mask",
                                f"a 3-D mask needs {target[0]} rows (the batch), got {mask.shape[0]}")
            mask = mask[:, None]  # (batch, S, T) -> (batch, 1, S, T)
        return original(mask, q_dtype, target)
    return check_mask


class ThreeDimensionalMaskBatchFirst(Fault):
    """Aligns a 3-D attention mask's dimensions from the left, as (batch, q_sequence, total_sequence) (the
    convention of older contrib attention operators), instead of broadcasting it from the right as (heads,
    q_sequence, total_sequence): a per-head mask is refused unless it happens to have one entry per batch
    row, and then it is applied per batch row to every head."""

    fault_id = "KV-ATTENTION.three-d-mask-batch-first"
    clauses = ("KV-ATTENTION",)
    boundary = True

    def patches(self):
        return [wrap(attention_module, "check_mask", _batch_first_mask)]


def _scatter(sequence_axis: int | None = None, wrap: bool = True, first_index: bool = False):
    """A TensorScatter kernel with one bug: it writes along ``sequence_axis`` whatever the axis attribute
    says (None: the attribute's axis), treats circular mode as linear (``wrap`` False), or writes every
    batch row at the first row's write index (``first_index``)."""
    def kernel(args, attrs, ctx):
        past, update = args[0], args[1]
        indices = args[2] if len(args) > 2 else None
        if first_index and indices is not None and np.size(indices):
            indices = np.full(np.shape(indices), np.asarray(indices).reshape(-1)[0], np.int64)
        mode = attrs.get("mode", "linear")
        mode = mode.decode() if isinstance(mode, bytes) else mode
        axis = int(attrs.get("axis", -2)) if sequence_axis is None else sequence_axis
        return [contiguous.tensor_scatter(past, update, indices, mode=mode if wrap else "linear", axis=axis)]
    return kernel


class ScatterFirstWriteIndexForAll(Fault):
    """TensorScatter writes every batch row's update at ``write_indices[0]`` (one write position for the
    batch) instead of each row's own index: rows whose caches hold different numbers of tokens overwrite
    or leave gaps in each other's positions."""

    fault_id = "KV-APPEND-EQUIV.scatter-first-write-index"
    clauses = ("KV-APPEND-EQUIV", "KV-ATTENTION")
    boundary = True

    def executor_kernels(self):
        return {**super().executor_kernels(), ("", "TensorScatter"): _scatter(first_index=True)}


class ScatterAxisFixedAtMinusTwo(Fault):
    """TensorScatter always writes along axis -2 (the head-major (batch, heads, sequence, head_size) cache
    layout), ignoring the axis attribute: a token-major (batch, sequence, heads, head_size) cache scattered
    along axis 1 is written across its heads, or refused."""

    fault_id = "KV-APPEND-EQUIV.scatter-axis-fixed"
    clauses = ("KV-APPEND-EQUIV", "KV-ATTENTION")

    def executor_kernels(self):
        return {**super().executor_kernels(), ("", "TensorScatter"): _scatter(sequence_axis=-2)}


class ScatterCircularAsLinear(Fault):
    """TensorScatter ignores mode = "circular": writes that run past the cache's end are refused as in
    linear mode instead of wrapping to its start."""

    fault_id = "KV-APPEND-EQUIV.scatter-circular-as-linear"
    clauses = ("KV-APPEND-EQUIV",)
    boundary = True

    def executor_kernels(self):
        return {**super().executor_kernels(), ("", "TensorScatter"): _scatter(wrap=False)}


def _zero_scale_defaulted(original):
    def sqrt_scale(attrs, head_size, dtype):
        """attention.sqrt_scale reading the scale as ``attrs.scale or 1 / sqrt(head_size)``."""
        return original(dataclasses.replace(attrs, scale=attrs.scale or None), head_size, dtype)
    return sqrt_scale


class ZeroScaleDefaulted(Fault):
    """Reads Attention's scale as ``scale or 1 / sqrt(head_size)`` (0 taken for "not set", the convention
    of older contrib attention operators): an explicit scale of 0, which makes every score 0 (each query
    averages the values it may see), is replaced by the default."""

    fault_id = "KV-ATTENTION.zero-scale-defaulted"
    clauses = ("KV-ATTENTION",)
    boundary = True

    def patches(self):
        return [wrap(attention_module, "sqrt_scale", _zero_scale_defaulted)]


def _qk_per_kv_head(original):
    def attention(*args, **kwargs):
        out = original(*args, **kwargs)
        qk, hkv = out.qk_matmul_output, out.present_key.shape[1]
        if qk.ndim == 4 and hkv and qk.shape[1] > hkv:
            group = qk.shape[1] // hkv
            out = out._replace(qk_matmul_output=np.repeat(qk[:, ::group], group, axis=1))
        return out
    return attention


class QkOutputPerKvHead(Fault):
    """Fills qk_matmul_output one row per key/value head (the scores of the first query head of each group)
    and repeats it over the group, as a grouped-query kernel that computes a group's scores together would:
    with grouped- or multi-query heads, every query head but the first of its group reports another head's
    scores."""

    fault_id = "KV-ATTENTION.qk-output-per-kv-head"
    clauses = ("KV-ATTENTION",)

    def patches(self):
        return [wrap(attention_module, "attention", _qk_per_kv_head)]


# ------------------------------------------------------------------------------ 3-D inputs
def _split_without_transpose(x, num_heads, name):
    batch, seq, hidden = x.shape
    if num_heads <= 0 or hidden % num_heads:
        raise violation(E.ATTENTION_INPUT_INVALID, f"Attention.{name}",
                        f"hidden size {hidden} is not a multiple of {num_heads} heads")
    return x.reshape(batch, num_heads, seq, hidden // num_heads)


def _merge_without_transpose(y):
    batch, heads, seq, size = y.shape
    return y.reshape(batch, seq, heads * size)


class PackedHeadsNotTransposed(Fault):
    """Splits 3-D (batch, sequence, heads * head_size) inputs into heads by a plain reshape to (batch,
    heads, sequence, head_size), and merges Y back the same way, without the transpose: with more than one
    token per call, the tokens and heads are scrambled."""

    fault_id = "KV-ATTENTION.packed-heads-not-transposed"
    clauses = ("KV-ATTENTION",)

    def patches(self):
        return [Patch(attention_module, "split_heads", _split_without_transpose),
                Patch(attention_module, "merge_heads", _merge_without_transpose)]


# ------------------------------------------------------------------------------ paged positions
def _offset_from_count(original):
    def attend_row(q, cache, mask, attrs, offset):
        if offset is None:
            offset = cache.count - q.shape[2]
        return original(q, cache, mask, attrs, offset)
    return attend_row


class PagedQueriesPlacedByCount(Fault):
    """Places the queries of a paged call at positions ``count - S + i`` (counting the cache's valid tokens
    from 0) while the keys keep the absolute positions of their blocks: when the first block does not start
    at 0, the causal frontier hides keys the queries should see."""

    fault_id = "KV-PAGED-RANGE.queries-placed-by-count"
    clauses = ("KV-PAGED-RANGE", "KV-ATTENTION")
    boundary = True

    def patches(self):
        return [wrap(paged_attention_module, "_attend_row", _offset_from_count)]


def _mask_by_position(original):
    def group_bias(mask, sq, lo, hi, first, offset, attrs):
        return original(mask, sq, lo, hi, 0, offset, attrs)
    return group_bias


class PagedMaskIndexedByPosition(Fault):
    """Indexes the attention mask of a paged call by the keys' absolute positions instead of their order in
    the cache: when the first block starts beyond 0, the mask is read shifted (and keys beyond its width
    are masked)."""

    fault_id = "KV-PAGED-RANGE.mask-indexed-by-position"
    clauses = ("KV-PAGED-RANGE", "KV-ATTENTION")
    boundary = True

    def patches(self):
        return [wrap(paged_attention_module, "_group_bias", _mask_by_position)]


# ------------------------------------------------------------------------------ factored block scales
def _scaled_interleaved(x, scale):
    """paged_attention._scaled with query head h reading the scale of KV head h % Hkv."""
    if scale is None:
        return x
    hq, hkv = x.shape[1], scale.shape[1]
    heads = np.arange(hq) % hkv
    return x * scale.T[heads][None, :, None, :]


class FactoredScaleHeadsInterleaved(Fault):
    """Applies the per-token, per-KV-head scale of symmetric affine blocks (factored out of the decoded
    keys and values, onto the scores and weights) with query head h reading KV head ``h % kv_heads`` while
    the codes are read with ``h // (q_heads / kv_heads)``: grouped-query Attention over such blocks mixes
    heads' scales; dense blocks and the other formats stay right."""

    fault_id = "KV-PAGED-FORMATS.factored-scale-heads-interleaved"
    clauses = ("KV-PAGED-FORMATS", "KV-ATTENTION")

    def patches(self):
        return [Patch(paged_attention_module, "_scaled", _scaled_interleaved)]


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


class ValueScaleInNormalizer(Fault):
    """Folds the factored per-token scale of symmetric affine value blocks into the softmax weights before
    the weights are summed, so the normalizer is sum(w * scale) instead of sum(w): Y is off whenever the
    value scales of the attended tokens differ."""

    fault_id = "KV-PAGED-FORMATS.value-scale-in-normalizer"
    clauses = ("KV-PAGED-FORMATS", "KV-ATTENTION")

    def patches(self):
        return [Patch(paged_attention_module.OnlineSoftmax, "add", _add_scaled_normalizer)]


# ------------------------------------------------------------------------------ external extents
def _checked_apart(original):
    def open_external(extent, base_dir, path):
        loose = dataclasses.replace(extent, offset=0, length=max(extent.offset, extent.length))
        return original(loose, base_dir, path)
    return open_external


class ExtentCheckedPartByPart(Fault):
    """Checks an external extent against its backing file part by part (``offset <= size`` and ``length <=
    size``) instead of ``offset + length <= size``: an extent that starts inside the file and runs past
    its end is accepted (its bytes then read short)."""

    fault_id = "PAY-EXTERNAL-EXTENT.offset-length-checked-apart"
    clauses = ("PAY-EXTERNAL-EXTENT",)
    boundary = True

    def patches(self):
        return [wrap(payload, "open_external", _checked_apart, aliases=False)]


def _wrapped(extent) -> int | None:
    """offset + length modulo 2**64 when the sum overflows uint64, else None."""
    total = extent.offset + extent.length
    return total % (UINT64_MAX + 1) if extent.external and total > UINT64_MAX else None


def _extent_wrapping(original):
    def payload_extent(value, path):
        try:
            return original(value, path)
        except ContractError as error:
            if error.code != E.EXTERNAL_EXTENT_OVERFLOW:
                raise
            entries = {entry.key: entry.value for entry in value.external_data}
            offset, length = int(entries.get("offset", "0")), int(entries["length"])
            if (offset + length) % (UINT64_MAX + 1) > INT64_MAX:
                raise
            return payload.Extent(length=length, location=entries["location"], offset=offset)
    return payload_extent


def _open_wrapping(original):
    def open_external(extent, base_dir, path):
        wrapped = _wrapped(extent)
        if wrapped is not None:  # the size check compares the wrapped end
            extent = dataclasses.replace(extent, offset=0, length=wrapped)
        return original(extent, base_dir, path)
    return open_external


def _read_wrapping(original):
    def open_payload(value, extent, base_dir, path):
        if _wrapped(extent) is not None:
            os.close(payload.open_external(extent, base_dir, path))
            raise violation(E.EXTERNAL_FILE_INVALID, path, "reading at the extent's offset found no bytes")
        return original(value, extent, base_dir, path)
    return open_payload


class ExtentSumWraps(Fault):
    """Computes an external extent's end as ``offset + length`` in wrapping uint64 arithmetic: an extent
    whose end overflows wraps to a small number, passes the file-size check, and is accepted (reading it
    then fails)."""

    fault_id = "PAY-EXTERNAL-EXTENT.extent-sum-wraps"
    clauses = ("PAY-EXTERNAL-EXTENT",)
    boundary = True

    def patches(self):
        return [wrap(payload, "payload_extent", _extent_wrapping),
                wrap(payload, "open_external", _open_wrapping, aliases=False),
                wrap(payload, "open_payload", _read_wrapping)]


def _basename_only(original):
    def open_external(extent, base_dir, path):
        name = extent.location.replace("\\", "/").rstrip("/").rsplit("/", 1)[-1]
        return original(dataclasses.replace(extent, location=name or extent.location), base_dir, path)
    return open_external


class LocationBasenameOnly(Fault):
    """Opens an external payload by the last component of its location, in the model directory itself
    (``os.path.basename``): a backing file in a subdirectory is not found, or a same-named file beside the
    model is read instead."""

    fault_id = "PAY-EXTERNAL-EXTENT.location-basename-only"
    clauses = ("PAY-EXTERNAL-EXTENT",)

    def patches(self):
        return [wrap(payload, "open_external", _basename_only, aliases=False)]




def _thirty_two_bit(original):
    def decimal(text, path):
        return original(text, path) % (1 << 32)
    return decimal


class ExternalNumbersThirtyTwoBit(Fault):
    """Parses external offset and length into 32-bit integers (``(uint32_t)strtoull(...)``): numbers of 2**32
    and beyond wrap, so an extent far beyond a small file is read from its start."""

    fault_id = "PAY-EXTERNAL-EXTENT.numbers-thirty-two-bit"
    clauses = ("PAY-EXTERNAL-EXTENT", "PAY-EXTERNAL-KEYS")
    boundary = True

    def patches(self):
        return [wrap(payload, "_decimal", _thirty_two_bit)]


def _empty_extent_unopened(original):
    def open_external(extent, base_dir, path):
        if extent.length == 0:  # nothing to read: the backing file is never looked at
            return os.open(os.devnull, os.O_RDONLY)
        return original(extent, base_dir, path)
    return open_external


class EmptyExtentFileNotOpened(Fault):
    """Skips the backing file entirely for a zero-length extent (nothing to read, so nothing is opened): an
    empty external payload whose location names no file is accepted."""

    fault_id = "PAY-EXTERNAL-EXTENT.empty-extent-file-not-opened"
    clauses = ("PAY-EXTERNAL-EXTENT", "PAY-EMPTY")
    boundary = True

    def patches(self):
        return [wrap(payload, "open_external", _empty_extent_unopened, aliases=False)]


def _aligned_only(original):
    def open_external(extent, base_dir, path):
        if extent.offset % 4:
            raise violation(E.EXTERNAL_FILE_INVALID, path,
                            f"offset {extent.offset} is not 4-byte aligned: no typed view of the extent")
        return original(extent, base_dir, path)
    return open_external


class UnalignedOffsetRefused(Fault):
    """Refuses external offsets that are not a multiple of 4 (it maps payloads as typed views and will not
    read a FLOAT or INT32 from an unaligned address) instead of reading the bytes at any offset."""

    fault_id = "PAY-EXTERNAL-EXTENT.unaligned-offset-refused"
    clauses = ("PAY-EXTERNAL-EXTENT",)
    boundary = True

    def patches(self):
        return [wrap(payload, "open_external", _aligned_only, aliases=False)]


def _head_size_axis(original):
    def bind_affine(self, layout, nbytes):
        if layout.HasField("axis"):
            layout = type(layout).FromString(layout.SerializeToString())
            layout.axis = 2  # per-axis and blocked parameters are taken to run along head_size
        return original(self, layout, nbytes)
    return bind_affine


class BlockAxisAssumedHeadSize(Fault):
    """Reads every per-axis or blocked affine K/V block as if its parameters ran along head_size (the axis
    of the runtime's own block formats), whatever its axis field says: a caller's block with one scale per
    token (axis 0) or per head (axis 1) is refused for its parameter shape, or decoded along the wrong
    axis."""

    fault_id = "KV-PAGED-FORMATS.block-axis-assumed-head-size"
    clauses = ("KV-PAGED-FORMATS", "AFF-AXIS")

    def patches(self):
        return [wrap(formats.BlockCodec, "_bind_affine", _head_size_axis)]


def _slots_against_max_tokens(original):
    def kernel(args, attrs, ctx):
        limit = attrs.get("max_tokens", 4096)
        try:
            value, block_size = args[3], int(attrs.get("block_size", 16))
            geometry = paged.struct_geometry(value, "PagedAttention.past")
            cache = paged.PagedKVCache.from_struct(value, *geometry, block_size) if geometry else None
            new = args[1].shape[2]
        except (ContractError, AttributeError, IndexError, TypeError, ValueError):
            cache = None  # the kernel itself reports what is wrong with its inputs
        if cache is not None and isinstance(limit, int) and sum(b.tokens for b in cache.blocks) + new > limit:
            raise violation(E.KV_CAPACITY_EXCEEDED, "PagedAttention.max_tokens",
                            f"{sum(b.tokens for b in cache.blocks)} slots + {new} tokens exceed max_tokens {limit}")
        return original(args, attrs, ctx)
    return kernel


class MaxTokensCountsSlots(Fault):
    """Checks max_tokens against the cache's physical slots plus the new tokens instead of its valid tokens:
    a cache holding a partial block (a payload with unused slots) is refused an append that stays within
    max_tokens."""

    fault_id = "KV-MUTATION-FAILED.max-tokens-counts-slots"
    clauses = ("KV-MUTATION-FAILED", "KV-PAGED-RANGE")
    boundary = True

    def patches(self):
        return [wrap(kernels, "paged_attention_kernel", _slots_against_max_tokens)]


# ------------------------------------------------------------------------------ paged appends
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


class NewBlockAfterPartialSlots(Fault):
    """Starts the block that follows a partial block (a caller's block whose payload holds more slots
    than valid tokens) at the partial block's start plus its physical slots, not its valid length: the
    cache it returns has a gap in its token range, which the next call refuses."""

    fault_id = "KV-PAGED-RANGE.new-block-after-partial-slots"
    clauses = ("KV-PAGED-RANGE",)
    boundary = True

    def patches(self):
        return [Patch(paged.PagedKVCache, "append", _paged_append(start_after_slots=True))]


class FilledBlockLeftOpen(Fault):
    """Seals a full block into the cache's key/value formats only when the next block is started: a block
    filled by a call's last token is returned (and retained) dense, and Attention in that call reads its
    unencoded values."""

    fault_id = "KV-PAGED-FORMATS.filled-block-left-open"
    clauses = ("KV-PAGED-FORMATS",)
    boundary = True

    def patches(self):
        return [Patch(paged.PagedKVCache, "append", _paged_append(lazy_seal=True))]


__all__ = [name for name, obj in dict(globals()).items()
           if isinstance(obj, type) and issubclass(obj, Fault) and obj is not Fault]

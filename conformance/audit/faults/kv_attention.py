"""Faults in the attention kernel that reads KV caches: scale, masks, heads and quantized operands."""

from __future__ import annotations

import dataclasses

import numpy as np

from conformance.audit.fault import Patch, fault, name_faults, returning, wrap
from conformance.audit.faults.shared import attention_module, paged_attention_module
from reference_impl.errors import ErrorCode as E
from reference_impl.errors import violation
from reference_impl.kv import kernels


def _one_over_head_size(attrs, head_size, dtype):
    scale = attrs.scale if attrs.scale is not None else 1.0 / head_size
    return dtype.type(np.sqrt(scale))


def _interleaved(x, q_heads: int):
    """``x`` with its head axis read at ``h % kv_heads`` for each query head h (interleaved)."""
    return x[:, np.arange(q_heads) % x.shape[1]]


def _interleaved_scores(q, k):
    return np.matmul(q, np.swapaxes(_interleaved(k, q.shape[1]), -1, -2)).astype(q.dtype, copy=False)


def _interleaved_values(p, v):
    return np.matmul(p, _interleaved(v, p.shape[1])).astype(p.dtype, copy=False)


def _interleaved_scaled(x, scale):
    return x if scale is None else x * _interleaved(scale, x.shape[1]).T[None, :, None, :]  # scale: [t, Hq]


def _softcap_after_bias(raw, bias, softcap):
    capped = attention_module.apply_softcap(raw, softcap)
    if bias is None:
        return capped, capped
    return capped, attention_module.apply_softcap(raw + bias, softcap)


def _frontier_at_start(per_batch_only: bool):
    """attention.position_bias with the queries' offset zeroed (only the per-batch frontier of an external cache,
    nonpad_kv_seqlen, when ``per_batch_only``)."""
    def make(original):
        def position_bias(q_len, start, stop, offset, attrs, dtype):
            if np.ndim(offset):
                offset = np.zeros_like(offset)
            elif not per_batch_only:
                offset = 0
            return original(q_len, start, stop, offset, attrs, dtype)
        return position_bias
    return make


def _short_mask_attends(bias, mask, dtype, start, stop):
    if bias is None or stop <= mask.shape[-1]:
        return bias
    padded = max(start, mask.shape[-1]) - start  # the first key beyond the mask, within [start, stop)
    bias = bias.copy()
    bias[..., padded:] = 0  # padded with "attend"
    return bias


def _finite_minimum(bias, parts, shape, dtype):
    return None if bias is None else np.where(np.isneginf(bias), np.finfo(dtype).min, bias).astype(dtype, copy=False)


def _output_mode_read(mode):
    """attention.attention reading qk_matmul_output_mode ``m`` (when set) as ``mode(m)``."""
    def make(original):
        def attention(*args, **kwargs):
            attrs = kwargs.get("attrs")
            if attrs is not None and attrs.qk_matmul_output_mode:
                kwargs["attrs"] = dataclasses.replace(attrs, qk_matmul_output_mode=mode(attrs.qk_matmul_output_mode))
            return original(*args, **kwargs)
        return attention
    return make


def _nonpad_read(read) -> Patch:
    """attention.check_nonpad whose checked lengths (when given) come back as ``read(lengths, total)``."""
    return returning(attention_module, "check_nonpad",
                     lambda checked, nonpad, batch, total: None if checked is None else read(checked, total))


def _first_batch_mask(checked, mask, q_dtype, target):
    if checked is not None and checked.ndim == 4 and checked.shape[0] > 1:
        return checked[:1]  # the batch row of the mask is never advanced
    return checked


def _mask_batch_first(rank: int, what: str):
    """attention.check_mask taking a mask of ``rank`` dimensions for one with the batch first (the convention of
    older contrib attention operators), (batch, 1, ...) once its rows are checked against the batch."""
    def make(original):
        def check_mask(mask, q_dtype, target):
            if mask is not None and np.ndim(mask) == rank:
                mask = np.asarray(mask)
                if mask.shape[0] != target[0]:
                    raise violation(E.ATTENTION_INPUT_INVALID, "Attention.attn_mask",
                                    f"a {what} needs {target[0]} rows (the batch), got {mask.shape[0]}")
                mask = mask.reshape(target[0], *(1,) * (4 - rank), *mask.shape[1:])
            return original(mask, q_dtype, target)
        return check_mask
    return make


def _zero_scale_defaulted(original):
    def sqrt_scale(attrs, head_size, dtype):
        """attention.sqrt_scale reading the scale as ``attrs.scale or 1 / sqrt(head_size)``."""
        return original(dataclasses.replace(attrs, scale=attrs.scale or None), head_size, dtype)
    return sqrt_scale


def _qk_per_kv_head(out, *args, **kwargs):
    qk, hkv = out.qk_matmul_output, out.present_key.shape[1]
    if qk.ndim == 4 and hkv and qk.shape[1] > hkv:
        group = qk.shape[1] // hkv
        out = out._replace(qk_matmul_output=np.repeat(qk[:, ::group], group, axis=1))
    return out


def _split_without_transpose(x, num_heads, name):
    batch, seq, hidden = x.shape
    if num_heads <= 0 or hidden % num_heads:
        raise violation(E.ATTENTION_INPUT_INVALID, f"Attention.{name}",
                        f"hidden size {hidden} is not a multiple of {num_heads} heads")
    return x.reshape(batch, num_heads, seq, hidden // num_heads)


def _merge_without_transpose(y):
    batch, heads, seq, size = y.shape
    return y.reshape(batch, seq, heads * size)


def _zero_refused(lengths, total):
    if np.any(lengths < 1):
        raise violation(E.ATTENTION_INPUT_INVALID, "Attention.nonpad_kv_seqlen", f"values must lie in [1, {total}]")
    return lengths


def _empty_rows_nan(original):
    def attention(q, k, v, attn_mask=None, past_key=None, past_value=None, nonpad_kv_seqlen=None, **kwargs):
        out = original(q, k, v, attn_mask, past_key, past_value, nonpad_kv_seqlen, **kwargs)
        if nonpad_kv_seqlen is None:
            return out
        empty = np.asarray(nonpad_kv_seqlen) == 0
        if not empty.any():
            return out
        y = out.y.copy()
        y[empty] = np.nan  # softmax over no key: 0 / 0 in every output element of the row
        return out._replace(y=y)
    return attention


def _upper_bound_unchecked(original):
    def check_nonpad(nonpad, batch, total):
        if nonpad is None:
            return None
        array = np.asarray(nonpad)
        longest = max(int(array.max(initial=0)), total)
        return original(nonpad, batch, longest)  # checked against no cache length: only the sign and shape
    return check_nonpad


def _window_exclusive(original):
    def position_bias(q_len, start, stop, offset, attrs, dtype):
        """attention.position_bias with ``distance < size`` for each bounded window side."""
        if attrs.left_window_size < 0 and attrs.right_window_size < 0:
            return original(q_len, start, stop, offset, attrs, dtype)
        offset = np.asarray(offset, np.int64).reshape(-1, 1, 1, 1) if np.ndim(offset) else int(offset)
        query = np.arange(q_len, dtype=np.int64).reshape(q_len, 1) + offset
        key = np.arange(start, stop, dtype=np.int64).reshape(1, stop - start)
        allowed = np.ones(np.broadcast_shapes(np.shape(query), key.shape), dtype=bool)
        if attrs.is_causal:
            allowed &= key <= query
        if attrs.left_window_size >= 0:
            allowed &= query - key < attrs.left_window_size
        if attrs.right_window_size >= 0:
            allowed &= key - query < attrs.right_window_size
        return np.where(allowed, dtype.type(0), dtype.type(-np.inf))
    return position_bias


AttentionScaleWrong = fault("KV-ATTENTION.scale-one-over-d", ("KV-ATTENTION",),
    """Scales attention scores by ``1 / head_size`` instead of ``1 / sqrt(head_size)``.""",
    patches=lambda: [Patch(attention_module, "sqrt_scale", _one_over_head_size)])

GroupedHeadsInterleaved = fault("KV-ATTENTION.gqa-heads-interleaved", ("KV-ATTENTION",),
    """Maps query head h to key/value head ``h % kv_heads`` (interleaved) instead of ``h // (q_heads / kv_heads)``
    (consecutive groups) in grouped- and multi-query Attention.""",
    patches=lambda: [Patch(attention_module, "grouped_scores", _interleaved_scores),
                     Patch(attention_module, "grouped_values", _interleaved_values),
                     Patch(paged_attention_module, "_scaled", _interleaved_scaled)])

SoftcapAfterMask = fault("KV-ATTENTION.softcap-after-mask", ("KV-ATTENTION",),
    """Adds the mask and causal bias to the scores before the softcap: ``c * tanh((s + bias) / c)`` maps a masked key's
    -inf to -c, so masked keys get weight.""",
    patches=lambda: [Patch(attention_module, "biased_logits", _softcap_after_bias)])

CausalAlignedTopLeft = fault("KV-ATTENTION.causal-top-left", ("KV-ATTENTION",),
    """Aligns the causal frontier to the start of the keys: query i sees keys 0..i even when a past precedes this call's
    tokens (instead of past_length + i, bottom-right).""",
    patches=lambda: [wrap(attention_module, "position_bias", _frontier_at_start(False))])

ShortMaskPaddedToAttend = fault("KV-ATTENTION.short-mask-padded-attend", ("KV-ATTENTION",),
    """Pads an attention mask shorter than the total sequence with zeros (attend) instead of -inf, so the keys beyond
    the mask's end are attended.""", boundary=True,
    patches=lambda: [returning(attention_module, "mask_bias", _short_mask_attends)])

MaskedWithFiniteMinimum = fault("KV-ATTENTION.finite-mask-minimum", ("KV-ATTENTION",),
    """Masks with the type's most negative finite value instead of -inf: a query row whose every key is masked averages
    all the values (uniform softmax) instead of giving zeros.""", boundary=True,
    patches=lambda: [returning(attention_module, "combine_bias", _finite_minimum)])

ExternalCacheCausalTopLeft = fault("KV-ATTENTION.external-cache-causal-top-left", ("KV-ATTENTION",),
    """With ``nonpad_kv_seqlen`` (an external cache), aligns the causal frontier to the start of the keys (query i sees
    keys 0..i) instead of bottom-right at nonpad_kv_seqlen - q_sequence_length + i, the bug onnx's own reference had
    before 1.23; the past/present path stays right.""", boundary=True,
    patches=lambda: [wrap(attention_module, "position_bias", _frontier_at_start(True))])

ExternalCachePaddingAttended = fault("KV-ATTENTION.external-cache-padding-attended", ("KV-ATTENTION",),
    """Reads ``nonpad_kv_seqlen`` only for the causal frontier and never masks the padding slots behind it: without
    is_causal, every query also attends the cache's unused (zero) slots.""", boundary=True,
    patches=lambda: [Patch(attention_module, "padding_bias", lambda nonpad, start, stop, dtype: None)])

QkOutputModesSwapped = fault("KV-ATTENTION.qk-output-modes-swapped", ("KV-ATTENTION",),
    """Numbers qk_matmul_output's intermediate modes in the order of an older operator draft (1: scores plus mask, 2:
    after the softcap) instead of ONNX's (1: after the softcap, before the mask; 2: mask and softcap both applied).""",
    patches=lambda: [wrap(attention_module, "attention", _output_mode_read(lambda m: 3 - m if m in (1, 2) else m))])

QkOutputModeIgnored = fault("KV-ATTENTION.qk-output-mode-ignored", ("KV-ATTENTION",),
    """Always returns the raw scaled Q K^T as qk_matmul_output, whatever qk_matmul_output_mode asks.""",
    patches=lambda: [wrap(attention_module, "attention", _output_mode_read(lambda m: 0))])

NonpadFirstRowForAll = fault("KV-ATTENTION.nonpad-first-row-for-all", ("KV-ATTENTION",),
    """Reads ``nonpad_kv_seqlen`` as one length (its first element) for the whole batch: every batch row is padded, and
    its causal frontier placed, as if it held the first row's number of valid tokens.""", boundary=True,
    patches=lambda: [_nonpad_read(
        lambda lengths, total: np.full_like(lengths, lengths[0]) if lengths.size else lengths)])

MaskFirstBatchRowForAll = fault("KV-ATTENTION.mask-first-batch-row-for-all", ("KV-ATTENTION",),
    """Indexes a 4-D attention mask with batch row 0 for every batch row (the mask pointer is not advanced by the batch
    stride): each row is masked with the first row's mask.""", boundary=True,
    patches=lambda: [returning(attention_module, "check_mask", _first_batch_mask)])

TwoDimensionalMaskAsKeyPadding = fault("KV-ATTENTION.two-d-mask-as-key-padding", ("KV-ATTENTION",),
    """Takes a 2-D attention mask for a (batch, total_sequence) key padding mask (the convention of older contrib
    attention operators) instead of broadcasting it as (q_sequence, total_sequence): a mask with one row per query is
    refused unless it happens to have one row per batch entry, and then every query of a batch row gets that row.""",
    boundary=True, patches=lambda: [wrap(attention_module, "check_mask", _mask_batch_first(2, "2-D key padding mask"))])

ThreeDimensionalMaskBatchFirst = fault("KV-ATTENTION.three-d-mask-batch-first", ("KV-ATTENTION",),
    """Aligns a 3-D attention mask's dimensions from the left, as (batch, q_sequence, total_sequence) (the convention of
    older contrib attention operators), instead of broadcasting it from the right as (heads, q_sequence,
    total_sequence): a per-head mask is refused unless it happens to have one entry per batch row, and then it is
    applied per batch row to every head.""", boundary=True,
    patches=lambda: [wrap(attention_module, "check_mask", _mask_batch_first(3, "3-D mask"))])

ZeroScaleDefaulted = fault("KV-ATTENTION.zero-scale-defaulted", ("KV-ATTENTION",),
    """Reads Attention's scale as ``scale or 1 / sqrt(head_size)`` (0 taken for "not set", the convention of older
    contrib attention operators): an explicit scale of 0, which makes every score 0 (each query averages the values it
    may see), is replaced by the default.""", boundary=True,
    patches=lambda: [wrap(attention_module, "sqrt_scale", _zero_scale_defaulted)])

QkOutputPerKvHead = fault("KV-ATTENTION.qk-output-per-kv-head", ("KV-ATTENTION",),
    """Fills qk_matmul_output one row per key/value head (the scores of the first query head of each group) and repeats
    it over the group, as a grouped-query kernel that computes a group's scores together would: with grouped- or
    multi-query heads, every query head but the first of its group reports another head's scores.""",
    patches=lambda: [returning(attention_module, "attention", _qk_per_kv_head)])

PackedHeadsNotTransposed = fault("KV-ATTENTION.packed-heads-not-transposed", ("KV-ATTENTION",),
    """Splits 3-D (batch, sequence, heads * head_size) inputs into heads by a plain reshape to (batch, heads, sequence,
    head_size), and merges Y back the same way, without the transpose: with more than one token per call, the tokens and
    heads are scrambled.""",
    patches=lambda: [Patch(attention_module, "split_heads", _split_without_transpose),
                     Patch(attention_module, "merge_heads", _merge_without_transpose)])

NonpadZeroRejected = fault("KV-ATTENTION.nonpad-zero-rejected", ("KV-ATTENTION",),
    """Requires every ``nonpad_kv_seqlen`` value to be at least 1 (a sequence length taken to be positive): a batch row
    that holds no valid key yet (ONNX: its keys are all padding, its output rows zeros) is refused with
    ATTENTION_INPUT_INVALID.""", boundary=True,
    patches=lambda: [_nonpad_read(_zero_refused)])

NonpadZeroAsFullLength = fault("KV-ATTENTION.nonpad-zero-as-full-length", ("KV-ATTENTION",),
    """Reads a ``nonpad_kv_seqlen`` value of 0 as "no padding" (0 as the unset sentinel of a length field): a row with
    no valid key attends every slot of the cache, padding included, and its causal frontier is placed at the end of the
    cache.""", boundary=True, patches=lambda: [_nonpad_read(
        lambda lengths, total: np.where(lengths == 0, total, lengths))])  # 0 read as "not given"

NonpadEmptyRowNaN = fault("KV-ATTENTION.nonpad-empty-row-nan", ("KV-ATTENTION",),
    """Attends each batch row over its first ``nonpad_kv_seqlen`` keys only (the slice, not a -inf padding bias) and
    normalizes by the sum of their weights: a row with no valid key divides 0 by 0, so its output rows are NaN instead
    of the zeros ONNX gives a fully-masked row.""", boundary=True,
    patches=lambda: [wrap(kernels, "attention", _empty_rows_nan)])

NonpadBeyondCacheAccepted = fault("KV-ATTENTION.nonpad-beyond-cache-accepted", ("KV-ATTENTION",),
    """Checks ``nonpad_kv_seqlen`` for its type, shape and sign but not against the cache's length: a value beyond the
    slots K and V hold is taken as "every slot valid" (and its causal frontier placed beyond the cache), where a kernel
    bounding its key loop by the value would read past the buffer.""", boundary=True,
    patches=lambda: [wrap(attention_module, "check_nonpad", _upper_bound_unchecked)])

SlidingWindowExclusive = fault("KV-ATTENTION.sliding-window-exclusive", ("KV-ATTENTION",),
    """Reads Attention-25's ``left_window_size`` / ``right_window_size`` as exclusive bounds (``distance < size``, a
    common off-by-one): a window of 1 holds only the query's own position and a window of 0 none.""", boundary=True,
    patches=lambda: [wrap(attention_module, "position_bias", _window_exclusive)])

name_faults(globals())

"""Attention over a paged cache, one block at a time, with an online softmax.

For each block the kernel decodes that block's valid K and V (whatever their formats), scores the
queries against it, and folds the block into running row maxima, normalizers and weighted sums. The
workspace is one decoded block plus the scores for it: it does not grow with the context, and the
cache is never materialized or dequantized as a whole (clause KV-BOUNDED).

Semantics are ONNX Attention's (scale, softcap, additive/boolean mask, bottom-right causal frontier,
sliding window, GQA/MQA, zero rows when fully masked), computed in float32.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from reference_impl.errors import ErrorCode as E
from reference_impl.errors import fail
from reference_impl.kv.attention import (
    AttentionAttrs,
    apply_softcap,
    check_attrs,
    check_mask,
    grouped_scores,
    grouped_values,
    mask_bias,
    position_bias,
    sqrt_scale,
)
from reference_impl.kv.paged import PagedKVCache

_F32 = np.dtype(np.float32)


def _check(q: np.ndarray, caches: Sequence[PagedKVCache], attrs: AttentionAttrs) -> None:
    check_attrs(attrs)
    if attrs.softmax_precision not in (None, 1) or attrs.qk_matmul_output_mode:
        raise fail(E.ATTENTION_INPUT_INVALID, "PagedAttention",
                   "paged attention computes in float32 and exposes no qk_matmul_output")
    if q.ndim != 4 or q.dtype != _F32 or q.shape[0] != len(caches):
        raise fail(E.ATTENTION_INPUT_INVALID, "PagedAttention.Q",
                   f"expected float32 (B, Hq, Sq, D) with one cache per batch row, got {q.dtype}{list(q.shape)} "
                   f"and {len(caches)} caches")
    for index, cache in enumerate(caches):
        if q.shape[1] % cache.kv_heads or q.shape[3] != cache.head_size:
            raise fail(E.ATTENTION_INPUT_INVALID, f"PagedAttention.cache[{index}]",
                       f"{q.shape[1]} query heads of size {q.shape[3]} do not fit {cache.kv_heads} key/value "
                       f"heads of size {cache.head_size}")


def paged_attention(q: np.ndarray, caches: PagedKVCache | Sequence[PagedKVCache],
                    attn_mask: np.ndarray | None = None, attrs: AttentionAttrs | None = None,
                    offset: int | None = None, **kwargs) -> np.ndarray:
    """Y (B, Hq, Sq, Dv) for queries (B, Hq, Sq, D) over one cache per batch row.

    Query i of a row sits at absolute position ``offset + i``; by default the queries are the last Sq
    tokens of the cache (``offset = cache.end - Sq``), as after appending them. ``attn_mask`` indexes
    the cache's valid tokens in order on its last axis (shorter masks are -inf beyond their end).
    """
    attrs = AttentionAttrs(**kwargs) if attrs is None else attrs
    if isinstance(caches, PagedKVCache):
        caches = [caches]
    q = np.asarray(q)
    _check(q, caches, attrs)
    if attn_mask is not None:
        attn_mask = check_mask(attn_mask, q.dtype, q.shape[:3] + (max(c.count for c in caches),))
    rows = []
    for row, cache in enumerate(caches):
        mask = None
        if attn_mask is not None:
            mask = np.asarray(attn_mask)
            if mask.ndim == 4:
                mask = mask[row if mask.shape[0] > 1 else 0]
        rows.append(_attend_row(q[row:row + 1], cache, mask, attrs, offset))
    return np.concatenate(rows, axis=0)


def _attend_row(q: np.ndarray, cache: PagedKVCache, mask, attrs: AttentionAttrs, offset) -> np.ndarray:
    _, hq, sq, head = q.shape
    first = cache.blocks[0].start if cache.blocks else 0
    offset = cache.end - sq if offset is None else offset
    s = sqrt_scale(attrs, head, _F32)
    qs = q * s
    running_max = np.full((1, hq, sq, 1), -np.inf, _F32)
    normalizer = np.zeros((1, hq, sq, 1), _F32)
    acc = np.zeros((1, hq, sq, cache.v_head_size), _F32)
    attended = np.zeros((1, hq, sq, 1), bool)
    for block in cache.blocks:
        k, v = block.decode()
        k = k.transpose(1, 0, 2)[None]  # (1, Hkv, t, D)
        v = v.transpose(1, 0, 2)[None]
        lo, hi = block.start, block.start + block.valid
        scores = apply_softcap(grouped_scores(qs, k * s), attrs.softcap)
        bias = _block_bias(mask, sq, lo, hi, first, offset, attrs)
        if bias is not None:
            scores = scores + bias
            attended |= ~np.isneginf(np.max(bias, axis=-1, keepdims=True))
        else:
            attended[...] = True
        block_max = np.max(scores, axis=-1, keepdims=True)
        new_max = np.maximum(running_max, block_max)
        safe_max = np.where(np.isneginf(new_max), _F32.type(0), new_max)
        correction = np.exp(running_max - safe_max)
        weights = np.exp(scores - safe_max)
        normalizer = normalizer * correction + np.sum(weights, axis=-1, keepdims=True)
        acc = acc * correction + grouped_values(weights, v)
        running_max = new_max
    keep = attended & (normalizer > 0)
    return np.where(keep, acc / np.where(keep, normalizer, _F32.type(1)), _F32.type(0))


def _block_bias(mask, sq: int, lo: int, hi: int, first: int, offset: int, attrs: AttentionAttrs):
    parts = [mask_bias(mask, _F32, lo - first, hi - first), position_bias(sq, lo, hi, offset, attrs, _F32)]
    parts = [p for p in parts if p is not None]
    if not parts:
        return None
    bias = parts[0]
    for part in parts[1:]:
        bias = bias + part
    return bias

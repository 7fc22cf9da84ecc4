"""Attention over a paged cache, a bounded group of blocks at a time, with an online softmax.

The blocks are walked in groups (``block_groups``): consecutive blocks of one representation, up to
``GROUP_TOKENS`` tokens, decoded together. Each group's scores are folded into running row maxima,
normalizers and weighted sums (``OnlineSoftmax``), so the workspace is one group of decoded K/V plus its
scores: it does not grow with the context, and the cache is never materialized or dequantized as a whole
(clause KV-BOUNDED). The peak is reported to the KV counters (``workspace_peak``).

Semantics are ONNX Attention's (scale, softcap, additive/boolean mask, bottom-right causal frontier,
sliding window, GQA/MQA, zero rows when fully masked), computed in float32 with the dense operator's own
helpers (``attention.py``), so the paged and dense paths cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from reference_impl.errors import ErrorCode as E
from reference_impl.errors import fail
from reference_impl.kv import attention as A
from reference_impl.kv import paged
from reference_impl.kv.paged import PagedKVCache
from reference_impl.kv.storage import record_workspace

_F32 = np.dtype(np.float32)


def _check(q: np.ndarray, caches: Sequence[PagedKVCache], attrs: A.AttentionAttrs) -> None:
    A.check_attrs(attrs)
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
                    attn_mask: np.ndarray | None = None, attrs: A.AttentionAttrs | None = None,
                    offset: int | None = None, **kwargs) -> np.ndarray:
    """Y (B, Hq, Sq, Dv) for queries (B, Hq, Sq, D) over one cache per batch row.

    Query i of a row sits at absolute position ``offset + i``; by default the queries are the last Sq
    tokens of the cache (``offset = cache.end - Sq``), as after appending them. ``attn_mask`` indexes
    the cache's valid tokens in order on its last axis (shorter masks are -inf beyond their end).
    """
    attrs = A.AttentionAttrs(**kwargs) if attrs is None else attrs
    if isinstance(caches, PagedKVCache):
        caches = [caches]
    q = np.asarray(q)
    _check(q, caches, attrs)
    if attn_mask is not None:
        attn_mask = A.check_mask(attn_mask, q.dtype, q.shape[:3] + (max(c.count for c in caches),))
    rows = []
    for row, cache in enumerate(caches):
        mask = None
        if attn_mask is not None:
            mask = np.asarray(attn_mask)
            if mask.ndim == 4:
                mask = mask[row if mask.shape[0] > 1 else 0]
        rows.append(_attend_row(q[row:row + 1], cache, mask, attrs, offset))
    return np.concatenate(rows, axis=0)


class OnlineSoftmax:
    """softmax(logits) @ V accumulated group by group: a running row maximum, the normalizer and the
    weighted sum, rescaled whenever the maximum grows (so exp never overflows, whatever the logits)."""

    def __init__(self, hq: int, sq: int, v_head: int):
        self.row_max = np.full((1, hq, sq, 1), -np.inf, _F32)
        self.normalizer = np.zeros((1, hq, sq, 1), _F32)
        self.acc = np.zeros((1, hq, sq, v_head), _F32)
        self.attended = np.zeros((1, hq, sq, 1), bool)

    def add(self, logits: np.ndarray, v: np.ndarray, bias) -> np.ndarray:
        """Fold one group's logits (1, Hq, Sq, t) and values (1, Hkv, t, Dv); returns its weights."""
        if bias is None:
            self.attended[...] = True
        else:
            self.attended |= ~np.isneginf(np.max(bias, axis=-1, keepdims=True))
        new_max = np.maximum(self.row_max, np.max(logits, axis=-1, keepdims=True))
        safe_max = np.where(np.isneginf(new_max), _F32.type(0), new_max)
        correction = np.exp(self.row_max - safe_max)
        weights = np.exp(logits - safe_max)
        self.normalizer = self.normalizer * correction + np.sum(weights, axis=-1, keepdims=True)
        self.acc = self.acc * correction + A.grouped_values(weights, v)
        self.row_max = new_max
        return weights

    def result(self) -> np.ndarray:
        keep = self.attended & (self.normalizer > 0)
        return np.where(keep, self.acc / np.where(keep, self.normalizer, _F32.type(1)), _F32.type(0))

    @property
    def nbytes(self) -> int:
        return self.row_max.nbytes + self.normalizer.nbytes + self.acc.nbytes + self.attended.nbytes


def _attend_row(q: np.ndarray, cache: PagedKVCache, mask, attrs: A.AttentionAttrs, offset) -> np.ndarray:
    _, hq, sq, head = q.shape
    first = cache.blocks[0].start if cache.blocks else 0
    offset = cache.end - sq if offset is None else offset
    s = A.sqrt_scale(attrs, head, _F32)
    qs = q * s
    softmax = OnlineSoftmax(hq, sq, cache.v_head_size)
    for group in paged.block_groups(cache.blocks):
        kd, vd = group.decode()  # (t, Hkv, D) and (t, Hkv, Dv): this group's valid tokens only
        k = kd.transpose(1, 0, 2)[None]
        v = vd.transpose(1, 0, 2)[None]
        ks = k * s
        raw = A.grouped_scores(qs, ks)
        bias = _group_bias(mask, sq, group.start, group.stop, first, offset, attrs)
        capped, logits = A.biased_logits(raw, bias, attrs.softcap)
        weights = softmax.add(logits, v, bias)
        held = [ks, raw, capped, logits, weights, bias] + ([kd, vd] if group.allocates else [])
        scratch = {id(a): a.nbytes for a in held if isinstance(a, np.ndarray)}
        record_workspace(sum(scratch.values()) + qs.nbytes + softmax.nbytes)
    return softmax.result()


def _group_bias(mask, sq: int, lo: int, hi: int, first: int, offset: int, attrs: A.AttentionAttrs):
    parts = [A.mask_bias(mask, _F32, lo - first, hi - first), A.position_bias(sq, lo, hi, offset, attrs, _F32)]
    parts = [p for p in parts if p is not None]
    if not parts:
        return None
    bias = parts[0]
    for part in parts[1:]:
        bias = bias + part
    return bias

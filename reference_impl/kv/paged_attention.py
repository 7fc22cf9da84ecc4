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
from reference_impl.errors import violation
from reference_impl.kv import attention as A
from reference_impl.kv import paged
from reference_impl.kv.paged import PagedKVCache
from reference_impl.kv.storage import counting_active, record_workspace

_F32 = np.dtype(np.float32)


def _check(q: np.ndarray, caches: Sequence[PagedKVCache], attrs: A.AttentionAttrs) -> None:
    A.check_attrs(attrs)
    if attrs.softmax_precision not in (None, 1) or attrs.qk_matmul_output_mode:
        raise violation(E.ATTENTION_INPUT_INVALID, "PagedAttention",
                        "paged attention computes in float32 and exposes no qk_matmul_output")
    if q.ndim != 4 or q.dtype != _F32 or q.shape[0] != len(caches):
        raise violation(E.ATTENTION_INPUT_INVALID, "PagedAttention.Q",
                        f"expected float32 (B, Hq, Sq, D) with one cache per batch row, got {q.dtype}{list(q.shape)} "
                        f"and {len(caches)} caches")
    for index, cache in enumerate(caches):
        if q.shape[1] % cache.kv_heads or q.shape[3] != cache.head_size:
            raise violation(E.ATTENTION_INPUT_INVALID, f"PagedAttention.cache[{index}]",
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
        self.shape = (1, hq, sq, v_head)
        self.row_max = np.full((1, hq, sq, 1), -np.inf, _F32)
        self.normalizer = self.acc = None  # until the first group
        self.attended = np.zeros((1, hq, sq, 1), bool)

    def add(self, logits: np.ndarray, v: np.ndarray, bias, v_scale: np.ndarray | None = None) -> np.ndarray:
        """Fold one group's logits (1, Hq, Sq, t) and values (1, Hkv, t, Dv) (times ``v_scale`` [t, Hkv]
        per token and head, when given); returns its weights."""
        if bias is None:
            self.attended[...] = True
        else:
            self.attended |= ~np.isneginf(bias.max(axis=-1, keepdims=True))
        new_max = logits.max(axis=-1, keepdims=True)
        first = self.normalizer is None
        if not first:
            new_max = np.maximum(self.row_max, new_max)
        # Without a bias no logit is -inf; with one, a row that has seen no key yet stays -inf: shift by 0.
        safe_max = new_max if bias is None else np.where(np.isneginf(new_max), _F32.type(0), new_max)
        weights = np.exp(logits - safe_max)
        part = A.grouped_values(_scaled(weights, v_scale), v)
        if first:
            self.normalizer, self.acc = weights.sum(axis=-1, keepdims=True), part
        else:
            correction = np.exp(self.row_max - safe_max)
            self.normalizer = self.normalizer * correction + weights.sum(axis=-1, keepdims=True)
            self.acc = self.acc * correction + part
        self.row_max = new_max
        return weights

    def result(self) -> np.ndarray:
        if self.normalizer is None:  # an empty cache: nothing to attend
            return np.zeros(self.shape, _F32)
        keep = self.attended & (self.normalizer > 0)
        if keep.all():
            return self.acc / self.normalizer
        return np.where(keep, self.acc / np.where(keep, self.normalizer, _F32.type(1)), _F32.type(0))

    @property
    def nbytes(self) -> int:
        return 2 * self.row_max.nbytes + self.attended.nbytes + int(np.prod(self.shape)) * 4


def _attend_row(q: np.ndarray, cache: PagedKVCache, mask, attrs: A.AttentionAttrs, offset) -> np.ndarray:
    _, hq, sq, head = q.shape
    first = cache.blocks[0].start if cache.blocks else 0
    offset = cache.end - sq if offset is None else offset
    s = A.sqrt_scale(attrs, head, _F32)
    qs = (q * s) * s  # the whole scale on the queries: the cache is read as it is stored, never rescaled
    softmax = OnlineSoftmax(hq, sq, cache.v_head_size)
    counting = counting_active()
    for group in paged.block_groups(cache.blocks):
        keys, key_scale = group.factored("key")  # (t, Hkv, D): this group's valid tokens only
        raw = _scaled(A.grouped_scores(qs, keys.transpose(1, 0, 2)[None]), key_scale)
        decoded = keys.nbytes if group.allocates else 0
        del keys  # released before V is decoded
        bias = _group_bias(mask, sq, group.start, group.stop, first, offset, attrs)
        capped, logits = A.biased_logits(raw, bias, attrs.softcap)
        values, value_scale = group.factored("value")
        weights = softmax.add(logits, values.transpose(1, 0, 2)[None], bias, value_scale)
        if counting:
            decoded = max(decoded, values.nbytes if group.allocates else 0)
            scratch = {id(a): a.nbytes for a in (raw, capped, logits, weights, bias) if isinstance(a, np.ndarray)}
            record_workspace(sum(scratch.values()) + decoded + qs.nbytes + softmax.nbytes)
        del values, raw, capped, logits, weights  # before the next group is decoded
    return softmax.result()


def _scaled(x: np.ndarray, scale: np.ndarray | None) -> np.ndarray:
    """(1, Hq, Sq, t) scores or weights times a per-token, per-KV-head scale [t, Hkv] (query head h uses KV
    head h // (Hq / Hkv)); ``x`` itself when there is no scale."""
    if scale is None:
        return x
    batch, hq, sq, t = x.shape
    hkv = scale.shape[1]
    grouped = x.reshape(batch, hkv, (hq // hkv) * sq, t) * scale.T[None, :, None, :]
    return grouped.reshape(batch, hq, sq, t)


def _group_bias(mask, sq: int, lo: int, hi: int, first: int, offset: int, attrs: A.AttentionAttrs):
    parts = [A.mask_bias(mask, _F32, lo - first, hi - first), A.position_bias(sq, lo, hi, offset, attrs, _F32)]
    parts = [p for p in parts if p is not None]
    if not parts:
        return None
    bias = parts[0]
    for part in parts[1:]:
        bias = bias + part
    return bias

"""Reference ONNX ``Attention`` (opsets 23-25) over dense NumPy tensors.

The computation follows the operator's documented pattern step by step and in the input precision:
``Q*sqrt(scale) @ (K*sqrt(scale))^T -> softcap -> + bias -> softmax -> @ V``. The bias composes the
attention mask, the bottom-right causal frontier, the optional sliding window and the ``nonpad_kv_seqlen``
padding additively (0 or -inf). A query row whose bias is -inf everywhere yields zeros.

The bias and score helpers take the absolute positions of the keys they cover, so the paged kernel
(``paged_attention``) reuses them block by block and agrees with this dense oracle.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

import ml_dtypes
import numpy as np

from reference_impl.errors import ErrorCode as E
from reference_impl.errors import violation
from reference_impl.kv.storage import counting_active, record_workspace

_PATH = "Attention"
FLOAT_TYPES = (np.dtype(np.float32), np.dtype(np.float16), np.dtype(np.float64),
               np.dtype(ml_dtypes.bfloat16))
#: softmax_precision values the operator accepts (TensorProto FLOAT, FLOAT16, DOUBLE, BFLOAT16).
SOFTMAX_PRECISION = {1: np.dtype(np.float32), 10: np.dtype(np.float16), 11: np.dtype(np.float64),
                     16: np.dtype(ml_dtypes.bfloat16)}

AppendFn = Callable[[np.ndarray, np.ndarray], np.ndarray]
#: (past_key, new_key, past_value, new_value) -> (present_key, present_value), as one update
AppendKVFn = Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]


@dataclass(frozen=True)
class AttentionAttrs:
    """The operator's attributes with their defaults (``scale=None`` means 1/sqrt(head_size))."""

    scale: float | None = None
    is_causal: bool = False
    q_num_heads: int | None = None
    kv_num_heads: int | None = None
    softcap: float = 0.0
    softmax_precision: int | None = None
    qk_matmul_output_mode: int = 0
    left_window_size: int = -1
    right_window_size: int = -1


class AttentionOutputs(NamedTuple):
    y: np.ndarray
    present_key: np.ndarray
    present_value: np.ndarray
    qk_matmul_output: np.ndarray


def _bad(path: str, message: str):
    return violation(E.ATTENTION_INPUT_INVALID, f"{_PATH}.{path}", message)


# ----------------------------------------------------------------------------- shapes and validation
def split_heads(x: np.ndarray, num_heads: int, name: str) -> np.ndarray:
    """(batch, seq, heads * size) -> (batch, heads, seq, size)."""
    batch, seq, hidden = x.shape
    if num_heads <= 0 or hidden % num_heads:
        raise _bad(name, f"hidden size {hidden} is not a multiple of {num_heads} heads")
    return x.reshape(batch, seq, num_heads, hidden // num_heads).transpose(0, 2, 1, 3)


def merge_heads(y: np.ndarray) -> np.ndarray:
    """(batch, heads, seq, size) -> (batch, seq, heads * size)."""
    batch, heads, seq, size = y.shape
    return y.transpose(0, 2, 1, 3).reshape(batch, seq, heads * size)


def check_attrs(attrs: AttentionAttrs) -> None:
    if attrs.qk_matmul_output_mode not in (0, 1, 2, 3):
        raise _bad("qk_matmul_output_mode", f"{attrs.qk_matmul_output_mode} is not 0, 1, 2 or 3")
    if attrs.softmax_precision is not None and attrs.softmax_precision not in SOFTMAX_PRECISION:
        raise _bad("softmax_precision", f"{attrs.softmax_precision} is not FLOAT, FLOAT16, DOUBLE or BFLOAT16")
    for name in ("left_window_size", "right_window_size"):
        if getattr(attrs, name) < -1:
            raise _bad(name, "must be -1 (unbounded) or nonnegative")
    if attrs.scale is not None and not np.isfinite(attrs.scale):
        raise _bad("scale", "must be finite")


def _to_4d(q, k, v, attrs: AttentionAttrs):
    if not q.ndim == k.ndim == v.ndim or q.ndim not in (3, 4):
        raise _bad("Q", f"Q, K and V must all be 3-D or all 4-D, got ranks {q.ndim}, {k.ndim}, {v.ndim}")
    if q.ndim == 3:
        if attrs.q_num_heads is None or attrs.kv_num_heads is None:
            raise _bad("q_num_heads", "3-D inputs need q_num_heads and kv_num_heads")
        return (split_heads(q, attrs.q_num_heads, "Q"), split_heads(k, attrs.kv_num_heads, "K"),
                split_heads(v, attrs.kv_num_heads, "V"))
    for name, given, actual in (("q_num_heads", attrs.q_num_heads, q.shape[1]),
                                ("kv_num_heads", attrs.kv_num_heads, k.shape[1])):
        if given is not None and given != actual:
            raise _bad(name, f"{given} contradicts the 4-D input's {actual} heads")
    return q, k, v


def check_geometry(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> None:
    """4-D Q (B, Hq, Sq, D), K (B, Hkv, T, D), V (B, Hkv, T, Dv) with Hq a multiple of Hkv."""
    for name, x in (("Q", q), ("K", k), ("V", v)):
        if x.dtype not in FLOAT_TYPES:
            raise _bad(name, f"element type {x.dtype} is not a floating type")
    if not q.dtype == k.dtype == v.dtype:
        raise _bad("K", f"Q, K and V element types differ ({q.dtype}, {k.dtype}, {v.dtype})")
    if not q.shape[0] == k.shape[0] == v.shape[0]:
        raise _bad("K", "batch sizes of Q, K and V differ")
    if k.shape[1] != v.shape[1] or k.shape[2] != v.shape[2]:
        raise _bad("V", f"K {k.shape} and V {v.shape} disagree on heads or sequence length")
    if q.shape[3] != k.shape[3]:
        raise _bad("K", f"Q head size {q.shape[3]} differs from K head size {k.shape[3]}")
    if k.shape[1] == 0 or q.shape[1] % k.shape[1]:
        raise _bad("K", f"{q.shape[1]} query heads are not a multiple of {k.shape[1]} key/value heads")


def _check_past(k, v, past_key, past_value, nonpad) -> None:
    if (past_key is None) != (past_value is None):
        raise _bad("past_key", "past_key and past_value must be given together")
    if past_key is None:
        return
    if nonpad is not None:
        raise _bad("nonpad_kv_seqlen", "cannot be combined with past_key/past_value")
    if past_key.dtype != k.dtype or past_value.dtype != v.dtype:
        raise _bad("past_key", "past and new key/value element types differ")
    if past_key.ndim != 4 or past_key.shape[:2] != k.shape[:2] or past_key.shape[3] != k.shape[3]:
        raise _bad("past_key", f"shape {past_key.shape} does not extend K {k.shape}")
    if past_value.ndim != 4 or past_value.shape[:2] != v.shape[:2] or past_value.shape[3] != v.shape[3] \
            or past_value.shape[2] != past_key.shape[2]:
        raise _bad("past_value", f"shape {past_value.shape} does not extend V {v.shape} like past_key")


def check_nonpad(nonpad, batch: int, total: int) -> np.ndarray | None:
    if nonpad is None:
        return None
    nonpad = np.asarray(nonpad)
    if nonpad.dtype != np.int64 or nonpad.shape != (batch,):
        raise _bad("nonpad_kv_seqlen", f"must be int64 of shape ({batch},), got {nonpad.dtype} {nonpad.shape}")
    if np.any(nonpad < 0) or np.any(nonpad > total):
        raise _bad("nonpad_kv_seqlen", f"values must lie in [0, {total}]")
    return nonpad


def check_mask(mask, q_dtype: np.dtype, target: tuple[int, int, int, int]) -> np.ndarray | None:
    """A boolean or Q-typed mask broadcastable to (B, Hq, Sq, <=T)."""
    if mask is None:
        return None
    mask = np.asarray(mask)
    if mask.dtype != np.bool_ and mask.dtype != q_dtype:
        raise _bad("attn_mask", f"element type {mask.dtype} is neither bool nor the query type {q_dtype}")
    if mask.ndim > 4 or mask.ndim == 0:
        raise _bad("attn_mask", f"rank {mask.ndim} is not 1..4")
    if mask.shape[-1] > target[3]:
        raise _bad("attn_mask", f"last dimension {mask.shape[-1]} exceeds the total length {target[3]}")
    try:
        np.broadcast_shapes(mask.shape[:-1], target[:-1])
    except ValueError:
        raise _bad("attn_mask", f"shape {mask.shape} does not broadcast to {target}") from None
    return mask


# ----------------------------------------------------------------------------- bias
def mask_bias(mask: np.ndarray | None, dtype: np.dtype, start: int, stop: int) -> np.ndarray | None:
    """Additive bias of the mask for keys [start, stop); keys beyond a short mask are -inf."""
    if mask is None:
        return None
    width = mask.shape[-1]
    inside = mask[..., start:min(stop, width)]
    if mask.dtype == np.bool_:
        inside = np.where(inside, dtype.type(0), dtype.type(-np.inf))
    if stop <= width:
        return inside
    pad = np.full(mask.shape[:-1] + (stop - max(start, width),), -np.inf, dtype=dtype)
    return np.concatenate([inside.astype(dtype, copy=False), pad], axis=-1)


def position_bias(q_len: int, start: int, stop: int, offset, attrs: AttentionAttrs,
                  dtype: np.dtype) -> np.ndarray | None:
    """Causal/window bias for keys [start, stop): query i sits at absolute position offset + i.

    ``offset`` is an int, or an int array of shape (B,) for per-batch frontiers (external cache).
    """
    windowed = attrs.left_window_size >= 0 or attrs.right_window_size >= 0
    if not attrs.is_causal and not windowed:
        return None
    if not windowed and np.ndim(offset) == 0 and offset >= stop - 1:
        return None  # causal, and even the first query is at or after every key here: nothing is hidden
    per_batch = np.ndim(offset) > 0
    offset = np.asarray(offset, dtype=np.int64).reshape(-1, 1, 1, 1) if per_batch else int(offset)
    query = np.arange(q_len, dtype=np.int64).reshape(q_len, 1) + offset
    key = np.arange(start, stop, dtype=np.int64).reshape(1, stop - start)
    allowed = np.ones(np.broadcast_shapes(np.shape(query), key.shape), dtype=bool)
    if attrs.is_causal:
        allowed &= key <= query
    if attrs.left_window_size >= 0:
        allowed &= query - key <= attrs.left_window_size
    if attrs.right_window_size >= 0:
        allowed &= key - query <= attrs.right_window_size
    return np.where(allowed, dtype.type(0), dtype.type(-np.inf))


def padding_bias(nonpad: np.ndarray | None, start: int, stop: int, dtype: np.dtype) -> np.ndarray | None:
    if nonpad is None:
        return None
    key = np.arange(start, stop, dtype=np.int64)
    valid = key[None, :] < nonpad[:, None]
    return np.where(valid, dtype.type(0), dtype.type(-np.inf)).reshape(len(nonpad), 1, 1, stop - start)


def combine_bias(parts: list, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray | None:
    """The sum of the bias parts (None: no part, nothing is masked)."""
    present = [part for part in parts if part is not None]
    if not present:
        return None
    bias = np.zeros(shape[-2:], dtype=dtype)
    for part in present:
        bias = bias + part
    return bias


# ----------------------------------------------------------------------------- scores and softmax
def sqrt_scale(attrs: AttentionAttrs, head_size: int, dtype: np.dtype):
    """sqrt(scale) in the input precision (scale defaults to 1/sqrt(head_size)); math.sqrt and np.sqrt
    both round correctly, np.sqrt keeps a negative scale's NaN."""
    scale = attrs.scale if attrs.scale is not None else 1.0 / math.sqrt(head_size)
    return dtype.type(math.sqrt(scale) if scale >= 0 else np.sqrt(scale))


def grouped_scores(q: np.ndarray, k: np.ndarray) -> np.ndarray:
    """(B, Hq, Sq, D) x (B, Hkv, T, D) -> (B, Hq, Sq, T); query head h reads key head h // (Hq/Hkv)."""
    batch, hq, sq, d = q.shape
    hkv, t = k.shape[1], k.shape[2]
    grouped = q.reshape(batch, hkv, (hq // hkv) * sq, d)
    # K @ Q^T, transposed back: the same dot products, and BLAS runs it several times faster than Q @ K^T
    # when there are few queries and many keys (decode).
    scores = np.swapaxes(np.matmul(k, np.swapaxes(grouped, -1, -2)), -1, -2)
    return scores.astype(q.dtype, copy=False).reshape(batch, hq, sq, t)


#: Keys scaled at a time: ``scaled_scores`` never holds a scaled copy of more of the cache than this.
SCORE_CHUNK = 1024


def scaled_scores(qs: np.ndarray, k: np.ndarray, s) -> np.ndarray:
    """``grouped_scores(qs, k * s)`` computed over chunks of keys, so the scaled copy of K stays bounded."""
    total = k.shape[2]
    if total <= SCORE_CHUNK:
        return grouped_scores(qs, (k * s).astype(qs.dtype, copy=False))
    out = np.empty(qs.shape[:3] + (total,), qs.dtype)
    for start in range(0, total, SCORE_CHUNK):
        chunk = k[:, :, start:start + SCORE_CHUNK]
        out[..., start:start + chunk.shape[2]] = grouped_scores(qs, (chunk * s).astype(qs.dtype, copy=False))
    return out


def grouped_values(p: np.ndarray, v: np.ndarray) -> np.ndarray:
    """(B, Hq, Sq, T) x (B, Hkv, T, Dv) -> (B, Hq, Sq, Dv) with the same head grouping."""
    batch, hq, sq, t = p.shape
    hkv = v.shape[1]
    out = np.matmul(p.reshape(batch, hkv, (hq // hkv) * sq, t), v)
    return out.astype(p.dtype, copy=False).reshape(batch, hq, sq, v.shape[3])


def apply_softcap(scores: np.ndarray, softcap: float) -> np.ndarray:
    if softcap > 0:
        cap = scores.dtype.type(softcap)
        return np.tanh(scores / cap) * cap
    return scores


def biased_logits(raw: np.ndarray, bias, softcap: float) -> tuple[np.ndarray, np.ndarray]:
    """(softcapped scores, softcapped scores + bias): the softcap applies to the raw product, before the
    mask and causal bias are added (the operator's order), so masked keys stay -inf."""
    capped = apply_softcap(raw, softcap)
    return capped, capped if bias is None else capped + bias


def softmax_rows(x: np.ndarray) -> np.ndarray:
    """Softmax over the last axis; a row that is -inf everywhere becomes zeros, not NaN."""
    row_max = x.max(axis=-1, keepdims=True)
    if np.isneginf(row_max).any():  # such rows are shifted by 0: exp gives zeros, their sum 0
        row_max = np.where(np.isneginf(row_max), x.dtype.type(0), row_max)
    e = np.exp(x - row_max)
    total = e.sum(axis=-1, keepdims=True)
    if not total.all():
        total = np.where(total == 0, x.dtype.type(1), total)
    e /= total
    return e


def fully_masked(bias: np.ndarray) -> np.ndarray:
    """Rows with no attendable key, decided on the bias alone (never on possibly-NaN logits)."""
    return np.isneginf(np.max(bias, axis=-1, keepdims=True))


def concat_append(past: np.ndarray, new: np.ndarray) -> np.ndarray:
    """Functional cache update: present = Concat(past, new) along the sequence axis."""
    return np.concatenate([past, new], axis=2)


# ----------------------------------------------------------------------------- the operator
def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, attn_mask: np.ndarray | None = None,
              past_key: np.ndarray | None = None, past_value: np.ndarray | None = None,
              nonpad_kv_seqlen: np.ndarray | None = None, attrs: AttentionAttrs | None = None,
              append: AppendFn = concat_append, append_kv: AppendKVFn | None = None,
              **kwargs) -> AttentionOutputs:
    """ONNX Attention. Attributes come as ``attrs`` or keyword arguments of AttentionAttrs.

    ``append(past, new)`` builds present_key/present_value; it defaults to Concat and may be a cache
    kernel (``kv.contiguous.append``) that writes only the new tokens but must return the same values.
    ``append_kv`` replaces both calls with one update (``kv.contiguous.append_kv``: all or nothing).
    Every input is validated before the cache is touched.
    """
    attrs = AttentionAttrs(**kwargs) if attrs is None else attrs
    check_attrs(attrs)
    q, k, v = (np.asarray(x) for x in (q, k, v))
    rank = q.ndim
    q4, k4, v4 = _to_4d(q, k, v, attrs)
    check_geometry(q4, k4, v4)
    _check_past(k4, v4, past_key, past_value, nonpad_kv_seqlen)
    dtype = q4.dtype
    past_len = 0 if past_key is None else past_key.shape[2]
    batch, hq, sq, head = q4.shape
    total = past_len + k4.shape[2]
    nonpad = check_nonpad(nonpad_kv_seqlen, batch, total)
    mask = check_mask(attn_mask, dtype, (batch, hq, sq, total))
    present_key, present_value = k4, v4  # without a cache, present is the new K/V (as onnx does)
    if past_key is not None:
        if append_kv is not None:
            present_key, present_value = append_kv(past_key, k4, past_value, v4)
        else:
            present_key, present_value = append(past_key, k4), append(past_value, v4)
        k4, v4 = present_key, present_value

    offset = past_len if nonpad is None else nonpad - sq
    bias = combine_bias([mask_bias(mask, dtype, 0, total),
                         position_bias(sq, 0, total, offset, attrs, dtype),
                         padding_bias(nonpad, 0, total, dtype)], (sq, total), dtype)
    s = sqrt_scale(attrs, head, dtype)
    qs = (q4 * s).astype(dtype, copy=False)
    raw = scaled_scores(qs, k4, s)
    capped, biased = biased_logits(raw, bias, attrs.softcap)
    precision = SOFTMAX_PRECISION.get(attrs.softmax_precision, dtype)
    probs = softmax_rows(biased.astype(precision, copy=False))
    if bias is not None:
        probs = np.where(fully_masked(bias), precision.type(0), probs)
    mode = attrs.qk_matmul_output_mode
    qk = {0: raw, 1: capped, 2: biased, 3: probs}[mode].astype(dtype, copy=False)
    y = grouped_values(probs.astype(dtype, copy=False), v4)
    if counting_active():
        scratch = {id(a): a.nbytes for a in (qs, raw, capped, biased, probs, bias, qk) if isinstance(a, np.ndarray)}
        record_workspace(sum(scratch.values()) + min(k4.shape[2], SCORE_CHUNK) * k4[0, :, :1].nbytes * len(k4))
    if rank == 3:
        y = merge_heads(y)
    return AttentionOutputs(y, present_key, present_value, qk)

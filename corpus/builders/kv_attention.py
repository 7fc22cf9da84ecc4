"""The attention formula the KV builders' expected values come from, in NumPy: softmax(Q K^T * scale) V over
every key so far, with grouped heads, softcap, the causal frontier and float or boolean masks. Its own module
so the contiguous, paged and semantics builders share it without importing each other."""

from __future__ import annotations

import numpy as np


def attention_formula(q, k, v, past_length: int, scale: float | None = None, softcap: float = 0.0,
                      causal: bool = False, mask: np.ndarray | None = None) -> np.ndarray:
    """Y (1, Hq, S, Dv) in float64 for queries (1, Hq, S, D) over every key and value so far (1, Hkv, T, D),
    the last S of which are this call's."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    group = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)  # query head h -> key/value head h // group
    scale = 1.0 / np.sqrt(q.shape[-1]) if scale is None else scale
    scores = q @ np.swapaxes(k, -1, -2) * scale
    if softcap > 0:
        scores = softcap * np.tanh(scores / softcap)
    queries, total = scores.shape[-2:]
    bias = np.zeros((queries, total))
    if causal:
        bias[np.arange(total)[None, :] > past_length + np.arange(queries)[:, None]] = -np.inf
    if mask is not None:
        bias = bias + (np.where(mask, 0.0, -np.inf) if mask.dtype == bool else mask.astype(np.float64))
    scores = scores + bias
    weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return (weights / weights.sum(axis=-1, keepdims=True)) @ v

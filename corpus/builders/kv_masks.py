"""Attention masks at their edges over a KV cache, on the contiguous path (ONNX Attention with past/present,
bound back) and the paged path (the paged_attention role): a mask shorter than the total sequence (the
keys beyond its end are masked, as if padded with -inf) and a query row whose every key is masked (its Y
row is zero, not NaN and not an average of the values).

Expected Y: ``attention_formula`` (corpus/builders/kv_semantics.py, ONNX Attention in float64 NumPy) over
the mask padded with False / -inf to the total length, with the fully masked rows set to zero as the
operator's definition says; presents are Concat(past, new).
"""

from __future__ import annotations

import numpy as np

from . import builder
from .kv import _literal, attention_model, paged_model
from .kv_attention import attention_formula
from .kv_paged import EMPTY_CACHE
from .kv_semantics import _run

#: scenario -> (mask kind, calls (new tokens, mask width or None for the total), rows to mask fully)
MASK_SCENARIOS = {
    # widths shorter than past + new: the last keys (this call's own, then the past's tail) are beyond it
    "ShortBoolMask": ("bool", ((3, 2), (2, 3), (1, 4), (2, 5)), False),
    "ShortFloatMask": ("float", ((3, 2), (2, 4), (1, 5), (2, 6)), False),  # (a width of 1 would also broadcast)
    # every call masks every key of query row 0 on head 1 (and of the last row on head 0)
    "FullyMaskedBoolRow": ("bool", ((3, None), (2, None), (1, None)), True),
    "FullyMaskedFloatRow": ("float", ((3, None), (2, None), (1, None)), True),
}


def _edge_mask(rng, kind: str, heads: int, queries: int, width: int, fully: bool) -> np.ndarray:
    """A (1, heads, queries, width) mask: every row attends its first key unless ``fully`` masks it."""
    shape = (1, heads, queries, width)
    if kind == "bool":
        mask = rng.random(shape) < 0.6
        mask[..., 0] = True
        if fully:
            mask[0, 1, 0, :] = False
            mask[0, 0, queries - 1, :] = False
        return mask
    mask = rng.choice(np.array([-np.inf, -1.5, 0.0, 0.7, 2.0], np.float32), shape)
    mask[..., 0] = 0.0
    if fully:
        mask[0, 1, 0, :] = -np.inf
        mask[0, 0, queries - 1, :] = -np.inf
    return mask


def _padded(mask: np.ndarray, total: int) -> np.ndarray:
    """The mask padded to ``total`` keys with False / -inf, as ONNX Attention defines a short mask."""
    pad = total - mask.shape[-1]
    fill = False if mask.dtype == bool else -np.inf
    return np.concatenate([mask, np.full(mask.shape[:-1] + (pad,), fill, mask.dtype)], axis=-1)


def _expected_y(q, keys, values, past: int, mask: np.ndarray) -> np.ndarray:
    full = _padded(mask, keys.shape[2])
    bias = np.where(full, 0.0, -np.inf) if full.dtype == bool else full.astype(np.float64)
    dead = np.all(np.isneginf(bias), axis=-1)  # (1, Hq, S): rows with no attendable key
    with np.errstate(invalid="ignore"):
        y = attention_formula(q, keys, values, past, mask=full)
    y[dead] = 0.0  # "A fully-masked query row ... produces a zero output row, not NaN"
    return y.astype(np.float32)


@builder
def kv_attention_mask_edges(path: str, scenario: str, heads: int = 2, head_size: int = 8, seed: int = 0):
    """A decode trace of ``scenario`` (MASK_SCENARIOS) on the ``contiguous`` path (presents checked too)
    or the ``paged`` path (4-token blocks)."""
    kind, calls, fully = MASK_SCENARIOS[scenario]
    rng = np.random.default_rng(seed or sum(map(ord, scenario)))
    keys = values = np.zeros((1, heads, 0, head_size), np.float32)
    runs = []
    for index, (count, width) in enumerate(calls):
        past = keys.shape[2]
        q = rng.standard_normal((1, heads, count, head_size)).astype(np.float32)
        k, v = (rng.standard_normal((1, heads, count, head_size)).astype(np.float32) for _ in range(2))
        keys, values = np.concatenate([keys, k], 2), np.concatenate([values, v], 2)
        mask = _edge_mask(rng, kind, heads, count, past + count if width is None else width, fully)
        y = _expected_y(q, keys, values, past, mask)
        runs.append((f"r{index}", {"q": q, "k": k, "v": v, "attn_mask": mask}, y, keys, values))
    if path == "contiguous":
        # Attention-24 defines a mask shorter than the keys ("padded ... with negative infinity");
        # Attention-23 requires it to broadcast to every key
        short = any(width is not None for _, width in calls)
        model = attention_model(heads, head_size, mask=kind, name="kv_mask_edges", opset=24 if short else 23,
                                is_causal=0)
        empty = _literal(np.zeros((1, heads, 0, head_size), np.float32))
        trace = [{"op": "open", "initial": {"past_key": empty, "past_value": empty}}]
        trace += [_run(label, feeds, {"y": y, "present_key": k, "present_value": v}, False)
                  for label, feeds, y, k, v in runs]
    else:
        model = paged_model(heads, head_size, 4, tokens="s", mask=kind, is_causal=0)
        trace = [{"op": "open", "initial": {"cache": EMPTY_CACHE}}]
        trace += [_run(label, feeds, {"y": y}, False) for label, feeds, y, _, _ in runs]
    return {"model": model, "steps": trace}


def _external_formula(q, keys, values, nonpad: int, causal: bool) -> np.ndarray:
    """ONNX Attention over an external cache (1, Hkv, capacity, D) whose first ``nonpad`` slots are valid:
    keys at or beyond ``nonpad`` are padding, and the causal frontier is aligned bottom-right (query i sits
    at position nonpad - S + i)."""
    q, keys, values = (np.asarray(x, np.float64) for x in (q, keys, values))
    group = q.shape[1] // keys.shape[1]  # query head h reads key/value head h // group
    keys, values = np.repeat(keys, group, axis=1), np.repeat(values, group, axis=1)
    scores = q @ np.swapaxes(keys, -1, -2) / np.sqrt(q.shape[-1])
    queries, total = scores.shape[-2:]
    key = np.arange(total)[None, :]
    allowed = np.broadcast_to(key < nonpad, (queries, total))
    if causal:
        allowed = allowed & (key <= nonpad - queries + np.arange(queries)[:, None])
    scores = np.where(allowed, scores, -np.inf)
    weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return (weights / weights.sum(axis=-1, keepdims=True)) @ values


@builder
def kv_external_cache(causal: int, plan: tuple = (3, 2, 1), heads: int = 2, q_heads: int = 2, head_size: int = 4,
                      capacity: int = 8, seed: int = 23):
    """An external cache (ONNX Attention's second KV use case): cache_key/cache_value (1, H, capacity, D)
    are bound state, TensorScatter writes each call's new tokens at ``write_indices``, and Attention reads
    the whole cache with ``nonpad_kv_seqlen`` = the valid tokens so far. Calls of ``plan`` tokens, ``q_heads``
    query heads on ``heads`` key/value heads; Y and the scattered caches are NumPy formulas."""
    from .kv import external_cache_model

    m = external_cache_model("kv_external_cache", causal, 1, heads, q_heads, head_size, capacity)

    rng = np.random.default_rng(seed)
    keys = np.zeros((1, heads, capacity, head_size), np.float32)
    values = keys.copy()
    trace = [{"op": "open", "initial": {"cache_key": _literal(keys), "cache_value": _literal(values)}}]
    filled = 0
    for index, count in enumerate(plan):
        q = rng.standard_normal((1, q_heads, count, head_size)).astype(np.float32)
        k, v = (rng.standard_normal((1, heads, count, head_size)).astype(np.float32) for _ in range(2))
        keys, values = keys.copy(), values.copy()
        keys[:, :, filled:filled + count], values[:, :, filled:filled + count] = k, v
        feeds = {"q": q, "k": k, "v": v, "write_indices": np.array([filled], np.int64),
                 "nonpad": np.array([filled + count], np.int64)}
        y = _external_formula(q, keys, values, filled + count, bool(causal)).astype(np.float32)
        trace.append(_run(f"r{index}", feeds, {"y": y, "next_key": keys, "next_value": values}, False))
        filled += count
    return {"model": m, "steps": trace}


def _qk_expected(q, keys, mask: np.ndarray, softcap: float, mode: int) -> np.ndarray:
    """ONNX Attention's qk_matmul_output for ``mode``: 0 the scaled Q K^T, 1 after the softcap, 2 after the
    (additive, finite) mask is added too, 3 the softmax."""
    q, keys = np.asarray(q, np.float64), np.asarray(keys, np.float64)
    group = q.shape[1] // keys.shape[1]
    keys = np.repeat(keys, group, axis=1)
    raw = q @ np.swapaxes(keys, -1, -2) / np.sqrt(q.shape[-1])
    capped = softcap * np.tanh(raw / softcap)
    biased = capped + mask.astype(np.float64)
    weights = np.exp(biased - biased.max(axis=-1, keepdims=True))
    probs = weights / weights.sum(axis=-1, keepdims=True)
    return (raw, capped, biased, probs)[mode]


@builder
def kv_attention_qk_output(mode: int, heads: int = 2, head_size: int = 4, softcap: float = 2.0, seed: int = 31):
    """Attention with past/present bound back and its fourth output qk_matmul_output in ``mode``: softcap
    2.0 over scores of magnitude ~5 and an additive float mask of finite values (-1.5, 0, 0.7, 2.0), so the
    softcap, the mask and the softmax each change the values (finite ones: no representation of -inf is
    at stake). Calls of 3, 2 and 1 tokens; Y, presents and qk_matmul_output are NumPy formulas."""
    from .kv import _tensor_vi

    m = attention_model(heads, head_size, name="kv_qk_output", mask="float", is_causal=0, softcap=float(softcap),
                        qk_matmul_output_mode=mode)
    m.graph.node[0].output.append("qk")
    _tensor_vi(m.graph, "qk", [1, heads, "s", "t2"], output=True)
    rng = np.random.default_rng(seed + mode)
    keys = values = np.zeros((1, heads, 0, head_size), np.float32)
    trace = [{"op": "open", "initial": {"past_key": _literal(keys), "past_value": _literal(values)}}]
    for index, count in enumerate((3, 2, 1)):
        past = keys.shape[2]
        q, k = (rng.standard_normal((1, heads, count, head_size)).astype(np.float32) * 3 for _ in range(2))
        v = rng.standard_normal((1, heads, count, head_size)).astype(np.float32)
        keys, values = np.concatenate([keys, k], 2), np.concatenate([values, v], 2)
        mask = rng.choice(np.array([-1.5, 0.0, 0.7, 2.0], np.float32), (1, heads, count, past + count))
        y = attention_formula(q, keys, values, past, softcap=softcap, mask=mask).astype(np.float32)
        qk = _qk_expected(q, keys, mask, softcap, mode).astype(np.float32)
        trace.append(_run(f"r{index}", {"q": q, "k": k, "v": v, "attn_mask": mask},
                          {"y": y, "present_key": keys, "present_value": values, "qk": qk}, False))
    return {"model": m, "steps": trace}

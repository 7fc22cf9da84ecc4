"""KV caches past any internal chunk: sizes past any internal chunk a runtime could tile, page or split its
attention by (key tiles and pages of 2^4 to 2^10 tokens, split-K partitions, 2^14 and 2^16 tokens), with
context lengths that are odd, so every power-of-two tile leaves a non-empty partial last tile, and paged
caches whose last block is partial (its payload slots past the valid tokens hold values far from the
others, so reading them changes Y).

Every token's key and value are distinct: unit normals, the values drifting from -1 to +1 along the
context, and each call's new keys aligned with its queries (3 q), so the newest tokens, at the end of the
last tile or block, carry a large share of the attention weight. A dropped, duplicated or shifted tile or
block changes Y far beyond the tolerance, which covers float32 summation over the whole context only.
Expected Y is softmax(Q K^T / sqrt(D)) V in float64 NumPy over the values a correct consumer reads
(corpus/builders/kv_paged.py, kv_formats.py), never the oracle's output.
"""

from __future__ import annotations

import numpy as np

from . import builder
from .kv import _literal, attention_model, attention_numpy
from .kv_formats import encode
from .kv_paged import Tokens, block_literal, cache_literal, paged_model, run_step

#: float32 summation over tens of thousands of tokens, against float64 NumPy (the reference is within 1e-8);
#: dropping the partial last block or tile, which holds the newest tokens, moves Y by more than 1e-3.
CONTEXT_ATOL = 1e-4
#: Keys and values in the payload slots past a partial block's valid tokens.
UNUSED_SLOT = 40.0
#: The new keys of each call: this multiple of the call's queries.
ALIGNED = 3.0


def _drift(values: np.ndarray, start: int, context: int) -> np.ndarray:
    """``values`` [..., tokens, ..] (token axis ``-2`` of [B, H, T, D] or ``0`` of [T, H, D] is handled by the
    caller) plus a drift from -1 to +1 over the context's positions."""
    return values + (2.0 * (start + np.arange(values.shape[0])) / context - 1.0).astype(np.float32)[:, None, None]


@builder
def kv_chunks_contiguous(context: int, calls: list, heads: int = 1, head_size: int = 4, seed: int = 173):
    """Attention with past/present bound back over an initial past of ``context`` tokens; each call appends
    ``calls[i]`` tokens (not causal: every query sees every token). Y = attention over the whole cache."""
    rng = np.random.default_rng(seed)
    past_k, past_v = (rng.standard_normal((1, heads, context, head_size)).astype(np.float32) for _ in range(2))
    past_v = _drift(past_v[0].transpose(1, 0, 2), 0, context).transpose(1, 0, 2)[None]
    trace = [{"op": "open", "initial": {"past_key": _literal(past_k), "past_value": _literal(past_v)}}]
    keys, values = past_k.astype(np.float64), past_v.astype(np.float64)
    for index, count in enumerate(calls):
        q, v = (rng.standard_normal((1, heads, count, head_size)).astype(np.float32) for _ in range(2))
        k = (ALIGNED * q).astype(np.float32)
        keys, values = np.concatenate([keys, k], 2), np.concatenate([values, v], 2)
        y = attention_numpy(q.astype(np.float64), keys, values).astype(np.float32)
        trace.append({"op": "run", "as": f"r{index}", "feeds": {"q": _literal(q), "k": _literal(k), "v": _literal(v)},
                      "outputs": {"y": _literal(y)}, "atol": CONTEXT_ATOL, "rtol": CONTEXT_ATOL})
    return {"model": attention_model(heads, head_size, name="kv_chunks"), "steps": trace}


@builder
def kv_chunks_paged(context: int, block_size: int, steps: int = 2, key_format: str = "dense",
                    value_format: str = "dense", heads: int = 2, head_size: int = 8, seed: int = 179):
    """An initial paged cache of ``context`` tokens in blocks of ``block_size``, the last one partial (its
    unused slots hold ``UNUSED_SLOT``), keys and values encoded in ``key_format`` / ``value_format`` (all
    blocks alike); ``steps`` calls append one dense token each. Y = attention over the valid tokens."""
    rng = np.random.default_rng(seed)
    tokens = Tokens(rng, heads, head_size)
    table = []
    for start in range(0, context, block_size):
        valid = min(block_size, context - start)
        k = rng.standard_normal((block_size, heads, head_size)).astype(np.float32)
        v = rng.standard_normal((block_size, heads, head_size)).astype(np.float32)
        v = _drift(v, start, context)
        k[valid:] = v[valid:] = UNUSED_SLOT
        (key, k_decoded), (value, v_decoded) = encode(k, key_format), encode(v, value_format)
        table.append(block_literal(start, valid, key, value))
        tokens.extend(k_decoded[:valid].transpose(1, 0, 2)[None], v_decoded[:valid].transpose(1, 0, 2)[None])
    trace = [{"op": "open", "initial": {"cache": cache_literal(table, context)}}]
    for step in range(steps):
        q, _, v = tokens.draw()
        k = (ALIGNED * q).astype(np.float32)
        tokens.extend(k, v)
        trace.append(run_step(f"r{step}", q, k, v, tokens.attend(q), atol=CONTEXT_ATOL))
    return {"model": paged_model(heads, head_size, block_size, max_tokens=1 << 20), "steps": trace}

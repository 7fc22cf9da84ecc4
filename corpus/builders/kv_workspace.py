"""Second paths to capacity and workspace rules of paged KV caches that one case alone used to check:
a negative block size or max_tokens under a cache the caller filled, and the attention workspace of one
decode step measured at two context lengths.

Expected values are the spec's rules and hand arithmetic on the sizes below, never the oracle's output.
"""

from __future__ import annotations

import numpy as np

from . import builder
from .kv import _literal
from .kv_paged import _bulk_block, cache_literal, paged_model
from .kv_reuse import invalid_capacity_over_caller_blocks


@builder
def thin_state_paged_bad_capacity(block_size: int = 4, max_tokens: int | None = None, heads: int = 2,
                                  q_heads: int = 4, head_size: int = 4, prefill: int = 8, seed: int = 173):
    """A paged_attention node whose block_size or max_tokens is not a positive count, opened with a cache
    the caller filled with two full 4-token dense blocks (4 query heads on 2 KV heads). The state is
    refused when it opens, or the first run fails, and the caller's blocks stay retained, the same
    buffers. Besides KV_CAPACITY_INVALID, a runtime may name the caller's blocks (they do not fit a
    block size that is not positive) or a first token that exceeds a max_tokens below one."""
    return invalid_capacity_over_caller_blocks(block_size, max_tokens, heads, q_heads, head_size, prefill, seed)


@builder
def thin_state_paged_workspace_growth(fmt: str = "dense", heads: int = 2, q_heads: int = 4, head_size: int = 8,
                                      block_size: int = 64, short: int = 1024, long: int = 8192, seed: int = 179):
    """Initial caches of ``fmt`` blocks (``dense`` or ``int4``) of ``short`` and of ``long`` tokens, each
    decoded one token by a fresh state: the long decode's attention_peak_workspace_bytes exceeds the short
    one's by less than half of one FLOAT score per extra token and query head. A kernel that walks the
    blocks with a running softmax holds the same scratch at any context length; one that keeps every
    block's scores (or weights) for a softmax at the end holds at least one FLOAT per token and query
    head more."""
    rng = np.random.default_rng(seed)
    blocks = [_bulk_block(start, block_size, heads, head_size, fmt, rng) for start in range(0, long, block_size)]
    trace = []
    for name, count in (("at_short", short), ("at_long", long)):
        q = rng.standard_normal((1, q_heads, 1, head_size)).astype(np.float32)
        k, v = (rng.standard_normal((1, heads, 1, head_size)).astype(np.float32) for _ in range(2))
        cache = cache_literal(blocks[:count // block_size], count)
        trace += [{"op": "open", "state": name, "initial": {"cache": cache}},
                  {"op": "run", "state": name, "feeds": {"q": _literal(q), "k": _literal(k), "v": _literal(v)}},
                  {"op": "counters", "state": name, "as": name}]
    trace[-1].update(since="at_short", at_most={"attention_peak_workspace_bytes": (long - short) * q_heads * 4 // 2})
    model = paged_model(heads, head_size, block_size, q_heads=q_heads, max_tokens=1 << 20)
    return {"model": model, "steps": trace}

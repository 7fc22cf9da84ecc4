"""Second, independent paths to KV rules that one case alone used to check: a contiguous past reset or
branched to an earlier present while a later present is still held, a paged cache whose blocks the
caller supplies under an unusable block size, and max_tokens reached by a cache that starts full.

Expected values are NumPy formulas (Concat for present, the attention formula for Y), never the
oracle's output.
"""

from __future__ import annotations

import numpy as np

from . import builder
from .kv import _literal, attention_model
from .kv_attention import attention_formula
from .kv_contiguous import Cache, _held
from .kv_formats import encode
from .kv_paged import block_literal, cache_literal, paged_model, run_step


@builder
def kv_contiguous_rewind(scenario: str, heads: int = 1, head_size: int = 8, seed: int = 97):
    """One request decodes r0 (three tokens), r1, r2 and r3, the caller keeping every output. Then a past
    goes back to an earlier present: the same state is reset to r2's present (``reset``), or a second state
    opens from r1's present, a prefix the first state has already extended twice (``older_prefix``; the
    first state then goes on too). The appends behind that past must not land where a held present or the
    first state's retained past can see them: every present the caller holds keeps its values, and each
    request attends over its own tokens. One KV head keeps a present's prefix view contiguous, so a
    runtime that refuses a strided caller buffer (as the spec allows) can still be handed one back."""
    rng = np.random.default_rng(seed)
    main = Cache(rng, heads, head_size)
    empty = _literal(main.k)
    trace = [{"op": "open", "state": "s1", "initial": {"past_key": empty, "past_value": empty}},
             main.step("r0", 3, "s1"), main.step("r1", 1, "s1")]
    at_r1 = main.branch()
    trace.append(main.step("r2", 1, "s1"))
    at_r2 = main.branch()
    trace.append(main.step("r3", 1, "s1"))
    at_r3 = main.branch()
    if scenario == "reset":
        rewound, state = at_r2.branch(), "s1"
        trace.append({"op": "reset", "state": "s1", "initial": {"past_key": {"ref": "r2|present_key"},
                                                                 "past_value": {"ref": "r2|present_value"}}})
    elif scenario == "older_prefix":
        rewound, state = at_r1.branch(), "s2"
        trace.append({"op": "open", "state": "s2", "initial": {"past_key": {"ref": "r1|present_key"},
                                                                "past_value": {"ref": "r1|present_value"}}})
    else:
        raise ValueError(f"unknown scenario {scenario!r}")
    trace += [rewound.step("b0", 1, state), rewound.step("b1", 1, state)]
    if scenario == "older_prefix":  # the first state goes on from its own r3 present
        trace.append(main.step("r4", 1, "s1"))
    trace += _held("r1", at_r1) + _held("r2", at_r2) + _held("r3", at_r3)
    trace.append({"op": "values", "state": state, "values": {"past_key": _literal(rewound.k),
                                                            "past_value": _literal(rewound.v)}})
    return {"model": attention_model(heads, head_size), "steps": trace}


def _dense_blocks(rng, tokens: int, heads: int, head_size: int, block_size: int):
    """Full dense blocks holding ``tokens`` tokens: their literals and the keys and values (1, H, T, D)."""
    literals, keys, values = [], [], []
    for start in range(0, tokens, block_size):
        k = rng.standard_normal((block_size, heads, head_size)).astype(np.float32)
        v = rng.standard_normal((block_size, heads, head_size)).astype(np.float32)
        literals.append(block_literal(start, block_size, encode(k, "dense")[0], encode(v, "dense")[0]))
        keys.append(k.transpose(1, 0, 2))
        values.append(v.transpose(1, 0, 2))
    return literals, np.concatenate(keys, 1)[None], np.concatenate(values, 1)[None]


@builder
def kv_paged_prefilled_zero_block_size(heads: int = 2, q_heads: int = 4, head_size: int = 4, prefill: int = 8,
                                       seed: int = 163):
    """A model whose paged_attention node has block_size 0, opened with a cache the caller filled with
    two full 4-token dense blocks, 4 query heads on 2 KV heads. No block size of zero tokens can hold the
    next token (nor the caller's blocks): the state is refused when it opens or the first run fails, and
    the caller's blocks stay retained."""
    return invalid_capacity_over_caller_blocks(0, None, heads, q_heads, head_size, prefill, seed)


def invalid_capacity_over_caller_blocks(block_size: int, max_tokens: int | None, heads: int, q_heads: int,
                                        head_size: int, prefill: int, seed: int) -> dict:
    """A paged_attention node with an invalid capacity (``block_size`` or ``max_tokens``) under a cache
    the caller filled with full 4-token dense blocks: refused when the state opens or at the first run
    (besides KV_CAPACITY_INVALID, a runtime may name the caller's blocks or a token that exceeds the
    capacity), and the caller's blocks stay retained, the same buffers."""
    rng = np.random.default_rng(seed)
    blocks, _, _ = _dense_blocks(rng, prefill, heads, head_size, 4)
    q = rng.standard_normal((1, q_heads, 1, head_size)).astype(np.float32)
    k, v = (rng.standard_normal((1, heads, 1, head_size)).astype(np.float32) for _ in range(2))
    codes = ["KV_BLOCK_INVALID", "KV_CAPACITY_EXCEEDED"]
    trace = [{"op": "open", "as": "init", "initial": {"cache": cache_literal(blocks, prefill)},
              "error": "KV_CAPACITY_INVALID", "also": codes, "optional": True},
             {"op": "run", "feeds": {"q": _literal(q), "k": _literal(k), "v": _literal(v)},
              "error": "STATE_RUN_FAILED", "also": ["EXECUTION_FAILED"], "cause": ["KV_CAPACITY_INVALID", *codes]},
             {"op": "values", "as": "after", "names": ["cache"]},
             {"op": "identity", "same": [[f"init|cache|blocks|{index}|{part}", f"after|cache|blocks|{index}|{part}"]
                                         for index in range(len(blocks)) for part in ("key", "value")]}]
    attrs = {} if max_tokens is None else {"max_tokens": max_tokens}
    model = paged_model(heads, head_size, block_size, q_heads=q_heads, tokens="s", is_causal=1, **attrs)
    return {"model": model, "steps": trace}


@builder
def kv_paged_prefilled_max_tokens(max_tokens: int = 10, heads: int = 2, head_size: int = 4, prefill: int = 8,
                                  seed: int = 167):
    """``max_tokens`` bounds the caller's cached tokens plus the new ones: a cache opened with 8 tokens (two
    full dense blocks) and max_tokens 10 refuses a 3-token call whole (11 > 10, although 3 alone fit),
    keeping the caller's blocks; a 2-token call then reaches exactly 10, and a 1-token call fails again."""
    rng = np.random.default_rng(seed)
    blocks, keys, values = _dense_blocks(rng, prefill, heads, head_size, 4)
    trace = [{"op": "open", "as": "init", "initial": {"cache": cache_literal(blocks, prefill)}}]

    def refused(count: int) -> dict:
        q, k, v = (rng.standard_normal((1, heads, count, head_size)).astype(np.float32) for _ in range(3))
        return {"op": "run", "feeds": {"q": _literal(q), "k": _literal(k), "v": _literal(v)},
                "error": "STATE_RUN_FAILED", "also": ["EXECUTION_FAILED"], "cause": ["KV_CAPACITY_EXCEEDED"]}

    trace.append(refused(max_tokens - prefill + 1))
    trace += [{"op": "values", "as": "after", "names": ["cache"]},
              {"op": "identity", "same": [[f"init|cache|blocks|{index}|{part}", f"after|cache|blocks|{index}|{part}"]
                                          for index in range(len(blocks)) for part in ("key", "value")]}]
    count = max_tokens - prefill
    q, k, v = (rng.standard_normal((1, heads, count, head_size)).astype(np.float32) for _ in range(3))
    keys, values = np.concatenate([keys, k], 2), np.concatenate([values, v], 2)
    y = attention_formula(q, keys, values, prefill, causal=True).astype(np.float32)
    trace.append(run_step("full", q, k, v, y))
    trace.append(refused(1))
    model = paged_model(heads, head_size, 4, tokens="s", is_causal=1, max_tokens=max_tokens)
    return {"model": model, "steps": trace}

"""Attention semantics over a KV cache, on the contiguous path (ONNX Attention with past/present) and the
paged path (the paged_attention role) alike: causal prefill with and without a past, grouped- and
multi-query heads, an explicit scale, softcap, float and boolean masks, and logits of 1e3 and beyond.

Every expected Y comes from ``attention_formula``, the ONNX Attention definition written here in float64
NumPy: scores = Q K^T * scale (query head h reads key/value head h // (q_heads / kv_heads)), softcap
``c * tanh(scores / c)`` on the raw scores, then the bias (the attention mask, and the causal frontier
aligned bottom-right: query i of a call sits at position past_length + i), softmax, times V. Contiguous
presents are Concat(past, new). The large-logit scenarios use integer data whose softmax is exactly
one-hot or an average of two tokens, so Y is exact (tests cross-check every expectation against onnx's
reference Attention and onnxruntime).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from . import builder
from .kv import _literal, attention_model, paged_model
from .kv_attention import attention_formula
from .kv_paged import EMPTY_CACHE


@dataclass(frozen=True)
class Scenario:
    """One trace: head counts, token counts per call, Attention attributes and the data's shape."""

    plan: tuple[int, ...]  # new tokens per call
    q_heads: int = 2
    kv_heads: int = 2
    head_size: int = 8
    attrs: dict = field(default_factory=dict)  # is_causal, scale, softcap
    mask: str | None = None  # "float" or "bool"
    amplitude: float = 1.0  # Q and K are unit normal times this
    logits: tuple[float, ...] | None = None  # exact scenarios: the score of each token (times 1/amplitude)


SCENARIOS = {
    "CausalPrefill": Scenario((5, 1, 1), attrs={"is_causal": 1}),
    "CausalChunkedPrefill": Scenario((3, 4, 2, 1), attrs={"is_causal": 1}),
    "GroupedQuery8On2": Scenario((3, 1, 1, 1), q_heads=8, kv_heads=2, attrs={"is_causal": 1}),
    "GroupedQuery8On4Chunked": Scenario((2, 3, 1), q_heads=8, kv_heads=4, attrs={"is_causal": 1}),
    "MultiQuery8On1": Scenario((3, 2, 1), q_heads=8, kv_heads=1, attrs={"is_causal": 1}),
    "ExplicitScale": Scenario((3, 1, 1), attrs={"is_causal": 0, "scale": 0.9}),
    "ExplicitScaleCausal": Scenario((4, 2, 1), attrs={"is_causal": 1, "scale": 2.5}),
    "Softcap": Scenario((4, 2, 1), attrs={"is_causal": 1, "softcap": 1.5}, amplitude=3.0),
    "SoftcapWithMask": Scenario((3, 2, 1), attrs={"is_causal": 0, "softcap": 2.0}, mask="bool", amplitude=3.0),
    "FloatMask": Scenario((3, 1, 2), attrs={"is_causal": 0}, mask="float"),
    "BoolMask": Scenario((3, 2, 1), attrs={"is_causal": 0}, mask="bool"),
    "BoolMaskCausal": Scenario((4, 1, 1), q_heads=4, attrs={"is_causal": 1}, mask="bool"),
    # head_size 4 and the default scale 1/2: q = 40 e0 and k = (score / 20) e0 give the score. Only the
    # default scale is used, so the paged rows need no suite extension of the role.
    "LargeLogits": Scenario((1,) * 10, head_size=4, attrs={"is_causal": 0},
                            logits=(0, -1000, 1000, 0, -1000, 0, 0, 0, 1000, 0)),
    "LargeLogitsLateBlocks": Scenario((1,) * 12, head_size=4, attrs={"is_causal": 0},
                                      logits=(0, 0, 3, 0, -5, 0, 0, 0, 1000, -1000, 1000, 10000)),
    "LargeLogitsFirstBlock": Scenario((1,) * 12, head_size=4, attrs={"is_causal": 0},
                                      logits=(5000, -5000, 0, 5000, 0, 0, 0, 1, 0, 0, -2, 0)),
}


def _tokens(rng, scenario: Scenario, position: int, count: int):
    """(q, k, v) of one call: unit normal (times the amplitude), or the exact large-logit construction."""
    s = scenario
    shapes = ((1, s.q_heads, count, s.head_size), (1, s.kv_heads, count, s.head_size))
    if s.logits is None:
        q = rng.standard_normal(shapes[0]) * s.amplitude
        k = rng.standard_normal(shapes[1]) * s.amplitude
        v = rng.standard_normal(shapes[1])
        return q.astype(np.float32), k.astype(np.float32), v.astype(np.float32)
    q = np.zeros(shapes[0], np.float32)
    q[..., 0] = 20.0 * np.sqrt(s.head_size)  # times the default scale 1/sqrt(head_size): 20
    k = np.zeros(shapes[1], np.float32)
    k[..., 0] = np.asarray(s.logits[position:position + count], np.float32)[None, None, :] / 20.0
    v = rng.integers(-4, 5, shapes[1]).astype(np.float32)  # small integers: tie averages are exact
    return q, k, v


def _mask(rng, kind: str, heads: int, queries: int, total: int, past: int, causal: bool) -> np.ndarray:
    """A mask that leaves every query at least one attendable key (masked keys vary by head)."""
    shape = (1, heads, queries, total)
    allowed = np.arange(total)[None, :] <= past + np.arange(queries)[:, None] if causal else np.ones((queries, total),
                                                                                                      bool)
    if kind == "bool":
        mask = rng.random(shape) < 0.65
        mask[..., np.arange(queries), past + np.arange(queries)] = True  # each query may see itself
        return mask & allowed | ~allowed  # causally hidden keys stay True: the mask alone decides nothing there
    values = rng.choice(np.array([-np.inf, -1.5, 0.0, 0.7, 2.0], np.float32), shape)
    values[..., np.arange(queries), past + np.arange(queries)] = 0.0
    return values


def _step_expectations(scenario: Scenario, seed: int):
    """Per call: feeds, the expected Y, and the keys/values so far (float32)."""
    rng = np.random.default_rng(seed)
    s = scenario
    keys = np.zeros((1, s.kv_heads, 0, s.head_size), np.float32)
    values = keys
    causal = bool(s.attrs.get("is_causal", 0))
    steps = []
    for count in s.plan:
        past = keys.shape[2]
        q, k, v = _tokens(rng, s, past, count)
        keys, values = np.concatenate([keys, k], 2), np.concatenate([values, v], 2)
        feeds = {"q": q, "k": k, "v": v}
        mask = None
        if s.mask:
            mask = _mask(rng, s.mask, s.q_heads, count, past + count, past, causal)
            feeds["attn_mask"] = mask
        y = attention_formula(q, keys, values, past, s.attrs.get("scale"), s.attrs.get("softcap", 0.0), causal,
                              mask)
        steps.append((feeds, y.astype(np.float32), keys, values, past))
    return steps


def _exact(scenario: Scenario, total: int) -> bool:
    """Whether Y after ``total`` tokens is exact in float32: every score ties the maximum or lies so far
    below it (200) that its weight underflows to zero, so Y is one value or an average of two."""
    if scenario.logits is None:
        return False
    logits = np.asarray(scenario.logits[:total], np.float64)
    top = logits.max()
    ties = int(np.sum(logits == top))
    return ties in (1, 2) and bool(np.all((logits == top) | (logits < top - 200)))


def _run(label: str, feeds: dict, outputs: dict, exact: bool) -> dict:
    tolerance = {"atol": 0.0, "rtol": 1e-6} if exact else {"atol": 1e-5, "rtol": 1e-5}
    return {"op": "run", "as": label, "feeds": {name: _literal(value) for name, value in feeds.items()},
            "outputs": {name: _literal(value) for name, value in outputs.items()}, **tolerance}


#: Scenarios of the contiguous path alone: an attribute or a length the paged_attention role does not take.
CONTIGUOUS_SCENARIOS = {
    # softmax_precision = 1 (FLOAT) on float inputs: the precision the softmax has without it.
    "SoftmaxPrecisionFloat": Scenario((4, 2, 1), attrs={"is_causal": 1, "softmax_precision": 1}),
    # a causal prefill of 1030 tokens (2 query heads on 1 KV head of 4), then two decode steps over them
    "LongPrefill": Scenario((1030, 1, 1), q_heads=2, kv_heads=1, head_size=4, attrs={"is_causal": 1}),
}


@builder
def kv_attention_contiguous_trace(scenario: str, seed: int = 0):
    """A decode trace of ``scenario`` (CONTIGUOUS_SCENARIOS) on the contiguous path, as
    ``kv_attention_semantics`` builds its contiguous rows."""
    return kv_attention_semantics("contiguous", scenario, seed=seed, scenarios=CONTIGUOUS_SCENARIOS)


@builder
def kv_attention_semantics(path: str, scenario: str, block_size: int = 4, seed: int = 0,
                           scenarios: dict | None = None):
    """A decode trace of ``scenario`` (SCENARIOS) on the ``contiguous`` path (Attention with past/present;
    presents are checked too) or the ``paged`` path (PagedAttention over ``block_size``-token blocks, so
    prefills and large logits cross block boundaries)."""
    s = (scenarios or SCENARIOS)[scenario]
    attrs = {name: (float(value) if name in ("scale", "softcap") else value) for name, value in s.attrs.items()}
    steps = _step_expectations(s, seed or sum(map(ord, scenario)))
    if path == "contiguous":
        model = attention_model(s.kv_heads, s.head_size, q_heads=s.q_heads, mask=s.mask, name="kv_semantics",
                                **attrs)
        empty = _literal(np.zeros((1, s.kv_heads, 0, s.head_size), np.float32))
        trace = [{"op": "open", "initial": {"past_key": empty, "past_value": empty}}]
        for index, (feeds, y, keys, values, past) in enumerate(steps):
            trace.append(_run(f"r{index}", feeds, {"y": y, "present_key": keys, "present_value": values},
                              _exact(s, past + feeds["k"].shape[2])))
    else:
        model = paged_model(s.kv_heads, s.head_size, block_size, q_heads=s.q_heads, tokens="s", mask=s.mask,
                            **attrs)
        trace = [{"op": "open", "initial": {"cache": EMPTY_CACHE}}]
        for index, (feeds, y, _, _, past) in enumerate(steps):
            trace.append(_run(f"r{index}", feeds, {"y": y}, _exact(s, past + feeds["k"].shape[2])))
    return {"model": model, "steps": trace}


def semantics_calls(scenario: str, seed: int = 0):
    """(feeds, expected Y, past length) per call, for tests that cross-check the formula."""
    s = {**SCENARIOS, **CONTIGUOUS_SCENARIOS}[scenario]
    return [(feeds, y, past, keys, values)
            for feeds, y, keys, values, past in _step_expectations(s, seed or sum(map(ord, scenario)))]

"""Attention inputs the operator does not define, fed at run time over a bound contiguous cache.

ONNX Attention fixes how its inputs' shapes relate: Q (batch, q_num_heads, S, head_size), K (batch,
kv_num_heads, S_kv, head_size), V (batch, kv_num_heads, S_kv, v_head_size), past_key/past_value (batch,
kv_num_heads, past, head_size / v_head_size), ``q_num_heads % kv_num_heads == 0`` for grouped queries, and an
attn_mask whose "Shape must be broadcastable to 4D tensor with shape (batch_size, q_num_heads,
q_sequence_length, total_sequence_length)". Each scenario breaks one of those relations in one run (the model
declares every dimension symbolic, so the feed reaches the operator); the run must fail, leave the retained
past as the previous present (same buffers), and decoding must go on from it. Expected values are NumPy:
Concat for present, softmax(Q K^T / sqrt(D)) V for Y (``kv_contiguous.Cache``).
"""

from __future__ import annotations

import numpy as np

from . import builder
from .common import model as new_model
from .kv import _literal, _tensor_vi, refusal_allowed
from .kv_contiguous import Cache, _held, _kept

HEADS, HEAD_SIZE = 2, 4

#: scenario -> what the failing run feeds instead of a valid (q, k, v[, attn_mask])
SCENARIOS = ("QueryHeadsNotAMultiple", "QueryHeadSizeDiffers", "KeyHeadsDifferFromPast",
             "KeyHeadSizeDiffersFromPast", "ValueHeadSizeDiffersFromPast", "MaskLongerThanKeys",
             "MaskHeadsDoNotBroadcast", "MaskRankFive")


def _free_model(mask: bool, mask_rank: bool = True):
    """Attention(q, k, v[, attn_mask], past_key, past_value) with every dimension symbolic and its own name,
    ``past_* <- present_*``; the mask's rank is 4, or left undeclared without ``mask_rank``."""
    m = new_model("kv_attention_inputs", 23)
    g = m.graph
    g.node.add(op_type="Attention", input=["q", "k", "v", "attn_mask" if mask else "", "past_key",
                                                   "past_value"], output=["y", "present_key", "present_value"])
    for name in ("q", "k", "v", "past_key", "past_value"):
        _tensor_vi(g, name, [f"{name}_{axis}" for axis in ("b", "h", "s", "d")])
    if mask:
        if mask_rank:
            _tensor_vi(g, "attn_mask", ["m_b", "m_h", "m_s", "m_t"], elem=9)
        else:
            g.input.add(name="attn_mask").type.tensor_type.elem_type = 9
    _tensor_vi(g, "y", ["y_b", "y_h", "y_s", "y_d"], output=True)
    for name in ("present_key", "present_value"):
        _tensor_vi(g, name, [f"{name}_{axis}" for axis in ("b", "h", "s", "d")], output=True)
    g.persistent_bindings.add(input_name="past_key", output_name="present_key")
    g.persistent_bindings.add(input_name="past_value", output_name="present_value")
    return m


def _with_mask(step: dict, total: int) -> dict:
    """A valid run given an all-True boolean mask (1, heads, S, total): Y is unchanged."""
    queries = step["feeds"]["q"]["shape"][2]
    step["feeds"]["attn_mask"] = _literal(np.ones((1, HEADS, queries, total), bool))
    return step


def _bad_feeds(scenario: str, rng, past: int) -> dict:
    """One decode step's feeds breaking the relation ``scenario`` names."""
    def normal(*shape):
        return rng.standard_normal(shape).astype(np.float32)

    q, k, v = normal(1, HEADS, 1, HEAD_SIZE), normal(1, HEADS, 1, HEAD_SIZE), normal(1, HEADS, 1, HEAD_SIZE)
    mask = np.ones((1, HEADS, 1, past + 1), bool)
    if scenario == "QueryHeadsNotAMultiple":
        q = normal(1, 3, 1, HEAD_SIZE)  # 3 query heads on 2 key/value heads
    elif scenario == "QueryHeadSizeDiffers":
        q = normal(1, HEADS, 1, 2 * HEAD_SIZE)  # Q's head_size 8, K's 4
    elif scenario == "KeyHeadsDifferFromPast":
        k, v = normal(1, 1, 1, HEAD_SIZE), normal(1, 1, 1, HEAD_SIZE)  # Q, K, V agree (2 on 1); the past has 2
    elif scenario == "KeyHeadSizeDiffersFromPast":
        q, k = normal(1, HEADS, 1, 2 * HEAD_SIZE), normal(1, HEADS, 1, 2 * HEAD_SIZE)  # Q, K agree; past_key 4
    elif scenario == "ValueHeadSizeDiffersFromPast":
        v = normal(1, HEADS, 1, 2 * HEAD_SIZE)  # v_head_size may differ from head_size, but not from past_value's
    elif scenario == "MaskLongerThanKeys":
        mask = np.ones((1, HEADS, 1, past + 2), bool)  # one key more than past + new
    elif scenario == "MaskHeadsDoNotBroadcast":
        mask = np.ones((1, 3, 1, past + 1), bool)  # 3 mask heads against 2 query heads
    elif scenario == "MaskRankFive":
        mask = np.ones((1, 1, 1, 1, past + 1), bool)  # rank 5 (the model leaves the rank open): not 4-D
    else:
        raise ValueError(f"unknown scenario {scenario}")
    feeds = {"q": _literal(q), "k": _literal(k), "v": _literal(v)}
    if scenario.startswith("Mask"):
        feeds["attn_mask"] = _literal(mask)
    return feeds


def _causes(scenario: str) -> list[str]:
    """New tokens that do not extend the bound past also "do not fit the cache geometry" (KV_SHAPE_MISMATCH),
    the code a runtime checking the append first gives; the other relations are Attention's alone."""
    return ["ATTENTION_INPUT_INVALID", "KV_SHAPE_MISMATCH"] if "FromPast" in scenario else ["ATTENTION_INPUT_INVALID"]


@builder
def kv_attention_inputs(scenario: str, seed: int = 23):
    """A prefill of three tokens and a decode step, then a run whose inputs break ``scenario``'s shape
    relation (SCENARIOS): it fails with ATTENTION_INPUT_INVALID as its cause (or
    KV_SHAPE_MISMATCH for new tokens that do not extend the past), the retained past is still the
    previous present, decoding goes on from it, and earlier outputs keep their values."""
    rng = np.random.default_rng(seed)
    masked = scenario.startswith("Mask")
    cache = Cache(rng, HEADS, HEAD_SIZE)
    empty = _literal(cache.k)

    def step(label, count=1):
        run = cache.step(label, count)
        return _with_mask(run, cache.k.shape[2]) if masked else run

    trace = [{"op": "open", "initial": {"past_key": empty, "past_value": empty}}, step("r0", 3)]
    held_r0 = cache.branch()
    trace.append(step("r1"))
    held_r1 = cache.branch()
    trace.append({"op": "run", "feeds": _bad_feeds(scenario, rng, cache.k.shape[2]), "error": "STATE_RUN_FAILED",
                  "also": ["EXECUTION_FAILED"], "cause": _causes(scenario)})
    trace += _kept(cache) + [step("r2"), step("r3")]
    trace += _held("r0", held_r0) + _held("r1", held_r1)
    if scenario == "MaskRankFive":  # onnx's checker requires an input's shape: a runtime may refuse the model
        trace = refusal_allowed(trace, "TYPE_INVALID")
    return {"model": _free_model(masked, mask_rank=scenario != "MaskRankFive"), "steps": trace}

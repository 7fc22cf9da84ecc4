"""External-cache traces where a batch row has no valid key (``nonpad_kv_seqlen`` = 0), written by hand.

ONNX Attention (opset 24): the keys at or beyond ``nonpad_kv_seqlen[b]`` are padding, so a row whose value
is 0 attends no key; a fully-masked query row "produces a zero output row, not NaN". Every query is zero,
so every score is 0 and a query's weights are uniform over the keys it may attend: Y is the plain mean of
those values (or zeros when there are none). The values are small integers whose means are exact, so the
expected outputs below are hand arithmetic, written out literally (tests/test_kv_padding_cases.py checks them
against onnx's reference evaluator).
"""

from __future__ import annotations

import numpy as np

from . import builder
from .kv import _literal, external_cache_model, refusal_allowed

_CAPACITY, _HEAD = 4, 2


def _batch(rows: list) -> np.ndarray:
    """(2, 1, n, 2) float32 from two rows of n (2,) vectors: batch 2, one head, head_size 2."""
    return np.array(rows, np.float32).reshape(2, 1, -1, _HEAD)


def _call(label: str, queries: int, write: list, nonpad: list, k: list, v: list, keys: list, values: list,
          y: list) -> dict:
    """One run: zero queries, the new k/v of each row written at ``write``, ``nonpad`` per row; ``keys`` and
    ``values`` are the whole caches after the write (row by row, slot by slot), ``y`` the expected rows."""
    feeds = {"q": np.zeros((2, 1, queries, _HEAD), np.float32), "k": _batch(k), "v": _batch(v),
             "write_indices": np.array(write, np.int64), "nonpad": np.array(nonpad, np.int64)}
    outputs = {"y": _batch(y), "next_key": _batch(keys), "next_value": _batch(values)}
    return {"op": "run", "as": label, "feeds": {name: _literal(x) for name, x in feeds.items()},
            "outputs": {name: _literal(x) for name, x in outputs.items()}, "atol": 1e-6, "rtol": 1e-6}


_Z = [0, 0]
#: scenario -> (is_causal, calls). Comments give each expected row: the mean of the values it attends.
SCENARIOS = {
    # Row 0 holds no valid key at the first call (its token is padding: nonpad 0), row 1 one key. At the
    # second call row 0 rewrites slot 0 and holds one key, row 1 appends at slot 1 and holds two.
    "EmptyFirstRow": (0, [
        dict(queries=1, write=[0, 0], nonpad=[0, 1], k=[[[1, 1]], [[2, 2]]], v=[[[4, 8]], [[2, 6]]],
             keys=[[[1, 1], _Z, _Z, _Z], [[2, 2], _Z, _Z, _Z]],
             values=[[[4, 8], _Z, _Z, _Z], [[2, 6], _Z, _Z, _Z]],
             y=[[_Z], [[2, 6]]]),  # row 0: no key -> zeros; row 1: slot 0 alone
        dict(queries=1, write=[0, 1], nonpad=[1, 2], k=[[[3, 3]], [[0, 1]]], v=[[[6, 2]], [[4, 2]]],
             keys=[[[3, 3], _Z, _Z, _Z], [[2, 2], [0, 1], _Z, _Z]],
             values=[[[6, 2], _Z, _Z, _Z], [[2, 6], [4, 2], _Z, _Z]],
             y=[[[6, 2]], [[3, 4]]]),  # row 0: slot 0; row 1: ([2, 6] + [4, 2]) / 2
    ]),
    # is_causal: query i of row b sees keys j <= nonpad[b] - S + i. Row 1 has no valid key at the first call
    # (offset -2: both queries fully masked); row 0 has two, query 0 sees slot 0, query 1 slots 0 and 1.
    "EmptySecondRowCausal": (1, [
        dict(queries=2, write=[0, 0], nonpad=[2, 0], k=[[[1, 0], [0, 1]], [[1, 1], [2, 0]]],
             v=[[[2, 4], [6, 0]], [[8, 2], [4, 4]]],
             keys=[[[1, 0], [0, 1], _Z, _Z], [[1, 1], [2, 0], _Z, _Z]],
             values=[[[2, 4], [6, 0], _Z, _Z], [[8, 2], [4, 4], _Z, _Z]],
             y=[[[2, 4], [4, 2]], [_Z, _Z]]),  # row 0: [2, 4], ([2, 4] + [6, 0]) / 2; row 1: zeros
        dict(queries=1, write=[2, 0], nonpad=[3, 1], k=[[[1, 1]], [[0, 2]]], v=[[[4, 2]], [[3, 5]]],
             keys=[[[1, 0], [0, 1], [1, 1], _Z], [[0, 2], [2, 0], _Z, _Z]],
             values=[[[2, 4], [6, 0], [4, 2], _Z], [[3, 5], [4, 4], _Z, _Z]],
             y=[[[4, 2]], [[3, 5]]]),  # row 0: ([2, 4] + [6, 0] + [4, 2]) / 3; row 1: slot 0 alone
    ]),
    # Both rows empty at once (a batch of padding only), then both hold keys: no row may borrow the other's
    # length, and a batch whose every row is empty is not "no padding".
    "EveryRowEmpty": (0, [
        dict(queries=1, write=[0, 0], nonpad=[0, 0], k=[[[1, 2]], [[2, 1]]], v=[[[2, 2]], [[6, 4]]],
             keys=[[[1, 2], _Z, _Z, _Z], [[2, 1], _Z, _Z, _Z]],
             values=[[[2, 2], _Z, _Z, _Z], [[6, 4], _Z, _Z, _Z]],
             y=[[_Z], [_Z]]),
        dict(queries=1, write=[1, 1], nonpad=[2, 2], k=[[[0, 1]], [[1, 0]]], v=[[[4, 6]], [[2, 8]]],
             keys=[[[1, 2], [0, 1], _Z, _Z], [[2, 1], [1, 0], _Z, _Z]],
             values=[[[2, 2], [4, 6], _Z, _Z], [[6, 4], [2, 8], _Z, _Z]],
             y=[[[3, 4]], [[4, 6]]]),  # the slot-0 tokens count now: ([2, 2] + [4, 6]) / 2, ([6, 4] + [2, 8]) / 2
    ]),
}


@builder
def mut_kv_nonpad_zero(scenario: str):
    """A bound 4-slot external cache of two batch rows (one KV head of size 2), written by TensorScatter and
    read by Attention with ``nonpad_kv_seqlen``; ``scenario`` picks a hand-written trace of SCENARIOS."""
    causal, calls = SCENARIOS[scenario]
    m = external_cache_model(f"mut_kv_{scenario}", causal, 2, 1, 1, _HEAD, _CAPACITY)
    empty = np.zeros((2, 1, _CAPACITY, _HEAD), np.float32)
    steps = [{"op": "open", "initial": {"cache_key": _literal(empty), "cache_value": _literal(empty)}}]
    steps += [_call(f"r{index}", **call) for index, call in enumerate(calls)]
    return {"model": m, "steps": steps}


@builder
def mut_kv_nonpad_beyond(causal: int, row: int, excess: int):
    """The same cache, one key per row after a first call; the second call gives row ``row`` a
    ``nonpad_kv_seqlen`` of 4 + ``excess``, more valid tokens than the 4 slots the cache has. onnxruntime
    refuses it ("out of range [0, 4]"); ONNX's text is silent and its reference evaluator takes every slot
    as valid, so the cases asking for the refusal are Recommended. A refused run leaves the caches as the
    first call left them, and the same call with the right lengths then succeeds."""
    m = external_cache_model(f"mut_kv_beyond_{causal}_{row}", causal, 2, 1, 1, _HEAD, _CAPACITY)
    empty = np.zeros((2, 1, _CAPACITY, _HEAD), np.float32)
    first = dict(queries=1, write=[0, 0], nonpad=[1, 1], k=[[[1, 1]], [[2, 2]]], v=[[[4, 8]], [[2, 6]]],
                 keys=[[[1, 1], _Z, _Z, _Z], [[2, 2], _Z, _Z, _Z]],
                 values=[[[4, 8], _Z, _Z, _Z], [[2, 6], _Z, _Z, _Z]],
                 y=[[[4, 8]], [[2, 6]]])
    second = dict(queries=1, write=[1, 1], nonpad=[2, 2], k=[[[0, 1]], [[1, 0]]], v=[[[2, 2]], [[6, 4]]],
                  keys=[[[1, 1], [0, 1], _Z, _Z], [[2, 2], [1, 0], _Z, _Z]],
                  values=[[[4, 8], [2, 2], _Z, _Z], [[2, 6], [6, 4], _Z, _Z]],
                  y=[[[3, 5]], [[4, 5]]])  # ([4, 8] + [2, 2]) / 2, ([2, 6] + [6, 4]) / 2
    beyond = list(second["nonpad"])
    beyond[row] = _CAPACITY + excess
    bad = _call("bad", **{**second, "nonpad": beyond})
    bad = {"op": "run", "feeds": bad["feeds"], "error": "STATE_RUN_FAILED", "also": ["EXECUTION_FAILED"],
           "cause": ["ATTENTION_INPUT_INVALID"]}
    kept = {"op": "values", "values": {"cache_key": _literal(_batch(first["keys"])),
                                       "cache_value": _literal(_batch(first["values"]))}}
    steps = [{"op": "open", "initial": {"cache_key": _literal(empty), "cache_value": _literal(empty)}},
             _call("r0", **first), bad, kept, _call("r1", **second)]
    return {"model": m, "steps": steps}


#: the values of tokens 0..4 (their keys are [t, 1]: with zero queries every score is 0 whatever they are)
_WINDOW_VALUES = [[2, 0], [4, 2], [6, 4], [0, 8], [2, 2]]
#: side -> (Attention attributes, expected Y rows of the prefill of tokens 0..2 and the chunk of 3..4)
WINDOWS = {
    # is_causal with left_window_size 1: the query at position p sees keys p - 1 and p.
    "Left": ({"is_causal": 1, "left_window_size": 1},
             [[2, 0], [3, 1], [5, 3]], [[3, 6], [1, 5]]),  # [2, 0]; means of (0, 1), (1, 2), then (2, 3), (3, 4)
    # no causal mask, left_window_size 0 and right_window_size 1: the query at p sees keys p and p + 1.
    "Right": ({"is_causal": 0, "left_window_size": 0, "right_window_size": 1},
              [[3, 1], [5, 3], [6, 4]], [[1, 5], [2, 2]]),  # means of (0, 1), (1, 2), then 2 alone; (3, 4), 4
    # The rows below use _WINDOW_VALUES_3 (multiples of 3: every mean of 1 to 4 of them is exact in float32; the
    # mean of all five, 2.4, is not, and is checked to the rows' 1e-6).
    # is_causal with left_window_size 2: the query at p sees keys p - 2 .. p.
    "LeftTwo": ({"is_causal": 1, "left_window_size": 2},
                [[3, 0], [1.5, 1.5], [3, 2]], [[2, 4], [3, 4]]),  # (0), (0, 1), (0, 1, 2); (1, 2, 3), (2, 3, 4)
    # no causal mask, left_window_size 1 and right_window_size 1: the query at p sees keys p - 1 .. p + 1.
    "BothSides": ({"is_causal": 0, "left_window_size": 1, "right_window_size": 1},
                  [[1.5, 1.5], [3, 2], [3, 3]], [[3, 4], [1.5, 4.5]]),  # (0, 1), (0, 1, 2), (1, 2); (2, 3, 4), (3, 4)
    # no causal mask, left_window_size 0 alone: the query at p sees keys p .. the last one (0 is a bound).
    "LeftZero": ({"is_causal": 0, "left_window_size": 0},
                 [[3, 2], [3, 3], [6, 3]], [[1.5, 4.5], [3, 3]]),  # (0, 1, 2), (1, 2), (2); (3, 4), (4)
    # no causal mask, right_window_size 0 alone: the query at p sees keys 0 .. p, the causal frontier.
    "RightZero": ({"is_causal": 0, "right_window_size": 0},
                  [[3, 0], [1.5, 1.5], [3, 2]], [[2.25, 3], [2.4, 3]]),  # (0), (0, 1), (0, 1, 2); (0..3), (0..4)
}
#: the sides whose values are _WINDOW_VALUES_3
_THIRDS = ("LeftTwo", "BothSides", "LeftZero", "RightZero")
#: the values of tokens 0..4 for the rows LeftTwo and BothSides
_WINDOW_VALUES_3 = [[3, 0], [0, 3], [6, 3], [0, 6], [3, 3]]


@builder
def mut_kv_window(side: str, refusable: bool = False):
    """Attention-25 (opset 25) with past/present bound back, one KV head of size 2, zero queries, and a
    sliding window whose bound is inclusive ("A value of 0 allows the current position but no preceding
    position"): a prefill of three tokens, then a chunk of two behind the past of three (positions 3, 4).
    ``refusable``: a runtime without Attention-25 may refuse the model; one that runs it applies the window."""
    from .kv import attention_model

    attrs, prefill, chunk = WINDOWS[side]
    m = attention_model(1, _HEAD, name=f"mut_kv_window_{side}", opset=25, **attrs)
    keys = np.array([[t, 1] for t in range(5)], np.float32).reshape(1, 1, 5, _HEAD)
    table = _WINDOW_VALUES_3 if side in _THIRDS else _WINDOW_VALUES
    values = np.array(table, np.float32).reshape(1, 1, 5, _HEAD)
    empty = np.zeros((1, 1, 0, _HEAD), np.float32)
    steps = [{"op": "open", "initial": {"past_key": _literal(empty), "past_value": _literal(empty)}}]
    for label, (lo, hi), y in (("r0", (0, 3), prefill), ("r1", (3, 5), chunk)):
        feeds = {"q": np.zeros((1, 1, hi - lo, _HEAD), np.float32), "k": keys[:, :, lo:hi], "v": values[:, :, lo:hi]}
        outputs = {"y": np.array(y, np.float32).reshape(1, 1, hi - lo, _HEAD), "present_key": keys[:, :, :hi],
                   "present_value": values[:, :, :hi]}
        steps.append({"op": "run", "as": label, "feeds": {name: _literal(x) for name, x in feeds.items()},
                      "outputs": {name: _literal(x) for name, x in outputs.items()}, "atol": 1e-6, "rtol": 1e-6})
    if refusable:
        steps = refusal_allowed(steps, "OPERATOR_UNSUPPORTED", ("ATTENTION_INPUT_INVALID",))
    return {"model": m, "steps": steps}

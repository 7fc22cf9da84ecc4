"""Caller buffer layouts on a contiguous KV decode trace: the per-call q, k or v feed, or the caller-supplied
initial cache (both past_key and past_value, at ``open`` or ``reset``), handed in one of the layouts of the
zero-copy cases (``zero_copy_layouts.LAYOUTS``, made by conformance/layouts.py: non-native byte order,
negative strides, every other element of a larger buffer, a misaligned start, a view of a view, read-only).

The runtime reads such a buffer with its values (a cache kept as it is must be the caller's own buffer) or
refuses it explicitly ("report unsupported layouts/ownership explicitly"), leaving the state as it was; a
runtime that reads the raw bytes as if they were contiguous or native-endian computes attention over other
values and fails. Expected Y and presents are ONNX Attention in float64 NumPy (``attention_formula``) and
Concat(past, new), for both outcomes.
"""

from __future__ import annotations

import numpy as np

from . import builder
from .kv import _literal, attention_model
from .kv_attention import attention_formula
from .zero_copy_layouts import LAYOUTS

Q_HEADS, KV_HEADS, HEAD_SIZE, PAST = 4, 2, 8, 3
#: an explicit refusal of a feed or cache layout: the layout code, or the value refused as not of its
#: declared type (a NumPy dtype in the other byte order is not the declared one's), or the run failing with it
_REFUSED = {"error": "STATE_UNRETAINABLE", "also": ["STATE_VALUE_INCOMPATIBLE"], "optional": True}
_RUN_REFUSED = {"error": "STATE_UNRETAINABLE", "also": ["STATE_VALUE_INCOMPATIBLE", "STATE_RUN_FAILED"],
                "cause": ["STATE_UNRETAINABLE", "STATE_VALUE_INCOMPATIBLE", "ATTENTION_INPUT_INVALID"],
                "optional": True}


class _Decode:
    """The keys and values so far and the expected outputs of appending to them (causal attention)."""

    def __init__(self, rng, keys: np.ndarray, values: np.ndarray):
        self.rng, self.keys, self.values = rng, keys, values

    def draw(self, count: int) -> dict[str, np.ndarray]:
        shapes = {"q": (1, Q_HEADS, count, HEAD_SIZE), "k": (1, KV_HEADS, count, HEAD_SIZE),
                  "v": (1, KV_HEADS, count, HEAD_SIZE)}
        return {name: self.rng.standard_normal(shape).astype(np.float32) for name, shape in shapes.items()}

    def run(self, feeds: dict[str, np.ndarray], label: str, layout: dict | None = None, laid: str = "") -> dict:
        """The run appending ``feeds`` (the feed ``laid`` in ``layout``), with its expected outputs."""
        past = self.keys.shape[2]
        self.keys = np.concatenate([self.keys, feeds["k"]], 2)
        self.values = np.concatenate([self.values, feeds["v"]], 2)
        y = attention_formula(feeds["q"], self.keys, self.values, past, causal=True)
        given = {name: {**_literal(x), **(layout if name == laid else {})} for name, x in feeds.items()}
        return {"op": "run", "as": label, "feeds": given,
                "outputs": {"y": _literal(y.astype(np.float32)), "present_key": _literal(self.keys),
                            "present_value": _literal(self.values)}, "atol": 1e-5, "rtol": 1e-5}

    def branch(self) -> _Decode:
        return _Decode(self.rng, self.keys, self.values)


def _cache(rng, count: int) -> tuple[np.ndarray, np.ndarray]:
    shape = (1, KV_HEADS, count, HEAD_SIZE)
    return rng.standard_normal(shape).astype(np.float32), rng.standard_normal(shape).astype(np.float32)


def _laid_cache(keys: np.ndarray, values: np.ndarray, layout: dict) -> dict:
    return {"past_key": {**_literal(keys), **layout}, "past_value": {**_literal(values), **layout}}


def _kept(label: str, decode: _Decode, check_values: bool) -> list[dict]:
    """The checks of a cache kept as it is: the caller's own buffers (by address), read with their values."""
    values = {"values": {"past_key": _literal(decode.keys), "past_value": _literal(decode.values)}} \
        if check_values else {}
    return [{"op": "values", "as": "kept", **values},
            {"op": "identity", "same": [[f"{label}|past_key", "kept|past_key"],
                                        [f"{label}|past_value", "kept|past_value"]]}]


@builder
def kv_caller_layout(entry: str, layout: str) -> dict:
    """Causal Attention, 4 query heads on 2 KV heads of 8, past/present bound back, over a past of 3 tokens.
    ``Q``, ``K``, ``V``: that feed of a two-token call is in ``layout``; refused, the state keeps its past
    (the same buffers) and decoding goes on from it. ``InitialCache``, ``ResetCache``: the past given to
    ``open`` (or to a ``reset`` after one call) is in ``layout``; kept, it is the caller's buffers and the
    next calls attend over its values; refused, nothing changes (a refused reset keeps the call's present).
    """
    keys = LAYOUTS[layout]
    rng = np.random.default_rng(sum(map(ord, entry + layout)))
    # A byte-swapped buffer kept as it is comes back in its own byte order: its values are checked through
    # what the next calls compute from them, which any correct reading gives.
    check_values = layout != "ByteSwapped"
    model = attention_model(KV_HEADS, HEAD_SIZE, name="kv_caller_layouts", q_heads=Q_HEADS, is_causal=1)
    past_k, past_v = _cache(rng, PAST)
    decode = _Decode(rng, past_k, past_v)
    if entry in ("Q", "K", "V"):
        steps = [{"op": "open", "as": "init", "initial": {"past_key": _literal(past_k),
                                                          "past_value": _literal(past_v)}}]
        refused = decode.branch()
        accepted = decode
        feeds = decode.draw(2)
        run = accepted.run(feeds, "r1", keys, entry.lower())
        after = decode.draw(1)
        unchanged = [{"op": "values", "as": "v0", "values": {"past_key": _literal(past_k),
                                                             "past_value": _literal(past_v)}},
                     {"op": "identity", "same": [["init|past_key", "v0|past_key"],
                                                 ["init|past_value", "v0|past_value"]]},
                     refused.run(after, "r2")]
        steps.append({**run, **_RUN_REFUSED, "if_accepted": [accepted.run(after, "r2")], "if_rejected": unchanged})
        return {"model": model, "steps": steps}
    if entry == "InitialCache":
        kept = _kept("given", decode, check_values)
        kept += [decode.run(decode.draw(2), "r1"), decode.run(decode.draw(1), "r2")]
        steps = [{"op": "open", "as": "given", "initial": _laid_cache(past_k, past_v, keys), **_REFUSED,
                  "if_accepted": kept}]
        return {"model": model, "steps": steps}
    if entry != "ResetCache":
        raise ValueError(f"unknown entry {entry!r}")
    steps = [{"op": "open", "initial": {"past_key": _literal(past_k), "past_value": _literal(past_v)}},
             decode.run(decode.draw(1), "r0")]
    refused = decode.branch()
    reset_k, reset_v = _cache(rng, PAST)
    accepted = _Decode(rng, reset_k, reset_v)
    after = accepted.draw(2)
    kept = _kept("given", accepted, check_values) + [accepted.run(after, "r1")]
    unchanged = [{"op": "values", "as": "v0", "values": {"past_key": _literal(refused.keys),
                                                         "past_value": _literal(refused.values)}},
                 {"op": "identity", "same": [["r0|present_key", "v0|past_key"],
                                             ["r0|present_value", "v0|past_value"]]},
                 refused.run(after, "r1")]
    steps.append({"op": "reset", "as": "given", "initial": _laid_cache(reset_k, reset_v, keys), **_REFUSED,
                  "if_accepted": kept, "if_rejected": unchanged})
    return {"model": model, "steps": steps}

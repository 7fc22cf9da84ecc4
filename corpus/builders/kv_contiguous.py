"""Contiguous KV-cache builders for failure, cancellation, shared prefixes and fixed capacities.

A runtime may append into spare cache capacity in place (the reference does), which is what these traces
probe. Expected values are NumPy formulas: Concat for present, softmax(Q K^T / sqrt(D)) V for Y, slot
writes for TensorScatter.
"""

from __future__ import annotations

import numpy as np

from . import builder
from .kv import _literal, _tensor_vi, attention_model, attention_numpy


class Cache:
    """One request's K/V so far and the outputs of appending to it."""

    def __init__(self, rng, heads: int, head_size: int):
        self.rng = rng
        self.k = self.v = np.zeros((1, heads, 0, head_size), np.float32)

    def branch(self) -> Cache:
        other = Cache.__new__(Cache)
        other.rng, other.k, other.v = self.rng, self.k, self.v
        return other

    def draw(self, count: int = 1) -> tuple[np.ndarray, ...]:
        shape = self.k.shape[:2] + (count, self.k.shape[3])
        return tuple(self.rng.standard_normal(shape).astype(np.float32) for _ in range(3))

    def step(self, label: str | None, count: int = 1, state: str = "main", tokens=None) -> dict:
        """A run appending ``count`` new tokens (or the given ``tokens`` (q, k, v)), labelled ``label``
        (None: unlabelled, so the caller keeps none of its outputs)."""
        q, k, v = tokens if tokens is not None else self.draw(count)
        self.k, self.v = np.concatenate([self.k, k], 2), np.concatenate([self.v, v], 2)
        y = attention_numpy(q.astype(np.float64), self.k.astype(np.float64), self.v.astype(np.float64))
        step = {"op": "run", "state": state,
                "feeds": {"q": _literal(q), "k": _literal(k), "v": _literal(v)},
                "outputs": {"y": _literal(y.astype(np.float32)), "present_key": _literal(self.k),
                            "present_value": _literal(self.v)}, "atol": 1e-5, "rtol": 1e-5}
        if label:
            step["as"] = label
        return step


def _held(label: str, cache: Cache) -> list[dict]:
    """Checks that the outputs returned at ``label`` still hold ``cache``'s values."""
    return [{"op": "check", "ref": f"{label}|present_key", "equals": _literal(cache.k)},
            {"op": "check", "ref": f"{label}|present_value", "equals": _literal(cache.v)}]


def _kept(cache: Cache) -> list[dict]:
    """After a failed or cancelled run: the retained past is still r1's present, the same buffers."""
    kept = {"past_key": _literal(cache.k), "past_value": _literal(cache.v)}
    same = [["r1|present_key", "after|past_key"], ["r1|present_value", "after|past_value"]]
    return [{"op": "values", "as": "after", "values": kept}, {"op": "identity", "same": same}]


@builder
def kv_contiguous_atomic(scenario: str, heads: int = 1, head_size: int = 4, seed: int = 81):
    """A prefill of three tokens and one decode step, then a run that fails (``mismatch``: K has one token,
    V two) or is issued with its cancellation already requested (``cancel``). A failed run leaves the
    retained past as the previous present (same buffers), decoding continues from it, and earlier
    outputs are unchanged. The spec says what a cancelled run leaves, not that a cancellation requested
    before the run must win: the run may end with STATE_CANCELLED (then as a failed run) or complete
    (then with all its new values, and decoding continues from them)."""
    rng = np.random.default_rng(seed)
    cache = Cache(rng, heads, head_size)
    empty = _literal(cache.k)
    trace = [{"op": "open", "initial": {"past_key": empty, "past_value": empty}}, cache.step("r0", 3)]
    held_r0 = cache.branch()
    trace.append(cache.step("r1"))
    held_r1 = cache.branch()
    q, k, v = cache.draw()
    if scenario == "cancel":
        completed = cache.branch()
        run = completed.step("rc", tokens=(q, k, v))
        trace.append({**run, "cancel": True, "error": "STATE_CANCELLED", "optional": True,
                      "if_rejected": _kept(cache) + [cache.step("r2"), cache.step("r3")],
                      "if_accepted": [completed.step("r2"), completed.step("r3")]})
    else:
        v2 = np.concatenate([v, v], axis=2)
        trace.append({"op": "run", "feeds": {"q": _literal(q), "k": _literal(k), "v": _literal(v2)},
                      "error": "STATE_RUN_FAILED", "also": ["EXECUTION_FAILED"],
                      "cause": ["ATTENTION_INPUT_INVALID", "KV_SHAPE_MISMATCH"]})
        trace += _kept(cache) + [cache.step("r2"), cache.step("r3")]
    trace += _held("r0", held_r0) + _held("r1", held_r1)
    model = attention_model(heads, head_size, free_tokens=scenario != "cancel")
    return {"model": model, "steps": trace}


@builder
def kv_contiguous_branches(heads: int = 1, head_size: int = 4, seed: int = 91):
    """s1 prefills three tokens and decodes two; s2 starts from s1's latest present (sharing its
    buffers) and appends A; s1 then appends B to the same prefix, and both go on. A runtime that
    appends into capacity behind a prefix someone else also extends would overwrite A with B."""
    rng = np.random.default_rng(seed)
    s1 = Cache(rng, heads, head_size)
    empty = _literal(s1.k)
    trace = [{"op": "open", "state": "s1", "initial": {"past_key": empty, "past_value": empty}},
             s1.step("r0", 3, "s1"), s1.step("r1", 1, "s1"), s1.step("r2", 1, "s1"),
             {"op": "open", "state": "s2", "initial": {"past_key": {"ref": "r2|present_key"},
                                                       "past_value": {"ref": "r2|present_value"}}}]
    shared = s1.branch()
    s2 = s1.branch()
    trace += [s2.step("b0", 1, "s2")]
    held_b0 = s2.branch()
    trace += [s1.step("r3", 1, "s1"), s2.step("b1", 1, "s2")]
    held_r3 = s1.branch()
    trace += [s1.step("r4", 1, "s1")]
    trace += _held("r2", shared) + _held("b0", held_b0) + _held("r3", held_r3)
    for name, cache in (("s1", s1), ("s2", s2)):
        trace.append({"op": "values", "state": name, "values": {"past_key": _literal(cache.k),
                                                                 "past_value": _literal(cache.v)}})
    return {"model": attention_model(heads, head_size), "steps": trace}


# ------------------------------------------------------------------------------ TensorScatter
def scatter_model(capacity: int, heads: int, head_size: int, mode: str):
    """TensorScatter(past, update, write_indices) (opset 24) with ``past <- present``."""
    from .common import model

    m = model("kv_scatter", opset=24)
    g = m.graph
    node = g.node.add(op_type="TensorScatter", input=["past", "update", "write_indices"], output=["present"])
    node.attribute.add(name="mode", type=3, s=mode.encode())
    _tensor_vi(g, "past", [1, heads, capacity, head_size])
    _tensor_vi(g, "update", [1, heads, "n", head_size])
    _tensor_vi(g, "write_indices", [1], elem=7)
    _tensor_vi(g, "present", [1, heads, capacity, head_size], output=True)
    g.persistent_bindings.add(input_name="past", output_name="present")
    return m


def _write(label: str | None, index: int, update: np.ndarray, present: np.ndarray | None = None, **extra) -> dict:
    step = {"op": "run", "feeds": {"update": _literal(update),
                                   "write_indices": {"dtype": "int64", "shape": [1], "data": [index]}}, **extra}
    if label:
        step["as"] = label
    if present is not None:
        step["outputs"] = {"present": _literal(present)}
    return step


@builder
def kv_scatter_capacity(scenario: str, capacity: int = 4, heads: int = 1, head_size: int = 2):
    """``overflow``: a two-token write that would cross the fixed capacity fails whole (no token of it
    lands) and the cache stays as it was; ``circular``: a ring of ``capacity`` slots reused past its end,
    every earlier output intact. Slot values are step numbers, so expected caches are hand-checkable."""
    mode = "circular" if scenario == "circular" else "linear"
    cache = np.zeros((1, heads, capacity, head_size), np.float32)
    trace = [{"op": "open", "initial": {"past": _literal(cache)}}]
    history = []
    if scenario in ("zero_capacity", "ring_overflow"):
        return _invalid_capacity(scenario, capacity, heads, head_size)
    writes = [(0, 2), (2, 1)] if scenario == "overflow" else [(i, 1) for i in range(capacity + 2)]
    for number, (index, count) in enumerate(writes):
        update = np.full((1, heads, count, head_size), number + 1, np.float32)
        cache = cache.copy()
        cache[:, :, (index + np.arange(count)) % capacity] = update
        trace.append(_write(f"w{number}", index, update, cache))
        history.append((f"w{number}", cache))
    if scenario == "overflow":
        last = history[-1][0]
        trace.append(_write(None, capacity - 1, np.full((1, heads, 2, head_size), 9, np.float32),
                            error="STATE_RUN_FAILED", also=["KV_CAPACITY_EXCEEDED", "EXECUTION_FAILED"]))
        trace.append({"op": "values", "as": "after", "values": {"past": _literal(cache)}})
        trace.append({"op": "identity", "same": [[f"{last}|present", "after|past"]]})
        cache = cache.copy()
        cache[:, :, capacity - 1] = 3
        trace.append(_write("w2", capacity - 1, np.full((1, heads, 1, head_size), 3, np.float32), cache))
    trace += [{"op": "check", "ref": f"{label}|present", "equals": _literal(value)} for label, value in history]
    return {"model": scatter_model(capacity, heads, head_size, mode), "steps": trace}


# ------------------------------------------------------------------------- fixed-capacity reuse
@builder
def kv_capacity_reuse(scenario: str, heads: int = 1, q_heads: int | None = None, head_size: int = 4,
                      prefill: int = 4, steps: int = 6, chunk: int = 1, seed: int = 101):
    """A prefill then ``steps`` appends of ``chunk`` tokens.

    ``identity`` (labelled runs: the caller keeps every present): every present shares the first
    present's allocation and the first present still holds its values. ``counters`` and ``no_whole_copy``
    (unlabelled runs: the caller keeps no present, so only the state refers to the cache and ownership
    permits reusing it): the runtime's ``kv_bytes_written`` grows by exactly the new tokens' K and V bytes
    (``counters``), or by less than copying the whole present at every append writes (``no_whole_copy``).
    """
    rng = np.random.default_rng(seed)
    q_heads = heads if q_heads is None else q_heads
    cache = Cache(rng, heads, head_size)
    empty = _literal(cache.k)
    labelled = scenario == "identity"
    trace = [{"op": "open", "initial": {"past_key": empty, "past_value": empty}},
             _grouped(cache.step("r0" if labelled else None, prefill), q_heads, rng)]
    first = cache.branch()
    if not labelled:
        trace.append({"op": "counters", "as": "c0"})
    for index in range(1, steps + 1):
        trace.append(_grouped(cache.step(f"r{index}" if labelled else None, chunk), q_heads, rng))
    token = 2 * heads * head_size * 4  # K and V bytes of one token, float32
    if scenario == "counters":
        trace.append({"op": "counters", "since": "c0", "equals": {"kv_bytes_written": steps * chunk * token}})
    elif scenario == "no_whole_copy":
        whole = sum(prefill + index * chunk for index in range(1, steps + 1)) * token
        trace.append({"op": "counters", "since": "c0", "at_most": {"kv_bytes_written": whole - 1}})
    else:
        labels = [f"r{index}" for index in range(steps + 1)]
        trace.append({"op": "identity", "same": [[f"{label}|present_{kind}" for label in labels]
                                                 for kind in ("key", "value")]})
        trace += _held("r0", first)
    model = attention_model(heads, head_size, q_heads=q_heads)
    return {"model": model, "steps": trace}


def _grouped(step: dict, q_heads: int, rng) -> dict:
    """A Cache step rewritten for ``q_heads`` query heads (GQA): new queries, Y recomputed."""
    k = np.asarray(step["feeds"]["k"]["data"], np.float32).reshape(step["feeds"]["k"]["shape"])
    if q_heads == k.shape[1]:
        return step
    from .kv_attention import attention_formula

    keys = np.asarray(step["outputs"]["present_key"]["data"], np.float32).reshape(
        step["outputs"]["present_key"]["shape"])
    values = np.asarray(step["outputs"]["present_value"]["data"], np.float32).reshape(keys.shape)
    q = rng.standard_normal((1, q_heads) + k.shape[2:]).astype(np.float32)
    y = attention_formula(q, keys, values, keys.shape[2] - k.shape[2])
    return {**step, "feeds": {**step["feeds"], "q": _literal(q)},
            "outputs": {**step["outputs"], "y": _literal(y.astype(np.float32))}}


def _invalid_capacity(scenario: str, capacity: int, heads: int, head_size: int) -> dict:
    """TensorScatter requires sequence_length <= max_sequence_length: ``zero_capacity``, a cache of no slots
    takes a one-token write; ``ring_overflow``, a circular cache of ``capacity`` slots takes a write of
    ``capacity + 1`` tokens. Either run fails and the cache stays the caller's initial value."""
    slots = 0 if scenario == "zero_capacity" else capacity
    count = 1 if scenario == "zero_capacity" else capacity + 1
    mode = "linear" if scenario == "zero_capacity" else "circular"
    cache = np.full((1, heads, slots, head_size), 7, np.float32)
    trace = [{"op": "open", "as": "init", "initial": {"past": _literal(cache)}},
             _write(None, 0, np.ones((1, heads, count, head_size), np.float32), error="STATE_RUN_FAILED",
                    cause=["KV_CAPACITY_INVALID", "KV_CAPACITY_EXCEEDED", "KV_SHAPE_MISMATCH", "EXECUTION_FAILED"]),
             {"op": "values", "as": "after", "values": {"past": _literal(cache)}}]
    if slots:  # an empty buffer has no identity to keep
        trace.append({"op": "identity", "same": [["init|past", "after|past"]]})
    return {"model": scatter_model(slots, heads, head_size, mode), "steps": trace}

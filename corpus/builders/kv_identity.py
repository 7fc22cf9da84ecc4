"""Two KV decode models, or two caches, that differ from an accepted one in exactly one part: one attribute
of the attention they lower (scale, softcap, is_causal, a sliding window), the number of KV heads, the
declared head size of the cache, or the encoding of a paged cache's blocks.

A runtime that caches what it derived from the first (the lowered attention attributes, a plan compiled for
its head counts, the validated cache metadata, the block decoders) under a key missing that part (the graph's
or the node's name, the cache input's name, a block's position) answers the second from the first. The twin
models share the graph name, the node name and every input and output name, so only a key holding the part
itself tells them apart.

Each trace runs model A on a cache, opens model B (``models = {twin}``) on a state of its own, by default
continuing A's present (a ``{ref}`` to it), then runs A and B again: every Y must follow its own model's
attributes, whichever ran last. Expected values are ONNX Attention in float64 NumPy (``attention_y`` of
kv_combinations: scale, softcap, causal frontier and windows at the query's absolute position, grouped
heads), and for encoded blocks over the values a correct consumer decodes (kv_formats, written from the
spec); never the oracle's output.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field

import numpy as np

from . import builder
from .kv import _literal, attention_model, paged_model
from .kv_combinations import attention_y
from .kv_formats import encode
from .kv_paged import block_literal, cache_literal

#: query amplitude: scores of a few units, so scale, softcap and the frontier each move Y well past 1e-5
AMPLITUDE = 1.5
PAST, BLOCK_SIZE, TOLERANCE = 4, 4, 1e-5
#: the node name both twins give their attention node (a key a runtime might cache by)
NODE = "attention"


@dataclass(frozen=True)
class Twin:
    """Model A's and model B's attention: heads, head size and attributes; ``opset`` of both."""

    a: dict = field(default_factory=dict)
    b: dict = field(default_factory=dict)
    heads: tuple[tuple[int, int], tuple[int, int]] = ((4, 2), (4, 2))  # (query heads, KV heads) of A, B
    head_size: tuple[int, int] = (8, 8)
    opset: int = 23
    #: whether B continues A's cache (otherwise B opens a cache of its own, after A's is refused)
    continued: bool = True


#: path -> part -> the twins
TWINS: dict[str, dict[str, Twin]] = {
    "contiguous": {
        "Scale": Twin(b={"scale": 1.0}),
        "Softcap": Twin(b={"softcap": 1.0}),
        "Causal": Twin(a={"is_causal": 1}, b={"is_causal": 0}),
        "KvHeads": Twin(heads=((4, 4), (4, 2)), continued=False),
        "HeadSize": Twin(head_size=(8, 4), continued=False),
        "Window": Twin(a={"is_causal": 1}, b={"is_causal": 1, "left_window_size": 2}, opset=25),
    },
    "paged": {
        # the role's is_causal defaults to 1: A leaves it out, B sets 0
        "Causal": Twin(b={"is_causal": 0}),
        "KvHeads": Twin(heads=((4, 4), (4, 2)), continued=False),
        "Scale": Twin(b={"scale": 1.0}),
        "Softcap": Twin(b={"softcap": 1.0}),
        "Window": Twin(b={"left_window_size": 2}),
    },
}
#: tokens per call: A, B, A, B (chunks of two, so the causal frontier and windows inside a call matter)
CALLS = (("main", 2), ("b", 2), ("main", 2), ("b", 2))


def _formula(attrs: dict, paged: bool) -> dict:
    causal = attrs.get("is_causal", 1 if paged else 0)
    return {"scale": attrs.get("scale"), "softcap": attrs.get("softcap", 0.0), "causal": bool(causal),
            "left": attrs.get("left_window_size", -1)}


def _model(path: str, twin: Twin, which: int):
    """Model A (``which`` 0) or B (1): the same graph and node names, inputs and outputs."""
    attrs = {name: (float(v) if name in ("scale", "softcap") else v) for name, v in (twin.a, twin.b)[which].items()}
    q_heads, kv_heads = twin.heads[which]
    size = twin.head_size[which]
    if path == "contiguous":
        m = attention_model(kv_heads, size, name="kv_identity", q_heads=q_heads, opset=twin.opset, **attrs)
    else:
        m = paged_model(kv_heads, size, BLOCK_SIZE, q_heads=q_heads, tokens="s", **attrs)
        m.graph.name = "kv_identity"
    m.graph.node[0].name = NODE
    return m


class _Cache:
    """One state's keys and values so far, (1, Hkv, T, D) float32, and the attention of its model."""

    def __init__(self, keys: np.ndarray, values: np.ndarray, q_heads: int, attrs: dict, paged: bool):
        self.keys, self.values, self.q_heads = keys, values, q_heads
        self.formula = _formula(attrs, paged)

    def step(self, rng, state: str, label: str, count: int, paged: bool) -> dict:
        kv_heads, size = self.keys.shape[1], self.keys.shape[3]
        q = (rng.standard_normal((1, self.q_heads, count, size)) * AMPLITUDE).astype(np.float32)
        k = (rng.standard_normal((1, kv_heads, count, size)) * AMPLITUDE).astype(np.float32)
        v = rng.standard_normal((1, kv_heads, count, size)).astype(np.float32)
        past = self.keys.shape[2]
        self.keys, self.values = np.concatenate([self.keys, k], 2), np.concatenate([self.values, v], 2)
        total = self.keys.shape[2]
        y = attention_y(q, self.keys, self.values, np.arange(past, total)[None], np.ones((1, total), bool),
                        **self.formula)
        outputs = {"y": _literal(y.astype(np.float32))}
        if not paged:
            outputs.update(present_key=_literal(self.keys), present_value=_literal(self.values))
        return {"op": "run", "state": state, "as": label, "feeds": {"q": _literal(q), "k": _literal(k),
                                                                     "v": _literal(v)},
                "outputs": outputs, "atol": TOLERANCE, "rtol": TOLERANCE}


def _initial(rng, path: str, heads: int, size: int, fmt: str = "dense"):
    """(initial values, the keys and values a correct consumer holds (1, H, PAST, D)): a bound past of
    ``PAST`` tokens, or one full paged block in ``fmt``."""
    k = (rng.standard_normal((PAST, heads, size)) * AMPLITUDE).astype(np.float32)
    v = rng.standard_normal((PAST, heads, size)).astype(np.float32)
    if path == "contiguous":
        keys, values = k.transpose(1, 0, 2)[None], v.transpose(1, 0, 2)[None]
        return {"past_key": _literal(keys), "past_value": _literal(values)}, keys, values
    (key, k_decoded), (value, v_decoded) = encode(k, fmt), encode(v, fmt)
    cache = cache_literal([block_literal(0, PAST, key, value)], PAST)
    return {"cache": cache}, k_decoded.transpose(1, 0, 2)[None], v_decoded.transpose(1, 0, 2)[None]


def _ref(label: str, path: str) -> dict:
    names = {"past_key": "present_key", "past_value": "present_value"} if path == "contiguous" \
        else {"cache": "next_cache"}
    return {name: {"ref": f"{label}|{output}"} for name, output in names.items()}


@builder
def kv_identity_twin(path: str, part: str) -> dict:
    """Model A runs a two-token call on a cache of ``PAST`` tokens; model B, differing from A in ``part``
    alone (TWINS), opens a state continuing A's present (or, where B's heads or head size cannot hold A's
    cache, is refused A's present and opens a cache of its own); then A, B, A and B run. Each Y is
    attention with its own model's attributes over its own state's tokens."""
    twin = TWINS[path][part]
    paged = path == "paged"
    rng = np.random.default_rng(zlib.crc32(f"{path}{part}".encode()))
    initial, keys, values = _initial(rng, path, twin.heads[0][1], twin.head_size[0])
    caches = {"main": _Cache(keys, values, twin.heads[0][0], twin.a, paged)}
    steps = [{"op": "open", "initial": initial}, caches["main"].step(rng, "main", "a0", 2, paged)]
    if twin.continued:
        cache = caches["main"]
        # A runtime may refuse to retain A's present as it is (its layout, say): B then opens over a copy of
        # the same values, and everything after is the same.
        copied = {"past_key": _literal(cache.keys), "past_value": _literal(cache.values)}
        steps.append({"op": "open", "state": "b", "model": "twin", "initial": _ref("a0", path),
                      **({} if paged else {"optional": True, "error": "STATE_UNRETAINABLE", "if_rejected": [
                          {"op": "open", "state": "b", "model": "twin", "initial": copied}]})})
        caches["b"] = _Cache(cache.keys, cache.values, twin.heads[1][0], twin.b, paged)
    else:
        if not paged:  # A's cache (its values, in a plain buffer) has the wrong heads or head size for B's
            cache = caches["main"]
            copied = {"past_key": _literal(cache.keys), "past_value": _literal(cache.values)}
            steps.append({"op": "open", "state": "refused", "model": "twin", "initial": copied,
                          "error": "STATE_VALUE_INCOMPATIBLE", "continue": True})
        own, keys, values = _initial(rng, path, twin.heads[1][1], twin.head_size[1])
        steps.append({"op": "open", "state": "b", "model": "twin", "initial": own})
        caches["b"] = _Cache(keys, values, twin.heads[1][0], twin.b, paged)
    for index, (state, count) in enumerate(CALLS[1:], start=1):
        steps.append(caches[state].step(rng, state, f"{'a' if state == 'main' else 'b'}{index}", count, paged))
    return {"model": _model(path, twin, 0), "models": {"twin": _model(path, twin, 1).SerializeToString()},
            "steps": steps}


#: block format of state A's cache -> of state B's: the same payload sizes, another decoding
BLOCK_FORMATS = {"Int8ThenUint8": ("int8", "uint8"), "Uint4ThenInt4": ("uint4", "int4"),
                 "Int8ThenGroupedInt8": ("int8", "int8/4")}


@builder
def kv_identity_block_format(formats: str, heads: int = 2, head_size: int = 8) -> dict:
    """One paged model, two states whose initial caches hold one full block each, encoded in two formats
    of equal payload size (BLOCK_FORMATS): states A and B open, then A, B, A, B run. Each Y is attention
    over the values its own blocks decode to (kv_formats), so a decoder bound to the first cache's block
    (by the cache input's name, the block's position or the model) misreads the second's."""
    first, second = BLOCK_FORMATS[formats]
    rng = np.random.default_rng(zlib.crc32(formats.encode()))
    caches, steps = {}, []
    for state, fmt in (("main", first), ("b", second)):
        initial, keys, values = _initial(rng, "paged", heads, head_size, fmt)
        caches[state] = _Cache(keys, values, heads, {}, True)
        steps.append({"op": "open", "state": state, "initial": initial})
    for index, (state, count) in enumerate((("main", 1), ("b", 1), ("main", 2), ("b", 1))):
        steps.append(caches[state].step(rng, state, f"r{index}", count, True))
    model = paged_model(heads, head_size, BLOCK_SIZE, tokens="s")
    model.graph.node[0].name = NODE
    return {"model": model, "steps": steps}

"""Attention over a KV cache with its features in combination: a covering array (corpus/builders/covering.py)
over the cache path and block format, the head ratio, prefill or decode, and every Attention attribute and
input the consumers take, so every pair of options (and the triples of GROUPS) meets in some case.

Each row is one decode trace. The cache starts with ``INITIAL`` tokens (7 with ``tail = partial``): a
bound past for the contiguous path, two batch rows of an external cache read with ``nonpad_kv_seqlen``
(``padding = ragged``), or 4-token blocks already encoded in the row's format for the paged path (the
second block holding 3 valid tokens of 4 slots with a partial tail). Then the calls of ``PHASES``: two
one-token decodes, a 3-token prefill, or a 6-token prefill ending mid-block followed by one decode token.

Every expected Y is ONNX Attention written here in float64 NumPy (``attention_y``) over the values a
correct consumer decodes from each block (``kv_formats.encode``, written from the spec): scores =
(Q K^T) * scale (default 1/sqrt(head_size); query head h reads key/value head h // (q_heads / kv_heads)),
then softcap c * tanh(scores / c), then the bias (attn_mask, the causal frontier and sliding windows at the
query's absolute position, padding at or beyond nonpad_kv_seqlen), softmax (a row with no attendable key
gives zeros), times V. tests/test_kv_interaction_cases.py checks every call against onnx's reference
evaluator on a plain Attention model over the K/V dequantized from the case's own payloads.

Levels: the spec forces attention over the cache to match ONNX Attention ("repeated Attention decode
comparison", the stateless loop), so rows using only what every consumer takes are Required: any option
on the contiguous path except sliding windows (Attention-25, beyond the Attention-23/24 of the other KV
cases), and on the paged path the role's own signature (causal, grouped heads, affine and dense blocks).
Rows needing the suite's extensions of the paged role (scale, softcap, attn_mask), sliding windows or the
codebook struct block (whose element order the spec leaves to the decoder) are Recommended.
"""

from __future__ import annotations

import functools
import zlib
from collections.abc import Mapping

import numpy as np

from . import builder
from .covering import covering_array
from .kv import _literal, _tensor_vi, add_attributes, attention_model, paged_model
from .kv_formats import encode
from .kv_paged import block_literal, cache_literal

#: factor -> options, in the order rows are built (the first option is the plainest)
FACTORS: dict[str, tuple] = {
    "storage": ("contiguous", "dense", "int8", "uint8", "int4", "uint4", "int2", "uint2", "int4:uint8",
                "uint2:int8", "codebook2"),
    "heads": ("mha", "gqa", "mqa"),
    "phase": ("decode", "prefill", "prefill-decode"),
    "causal": (0, 1),
    "scale": ("default", "explicit"),
    "softcap": ("off", "on"),
    "mask": ("none", "float", "bool"),
    "window": ("none", "left", "both"),
    "padding": ("none", "ragged"),
    "tail": ("full", "partial"),
}
#: factor sets covered at strength 3: the query positions (decode or prefill) against the head grouping and
#: the causal frontier or the sliding windows that read them
GROUPS = (("heads", "phase", "causal"), ("heads", "phase", "window"))
#: (query heads, key/value heads)
HEADS = {"mha": (2, 2), "gqa": (4, 2), "mqa": (4, 1)}
#: new tokens per call
PHASES = {"decode": (1, 1), "prefill": (3,), "prefill-decode": (6, 1)}
HEAD_SIZE, BLOCK_SIZE, INITIAL, CAPACITY = 8, 4, 8, 16
#: the explicit scale, the softcap, the window sizes and the amplitude of Q and K (scores of a few units,
#: so the softcap bends them and the scale matters)
SCALE, SOFTCAP, LEFT, RIGHT, AMPLITUDE = 0.75, 2.0, 3, 1, 1.5
#: the second batch row of a ragged external cache holds this many fewer tokens
RAGGED_SHORTFALL = 3
#: float32 summation order against float64 (decoded block values are exact in float32)
ATOL = RTOL = 1e-5


def paged(row: Mapping) -> bool:
    """Whether the row runs on the paged path (any storage but the contiguous cache)."""
    return row.get("storage") not in (None, "contiguous")


def allowed(row: Mapping) -> bool:
    """Combinations some consumer takes: nonpad_kv_seqlen only on the contiguous path (the paged role carries
    lengths in its block table), right windows only there too (the role has ``left_window_size`` only)."""
    return not (paged(row) and (row.get("padding") == "ragged" or row.get("window") == "both"))


def required(row: Mapping) -> bool:
    """Whether the spec forces the row's expectation on every consumer (see the module docstring); decided on
    the factors assigned so far, so the covering array can build the Required rows first."""
    if row.get("storage") == "codebook2" or row.get("window") not in (None, "none"):
        return False
    if paged(row):
        return row.get("scale") in (None, "default") and row.get("softcap") in (None, "off") \
            and row.get("mask") in (None, "none")
    return True


@functools.cache
def _rows() -> tuple[tuple[tuple[str, object], ...], ...]:
    base = covering_array(FACTORS, allowed=lambda r: allowed(r) and required(r))
    rows = covering_array(FACTORS, groups=GROUPS, allowed=allowed, seed=base)
    return tuple(tuple(row.items()) for row in rows)


def rows() -> list[dict]:
    """The covering array: the Required rows (pairwise over the Required options) first, then the rows that
    complete pairwise coverage, and the triples of GROUPS, over every option."""
    return [dict(row) for row in _rows()]


# --------------------------------------------------------------------------------------------- naming
_STORAGE_NAMES = {"contiguous": "", "dense": "Dense", "int8": "Int8", "uint8": "Uint8", "int4": "Int4",
                  "uint4": "Uint4", "int2": "Int2", "uint2": "Uint2", "int4:uint8": "Int4KeysUint8Values",
                  "uint2:int8": "Uint2KeysInt8Values", "codebook2": "Codebook"}
_PHASE_NAMES = {"decode": "Decode", "prefill": "Prefill", "prefill-decode": "PrefillThenDecode"}


def row_name(row: Mapping) -> str:
    """The case name: every option that is not the plainest, in factor order."""
    parts = [_STORAGE_NAMES[row["storage"]], row["heads"].capitalize(), _PHASE_NAMES[row["phase"]],
             "Causal" if row["causal"] else "", "ExplicitScale" if row["scale"] == "explicit" else "",
             "Softcap" if row["softcap"] == "on" else "",
             {"none": "", "float": "FloatMask", "bool": "BoolMask"}[row["mask"]],
             {"none": "", "left": "LeftWindow", "both": "TwoSidedWindow"}[row["window"]],
             "RaggedPadding" if row["padding"] == "ragged" else "",
             ("PartialBlock" if paged(row) else "PastOfSeven") if row["tail"] == "partial" else ""]
    return "".join(parts)


def row_what(row: Mapping) -> str:
    """The row in words, for the case description."""
    q_heads, kv_heads = HEADS[row["heads"]]
    initial = INITIAL - (row["tail"] == "partial")
    if not paged(row):
        where = (f"an external cache of {CAPACITY} slots, two batch rows holding {initial} and "
                 f"{initial - RAGGED_SHORTFALL} tokens, written by TensorScatter and read with nonpad_kv_seqlen"
                 if row["padding"] == "ragged" else f"a bound past of {initial} tokens")
    else:
        key, _, value = row["storage"].partition(":")
        formats = f"{key.upper()} key and {(value or key).upper()} value blocks"
        if row["storage"] == "codebook2":
            formats = "SCALED_CODEBOOK2_BLOCK_32 struct blocks"
        elif row["storage"] == "dense":
            formats = "dense FLOAT blocks"
        where = (f"an initial paged cache of {formats} ({initial} tokens in 4-token blocks"
                 f"{', the second holding 3 valid tokens of 4 slots' if row['tail'] == 'partial' else ''})")
    calls = {"decode": "two one-token decode calls", "prefill": "a 3-token prefill",
             "prefill-decode": "a 6-token prefill ending mid-block, then one decode token"}[row["phase"]]
    on = "one KV head" if kv_heads == 1 else f"{kv_heads} KV heads"
    attributes = [f"{q_heads} query heads on {on}", "causal" if row["causal"] else "not causal"]
    if row["scale"] == "explicit":
        attributes.append(f"scale {SCALE}")
    if row["softcap"] == "on":
        attributes.append(f"softcap {SOFTCAP}")
    if row["mask"] != "none":
        attributes.append(f"a {row['mask']} attn_mask")
    if row["window"] != "none":
        attributes.append(f"left_window_size {LEFT}" + (f", right_window_size {RIGHT}"
                                                         if row["window"] == "both" else ""))
    return f"{where}; {calls}; {', '.join(attributes)}"


# ------------------------------------------------------------------------------------------- the formula
def attention_y(q, k, v, positions, valid, scale: float | None = None, softcap: float = 0.0, causal: bool = False,
                left: int = -1, right: int = -1, mask: np.ndarray | None = None) -> np.ndarray:
    """ONNX Attention in float64: Y (B, Hq, S, D) for q (B, Hq, S, D) over k, v (B, Hkv, T, D), where query i
    of row b sits at position ``positions[b, i]`` and key j at position j, attendable where ``valid[b, j]``."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    group = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)  # query head h -> key/value head h // group
    scale = 1.0 / np.sqrt(q.shape[-1]) if scale is None else scale
    scores = q @ np.swapaxes(k, -1, -2) * scale
    if softcap > 0:
        scores = softcap * np.tanh(scores / softcap)
    query = np.asarray(positions, np.int64)[:, None, :, None]  # (B, 1, S, 1)
    key = np.arange(k.shape[2])[None, None, None, :]
    allowed = np.broadcast_to(np.asarray(valid, bool)[:, None, None, :], scores.shape).copy()
    if causal:
        allowed &= key <= query
    if left >= 0:
        allowed &= query - key <= left
    if right >= 0:
        allowed &= key - query <= right
    bias = np.where(allowed, 0.0, -np.inf)
    if mask is not None:
        bias = bias + (np.where(mask, 0.0, -np.inf) if mask.dtype == bool else mask.astype(np.float64))
    scores = scores + bias
    top = scores.max(axis=-1, keepdims=True)
    empty = np.isneginf(top)  # no attendable key: a zero row
    weights = np.exp(scores - np.where(empty, 0.0, top))
    total = weights.sum(axis=-1, keepdims=True)
    return np.where(empty, 0.0, weights / np.where(empty, 1.0, total)) @ v


# --------------------------------------------------------------------------------------------- the trace
def _mask(rng, kind: str, shape: tuple, own: np.ndarray) -> np.ndarray:
    """A bool or float mask of ``shape`` (B, Hq, S, T); query i of row b may always see its own key
    ``own[b, i]`` (float masks mix -inf with finite values, different per head)."""
    batch, _, queries, _ = shape
    rows, cols = np.arange(batch)[:, None], np.arange(queries)[None, :]
    if kind == "bool":
        mask = rng.random(shape) < 0.6
        mask[rows, :, cols, own] = True
        return mask
    mask = rng.choice(np.array([-np.inf, -1.5, 0.0, 0.7, 2.0], np.float32), shape)
    mask[rows, :, cols, own] = 0.0
    return mask


def _attributes(row: Mapping) -> dict:
    attrs = {"is_causal": int(row["causal"])}
    if row["scale"] == "explicit":
        attrs["scale"] = SCALE
    if row["softcap"] == "on":
        attrs["softcap"] = SOFTCAP
    if row["window"] != "none":
        attrs["left_window_size"] = LEFT
    if row["window"] == "both":
        attrs["right_window_size"] = RIGHT
    return attrs


def _formula_args(row: Mapping) -> dict:
    return {"scale": SCALE if row["scale"] == "explicit" else None,
            "softcap": SOFTCAP if row["softcap"] == "on" else 0.0, "causal": bool(row["causal"]),
            "left": LEFT if row["window"] != "none" else -1, "right": RIGHT if row["window"] == "both" else -1}


def external_model(row: Mapping, q_heads: int, kv_heads: int):
    """ONNX Attention's external-cache use over two batch rows: bound caches (2, kv_heads, CAPACITY, D),
    TensorScatter writing each call's k/v at ``write_indices``, Attention reading the whole cache with
    ``nonpad_kv_seqlen`` (opset 24; 25 with a sliding window) and the row's attributes."""
    from .common import model

    m = model("kv_combination_external", opset=25 if row["window"] != "none" else 24)
    g = m.graph
    g.node.add(op_type="TensorScatter", input=["cache_key", "k", "write_indices"], output=["next_key"])
    g.node.add(op_type="TensorScatter", input=["cache_value", "v", "write_indices"], output=["next_value"])
    mask = "attn_mask" if row["mask"] != "none" else ""
    node = g.node.add(op_type="Attention", input=["q", "next_key", "next_value", mask, "", "", "nonpad"],
                      output=["y"])
    add_attributes(node, _attributes(row))
    _tensor_vi(g, "q", [2, q_heads, "s", HEAD_SIZE])
    for name in ("k", "v"):
        _tensor_vi(g, name, [2, kv_heads, "s", HEAD_SIZE])
    if mask:
        _tensor_vi(g, mask, [2, q_heads, "s", CAPACITY], elem=9 if row["mask"] == "bool" else 1)
    for name in ("cache_key", "cache_value"):
        _tensor_vi(g, name, [2, kv_heads, CAPACITY, HEAD_SIZE])
    _tensor_vi(g, "write_indices", [2], elem=7)
    _tensor_vi(g, "nonpad", [2], elem=7)
    _tensor_vi(g, "y", [2, q_heads, "s", HEAD_SIZE], output=True)
    for name in ("next_key", "next_value"):
        _tensor_vi(g, name, [2, kv_heads, CAPACITY, HEAD_SIZE], output=True)
    g.persistent_bindings.add(input_name="cache_key", output_name="next_key")
    g.persistent_bindings.add(input_name="cache_value", output_name="next_value")
    return m


def _initial(row: Mapping, rng, kv_heads: int):
    """(initial state values, keys and values a correct consumer holds (B, Hkv, T, D), tokens per row)."""
    initial = INITIAL - (row["tail"] == "partial")
    if row["padding"] == "ragged":
        lengths = [initial, initial - RAGGED_SHORTFALL]
        shape = (2, kv_heads, CAPACITY, HEAD_SIZE)
        # padding slots hold large junk: a consumer reading beyond nonpad_kv_seqlen is seen
        keys = (rng.standard_normal(shape) * 4).astype(np.float32)
        values = (rng.standard_normal(shape) * 4).astype(np.float32)
        for b, count in enumerate(lengths):
            keys[b, :, :count] = rng.standard_normal((kv_heads, count, HEAD_SIZE)) * AMPLITUDE
            values[b, :, :count] = rng.standard_normal((kv_heads, count, HEAD_SIZE))
        return {"cache_key": _literal(keys), "cache_value": _literal(values)}, keys, values, lengths
    if not paged(row):
        keys = (rng.standard_normal((1, kv_heads, initial, HEAD_SIZE)) * AMPLITUDE).astype(np.float32)
        values = rng.standard_normal((1, kv_heads, initial, HEAD_SIZE)).astype(np.float32)
        return {"past_key": _literal(keys), "past_value": _literal(values)}, keys, values, [initial]
    key_format, _, value_format = row["storage"].partition(":")
    value_format = value_format or key_format
    blocks, decoded_k, decoded_v, start = [], [], [], 0
    for valid in (BLOCK_SIZE, initial - BLOCK_SIZE):
        k = (rng.standard_normal((BLOCK_SIZE, kv_heads, HEAD_SIZE)) * AMPLITUDE).astype(np.float32)
        v = rng.standard_normal((BLOCK_SIZE, kv_heads, HEAD_SIZE)).astype(np.float32)
        (key, k_decoded), (value, v_decoded) = encode(k, key_format), encode(v, value_format)
        blocks.append(block_literal(start, valid, key, value))
        decoded_k.append(k_decoded[:valid])
        decoded_v.append(v_decoded[:valid])
        start += valid
    keys = np.concatenate(decoded_k).transpose(1, 0, 2)[None]  # (1, Hkv, T, D)
    values = np.concatenate(decoded_v).transpose(1, 0, 2)[None]
    return {"cache": cache_literal(blocks, start)}, keys, values, [initial]


@builder
def kv_combination(storage: str, heads: str, phase: str, causal: int, scale: str, softcap: str, mask: str,
                   window: str, padding: str, tail: str):
    """One row of the covering array as a decode trace (see the module docstring); the data's seed is the
    row's name, so every row draws its own."""
    row = {"storage": storage, "heads": heads, "phase": phase, "causal": causal, "scale": scale,
           "softcap": softcap, "mask": mask, "window": window, "padding": padding, "tail": tail}
    if set(row.items()) - {(name, value) for name in FACTORS for value in FACTORS[name]} or not allowed(row):
        raise ValueError(f"not a row of the covering array: {row}")
    rng = np.random.default_rng(zlib.crc32(row_name(row).encode()))
    q_heads, kv_heads = HEADS[heads]
    initial, keys, values, lengths = _initial(row, rng, kv_heads)
    ragged = padding == "ragged"
    batch = 2 if ragged else 1
    steps = [{"op": "open", "initial": initial}]
    for index, count in enumerate(PHASES[phase]):
        q = (rng.standard_normal((batch, q_heads, count, HEAD_SIZE)) * AMPLITUDE).astype(np.float32)
        k = (rng.standard_normal((batch, kv_heads, count, HEAD_SIZE)) * AMPLITUDE).astype(np.float32)
        v = rng.standard_normal((batch, kv_heads, count, HEAD_SIZE)).astype(np.float32)
        feeds = {"q": q, "k": k, "v": v}
        positions = np.array([[length + i for i in range(count)] for length in lengths])
        if ragged:
            for b, length in enumerate(lengths):
                keys[b, :, length:length + count] = k[b]
                values[b, :, length:length + count] = v[b]
            feeds["write_indices"] = np.array(lengths, np.int64)
            lengths = [length + count for length in lengths]
            feeds["nonpad"] = np.array(lengths, np.int64)
        else:
            keys, values = np.concatenate([keys, k], 2), np.concatenate([values, v], 2)
            lengths = [lengths[0] + count]
        total = keys.shape[2]
        valid = np.arange(total)[None, :] < np.array(lengths)[:, None]
        attn_mask = None
        if mask != "none":
            attn_mask = _mask(rng, mask, (batch, q_heads, count, total), positions)
            feeds["attn_mask"] = attn_mask
        y = attention_y(q, keys, values, positions, valid, mask=attn_mask, **_formula_args(row))
        steps.append({"op": "run", "as": f"r{index}", "feeds": {name: _literal(x) for name, x in feeds.items()},
                      "outputs": {"y": _literal(y.astype(np.float32))}, "atol": ATOL, "rtol": RTOL})
    attrs = _attributes(row)
    if ragged:
        model = external_model(row, q_heads, kv_heads)
    elif paged(row):
        model = paged_model(kv_heads, HEAD_SIZE, BLOCK_SIZE, q_heads=q_heads, tokens="s",
                            mask=None if mask == "none" else mask, **attrs)
    else:
        model = attention_model(kv_heads, HEAD_SIZE, name="kv_combination", q_heads=q_heads,
                                mask=None if mask == "none" else mask, opset=25 if window != "none" else 23, **attrs)
    return {"model": model, "steps": steps}


# ------------------------------------------------------------------------------------------ the case file
_LOOP = "This helper is equivalent to the ordinary stateless loop:"
_DECODE = "repeated Attention decode comparison"
_FORMATS = ("Each K/V block may use a different EncodedValueProto layout, such as INT4, INT8 or a codebook struct, "
            "provided its decoded type and geometry satisfy the consumer contract.")
_RANGE = ("The block’s logical token range and valid length are value data; payload byte length measures physical "
          "records, not valid tokens.")
_DQ = ("Parameter shapes, axis normalization, code packing and decoded values follow the corresponding "
       "QuantizeLinear/DequantizeLinear contract.")
_COVERS = ("interactions, pairwise over the cache path and block format, head ratio, prefill or decode, is_causal, "
           "scale, softcap, attn_mask (float, bool), sliding windows, nonpad_kv_seqlen padding and partial tails, "
           "and three-way over head ratio x prefill or decode x is_causal and x sliding window")
#: (ID topic, profile, which rows, clauses, quotes)
FAMILIES = (
    ("AttentionCombinations", "kv-contiguous", lambda row: not paged(row),
     ["KV-ATTENTION", "KV-APPEND-EQUIV", "STATE-EQUIV-LOOP"],
     [_LOOP, "append touches only new tokens and matches functional execution.", _DECODE]),
    ("PagedCombinations", "kv-paged", lambda row: row["storage"] == "dense",
     ["KV-ATTENTION", "KV-PAGED-FORMATS", "KV-PAGED-RANGE", "STATE-EQUIV-LOOP"], [_LOOP, _DECODE, _FORMATS, _RANGE]),
    ("PagedCombinations", "kv-paged", lambda row: paged(row) and row["storage"] not in ("dense", "codebook2"),
     ["KV-ATTENTION", "KV-PAGED-FORMATS", "KV-PAGED-RANGE", "AFF-DQ", "STATE-EQUIV-LOOP"],
     [_LOOP, _DECODE, _FORMATS, _RANGE, _DQ]),
    ("PagedCombinations", "kv-paged", lambda row: row["storage"] == "codebook2",
     ["KV-ATTENTION", "KV-PAGED-FORMATS", "KV-PAGED-RANGE", "STATE-EQUIV-LOOP"], [_LOOP, _DECODE, _FORMATS, _RANGE]),
)
_HEADER = """\
# Attention over a KV cache with its features in combination. Generated: do not edit the rows by hand
#   python -c "from corpus.builders.kv_combinations import toml_text; print(toml_text(), end='')" \\
#     > corpus/cases/kv/attention_combinations.toml
# (tests/test_kv_interaction_cases.py checks they are the covering array of corpus/builders/covering.py).
# A runtime can be right about each feature alone and wrong where two meet; every pair of options of the
# factors below meets in some row, and the triples of head ratio x prefill/decode x is_causal and x window:
#   storage: the contiguous path (a bound past, or an external cache read with nonpad_kv_seqlen), or a paged
#            cache whose initial blocks are dense, INT8, UINT8, INT4, UINT4, INT2, UINT2, mixed (INT4 keys with
#            UINT8 values, UINT2 keys with INT8 values) or SCALED_CODEBOOK2_BLOCK_32 struct blocks
#   heads 2 on 2, 4 on 2, 4 on 1; phase: two decode tokens, a 3-token prefill, a 6-token prefill ending
#   mid-block then a decode token; is_causal; scale (default, 0.75); softcap (none, 2); attn_mask (none,
#   float, bool); windows (none, left 3, left 3 and right 1); nonpad_kv_seqlen (none, two ragged rows);
#   tail (8 initial tokens, or 7: a partial last block).
# Expected Y: ONNX Attention in float64 NumPy over the decoded values (corpus/builders/kv_combinations.py),
# checked call by call against onnx's reference evaluator over K/V dequantized from the case's own payloads.
# Required: what every consumer takes (the contiguous path without windows; the paged role's own signature
# with dense or affine blocks). Recommended: the suite's extensions of the paged role (scale, softcap,
# attn_mask), sliding windows (Attention-25) and codebook blocks (element order left to the decoder).
op = "state"
expectation_source = "numpy"
"""


def _toml(value) -> str:
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list):
        return "[" + ", ".join(_toml(item) for item in value) + "]"
    return str(value)


def toml_text() -> str:
    """The case file: one family per path and decoding kind, a row per covering-array row."""
    args = ", ".join(f"{name} = \"${name}\"" for name in FACTORS)
    parts = [_HEADER]
    for topic, profile, selects, clauses, quotes in FAMILIES:
        selected = [row for row in rows() if selects(row)]
        parts.append(f"""
[[family]]
id = "$level.KV.{topic}.$name"
profile = "{profile}"
builder = "kv_combination"
clause = {_toml(clauses)}
args = {{ {args} }}
description = "{_COVERS}: $what"
quote = {_toml(quotes)}
rows = [
""")
        for row in selected:
            level = "Required" if required(row) else "Recommended"
            fields = {"level": level, "name": row_name(row), **row, "what": row_what(row)}
            parts.append("  { " + ", ".join(f"{key} = {_toml(value)}" for key, value in fields.items()) + " },\n")
        parts.append("]\n")
    return "".join(parts)

"""Paged KV-cache builders: caches whose blocks are encoded in every format, invalid block tables and
capacities, block conversion, and failure/cancellation/branching over ``ai.rt::PagedAttention`` (the
paged_attention operator role).

Expected outputs are softmax(Q K^T / sqrt(D)) V in float64 NumPy over the values a correct consumer
decodes from each block (``kv_formats``), never the oracle's own output.
"""

from __future__ import annotations

import numpy as np
from google.protobuf import text_format

from reference_impl import schema

from . import builder
from .common import add_float_logical
from .kv import _literal, attention_numpy, paged_model
from .kv_formats import AFFINE, SCALED_CODEBOOK2_BLOCK_32, encode, float_tensor

KV_BLOCK, KV_PAGED_CACHE = 3100, 3101
#: Float32 summation order only: Y over decoded blocks versus float64 NumPy over the same values.
DECODED_ATOL = 1e-5


def _int64(value: int) -> dict:
    return {"dtype": "int64", "shape": [], "data": [int(value)]}


def _encoded(block) -> dict:
    """A block value literal: a dense float32 tensor, or an encoded value."""
    if isinstance(block, np.ndarray):
        return _literal(block)
    return {"encoded": text_format.MessageToString(block)}


def block_literal(start: int, valid: int, key, value) -> dict:
    return {"struct": {"start": _int64(start), "valid_length": _int64(valid), "key": _encoded(key),
                       "value": _encoded(value)}, "type_id": KV_BLOCK}


def cache_literal(blocks: list[dict], length: int) -> dict:
    return {"struct": {"blocks": {"sequence": blocks}, "length": _int64(length)}, "type_id": KV_PAGED_CACHE}


EMPTY_CACHE = cache_literal([], 0)


class Tokens:
    """The float values a cache holds, in order, and the expected attention of a new query over them."""

    def __init__(self, rng, heads: int, head_size: int):
        self.rng, self.heads, self.head_size = rng, heads, head_size
        self.keys: list[np.ndarray] = []  # each [H, n, D]
        self.values: list[np.ndarray] = []

    def draw(self, count: int = 1) -> tuple[np.ndarray, ...]:
        shape = (1, self.heads, count, self.head_size)
        return tuple(self.rng.standard_normal(shape).astype(np.float32) for _ in range(3))

    def extend(self, k: np.ndarray, v: np.ndarray) -> None:
        self.keys.append(k[0])
        self.values.append(v[0])

    def branch(self) -> Tokens:
        other = Tokens(self.rng, self.heads, self.head_size)
        other.keys, other.values = list(self.keys), list(self.values)
        return other

    def attend(self, q: np.ndarray) -> np.ndarray:
        k = np.concatenate(self.keys, axis=1)[None].astype(np.float64)
        v = np.concatenate(self.values, axis=1)[None].astype(np.float64)
        return attention_numpy(q.astype(np.float64), k, v).astype(np.float32)


def run_step(label: str | None, q, k, v, y, state: str = "main", atol: float = DECODED_ATOL, **extra) -> dict:
    """A run with its expected Y; ``label`` None leaves it unlabelled (the caller keeps none of its outputs)."""
    step = {"op": "run", "state": state, "feeds": {"q": _literal(q), "k": _literal(k), "v": _literal(v)},
            "outputs": {"y": _literal(y)}, "atol": atol, "rtol": 1e-5, **extra}
    if label:
        step["as"] = label
    return step


def layout_check(ref: str, fmt: str) -> dict:
    """A check that ``ref`` is encoded in the (non-dense) block format ``fmt``."""
    name = fmt.partition("/")[0]
    if name in AFFINE:
        return {"op": "check", "ref": ref, "layout": "affine", "storage_type": AFFINE[name][0]}
    return {"op": "check", "ref": ref, "layout": "struct_type", "type_ref": SCALED_CODEBOOK2_BLOCK_32}


# ------------------------------------------------------------------------------------ decoding
@builder
def kv_paged_formats(blocks: list, heads: int = 2, head_size: int = 8, block_size: int = 4, steps: int = 2,
                     seed: int = 31, same_payloads: bool = False):
    """An initial cache whose blocks are already encoded, one ``"key:value[@valid]"`` format pair per
    block (``@valid`` < block_size: the payload holds more physical slots than valid tokens). Each run
    appends one dense token; Y is attention over every block's decoded valid tokens. With
    ``same_payloads`` the retained cache must also keep the caller's block payloads (no unchanged block
    copied or converted)."""
    rng = np.random.default_rng(seed)
    tokens = Tokens(rng, heads, head_size)
    table, start = [], 0
    for spec in blocks:
        pair, _, valid = spec.partition("@")
        key_format, value_format = pair.split(":")
        valid = int(valid) if valid else block_size
        k = rng.standard_normal((block_size, heads, head_size)).astype(np.float32)
        v = rng.standard_normal((block_size, heads, head_size)).astype(np.float32)
        (key, k_decoded), (value, v_decoded) = encode(k, key_format), encode(v, value_format)
        table.append(block_literal(start, valid, key, value))
        tokens.extend(k_decoded[:valid].transpose(1, 0, 2)[None], v_decoded[:valid].transpose(1, 0, 2)[None])
        start += valid
    trace = [{"op": "open", "as": "init", "initial": {"cache": cache_literal(table, start)}}]
    for step in range(steps):
        q, k, v = tokens.draw()
        tokens.extend(k, v)
        trace.append(run_step(f"r{step}", q, k, v, tokens.attend(q)))
    if same_payloads:
        trace.append({"op": "values", "as": "end", "names": ["cache"]})
        trace.append({"op": "identity", "same": [[f"init|cache|blocks|{i}|{part}", f"end|cache|blocks|{i}|{part}"]
                                                 for i in range(len(blocks)) for part in ("key", "value")]})
    return {"model": paged_model(heads, head_size, block_size), "steps": trace}


# ---------------------------------------------------------------------------------- conversion
@builder
def kv_paged_convert(key_format: str, value_format: str, heads: int = 2, head_size: int = 8, block_size: int = 4,
                     steps: int = 9, seed: int = 41):
    """One token per call; each block that fills is converted to ``key_format``/``value_format``. Y is
    checked against attention over the blocks encoded here as docs/kv.md describes the formats, within
    twice the error those encodings cause against the float cache (so any encoding of the format at
    least as accurate passes); the sealed blocks must carry the requested layouts."""
    rng = np.random.default_rng(seed)
    floats = Tokens(rng, heads, head_size)
    runs, worst = [], 0.0
    for step in range(steps):
        q, k, v = floats.draw()
        floats.extend(k, v)
        quantized = _sealed(floats, block_size, key_format, value_format)
        y = quantized.attend(q)
        worst = max(worst, float(np.max(np.abs(y.astype(np.float64) - floats.attend(q)))))
        runs.append((f"r{step}", q, k, v, y))
    atol = 2 * worst + DECODED_ATOL
    trace = [{"op": "open", "initial": {"cache": EMPTY_CACHE}}]
    trace += [run_step(*run, atol=atol) for run in runs]
    trace.append({"op": "values", "as": "end", "names": ["cache"]})
    for index in range(steps // block_size):
        trace.append(layout_check(f"end|cache|blocks|{index}|key", key_format))
        trace.append(layout_check(f"end|cache|blocks|{index}|value", value_format))
    model = paged_model(heads, head_size, block_size, key_format, value_format)
    return {"model": model, "steps": trace, "atol": atol}


def _sealed(floats: Tokens, block_size: int, key_format: str, value_format: str) -> Tokens:
    """The decoded cache after sealing every full block (token by token, as the appends happen)."""
    k = np.concatenate(floats.keys, axis=1)  # [H, T, D]
    v = np.concatenate(floats.values, axis=1)
    out = floats.branch()
    out.keys, out.values = [], []
    for begin in range(0, k.shape[1], block_size):
        kb, vb = k[:, begin:begin + block_size], v[:, begin:begin + block_size]
        if kb.shape[1] == block_size:
            kb = encode(kb.transpose(1, 0, 2), key_format)[1].transpose(1, 0, 2)
            vb = encode(vb.transpose(1, 0, 2), value_format)[1].transpose(1, 0, 2)
        out.keys.append(kb)
        out.values.append(vb)
    return out


# ------------------------------------------------------------------------------ invalid inputs
#: fault -> block table as (start, valid, key slots, value slots, key heads), and the length field
#: (None: the sum of valid tokens)
_TABLES = {
    "gap": ([(0, 4, 4, 4, 2), (5, 4, 4, 4, 2)], None),
    "overlap": ([(0, 4, 4, 4, 2), (3, 4, 4, 4, 2)], None),
    "negative_start": ([(-1, 4, 4, 4, 2)], None),
    "zero_valid": ([(0, 4, 4, 4, 2), (4, 0, 4, 4, 2)], None),
    "valid_beyond_slots": ([(0, 5, 4, 4, 2)], None),
    "length_mismatch": ([(0, 4, 4, 4, 2), (4, 3, 4, 4, 2)], 8),
    "key_value_slots_differ": ([(0, 2, 4, 2, 2)], None),
    "wrong_heads": ([(0, 4, 4, 4, 3)], None),
    "slots_exceed_block_size": ([(0, 8, 8, 8, 2)], None),
    "dense_not_float": ([(0, 4, 4, 4, 2)], None),
    "affine_payload_short": ([(0, 4, 4, 4, 2)], None),
}
#: fault -> (key format, payload bytes cut from the end of the key block)
_SHORT = {"affine_payload_short": ("int8", 1)}


@builder
def kv_paged_invalid(fault: str, code: str, also: list | None = None, block_size: int = 4,
                     key_format: str = "dense", value_format: str = "dense", heads: int = 2, head_size: int = 4,
                     max_tokens: int | None = None, seed: int = 51):
    """A cache or attribute that violates the paged-cache contract (``fault`` "none": only the model's
    attributes are wrong). The runtime may reject it when the state is opened or at the first run (as
    STATE_RUN_FAILED naming ``code``); either way nothing is published: the initial cache stays."""
    rng = np.random.default_rng(seed)
    table, length = _TABLES.get(fault, ([], None))
    block_format, cut = _SHORT.get(fault, ("dense", 0))
    blocks = []
    for start, valid, key_slots, value_slots, key_heads in table:
        key, _ = encode(rng.standard_normal((key_slots, key_heads, head_size)).astype(np.float32), block_format)
        value, _ = encode(rng.standard_normal((value_slots, heads, head_size)).astype(np.float32), "dense")
        if cut:
            key.raw_data = key.raw_data[:len(key.raw_data) - cut]
        if fault == "dense_not_float":
            key = key.astype(np.float16)
        blocks.append(block_literal(start, valid, key, value))
    total = sum(row[1] for row in table) if length is None else length
    causes = [code, *(also or [])]
    q, k, v = (rng.standard_normal((1, heads, 1, head_size)).astype(np.float32) for _ in range(3))
    trace = [{"op": "open", "as": "init", "initial": {"cache": cache_literal(blocks, total)}, "error": code,
              "also": causes[1:], "optional": True},
             {"op": "run", "feeds": {"q": _literal(q), "k": _literal(k), "v": _literal(v)},
              "error": "STATE_RUN_FAILED", "also": ["EXECUTION_FAILED"], "cause": causes},
             {"op": "values", "as": "after", "names": ["cache"]}]
    if blocks:
        trace.append({"op": "identity", "same": [["init|cache|blocks|0|key", "after|cache|blocks|0|key"]]})
    model = paged_model(heads, head_size, block_size, key_format, value_format, max_tokens=max_tokens)
    return {"model": model, "steps": trace}


# -------------------------------------------------------------------- failure, cancellation, views
@builder
def kv_paged_atomic(scenario: str, heads: int = 2, head_size: int = 4, block_size: int = 4, seed: int = 61):
    """Three tokens, then a run that fails (``mismatch``: K and V carry different token counts) or is
    issued with its cancellation already requested (``cancel``), exactly where the block would fill. A
    failed run leaves the retained cache the previous one (same block payloads) and the next runs continue
    from it as if the bad call never happened. A cancelled run either ends with STATE_CANCELLED and leaves
    the cache as a failed run does, or completes (the spec does not say a cancellation requested before the
    run must win) with all its new values, and decoding continues from them."""
    rng = np.random.default_rng(seed)
    tokens = Tokens(rng, heads, head_size)
    trace = [{"op": "open", "initial": {"cache": EMPTY_CACHE}}]
    for step in range(3):
        q, k, v = tokens.draw()
        tokens.extend(k, v)
        trace.append(run_step(f"r{step}", q, k, v, tokens.attend(q)))
    q, k, v = tokens.draw()
    kept = [{"op": "values", "as": "after", "names": ["cache"]},
            {"op": "identity", "same": [["r2|next_cache|blocks|0|key", "after|cache|blocks|0|key"],
                                        ["r2|next_cache|blocks|0|value", "after|cache|blocks|0|value"]]}]
    if scenario == "cancel":
        completed = tokens.branch()
        completed.extend(k, v)
        trace.append(run_step("rc", q, k, v, completed.attend(q), cancel=True, error="STATE_CANCELLED", optional=True,
                              if_rejected=kept + _continue(tokens), if_accepted=_continue(completed)))
    else:
        v2 = np.concatenate([v, v], axis=2)
        trace.append({"op": "run", "feeds": {"q": _literal(q), "k": _literal(k), "v": _literal(v2)},
                      "error": "STATE_RUN_FAILED", "also": ["EXECUTION_FAILED"],
                      "cause": ["KV_SHAPE_MISMATCH", "ATTENTION_INPUT_INVALID"]})
        trace += kept + _continue(tokens)
    return {"model": paged_model(heads, head_size, block_size, free_tokens=True), "steps": trace}


def _continue(tokens: Tokens, calls: int = 3) -> list[dict]:
    """One-token calls decoding on from ``tokens``."""
    steps = []
    for index in range(calls):
        q, k, v = tokens.draw()
        tokens.extend(k, v)
        steps.append(run_step(f"r{3 + index}", q, k, v, tokens.attend(q)))
    return steps


@builder
def kv_paged_branches(heads: int = 2, head_size: int = 4, block_size: int = 4, seed: int = 71):
    """Three requests share one cache value: s1 decodes three tokens; s2 starts from s1's latest cache
    and appends A; s1 then appends B to the same value; s3 starts from that value again at the end.
    Each sees only its own tokens: an append never writes where a held or retained value can see
    (dense blocks keep their payload when sealed, so an in-place overwrite would show in s2's Y)."""
    rng = np.random.default_rng(seed)
    s1 = Tokens(rng, heads, head_size)
    trace = [{"op": "open", "state": "s1", "initial": {"cache": EMPTY_CACHE}}]
    for step in range(3):
        q, k, v = s1.draw()
        s1.extend(k, v)
        trace.append(run_step(f"r{step}", q, k, v, s1.attend(q), state="s1"))
    shared = s1.branch()
    s2 = shared.branch()
    trace.append({"op": "open", "state": "s2", "initial": {"cache": {"ref": "r2|next_cache"}}})
    for label, branch, state in (("b0", s2, "s2"), ("r3", s1, "s1"), ("b1", s2, "s2"), ("r4", s1, "s1")):
        q, k, v = branch.draw()
        branch.extend(k, v)
        trace.append(run_step(label, q, k, v, branch.attend(q), state=state))
    s3 = shared.branch()
    trace.append({"op": "open", "state": "s3", "initial": {"cache": {"ref": "r2|next_cache"}}})
    q, k, v = s3.draw()
    s3.extend(k, v)
    trace.append(run_step("c0", q, k, v, s3.attend(q), state="s3"))
    return {"model": paged_model(heads, head_size, block_size), "steps": trace}


# ---------------------------------------------------------------------- bounded workspace, bytes written
def _bulk_block(start: int, tokens: int, heads: int, head_size: int, fmt: str, rng) -> dict:
    """A block literal that stays small however long the cache: ``dense`` K and V as ramps, ``int4`` as
    affine INT4 blocks (one scale per token and head) whose code bytes are printable, so the text form of
    the payload is no longer than the payload."""
    shape = (tokens, heads, head_size)
    if fmt == "dense":
        return {"struct": {"start": _int64(start), "valid_length": _int64(tokens),
                           "key": _ramp(shape, start / 4096), "value": _ramp(shape, -start / 4096)},
                "type_id": KV_BLOCK}
    parts = {}
    for name in ("key", "value"):
        value = schema.EncodedValueProto()
        add_float_logical(value, shape)
        layout = value.affine
        layout.storage_type = AFFINE["int4"][0]
        layout.scale.CopyFrom(float_tensor(rng.uniform(0.01, 0.1, (tokens, heads, 1)).astype(np.float32)))
        layout.axis = 2
        layout.block_size = head_size
        value.raw_data = rng.integers(0x41, 0x5B, tokens * heads * head_size // 2).astype(np.uint8).tobytes()
        parts[name] = _encoded(value)
    return {"struct": {"start": _int64(start), "valid_length": _int64(tokens), **parts}, "type_id": KV_BLOCK}


def _ramp(shape: tuple[int, ...], offset: float) -> dict:
    """A compact tensor literal: float32 values along a ramp in about [-1, 1)."""
    count = int(np.prod(shape))
    return {"dtype": "float32", "shape": list(shape), "range": [offset - 1.0, 2.0 / count]}


@builder
def kv_paged_bounded(fmt: str = "dense", heads: int = 2, head_size: int = 64, block_size: int = 64,
                     short: int = 2048, seed: int = 131, bound: str = "quarter"):
    """Initial caches of ``fmt`` blocks, each decoded one token by a fresh state, bounded by the runtime's
    ``attention_peak_workspace_bytes``.

    ``whole``: one cache of ``4 * short`` tokens; the workspace stays below the dequantized bytes of all its
    keys. Holding every token's dequantized (or copied) keys at once is a dequantization (copy) of the
    whole key cache, which "no full-cache copy or dequantization" rules out, whatever else a kernel does;
    a blockwise kernel holding K and V of any tile shorter than half the cache passes.
    ``quarter``: caches of ``short`` tokens and twice that; the long decode's workspace exceeds the short
    one's by at most a quarter of the extra tokens' dequantized bytes and stays under a quarter of the
    whole dequantized long cache. That assumes the kernel's tile is well below ``short`` tokens: a
    blockwise kernel with longer tiles is still bounded, so these bounds are the suite's figures.
    A runtime that dequantizes or copies the whole cache for attention fails all of them."""
    rng = np.random.default_rng(seed)
    per_token = heads * head_size * 4 * 2  # dequantized K and V bytes per token
    contexts = (("at_long", 4 * short),) if bound == "whole" else (("at_short", short), ("at_long", 2 * short))
    longest = contexts[-1][1]
    blocks = [_bulk_block(start, block_size, heads, head_size, fmt, rng) for start in range(0, longest, block_size)]
    trace = []
    for name, count in contexts:
        q, k, v = (rng.standard_normal((1, heads, 1, head_size)).astype(np.float32) for _ in range(3))
        cache = cache_literal(blocks[:count // block_size], count)
        trace += [{"op": "open", "state": name, "initial": {"cache": cache}},
                  {"op": "run", "state": name, "feeds": {"q": _literal(q), "k": _literal(k), "v": _literal(v)}},
                  {"op": "counters", "state": name, "as": name}]
    if bound == "whole":
        trace[-1]["at_most"] = {"attention_peak_workspace_bytes": longest * per_token // 2 - 1}
    else:
        trace[-1].update(since="at_short", at_most={"attention_peak_workspace_bytes": short * per_token // 4})
        trace.append({"op": "counters", "state": "at_long",
                      "at_most": {"attention_peak_workspace_bytes": 2 * short * per_token // 4}})
    model = paged_model(heads, head_size, block_size, max_tokens=1 << 20)
    return {"model": model, "steps": trace}


@builder
def kv_paged_written(heads: int = 2, q_heads: int = 4, head_size: int = 8, block_size: int = 4, steps: int = 9,
                     prefill: int = 3, seed: int = 141, bound: str = "exact"):
    """Dense blocks: a prefill, then one-token calls (crossing block boundaries) bounded by the runtime's
    ``kv_bytes_written``. The runs are unlabelled: the caller keeps no output, so only the state refers to
    the cache and ownership permits writing into its open block. ``exact``: each call grows the counter
    by exactly its token's K and V bytes (no block copied or rewritten). ``block``: by at most one whole
    block's K and V bytes per call, which a blockwise append that rewrites its open block stays within
    and a copy of the whole cache exceeds. Y is checked against the attention formula throughout."""
    from .kv_attention import attention_formula

    rng = np.random.default_rng(seed)
    keys = values = np.zeros((1, heads, 0, head_size), np.float32)
    trace = [{"op": "open", "initial": {"cache": EMPTY_CACHE}}]
    for index, count in enumerate([prefill] + [1] * steps):
        q = rng.standard_normal((1, q_heads, count, head_size)).astype(np.float32)
        k, v = (rng.standard_normal((1, heads, count, head_size)).astype(np.float32) for _ in range(2))
        past = keys.shape[2]
        keys, values = np.concatenate([keys, k], 2), np.concatenate([values, v], 2)
        y = attention_formula(q, keys, values, past, causal=True).astype(np.float32)
        trace.append(run_step(None, q, k, v, y))
        if index == 0:
            trace.append({"op": "counters", "as": "c0"})
    token = 2 * heads * head_size * 4
    check = {"equals": {"kv_bytes_written": steps * token}} if bound == "exact" else \
        {"at_most": {"kv_bytes_written": steps * block_size * token}}
    trace.append({"op": "counters", "since": "c0", **check})
    model = paged_model(heads, head_size, block_size, q_heads=q_heads, tokens="s", is_causal=1)
    return {"model": model, "steps": trace}


@builder
def kv_paged_max_tokens(max_tokens: int = 6, heads: int = 2, head_size: int = 4, block_size: int = 4,
                        seed: int = 151):
    """``max_tokens`` bounds past plus new tokens: five one-token calls, then a two-token call that would
    hold seven fails whole (KV_CAPACITY_EXCEEDED) and the cache stays the previous one, then a one-token
    call reaches exactly ``max_tokens``, and one more fails again."""
    from .kv_attention import attention_formula

    rng = np.random.default_rng(seed)
    keys = values = np.zeros((1, heads, 0, head_size), np.float32)
    trace = [{"op": "open", "initial": {"cache": EMPTY_CACHE}}]

    def call(label, count, expect_ok=True):
        nonlocal keys, values
        q, k, v = (rng.standard_normal((1, heads, count, head_size)).astype(np.float32) for _ in range(3))
        if not expect_ok:
            return {"op": "run", "feeds": {"q": _literal(q), "k": _literal(k), "v": _literal(v)},
                    "error": "STATE_RUN_FAILED", "also": ["EXECUTION_FAILED"], "cause": ["KV_CAPACITY_EXCEEDED"]}
        past = keys.shape[2]
        keys, values = np.concatenate([keys, k], 2), np.concatenate([values, v], 2)
        return run_step(label, q, k, v, attention_formula(q, keys, values, past, causal=True).astype(np.float32))

    trace += [call(f"r{index}", 1) for index in range(max_tokens - 1)]
    trace.append(call(None, 2, expect_ok=False))
    trace.append({"op": "values", "as": "after", "names": ["cache"]})
    trace.append({"op": "identity", "same": [[f"r{max_tokens - 2}|next_cache|blocks|1|key",
                                              "after|cache|blocks|1|key"]]})
    trace.append(call("full", 1))
    trace.append(call(None, 1, expect_ok=False))
    model = paged_model(heads, head_size, block_size, tokens="s", is_causal=1, max_tokens=max_tokens)
    return {"model": model, "steps": trace}

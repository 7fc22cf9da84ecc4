"""KV-cache traces for the paths the happy decode traces do not reach: batch rows beyond the first (an
external cache whose rows hold different numbers of tokens, per-row masks over a bound past), masks of
rank 2, 3-D inputs with packed heads, paged caches whose first block starts beyond position 0, and
symmetric per-head block scales under grouped-query heads.

Every expected Y comes from ``attention_expected``, ONNX Attention written here in float64 NumPy: scores
= Q K^T * scale (default 1/sqrt(head_size); query head h reads key/value head h // (q_heads / kv_heads)),
plus the additive bias (the mask, -inf where a boolean mask is False, -inf beyond the causal frontier
aligned bottom-right, -inf on padding slots), softmax over the keys, times V. Presents are Concat(past,
new); scattered caches are the cache with the update written at each row's own write index.
"""

from __future__ import annotations

import numpy as np

from . import builder
from .kv import _literal, _tensor_vi, add_attributes, external_cache_model, paged_model, refusal_allowed
from .kv_formats import AFFINE, _tensor, encode, pack
from .kv_paged import DECODED_ATOL, block_literal, cache_literal


def attention_expected(q, k, v, bias=None, scale: float | None = None) -> np.ndarray:
    """Y (B, Hq, S, Dv) in float64 for q (B, Hq, S, D) over k, v (B, Hkv, T, D); ``bias`` is additive and
    broadcasts to (B, Hq, S, T)."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    group = q.shape[1] // k.shape[1]
    k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)  # query head h -> key/value head h // group
    scale = 1.0 / np.sqrt(q.shape[-1]) if scale is None else scale
    scores = q @ np.swapaxes(k, -1, -2) * scale
    if bias is not None:
        scores = scores + bias
    weights = np.exp(scores - scores.max(axis=-1, keepdims=True))
    return (weights / weights.sum(axis=-1, keepdims=True)) @ v


def causal_bias(queries: int, total: int, ends) -> np.ndarray:
    """-inf where key j lies beyond query i's frontier ``end - queries + i`` (``ends``: one per batch row)."""
    ends = np.asarray(ends, np.int64).reshape(-1, 1, 1, 1)
    frontier = ends - queries + np.arange(queries)[:, None]
    return np.where(np.arange(total)[None, :] <= frontier, 0.0, -np.inf)


def _mask(rng, kind: str, shape: tuple, own: np.ndarray) -> np.ndarray:
    """A random bool or float mask of ``shape`` (..., S, T) where each query's own key (``own[i]``) is
    attendable, so no row is fully masked; float masks mix -inf with finite values."""
    queries = shape[-2]
    if kind == "bool":
        mask = rng.random(shape) < 0.55
        mask[..., np.arange(queries), own] = True
        return mask
    mask = rng.choice(np.array([-np.inf, -1.5, 0.0, 0.7, 2.0], np.float32), shape)
    mask[..., np.arange(queries), own] = 0.0
    return mask


def _bias_of(mask: np.ndarray) -> np.ndarray:
    return np.where(mask, 0.0, -np.inf) if mask.dtype == bool else mask.astype(np.float64)


def _attention_refusable(steps: list) -> list:
    """An Attention model whose attribute a runtime may refuse as invalid (such as an explicit scale of 0,
    which the operator's text neither allows nor forbids): if it runs the model, every call must give the
    expected outputs."""
    return refusal_allowed(steps, "ATTENTION_INPUT_INVALID", ("OPERATOR_UNSUPPORTED",))


def _run(label: str, feeds: dict, outputs: dict, atol: float = 1e-5) -> dict:
    return {"op": "run", "as": label, "feeds": {name: _literal(value) for name, value in feeds.items()},
            "outputs": {name: _literal(value) for name, value in outputs.items()}, "atol": atol, "rtol": 1e-5}


# ------------------------------------------------------------------------------ batch of external caches
@builder
def kv_more_batch_external(causal: int, q_heads: int = 2, lead: tuple = (0, 2), plan: tuple = (3, 2, 1),
                           heads: int = 2, head_size: int = 4, capacity: int = 8, seed: int = 57):
    """A bound external cache of two batch rows (ONNX Attention's external-cache use): row b already holds
    ``lead[b]`` tokens, TensorScatter writes each call's tokens at each row's own write index and Attention
    reads the whole cache with each row's own ``nonpad_kv_seqlen``."""
    batch = len(lead)
    m = external_cache_model("kv_more_batch_external", causal, batch, heads, q_heads, head_size, capacity)

    rng = np.random.default_rng(seed)
    keys = np.zeros((batch, heads, capacity, head_size), np.float32)
    values = keys.copy()
    for row, count in enumerate(lead):
        keys[row, :, :count] = rng.standard_normal((heads, count, head_size))
        values[row, :, :count] = rng.standard_normal((heads, count, head_size))
    trace = [{"op": "open", "initial": {"cache_key": _literal(keys), "cache_value": _literal(values)}}]
    filled = np.array(lead, np.int64)
    for index, count in enumerate(plan):
        q = rng.standard_normal((batch, q_heads, count, head_size)).astype(np.float32)
        k, v = (rng.standard_normal((batch, heads, count, head_size)).astype(np.float32) for _ in range(2))
        keys, values = keys.copy(), values.copy()
        for row in range(batch):
            keys[row, :, filled[row]:filled[row] + count] = k[row]
            values[row, :, filled[row]:filled[row] + count] = v[row]
        nonpad = filled + count
        bias = np.where(np.arange(capacity)[None, :] < nonpad[:, None], 0.0, -np.inf)[:, None, None, :]
        if causal:
            bias = bias + causal_bias(count, capacity, nonpad)
        y = attention_expected(q, keys, values, bias).astype(np.float32)
        feeds = {"q": q, "k": k, "v": v, "write_indices": filled.copy(), "nonpad": nonpad}
        trace.append(_run(f"r{index}", feeds, {"y": y, "next_key": keys, "next_value": values}))
        filled = nonpad
    return {"model": m, "steps": trace}


# ------------------------------------------------------------------------------ masks over a bound past
@builder
def kv_more_masked_past(mask: str, batch: int = 2, mask_rank: int = 4, q_heads: int = 2, heads: int = 2,
                        head_size: int = 8, plan: tuple = (3, 2, 1), causal: int = 0, seed: int = 61,
                        scale: float | None = None, refusable: bool = False):
    """Attention(q, k, v, attn_mask, past_key, past_value) with ``past_* <- present_*`` and ``batch`` rows.
    The mask covers every key so far (past and new, so it broadcasts in Attention-23 too): rank 4,
    (batch, q_heads, S, T) with a different mask per row and head; rank 3, (q_heads, S, T) broadcast over
    the batch, a different mask per head; or rank 2, (S, T) broadcast over the batch and heads, with a
    different mask per query. ``scale``: the Attention attribute (None: left out, 1/sqrt(head_size));
    ``refusable``: a runtime may refuse the model instead (see ``_attention_refusable``)."""
    from .common import model as new_model

    m = new_model("kv_more_masked_past", opset=23)
    g = m.graph
    node = g.node.add(op_type="Attention", input=["q", "k", "v", "attn_mask", "past_key", "past_value"],
                      output=["y", "present_key", "present_value"])
    add_attributes(node, {"is_causal": causal, "scale": None if scale is None else float(scale)})
    _tensor_vi(g, "q", [batch, q_heads, "s", head_size])
    for name in ("k", "v"):
        _tensor_vi(g, name, [batch, heads, "s", head_size])
    mask_dims = {4: [batch, q_heads, "s", "t"], 3: [q_heads, "s", "t"], 2: ["s", "t"]}[mask_rank]
    _tensor_vi(g, "attn_mask", mask_dims, elem=9 if mask == "bool" else 1)
    for name in ("past_key", "past_value"):
        _tensor_vi(g, name, [batch, heads, "p", head_size])
    _tensor_vi(g, "y", [batch, q_heads, "s", head_size], output=True)
    for name in ("present_key", "present_value"):
        _tensor_vi(g, name, [batch, heads, "t", head_size], output=True)
    g.persistent_bindings.add(input_name="past_key", output_name="present_key")
    g.persistent_bindings.add(input_name="past_value", output_name="present_value")

    rng = np.random.default_rng(seed)
    keys = np.zeros((batch, heads, 0, head_size), np.float32)
    values = keys
    trace = [{"op": "open", "initial": {"past_key": _literal(keys), "past_value": _literal(values)}}]
    for index, count in enumerate(plan):
        past = keys.shape[2]
        total = past + count
        q = rng.standard_normal((batch, q_heads, count, head_size)).astype(np.float32)
        k, v = (rng.standard_normal((batch, heads, count, head_size)).astype(np.float32) for _ in range(2))
        keys, values = np.concatenate([keys, k], 2), np.concatenate([values, v], 2)
        shape = {4: (batch, q_heads, count, total), 3: (q_heads, count, total), 2: (count, total)}[mask_rank]
        attn_mask = _mask(rng, mask, shape, past + np.arange(count))
        bias = _bias_of(attn_mask)
        if causal:
            bias = bias + causal_bias(count, total, [total])
        y = attention_expected(q, keys, values, bias, scale).astype(np.float32)
        feeds = {"q": q, "k": k, "v": v, "attn_mask": attn_mask}
        trace.append(_run(f"r{index}", feeds, {"y": y, "present_key": keys, "present_value": values}))
    return {"model": m, "steps": _attention_refusable(trace) if refusable else trace}


# ------------------------------------------------------------------------------ 3-D inputs
@builder
def kv_more_packed_heads(q_heads: int, heads: int, head_size: int = 4, plan: tuple = (3, 2, 1), causal: int = 1,
                         seed: int = 67, scale: float | None = None, refusable: bool = False):
    """Attention over 3-D inputs: Q (1, S, q_heads * head_size), K and V (1, S, heads * head_size) with
    q_num_heads/kv_num_heads; the bound past and present are 4-D (1, heads, T, head_size) and Y is 3-D
    (1, S, q_heads * head_size). Head h of a token is its h-th run of head_size values. ``scale``: the
    Attention attribute (None: left out, 1/sqrt(head_size)); ``refusable``: a runtime may refuse the model
    instead (see ``_attention_refusable``)."""
    from .common import model as new_model

    m = new_model("kv_more_packed_heads", opset=23)
    g = m.graph
    node = g.node.add(op_type="Attention", input=["q", "k", "v", "", "past_key", "past_value"],
                      output=["y", "present_key", "present_value"])
    add_attributes(node, {"is_causal": causal, "q_num_heads": q_heads, "kv_num_heads": heads,
                          "scale": None if scale is None else float(scale)})
    _tensor_vi(g, "q", [1, "s", q_heads * head_size])
    for name in ("k", "v"):
        _tensor_vi(g, name, [1, "s", heads * head_size])
    for name in ("past_key", "past_value"):
        _tensor_vi(g, name, [1, heads, "p", head_size])
    _tensor_vi(g, "y", [1, "s", q_heads * head_size], output=True)
    for name in ("present_key", "present_value"):
        _tensor_vi(g, name, [1, heads, "t", head_size], output=True)
    g.persistent_bindings.add(input_name="past_key", output_name="present_key")
    g.persistent_bindings.add(input_name="past_value", output_name="present_value")

    def heads_of(x, count):  # (1, S, H * D) -> (1, H, S, D)
        return x.reshape(1, x.shape[1], count, head_size).transpose(0, 2, 1, 3)

    rng = np.random.default_rng(seed)
    keys = np.zeros((1, heads, 0, head_size), np.float32)
    values = keys
    trace = [{"op": "open", "initial": {"past_key": _literal(keys), "past_value": _literal(values)}}]
    for index, count in enumerate(plan):
        q = rng.standard_normal((1, count, q_heads * head_size)).astype(np.float32)
        k, v = (rng.standard_normal((1, count, heads * head_size)).astype(np.float32) for _ in range(2))
        keys = np.concatenate([keys, heads_of(k, heads)], 2)
        values = np.concatenate([values, heads_of(v, heads)], 2)
        total = keys.shape[2]
        bias = causal_bias(count, total, [total]) if causal else None
        y4 = attention_expected(heads_of(q, q_heads), keys, values, bias, scale)
        y = y4.transpose(0, 2, 1, 3).reshape(1, count, q_heads * head_size).astype(np.float32)
        trace.append(_run(f"r{index}", {"q": q, "k": k, "v": v},
                          {"y": y, "present_key": keys, "present_value": values}))
    return {"model": m, "steps": _attention_refusable(trace) if refusable else trace}


# ------------------------------------------------------------------------------ paged caches
def encode_along(x: np.ndarray, fmt: str):
    """(block value, decoded float32 values) of a FLOAT[tokens, heads, size] block in the built-in affine
    branch with per-axis parameters: ``fmt`` is ``"<type>@<axis>"`` (one scale, and for unsigned types one
    zero point, per index of that axis, covering the values there) or ``"<type>@tensor"`` (one of each).
    Codes are QuantizeLinear's (round half to even, saturate); values decode as (code - zp) * scale."""
    from reference_impl import schema

    from .common import add_float_logical

    name, _, where = fmt.partition("@")
    data_type, width, low, high = AFFINE[name]
    axis = None if where == "tensor" else int(where)
    others = tuple(i for i in range(3) if i != axis)
    keep = (lambda a: a.reshape(-1)) if axis is not None else (lambda a: a.reshape(()))
    if low < 0:
        amax = np.max(np.abs(x), axis=others, keepdims=True)
        scale = np.where(amax > 0, amax / np.float32(high), np.float32(1)).astype(np.float32)
        zero = np.zeros_like(scale, np.int64)
    else:
        lo = np.minimum(np.min(x, axis=others, keepdims=True), np.float32(0))
        hi = np.maximum(np.max(x, axis=others, keepdims=True), np.float32(0))
        scale = np.where(hi > lo, (hi - lo) / np.float32(high - low), np.float32(1)).astype(np.float32)
        zero = np.clip(np.rint(low - lo / scale), low, high).astype(np.int64)
    codes = np.clip(np.rint(x / scale).astype(np.int64) + zero, low, high)
    value = schema.EncodedValueProto()
    add_float_logical(value, x.shape)
    value.affine.storage_type = data_type
    value.affine.scale.CopyFrom(_tensor(keep(scale), 1))
    if low >= 0:
        value.affine.zero_point.CopyFrom(_tensor(keep(zero), data_type, width))
    if axis is not None:
        value.affine.axis = axis
    value.raw_data = pack(codes, width)
    return value, ((codes - zero).astype(np.float32) * scale).astype(np.float32)


@builder
def kv_more_paged(blocks: list, first_start: int = 0, q_heads: int = 2, heads: int = 2, head_size: int = 8,
                  block_size: int = 4, plan: tuple = (1, 1), mask: str | None = None, head_gain: tuple = (1.0, 1.0),
                  seed: int = 71, valid: tuple | None = None, max_tokens: int | None = None):
    """An initial paged cache of pre-encoded blocks (``"key:value"`` format pairs: kv_formats', or
    ``encode_along``'s ``"<type>@<axis>"`` / ``"<type>@tensor"``) whose first
    block starts at position ``first_start``; each call appends ``plan[i]`` dense tokens through the
    paged_attention role (is_causal by default: query i sees the keys up to the cache's last S tokens' i-th),
    optionally with an ``attn_mask`` over the cache's tokens in order. KV head h's data is scaled by
    ``head_gain[h]``, so per-head block scales differ. ``valid`` gives each block's valid tokens (default:
    all its slots; fewer: a partial block whose payload holds unused slots), ``max_tokens`` the role's
    attribute. Y is attention over every block's decoded valid tokens."""
    mask = mask or None  # a case row without a mask passes ""
    rng = np.random.default_rng(seed)
    gain = np.asarray(head_gain, np.float32).reshape(1, heads, 1)
    table, start = [], first_start
    keys, values = [], []  # decoded, each (H, n, D)
    valid = [block_size] * len(blocks) if valid is None else list(valid)
    for pair, used in zip(blocks, valid, strict=True):
        key_format, value_format = pair.split(":")
        k = (rng.standard_normal((block_size, heads, head_size)) * gain).astype(np.float32)
        v = (rng.standard_normal((block_size, heads, head_size)) * gain).astype(np.float32)
        (key, k_decoded), (value, v_decoded) = (encode_along(x, fmt) if "@" in fmt else encode(x, fmt)
                                                for x, fmt in ((k, key_format), (v, value_format)))
        table.append(block_literal(start, used, key, value))
        keys.append(k_decoded[:used].transpose(1, 0, 2))
        values.append(v_decoded[:used].transpose(1, 0, 2))
        start += used
    trace = [{"op": "open", "initial": {"cache": cache_literal(table, start - first_start)}}]
    for index, count in enumerate(plan):
        q = rng.standard_normal((1, q_heads, count, head_size)).astype(np.float32)
        k = (rng.standard_normal((1, heads, count, head_size)) * gain[:, :, :, None]).astype(np.float32)
        v = (rng.standard_normal((1, heads, count, head_size)) * gain[:, :, :, None]).astype(np.float32)
        keys.append(k[0])
        values.append(v[0])
        all_keys, all_values = np.concatenate(keys, 1)[None], np.concatenate(values, 1)[None]
        total = all_keys.shape[2]
        bias = causal_bias(count, total, [total])
        feeds = {"q": q, "k": k, "v": v}
        if mask:
            feeds["attn_mask"] = _mask(rng, mask, (1, q_heads, count, total), total - count + np.arange(count))
            bias = bias + _bias_of(feeds["attn_mask"])
        y = attention_expected(q, all_keys, all_values, bias).astype(np.float32)
        trace.append(_run(f"r{index}", feeds, {"y": y}, atol=DECODED_ATOL * float(np.max(head_gain))))
    tokens = "s" if max(plan) > 1 else 1
    attrs = {} if max_tokens is None else {"max_tokens": max_tokens}
    return {"model": paged_model(heads, head_size, block_size, q_heads=q_heads, tokens=tokens, mask=mask, **attrs),
            "steps": trace}


# ------------------------------------------------------------------------------ scattered caches, any layout
@builder
def kv_more_scattered_cache(causal: int, q_heads: int = 2, token_major: bool = True, mode: str = "linear",
                            plan: tuple = (3, 2, 1), heads: int = 2, head_size: int = 4, capacity: int = 8,
                            seed: int = 73):
    """A bound external cache written by TensorScatter and read by Attention with ``nonpad_kv_seqlen``.
    ``token_major``: the caches are (1, capacity, heads, head_size), scattered along axis 1 and reshaped to
    3-D (1, capacity, heads * head_size) for Attention (3-D Q and Y, q_num_heads/kv_num_heads); otherwise
    head-major (1, heads, capacity, head_size) along the default axis -2. ``mode`` "circular" wraps the
    writes modulo the capacity (write index = tokens so far modulo capacity, nonpad = min(tokens so far,
    capacity)); with it the queries attend over the ring's slots, so ``causal`` must be 0."""
    from .common import model as new_model

    m = new_model("kv_more_scattered_cache", opset=24)
    g = m.graph
    scatter = {"mode": mode if mode != "linear" else None, "axis": 1 if token_major else None}
    for name in ("key", "value"):
        node = g.node.add(op_type="TensorScatter", input=[f"cache_{name}", name[0], "write_indices"],
                          output=[f"next_{name}"])
        add_attributes(node, scatter)
    attention_inputs = ["q", "next_key", "next_value"]
    if token_major:
        shape = g.initializer.add(name="flat_shape", data_type=7, dims=[3])
        shape.int64_data.extend([1, capacity, heads * head_size])
        for name in ("key", "value"):
            g.node.add(op_type="Reshape", input=[f"next_{name}", "flat_shape"], output=[f"flat_{name}"])
        attention_inputs = ["q", "flat_key", "flat_value"]
    node = g.node.add(op_type="Attention", input=[*attention_inputs, "", "", "", "nonpad"], output=["y"])
    add_attributes(node, {"is_causal": causal, **({"q_num_heads": q_heads, "kv_num_heads": heads}
                                                  if token_major else {})})
    cache_dims = [1, capacity, heads, head_size] if token_major else [1, heads, capacity, head_size]
    if token_major:
        _tensor_vi(g, "q", [1, "s", q_heads * head_size])
        for name in ("k", "v"):
            _tensor_vi(g, name, [1, "s", heads, head_size])
    else:
        _tensor_vi(g, "q", [1, q_heads, "s", head_size])
        for name in ("k", "v"):
            _tensor_vi(g, name, [1, heads, "s", head_size])
    for name in ("cache_key", "cache_value"):
        _tensor_vi(g, name, cache_dims)
    _tensor_vi(g, "write_indices", [1], elem=7)
    _tensor_vi(g, "nonpad", [1], elem=7)
    _tensor_vi(g, "y", [1, "s", q_heads * head_size] if token_major else [1, q_heads, "s", head_size], output=True)
    for name in ("next_key", "next_value"):
        _tensor_vi(g, name, cache_dims, output=True)
    g.persistent_bindings.add(input_name="cache_key", output_name="next_key")
    g.persistent_bindings.add(input_name="cache_value", output_name="next_value")

    rng = np.random.default_rng(seed)
    keys = np.zeros((1, heads, capacity, head_size), np.float32)  # head-major here, whatever the layout
    values = keys.copy()

    def stored(x):  # head-major (1, H, T, D) -> the case's layout
        return x.transpose(0, 2, 1, 3) if token_major else x

    trace = [{"op": "open", "initial": {"cache_key": _literal(stored(keys)), "cache_value": _literal(stored(values))}}]
    filled = 0
    for index, count in enumerate(plan):
        q = rng.standard_normal((1, q_heads, count, head_size)).astype(np.float32)
        k, v = (rng.standard_normal((1, heads, count, head_size)).astype(np.float32) for _ in range(2))
        slots = (filled + np.arange(count)) % capacity if mode == "circular" else filled + np.arange(count)
        keys, values = keys.copy(), values.copy()
        keys[:, :, slots], values[:, :, slots] = k, v
        nonpad = min(filled + count, capacity)
        bias = np.where(np.arange(capacity) < nonpad, 0.0, -np.inf)[None, None, None, :]
        if causal:
            bias = bias + causal_bias(count, capacity, [nonpad])
        y = attention_expected(q, keys, values, bias).astype(np.float32)
        feeds = {"q": q, "k": stored(k), "v": stored(v),
                 "write_indices": np.array([filled % capacity if mode == "circular" else filled], np.int64),
                 "nonpad": np.array([nonpad], np.int64)}
        if token_major:
            feeds["q"] = q.transpose(0, 2, 1, 3).reshape(1, count, q_heads * head_size)
            y = y.transpose(0, 2, 1, 3).reshape(1, count, q_heads * head_size)
        trace.append(_run(f"r{index}", feeds, {"y": y, "next_key": stored(keys), "next_value": stored(values)}))
        filled += count
    return {"model": m, "steps": trace}


# ------------------------------------------------------------------------------ qk_matmul_output, grouped heads
@builder
def kv_more_qk_grouped(mode: int, q_heads: int = 4, heads: int = 2, head_size: int = 4, causal: int = 0,
                       plan: tuple = (3, 2, 1), seed: int = 79):
    """Attention over a bound past with grouped-query heads and its fourth output qk_matmul_output in
    ``mode`` 0 (Q K^T times the scale) or 3 (the softmax weights), one row per query head: (1, q_heads, S,
    T). No mask and no softcap, so the modes' intermediate steps are not at stake."""
    from .kv import attention_model

    m = attention_model(heads, head_size, name="kv_more_qk_grouped", q_heads=q_heads, is_causal=causal,
                        qk_matmul_output_mode=mode)
    m.graph.node[0].output.append("qk")
    _tensor_vi(m.graph, "qk", [1, q_heads, "s", "t2"], output=True)
    rng = np.random.default_rng(seed + mode)
    keys = values = np.zeros((1, heads, 0, head_size), np.float32)
    trace = [{"op": "open", "initial": {"past_key": _literal(keys), "past_value": _literal(values)}}]
    group = q_heads // heads
    for index, count in enumerate(plan):
        q = (rng.standard_normal((1, q_heads, count, head_size)) * 2).astype(np.float32)
        k, v = (rng.standard_normal((1, heads, count, head_size)).astype(np.float32) for _ in range(2))
        keys, values = np.concatenate([keys, k], 2), np.concatenate([values, v], 2)
        total = keys.shape[2]
        bias = causal_bias(count, total, [total]) if causal else None
        y = attention_expected(q, keys, values, bias).astype(np.float32)
        scores = q.astype(np.float64) @ np.swapaxes(np.repeat(keys, group, axis=1), -1, -2) / np.sqrt(head_size)
        if mode == 3:
            biased = scores if bias is None else scores + bias
            weights = np.exp(biased - biased.max(axis=-1, keepdims=True))
            scores = weights / weights.sum(axis=-1, keepdims=True)
        trace.append(_run(f"r{index}", {"q": q, "k": k, "v": v},
                          {"y": y, "present_key": keys, "present_value": values, "qk": scores.astype(np.float32)}))
    return {"model": m, "steps": trace}

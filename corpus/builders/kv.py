"""KV-cache builders: decode traces whose expected outputs come from the attention formula in NumPy,
softmax(Q K^T / sqrt(head_size)) V over the concatenated cache, with present = Concat(past, new)."""

from __future__ import annotations

import numpy as np

from . import builder


def _tensor_vi(g, name, dims, elem=1, output=False):
    vi = (g.output if output else g.input).add(name=name)
    vi.type.tensor_type.elem_type = elem
    for d in dims:
        dim = vi.type.tensor_type.shape.dim.add()
        if isinstance(d, str):
            dim.dim_param = d
        else:
            dim.dim_value = d
    return vi


def _literal(array: np.ndarray) -> dict:
    return {"dtype": str(array.dtype), "shape": list(array.shape), "data": array.reshape(-1).tolist()}


def refusal_allowed(steps: list, error: str, also: tuple = ()) -> list:
    """``steps`` (an open, then runs) for a model a runtime may refuse, when the state opens or at its first
    run, with ``error`` (or a code of ``also``): a runtime that accepts it must give every expected output."""
    opened, first, *rest = steps
    codes = [error, *also]
    return [{**opened, "optional": True, "error": error, "also": list(also)},
            {**first, "optional": True, "error": "STATE_RUN_FAILED", "also": ["EXECUTION_FAILED"], "cause": codes,
             "if_accepted": rest}]


def attention_numpy(q, k, v):
    scores = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    scores = scores - scores.max(axis=-1, keepdims=True)
    weights = np.exp(scores)
    weights /= weights.sum(axis=-1, keepdims=True)
    return weights @ v


def add_attributes(node, attrs: dict) -> None:
    """INT, FLOAT and STRING attributes from Python values (None: left out, the operator's default)."""
    for name, value in attrs.items():
        if value is None:
            continue
        if isinstance(value, str):
            node.attribute.add(name=name, type=3, s=value.encode())
        elif isinstance(value, float):
            node.attribute.add(name=name, type=1, f=value)
        else:
            node.attribute.add(name=name, type=2, i=int(value))


def external_cache_model(graph_name: str, causal: int, batch: int, heads: int, q_heads: int, head_size: int,
                         capacity: int):
    """ONNX Attention's external-cache use: bound caches cache_key/cache_value (batch, heads, capacity,
    head_size), TensorScatter writing each call's k/v at ``write_indices`` (one per batch row), and Attention
    reading the whole cache with ``nonpad_kv_seqlen`` (opset 24)."""
    from .common import model as new_model

    m = new_model(graph_name, opset=24)
    g = m.graph
    g.node.add(op_type="TensorScatter", input=["cache_key", "k", "write_indices"], output=["next_key"])
    g.node.add(op_type="TensorScatter", input=["cache_value", "v", "write_indices"], output=["next_value"])
    node = g.node.add(op_type="Attention", input=["q", "next_key", "next_value", "", "", "", "nonpad"],
                      output=["y"])
    add_attributes(node, {"is_causal": causal})
    _tensor_vi(g, "q", [batch, q_heads, "s", head_size])
    for name in ("k", "v"):
        _tensor_vi(g, name, [batch, heads, "s", head_size])
    for name in ("cache_key", "cache_value"):
        _tensor_vi(g, name, [batch, heads, capacity, head_size])
    _tensor_vi(g, "write_indices", [batch], elem=7)
    _tensor_vi(g, "nonpad", [batch], elem=7)
    _tensor_vi(g, "y", [batch, q_heads, "s", head_size], output=True)
    for name in ("next_key", "next_value"):
        _tensor_vi(g, name, [batch, heads, capacity, head_size], output=True)
    g.persistent_bindings.add(input_name="cache_key", output_name="next_key")
    g.persistent_bindings.add(input_name="cache_value", output_name="next_value")
    return m


def _mask_vi(g, mask: str | None, q_heads: int, tokens) -> str:
    """The optional attn_mask input: float (additive) or bool, [1, q_heads, S, total]."""
    if mask is None:
        return ""
    _tensor_vi(g, "attn_mask", [1, q_heads, tokens, "t"], elem=9 if mask == "bool" else 1)
    return "attn_mask"


def attention_model(heads: int, head_size: int, free_tokens: bool = False, name: str = "kv_contiguous",
                    q_heads: int | None = None, mask: str | None = None, opset: int = 23, **attrs):
    """Attention(q, k, v[, attn_mask], past_key, past_value) with ``past_* <- present_*``; ``q_heads``
    query heads over ``heads`` key/value heads; ``attrs`` are Attention attributes (is_causal, scale,
    softcap); ``opset`` the default domain's version (24 defines masks shorter than the keys)."""
    from .common import model

    q_heads = heads if q_heads is None else q_heads
    m = model(name, opset)
    g = m.graph
    node = g.node.add(op_type="Attention", input=["q", "k", "v", _mask_vi(g, mask, q_heads, "s"), "past_key",
                                                   "past_value"], output=["y", "present_key", "present_value"])
    add_attributes(node, attrs)
    _tensor_vi(g, "q", [1, q_heads, "s", head_size])
    _tensor_vi(g, "k", [1, heads, "sk" if free_tokens else "s", head_size])
    _tensor_vi(g, "v", [1, heads, "sv" if free_tokens else "s", head_size])
    for name in ("past_key", "past_value"):
        _tensor_vi(g, name, [1, heads, "p", head_size])
    _tensor_vi(g, "y", [1, q_heads, "s", head_size], output=True)
    for name in ("present_key", "present_value"):
        _tensor_vi(g, name, [1, heads, "t2", head_size], output=True)
    g.persistent_bindings.add(input_name="past_key", output_name="present_key")
    g.persistent_bindings.add(input_name="past_value", output_name="present_value")
    return m


def paged_model(heads: int, head_size: int, block_size, key_format: str = "dense", value_format: str = "dense",
                free_tokens: bool = False, q_heads: int | None = None, tokens: int | str = 1,
                mask: str | None = None, **attrs):
    """The paged_attention role's default operator, ai.rt::PagedAttention(q, k, v, cache[, attn_mask]) ->
    (y, next_cache), with ``cache <- next_cache``. ``tokens`` is the declared token count of q, k and v
    (a name for any); ``free_tokens`` declares k and v with independent symbolic token counts (so a
    mismatch reaches the kernel); ``attrs`` are further attributes (is_causal, max_tokens, or the suite's
    extensions scale and softcap). The model carries a suite extension only when the case asks for it:
    ``key_format``/``value_format`` only when not dense (the format blocks stay in without them), the
    ``attn_mask`` input only with ``mask``, so a case without them runs on the role's own signature."""
    from reference_impl.kv.formats import KV_PAGED_CACHE, kv_struct_types

    from .common import model

    q_heads = heads if q_heads is None else q_heads
    m = model("kv_paged")
    m.opset_import.add(domain="ai.rt", version=1)
    m.struct_types.extend(kv_struct_types())
    g = m.graph
    inputs = ["q", "k", "v", "cache"]
    masked = _mask_vi(g, mask, q_heads, tokens)
    if masked:
        inputs.append(masked)
    node = g.node.add(op_type="PagedAttention", domain="ai.rt", input=inputs, output=["y", "next_cache"])
    formats = {name: fmt for name, fmt in (("key_format", key_format), ("value_format", value_format))
               if fmt != "dense"}
    add_attributes(node, {"block_size": block_size, **formats, **attrs})
    _tensor_vi(g, "q", [1, q_heads, tokens, head_size])
    _tensor_vi(g, "k", [1, heads, "sk" if free_tokens else tokens, head_size])
    _tensor_vi(g, "v", [1, heads, "sv" if free_tokens else tokens, head_size])
    _tensor_vi(g, "y", [1, q_heads, tokens, head_size], output=True)
    g.input.add(name="cache").type.struct_type.type_ref = KV_PAGED_CACHE
    g.output.add(name="next_cache").type.struct_type.type_ref = KV_PAGED_CACHE
    g.persistent_bindings.add(input_name="cache", output_name="next_cache")
    return m


@builder
def kv_decode(steps: int = 4, heads: int = 2, head_size: int = 4, prefill: int = 3, seed: int = 5,
              states: int = 1):
    """Attention with past/present bound back: a prefill of ``prefill`` tokens then one token per call.
    With ``states`` > 1 the requests interleave on independent states over one model."""
    m = attention_model(heads, head_size, name="kv_decode")
    rng = np.random.default_rng(seed)
    empty = np.zeros((1, heads, 0, head_size), np.float32)
    trace = []
    caches = {}
    for index in range(states):
        name = f"s{index}"
        trace.append({"op": "open", "state": name, "initial": {"past_key": _literal(empty),
                                                               "past_value": _literal(empty)}})
        caches[name] = (empty, empty)
    for step in range(steps):
        for name in caches:
            count = prefill if step == 0 else 1
            q, k, v = (rng.standard_normal((1, heads, count, head_size)).astype(np.float32) for _ in range(3))
            past_k, past_v = caches[name]
            all_k, all_v = np.concatenate([past_k, k], 2), np.concatenate([past_v, v], 2)
            scores_q = q
            if count > 1:  # prefill without a mask: every query sees every token of the prompt
                pass
            y = attention_numpy(scores_q.astype(np.float64), all_k.astype(np.float64), all_v.astype(np.float64))
            caches[name] = (all_k, all_v)
            trace.append({"op": "run", "state": name, "as": f"{name}_{step}",
                          "feeds": {"q": _literal(q), "k": _literal(k), "v": _literal(v)},
                          "outputs": {"y": _literal(y.astype(np.float32)), "present_key": _literal(all_k),
                                      "present_value": _literal(all_v)},
                          "atol": 1e-5, "rtol": 1e-5})
    for name, (all_k, _) in caches.items():
        trace.append({"op": "values", "state": name, "as": f"{name}_end",
                      "values": {"past_key": _literal(all_k)}})
        trace.append({"op": "identity", "same": [[f"{name}_{steps - 1}|present_key", f"{name}_end|past_key"]]})
    return {"model": m, "steps": trace}


@builder
def kv_scatter(capacity: int = 4, heads: int = 1, head_size: int = 2):
    """A fixed-capacity cache updated with TensorScatter (opset 24) at caller-given write indices."""
    from .common import model

    m = model("kv_scatter", opset=24)
    g = m.graph
    g.node.add(op_type="TensorScatter", input=["past", "update", "write_indices"], output=["present"])
    _tensor_vi(g, "past", [1, heads, capacity, head_size])
    _tensor_vi(g, "update", [1, heads, 1, head_size])
    _tensor_vi(g, "write_indices", [1], elem=7)
    _tensor_vi(g, "present", [1, heads, capacity, head_size], output=True)
    g.persistent_bindings.add(input_name="past", output_name="present")
    cache = np.zeros((1, heads, capacity, head_size), np.float32)
    trace = [{"op": "open", "initial": {"past": _literal(cache)}}]
    for position in range(capacity):
        update = np.full((1, heads, 1, head_size), position + 1, np.float32)
        cache = cache.copy()
        cache[:, :, position] = update[:, :, 0]
        trace.append({"op": "run", "as": f"w{position}", "feeds": {"update": _literal(update),
                      "write_indices": {"dtype": "int64", "shape": [1], "data": [position]}},
                      "outputs": {"present": _literal(cache)}})
    trace.append({"op": "run", "feeds": {"update": _literal(np.full((1, heads, 1, head_size), 9, np.float32)),
                  "write_indices": {"dtype": "int64", "shape": [1], "data": [capacity]}},
                  "error": "STATE_RUN_FAILED", "also": ["KV_CAPACITY_EXCEEDED", "EXECUTION_FAILED"]})
    trace.append({"op": "values", "as": "after", "values": {"past": _literal(cache)}})
    trace.append({"op": "identity", "same": [[f"w{capacity - 1}|present", "after|past"]]})
    trace.append({"op": "check", "ref": "w0|present",
                  "equals": _literal(np.concatenate([np.full((1, heads, 1, head_size), 1, np.float32),
                                                     np.zeros((1, heads, capacity - 1, head_size), np.float32)], 2))})
    return {"model": m, "steps": trace}


@builder
def kv_paged_decode(steps: int = 6, heads: int = 2, head_size: int = 4, block_size: int = 4,
                    key_format: str = "dense", value_format: str = "dense", seed: int = 9,
                    atol: float = 1e-5):
    """PagedAttention(Q, K, V, cache) -> (Y, next_cache) with the cache struct bound back: one token per
    call; blocks fill and are sealed in ``key_format``/``value_format``. Y is checked against dense
    attention over every token so far (with ``atol`` for quantized block formats)."""
    from reference_impl.kv.formats import KV_PAGED_CACHE

    m = paged_model(heads, head_size, block_size, key_format, value_format)
    rng = np.random.default_rng(seed)
    trace = [{"op": "open", "initial": {"cache": {"struct": {"blocks": {"sequence": []},
                                                             "length": {"dtype": "int64", "shape": [],
                                                                        "data": [0]}},
                                                  "type_id": KV_PAGED_CACHE}}}]
    keys, values = [], []
    for step in range(steps):
        q, k, v = (rng.standard_normal((1, heads, 1, head_size)).astype(np.float32) for _ in range(3))
        keys.append(k)
        values.append(v)
        all_k, all_v = np.concatenate(keys, 2), np.concatenate(values, 2)
        y = attention_numpy(q.astype(np.float64), all_k.astype(np.float64), all_v.astype(np.float64))
        trace.append({"op": "run", "as": f"r{step}", "feeds": {"q": _literal(q), "k": _literal(k), "v": _literal(v)},
                      "outputs": {"y": _literal(y.astype(np.float32))}, "atol": atol, "rtol": 1e-4})
    trace.append({"op": "values", "as": "end", "names": ["cache"]})
    trace.append({"op": "identity", "same": [[f"r{steps - 1}|next_cache|blocks|0|key", "end|cache|blocks|0|key"]]})
    return {"model": m, "steps": trace}

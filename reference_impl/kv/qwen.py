"""A tiny Qwen-style decoder built in code, for end-to-end stateful decode.

Two layers of RMS norm, GQA attention with rotary embeddings and q/k/v biases, and a SiLU-gated MLP.
Every projection (and the LM head) is a blocked INT4 affine encoded initializer consumed explicitly
by ``onnx_light.Decode``. Three cache variants share the weights:

* ``tensors``: inputs ``past_key_<i>``/``past_value_<i>`` (1, P, Hkv, D) bound to ``present_key_<i>`` /
  ``present_value_<i>``; Attention with past/present inside.
* ``struct``: one whole struct input ``cache`` (KV_CONTIGUOUS_CACHE: the four tensors and ``length``)
  bound to ``next_cache``, taken apart by GetField and rebuilt by MakeStruct.
* ``paged``: ``cache_<i>`` (KV_PAGED_CACHE struct values) bound to ``next_cache_<i>``, consumed by
  ``ai.rt::PagedAttention`` (the paged_attention role) with quantized sealed blocks.

Caches are token-major (1, S, Hkv, D) so that a batch-1 cache growing in place stays C-contiguous.
``lower`` turns the tensors variant into a standard ONNX model (DequantizeLinear for the INT4
weights, no bindings) plus its feedback mapping, for onnxruntime.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from reference_impl import dtypes, schema
from reference_impl.affine import make_affine_value
from reference_impl.kv import contiguous, paged
from reference_impl.kv.formats import KV_PAGED_CACHE, kv_struct_types
from reference_impl.kv.kernels import KV_DOMAIN
from reference_impl.values import StructValue

VARIANTS = ("tensors", "struct", "paged")
KV_CONTIGUOUS_CACHE = 3200
LOCAL_DOMAIN = "onnx_light"


@dataclass(frozen=True)
class QwenConfig:
    vocab: int = 64
    hidden: int = 32
    layers: int = 2
    q_heads: int = 4
    kv_heads: int = 2
    head_dim: int = 8
    intermediate: int = 64
    rope_theta: float = 10000.0
    eps: float = 1e-6
    max_positions: int = 1024
    weight_block: int = 16
    seed: int = 0
    # paged variant
    block_size: int = 16
    key_format: str = "int8"
    value_format: str = "int4"


def make_weights(config: QwenConfig) -> dict[str, np.ndarray]:
    """Deterministic float weights; projections are later stored as blocked INT4."""
    rng = np.random.default_rng(config.seed)
    c = config

    def f(*shape: int, scale: float = 0.2) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    w = {"embed": f(c.vocab, c.hidden, scale=1.0), "norm": 1 + f(c.hidden, scale=0.05),
         "lm_head": f(c.hidden, c.vocab)}
    for i in range(c.layers):
        w.update({
            f"l{i}.ln1": 1 + f(c.hidden, scale=0.05), f"l{i}.ln2": 1 + f(c.hidden, scale=0.05),
            f"l{i}.wq": f(c.hidden, c.q_heads * c.head_dim), f"l{i}.bq": f(c.q_heads * c.head_dim, scale=0.05),
            f"l{i}.wk": f(c.hidden, c.kv_heads * c.head_dim), f"l{i}.bk": f(c.kv_heads * c.head_dim, scale=0.05),
            f"l{i}.wv": f(c.hidden, c.kv_heads * c.head_dim), f"l{i}.bv": f(c.kv_heads * c.head_dim, scale=0.05),
            f"l{i}.wo": f(c.q_heads * c.head_dim, c.hidden), f"l{i}.wg": f(c.hidden, c.intermediate),
            f"l{i}.wu": f(c.hidden, c.intermediate), f"l{i}.wd": f(c.intermediate, c.hidden),
        })
    return w


def _rope_tables(config: QwenConfig) -> tuple[np.ndarray, np.ndarray]:
    half = config.head_dim // 2
    inv = 1.0 / config.rope_theta ** (np.arange(half, dtype=np.float64) / half)
    angles = np.arange(config.max_positions, dtype=np.float64)[:, None] * inv[None, :]
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


class _Graph:
    """Accumulates nodes and dense initializers with generated value names."""

    def __init__(self):
        self.nodes, self.initializers, self._count = [], [], 0

    def const(self, name: str, array: np.ndarray) -> str:
        self.initializers.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def op(self, op_type: str, inputs: list[str], outputs: int | list[str] = 1, domain: str = "",
           **attrs) -> list[str]:
        if isinstance(outputs, int):
            names = []
            for _ in range(outputs):
                self._count += 1
                names.append(f"{op_type.lower()}_{self._count}")
        else:
            names = outputs
        self.nodes.append(helper.make_node(op_type, inputs, names, domain=domain or None, **attrs))
        return names

    def one(self, op_type: str, inputs: list[str], domain: str = "", **attrs) -> str:
        return self.op(op_type, inputs, 1, domain, **attrs)[0]


def _layer(g: _Graph, c: QwenConfig, i: int, h: str, positions: str, variant: str, past: tuple) -> tuple:
    """One decoder layer; returns the new hidden state and what the variant emits for its cache."""
    x = g.one("RMSNormalization", [h, f"l{i}.ln1"], axis=-1, epsilon=c.eps)

    def project(name: str, heads: int, rotary: bool) -> str:
        y = g.one("Add", [g.one("MatMul", [x, f"l{i}.w{name}.f"]), f"l{i}.b{name}"])
        y = g.one("Transpose", [g.one("Reshape", [y, f"dims_{heads}"])], perm=[0, 2, 1, 3])
        return g.one("RotaryEmbedding", [y, "cos", "sin", positions]) if rotary else y

    q, k, v = project("q", c.q_heads, True), project("k", c.kv_heads, True), project("v", c.kv_heads, False)
    if variant == "paged":
        y, emitted = g.op("PagedAttention", [q, k, v, past[0]], [f"att_{i}", past[1]], domain=KV_DOMAIN,
                          block_size=c.block_size, key_format=c.key_format, value_format=c.value_format,
                          is_causal=1)
        emitted = (emitted,)
    else:
        past_k, past_v = (g.one("Transpose", [name], perm=[0, 2, 1, 3]) for name in past)
        y, present_k, present_v = g.op("Attention", [q, k, v, "", past_k, past_v], 3, is_causal=1)
        emitted = tuple(g.one("Transpose", [name], perm=[0, 2, 1, 3]) for name in (present_k, present_v))
    y = g.one("Reshape", [g.one("Transpose", [y], perm=[0, 2, 1, 3]), "dims_hidden"])
    h = g.one("Add", [h, g.one("MatMul", [y, f"l{i}.wo.f"])])
    x = g.one("RMSNormalization", [h, f"l{i}.ln2"], axis=-1, epsilon=c.eps)
    gate = g.one("MatMul", [x, f"l{i}.wg.f"])
    act = g.one("Mul", [gate, g.one("Sigmoid", [gate])])
    h = g.one("Add", [h, g.one("MatMul", [g.one("Mul", [act, g.one("MatMul", [x, f"l{i}.wu.f"])]), f"l{i}.wd.f"])])
    return h, emitted


def _tensor_info(name: str, elem: int, dims: list) -> object:
    return helper.make_tensor_value_info(name, elem, dims)


def build(config: QwenConfig = QwenConfig(), variant: str = "tensors"):
    """The decoder as an extended ModelProto with persistent bindings for its cache."""
    if variant not in VARIANTS:
        raise ValueError(f"variant must be one of {VARIANTS}")
    c = config
    weights = make_weights(c)
    g = _Graph()
    cos, sin = _rope_tables(c)
    g.const("cos", cos)
    g.const("sin", sin)
    for name in ("embed", "norm") + tuple(f"l{i}.{n}" for i in range(c.layers)
                                          for n in ("ln1", "ln2", "bq", "bk", "bv")):
        g.const(name, weights[name])
    g.const(f"dims_{c.q_heads}", np.array([1, -1, c.q_heads, c.head_dim], np.int64))
    g.const(f"dims_{c.kv_heads}", np.array([1, -1, c.kv_heads, c.head_dim], np.int64))
    g.const("dims_hidden", np.array([1, -1, c.q_heads * c.head_dim], np.int64))
    g.const("one", np.array(1, np.int64))
    g.const("dims_1", np.array([1], np.int64))
    g.const("axes_0", np.array([0], np.int64))
    encoded = [name for name in weights if name.split(".")[-1] in ("wq", "wk", "wv", "wo", "wg", "wu", "wd")
               or name == "lm_head"]
    for name in encoded:
        g.op("Decode", [name], [f"{name}.f"], domain=LOCAL_DOMAIN)

    cache_dims = [1, "P", c.kv_heads, c.head_dim]
    inputs = [_tensor_info("input_ids", TensorProto.INT64, [1, "S"])]
    outputs = [_tensor_info("logits", TensorProto.FLOAT, [1, "S", c.vocab])]
    bindings, cache_types = [], {}
    # Where each layer's past comes from, and the cache length (the first position of this call).
    if variant == "tensors":
        pasts = [(f"past_key_{i}", f"past_value_{i}") for i in range(c.layers)]
        for i in range(c.layers):
            for kind in ("key", "value"):
                inputs.append(_tensor_info(f"past_{kind}_{i}", TensorProto.FLOAT, cache_dims))
                outputs.append(_tensor_info(f"present_{kind}_{i}", TensorProto.FLOAT, [1, "T", c.kv_heads,
                                                                                      c.head_dim]))
                bindings.append((f"past_{kind}_{i}", f"present_{kind}_{i}"))
        length = g.one("Shape", ["past_key_0"], start=1, end=2)
    elif variant == "struct":
        pasts = [tuple(g.op("GetField", ["cache"], [f"past_{kind}_{i}"], domain=LOCAL_DOMAIN, field=f"{kind}_{i}")[0]
                       for kind in ("key", "value")) for i in range(c.layers)]
        cache_types = {"cache": KV_CONTIGUOUS_CACHE, "next_cache": KV_CONTIGUOUS_CACHE}
        bindings.append(("cache", "next_cache"))
        length = g.one("Reshape", [g.one("GetField", ["cache"], domain=LOCAL_DOMAIN, field="length"), "dims_1"])
    else:
        pasts = [(f"cache_{i}", f"next_cache_{i}") for i in range(c.layers)]
        cache_types = {name: KV_PAGED_CACHE for pair in pasts for name in pair}
        bindings += pasts
        length = g.one("Reshape", [g.one("GetField", ["cache_0"], domain=LOCAL_DOMAIN, field="length"),
                                   "dims_1"])
    count = g.one("Shape", ["input_ids"], start=1, end=2)
    end = g.one("Add", [length, count])
    positions = g.one("Unsqueeze", [g.one("Range", [g.one("Squeeze", [length]), g.one("Squeeze", [end]), "one"]),
                                    "axes_0"])
    h = g.one("Gather", ["embed", "input_ids"], axis=0)
    emitted = []
    for i in range(c.layers):
        h, out = _layer(g, c, i, h, positions, variant, pasts[i])
        emitted.append(out)
    if variant == "tensors":
        for i, (k, v) in enumerate(emitted):
            g.nodes.append(helper.make_node("Identity", [k], [f"present_key_{i}"]))
            g.nodes.append(helper.make_node("Identity", [v], [f"present_value_{i}"]))
    elif variant == "struct":
        fields = [f"{kind}_{i}" for i in range(c.layers) for kind in ("key", "value")]
        g.op("MakeStruct", [name for pair in emitted for name in pair] + [g.one("Squeeze", [end])], ["next_cache"],
             domain=LOCAL_DOMAIN, type_id=KV_CONTIGUOUS_CACHE, fields=fields + ["length"])
    h = g.one("RMSNormalization", [h, "norm"], axis=-1, epsilon=c.eps)
    g.nodes.append(helper.make_node("MatMul", [h, "lm_head.f"], ["logits"]))

    graph = helper.make_graph(g.nodes, f"qwen_{variant}", inputs, outputs, g.initializers)
    opsets = [helper.make_opsetid("", 24), helper.make_opsetid(LOCAL_DOMAIN, 1)]
    if variant == "paged":
        opsets.append(helper.make_opsetid(KV_DOMAIN, 1))
    model = schema.from_onnx(helper.make_model(graph, opset_imports=opsets, ir_version=10))
    if variant == "struct":
        model.struct_types.append(_contiguous_cache_type(c))
    elif variant == "paged":
        model.struct_types.extend(kv_struct_types())
    for name, type_id in cache_types.items():
        info = schema.ValueInfoProto(name=name)
        info.type.struct_type.type_ref = type_id
        (model.graph.input if name in (b[0] for b in bindings) else model.graph.output).append(info)
    for name in encoded:
        w = weights[name]
        blocks = w.reshape(w.shape[0] // c.weight_block, c.weight_block, w.shape[1])
        scale = (np.max(np.abs(blocks), axis=1) / 7).astype(np.float32)
        model.graph.encoded_initializer.append(
            make_affine_value(w, dtypes.INT4, scale, axis=0, block_size=c.weight_block, name=name))
    for input_name, output_name in bindings:
        model.graph.persistent_bindings.add(input_name=input_name, output_name=output_name)
    return model


def _contiguous_cache_type(c: QwenConfig):
    decl = schema.StructTypeProto(type_id=KV_CONTIGUOUS_CACHE, name="KV_CONTIGUOUS_CACHE")
    for i in range(c.layers):
        for kind in ("key", "value"):
            field = decl.structure.field.add(name=f"{kind}_{i}")
            tensor = field.type.tensor_type
            tensor.elem_type = dtypes.FLOAT
            for dim in (1, "P", c.kv_heads, c.head_dim):
                if isinstance(dim, str):
                    tensor.shape.dim.add(dim_param=dim)
                else:
                    tensor.shape.dim.add(dim_value=dim)
    length = decl.structure.field.add(name="length")
    length.type.tensor_type.elem_type = dtypes.INT64
    length.type.tensor_type.shape.SetInParent()
    return decl


def initial_values(config: QwenConfig, variant: str, capacity: int = 128) -> dict:
    """Empty caches for a fresh state. Contiguous caches are token-major allocations of ``capacity``
    tokens that grow (by relocation) if a request outlives them."""
    c = config

    def empty():
        return contiguous.empty_cache(1, c.kv_heads, c.head_dim, capacity, fixed=False,
                                      token_major=True).transpose(0, 2, 1, 3)

    if variant == "tensors":
        return {f"past_{kind}_{i}": empty() for i in range(c.layers) for kind in ("key", "value")}
    if variant == "struct":
        fields = {f"{kind}_{i}": empty() for i in range(c.layers) for kind in ("key", "value")}
        fields["length"] = np.array(0, np.int64)
        return {"cache": StructValue(fields, KV_CONTIGUOUS_CACHE)}
    return {f"cache_{i}": paged.empty(c.kv_heads, c.head_dim, c.block_size).to_struct() for i in range(c.layers)}


def lower(model):
    """The tensors variant as standard ONNX for a stateless runtime: each ``Decode`` of an INT4 weight
    becomes DequantizeLinear over the same packed codes (a standard INT4 initializer), and the bindings
    become the caller-managed feedback mapping (``graph_utils.export_standard(lower=True)``)."""
    from reference_impl.graph_utils import copy_model, export_standard

    clone = copy_model(model)
    graph = clone.graph
    encoded = {value.name: value for value in graph.encoded_initializer}
    for node in graph.node:
        if node.domain == LOCAL_DOMAIN and node.op_type == "Decode" and node.input[0] in encoded:
            value = encoded[node.input[0]]
            layout = value.affine
            codes = graph.initializer.add(name=f"{value.name}.codes", data_type=layout.storage_type,
                                          dims=[d.dim_value for d in value.logical_type.tensor_type.shape.dim],
                                          raw_data=value.raw_data)
            scale = graph.initializer.add()
            scale.CopyFrom(layout.scale)
            scale.name = f"{value.name}.scale"
            inputs = [codes.name, scale.name]
            if layout.HasField("zero_point"):
                zero_point = graph.initializer.add()
                zero_point.CopyFrom(layout.zero_point)
                zero_point.name = f"{value.name}.zero_point"
                inputs.append(zero_point.name)
            attrs = {"axis": layout.axis} if layout.HasField("axis") else {}
            if layout.HasField("block_size"):
                attrs["block_size"] = layout.block_size
            replacement = schema.from_onnx(helper.make_node("DequantizeLinear", inputs, list(node.output), **attrs))
            node.CopyFrom(replacement)
    graph.ClearField("encoded_initializer")
    kept = [o for o in clone.opset_import if o.domain != LOCAL_DOMAIN]
    del clone.opset_import[:]
    clone.opset_import.extend(kept)
    return export_standard(clone, lower=True)

"""Model builders shared by the state, binding, executor and graph-utility tests (no tests here).

Models are authored with onnx.helper, converted to the extended schema, then given the local
extensions (struct types, struct-typed values, bindings) the contract adds.
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto as T
from onnx import helper, numpy_helper

from reference_impl import schema
from reference_impl.executor import LOCAL_DOMAIN

OPSET = 21
CACHE_TYPE = 3001
D, V = 8, 16


def opsets(*extra):
    return [helper.make_opsetid("", OPSET), helper.make_opsetid(LOCAL_DOMAIN, 1), *extra]


def tensor_type(elem: int, dims) -> schema.TypeProto:
    return schema.from_onnx(helper.make_tensor_type_proto(elem, dims))


def set_struct(vi, type_id: int = CACHE_TYPE) -> None:
    vi.type.ClearField("tensor_type")
    vi.type.struct_type.type_ref = type_id


def cache_declaration(type_id: int = CACHE_TYPE, key_elem: int = T.FLOAT) -> schema.StructTypeProto:
    decl = schema.StructTypeProto(type_id=type_id, name="Cache")
    for name, elem, dims in (("keys", key_elem, [1, "n", D]), ("values", T.FLOAT, [1, "n", D]),
                             ("length", T.INT64, [])):
        decl.structure.field.add(name=name).type.CopyFrom(tensor_type(elem, dims))
    return decl


def weights(seed: int = 0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((V, D)).astype(np.float32), rng.standard_normal((D, V)).astype(np.float32))


def kv_model(bind: bool = True, d: int = D, v: int = V, seed: int = 0):
    """tokens + past_key -> logits, present_key (= Concat(past_key, embed(tokens))), seen_past."""
    rng = np.random.default_rng(seed)
    emb_w = rng.standard_normal((v, d)).astype(np.float32)
    out_w = rng.standard_normal((d, v)).astype(np.float32)
    nodes = [
        helper.make_node("Gather", ["E", "tokens"], ["emb"]),
        helper.make_node("Concat", ["past_key", "emb"], ["present_key"], axis=1),
        helper.make_node("ReduceSum", ["present_key", "axis1"], ["ctx"], keepdims=1),
        helper.make_node("Add", ["emb", "ctx"], ["hidden"]),
        helper.make_node("MatMul", ["hidden", "W"], ["logits"]),
        helper.make_node("Identity", ["past_key"], ["seen_past"]),
    ]
    graph = helper.make_graph(
        nodes, "kv",
        [helper.make_tensor_value_info("tokens", T.INT64, [1, "s"]),
         helper.make_tensor_value_info("past_key", T.FLOAT, [1, "past", d])],
        [helper.make_tensor_value_info("logits", T.FLOAT, [1, "s", v]),
         helper.make_tensor_value_info("present_key", T.FLOAT, [1, "total", d]),
         helper.make_tensor_value_info("seen_past", T.FLOAT, [1, "past", d])],
        [numpy_helper.from_array(emb_w, "E"), numpy_helper.from_array(out_w, "W"),
         numpy_helper.from_array(np.array([1], np.int64), "axis1")])
    model = schema.from_onnx(helper.make_model(graph, opset_imports=opsets()))
    if bind:
        model.graph.persistent_bindings.add(input_name="past_key", output_name="present_key")
    return model


def struct_cache_model(extra_struct_input: bool = False):
    """The spec's whole structured cache: tokens + cache -> logits, next_cache; cache <- next_cache.

    With ``extra_struct_input`` a second input ``draft`` of the same Cache type is fed fresh each call
    and passed through to an unbound output ``draft_out``.
    """
    emb_w, out_w = weights(1)
    nodes = [
        helper.make_node("GetField", ["cache"], ["k"], domain=LOCAL_DOMAIN, field="keys"),
        helper.make_node("GetField", ["cache"], ["v"], domain=LOCAL_DOMAIN, field="values"),
        helper.make_node("Gather", ["E", "tokens"], ["emb"]),
        helper.make_node("Concat", ["k", "emb"], ["k2"], axis=1),
        helper.make_node("Neg", ["emb"], ["nemb"]),
        helper.make_node("Concat", ["v", "nemb"], ["v2"], axis=1),
        helper.make_node("Shape", ["k2"], ["k2_shape"]),
        helper.make_node("Gather", ["k2_shape", "one"], ["length"], axis=0),
        helper.make_node("MakeStruct", ["k2", "v2", "length"], ["next_cache"], domain=LOCAL_DOMAIN,
                         fields=["keys", "values", "length"], type_id=CACHE_TYPE),
        helper.make_node("ReduceSum", ["v2", "axis1"], ["ctx"], keepdims=1),
        helper.make_node("Add", ["emb", "ctx"], ["hidden"]),
        helper.make_node("MatMul", ["hidden", "W"], ["logits"]),
    ]
    inputs = [helper.make_tensor_value_info("tokens", T.INT64, [1, "s"]),
              helper.make_tensor_value_info("cache", T.FLOAT, None)]
    outputs = [helper.make_tensor_value_info("logits", T.FLOAT, [1, "s", V]),
               helper.make_tensor_value_info("next_cache", T.FLOAT, None)]
    if extra_struct_input:
        inputs.append(helper.make_tensor_value_info("draft", T.FLOAT, None))
        outputs.append(helper.make_tensor_value_info("draft_out", T.FLOAT, None))
        nodes.append(helper.make_node("Identity", ["draft"], ["draft_out"]))
    graph = helper.make_graph(
        nodes, "struct_cache", inputs, outputs,
        [numpy_helper.from_array(emb_w, "E"), numpy_helper.from_array(out_w, "W"),
         numpy_helper.from_array(np.array([1], np.int64), "axis1"),
         numpy_helper.from_array(np.array(1, np.int64), "one")])
    model = schema.from_onnx(helper.make_model(graph, opset_imports=opsets()))
    model.struct_types.append(cache_declaration())
    for group in (model.graph.input, model.graph.output):
        for vi in group:
            if vi.name in ("cache", "next_cache", "draft", "draft_out"):
                set_struct(vi)
    model.graph.persistent_bindings.add(input_name="cache", output_name="next_cache")
    return model


def empty_cache(n: int = 0):
    from reference_impl.values import StructValue

    return StructValue({"keys": np.zeros((1, n, D), np.float32), "values": np.zeros((1, n, D), np.float32),
                        "length": np.array(n, np.int64)}, CACHE_TYPE)


def tokens(*ids: int) -> np.ndarray:
    return np.array([list(ids)], dtype=np.int64)


def address(array: np.ndarray) -> int:
    return array.__array_interface__["data"][0]

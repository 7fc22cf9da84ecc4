"""Binding validation against the final graph: exact names, duplicates, types, strings, nesting."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper
from test_state_models import (
    CACHE_TYPE,
    cache_declaration,
    kv_model,
    opsets,
    set_struct,
    struct_cache_model,
    tensor_type,
)

from reference_impl import schema
from reference_impl.bindings import validate_bindings
from reference_impl.errors import ContractError, ErrorCode
from reference_impl.executor import Executor


def passthrough_model(inputs, outputs, nodes=None, struct_types=()):
    """Inputs and outputs as (name, elem, dims); each output defaults to Identity of the same-index input."""
    nodes = nodes if nodes is not None else [
        helper.make_node("Identity", [i[0]], [o[0]]) for i, o in zip(inputs, outputs)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(*i) for i in inputs],
                              [helper.make_tensor_value_info(*o) for o in outputs])
    model = schema.from_onnx(helper.make_model(graph, opset_imports=opsets()))
    model.struct_types.extend(struct_types)
    return model


def bind(model, *pairs):
    for input_name, output_name in pairs:
        model.graph.persistent_bindings.add(input_name=input_name, output_name=output_name)
    return model


def code_of(model) -> ErrorCode:
    with pytest.raises(ContractError) as info:
        validate_bindings(model)
    return info.value.code


@pytest.mark.clause("BIND-STATELESS-DEFAULT")
def test_no_bindings_is_stateless():
    assert validate_bindings(kv_model(bind=False)) == ()


@pytest.mark.clause("BIND-EXACT-NAMES")
def test_resolves_exact_names_with_types():
    (binding,) = validate_bindings(kv_model())
    assert (binding.input_name, binding.output_name) == ("past_key", "present_key")
    assert binding.spec.elem_type == T.FLOAT and binding.spec.dims == (1, "past", 8)


@pytest.mark.clause("BIND-EXACT-NAMES")
@pytest.mark.parametrize("pair", [("missing", "present_key"), ("past_key", "missing"),
                                  ("present_key", "present_key"), ("past_key", "past_key"),
                                  ("Past_key", "present_key"), ("past_key ", "present_key")])
def test_unknown_or_inexact_names_rejected(pair):
    model = bind(kv_model(bind=False), pair)
    assert code_of(model) is ErrorCode.BINDING_NAME_UNKNOWN


@pytest.mark.clause("BIND-EXACT-NAMES", "BIND-WHOLE", "BIND-LITERAL-NAMES")
def test_dotted_and_backslash_names_are_literal():
    dims = [1, 4]
    model = passthrough_model([("cache.keys", T.FLOAT, dims), ("a\\b", T.FLOAT, dims)],
                              [("next.keys", T.FLOAT, dims), ("c\\d", T.FLOAT, dims)])
    resolved = validate_bindings(bind(model, ("cache.keys", "next.keys"), ("a\\b", "c\\d")))
    assert [b.input_name for b in resolved] == ["cache.keys", "a\\b"]


@pytest.mark.clause("BIND-WHOLE", "BIND-EXACT-NAMES")
def test_field_path_into_struct_input_is_not_a_name():
    model = struct_cache_model()
    del model.graph.persistent_bindings[:]
    bind(model, ("cache.keys", "next_cache"))
    with pytest.raises(ContractError) as info:
        validate_bindings(model)
    assert info.value.code is ErrorCode.BINDING_NAME_UNKNOWN
    assert "partial field selection" in info.value.message


@pytest.mark.clause("BIND-DUPLICATES")
def test_duplicate_input_selection():
    dims = [2]
    model = passthrough_model([("a", T.FLOAT, dims)], [("x", T.FLOAT, dims)])
    model.graph.output.add().CopyFrom(schema.from_onnx(helper.make_tensor_value_info("y", T.FLOAT, dims)))
    model.graph.node.add().CopyFrom(schema.from_onnx(helper.make_node("Identity", ["a"], ["y"])))
    assert code_of(bind(model, ("a", "x"), ("a", "y"))) is ErrorCode.BINDING_INPUT_DUPLICATE


@pytest.mark.clause("BIND-DUPLICATES")
def test_duplicate_output_selection():
    dims = [2]
    model = passthrough_model([("a", T.FLOAT, dims), ("b", T.FLOAT, dims)], [("x", T.FLOAT, dims)],
                              nodes=[helper.make_node("Add", ["a", "b"], ["x"])])
    assert code_of(bind(model, ("a", "x"), ("b", "x"))) is ErrorCode.BINDING_OUTPUT_DUPLICATE


@pytest.mark.clause("BIND-COMPATIBLE")
@pytest.mark.parametrize("in_type, out_type, ok", [
    ((T.FLOAT, [1, 4]), (T.FLOAT, [1, 4]), True),
    ((T.FLOAT, [1, "n"]), (T.FLOAT, [1, 4]), True),      # symbolic matches concrete
    ((T.FLOAT, [1, "n"]), (T.FLOAT, [1, "m"]), True),    # growing caches: different symbols
    ((T.FLOAT, None), (T.FLOAT, [3]), True),              # unknown rank constrains nothing
    ((T.FLOAT, [1, 4]), (T.FLOAT16, [1, 4]), False),     # element type
    ((T.FLOAT, [1, 4]), (T.FLOAT, [1, 4, 1]), False),    # rank
    ((T.FLOAT, [1, 4]), (T.FLOAT, [1, 5]), False),       # fixed dimension
    ((T.INT64, []), (T.INT32, []), False),
])
def test_type_and_shape_compatibility(in_type, out_type, ok):
    model = passthrough_model([("a", in_type[0], in_type[1])], [("b", out_type[0], out_type[1])],
                              nodes=[helper.make_node("Cast", ["a"], ["b"], to=out_type[0])])
    bind(model, ("a", "b"))
    if ok:
        assert len(validate_bindings(model)) == 1
    else:
        assert code_of(model) is ErrorCode.BINDING_INCOMPATIBLE


@pytest.mark.clause("BIND-COMPATIBLE")
def test_struct_versus_tensor_and_different_struct_ids_incompatible():
    model = struct_cache_model()
    model.struct_types.append(cache_declaration(type_id=3002))
    next_cache = [vi for vi in model.graph.output if vi.name == "next_cache"][0]
    set_struct(next_cache, 3002)
    assert code_of(model) is ErrorCode.BINDING_INCOMPATIBLE
    next_cache.type.CopyFrom(tensor_type(T.FLOAT, [1]))
    assert code_of(model) is ErrorCode.BINDING_INCOMPATIBLE


@pytest.mark.clause("BIND-COMPATIBLE")
def test_untyped_bound_value_rejected():
    model = passthrough_model([("a", T.FLOAT, [2])], [("b", T.FLOAT, [2])])
    model.graph.output[0].ClearField("type")
    assert code_of(bind(model, ("a", "b"))) is ErrorCode.BINDING_INCOMPATIBLE


def _string_in(where: str):
    """A bound struct whose declaration hides a string tensor at ``where``."""
    inner = schema.StructTypeProto(type_id=3100, name="Inner")
    decl = cache_declaration()
    if where == "field":
        decl.structure.field.add(name="names").type.CopyFrom(tensor_type(T.STRING, [2]))
    elif where == "constant":
        decl.structure.field.add(name="labels").constant.CopyFrom(
            schema.from_onnx(numpy_helper.from_array(np.array([b"a"], dtype=object), "labels")))
    elif where == "nested":
        inner.structure.field.add(name="tag").type.CopyFrom(tensor_type(T.STRING, []))
        decl.structure.field.add(name="inner").type.struct_type.type_ref = 3100
    elif where == "sequence":
        seq = schema.from_onnx(helper.make_sequence_type_proto(helper.make_tensor_type_proto(T.STRING, [])))
        decl.structure.field.add(name="seq").type.CopyFrom(seq)
    model = passthrough_model([("s", T.FLOAT, None)], [("t", T.FLOAT, None)],
                              struct_types=[decl, inner] if where == "nested" else [decl])
    set_struct(model.graph.input[0])
    set_struct(model.graph.output[0])
    return bind(model, ("s", "t"))


@pytest.mark.clause("BIND-NO-STRINGS")
@pytest.mark.parametrize("where", ["field", "constant", "nested", "sequence"])
def test_string_anywhere_inside_a_persistent_value(where):
    assert code_of(_string_in(where)) is ErrorCode.BINDING_STRING


@pytest.mark.clause("BIND-NO-STRINGS")
def test_plain_string_tensor_binding_rejected():
    model = passthrough_model([("a", T.STRING, [2])], [("b", T.STRING, [2])])
    assert code_of(bind(model, ("a", "b"))) is ErrorCode.BINDING_STRING


@pytest.mark.clause("BIND-NO-STRINGS")
def test_string_feed_that_is_not_bound_is_fine():
    model = passthrough_model([("a", T.FLOAT, [2]), ("s", T.STRING, [1])],
                              [("b", T.FLOAT, [2]), ("t", T.STRING, [1])])
    assert len(validate_bindings(bind(model, ("a", "b")))) == 1


def _if_with_bound_subgraph():
    branch = helper.make_graph([helper.make_node("Identity", ["a"], ["r"])], "branch", [],
                               [helper.make_tensor_value_info("r", T.FLOAT, [2])])
    node = helper.make_node("If", ["c"], ["b"], then_branch=branch, else_branch=branch)
    model = passthrough_model([("a", T.FLOAT, [2]), ("c", T.BOOL, [])], [("b", T.FLOAT, [2])], nodes=[node])
    model.graph.node[0].attribute[0].g.persistent_bindings.add(input_name="a", output_name="r")
    return model


@pytest.mark.clause("BIND-ROOT-ONLY")
def test_bindings_inside_control_flow_subgraph_rejected():
    with pytest.raises(ContractError) as info:
        validate_bindings(_if_with_bound_subgraph())
    assert info.value.code is ErrorCode.BINDING_IN_SUBGRAPH
    assert "attribute['then_branch']" in info.value.path or "attribute['else_branch']" in info.value.path


@pytest.mark.clause("BIND-ROOT-ONLY")
def test_bindings_inside_a_function_body_subgraph_rejected():
    model = _if_with_bound_subgraph()
    function = schema.FunctionProto(name="F", domain="local")
    function.input.extend(["a", "c"])
    function.output.append("b")
    function.node.add().CopyFrom(model.graph.node[0])
    function.opset_import.add(domain="", version=21)
    model.functions.append(function)
    del model.graph.node[:]
    call = helper.make_node("F", ["a", "c"], ["b"], domain="local")
    model.graph.node.add().CopyFrom(schema.from_onnx(call))
    with pytest.raises(ContractError) as info:
        validate_bindings(model)
    assert info.value.code is ErrorCode.BINDING_IN_SUBGRAPH and "functions[0]" in info.value.path


@pytest.mark.clause("BIND-EXACT-NAMES", "STATE-RESOLVE-ONCE", "EXP-VALIDATE-FINAL")
def test_executor_validates_bindings_before_any_state():
    model = bind(kv_model(bind=False), ("tokens", "logits"))  # INT64 input <- FLOAT output
    with pytest.raises(ContractError) as info:
        Executor(model)
    assert info.value.code is ErrorCode.BINDING_INCOMPATIBLE


@pytest.mark.clause("STATE-WHOLE-STRUCT")
def test_two_values_of_one_struct_type_bound_differently():
    model = struct_cache_model(extra_struct_input=True)
    resolved = validate_bindings(model)
    assert [(b.input_name, b.output_name) for b in resolved] == [("cache", "next_cache")]
    assert resolved[0].spec.type_id == CACHE_TYPE
    bind(model, ("draft", "draft_out"))
    assert [b.input_name for b in validate_bindings(model)] == ["cache", "draft"]

"""Bindings through save/load, copies, renames and rewrites; standard export and its lowering."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto as T
from onnx import helper
from onnx.reference import ReferenceEvaluator
from test_state_models import D, kv_model, struct_cache_model, tensor_type, tokens

from reference_impl import schema
from reference_impl.errors import ContractError, ErrorCode
from reference_impl.executor import Executor
from reference_impl.graph_utils import (
    apply_rewrite,
    copy_model,
    export_standard,
    feedback_loop,
    load_model,
    rename_value,
    save_model,
)
from reference_impl.state import make_state


def pairs(model):
    return [(b.input_name, b.output_name) for b in model.graph.persistent_bindings]


@pytest.mark.clause("EXP-PRESERVE", "WIRE-BINDINGS-FIELD")
def test_bindings_round_trip_through_save_load_text_and_copy(tmp_path):
    model = struct_cache_model()
    save_model(model, tmp_path / "m.onnx")
    assert pairs(load_model(tmp_path / "m.onnx")) == [("cache", "next_cache")]
    assert pairs(schema.parse_text(schema.to_text(model))) == [("cache", "next_cache")]
    assert pairs(copy_model(model)) == [("cache", "next_cache")]
    raw = model.SerializeToString()
    plain = schema.to_onnx(model)  # upstream onnx keeps field 1001 as an unknown field ...
    assert pairs(schema.from_onnx(plain)) == [("cache", "next_cache")]  # ... and gives it back intact
    assert schema.parse_model(raw) == model


@pytest.mark.clause("EXP-RENAME")
@pytest.mark.parametrize("old, new", [("past_key", "cache.k"), ("present_key", "next\\k")])
def test_rename_updates_binding_and_runs_the_same(old, new):
    model = kv_model()
    renamed = rename_value(model, old, new)
    expected = [(new if i == old else i, new if o == old else o) for i, o in pairs(model)]
    assert pairs(renamed) == expected
    assert pairs(model) == [("past_key", "present_key")]  # the original is untouched
    a = make_state(model, {"past_key": np.zeros((1, 0, D), np.float32)})
    b = make_state(renamed, {pairs(renamed)[0][0]: np.zeros((1, 0, D), np.float32)})
    for ids in ((1, 2), (3,)):
        out_a, out_b = a.run({"tokens": tokens(*ids)}), b.run({"tokens": tokens(*ids)})
        np.testing.assert_array_equal(out_a["logits"], out_b["logits"])


@pytest.mark.clause("EXP-RENAME")
def test_rename_reaches_subgraphs_that_see_the_outer_value():
    branch = helper.make_graph([helper.make_node("Identity", ["x"], ["r"])], "b", [],
                               [helper.make_tensor_value_info("r", T.FLOAT, [2])])
    graph = helper.make_graph([helper.make_node("If", ["c"], ["y"], then_branch=branch, else_branch=branch)],
                              "g", [helper.make_tensor_value_info("x", T.FLOAT, [2]),
                                    helper.make_tensor_value_info("c", T.BOOL, [])],
                              [helper.make_tensor_value_info("y", T.FLOAT, [2])])
    model = schema.from_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]))
    model.graph.persistent_bindings.add(input_name="x", output_name="y")
    renamed = rename_value(model, "x", "state.x")
    state = make_state(renamed, {"state.x": np.ones(2, np.float32)})
    np.testing.assert_array_equal(state.run({"c": np.array(True)})["y"], np.ones(2, np.float32))


@pytest.mark.clause("EXP-RENAME")
def test_rename_onto_an_existing_name_fails():
    with pytest.raises(ContractError) as info:
        rename_value(kv_model(), "past_key", "tokens")
    assert info.value.code is ErrorCode.REWRITE_NAME_CONFLICT


def _remove_input(name):
    def rewrite(model):
        index = [vi.name for vi in model.graph.input].index(name)
        del model.graph.input[index]
    return rewrite


def _retype_output(name, elem):
    def rewrite(model):
        for vi in model.graph.output:
            if vi.name == name:
                vi.type.CopyFrom(tensor_type(elem, [1, "total", D]))
    return rewrite


@pytest.mark.clause("EXP-REWRITE")
@pytest.mark.parametrize("rewrite", [
    _remove_input("past_key"),
    _retype_output("present_key", T.FLOAT16),
    lambda m: m.graph.ClearField("persistent_bindings"),
    lambda m: m.graph.output.pop(1),
], ids=["remove-bound-input", "retype-bound-output", "drop-declaration", "remove-bound-output"])
def test_rewrite_touching_a_bound_value_fails_instead_of_dropping_it(rewrite):
    with pytest.raises(ContractError) as info:
        apply_rewrite(kv_model(), rewrite)
    assert info.value.code is ErrorCode.REWRITE_DROPS_BINDING


@pytest.mark.clause("EXP-PRESERVE")
def test_rewrite_of_unbound_values_keeps_bindings():
    def rename_seen(model):
        model.graph.output[2].name = "observed"
        model.graph.node[5].output[0] = "observed"
    result = apply_rewrite(kv_model(), rename_seen)
    assert pairs(result) == [("past_key", "present_key")]
    assert "observed" in Executor(result).output_names


@pytest.mark.clause("EXP-STANDARD")
def test_standard_export_rejects_bindings_unless_lowered():
    with pytest.raises(ContractError) as info:
        export_standard(kv_model())
    assert info.value.code is ErrorCode.EXPORT_PERSISTENCE
    lowered = export_standard(kv_model(), lower=True)
    assert lowered.feedback == (("past_key", "present_key"),)
    serialized = lowered.model.SerializeToString()
    assert schema.parse_model(serialized).graph.persistent_bindings == []  # nothing hidden left


@pytest.mark.clause("EXP-STRUCT")
def test_standard_export_rejects_structured_values():
    with pytest.raises(ContractError) as info:
        export_standard(struct_cache_model(), lower=True)
    assert info.value.code is ErrorCode.EXPORT_UNSUPPORTED


@pytest.mark.clause("EXP-STANDARD", "STATE-EQUIV-LOOP")
def test_lowered_model_in_a_caller_loop_matches_the_state():
    model = kv_model()
    lowered = export_standard(model, lower=True)
    reference = ReferenceEvaluator(lowered.model)

    def run(feeds):
        return dict(zip(reference.output_names, reference.run(None, feeds)))

    initial = {"past_key": np.zeros((1, 0, D), np.float32)}
    sequence = [{"tokens": tokens(*ids)} for ids in ((1, 2), (3,), (4, 5, 6), (7,))]
    state = make_state(model, initial)
    for feeds, expected in zip(sequence, feedback_loop(run, lowered.feedback, initial, sequence)):
        got = state.run(feeds)
        assert got.keys() == expected.keys()
        for name in got:
            np.testing.assert_allclose(got[name], expected[name], rtol=1e-6)

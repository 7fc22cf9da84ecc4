"""Property: for random small models and feed sequences, the state helper gives exactly the outputs of
the spec's manual output-to-input loop, run both on this executor and on onnx's reference evaluator
over the lowered standard model."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto as T
from onnx import helper
from onnx.reference import ReferenceEvaluator

from reference_impl import schema
from reference_impl.executor import Executor
from reference_impl.graph_utils import export_standard
from reference_impl.state import make_state

SHAPE = [3]
BINARY = ["Add", "Sub", "Mul", "Max", "Min"]
UNARY = ["Neg", "Abs", "Identity"]


@st.composite
def stateful_models(draw):
    n_inputs = draw(st.integers(1, 4))
    names = [f"in{i}" for i in range(n_inputs)]
    available = list(names)
    nodes = []
    for index in range(draw(st.integers(1, 6))):
        out = f"v{index}"
        if draw(st.booleans()):
            op = draw(st.sampled_from(BINARY))
            args = [draw(st.sampled_from(available)), draw(st.sampled_from(available))]
        else:
            op = draw(st.sampled_from(UNARY))
            args = [draw(st.sampled_from(available))]
        nodes.append(helper.make_node(op, args, [out]))
        available.append(out)
    bound = draw(st.lists(st.sampled_from(names), unique=True, min_size=1, max_size=n_inputs))
    outputs, bindings = [], []
    for index, input_name in enumerate(bound):
        source = draw(st.sampled_from(available))
        nodes.append(helper.make_node("Identity", [source], [f"next{index}"]))
        outputs.append(f"next{index}")
        bindings.append((input_name, f"next{index}"))
    nodes.append(helper.make_node("Identity", [available[-1]], ["extra"]))
    outputs.append("extra")
    graph = helper.make_graph(nodes, "random",
                              [helper.make_tensor_value_info(n, T.FLOAT, SHAPE) for n in names],
                              [helper.make_tensor_value_info(n, T.FLOAT, SHAPE) for n in outputs])
    model = schema.from_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]))
    for input_name, output_name in bindings:
        model.graph.persistent_bindings.add(input_name=input_name, output_name=output_name)
    fresh = [n for n in names if n not in bound]
    values = st.lists(st.integers(-4, 4), min_size=3, max_size=3).map(lambda v: np.array(v, np.float32))
    initial = {name: draw(values) for name in bound}
    steps = draw(st.lists(st.fixed_dictionaries({name: values for name in fresh}), min_size=1, max_size=5))
    return model, bindings, initial, steps


@pytest.mark.clause("STATE-EQUIV-LOOP", "STATE-UNSELECTED")
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stateful_models())
def test_state_equals_the_manual_feedback_loop(case):
    model, bindings, initial, steps = case
    executor = Executor(model)
    reference = ReferenceEvaluator(export_standard(model, lower=True).model)
    state = make_state(executor, initial)
    loop_values = dict(initial)
    for feeds in steps:
        got = state.run(feeds)
        manual = executor.run({**feeds, **loop_values})
        independent = dict(zip(reference.output_names, reference.run(None, {**feeds, **loop_values})))
        assert got.keys() == manual.keys() == independent.keys()
        for name in got:
            np.testing.assert_array_equal(got[name], manual[name])
            np.testing.assert_array_equal(got[name], independent[name])
        loop_values = {input_name: manual[output_name] for input_name, output_name in bindings}
        assert state.values.keys() == loop_values.keys()
        for name, value in loop_values.items():
            np.testing.assert_array_equal(state.values[name], value)
    assert state.counters.payload_bytes_copied == 0

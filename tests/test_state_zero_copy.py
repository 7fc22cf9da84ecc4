"""Zero copy, measured: counters over many steps, pointer identity across the feedback edge, and a
large model whose serialization/clone/compare entry points are instrumented during state use."""

from __future__ import annotations

import copy

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper
from test_state_models import D, address, empty_cache, kv_model, opsets, struct_cache_model, tokens

from reference_impl import ContractError, ErrorCode, schema
from reference_impl.executor import Executor
from reference_impl.state import Counters, _record, adopt, make_state


def accumulator_model():
    """x <- x + u with a pass-through view of x (fixed-size state, many cheap steps)."""
    nodes = [helper.make_node("Add", ["x", "u"], ["next_x"]), helper.make_node("Identity", ["x"], ["seen_x"])]
    graph = helper.make_graph(nodes, "acc", [helper.make_tensor_value_info(n, T.FLOAT, [4, 4]) for n in "xu"],
                              [helper.make_tensor_value_info(n, T.FLOAT, [4, 4])
                               for n in ("next_x", "seen_x")])
    model = schema.from_onnx(helper.make_model(graph, opset_imports=opsets()))
    model.graph.persistent_bindings.add(input_name="x", output_name="next_x")
    return model


@pytest.mark.clause("ZC-RETAIN", "ZC-VIEWS", "ZC-NO-PAYLOAD-COPY")
def test_zero_bytes_copied_over_a_thousand_steps_with_pointer_identity():
    initial = np.zeros((4, 4), np.float32)
    state = make_state(accumulator_model(), {"x": initial})
    assert address(state.values["x"]) == address(initial)
    u = np.ones((4, 4), np.float32)
    previous = state.values["x"]
    for _step in range(1000):
        out = state.run({"u": u})
        assert address(out["seen_x"]) == address(previous)        # step t+1's input = step t's output
        assert address(state.values["x"]) == address(out["next_x"])  # retained = returned
        previous = out["next_x"]
    assert float(previous[0, 0]) == 1000.0
    counters = state.counters
    assert counters.payload_bytes_copied == 0 and counters.payload_allocations == 0
    assert counters.adopted_leaves >= 1000  # every step adopted its next state


@pytest.mark.clause("ZC-RETAIN", "STATE-WHOLE-STRUCT", "PAY-FIELD-OWNERS")
def test_struct_cache_fields_keep_their_buffers_through_reset_and_views():
    state = make_state(struct_cache_model(), {"cache": empty_cache()})
    out = state.run({"tokens": tokens(1, 2)})
    assert all(address(state.values["cache"][f]) == address(out["next_cache"][f]) for f in ("keys", "values"))
    fresh = empty_cache(3)
    state.reset({"cache": fresh})
    assert all(address(state.values["cache"][f]) == address(fresh[f]) for f in fresh)
    assert state.counters.payload_bytes_copied == 0 and state.counters.payload_allocations == 0


def test_copy_measurement_is_real():
    counters = Counters()
    source = np.arange(8, dtype=np.float32)
    _record(counters, source, source.view())
    assert counters.payload_bytes_copied == 0
    _record(counters, source, source.copy())
    assert counters.payload_bytes_copied == source.nbytes and counters.payload_allocations == 1


@pytest.mark.clause("ZC-ENTRY-POINTS")
def test_numpy_entry_points_are_adopted_by_reference():
    counters = Counters()
    feed = np.arange(6, dtype=np.int64).reshape(2, 3)
    adopted = adopt(feed, "feed", counters, persistent=False)
    assert address(adopted) == address(feed) and not adopted.flags.writeable and feed.flags.writeable
    frozen = np.zeros(3)
    frozen.flags.writeable = False
    assert adopt(frozen, "x", counters, persistent=True) is frozen  # already read-only: no new view
    assert counters.payload_bytes_copied == 0


# ------------------------------------------------------------------------ large-model instrumentation
_SPIED = ("SerializeToString", "SerializePartialToString", "CopyFrom", "MergeFrom", "MergeFromString",
          "ParseFromString", "__deepcopy__", "__copy__", "__eq__", "__ne__", "__hash__", "ByteSize",
          "ListFields", "FindInitializationErrors", "IsInitialized", "DiscardUnknownFields")


@pytest.fixture
def spy(monkeypatch):
    """Record every serialization, clone, hash or comparison of model messages (ours and onnx's)."""
    calls: list[str] = []
    classes = [schema.ModelProto, schema.GraphProto, schema.NodeProto, schema.TensorProto,
               schema.FunctionProto, onnx.ModelProto, onnx.GraphProto, onnx.NodeProto, onnx.TensorProto]
    for cls in classes:
        for name in _SPIED:
            original = getattr(cls, name, None)
            if original is None:
                continue

            def wrapper(self, *args, _name=f"{cls.__module__}.{cls.__name__}.{name}", _orig=original,
                        **kwargs):
                calls.append(_name)
                return _orig(self, *args, **kwargs)
            monkeypatch.setattr(cls, name, wrapper)
    return calls


class Tripwire:
    """Stands in for the model after load: any attribute access is a model scan."""

    def __init__(self, calls):
        object.__setattr__(self, "_calls", calls)

    def __getattribute__(self, name):
        object.__getattribute__(self, "_calls").append(f"model.{name}")
        raise AttributeError(name)


def large_kv_model():
    """The KV model plus ~32 MiB of initializers and a long chain of nodes."""
    model = kv_model()
    big = np.random.default_rng(0).random((8 * 1024 * 1024,), np.float32)
    model.graph.initializer.add().CopyFrom(schema.from_onnx(numpy_helper.from_array(big, "ballast")))
    for i in range(200):
        model.graph.node.add().CopyFrom(schema.from_onnx(
            helper.make_node("Neg", [f"chain{i}" if i else "logits"], [f"chain{i + 1}"])))
    last = helper.make_tensor_value_info("chain200", T.FLOAT, None)
    model.graph.output.add().CopyFrom(schema.from_onnx(last))
    return model


@pytest.mark.clause("STATE-NO-MODEL-SCAN")
def test_large_model_is_never_serialized_cloned_hashed_or_scanned(spy):
    model = large_kv_model()
    executor = Executor(model)  # the explicit load: converting the model is allowed here, and seen
    assert any("SerializeToString" in call for call in spy)
    copy.deepcopy(schema.NodeProto())
    assert any("__deepcopy__" in call for call in spy)  # the instrumentation sees clones too
    spy.clear()
    executor.model = Tripwire(spy)
    state = make_state(executor, {"past_key": np.zeros((1, 0, D), np.float32)})
    for step in range(20):
        out = state.run({"tokens": tokens(step % 16)})
    state.reset({"past_key": np.zeros((1, 1, D), np.float32)})
    state.run({"tokens": tokens(1)})
    assert dict(state.values).keys() == {"past_key"}
    state.close()
    assert spy == []
    assert out["chain200"].shape == (1, 1, 16)


@pytest.mark.clause("ZC-RETAIN", "KV-APPEND-INPLACE")
def test_multi_head_attention_cache_is_retained_as_the_kernels_strided_view():
    """The Attention kernel returns present K/V as prefix views of a head-major capacity buffer; the
    state retains those views as they are (no copy), while a caller's strided buffer is refused."""
    from reference_impl.kv.kernels import kv_kernels

    heads, size = 2, 4
    node = helper.make_node("Attention", ["Q", "K", "V", "", "past_key", "past_value"],
                            ["Y", "present_key", "present_value"])
    info = helper.make_tensor_value_info
    graph = helper.make_graph(
        [node], "mha",
        [info("Q", T.FLOAT, [1, heads, 1, size]), info("K", T.FLOAT, [1, heads, 1, size]),
         info("V", T.FLOAT, [1, heads, 1, size]), info("past_key", T.FLOAT, [1, heads, "p", size]),
         info("past_value", T.FLOAT, [1, heads, "p", size])],
        [info("Y", T.FLOAT, [1, heads, 1, size]), info("present_key", T.FLOAT, [1, heads, "t", size]),
         info("present_value", T.FLOAT, [1, heads, "t", size])])
    model = schema.from_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)]))
    for name in ("key", "value"):
        model.graph.persistent_bindings.add(input_name=f"past_{name}", output_name=f"present_{name}")
    empty = np.zeros((1, heads, 0, size), np.float32)
    state = make_state(Executor(model, kernels=kv_kernels()), {"past_key": empty, "past_value": empty})
    rng = np.random.default_rng(0)
    keys = []
    for _ in range(5):
        q, k, v = (rng.standard_normal((1, heads, 1, size)).astype(np.float32) for _ in range(3))
        out = state.run({"Q": q, "K": k, "V": v})
        keys.append(k)
        assert address(out["present_key"]) == address(state.values["past_key"])
    np.testing.assert_array_equal(state.values["past_key"], np.concatenate(keys, axis=2))
    assert state.counters.payload_bytes_copied == 0
    strided = np.zeros((1, heads, 4, 2 * size), np.float32)[..., ::2]
    with pytest.raises(ContractError) as error:
        state.reset({"past_key": strided, "past_value": empty})
    assert error.value.code is ErrorCode.STATE_UNRETAINABLE


# --------------------------------------------------------------------- no model serialization
_MODEL_COPIES = {"SerializeToString", "SerializePartialToString", "CopyFrom", "MergeFrom", "MergeFromString",
                 "ParseFromString", "ByteSize", "__deepcopy__", "__copy__", "__reduce__", "__reduce_ex__"}


@pytest.mark.clause("STATE-NO-MODEL-SCAN", "STATE-RESOLVE-ONCE")
@pytest.mark.parametrize("variant", ["tensors", "struct", "paged"])
def test_state_never_serializes_or_copies_the_model(variant):
    """Every C-level protobuf call made while a state is built over a loaded session and run is traced:
    none serializes, clones or re-parses the model, so the ``model_serializations`` counter the state
    reports (0) is true. Loading the session itself (the explicit load) is outside the state."""
    import sys

    from reference_impl.executor import Executor
    from reference_impl.kv import qwen
    from reference_impl.kv.kernels import kv_kernels

    config = qwen.QwenConfig()
    executor = Executor(qwen.build(config, variant), kernels=kv_kernels())
    calls: list[str] = []

    def profile(frame, event, arg):
        if event == "c_call" and getattr(arg, "__name__", "") in _MODEL_COPIES:
            calls.append(f"{arg.__qualname__} from {frame.f_code.co_filename}:{frame.f_lineno}")

    sys.setprofile(profile)
    try:
        state = make_state(executor, qwen.initial_values(config, variant))
        for _ in range(3):
            state.run({"input_ids": np.zeros((1, 1), np.int64)})
        state.reset(qwen.initial_values(config, variant))
        state.run({"input_ids": np.zeros((1, 2), np.int64)})
    finally:
        sys.setprofile(None)
    assert calls == []
    assert state.counters.model_serializations == 0 and state.counters.binding_resolutions == 1

"""The spec's state fixtures: retention, feedback, reset, isolation, lifetimes, atomic failure and
cancellation, concurrency, ownership and exact names."""

from __future__ import annotations

import ctypes
import gc
import threading
import weakref

import numpy as np
import pytest
from onnx import TensorProto as T
from onnx import helper
from test_state_models import (
    CACHE_TYPE,
    D,
    address,
    cache_declaration,
    empty_cache,
    kv_model,
    opsets,
    set_struct,
    struct_cache_model,
    tokens,
)

from reference_impl import schema
from reference_impl import state as state_module
from reference_impl.errors import ContractError, ErrorCode
from reference_impl.examples import encoded, spec_struct_types
from reference_impl.executor import LOCAL_DOMAIN, CancelToken, Executor
from reference_impl.state import make_state
from reference_impl.values import EncodedValue, InvocationBorrow, StructValue


def code(fn, *args, **kwargs) -> ErrorCode:
    with pytest.raises(ContractError) as info:
        fn(*args, **kwargs)
    return info.value.code


def empty_past(n: int = 0) -> np.ndarray:
    return np.zeros((1, n, D), np.float32)


def hook_model():
    """x (bound, FLOAT[2]) + u -> Hook -> y (bound back to x); z = Neg(y) is not retained."""
    nodes = [helper.make_node("Add", ["x", "u"], ["a"]),
             helper.make_node("Hook", ["a", "x"], ["y"], domain="test"),
             helper.make_node("Neg", ["y"], ["z"])]
    graph = helper.make_graph(nodes, "hook", [helper.make_tensor_value_info(n, T.FLOAT, [2]) for n in "xu"],
                              [helper.make_tensor_value_info(n, T.FLOAT, [2]) for n in "yz"])
    model = schema.from_onnx(helper.make_model(graph, opset_imports=opsets()))
    model.graph.persistent_bindings.add(input_name="x", output_name="y")
    return model


class Hook:
    """A test kernel whose behaviour each test sets: ``action(inputs, ctx)`` -> output or None."""

    def __init__(self):
        self.action = None
        self.calls = 0

    def __call__(self, inputs, attributes, ctx):
        self.calls += 1
        if self.action is not None:
            result = self.action(inputs, ctx)
            if result is not None:
                return [result]
        return [inputs[0]]


@pytest.fixture
def hooked():
    hook = Hook()
    executor = Executor(hook_model(), kernels={("test", "Hook"): hook})
    state = make_state(executor, {"x": np.zeros(2, np.float32)})
    return state, hook


ONE = np.ones(2, np.float32)


# ------------------------------------------------------------------------------------ retention
@pytest.mark.clause("STATE-UNSELECTED", "ZC-RETAIN", "STATE-EQUIV-LOOP", "ZC-SHARED-STORAGE", "ZC-NO-DUPLICATE")
def test_whole_tensor_retained_and_fed_back_by_buffer():
    state = make_state(kv_model(), {"past_key": empty_past()})
    first = state.run({"tokens": tokens(1, 2)})
    assert set(state.values) == {"past_key"}
    assert state.values["past_key"] is first["present_key"]
    second = state.run({"tokens": tokens(3)})
    assert address(second["seen_past"]) == address(first["present_key"])
    assert second["present_key"].shape == (1, 3, D)
    np.testing.assert_array_equal(second["present_key"][:, :2], first["present_key"])


@pytest.mark.clause("STATE-UNSELECTED", "ZC-EXACT-OUTPUTS")
def test_unselected_outputs_are_not_retained():
    state = make_state(kv_model(), {"past_key": empty_past()})
    out = state.run({"tokens": tokens(1)})
    logits = weakref.ref(out["logits"])
    present = weakref.ref(out["present_key"])
    del out
    gc.collect()
    assert logits() is None  # only the caller held it
    assert present() is state.values["past_key"]


@pytest.mark.clause("STATE-WHOLE-STRUCT", "ZC-RETAIN")
def test_whole_struct_cache_retained_as_one_value():
    model = struct_cache_model()
    model.graph.node.add().CopyFrom(schema.from_onnx(helper.make_node("Identity", ["k"], ["seen_keys"])))
    model.graph.output.add().CopyFrom(schema.from_onnx(
        helper.make_tensor_value_info("seen_keys", T.FLOAT, [1, "n", D])))
    state = make_state(model, {"cache": empty_cache()})
    first = state.run({"tokens": tokens(1, 2)})
    cache = state.values["cache"]
    assert isinstance(cache, StructValue) and cache.type_id == CACHE_TYPE
    assert cache is first["next_cache"] and int(cache["length"]) == 2
    second = state.run({"tokens": tokens(5)})
    assert address(second["seen_keys"]) == address(first["next_cache"]["keys"])
    assert int(state.values["cache"]["length"]) == 3
    assert "logits" in second and "logits" not in state.values


@pytest.mark.clause("STATE-WHOLE-STRUCT", "BIND-WHOLE", "BIND-SHARED-TYPE")
def test_two_values_of_one_struct_type_with_different_bindings():
    state = make_state(struct_cache_model(extra_struct_input=True), {"cache": empty_cache()})
    draft = empty_cache(4)
    out = state.run({"tokens": tokens(1), "draft": draft})
    assert address(out["draft_out"]["keys"]) == address(draft["keys"])
    assert set(state.values) == {"cache"}  # draft shares the type but is not bound


@pytest.mark.clause("BIND-STATELESS-DEFAULT")
def test_no_bindings_runs_stateless():
    state = make_state(kv_model(bind=False), {})
    out = state.run({"tokens": tokens(1), "past_key": empty_past(2)})
    assert dict(state.values) == {} and out["present_key"].shape == (1, 3, D)


# ------------------------------------------------------------------------------- initial and feeds
@pytest.mark.clause("STATE-INITIAL")
def test_initial_values_must_be_exactly_the_bound_inputs():
    model = kv_model()
    assert code(make_state, model, {}) is ErrorCode.STATE_INITIAL_MISSING
    assert code(make_state, model, {"past_key": empty_past(), "tokens": tokens(1)}) is \
        ErrorCode.STATE_INITIAL_UNKNOWN
    assert code(make_state, model, {"past_key": np.zeros((1, 0, D), np.float64)}) is \
        ErrorCode.STATE_VALUE_INCOMPATIBLE
    assert code(make_state, model, {"past_key": np.zeros((1, 0, D + 1), np.float32)}) is \
        ErrorCode.STATE_VALUE_INCOMPATIBLE


@pytest.mark.clause("STATE-FEEDS", "STATE-FEED-OVERRIDE")
def test_feed_rules():
    state = make_state(kv_model(), {"past_key": empty_past()})
    assert code(state.run, {"tokens": tokens(1), "past_key": empty_past()}) is ErrorCode.STATE_FEED_OVERRIDES
    assert code(state.run, {}) is ErrorCode.STATE_FEED_MISSING
    assert code(state.run, {"tokens": tokens(1), "other": ONE}) is ErrorCode.STATE_FEED_UNKNOWN
    assert state.steps == 0


# --------------------------------------------------------------------------------- reset, isolation
@pytest.mark.clause("STATE-RESET", "ZC-RETAIN")
def test_reset_restores_caller_supplied_initial_values_by_buffer():
    state = make_state(kv_model(), {"past_key": empty_past()})
    state.run({"tokens": tokens(1, 2)})
    fresh = np.full((1, 1, D), 7, np.float32)
    state.reset({"past_key": fresh})
    assert address(state.values["past_key"]) == address(fresh) and state.steps == 0
    out = state.run({"tokens": tokens(3)})
    assert address(out["seen_past"]) == address(fresh)
    assert code(state.reset, {}) is ErrorCode.STATE_INITIAL_MISSING
    assert state.values["past_key"].shape == (1, 2, D)  # a rejected reset changes nothing


@pytest.mark.clause("STATE-ISOLATION")
def test_states_over_one_model_are_isolated():
    executor = Executor(kv_model())
    shared = empty_past()
    a = make_state(executor, {"past_key": shared})
    b = make_state(executor, {"past_key": shared})
    a.run({"tokens": tokens(1, 2, 3)})
    b.run({"tokens": tokens(4)})
    assert a.values["past_key"].shape == (1, 3, D) and b.values["past_key"].shape == (1, 1, D)
    a.close()
    assert b.run({"tokens": tokens(5)})["present_key"].shape == (1, 2, D)


# ---------------------------------------------------------------------------------------- lifetimes
@pytest.mark.clause("ZC-OUTSTANDING")
def test_caller_releasing_its_references_keeps_the_state_valid():
    initial = np.random.default_rng(0).random((1, 1, D), np.float32)
    assert initial.base is None  # the caller's array owns its buffer
    expected = initial.copy()
    owner = weakref.ref(initial)
    state = make_state(kv_model(), {"past_key": initial})
    del initial
    gc.collect()
    assert owner() is not None  # the retained view keeps the caller's buffer alive
    out = state.run({"tokens": tokens(1)})
    np.testing.assert_array_equal(out["seen_past"], expected)


@pytest.mark.clause("ZC-OUTSTANDING", "STATE-CLOSE")
def test_outstanding_outputs_and_views_survive_close_and_later_runs():
    state = make_state(kv_model(), {"past_key": empty_past()})
    out = state.run({"tokens": tokens(1, 2)})
    view = state.values
    snapshot = out["present_key"].copy()
    state.run({"tokens": tokens(3)})
    state.reset({"past_key": empty_past()})
    state.close()
    np.testing.assert_array_equal(view["past_key"], snapshot)
    np.testing.assert_array_equal(out["present_key"], snapshot)
    assert code(state.run, {"tokens": tokens(1)}) is ErrorCode.STATE_CLOSED
    assert code(state.reset, {"past_key": empty_past()}) is ErrorCode.STATE_CLOSED
    assert code(lambda: state.values) is ErrorCode.STATE_CLOSED
    state.close()  # harmless


@pytest.mark.clause("ZC-READ-ONLY", "ZC-NO-INPLACE")
def test_retained_buffers_are_read_only_but_callers_objects_untouched():
    initial = empty_past(1)
    state = make_state(kv_model(), {"past_key": initial})
    assert initial.flags.writeable  # the caller's own object is not modified
    with pytest.raises(ValueError):
        state.values["past_key"][...] = 1
    out = state.run({"tokens": tokens(1)})
    with pytest.raises(ValueError):
        out["present_key"][...] = 1


@pytest.mark.clause("ZC-NO-INPLACE", "STATE-ATOMIC")
def test_kernel_cannot_write_into_a_retained_buffer(hooked):
    state, hook = hooked
    state.run({"u": ONE})
    before = state.values

    def scribble(inputs, ctx):
        inputs[1][...] = 99  # x: the retained buffer
    hook.action = scribble
    assert code(state.run, {"u": ONE}) is ErrorCode.STATE_RUN_FAILED
    assert state.values is before
    np.testing.assert_array_equal(before["x"], ONE)


# ------------------------------------------------------------------------------ atomic failure
@pytest.mark.clause("STATE-ATOMIC", "ZC-FAILURE")
def test_failed_run_leaves_state_and_buffers_untouched(hooked):
    state, hook = hooked
    state.run({"u": ONE})
    before, buffer = state.values, state.values["x"]

    def explode(inputs, ctx):
        raise RuntimeError("kernel failure")
    hook.action = explode
    with pytest.raises(ContractError) as info:
        state.run({"u": ONE})
    assert info.value.code is ErrorCode.STATE_RUN_FAILED and "EXECUTION_FAILED" in info.value.message
    assert state.values is before and state.values["x"] is buffer and state.steps == 1
    np.testing.assert_array_equal(buffer, ONE)
    hook.action = None
    np.testing.assert_array_equal(state.run({"u": ONE})["y"], 2 * ONE)


@pytest.mark.clause("STATE-ATOMIC", "ZC-FAILURE")
def test_cancelled_run_leaves_state_untouched(hooked):
    state, hook = hooked
    state.run({"u": ONE})
    before = state.values
    token = CancelToken()
    hook.action = lambda inputs, ctx: token.cancel()
    assert code(state.run, {"u": ONE}, cancel=token) is ErrorCode.STATE_CANCELLED
    assert state.values is before and hook.calls == 2
    np.testing.assert_array_equal(state.values["x"], ONE)


@pytest.mark.clause("STATE-ATOMIC", "BIND-COMPATIBLE", "STATE-VALIDATE-METADATA")
def test_invalid_next_value_is_rejected_before_publication(hooked):
    state, hook = hooked
    before = state.values
    hook.action = lambda inputs, ctx: np.ones(3, np.float32)  # declared FLOAT[2]
    assert code(state.run, {"u": ONE}) is ErrorCode.STATE_VALUE_INCOMPATIBLE
    assert state.values is before


@pytest.mark.clause("PAY-OWNERLESS")
def test_ownerless_borrow_cannot_become_state_or_output(hooked):
    state, hook = hooked
    before = state.values
    scratch = np.zeros(2, np.float32)
    hook.action = lambda inputs, ctx: InvocationBorrow(scratch)
    assert code(state.run, {"u": ONE}) is ErrorCode.STATE_RUN_FAILED
    assert state.values is before


# ---------------------------------------------------------------------------------- concurrency
@pytest.mark.clause("STATE-NO-CONCURRENCY")
def test_reentrant_call_from_a_kernel_is_rejected(hooked):
    state, hook = hooked
    seen = []

    def reenter(inputs, ctx):
        for call in (lambda: state.run({"u": ONE}), lambda: state.reset({"x": ONE}), state.close):
            try:
                call()
            except ContractError as err:
                seen.append(err.code)
    hook.action = reenter
    state.run({"u": ONE})
    assert seen == [ErrorCode.STATE_BUSY] * 3
    assert not state.closed and state.steps == 1


@pytest.mark.clause("STATE-NO-CONCURRENCY", "STATE-NO-RACE")
def test_simultaneous_calls_from_two_threads_are_rejected(hooked):
    state, hook = hooked
    entered, release = threading.Event(), threading.Event()

    def block(inputs, ctx):
        entered.set()
        assert release.wait(10)
    hook.action = block
    worker = threading.Thread(target=state.run, args=({"u": ONE},))
    worker.start()
    try:
        assert entered.wait(10)
        assert code(state.run, {"u": ONE}) is ErrorCode.STATE_BUSY
        assert code(state.reset, {"x": ONE}) is ErrorCode.STATE_BUSY
        assert code(state.close) is ErrorCode.STATE_BUSY
    finally:
        release.set()
        worker.join(10)
    assert state.steps == 1 and hook.calls == 1


# ------------------------------------------------------------------------------------- ownership
@pytest.mark.clause("ZC-ENTRY-POINTS", "PAY-UNSUPPORTED-OWNERSHIP")
@pytest.mark.parametrize("make", [
    lambda: np.zeros((1, 2, 2 * D), np.float32)[:, :, ::2],            # non-contiguous
    lambda: np.zeros((1, 2, D), ">f4"),                                 # foreign byte order
    lambda: np.zeros((1, 2, D), np.float32).tolist(),                   # not a buffer
], ids=["strided", "big-endian", "python-list"])
def test_unretainable_initial_values_rejected_not_copied(make):
    assert code(make_state, kv_model(), {"past_key": make()}) is ErrorCode.STATE_UNRETAINABLE


_KEEP = []


def borrowed(shape, ctype=ctypes.c_float):
    """An array over a raw address: nothing the state could keep alive owns its memory."""
    count = int(np.prod(shape))
    storage = (ctype * count)()
    _KEEP.append(storage)
    pointer = ctypes.cast(storage, ctypes.POINTER(ctype))
    return np.ctypeslib.as_array(pointer, shape=shape), storage


def forward_model():
    """z = Neg(u) is bound back to x; y = Identity(u) forwards the feed to a returned output."""
    nodes = [helper.make_node("Identity", ["u"], ["y"]), helper.make_node("Neg", ["u"], ["z"])]
    graph = helper.make_graph(nodes, "fwd", [helper.make_tensor_value_info(n, T.FLOAT, [2]) for n in "xu"],
                              [helper.make_tensor_value_info(n, T.FLOAT, [2]) for n in "yz"])
    model = schema.from_onnx(helper.make_model(graph, opset_imports=opsets()))
    model.graph.persistent_bindings.add(input_name="x", output_name="z")
    return model


@pytest.mark.clause("PAY-OWNERLESS", "PAY-UNSUPPORTED-OWNERSHIP")
def test_borrowed_raw_pointer_cannot_become_state():
    past, storage = borrowed((1, 2, D))
    assert code(make_state, kv_model(), {"past_key": past}) is ErrorCode.OWNERLESS_BORROW
    owned = np.ctypeslib.as_array(storage).reshape(1, 2, D)  # a ctypes array that owns its memory
    assert address(make_state(kv_model(), {"past_key": owned}).values["past_key"]) == address(owned)


@pytest.mark.clause("PAY-OWNERLESS")
def test_borrowed_feed_may_be_read_but_not_retained_or_returned():
    state = make_state(kv_model(), {"past_key": empty_past()})
    tok, _ = borrowed((1, 1), ctypes.c_int64)
    assert state.run({"tokens": tok})["present_key"].shape == (1, 1, D)  # invocation-only use is fine
    state = make_state(forward_model(), {"x": np.zeros(2, np.float32)})
    before = state.values
    u, _ = borrowed((2,))
    assert code(state.run, {"u": u}) is ErrorCode.OWNERLESS_BORROW
    assert state.values is before
    u = np.ones(2, np.float32)
    out = state.run({"u": u})
    assert out["y"] is u and address(state.values["x"]) == address(out["z"])


def two_output_model():
    """x (bound, FLOAT[2]) + u -> Pair -> y (bound back to x) and w (returned only)."""
    nodes = [helper.make_node("Add", ["x", "u"], ["a"]), helper.make_node("Pair", ["a"], ["y", "w"], domain="test")]
    graph = helper.make_graph(nodes, "pair", [helper.make_tensor_value_info(n, T.FLOAT, [2]) for n in "xu"],
                              [helper.make_tensor_value_info(n, T.FLOAT, [2]) for n in "yw"])
    model = schema.from_onnx(helper.make_model(graph, opset_imports=opsets()))
    model.graph.persistent_bindings.add(input_name="x", output_name="y")
    return model


def _raw(values) -> np.ndarray:
    array, _ = borrowed((2,))
    array[:] = values
    return array


#: (bound output y, returned-only output w, cancel during the run): each a fresh value per call
_OUTPUT_PROBLEMS = {
    "borrow-bound": (lambda a: InvocationBorrow(a), lambda a: a.copy(), False),
    "borrow-returned": (lambda a: a.copy(), lambda a: InvocationBorrow(a), False),
    "ownerless-bound": (_raw, lambda a: a.copy(), False),
    "ownerless-returned": (lambda a: a.copy(), _raw, False),
    "ownerless-bound-borrow-returned": (_raw, lambda a: InvocationBorrow(a), False),
    "wrong-shape-bound-borrow-returned": (lambda a: np.ones(3, np.float32), lambda a: InvocationBorrow(a), False),
    "wrong-shape-bound-ownerless-returned": (lambda a: np.ones(3, np.float32), _raw, False),
    "ownerless-returned-cancelled": (lambda a: a.copy(), _raw, True),
    "valid": (lambda a: a.copy(), lambda a: a.copy(), False),
}


@pytest.mark.clause("PAY-OWNERLESS", "STATE-ATOMIC", "STATE-VALIDATE-METADATA")
@pytest.mark.parametrize("problem", sorted(_OUTPUT_PROBLEMS))
def test_outputs_are_judged_as_by_the_ordered_checks(problem, monkeypatch):
    """A call whose outputs all pass is retained without walking its bound outputs twice; any problem
    is then reported by the checks in their contract order. Either way the verdict, the error and the
    counters are those of the ordered checks alone."""
    make_bound, make_returned, cancelled = _OUTPUT_PROBLEMS[problem]

    def outcome(ordered_only: bool):
        token = CancelToken()

        def pair(inputs, attributes, ctx):
            if cancelled:
                token.cancel()
            return [make_bound(inputs[0]), make_returned(inputs[0])]

        executor = Executor(two_output_model(), kernels={("test", "Pair"): pair})
        state = make_state(executor, {"x": np.zeros(2, np.float32)})
        if ordered_only:
            def refuse(*args):
                raise ContractError(ErrorCode.STATE_RUN_FAILED, "test", "the ordered checks only")
            monkeypatch.setattr(state_module.State, "_retain_valid", refuse)
        before = state.values
        try:
            outputs = state.run({"u": ONE}, cancel=token)
            verdict = ("passed", sorted(outputs), outputs["y"] is state.values["x"])
        except ContractError as err:
            verdict = (err.code, err.path, err.message, err.causes, state.values is before)
        monkeypatch.undo()
        return verdict, state.counters.snapshot()

    fast, ordered = outcome(False), outcome(True)
    assert fast == ordered
    assert (fast[0][0] == "passed") == (problem == "valid")


@pytest.mark.clause("BIND-EXACT-NAMES", "BIND-WHOLE", "BIND-LITERAL-NAMES")
def test_dotted_input_name_is_distinct_from_a_struct_field():
    nodes = [helper.make_node("GetField", ["cache"], ["k"], domain=LOCAL_DOMAIN, field="keys"),
             helper.make_node("Add", ["cache.keys", "k"], ["next.keys"])]
    inputs = [helper.make_tensor_value_info("cache", T.FLOAT, None),
              helper.make_tensor_value_info("cache.keys", T.FLOAT, [1, 1, D])]
    graph = helper.make_graph(nodes, "dotted", inputs,
                              [helper.make_tensor_value_info("next.keys", T.FLOAT, [1, 1, D])])
    model = schema.from_onnx(helper.make_model(graph, opset_imports=opsets()))
    model.struct_types.append(cache_declaration())
    set_struct(model.graph.input[0])
    model.graph.persistent_bindings.add(input_name="cache.keys", output_name="next.keys")
    state = make_state(model, {"cache.keys": np.ones((1, 1, D), np.float32)})
    cache = empty_cache(1).replace(keys=np.full((1, 1, D), 2, np.float32))
    out = state.run({"cache": cache})
    assert set(state.values) == {"cache.keys"}
    np.testing.assert_array_equal(out["next.keys"], np.full((1, 1, D), 3, np.float32))
    assert code(state.run, {"cache": cache, "cache.keys": np.ones((1, 1, D), np.float32)}) is \
        ErrorCode.STATE_FEED_OVERRIDES
    np.testing.assert_array_equal(state.run({"cache": cache})["next.keys"], np.full((1, 1, D), 5, np.float32))


# -------------------------------------------------------------------------------- encoded values
@pytest.mark.clause("ZC-RETAIN", "PAY-READ-ONLY")
def test_encoded_value_retained_by_buffer_and_decoded_explicitly():
    nodes = [helper.make_node("Identity", ["w"], ["next_w"]),
             helper.make_node("Decode", ["w"], ["dense"], domain=LOCAL_DOMAIN)]
    graph = helper.make_graph(nodes, "enc", [helper.make_tensor_value_info("w", T.FLOAT, None)],
                              [helper.make_tensor_value_info("next_w", T.FLOAT, None),
                               helper.make_tensor_value_info("dense", T.FLOAT, [32])])
    model = schema.from_onnx(helper.make_model(graph, opset_imports=opsets()))
    model.struct_types.extend(spec_struct_types())
    for vi in (model.graph.input[0], model.graph.output[0]):
        set_struct(vi, 1102)
    model.graph.persistent_bindings.add(input_name="w", output_name="next_w")
    header = encoded("w", 1102, b"", [32])
    payload = np.frombuffer(bytearray([0xE4] * 8 + [0, 0, 0, 0x40]), np.uint8)
    state = make_state(model, {"w": EncodedValue(header, payload)})
    for _ in range(3):
        out = state.run({})
        assert address(state.values["w"].payload) == address(payload)
    np.testing.assert_array_equal(out["dense"], np.tile(np.float32([-2.0, -0.5, 0.5, 2.0]), 8))
    assert state.counters.payload_bytes_copied == 0

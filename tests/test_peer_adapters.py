"""The lowered peer adapters honour every rule they can with the runtime's public API: an explicit Decode of
an inline affine initializer runs as DequantizeLinear, ownerless borrows never become state or outputs, a
fresh feed the runtime cannot share is copied for its call only, OpenVINO's bf16 memory is read as
bfloat16, and string tensors a runtime cannot take safely are refused with the finding that says why."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import pytest

from conformance.adapters import Rejected
from conformance.adapters.lowering import LoweredState, dequantize_model, lower_affine_initializers
from conformance.adapters.onnx_reference import EvaluatorSession, OnnxReferenceAdapter
from conformance.cases import load_cases, select
from conformance.execute import PASSED, PASSED_WITHOUT_CODE, run_case
from conformance.values import borrow
from reference_impl import schema

CASES = {case.id: case for case in load_cases()}


def _verdict(case_id: str, adapter) -> tuple[str, str]:
    result = run_case(select(CASES.values(), [case_id])[0], adapter, timeout=120)
    return result.verdict, result.message


# ------------------------------------------------------------------- explicit Decode of affine values
@pytest.mark.parametrize("case_id", ["Required.State.Consumers.ExplicitDecodeAccepted",
                                     "Required.State.Parameters.ChangedScaleUnchangedCodes",
                                     "Required.ZeroCopy.ReadOnlyInputs.EncodedInitializerNeverWritten"])
def test_an_explicit_decode_of_an_inline_affine_initializer_runs_on_the_runtime(case_id):
    assert _verdict(case_id, OnnxReferenceAdapter()) == (PASSED, "passed")


def test_the_lowered_decode_is_standard_dequantize_linear():
    model = schema.parse_model(CASES["Required.State.Parameters.ChangedScaleUnchangedCodes"].model_bytes())
    lower_affine_initializers(model)
    plain = schema.to_onnx(model)
    onnx.checker.check_model(plain, full_check=True)
    assert [node.op_type for node in plain.graph.node] == ["DequantizeLinear"] * 3
    assert [node.output[0] for node in plain.graph.node] == ["ya", "yb", "yc"]
    assert not len(model.graph.encoded_initializer)
    assert {entry.domain for entry in plain.opset_import} == {""}


@pytest.mark.parametrize("case_id", ["Required.State.Consumers.TensorOpRejectsEncodedBytes",
                                     "Required.State.Consumers.EightCodeAffineToMul"])
def test_a_tensor_operator_reading_encoded_bytes_is_still_refused(case_id):
    verdict, message = _verdict(case_id, OnnxReferenceAdapter())
    assert verdict == PASSED_WITHOUT_CODE, message


def test_an_external_affine_payload_is_refused_not_read_by_the_adapter():
    case = CASES["Required.ZeroCopy.External.InitializerSurvivesFileRemoval"]
    with pytest.raises(Rejected, match="external payloads are not lowered"):
        OnnxReferenceAdapter().open_state(case.model_bytes(), {"past": np.zeros(4, np.float32)})


# --------------------------------------------------------------------------------- ownerless borrows
OWNERLESS = ["Required.ZeroCopy.Ownerless.InitialValueRejected", "Required.ZeroCopy.Ownerless.ResetValueRejected",
             "Required.ZeroCopy.Ownerless.ForwardedFeedNotRetained",
             "Required.ZeroCopy.Ownerless.ReturnedOutputRejected",
             "Recommended.ZeroCopy.Ownerless.ConsumedFeedAccepted"]


@pytest.mark.parametrize("case_id", OWNERLESS)
def test_an_ownerless_borrow_never_outlives_its_call(case_id):
    assert _verdict(case_id, OnnxReferenceAdapter()) == (PASSED, "passed")


@pytest.mark.parametrize("case_id", OWNERLESS)
def test_an_ownerless_borrow_never_outlives_its_call_on_onnxruntime(case_id):
    pytest.importorskip("onnxruntime")
    from conformance.adapters.ort import OnnxRuntimeAdapter

    assert _verdict(case_id, OnnxRuntimeAdapter()) == (PASSED, "passed")


class ForwardingSession:
    """A session over NumPy arrays whose graph returns its input ``x`` as output ``x`` (no copy); it shares
    only contiguous memory, like onnxruntime's and OpenVINO's bindings."""

    def adopt(self, value):
        if not value.flags.c_contiguous:
            raise Rejected("STATE_UNRETAINABLE", "contiguous buffers only")
        return value

    def run_handles(self, feeds):
        return {"x": feeds["x"], "sum": feeds["past"] + feeds["x"]}

    def to_numpy(self, handle):
        return handle

    def buffer_id(self, value):
        return int(value.__array_interface__["data"][0]) if value.size else None


def test_a_forwarded_ownerless_feed_fails_the_call_and_keeps_the_state():
    state = LoweredState(ForwardingSession(), [("past", "x")], {"past": np.zeros(2, np.float32)})
    with pytest.raises(Rejected) as refused:
        state.run({"x": borrow(np.array([3, 4], np.float32))})
    assert refused.value.code == "OWNERLESS_BORROW"
    np.testing.assert_array_equal(state.values()["past"], [0, 0])


def test_an_ownerless_initial_value_is_refused():
    with pytest.raises(Rejected) as refused:
        LoweredState(ForwardingSession(), [("past", "x")], {"past": borrow(np.array([1, 2], np.float32))})
    assert refused.value.code == "OWNERLESS_BORROW"


# --------------------------------------------------------------------------- unsharable fresh feeds
def test_a_strided_fresh_feed_is_copied_for_its_call_only():
    state = LoweredState(ForwardingSession(), [("past", "sum")], {"past": np.zeros(2, np.float32)})
    strided = np.array([1, 9, 2, 9], np.float32)[::2]
    outputs = state.run({"x": strided})
    np.testing.assert_array_equal(outputs["sum"], [1, 2])


def test_a_copy_of_a_strided_feed_never_becomes_state():
    state = LoweredState(ForwardingSession(), [("past", "x")], {"past": np.zeros(2, np.float32)})
    with pytest.raises(Rejected) as refused:
        state.run({"x": np.array([1, 9, 2, 9], np.float32)[::2]})
    assert refused.value.code == "STATE_UNRETAINABLE"
    np.testing.assert_array_equal(state.values()["past"], [0, 0])


@pytest.mark.parametrize("case_id", ["Recommended.ZeroCopy.Ownership.NonContiguousFreshFeedAccepted",
                                     "Required.ZeroCopy.Ownership.NonContiguousFeedForwardedRetainedOrRejected",
                                     "Required.ZeroCopy.Ownership.NonContiguousInitialRetainedOrRejected"])
def test_strided_values_on_onnxruntime(case_id):
    pytest.importorskip("onnxruntime")
    from conformance.adapters.ort import OnnxRuntimeAdapter

    assert _verdict(case_id, OnnxRuntimeAdapter()) == (PASSED, "passed")


# ------------------------------------------------------------------------------------- OpenVINO
def test_openvino_bfloat16_results_are_bfloat16():
    pytest.importorskip("openvino")
    from conformance.adapters.ov import OpenVinoAdapter

    assert _verdict("Recommended.Affine.Scale.OutputDtype_Bfloat16FromFloatScale", OpenVinoAdapter()) \
        == (PASSED, "passed")


def test_openvino_shares_a_bfloat16_feed():
    pytest.importorskip("openvino")
    from conformance.adapters.ov import OpenVinoAdapter

    model = CASES["Recommended.Affine.Scale.OutputDtype_Bfloat16FromFloatScale"].model_bytes()
    value = schema.parse_model(model).graph.encoded_initializer[0]
    session = OpenVinoAdapter().stateless(dequantize_model(value))
    feed = np.array([1.5, -2], dtype=ml_dtypes.bfloat16)
    tensor = session.adopt(feed)
    assert str(tensor.get_element_type()) == "<Type: 'bfloat16'>"
    assert session.to_numpy(tensor).__array_interface__["data"][0] == feed.__array_interface__["data"][0]
    np.testing.assert_array_equal(session.to_numpy(tensor).astype(np.float32), [1.5, -2])


def test_openvino_refuses_string_tensors_naming_the_finding():
    pytest.importorskip("openvino")
    from conformance.adapters.ov import OpenVinoAdapter

    _, message = _verdict("Required.ZeroCopy.Strings.NonPersistentStringFeedAndOutput", OpenVinoAdapter())
    assert "OV-STRING" in message


def test_tract_refuses_string_tensors_naming_the_finding():
    pytest.importorskip("tract")
    from conformance.adapters.tract_rt import TractAdapter

    _, message = _verdict("Required.ZeroCopy.Strings.NonPersistentStringFeedAndOutput", TractAdapter())
    assert "T-STRINGS" in message


def test_openvino_forgets_a_handed_out_buffer_once_it_is_gone():
    """The adapter-wide map from handed-out addresses to tensors counts an entry only while the array it
    handed out is alive: once that array (and its session's hold on it) is gone, a new caller array at the
    same address is the caller's own memory, not the old tensor (cases failed in sequence, not alone)."""
    pytest.importorskip("openvino")
    import gc

    from conformance.adapters.ov import OpenVinoAdapter, _key

    model = CASES["Recommended.Affine.Scale.OutputDtype_Bfloat16FromFloatScale"].model_bytes()
    value = schema.parse_model(model).graph.encoded_initializer[0]
    session = OpenVinoAdapter().stateless(dequantize_model(value))
    old = np.array([1, 2], np.float32)
    handed = session.to_numpy(session.adopt(old))
    fresh = np.array([7, 8], np.float32)
    session.handed_out[_key(fresh)] = session.handed_out.pop(_key(handed))  # as if fresh took its address
    old[...] = 0
    del handed
    session._keep.clear()
    gc.collect()
    np.testing.assert_array_equal(session.to_numpy(session.adopt(fresh)), [7, 8])


# --------------------------------------------------------------------------- inputs with a default
DEFAULTED_CASES = ["Recommended.State.Feeds.DefaultedInputMayBeOmitted",
                   "Recommended.State.Feeds.DefaultedScalarStepAfterAFedOne"]


class ConstantDefaultSession(EvaluatorSession):
    """A runtime that takes an input with an initializer as a constant, as ONNX permits (OpenVINO folds it
    away and has no port for it; tract loads it as a constant): it refuses a feed for such an input."""

    def __init__(self, model_bytes: bytes):
        super().__init__(model_bytes)
        model = onnx.ModelProto()
        model.ParseFromString(model_bytes)
        self.constants = {t.name for t in model.graph.initializer} & {vi.name for vi in model.graph.input}

    def run_handles(self, feeds: dict) -> dict:
        if set(feeds) & self.constants:
            raise RuntimeError(f"no port for the constant inputs {sorted(set(feeds) & self.constants)}")
        return super().run_handles(feeds)


class ConstantDefaultAdapter(OnnxReferenceAdapter):
    def stateless(self, model_bytes: bytes) -> ConstantDefaultSession:
        return ConstantDefaultSession(model_bytes)


@pytest.mark.parametrize("case_id", DEFAULTED_CASES)
def test_an_input_default_is_fed_by_the_caller_not_left_to_the_runtime(case_id):
    """The lowered model holds no initializer for a graph input: the feedback loop feeds the default when a
    call omits the input and the caller's feed otherwise, whatever the runtime makes of such initializers."""
    assert _verdict(case_id, ConstantDefaultAdapter()) == (PASSED, "passed")


def test_a_bound_inputs_initializer_is_no_default():
    case = CASES["Recommended.State.Initial.InitializerIsNoInitialValue"]
    with pytest.raises(Rejected) as refused:
        ConstantDefaultAdapter().open_state(case.model_bytes(), {})
    assert refused.value.code == "STATE_INITIAL_MISSING"
    state = ConstantDefaultAdapter().open_state(case.model_bytes(), {"past": np.zeros(2, np.float32)})
    assert not state.defaults
    np.testing.assert_array_equal(state.run({"x": np.ones(2, np.float32)})["present"], [1, 1])


@pytest.mark.parametrize("case_id", DEFAULTED_CASES)
@pytest.mark.parametrize("runtime", ["openvino", "tract"])
def test_an_input_default_on_runtimes_that_take_it_as_a_constant(case_id, runtime):
    pytest.importorskip(runtime)
    if runtime == "openvino":
        from conformance.adapters.ov import OpenVinoAdapter as Adapter
    else:
        from conformance.adapters.tract_rt import TractAdapter as Adapter
    assert _verdict(case_id, Adapter()) == (PASSED, "passed")


# ------------------------------------------------------------- what a runtime does, not the adapter
def test_openvino_outputs_are_found_by_the_graph_output_name():
    """OpenVINO folds a DequantizeLinear of FLOAT codes away, and the port it leaves answers to the codes'
    name as well as ``y``: the adapter reads ``y``, so the model (invalid ONNX) is seen to be accepted
    (docs/peer-deviations.md, OV-INVALID), not turned into a code-less rejection by a KeyError."""
    pytest.importorskip("openvino")
    from conformance.adapters.ov import OpenVinoAdapter

    adapter = OpenVinoAdapter()
    case = CASES["Required.Affine.Storage.Rejects_Float"]
    (value,) = schema.parse_model(case.model_bytes()).graph.encoded_initializer
    session = adapter.stateless(dequantize_model(value))
    assert list(session.output_ports) == ["y"]
    assert adapter.verify(case.model_bytes(), None) is None
    assert _verdict(case.id, adapter)[0] == "failed"


@pytest.mark.parametrize("case_id", ["Required.State.Feeds.WrongFeedTypeForwardedIntoState",
                                     "Required.ZeroCopy.Retain.NextCallReceivesSameBuffer",
                                     "Required.KV.Contiguous.FailedAppendLeavesCache"])
def test_tract_is_given_the_declared_input_types(case_id):
    """tract's loader drops the declared type of an input that is also an output, and cannot load Attention
    whose K and V lengths are distinct symbols: given the declared types (concrete ones per call for the
    latter), it runs these models."""
    pytest.importorskip("tract")
    from conformance.adapters.tract_rt import TractAdapter

    assert _verdict(case_id, TractAdapter()) == (PASSED, "passed")


class _RefusingSession:
    """A runtime that loads lazily and lacks an operator of the model: refused at the call."""

    def adopt(self, value):
        return value

    def run_handles(self, feeds):
        from conformance.adapters.lowering import ModelRefused

        raise ModelRefused("no TensorScatter")

    def to_numpy(self, handle):
        return handle

    def buffer_id(self, value):
        return None


class _LazyAdapter(OnnxReferenceAdapter):
    def stateless(self, model_bytes):
        return _RefusingSession()


def test_a_model_refused_at_a_call_is_not_a_failed_call():
    """ZeroCapacityCache expects its write to fail the call (STATE_RUN_FAILED): a runtime lacking the
    operator must not pass it for that reason."""
    verdict, message = _verdict("Required.KV.Capacity.ZeroCapacityCache", _LazyAdapter())
    assert verdict == "not supported" and "no TensorScatter" in message


def test_tract_does_not_pass_the_zero_capacity_case_for_lacking_tensor_scatter():
    pytest.importorskip("tract")
    from conformance.adapters.tract_rt import TractAdapter

    verdict, message = _verdict("Required.KV.Capacity.ZeroCapacityCache", TractAdapter())
    assert verdict not in (PASSED, PASSED_WITHOUT_CODE) and "TensorScatter" in message


# --------------------------------------------------------------------- storage types ONNX cannot name
UNDEFINED_STORAGE = "Required.Affine.Storage.Rejects_Undefined"


def test_an_undefined_storage_type_reaches_the_runtime_as_it_is():
    """storage_type 0 has no NumPy type in onnx.helper: the lowering hands it to the runtime unchanged
    rather than failing to build the codes itself."""
    model = schema.parse_model(CASES[UNDEFINED_STORAGE].model_bytes())
    (value,) = model.graph.encoded_initializer
    lowered = onnx.ModelProto()
    lowered.ParseFromString(dequantize_model(value))
    codes = next(tensor for tensor in lowered.graph.initializer if tensor.name == "x")
    assert (codes.data_type, list(codes.dims), codes.raw_data) == (0, [2], value.raw_data)


def _undefined_storage_rejection(adapter) -> str:
    from conformance.judging import call

    outcome = call(adapter, "verify", CASES[UNDEFINED_STORAGE].model_bytes(), None)
    assert outcome.rejected is not None and outcome.rejected.code is None
    return outcome.rejected.message


def test_the_evaluator_itself_rejects_an_undefined_storage_type():
    """The case passes without code because the runtime refused the codes' type, not because the lowering
    raised KeyError: 0 before the runtime saw the model."""
    message = _undefined_storage_rejection(OnnxReferenceAdapter())
    assert "UNDEFINED" in message and "KeyError" not in message


@pytest.mark.parametrize("module,adapter,says", [
    ("openvino", "ov:OpenVinoAdapter", "Data type is Undefined"),
    ("tract", "tract_rt:TractAdapter", "Unknown DatumType Undefined"),
    ("onnxruntime", "ort:OnnxRuntimeAdapter", "Tensor does not have type information"),
])
def test_each_peer_itself_rejects_an_undefined_storage_type(module, adapter, says):
    pytest.importorskip(module)
    import importlib

    path, name = adapter.split(":")
    message = _undefined_storage_rejection(getattr(importlib.import_module(f"conformance.adapters.{path}"), name)())
    assert says in message and "KeyError" not in message

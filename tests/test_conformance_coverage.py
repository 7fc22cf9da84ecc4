"""Every case of the coverage manifests can fail: for each rule, the reference with one realistic bug
injected (a faulty adapter) fails the cases written against that bug, while the unmodified reference
passes them in process and through the testee.

Faults are injected by patching one reference function or wrapping the state handle, so each faulty
adapter differs from the oracle in exactly the behaviour its docstring names.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import importlib
import sys
import threading
from types import MappingProxyType
from unittest import mock

import ml_dtypes
import numpy as np
import pytest
from test_conformance_faults import _caught

from conformance import values as V
from conformance.adapters import Rejected, load_adapter
from conformance.adapters.reference import ReferenceAdapter, ReferenceState, to_runtime
from conformance.audit.faults.affine import DecodesToFloat32
from conformance.audit.faults.external_ownership import CallerBuffersTakenAsOwned
from conformance.audit.faults.zero_copy import (
    DecodeScratchesInput,
    FieldTransportCopies,
    FunctionInputsDetached,
    IfOutputsDetached,
)
from conformance.cases import builders, load_cases, select
from conformance.execute import PASSED, run_case
from reference_impl import ContractError, ErrorCode, affine, graph_utils, schema
from reference_impl import bindings as bindings_module
from reference_impl import state as state_module
from reference_impl import values as values_module
from reference_impl.errors import violation
from reference_impl.executor import Executor
from reference_impl.executor import kernels as kernels_module
from reference_impl.executor import program as program_module
from reference_impl.values import (
    EncodedValue,
    MapSpec,
    OptionalSpec,
    SequenceSpec,
    StructValue,
    TensorSpec,
    check_value,
)

decode_module = importlib.import_module("reference_impl.decode")  # the package re-exports decode()

#: The manifests of this file's cases.
MANIFESTS = ("cases/affine/scales.toml", "cases/bindings/compatibility.toml", "cases/state/consumers.toml",
             "cases/export/semantics.toml", "cases/zero_copy/ownership.toml", "cases/state/counters.toml",
             "cases/structured/representation.toml", "cases/state/independence.toml", "cases/state/publication.toml",
             "cases/state/structured_state.toml", "cases/zero_copy/transport.toml")
NEW_CASES = [case for case in load_cases() if case.source in MANIFESTS]


# ------------------------------------------------------------------------------------------ plumbing
class Patched(ReferenceAdapter):
    """The reference with reference functions replaced while models load (``load``) and while state
    calls run (``calls``): ``(object, attribute, replacement)`` triples."""

    def __init__(self, load=(), calls=(), state_cls=None):
        super().__init__()
        self.load, self.calls, self.state_cls = list(load), list(calls), state_cls or PatchedState

    @contextlib.contextmanager
    def patches(self, which):
        with contextlib.ExitStack() as stack:
            for target, name, value in which:
                if isinstance(target, dict):
                    stack.enter_context(mock.patch.dict(target, {name: value}))
                else:
                    stack.enter_context(mock.patch.object(target, name, value))
            yield

    def open_state(self, model_bytes, initial, base_dir=None):
        with self.patches(self.load + self.calls):
            handle = super().open_state(model_bytes, initial, base_dir)
        return self.state_cls(handle.state, self)

    def decode(self, model_bytes, value_name, base_dir):
        with self.patches(self.load):
            return super().decode(model_bytes, value_name, base_dir)

    def rewrite(self, model_bytes, rewrite):
        with self.patches(self.load):
            return super().rewrite(model_bytes, rewrite)


class PatchedState(ReferenceState):
    def __init__(self, state, adapter):
        super().__init__(state)
        self.adapter = adapter

    def run(self, feeds):
        with self.adapter.patches(self.adapter.calls):
            return super().run(feeds)

    def reset(self, initial):
        with self.adapter.patches(self.adapter.calls):
            return super().reset(initial)


def _detach(value):
    """A deep copy of a runtime value: what a deep-copy or serialization-based detachment helper gives."""
    if isinstance(value, np.ndarray):
        return value.copy()
    if isinstance(value, StructValue):
        return StructValue({k: _detach(v) for k, v in value.items()}, value.type_id)
    if isinstance(value, EncodedValue):
        return EncodedValue(value.header, value.payload.copy())
    if isinstance(value, list):
        return [_detach(v) for v in value]
    return value


def _copying(kernel_factory):
    """A kernel factory whose kernels return detached copies of their results."""
    def factory(node, session):
        kernel = kernel_factory(node, session)
        return lambda inputs, ctx: [_detach(v) for v in kernel(inputs, ctx)]
    return factory


def _run(adapter, *patterns):
    cases = select(load_cases(), list(patterns))
    assert cases, patterns
    return {case.id: run_case(case, adapter) for case in cases}


def _expect_caught(adapter, patterns, *expected):
    caught = _caught(adapter, *patterns)
    missing = [case_id for case_id in expected if case_id not in caught]
    assert not missing, f"not caught: {missing}; caught: {caught}"


# --------------------------------------------------------------------- A. all-or-nothing publication
class PublishesBindingByBinding(PatchedState):
    """Validates and publishes bound outputs one at a time: those before a bad one stay published."""

    def run(self, feeds):
        try:
            return super().run(feeds)
        except ContractError as error:
            if error.code is not ErrorCode.STATE_VALUE_INCOMPATIBLE:
                raise
            state = self.state
            merged = {**{k: to_runtime(v) for k, v in feeds.items()}, **state.values}
            outputs = state._executor.run(merged, check_feeds=False)
            published = dict(state.values)
            for binding in state.bindings:
                try:
                    check_value(outputs[binding.output_name], binding.spec, "output")
                except ContractError:
                    break
                published[binding.input_name] = outputs[binding.output_name]
            state._values = MappingProxyType(published)
            raise


PUBLICATION = ["Required.State.Publication", "Required.State.Atomic"]


@pytest.mark.clause("STATE-ATOMIC", "STATE-VALIDATE-METADATA")
def test_unvalidated_outputs_are_caught():
    skips = Patched(calls=[(state_module, "check_value", lambda *args, **kw: None)])
    _expect_caught(skips, PUBLICATION, "Required.State.Atomic.OutputFailsValidation",
                   "Required.State.Publication.GrownOutputRejected",
                   "Required.State.Publication.LaterBindingBadNothingPublished",
                   "Required.State.Publication.LaterBindingBadOutputsReordered",
                   "Required.State.Publication.StructFieldBadNothingPublished")


@pytest.mark.clause("STATE-ATOMIC")
def test_binding_by_binding_publication_is_caught():
    _expect_caught(Patched(state_cls=PublishesBindingByBinding), PUBLICATION,
                   "Required.State.Publication.LaterBindingBadNothingPublished",
                   "Required.State.Publication.LaterBindingBadOutputsReordered",
                   "Required.State.Publication.StructFieldBadNothingPublished")


# ----------------------------------------------------------------------- A. binding compatibility
_INCOMPATIBILITY = values_module.incompatibility
_STRING_PATH = values_module.string_path


def _rank_only(a, b):
    """Element type and rank, never the fixed dimensions."""
    if isinstance(a, TensorSpec) and isinstance(b, TensorSpec) and a.dims is not None and b.dims is not None:
        return None if a.elem_type == b.elem_type and len(a.dims) == len(b.dims) else "differ"
    return _INCOMPATIBILITY(a, b)


def _top_level_only(a, b):
    """Containers and structs compared by kind only, tensors in full."""
    if isinstance(a, TensorSpec) or type(a) is not type(b):
        return _INCOMPATIBILITY(a, b)
    return None


def _compat(fn):
    return Patched(load=[(bindings_module, "incompatibility", fn), (values_module, "incompatibility", fn)])


DIMENSIONS = ["Required.Bindings.Dimensions"]
CONTAINER_ROWS = ["SequenceElementDimConflict", "OptionalElementDimConflict", "MapValueDimConflict",
                  "StructFieldDimConflict", "NestedStructFieldDimConflict", "SequenceFieldDimConflict",
                  "SequenceOfStructsDimConflict"]


@pytest.mark.clause("BIND-COMPATIBLE")
def test_fixed_dimensions_ignored_is_caught():
    _expect_caught(_compat(_rank_only), DIMENSIONS,
                   *[f"Required.Bindings.Dimensions.{row}" for row in ["FixedDimConflict", "InnerDimConflict"]
                     + CONTAINER_ROWS])


@pytest.mark.clause("BIND-COMPATIBLE")
def test_containers_compared_by_kind_only_is_caught():
    _expect_caught(_compat(_top_level_only), DIMENSIONS,
                   *[f"Required.Bindings.Dimensions.{row}" for row in CONTAINER_ROWS])


@pytest.mark.clause("BIND-COMPATIBLE")
def test_rejecting_container_bindings_is_caught():
    """Over-strict: any binding of a container or inline struct is refused as incompatible."""
    def refuses_containers(a, b):
        return None if isinstance(a, TensorSpec) else "containers are not supported"
    _expect_caught(_compat(refuses_containers), ["Recommended.Bindings.Dimensions"],
                   *[f"Recommended.Bindings.Dimensions.Agreeing{row}"
                     for row in ("Sequence", "Optional", "InlineStruct", "SequenceField")])


def _shallow_strings(spec, path):
    """Strings found in tensors, struct fields and constants, but not through sequences, optionals, maps."""
    if isinstance(spec, (SequenceSpec, OptionalSpec, MapSpec)):
        return None
    return _STRING_PATH(spec, path)


STRINGS = ["Required.Bindings.Strings"]


@pytest.mark.clause("BIND-NO-STRINGS")
def test_strings_through_containers_missed_is_caught():
    adapter = Patched(load=[(bindings_module, "string_path", _shallow_strings),
                            (values_module, "string_path", _shallow_strings)])
    _expect_caught(adapter, STRINGS, *[f"Required.Bindings.Strings.{row}" for row in (
        "SequenceOfStrings", "OptionalString", "OptionalMapOfStrings", "SequenceOfStructsWithStringField",
        "ReferencedOptionalStringField")])


@pytest.mark.clause("BIND-NO-STRINGS")
def test_strings_checked_only_on_values_is_caught():
    adapter = Patched(load=[(bindings_module, "string_path", lambda spec, path: None)])
    _expect_caught(adapter, STRINGS, *[case.id for case in select(load_cases(), STRINGS)])


# ------------------------------------------------------------------------------ A. scale types
class Bfloat16ReadAsFloat16(ReferenceAdapter):
    """Reads a BFLOAT16 scale's bits as FLOAT16 (the two 16-bit float types confused)."""

    def decode(self, model_bytes, value_name, base_dir):
        model = schema.parse_model(model_bytes)
        confused = False
        for value in model.graph.encoded_initializer:
            if value.WhichOneof("layout") == "affine" and value.affine.scale.data_type == 16:
                value.affine.scale.data_type = 10
                value.logical_type.tensor_type.elem_type = 10
                confused = True
        result = super().decode(model.SerializeToString(), value_name, base_dir)
        return result.astype(ml_dtypes.bfloat16) if confused else result


_DEQUANTIZE = affine.dequantize


def _double_in_float32(codes, storage_type, scale, zero_point, axis, block_size, shape):
    """A DOUBLE scale rounded to FLOAT, the product computed in FLOAT, then widened."""
    scale = np.asarray(scale)
    if scale.dtype == np.float64:
        narrow = _DEQUANTIZE(codes, storage_type, scale.astype(np.float32), zero_point, axis, block_size, shape)
        return narrow.astype(np.float64)
    return _DEQUANTIZE(codes, storage_type, scale, zero_point, axis, block_size, shape)


SCALES = ["Required.Affine.ScaleType"]


@pytest.mark.clause("AFF-SCALE")
def test_bfloat16_scale_read_as_float16_is_caught():
    _expect_caught(Bfloat16ReadAsFloat16(), SCALES, *[f"Required.Affine.ScaleType.Bfloat16.{g}"
                                                      for g in ("PerTensor", "PerAxis", "Blocked")])


@pytest.mark.clause("AFF-SCALE", "AFF-DQ")
def test_double_scale_computed_in_float_is_caught():
    _expect_caught(Patched(load=[(affine, "dequantize", _double_in_float32)]), SCALES,
                   *[f"Required.Affine.ScaleType.Double.{g}" for g in ("PerTensor", "PerAxis", "Blocked")])


@pytest.mark.clause("AFF-SCALE")
def test_every_scale_decoded_as_float_is_caught():
    _expect_caught(DecodesToFloat32(), SCALES, *[f"Required.Affine.ScaleType.{t}.{g}"
                                                 for t in ("Float16", "Bfloat16", "Double")
                                                 for g in ("PerTensor", "PerAxis", "Blocked")])


@pytest.mark.clause("AFF-SCALE", "AFF-DQ")
@pytest.mark.parametrize("scale_type", ["float", "float16", "bfloat16"])
@pytest.mark.parametrize("granularity", ["tensor", "axis", "block", "two_bit"])
def test_scale_expectations_equal_onnx_dequantize_linear(scale_type, granularity):
    """The builder's formula and onnx's reference DequantizeLinear agree exactly for every scale type
    ONNX admits (DOUBLE is the spec's addition; its values follow the same formula)."""
    import onnx
    from onnx import helper
    from onnx.reference import ReferenceEvaluator

    built = builders()["affine_scale"](scale_type, granularity)
    from corpus.builders.affine_scales import SCALE_TYPES
    value = built["model"].graph.encoded_initializer[0]
    layout = value.affine
    dims = list(built["codes"].shape)
    inits = [helper.make_tensor("x", layout.storage_type, dims, vals=value.raw_data, raw=True),
             schema.to_onnx(_named(layout.scale, "s"))]
    inputs = ["x", "s"]
    if layout.HasField("zero_point"):
        inits.append(schema.to_onnx(_named(layout.zero_point, "z")))
        inputs.append("z")
    attrs = {key: getattr(layout, key) for key in ("axis", "block_size") if layout.HasField(key)}
    node = helper.make_node("DequantizeLinear", inputs, ["y"], **attrs)
    data_type = SCALE_TYPES[scale_type][0]
    graph = helper.make_graph([node], "dq", [], [helper.make_tensor_value_info("y", data_type, dims)], inits)
    onnx_model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 25)])
    got = ReferenceEvaluator(onnx_model).run(None, {})[0]
    assert got.dtype == built["expected"].dtype
    assert np.array_equal(got.astype(np.float64), built["expected"].astype(np.float64))
    assert isinstance(onnx_model, onnx.ModelProto)


def _named(tensor, name):
    copy = type(tensor)()
    copy.CopyFrom(tensor)
    copy.name = name
    return copy


# ------------------------------------------------------------------- C. transport keeps owners
_FUNCTION_CALL, _IF = program_module._function_call, program_module._if


TRANSPORT = ["Required.ZeroCopy.Transport", "Recommended.ZeroCopy.Transport", "Required.ZeroCopy.Structured"]


@pytest.mark.clause("ZC-TRANSPORT")
def test_function_boundary_copies_are_caught():
    _expect_caught(FunctionInputsDetached(), TRANSPORT,
                   "Required.ZeroCopy.Transport.ThroughFunction",
                   "Required.ZeroCopy.Transport.WholeStructThroughIfAndFunction",
                   "Required.ZeroCopy.Transport.EncodedThroughFunctionAndIf")


@pytest.mark.clause("ZC-TRANSPORT")
def test_if_branch_copies_are_caught():
    _expect_caught(IfOutputsDetached(), TRANSPORT,
                   "Recommended.ZeroCopy.Transport.ThroughIfBranches",
                   "Required.ZeroCopy.Transport.WholeStructThroughIfAndFunction",
                   "Required.ZeroCopy.Transport.EncodedThroughFunctionAndIf")


@pytest.mark.clause("ZC-TRANSPORT", "PAY-FIELD-OWNERS")
def test_field_transport_copies_are_caught():
    _expect_caught(FieldTransportCopies(), TRANSPORT,
                   "Required.ZeroCopy.Transport.StructFieldsThroughGetFieldMakeStruct",
                   "Required.ZeroCopy.Structured.ResetStructRetainedByBuffer",
                   "Required.ZeroCopy.Structured.NextCallReceivesStructBuffers")


def _neutral_copy(value):
    """Struct and encoded values copied (as a runtime materializing them on entry would)."""
    if isinstance(value, V.Struct):
        return V.Struct({k: _neutral_copy(v) if isinstance(v, (V.Struct, V.Encoded)) else np.array(v)
                         for k, v in value.items()}, value.type_id)
    if isinstance(value, V.Encoded):
        return V.Encoded(value.header, value.payload.copy())
    return value


class CopiesStructuredEntries(ReferenceAdapter):
    """Materializes struct and encoded initial values, reset values and feeds before retaining them."""

    def open_state(self, model_bytes, initial, base_dir=None):
        handle = super().open_state(model_bytes, {k: _neutral_copy(v) for k, v in initial.items()}, base_dir)
        return _CopyingEntriesState(handle.state)


class _CopyingEntriesState(ReferenceState):
    def run(self, feeds):
        return super().run({k: _neutral_copy(v) for k, v in feeds.items()})

    def reset(self, initial):
        return super().reset({k: _neutral_copy(v) for k, v in initial.items()})


@pytest.mark.clause("ZC-RETAIN")
def test_structured_entries_copied_are_caught():
    _expect_caught(CopiesStructuredEntries(), TRANSPORT,
                   "Required.ZeroCopy.Structured.ResetStructRetainedByBuffer",
                   "Required.ZeroCopy.Structured.ResetEncodedRetainedByBuffer",
                   "Required.ZeroCopy.Structured.ForwardedFeedsBecomeState")


# --------------------------------------------------------------------------- B. ownerless borrows
class _Unborrowing(ReferenceState):
    def run(self, feeds):
        return super().run({k: _unborrow(v) for k, v in feeds.items()})

    def reset(self, initial):
        return super().reset({k: _unborrow(v) for k, v in initial.items()})


def _unborrow(value):
    return value.copy() if V.is_ownerless(value) else value


class CopiesOwnerlessBorrows(ReferenceAdapter):
    """Repairs ownerless borrows with a hidden copy instead of rejecting them."""

    def open_state(self, model_bytes, initial, base_dir=None):
        handle = super().open_state(model_bytes, {k: _unborrow(v) for k, v in initial.items()}, base_dir)
        return _Unborrowing(handle.state)


OWNERLESS_REQUIRED = [f"Required.ZeroCopy.Ownerless.{name}" for name in (
    "ForwardedFeedNotRetained", "ReturnedOutputRejected", "InitialValueRejected", "ResetValueRejected")]


@pytest.mark.clause("PAY-OWNERLESS")
def test_ownerless_borrows_retained_are_caught():
    _expect_caught(CallerBuffersTakenAsOwned(), ["Required.ZeroCopy.Ownerless"], *OWNERLESS_REQUIRED)


@pytest.mark.clause("PAY-OWNERLESS", "PAY-UNSUPPORTED-OWNERSHIP")
def test_ownerless_borrows_copied_are_caught():
    """A copy of a borrow that becomes state is a hidden repair; a copy returned through Identity is not
    told apart from an Identity kernel computing a new buffer (allowed), so ReturnedOutputRejected passes."""
    _expect_caught(CopiesOwnerlessBorrows(), ["Required.ZeroCopy.Ownerless"],
                   *[case_id for case_id in OWNERLESS_REQUIRED if not case_id.endswith("ReturnedOutputRejected")])


@pytest.mark.clause("PAY-OWNERLESS")
def test_every_ownerless_feed_refused_is_caught():
    """Over-strict: a borrow only read during the call is refused too."""
    class RefusesBorrows(ReferenceAdapter):
        def open_state(self, model_bytes, initial, base_dir=None):
            handle = super().open_state(model_bytes, initial, base_dir)
            return _RefusingState(handle.state)

    class _RefusingState(ReferenceState):
        def run(self, feeds):
            if any(V.is_ownerless(v) for v in feeds.values()):
                raise Rejected("OWNERLESS_BORROW", "borrowed buffers are not accepted")
            return super().run(feeds)

    _expect_caught(RefusesBorrows(), ["Recommended.ZeroCopy.Ownerless"],
                   "Recommended.ZeroCopy.Ownerless.ConsumedFeedAccepted")


def test_ownerless_literal_crosses_the_protocol_as_a_borrow():
    from conformance import protocol as P

    lent = V.build({"dtype": "float32", "shape": [2], "data": [1, 2], "ownerless": True})
    assert V.is_ownerless(lent) and not V.is_ownerless(np.ones(2))
    message = P.MESSAGES["Value"]()
    P.to_proto(lent, message)
    assert message.tensor.ownerless
    back = P.from_proto(message)
    assert V.is_ownerless(back) and back.tolist() == [1.0, 2.0]


# -------------------------------------------------------------------------- B. read-only inputs
_DECODE_FACTORY = kernels_module.LOCAL_KERNELS["Decode"]

READ_ONLY = ["Required.ZeroCopy.ReadOnlyInputs", "Recommended.ZeroCopy.ReadOnlyInputs"]


@pytest.mark.clause("PAY-READ-ONLY")
def test_encoded_inputs_written_are_caught():
    _expect_caught(DecodeScratchesInput(), READ_ONLY, "Required.ZeroCopy.ReadOnlyInputs.RetainedEncodedNeverWritten",
                   "Required.ZeroCopy.ReadOnlyInputs.EncodedFeedNeverWritten",
                   "Required.ZeroCopy.ReadOnlyInputs.EncodedInitializerNeverWritten")


@pytest.mark.clause("PAY-READ-ONLY", "ZC-READ-ONLY")
def test_writable_encoded_views_are_caught():
    class WritableEncoded(ReferenceState):
        def run(self, feeds):
            return {k: _writable(v) for k, v in super().run(feeds).items()}

        def values(self):
            return {k: _writable(v) for k, v in super().values().items()}

    class HandsOutWritable(ReferenceAdapter):
        def open_state(self, model_bytes, initial, base_dir=None):
            return WritableEncoded(super().open_state(model_bytes, initial, base_dir).state)

    _expect_caught(HandsOutWritable(), READ_ONLY, "Recommended.ZeroCopy.ReadOnlyInputs.EncodedViewsHandedOutReadOnly")


def _writable(value):
    return V.Encoded(value.header, value.payload.copy()) if isinstance(value, V.Encoded) else value


# ------------------------------------------------------------------------ B. external mappings
def _lazy_to_proto(self):
    """The source message as loaded: an external value is read from its file again."""
    if self.source is not None:
        return self.source
    proto = type(self.header)()
    proto.CopyFrom(self.header)
    proto.raw_data = self.payload.tobytes()
    return proto


@pytest.mark.clause("PAY-EXTERNAL-OWNER")
def test_external_payloads_read_again_are_caught():
    adapter = Patched(load=[(EncodedValue, "to_proto", _lazy_to_proto)],
                      calls=[(EncodedValue, "to_proto", _lazy_to_proto)])
    _expect_caught(adapter, ["Required.ZeroCopy.External"],
                   "Required.ZeroCopy.External.RetainedValueKeepsItsMapping",
                   "Required.ZeroCopy.External.InitializerSurvivesFileRemoval")


# ----------------------------------------------------------------------------------- B. arena
class RecyclingArena(ReferenceState):
    """Computes every output into a two-slot arena per output name and recycles a slot as soon as the
    state itself no longer holds it, ignoring the caller's outstanding views."""

    def __init__(self, state):
        super().__init__(state)
        self.slots: dict[str, list[np.ndarray]] = {}
        self.calls = 0

    def _slot(self, name, array):
        ring = self.slots.setdefault(name, [np.empty_like(array), np.empty_like(array)])
        slot = ring[self.calls % 2]
        np.copyto(slot, array)
        return slot

    def run(self, feeds):
        outputs = super().run(feeds)
        held = {id(v) for v in feeds.values()}
        placed = {name: self._slot(name, value) if isinstance(value, np.ndarray) and id(value) not in held
                  else value for name, value in outputs.items()}
        self.state._values = MappingProxyType({b.input_name: placed[b.output_name] for b in self.state.bindings})
        self.calls += 1
        return placed


class RecyclesArena(ReferenceAdapter):
    def open_state(self, model_bytes, initial, base_dir=None):
        return RecyclingArena(super().open_state(model_bytes, initial, base_dir).state)


@pytest.mark.clause("PAY-ARENA", "ZC-OUTSTANDING")
def test_arena_recycled_while_referenced_is_caught():
    _expect_caught(RecyclesArena(), ["Required.ZeroCopy.Arena", "Required.ZeroCopy.Outstanding"],
                   "Required.ZeroCopy.Arena.UnselectedOutputNotRecycled",
                   "Required.ZeroCopy.Arena.RetainedViewNotRecycledAfterReset",
                   "Required.ZeroCopy.Outstanding.SurvivesLaterRuns")


# ---------------------------------------------------------------------------------- B. counters
class HashesModelEachCall(ReferenceState):
    """Detects model mutation by hashing the serialized model on every call (and says so)."""

    def _scan(self):
        hashlib.sha256(self.state._executor.model.SerializeToString()).hexdigest()
        self.state.counters.model_serializations += 1

    def run(self, feeds):
        self._scan()
        return super().run(feeds)

    def reset(self, initial):
        self._scan()
        return super().reset(initial)


class ResolvesEachCall(ReferenceState):
    """Resolves the bindings against the model again on every call (and counts it)."""

    def run(self, feeds):
        executor = self.state._executor
        bindings_module.validate_bindings(executor.model, executor.catalogue)
        self.state.counters.binding_resolutions += 1
        return super().run(feeds)


def _with_state(state_cls):
    class Faulty(ReferenceAdapter):
        def open_state(self, model_bytes, initial, base_dir=None):
            return state_cls(super().open_state(model_bytes, initial, base_dir).state)
    return Faulty()


MODEL_USE = ["Required.State.ModelUse"]
MODEL_USE_CASES = [f"Required.State.ModelUse.{name}" for name in (
    "NoModelSerializationAcrossCalls", "StructuredStateNoModelScan", "RenamedModelResolvedOnce")]


@pytest.mark.clause("STATE-NO-MODEL-SCAN")
def test_model_serialized_per_call_is_caught():
    _expect_caught(_with_state(HashesModelEachCall), MODEL_USE, *MODEL_USE_CASES)


@pytest.mark.clause("STATE-RESOLVE-ONCE")
def test_bindings_resolved_per_call_is_caught():
    _expect_caught(_with_state(ResolvesEachCall), MODEL_USE, *MODEL_USE_CASES)


def test_runtime_without_counters_is_not_supported():
    class Silent(ReferenceState):
        counters = None

    class NoCounters(ReferenceAdapter):
        def open_state(self, model_bytes, initial, base_dir=None):
            return Silent(super().open_state(model_bytes, initial, base_dir).state)

    results = _run(NoCounters(), *MODEL_USE)
    assert {r.verdict for r in results.values()} == {"not supported"}


# ------------------------------------------------------------------------ C. independent states
class GlobalBusyLock(ReferenceAdapter):
    """One busy flag for every state of the runtime: a call on another state is refused as busy."""

    def __init__(self):
        super().__init__()
        self.lock = threading.Lock()

    def open_state(self, model_bytes, initial, base_dir=None):
        return _GloballyLocked(super().open_state(model_bytes, initial, base_dir).state, self.lock)


class _GloballyLocked(ReferenceState):
    def __init__(self, state, lock):
        super().__init__(state)
        self.lock = lock

    def run(self, feeds):
        if not self.lock.acquire(blocking=False):
            raise Rejected("STATE_BUSY", "a call is already active")
        try:
            return super().run(feeds)
        finally:
            self.lock.release()


@pytest.mark.clause("STATE-ISOLATION")
def test_busy_across_states_is_caught():
    _expect_caught(GlobalBusyLock(), ["Required.State.Independent"],
                   "Required.State.Independent.TwoStatesRunAtOnce",
                   "Required.State.Independent.ThreeStatesTwoRounds")


# ---------------------------------------------------------------------------- C. export, rename
def _lowered(adapter, model_bytes, edit):
    import onnx

    data, feedback = ReferenceAdapter.export(adapter, model_bytes, "onnx-lowered")
    model = onnx.ModelProto()
    model.ParseFromString(data)
    feedback = edit(model, feedback)
    return model.SerializeToString(), feedback


class LoweringSwapsOperator(ReferenceAdapter):
    """Its lowering writes Sub for the first Add (and Add for the first Sub)."""

    def export(self, model_bytes, target):
        if target != "onnx-lowered":
            return super().export(model_bytes, target)

        def swap(model, feedback):
            node = next(n for n in model.graph.node if n.op_type in ("Add", "Sub"))
            node.op_type = "Sub" if node.op_type == "Add" else "Add"
            return feedback
        return _lowered(self, model_bytes, swap)


class LoweringPairsByPosition(ReferenceAdapter):
    """Its feedback pairs bound inputs with bound outputs in graph output order, not by the bindings."""

    def export(self, model_bytes, target):
        if target != "onnx-lowered":
            return super().export(model_bytes, target)

        def positional(model, feedback):
            bound = {o for _, o in feedback}
            outputs = [vi.name for vi in model.graph.output if vi.name in bound]
            return [(i, o) for (i, _), o in zip(feedback, outputs)]
        return _lowered(self, model_bytes, positional)


class IgnoresNestedBindings(ReferenceAdapter):
    """Exports after silently dropping the bindings of subgraphs."""

    def export(self, model_bytes, target):
        model = schema.parse_model(model_bytes)
        nodes = list(model.graph.node) + [node for function in model.functions for node in function.node]
        while nodes:
            for attribute in nodes.pop().attribute:
                if attribute.type == 5:  # GRAPH
                    attribute.g.ClearField("persistent_bindings")
                    nodes.extend(attribute.g.node)
        return super().export(model.SerializeToString(), target)


class DropsExternalOffset(ReferenceAdapter):
    """Saves external payload references without their offset (as if every payload began the file)."""

    def _drop(self, model_bytes):
        model = schema.parse_model(model_bytes)
        for value in model.graph.encoded_initializer:
            keep = [entry for entry in value.external_data if entry.key != "offset"]
            del value.external_data[:]
            value.external_data.extend(keep)
        return model.SerializeToString()

    def export(self, model_bytes, target):
        return super().export(self._drop(model_bytes), target)

    def roundtrip(self, model_bytes):
        return super().roundtrip(self._drop(model_bytes))


class LosesSequenceElementTypes(ReferenceAdapter):
    """Saves sequence field types without their element type."""

    def roundtrip(self, model_bytes):
        model = schema.parse_model(super().roundtrip(model_bytes))
        for declaration in model.struct_types:
            for field in declaration.structure.field:
                if field.type.WhichOneof("value") == "sequence_type":
                    field.type.sequence_type.ClearField("elem_type")
        return model.SerializeToString()


class KeepsOneValuePerType(ReferenceAdapter):
    """Saves one encoded value per struct type ID (the first), as if the type identified the value."""

    def export(self, model_bytes, target):
        model = schema.parse_model(super().export(model_bytes, target))
        seen, keep = set(), []
        for value in model.graph.encoded_initializer:
            key = value.struct_type.type_ref if value.WhichOneof("layout") == "struct_type" else id(value)
            if key not in seen:
                seen.add(key)
                keep.append(value)
        del model.graph.encoded_initializer[:]
        model.graph.encoded_initializer.extend(keep)
        return model.SerializeToString()


def _rename_root_only(nodes, old, new):
    for node in nodes:
        node.input[:] = [new if name == old else name for name in node.input]
        node.output[:] = [new if name == old else name for name in node.output]


EXPORT = ["Required.Export.Lowered", "Required.Export.Nested", "Required.Export.Rename", "Required.Export.Preserve"]


@pytest.mark.clause("EXP-STANDARD", "STATE-EQUIV-LOOP")
def test_lowering_that_swaps_an_operator_is_caught():
    _expect_caught(LoweringSwapsOperator(), EXPORT, "Required.Export.Lowered.CallerLoopMatchesState",
                   "Required.Export.Lowered.TwoBindingsCallerLoopMatchesState")


@pytest.mark.clause("EXP-STANDARD")
def test_lowering_with_positional_feedback_is_caught():
    _expect_caught(LoweringPairsByPosition(), EXPORT, "Required.Export.Lowered.TwoBindingsCallerLoopMatchesState")


@pytest.mark.clause("EXP-STANDARD", "BIND-ROOT-ONLY")
def test_nested_bindings_dropped_on_export_are_caught():
    _expect_caught(IgnoresNestedBindings(), EXPORT, *[f"Required.Export.Nested.{name}" for name in (
        "LoweringRejectsIfBranchBindings", "StandardRejectsIfBranchBindings", "StandardRejectsFunctionBodyBindings",
        "LoweringRejectsFunctionBodyBindings")])


@pytest.mark.clause("EXP-RENAME")
def test_rename_skipping_subgraphs_is_caught():
    _expect_caught(Patched(load=[(graph_utils, "_rename_in_nodes", _rename_root_only)]), EXPORT,
                   "Required.Export.Rename.RenamedValueReadInIfBranch")


@pytest.mark.clause("EXP-RENAME")
def test_rename_forgetting_bindings_is_caught():
    def forgets(model, old, new):
        clone = graph_utils.copy_model(model)
        for group in (clone.graph.input, clone.graph.output):
            for item in group:
                if item.name == old:
                    item.name = new
        graph_utils._rename_in_nodes(clone.graph.node, old, new)
        return clone
    _expect_caught(Patched(load=[(graph_utils, "rename_value", forgets)]), EXPORT + ["Required.State.ModelUse"],
                   "Required.Export.Rename.RenamedBindingsFeedBack", "Required.State.ModelUse.RenamedModelResolvedOnce")


@pytest.mark.clause("EXP-PRESERVE-STRUCT")
def test_external_offset_lost_on_save_is_caught():
    _expect_caught(DropsExternalOffset(), EXPORT, "Required.Export.Preserve.ExternalAffineRoundTrip",
                   "Required.Export.Preserve.ExternalAffineExplicitRoundTrip",
                   "Required.Export.Preserve.SavedAndLoadedStateRuns")


@pytest.mark.clause("WIRE-ROUNDTRIP")
def test_sequence_field_types_lost_are_caught():
    _expect_caught(LosesSequenceElementTypes(), EXPORT, "Required.Export.Preserve.SequenceFieldRoundTrip")


@pytest.mark.clause("WIRE-ROUNDTRIP", "ENC-NO-COUNT-IN-TYPE")
def test_values_sharing_a_type_merged_are_caught():
    _expect_caught(KeepsOneValuePerType(), EXPORT, "Required.Export.Preserve.SharedTypeIdRoundTrip")


# ------------------------------------------------------------------ C. consumers and parameters
_TENSOR_OPERAND = program_module._tensor_operand


def _reinterprets(value, op_type, path):
    """Encoded bytes whose length fits float32 are handed to the operator as float32 values."""
    if isinstance(value, EncodedValue) and value.payload.nbytes % 4 == 0:
        return np.ascontiguousarray(value.payload).view(np.float32)
    return _TENSOR_OPERAND(value, op_type, path)


@pytest.mark.clause("ENC-NO-IMPLICIT-TENSOR")
def test_encoded_bytes_reinterpreted_as_tensors_are_caught():
    adapter = Patched(load=[(program_module, "_tensor_operand", _reinterprets)],
                      calls=[(program_module, "_tensor_operand", _reinterprets)])
    _expect_caught(adapter, ["Required.State.Consumers"],
                   "Required.State.Consumers.EightByteStructInitializerToRelu",
                   "Required.State.Consumers.EightByteStructFeedToAdd",
                   "Required.State.Consumers.EightCodeAffineToMul")


def _caches_by_codes(node, session):
    """Decoded results cached by the code bytes (the parameters forgotten in the key)."""
    kernel = _DECODE_FACTORY(node, session)
    cache = session.__dict__.setdefault("_decoded_by_codes", {})

    def decode(inputs, ctx):
        value = inputs[0]
        key = (value.type_ref, value.header.affine.storage_type, value.payload[:64].tobytes())
        if key not in cache:
            cache[key] = kernel(inputs, ctx)
        return cache[key]
    return decode


@pytest.mark.clause("ENC-PER-VALUE-PARAMS")
def test_decoded_values_cached_by_code_bytes_are_caught():
    adapter = Patched(load=[(kernels_module.LOCAL_KERNELS, "Decode", _caches_by_codes)])
    _expect_caught(adapter, ["Required.State.Parameters"], "Required.State.Parameters.ChangedScaleUnchangedCodes",
                   "Required.State.Parameters.Type1002OwnParameters")


_DECODE_AFFINE = decode_module._decode_affine


def _masked(payload, storage_type, count):
    from reference_impl import dtypes

    bits = count * dtypes.BIT_WIDTH[storage_type]
    if bits % 8 and len(payload):
        payload = payload.copy()
        payload[-1] &= (1 << (bits % 8)) - 1
    return payload


def _masks_padding(value, payload, count, path):
    """The decoder trusts the verifier (which reads inline bytes only) and masks the padding bits away."""
    return _DECODE_AFFINE(value, _masked(payload, value.affine.storage_type, count), count, path)


def _masking_decode_kernel(node, session):
    """The Decode consumer masks the unused bits of affine payloads instead of checking them."""
    kernel = _DECODE_FACTORY(node, session)

    def decode(inputs, ctx):
        value = inputs[0]
        if isinstance(value, EncodedValue) and value.layout == "affine":
            dims = value.header.logical_type.tensor_type.shape.dim
            count = int(np.prod([d.dim_value for d in dims], dtype=np.int64))
            value = EncodedValue(value.header, _masked(value.payload, value.header.affine.storage_type, count))
        return kernel([value], ctx)
    return decode


@pytest.mark.clause("AFF-PADDING-ZERO", "PAY-VALIDATE-FIRST")
def test_external_padding_unchecked_is_caught():
    adapter = Patched(load=[(decode_module, "_decode_affine", _masks_padding),
                            (kernels_module.LOCAL_KERNELS, "Decode", _masking_decode_kernel)])
    _expect_caught(adapter, ["Required.State.Padding"],
                   "Required.State.Padding.ExternalInt4NonzeroPaddingRejected",
                   "Required.State.Padding.ExternalUint2NonzeroPaddingNotDecoded")


# -------------------------------------------------------------------- every new case, both ways
def test_every_new_case_is_required_to_quote_the_spec():
    assert len(NEW_CASES) >= 95
    assert all(case.quote for case in NEW_CASES if case.level == "Required")


def test_new_cases_pass_on_the_reference_in_process():
    adapter = ReferenceAdapter()
    failed = [(case.id, r.message) for case in NEW_CASES if (r := run_case(case, adapter)).verdict != PASSED]
    assert not failed


def test_new_cases_pass_through_the_reference_testee():
    adapter = load_adapter(testee=f"{sys.executable} -m conformance.testee")
    try:
        failed = [(case.id, r.message) for case in NEW_CASES if (r := run_case(case, adapter)).verdict != PASSED]
    finally:
        adapter.shutdown()
    assert not failed


# ------------------------------------------------------------- the state rules over a second model
class _StartsMissingValuesEmpty(ReferenceAdapter):
    """Bound inputs without an initial value start as zeros; initial values for other names are ignored."""

    def open_state(self, model_bytes, initial, base_dir=None):
        executor = Executor(schema.parse_model(model_bytes), base_dir=base_dir)
        completed = {k: v for k, v in initial.items() if k in {b.input_name for b in executor.bindings}}
        for binding in executor.bindings:
            if binding.input_name not in completed and isinstance(binding.spec, TensorSpec):
                dims = tuple(d if isinstance(d, int) else 0 for d in binding.spec.dims or ())
                completed[binding.input_name] = np.zeros(dims, values_module.numpy_dtype(binding.spec.elem_type))
        return super().open_state(model_bytes, completed, base_dir)


class _FeedsWin(ReferenceState):
    """A feed for a bound input replaces the retained value instead of being refused."""

    def run(self, feeds):
        bound = {b.input_name for b in self.state.bindings}
        overrides = {k: to_runtime(v) for k, v in feeds.items() if k in bound}
        if overrides:
            self.state._values = MappingProxyType({**self.state.values, **overrides})
        return super().run({k: v for k, v in feeds.items() if k not in bound})


class _KeepsEveryOutput(ReferenceState):
    """values() also returns every output of the last call (a context-wide persistence mode)."""

    last: dict = {}

    def run(self, feeds):
        self.last = super().run(feeds)
        return self.last

    def values(self):
        return {**self.last, **super().values()}


class _CopiedValues(ReferenceState):
    """values() returns deep-copied snapshots."""

    def values(self):
        return {k: V.Struct({f: np.array(x) for f, x in v.items()}, v.type_id) if isinstance(v, V.Struct)
                else np.array(v) for k, v in super().values().items()}


class _CloseIgnored(ReferenceState):
    def close(self):
        return None


class _BindingMarksTheType(ReferenceState):
    """Treats every input of a bound input's struct type as persistent (a flag on the type)."""

    def run(self, feeds):
        specs = self.state._executor.input_specs
        bound_types = {b.spec for b in self.state.bindings}
        if any(specs.get(name) in bound_types and name not in {b.input_name for b in self.state.bindings}
               for name in feeds):
            raise Rejected("STATE_FEED_OVERRIDES", "an input of a persistent type is supplied by the state")
        return super().run(feeds)


_CHECK_FEEDS = Executor.check_feeds


def _ignores_missing_feeds(self, feeds, validated=None):
    try:
        _CHECK_FEEDS(self, feeds, validated)
    except ContractError as error:
        if error.code is not ErrorCode.STATE_FEED_MISSING:
            raise


def _prunes_bindings(before, after):
    """Bindings whose input or output a rewrite removed are dropped without a word."""
    names = {vi.name for vi in after.graph.input} | {vi.name for vi in after.graph.output}
    keep = [b for b in after.graph.persistent_bindings if b.input_name in names and b.output_name in names]
    del after.graph.persistent_bindings[:]
    after.graph.persistent_bindings.extend(keep)


RULES = ["Required.State.StructuredRules", "Required.State.Feedback", "Required.State.ResetClose",
         "Required.State.Initial"]


@pytest.mark.clause("STATE-INITIAL")
def test_missing_or_unknown_initial_values_tolerated_are_caught():
    _expect_caught(_StartsMissingValuesEmpty(), RULES + ["Recommended.State.StructuredRules"],
                   "Required.State.StructuredRules.OneInitialValueMissing",
                   "Recommended.State.StructuredRules.InitialForFreshInputRejected")


@pytest.mark.clause("STATE-FEED-OVERRIDE")
def test_feeds_overriding_the_state_are_caught():
    _expect_caught(_with_state(_FeedsWin), RULES, "Required.State.StructuredRules.FeedOverridingRetainedStruct")


@pytest.mark.clause("STATE-FEEDS")
def test_missing_fresh_inputs_not_checked_are_caught():
    adapter = Patched(calls=[(Executor, "check_feeds", _ignores_missing_feeds)])
    _expect_caught(adapter, RULES, "Required.State.StructuredRules.FreshStructInputMissing")


@pytest.mark.clause("ZC-EXACT-OUTPUTS", "BIND-STATELESS-DEFAULT")
def test_every_output_retained_is_caught():
    _expect_caught(_with_state(_KeepsEveryOutput), RULES, "Required.State.StructuredRules.OnlySelectedOutputsRetained",
                   "Required.State.StructuredRules.NoBindingsNothingRetained",
                   "Required.State.Feedback.UnselectedOutputsNotRetained")


@pytest.mark.clause("ZC-VIEWS")
def test_values_snapshots_are_caught():
    _expect_caught(_with_state(_CopiedValues), RULES, "Required.State.StructuredRules.ValuesAreViewsOfTheOutputs")


@pytest.mark.clause("STATE-CLOSE")
def test_close_ignored_is_caught():
    _expect_caught(_with_state(_CloseIgnored), RULES, "Required.State.StructuredRules.ClosedStateReleasesAndRejects",
                   "Required.State.ResetClose.ClosedStateReleasesValues")


@pytest.mark.clause("BIND-SHARED-TYPE", "BIND-GRAPH-LEVEL")
def test_persistence_flag_on_the_type_is_caught():
    _expect_caught(_with_state(_BindingMarksTheType), RULES,
                   "Required.State.StructuredRules.SharedTypeFreshInputFedEachCall")


@pytest.mark.clause("STATE-NO-RACE")
def test_reset_and_close_racing_a_run_are_caught():
    from test_conformance_alternatives import Races

    _expect_caught(Races(), ["Required.State.Independent"],
                   "Required.State.Independent.ResetDuringRunDoesNotRace",
                   "Required.State.Independent.CloseDuringRunDoesNotRace")


@pytest.mark.clause("EXP-REWRITE")
def test_bindings_pruned_by_a_rewrite_are_caught():
    _expect_caught(Patched(load=[(graph_utils, "check_rewrite", _prunes_bindings)]), ["Required.Export.Rewrite"],
                   *[f"Required.Export.Rewrite.Ledger{name}" for name in (
                       "RemoveBoundStructOutput", "RemoveBoundTensorInput", "RetypeBoundTensorOutput")])


# -------------------------------------------------------------- representation rules, second cases
def _column_major(codes, storage_type, scale, zero_point, axis, block_size, shape):
    """Codes placed in column-major order: the payload's k-th code lands at the k-th Fortran position."""
    from reference_impl import dtypes
    from reference_impl.bits import pack_sub_byte

    if len(shape) < 2:
        return _DEQUANTIZE(codes, storage_type, scale, zero_point, axis, block_size, shape)
    plain = _DEQUANTIZE(codes, storage_type, np.float64(1.0), None, None, None, shape).astype(np.int64)
    placed = plain.reshape(-1).reshape(shape, order="F").reshape(-1)
    width = dtypes.BIT_WIDTH[storage_type]
    repacked = placed.astype(dtypes.NUMPY_DTYPE[storage_type]).tobytes() if width == 8 else pack_sub_byte(placed, width)
    return _DEQUANTIZE(repacked, storage_type, scale, zero_point, axis, block_size, shape)


@pytest.mark.clause("AFF-ROW-MAJOR")
def test_column_major_codes_are_caught():
    _expect_caught(Patched(load=[(affine, "dequantize", _column_major)]), SCALES + ["Required.Affine.Axis"],
                   *[f"Required.Affine.ScaleType.{t}.{g}" for t in ("Float", "Float16", "Bfloat16", "Double")
                     for g in ("PerAxis", "Blocked")], "Required.Affine.Axis.PerAxisRows")


def _msb_first_codebook(layout, payload):
    """The spec's codebook decoder reading the four 2-bit indices of a byte most-significant first."""
    table = layout.constant("quantized.codebook").astype(np.float32).reshape(-1)
    index = layout.read(payload, "quantized.codes.index").astype(np.intp)
    index = index.reshape(index.shape[0], -1, 4)[:, :, ::-1].reshape(index.shape[0], -1)
    scale = layout.read(payload, "scale").astype(np.float32)
    return (scale[:, None] * table[index]).reshape(-1)


@pytest.mark.clause("EX-CODEBOOK")
def test_codebook_indices_read_high_first_are_caught():
    from reference_impl import decoders

    registry = decoders.default_registry()
    registry.register(1102, "DecodeScaledCodebookBlocks", decoders.spec_catalogue(), _msb_first_codebook)
    adapter = Patched(load=[(decode_module, "_DEFAULT_REGISTRY", registry)],
                      calls=[(decode_module, "_DEFAULT_REGISTRY", registry)])
    _expect_caught(adapter, ["Required.Structured.SpecExamples", "Required.ZeroCopy.ReadOnlyInputs",
                             "Required.ZeroCopy.Transport"],
                   "Required.Structured.SpecExamples.CodebookFirstValue",
                   "Required.ZeroCopy.ReadOnlyInputs.RetainedEncodedNeverWritten",
                   "Required.ZeroCopy.Transport.EncodedThroughFunctionAndIf")


class DenseWithoutLayout(ReferenceAdapter):
    """An encoded value selecting no layout is read as the dense bytes of its logical tensor type."""

    def decode(self, model_bytes, value_name, base_dir):
        model = schema.parse_model(model_bytes)
        for value in model.graph.encoded_initializer:
            if value.name == value_name and value.WhichOneof("layout") is None:
                tensor = value.logical_type.tensor_type
                dtype = values_module.numpy_dtype(tensor.elem_type)
                return np.frombuffer(value.raw_data, dtype=dtype).reshape([d.dim_value for d in tensor.shape.dim])
        return super().decode(model_bytes, value_name, base_dir)


class AliasDeclarations(ReferenceAdapter):
    """A type_ref declaration is accepted as an alias of the type it names."""

    def verify(self, model_bytes, base_dir):
        model = schema.parse_model(model_bytes)
        by_id = {d.type_id: d for d in model.struct_types}
        for declaration in model.struct_types:
            if declaration.WhichOneof("kind") == "type_ref":
                type_id = declaration.type_id
                declaration.CopyFrom(by_id[declaration.type_ref])
                declaration.type_id = type_id
        return super().verify(model.SerializeToString(), base_dir)


def _bind_by_id(self, type_id, layout, path, declaration=None):
    """The decoder registered for an ID, whatever the model now declares under it, reading each record where
    the registered declaration puts its fields. (Binding by ID and reading the model's own declaration
    misreads nothing, which the spec allows: tests/test_conformance_alternatives.py.)"""
    import dataclasses

    from conformance.audit.faults.structured import _registered_layouts

    decoder = self._decoders.get(type_id)
    if decoder is None:
        raise violation(ErrorCode.CONSUMER_MISSING, path, "no decoder")
    registered = _registered_layouts().get(type_id, layout)
    return dataclasses.replace(decoder, decode=lambda _layout, payload: decoder.decode(registered, payload))


class CompilesCodecsAtLoad(ReferenceAdapter):
    """Prepares every declared codec when the model is loaded, failing on operators it cannot run."""

    def open_state(self, model_bytes, initial, base_dir=None):
        for declaration in schema.parse_model(model_bytes).struct_types:
            for node in declaration.decoder.node:
                if node.domain not in ("", "ai.onnx", "onnx_light"):
                    raise Rejected("OPERATOR_UNSUPPORTED", f"cannot prepare {node.domain}.{node.op_type}")
        return super().open_state(model_bytes, initial, base_dir)


@pytest.mark.clause("ENC-LAYOUT")
def test_missing_layout_read_as_dense_is_caught():
    _expect_caught(DenseWithoutLayout(), ["Required.Affine.Layout"], "Required.Affine.Layout.NoLayoutNotReadAsDense")


@pytest.mark.clause("CAT-DECL-CONCRETE")
def test_type_ref_declarations_as_aliases_are_caught():
    _expect_caught(AliasDeclarations(), ["Required.Catalogue.Identity"],
                   "Required.Catalogue.Identity.ValueThroughTypeRefDeclaration",
                   "Required.Catalogue.Identity.DeclarationIsTypeRef")


@pytest.mark.clause("CAT-ID-CHANGE", "DEC-KEYED")
def test_decoders_bound_by_id_alone_are_caught():
    from reference_impl.decoders import DecoderRegistry

    _expect_caught(Patched(load=[(DecoderRegistry, "bind", _bind_by_id)]), ["Required.Structured.Consumers"],
                   "Required.Structured.Consumers.ChangedFieldTypeNeedsNewId")


@pytest.mark.clause("DEC-NO-LOAD-EXEC")
def test_codecs_prepared_at_load_are_caught():
    _expect_caught(CompilesCodecsAtLoad(), ["Required.Structured.Consumers"],
                   "Required.Structured.Consumers.CodecNotRunWhenLoading")


class HasFieldMeansExternal(ReferenceAdapter):
    """Takes the presence of data_location, not its value, to mean an external payload."""

    def decode(self, model_bytes, value_name, base_dir):
        for value in schema.parse_model(model_bytes).graph.encoded_initializer:
            if value.name == value_name and value.HasField("data_location") and not len(value.external_data):
                raise Rejected("EXTERNAL_LOCATION_MISSING", "data_location is set but names no file")
        return super().decode(model_bytes, value_name, base_dir)


@pytest.mark.clause("PAY-DEFAULT-INLINE")
def test_explicit_default_location_misread_is_caught():
    _expect_caught(HasFieldMeansExternal(), ["Required.External.Keys"],
                   "Required.External.Keys.ExplicitDefaultLocationUsesRawData")


def _naturally_aligned(compile_layout):
    """Record layouts with implicit padding: 16/32/64-bit scalars start at a multiple of their width."""

    from reference_impl.records import RecordLayout

    def compile_aligned(st, catalogue, path="layout"):
        layout = compile_layout(st, catalogue, path)
        shift, leaves = 0, {}
        for leaf in sorted(layout.leaves.values(), key=lambda item: item.offset):
            offset = leaf.offset + shift
            if leaf.elem_type is not None and leaf.width in (16, 32, 64) and not leaf.dims and offset % leaf.width:
                shift += leaf.width - offset % leaf.width
                offset = leaf.offset + shift
            leaves[leaf.path] = leaf._replace(offset=offset)
        return RecordLayout(layout.record_bits + shift, leaves, dict(layout.constants))
    return compile_aligned


@pytest.mark.clause("ENC-TIGHT", "ENC-UNALIGNED")
def test_implicit_alignment_padding_is_caught():
    from reference_impl import decoders

    aligned = _naturally_aligned(decode_module.compile_layout)
    with mock.patch.object(decoders, "compile_layout", aligned):
        registry = decoders.default_registry()
    patches = [(decode_module, "compile_layout", aligned), (decoders, "compile_layout", aligned),
               (decode_module, "_DEFAULT_REGISTRY", registry)]
    _expect_caught(Patched(load=patches, calls=patches),
                   ["Required.State.Parameters", "Required.Structured.SpecExamples"],
                   "Required.State.Parameters.Type1002OwnParameters",
                   "Required.Structured.SpecExamples.WithParameters1002")


class AxisAndBlockNumbersSwapped(ReferenceAdapter):
    """Its AffineLayoutProto numbers axis 5 and block_size 4 (the two swapped)."""

    def decode(self, model_bytes, value_name, base_dir):
        model = schema.parse_model(model_bytes)
        for value in model.graph.encoded_initializer:
            layout = value.affine
            if value.WhichOneof("layout") == "affine" and layout.HasField("axis") and layout.HasField("block_size"):
                layout.axis, layout.block_size = layout.block_size, layout.axis
        return super().decode(model.SerializeToString(), value_name, base_dir)


class BitWidthMisnumbered(ReferenceAdapter):
    """Its BitPacking.Component reads bit_width from the wrong field number, so every width reads as zero."""

    def decode(self, model_bytes, value_name, base_dir):
        model = schema.parse_model(model_bytes)
        for declaration in model.struct_types:
            for item in declaration.structure.field:
                kind = item.type.struct_type.WhichOneof("kind") if item.type.HasField("struct_type") else None
                if kind == "bit_packing":
                    for component in item.type.struct_type.bit_packing.component:
                        component.bit_width = 0
        return super().decode(model.SerializeToString(), value_name, base_dir)


@pytest.mark.clause("WIRE-SCHEMA")
def test_misnumbered_schema_fields_are_caught():
    _expect_caught(AxisAndBlockNumbersSwapped(), ["Required.Wire.FieldNumbers"],
                   "Required.Wire.FieldNumbers.EveryAffineLayoutField")
    _expect_caught(BitWidthMisnumbered(), ["Required.Wire.FieldNumbers"],
                   "Required.Wire.FieldNumbers.CodebookCatalogueByFieldNumber")


# ------------------------------------------------------------------ the caller lets go of buffers
_ADOPT_ARRAY = state_module._adopt_array


def _adopts_by_address(array, path, counters, persistent, owned):
    """Retains the memory's address, not its owner (a raw pointer into the caller's buffer)."""
    kept = _ADOPT_ARRAY(array, path, counters, persistent, owned)
    if not kept.nbytes or kept.dtype.kind in "OUS":
        return kept
    raw = (ctypes.c_char * kept.nbytes).from_address(kept.__array_interface__["data"][0])
    view = np.frombuffer(raw, dtype=kept.dtype).reshape(kept.shape)
    view.flags.writeable = False
    return view


@pytest.mark.clause("ZC-OUTSTANDING")
def test_retained_views_without_owner_are_caught():
    patches = [(state_module, "_adopt_array", _adopts_by_address)]
    _expect_caught(Patched(load=patches, calls=patches), ["Required.ZeroCopy.Outstanding"],
                   "Required.ZeroCopy.Outstanding.CallerDropsForwardedFeed",
                   "Required.ZeroCopy.Outstanding.CallerDropsItsBuffers")

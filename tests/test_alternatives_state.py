"""Soundness of the Required state cases (zero_copy_more, second_state, state_more, kv_more, the kind-less
string cases of mut_exec and state_independent): toy runtimes that each take one choice the spec's words
leave open (and the reference does not take) pass them, while the forbidden behaviour next to it is still
caught. In the style of tests/test_conformance_alternatives.py."""

from __future__ import annotations

import threading

import numpy as np
import onnx
import pytest

from conformance.adapters import Rejected
from conformance.adapters.reference import ReferenceAdapter, ReferenceState, _HoldSlot, to_runtime
from conformance.cases import load_cases, select
from conformance.execute import FAILED, PASSED, run_case
from conformance.hold import HOLD_DOMAIN, HOLD_OP
from reference_impl import schema
from reference_impl.decode import decode_value
from reference_impl.errors import ErrorCode as E
from reference_impl.errors import violation
from reference_impl.executor import Executor
from reference_impl.structs import struct_kind
from reference_impl.values import EncodedValue, check_value

#: the Required topics of the renamed rule cases (corpus/renames.toml)
_CATALOGUE_RULE_TOPICS = ("Required.Catalogue.LogicalTypeRef", "Required.Catalogue.TypeRefExtras",
                          "Required.Declarations.SubByteConstant", "Required.Declarations.ZeroSizeTensor",
                          "Required.Encoding.EmptyPayload", "Required.Encoding.KindlessInLayout",
                          "Required.Encoding.LogicalShape", "Required.Encoding.PackingRoot")


CASES = load_cases()
SOURCES = ("lifetime.toml", "state_paths.toml", "masks_and_bindings.toml", "batches_and_masks.toml")
REQUIRED = [case.id for case in CASES if case.source.endswith(SOURCES) and case.id.startswith("Required.")]


def _verdicts(adapter, *patterns) -> dict:
    chosen = select(CASES, list(patterns))
    assert chosen, patterns
    return {case.id: run_case(case, adapter) for case in chosen}


def _passes(adapter, *patterns) -> None:
    failed = {cid: r.message for cid, r in _verdicts(adapter, *patterns).items() if r.verdict != PASSED}
    assert not failed, failed


def _fails(adapter, case_id: str) -> str:
    result = _verdicts(adapter, case_id)[case_id]
    assert result.verdict == FAILED, (case_id, result.message)
    return result.message


# ------------------------------------------------- decoder-exposed dimensions and checked outputs
def _decode_in_blocks(inputs, attributes, ctx):
    """onnx_light::Decode exposing a struct value without logical_type as (records, 32): the spec lets the
    decoder choose the dimensions of a value that has no logical type."""
    value = inputs[0]
    proto = value.to_proto()
    decoded = decode_value(proto, ctx.session.catalogue, base_dir=value.base_dir or ctx.session.base_dir,
                           registry=ctx.session.registry)
    if proto.WhichOneof("layout") == "struct_type" and not proto.HasField("logical_type"):
        decoded = np.asarray(decoded).reshape(-1, 32)
    return [decoded]


class _OutputsChecked(Executor):
    """Checks every graph output, selected or not, against its declared type before anything is published
    (the spec asks it of the selected ones and forbids it of none)."""

    def run(self, feeds, **options):
        outputs = super().run(feeds, **options)
        for name, value in outputs.items():
            if not isinstance(value, EncodedValue):
                check_value(value, self.output_specs[name], f"output {name!r}")
        return outputs


class BlockDecoderCheckedOutputs(ReferenceAdapter):
    """A decoder exposing (records, 32) for a struct value without logical_type (allowed: docs'
    FlatOrBlocks) in a runtime that validates every output against the graph's declaration before
    publishing (allowed)."""

    def open_state(self, model_bytes, initial, base_dir=None):
        from reference_impl.state import make_state

        slot = _HoldSlot()
        kernels = {**self.executor_kernels(), ("onnx_light", "Decode"): _decode_in_blocks,
                   (HOLD_DOMAIN, HOLD_OP): slot.kernel}
        executor = _OutputsChecked(schema.parse_model(model_bytes), base_dir=base_dir, kernels=kernels)
        return ReferenceState(make_state(executor, {k: to_runtime(v) for k, v in initial.items()}), slot)


ENCODED_STATE = ["Required.ZeroCopy.Lifetime.EncodedViewsSurviveClose",
                 "Required.ZeroCopy.Lifetime.EncodedStateCopiesNothing",
                 "Required.ZeroCopy.Lifetime.EncodedResetCopiesNothing"]


@pytest.mark.clause("ENC-LOGICAL-OPTIONAL", "ZC-OUTSTANDING", "ZC-NO-PAYLOAD-COPY")
def test_decoder_dimensions_of_a_value_without_logical_type_pass_the_encoded_state_cases():
    _passes(BlockDecoderCheckedOutputs(), *ENCODED_STATE)
    # while a decode that scratches the retained payload and a close that scrubs it are still caught
    from conformance.audit.faults.zero_copy import DecodeScratchesInput, EncodedScrubbedOnClose

    _fails(DecodeScratchesInput(), "Required.ZeroCopy.Lifetime.EncodedViewsSurviveClose")
    _fails(EncodedScrubbedOnClose(), "Required.ZeroCopy.Lifetime.EncodedViewsSurviveClose")


# ------------------------------------------------------------------ ONNX's checker on plain-ONNX models
def _holds_struct(value_type) -> bool:
    """Whether a TypeProto is or holds (through sequences, maps and optionals) a struct type."""
    kind = value_type.WhichOneof("value")
    if kind == "struct_type":
        return True
    inner = {"sequence_type": lambda: value_type.sequence_type.elem_type,
             "optional_type": lambda: value_type.optional_type.elem_type,
             "map_type": lambda: value_type.map_type.value_type}.get(kind)
    return inner is not None and _holds_struct(inner())


class ChecksPlainOnnx(ReferenceAdapter):
    """Runs onnx's own full checker (operator type constraints and shape inference included) on every
    model made only of ONNX's types, before anything else, and refuses a model it refuses with
    TYPE_INVALID: such a model must be valid ONNX apart from the rule under test."""

    def open_state(self, model_bytes, initial, base_dir=None):
        model = schema.parse_model(model_bytes)
        graph = model.graph
        plain = not model.struct_types and not graph.encoded_initializer and not any(
            _holds_struct(v.type) for v in (*graph.input, *graph.output, *graph.value_info))
        if plain:
            try:
                onnx.checker.check_model(onnx.load_from_string(model_bytes), full_check=True)
            except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as error:
                raise Rejected("TYPE_INVALID", f"onnx's checker refuses the model: {error}") from None
        return super().open_state(model_bytes, initial, base_dir)


@pytest.mark.clause("BIND-COMPATIBLE")
def test_a_runtime_running_onnx_checker_on_plain_models_passes_the_state_cases():
    _passes(ChecksPlainOnnx(), *REQUIRED)
    # while map key types left uncompared are still caught by both map rows
    from conformance.audit.faults.bindings import MapKeyTypesNotCompared

    for case_id in ("Required.Bindings.Nested.MapKeyInt32ForInt64",
                    "Required.Bindings.Nested.SequenceOfMapsKeyInt64ForInt32"):
        _fails(MapKeyTypesNotCompared(), case_id)


# ------------------------------------------------------------- kind-less categories outside elements
def _misplaced_category(value_type, element: bool) -> bool:
    """Whether a TypeProto holds a kind-less struct anywhere but as a sequence element or map value."""
    kind = value_type.WhichOneof("value")
    if kind == "struct_type":
        declared = value_type.struct_type
        return not element if struct_kind(declared) is None else _misplaced_in_declaration(declared)
    if kind == "sequence_type":
        return _misplaced_category(value_type.sequence_type.elem_type, True)
    if kind == "map_type":
        return _misplaced_category(value_type.map_type.value_type, True)
    if kind == "optional_type":
        return _misplaced_category(value_type.optional_type.elem_type, False)
    return False


def _misplaced_in_declaration(declared) -> bool:
    kind = struct_kind(declared)
    if kind == "structure":
        return any(_misplaced_category(field.type, False) for field in declared.structure.field
                   if field.HasField("type"))
    return kind == "array" and _misplaced_category(declared.array.element_type, False)


class RefusesMisplacedCategories(ReferenceAdapter):
    """Takes "An unset-kind StructTypeProto is an unconstrained category, permitted only inside TypeProto for
    heterogeneous sequence/map elements" literally: a kind-less struct_type {} as a graph input, output or
    value_info type, a field or array element type, an optional's element or a logical_type is refused with
    KINDLESS_MISPLACED when the model is loaded (verified, decoded, read or opened as a state)."""

    @staticmethod
    def _check(model_bytes: bytes) -> None:
        model = schema.parse_model(model_bytes)
        graph = model.graph
        types = [(value.type, value.name) for value in (*graph.input, *graph.output, *graph.value_info)]
        types += [(value.logical_type, value.name) for value in graph.encoded_initializer
                  if value.HasField("logical_type")]
        declarations = [*model.struct_types, *(value.struct_type for value in graph.encoded_initializer
                                               if value.WhichOneof("layout") == "struct_type")]
        for value_type, name in types:
            if _misplaced_category(value_type, False):
                raise Rejected("KINDLESS_MISPLACED", f"{name!r}: a kind-less struct is only a sequence/map element")
        if any(_misplaced_in_declaration(declared) for declared in declarations):
            raise Rejected("KINDLESS_MISPLACED", "a declaration holds a kind-less struct outside an element")

    def verify(self, model_bytes, base_dir):
        self._check(model_bytes)
        return super().verify(model_bytes, base_dir)

    def decode(self, model_bytes, value_name, base_dir):
        self._check(model_bytes)
        return super().decode(model_bytes, value_name, base_dir)

    def read_fields(self, model_bytes, value_name, base_dir):
        self._check(model_bytes)
        return super().read_fields(model_bytes, value_name, base_dir)

    def open_state(self, model_bytes, initial, base_dir=None):
        self._check(model_bytes)
        return super().open_state(model_bytes, initial, base_dir)


KINDLESS_STRINGS = "Required.Bindings.KindlessStrings"


@pytest.mark.clause("CAT-KINDLESS", "BIND-NO-STRINGS")
def test_refusing_kindless_categories_outside_elements_passes_the_kindless_string_cases():
    _passes(RefusesMisplacedCategories(), KINDLESS_STRINGS, "Required.Catalogue", *_CATALOGUE_RULE_TOPICS,
            "Required.Affine.Logical", "Required.Bindings", "Required.Declarations")
    # while a runtime retaining an encoded value whose logical type is STRING is still caught by each case
    from conformance.audit.faults.bindings import EncodedStringLogicalRetained

    chosen = [case.id for case in select(CASES, [KINDLESS_STRINGS])]
    assert len(chosen) == 4
    for case_id in chosen:
        _fails(EncodedStringLogicalRetained(), case_id)


_BARE = '''
ir_version: 13
opset_import { domain: "" version: 23 }
graph {
  name: "g"
  node { op_type: "Identity" input: "s" output: "s_next" }
  input { name: "s" type { $type } }
  output { name: "s_next" type { $type } }
  persistent_bindings { input_name: "s" output_name: "s_next" }
}
'''


@pytest.mark.clause("CAT-KINDLESS")
@pytest.mark.parametrize(("value_type", "refused"), [
    ("struct_type { }", True),
    ("optional_type { elem_type { struct_type { } } }", True),
    ("sequence_type { elem_type { struct_type { } } }", False),
    ("sequence_type { elem_type { sequence_type { elem_type { struct_type { } } } } }", False),
    ("optional_type { elem_type { map_type { key_type: 7 value_type { struct_type { } } } } }", False),
])
def test_the_toy_refuses_the_category_only_outside_elements(value_type, refused):
    from google.protobuf import text_format

    model = text_format.Parse(_BARE.replace("$type", value_type), schema.ModelProto())
    if refused:
        with pytest.raises(Rejected) as raised:
            RefusesMisplacedCategories._check(model.SerializeToString())
        assert raised.value.code == "KINDLESS_MISPLACED"
    else:
        RefusesMisplacedCategories._check(model.SerializeToString())


# --------------------------------------------------------------------- runs of different states queued
class _QueuedRuns(ReferenceState):
    """A state of SerializesRunsAcrossStates: a call while this state is busy is refused with STATE_BUSY; a
    run then waits for the runtime's one execution slot."""

    def __init__(self, handle, slot: threading.Lock):
        super().__init__(handle.state, handle.slot)
        self.slot_lock = slot
        self.busy = threading.Lock()

    def _exclusive(self, call, *args, queued: bool):
        if not self.busy.acquire(blocking=False):
            raise violation(E.STATE_BUSY, "state", "a call is already active on this state")
        try:
            if not queued:
                return call(*args)
            with self.slot_lock:
                return call(*args)
        finally:
            self.busy.release()

    def run(self, feeds):
        return self._exclusive(super().run, feeds, queued=True)

    def run_cancelled(self, feeds):
        return self._exclusive(super().run_cancelled, feeds, queued=True)

    def run_held(self, feeds, hold):
        return self._exclusive(super().run_held, feeds, hold, queued=True)

    def reset(self, initial):
        return self._exclusive(super().reset, initial, queued=False)

    def close(self):
        return self._exclusive(super().close, queued=False)


class SerializesRunsAcrossStates(ReferenceAdapter):
    """One execution slot for the whole runtime: a run of one state waits while a run of another state
    executes (it is never refused); simultaneous calls on the same state are still refused (STATE_BUSY). The
    spec rejects only those ("simultaneous calls on the same state are rejected") and leaves scheduling to
    other work."""

    def __init__(self):
        super().__init__()
        self.slot = threading.Lock()

    def open_state(self, model_bytes, initial, base_dir=None):
        return _QueuedRuns(super().open_state(model_bytes, initial, base_dir), self.slot)


INDEPENDENT = ["Required.State.Independent.TwoStatesRunAtOnce", "Required.State.Independent.ThreeStatesTwoRounds"]


@pytest.mark.clause("STATE-ISOLATION", "STATE-NO-CONCURRENCY")
def test_queueing_runs_of_different_states_passes_the_independence_cases(monkeypatch):
    from conformance import trace
    from conformance.audit.faults.state import CallGuardPerModel, SharedStateAcrossRequests

    without_waiting = "Recommended.State.Independent.TwoStatesRunWithoutWaiting"
    _passes(ReferenceAdapter(), without_waiting)  # with the whole independence timeout: load decides nothing
    _passes(SerializesRunsAcrossStates(), "Required.State.Independent", "Required.State.Concurrency",
            "Required.ZeroCopy.Lifetime.ResetOfOtherStateDuringRun",
            "Required.ZeroCopy.Lifetime.CloseOfOtherStateDuringRun")
    monkeypatch.setattr(trace, "INDEPENDENT_TIMEOUT", 0.5)  # the queued run would wait out the whole timeout
    assert "waited" in _fails(SerializesRunsAcrossStates(), without_waiting)
    # while refusing a call on another state, and sharing one state between requests, are still caught
    for case_id in INDEPENDENT:
        assert "rejected" in _fails(CallGuardPerModel(), case_id)
        _fails(SharedStateAcrossRequests(), case_id)


# ------------------------------------------------------------------------ feed types left to the kernels
class _FeedsByName(Executor):
    """Checks a call's feeds by name and presence only: their types and shapes are the kernels' business."""

    def check_feeds(self, feeds, validated=None):
        retained = validated or {}
        for name in feeds:
            if name not in self.input_specs and name not in retained:
                raise violation(E.STATE_FEED_UNKNOWN, f"feeds[{name!r}]", f"{name!r} is not a graph input")
        for name in self.required_inputs:
            if name not in feeds and name not in retained:
                raise violation(E.STATE_FEED_MISSING, f"feeds[{name!r}]", f"required input {name!r} has no feed")


class LeavesFeedTypesToKernels(ReferenceAdapter):
    """Never compares a fresh feed's type or shape to its graph input (the spec validates the selected values
    before publication, not fresh feeds): a feed the kernels cannot take fails the run in execution, one they
    take runs, and every value to retain is still validated before it is published."""

    def open_state(self, model_bytes, initial, base_dir=None):
        from reference_impl.state import make_state

        slot = _HoldSlot()
        kernels = {**self.executor_kernels(), (HOLD_DOMAIN, HOLD_OP): slot.kernel}
        executor = _FeedsByName(schema.parse_model(model_bytes), base_dir=base_dir, kernels=kernels)
        return ReferenceState(make_state(executor, {k: to_runtime(v) for k, v in initial.items()}), slot)


@pytest.mark.clause("STATE-VALIDATE-METADATA", "STATE-ATOMIC")
def test_leaving_feed_types_to_the_kernels_passes_the_feed_cases():
    _passes(LeavesFeedTypesToKernels(), "Required.State.Feeds", "Required.State.Atomic", "Required.State.Publication")
    # refusing a wrong feed before execution, where the kernels would take it into a valid state, is the
    # suite's choice
    refused_early = "Recommended.State.Feeds.WrongFeedShapeRefusedBeforeExecution"
    assert "accepted" in _fails(LeavesFeedTypesToKernels(), refused_early)

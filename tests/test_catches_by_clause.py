"""Faults the audit once saw caught only by cases of other clauses (an incidental catch does not count: a
runtime with the bug but without the incidental trigger passes), or only by Recommended cases where the
spec's words force the behaviour, are each caught by two independent Required cases of their own clauses:
the reference passes each listed case, the fault fails it, no two share a model, and each cites a clause
of the fault and quotes it. The Attention cases let a runtime refuse a degenerate attribute; one that
refuses passes, and the windows' hand arithmetic agrees with onnx's reference evaluator."""

from __future__ import annotations

import pytest
from fault_catchers import assert_caught_by_independent_cases, params
from plain_models import assert_refusable_trace_matches_onnx_reference

from conformance.adapters.reference import ReferenceAdapter, ReferenceState
from conformance.audit import catalogue
from conformance.cases import load_cases
from conformance.execute import FAILED, PASSED, run_case
from reference_impl import schema
from reference_impl.clauses import CLAUSES
from reference_impl.errors import ErrorCode as E
from reference_impl.errors import violation

#: fault ID -> the Required cases of its clauses that catch it
CATCHERS = {
    "AFF-ROW-MAJOR.blocked-axis0-column-major": (
        "Required.Affine.Block.NegativeAxisBlocksOfRows", "Required.Affine.Axis.MinusRankBlockedRows"),
    "BIND-COMPATIBLE.symbolic-dims-by-name": (
        "Required.Bindings.Dimensions.SymbolicPastBoundToSymbolicTotal",
        "Required.Bindings.Dimensions.SymbolicInputBoundToConcreteOutput"),
    "BIND-GRAPH-LEVEL.struct-binding-on-type": (
        "Required.Export.Preserve.SaveLoadKeepsStructures", "Required.Wire.RoundTrip.BindingsAndStructIo"),
    "DEC-DEFINES-MAPPING.flat-logical-required": (
        "Required.Encoding.LogicalShape.CodebookColumn", "Required.Encoding.LogicalShape.Linear3D"),
    "DEC-DEFINES-MAPPING.row-per-record-required": (
        "Required.Encoding.LogicalShape.Linear3D", "Required.Structured.SpecExamples.Codebook128Records"),
    "ENC-PER-VALUE-PARAMS.first-record-parameters": (
        "Required.Structured.SpecExamples.CodebookTwoRecords", "Required.Structured.SpecExamples.Codebook128Records"),
    "ENC-STRUCT-LAYOUT.nested-ref-in-inline-refused": (
        "Required.Encoding.Nested.SameTypeTwiceInRecord", "Required.Encoding.Nested.RootArrayOfTwelveBitStructs",
        "Required.Encoding.Nested.ArrayOfTwelveBitStructs"),
    "REP-STATIC-SUBSET.graph-values-fixed-size": (
        "Required.Declarations.UnknownDims.UnknownDimFieldRetained",
        "Required.Declarations.UnknownDims.UnknownDimFieldFedAndRead"),
    "WIRE-BINDINGS-FIELD.binding-names-swapped": (
        "Required.Wire.FieldNumbers.TwoTensorBindingsAt1001Run",
        "Required.Wire.FieldNumbers.StructAndCounterBindingsAt1001Run"),
    "WIRE-BINDINGS-FIELD.bindings-at-1002": (
        "Required.Wire.FieldNumbers.TwoTensorBindingsAt1001Run",
        "Required.Wire.FieldNumbers.StructAndCounterBindingsAt1001Run"),
    "WIRE-BINDINGS-FIELD.singular-field": (
        "Required.Wire.FieldNumbers.TwoTensorBindingsAt1001Run",
        "Required.Wire.FieldNumbers.StructAndCounterBindingsAt1001Run"),
    "WIRE-LOCAL-RANGE.bindings-at-18": (
        "Required.Wire.FieldNumbers.TwoTensorBindingsAt1001Run",
        "Required.Wire.FieldNumbers.StructAndCounterBindingsAt1001Run"),
    "WIRE-FIELDS.encoded-initializer-singular": (
        "Required.Wire.FieldNumbers.FirstOfTwoAffineValuesAt1000",
        "Required.Wire.FieldNumbers.FirstOfTwoStructValuesAt1000"),
    "ZC-NO-DUPLICATE.encoded-outputs-duplicated": (
        "Required.ZeroCopy.Retain.EncodedOutputBecomesState",
        "Required.ZeroCopy.Retain.EncodedNextCallReceivesReturnedBuffer"),
    "ZC-VIEWS.encoded-payloads-snapshotted": (
        "Required.ZeroCopy.Views.EncodedValuesAreSharedViews",
        "Required.ZeroCopy.Views.EncodedInitialValueSharedViews"),
    "KV-ATTENTION.zero-scale-defaulted": (
        "Required.KV.Attention.ZeroScaleBoolMask", "Required.KV.Attention.ZeroScaleGroupedQuery"),
    "KV-ATTENTION.sliding-window-exclusive": (
        "Required.KV.Attention.SlidingWindowLeftTwo", "Required.KV.Attention.SlidingWindowBothSides"),
}
_REFUSABLE = CATCHERS["KV-ATTENTION.zero-scale-defaulted"] + CATCHERS["KV-ATTENTION.sliding-window-exclusive"]
_CASES = {case.id: case for case in load_cases()}
_FAULTS = {cls.fault_id: cls for cls in catalogue.faults()}


@pytest.mark.parametrize(("fault_id", "case_ids"), list(params(CATCHERS)))
def test_fault_is_caught_by_independent_required_cases_of_its_clauses(fault_id, case_ids):
    assert_caught_by_independent_cases(fault_id, case_ids)
    clauses = set(_FAULTS[fault_id].clauses)
    for case_id in case_ids:
        case = _CASES[case_id]
        cited = clauses & set(case.clauses)
        assert case.level == "Required" and cited, (case_id, case.clauses)
        statements = " ".join(quote for clause in cited for quote in CLAUSES[clause].quotes)
        assert any(quote in statements for quote in case.quote), f"{case_id} quotes no sentence of {sorted(cited)}"


def _refused_attribute(model_bytes: bytes) -> bool:
    """Whether the model's Attention has an explicit scale of 0 or a sliding window."""
    for node in schema.parse_model(model_bytes).graph.node:
        if node.op_type == "Attention":
            attributes = {a.name: a for a in node.attribute}
            if "scale" in attributes and attributes["scale"].f == 0.0 or \
                    {"left_window_size", "right_window_size"} & set(attributes):
                return True
    return False


class RefusesWhenOpening(ReferenceAdapter):
    """Refuses a scale of 0 or a window when the model is loaded (as onnxruntime does a scale of 0)."""

    def open_state(self, model_bytes, initial, base_dir=None):
        if _refused_attribute(model_bytes):
            raise violation(E.ATTENTION_INPUT_INVALID, "model.graph.node[0]", "Attention attribute refused")
        return super().open_state(model_bytes, initial, base_dir)


class RefusesWhenRunning(ReferenceAdapter):
    """Opens any model but refuses its first call when the Attention kernel meets the attribute."""

    def open_state(self, model_bytes, initial, base_dir=None):
        handle = super().open_state(model_bytes, initial, base_dir)
        if not _refused_attribute(model_bytes):
            return handle

        class Refusing(ReferenceState):
            def run(self, feeds):
                raise violation(E.STATE_RUN_FAILED, "run", "execution failed", (E.OPERATOR_UNSUPPORTED,))

        return Refusing(handle.state, handle.slot)


@pytest.mark.clause("KV-ATTENTION")
@pytest.mark.parametrize("adapter", [RefusesWhenOpening, RefusesWhenRunning])
@pytest.mark.parametrize("case_id", _REFUSABLE)
def test_a_runtime_refusing_the_attribute_passes(case_id, adapter):
    assert run_case(_CASES[case_id], adapter(), timeout=60).verdict == PASSED


@pytest.mark.clause("KV-ATTENTION")
@pytest.mark.parametrize("case_id", _REFUSABLE)
def test_a_runtime_that_runs_the_model_must_compute_it(case_id):
    """Refusing after a first call succeeded is no refusal of the attribute: the remaining calls must run."""

    class RefusesLater(ReferenceAdapter):
        def open_state(self, model_bytes, initial, base_dir=None):
            handle = super().open_state(model_bytes, initial, base_dir)
            calls = []

            class Later(ReferenceState):
                def run(self, feeds):
                    calls.append(feeds)
                    if len(calls) > 1:
                        raise violation(E.ATTENTION_INPUT_INVALID, "run", "refused late")
                    return super().run(feeds)

            return Later(handle.state, handle.slot)

    assert run_case(_CASES[case_id], RefusesLater(), timeout=60).verdict == FAILED


@pytest.mark.clause("KV-ATTENTION")
@pytest.mark.parametrize("case_id", CATCHERS["KV-ATTENTION.sliding-window-exclusive"])
def test_window_arithmetic_agrees_with_onnx_reference(case_id):
    """Attention-25 in onnx's reference evaluator gives every expected output of both calls, the past fed
    back by hand."""
    assert_refusable_trace_matches_onnx_reference(_CASES[case_id])

"""The wire and model-level faults of conformance/audit/faults_wire_more.py that no case, or a single one,
caught are caught by at least two cases (corpus/cases/wire_more.toml, with the earlier catcher where one
existed), each with its own model: every case passes on the reference and fails on the fault. The whole
catalogue is audited by ``python -m conformance audit`` (tests/test_audit.py)."""

from __future__ import annotations

import pytest

from conformance.adapters.reference import ReferenceAdapter
from conformance.audit import catalogue
from conformance.cases import load_cases
from conformance.execute import FAILED, PASSED, run_case

_DEDUP = "Required.Export.Dedup."
_PRESERVE = "Required.Export.Preserve."
_GRAPH = "Required.Catalogue.Graph."
_NAMES = "Required.Naming.Initializers."
#: fault ID -> the cases that must catch it
CATCHERS = {
    "DEC-MISSING.uint8-bytes-view": (
        "Required.Structured.Consumers.UnregisteredTypeWithByteLogicalType",
        "Required.Structured.Consumers.UnregisteredPairsWithByteLogicalType"),
    "DEC-KEYED.inline-matched-by-layout": (
        "Required.Structured.Consumers.InlineCopyOfInt4BlockHasNoDecoder",
        "Required.Structured.Consumers.InlineCopyOfInt4BlockTwoRecords"),
    "EXP-DEDUP.external-extent-ignored": (
        _DEDUP + "KeepsExternalValuesAtDifferentOffsets", _DEDUP + "KeepsExternalStructValuesInDifferentFiles"),
    "EXP-DEDUP.logical-type-ignored": (
        _DEDUP + "KeepsValuesOfDifferentLogicalShape", _DEDUP + "KeepsStructValuesOfDifferentLogicalType"),
    "EXP-PRESERVE-STRUCT.external-location-flattened": (
        _PRESERVE + "ExternalSubdirectoryLocationExport", "Required.Wire.RoundTrip.ExternalNestedDirectoryLocation"),
    "EXP-RENAME.subgraph-references-stale": (
        "Required.Export.Rename.BoundInputReadOnlyInBranches", "Required.Export.Rename.RenamedValueReadInIfBranch"),
    "EXP-STANDARD.lowered-feedback-reversed": (
        "Required.Export.Standard.LoweredFeedbackNamesInputThenOutput",
        "Required.Export.Standard.LoweredToStatelessModel"),
    "EXP-STRUCT.unknown-fields-dropped": (
        "Required.Export.Standard.RejectsStructInFunctionValueInfo",
        "Required.Export.Standard.RejectsStructInTypeAttribute"),
    "GRAPH-STRUCT-IO.outputs-unchecked": (_GRAPH + "UnresolvedOutputRefOnly", _GRAPH + "MalformedValueInfoStruct"),
    "GRAPH-STRUCT-IO.nested-io-unchecked": (
        _GRAPH + "SequenceOfUnresolvedRefInput", _GRAPH + "OptionalMalformedStructOutput"),
    "GRAPH-STRUCT-IO.subgraph-io-unchecked": (
        _GRAPH + "IfBranchOutputUnresolvedRef", _GRAPH + "LoopBodyInputMalformedStruct"),
    "INIT-AS-INPUT.dense-input-rejected": (
        _NAMES + "DenseInitializerAlsoGraphInput", _NAMES + "SparseInitializerAlsoGraphInput"),
    "INIT-NAMES-UNIQUE.case-insensitive": (_NAMES + "EncodedNamesDifferingInCase", _NAMES + "NamesAreCaseSensitive"),
    "INIT-NAMES-UNIQUE.function-subgraphs-skipped": (
        _NAMES + "DuplicateInFunctionBodyBranch", _NAMES + "DuplicateEncodedInFunctionBodyLoop"),
    "INIT-NAMES-UNIQUE.sparse-name-from-indices": (
        _NAMES + "TwoSparseInitializersUnnamedIndices", _NAMES + "StructValueRepeatsSparseName"),
    "INIT-NAMES-UNIQUE.sparse-not-counted": (_NAMES + "StructValueRepeatsSparseName", _NAMES + "EncodedRepeatsSparse"),
    "REP-TENSORPROTO-COMPAT.sparse-densified-on-save": (
        "Required.Wire.RoundTrip.SparseInitializerUnmigrated", _PRESERVE + "SparseInitializerUnmigratedExport"),
    "WIRE-ROUNDTRIP.payload-length-per-type": (
        "Required.Wire.RoundTrip.SharedTypeLongerValueFirst", _PRESERVE + "SharedTypeIdRoundTrip"),
    "WIRE-ROUNDTRIP.subgraph-encoded-dropped": (
        _PRESERVE + "IfBranchEncodedInitializerRoundTrip", _PRESERVE + "LoopBodyStructInitializerExport"),
}

FAULTS = {cls.fault_id: cls for cls in catalogue.faults()}
CASES = {case.id: case for case in load_cases()}


def _params():
    for fault_id, case_ids in CATCHERS.items():
        clause = fault_id.split(".", 1)[0]
        yield pytest.param(fault_id, case_ids, id=fault_id, marks=pytest.mark.clause(clause))


@pytest.mark.parametrize(("fault_id", "case_ids"), list(_params()))
def test_fault_is_caught_by_two_independent_cases(fault_id, case_ids):
    cases = [CASES[case_id] for case_id in case_ids]
    assert len(cases) >= 2
    assert len({case.model_bytes() for case in cases}) == len(cases), "two of the cases share a model"
    reference = {case.id: run_case(case, ReferenceAdapter(), timeout=60) for case in cases}
    assert all(r.verdict == PASSED for r in reference.values()), {i: r.message for i, r in reference.items()
                                                                 if r.verdict != PASSED}
    faulty = {case.id: run_case(case, FAULTS[fault_id](), timeout=60) for case in cases}
    missed = [case_id for case_id, result in faulty.items() if result.verdict != FAILED]
    assert not missed, f"{fault_id} survives {missed}"


def test_every_new_case_catches_a_fault_listed_here():
    """Each case of the file is one of the catchers above, so none is there without a fault it kills."""
    new = {case.id for case in CASES.values() if case.source == "cases/wire_more.toml"}
    listed = {case_id for case_ids in CATCHERS.values() for case_id in case_ids}
    assert new and new <= listed, sorted(new - listed)

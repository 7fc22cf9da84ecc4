"""The wire and model-level faults of conformance/audit/faults/ that no case, or a single one,
caught are caught by at least two cases (corpus/cases/export/wire_rules.toml, with the earlier catcher where one
existed), each with its own model: every case passes on the reference and fails on the fault. The whole
catalogue is audited by ``python -m conformance audit`` (tests/test_audit.py)."""

from __future__ import annotations

import pytest
from fault_catchers import assert_caught_by_independent_cases, assert_every_case_listed, params

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
    "GRAPH-STRUCT-IO.outputs-unchecked": (
        _GRAPH + "UnresolvedOutputRefOnly", _GRAPH + "MalformedOutputStructOnly",
        "Recommended.Catalogue.Graph.MalformedValueInfoStruct"),
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


@pytest.mark.parametrize(("fault_id", "case_ids"), list(params(CATCHERS)))
def test_fault_is_caught_by_two_independent_cases(fault_id, case_ids):
    assert_caught_by_independent_cases(fault_id, case_ids)


def test_every_new_case_catches_a_fault_listed_here():
    """Each case of the file is one of the catchers above, so none is there without a fault it kills."""
    assert_every_case_listed(CATCHERS, "cases/export/wire_rules.toml")

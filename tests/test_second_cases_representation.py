"""Representation, payload and export faults that one case alone used to catch are now caught by at least
two independent cases (corpus/cases/second_representation.toml added the second): each case passes on the
reference and fails on the fault, and no two of a fault's cases share a model. The whole catalogue is
audited by ``python -m conformance audit`` (tests/test_audit.py)."""

from __future__ import annotations

import pytest

from conformance.adapters.reference import ReferenceAdapter
from conformance.audit import catalogue
from conformance.cases import load_cases
from conformance.execute import FAILED, PASSED, run_case

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # a faulty runtime's arithmetic may overflow

#: fault ID -> the cases that must catch it (the one that used to be alone first)
CATCHERS = {
    "AFF-AXIS.negative-axis-rejected": (
        "Required.Affine.Axis.NegativeNormalized", "Required.Affine.Axis.NegativeAxisRank3Int4ZeroPoints",
        "Required.Affine.Block.NegativeAxisBlocksOfRows"),
    "AFF-BLOCK.block-without-axis-ignored": (
        "Required.Affine.Block.Rejects_BlockWithoutAxis", "Required.Affine.Block.BlockWithoutAxisNotDecoded"),
    "CAT-ID-NONZERO.signed-type-id": (
        "Required.Catalogue.Accepts.MaximumTypeId", "Required.Structured.Fields.TypeIdTwoToThe63"),
    "CAT-KINDLESS.kindless-declaration-skipped": (
        "Required.Catalogue.Identity.KindlessDeclaration",
        "Required.Catalogue.Identity.KindlessDeclarationAmongUsedTypes"),
    "CAT-REF-ACYCLIC.diamond-rejected": (
        "Required.Catalogue.Accepts.DiamondIsNotACycle", "Required.Structured.Fields.SharedSubtypeReachedTwice"),
    "DEC-INLINE-CODEC.inline-layout-guessed": (
        "Required.Structured.Consumers.InlineLayoutNeedsCodec", "Required.Structured.Consumers.InlineArrayNeedsCodec",
        "Required.State.Consumers.DecodeNodeOnInlineLayoutFails"),
    "DEC-ROOT-ONLY.nested-decoders-invoked": (
        "Required.Structured.Consumers.NestedDecoderIgnored", "Required.State.Consumers.NestedSubtypeCodecsNeverRun"),
    "ENC-CONSTANT-ONLY.zero-size-root": (
        "Required.Encoding.Eligibility.ConstantOnlyRoot", "Required.Encoding.Eligibility.ArrayOfConstantGroupsRoot"),
    "INIT-AS-INPUT.input-name-rejected": (
        "Required.Naming.Initializers.EncodedNameAlsoGraphInput",
        "Required.Naming.Initializers.StructValueAlsoGraphInputDecodes"),
    "INIT-NAMES-UNIQUE.root-graph-only": (
        "Required.Naming.Initializers.InSubgraph", "Required.Naming.Initializers.DuplicateInLoopBody"),
    "PAY-DEFAULT-INLINE.location-inferred": (
        "Required.External.Keys.ExternalDataWithoutLocationFlag",
        "Required.External.Struct.EntriesWithoutExternalFlag"),
    "PAY-EXCLUSIVE.external-wins": (
        "Required.External.Keys.RawAndExternalBoth", "Required.External.Struct.RawDataAndFileBoth"),
    "PAY-EXTERNAL-KEYS.length-optional": (
        "Required.External.Keys.LengthMissing", "Required.External.Struct.OffsetWithoutLength"),
    "RESOURCE-LIMITS.layout-paths-unbounded": (
        "Recommended.Fuzz.Oracle.constant_diamond_layout", "Recommended.Limits.Expansion.BinaryDiamondDecoded"),
    "EXP-DEDUP.payload-bytes-only": (
        "Required.Export.Rewrite.DeduplicationKeepsDistinctProfiles",
        "Required.Export.Rewrite.DeduplicationKeepsDistinctStructTypes",
        "Required.Export.Rewrite.DeduplicatedModelDecodesEachValue"),
    "EXP-STANDARD.bindings-stripped": (
        "Required.Export.Standard.RejectsBindings", "Required.Export.Standard.RejectsKeyValueBindings"),
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
    """Each case of the manifest is one of the catchers above, so none is there without a fault it kills."""
    new = {case.id for case in CASES.values() if case.source == "cases/second_representation.toml"}
    listed = {case_id for case_ids in CATCHERS.values() for case_id in case_ids}
    assert new and new <= listed, sorted(new - listed)

"""Second faults for declaration, catalogue, binding and consumer rules that had one fault each
(conformance/audit/faults/) are each caught by at least two independent cases; the cases of
corpus/cases/bindings/declaration_rules.toml were added for those no case caught. Each listed case passes on the
reference
and fails on the fault, and no two of a fault's cases share a model."""

from __future__ import annotations

import pytest
from fault_catchers import assert_caught_by_independent_cases, assert_every_case_listed, params

#: fault ID -> the cases that must catch it (the new cases of declaration_rules.toml first)
CATCHERS = {
    "BIND-GRAPH-LEVEL.struct-binding-on-type": (
        "Required.Export.Preserve.SaveLoadKeepsStructures", "Required.Export.Preserve.SequenceFieldRoundTrip"),
    "BIND-LITERAL-NAMES.backslash-escapes": (
        "Required.Bindings.Nesting.BackslashNameBoundAndRun",
        "Required.Bindings.Nesting.BackslashStructNameRetained"),
    "BIND-NO-CONTENTS.decode-memoized": (
        "Required.Structured.Consumers.DecodeOfFreshCodebookEachCall",
        "Required.Structured.Consumers.DecodeOfFreshFixedParametersEachCall"),
    "BIND-NO-CONTENTS.legacy-paths-dropped": (
        "Recommended.Limits.Bindings.LegacyInputFieldPath", "Recommended.Limits.Bindings.LegacyOutputFieldPath"),
    "BIND-ROOT-ONLY.one-level-deep": (
        "Required.Bindings.Nesting.NestedInIfInsideIf", "Required.Bindings.Declaration.NestedInFunctionBody"),
    "BIND-ROOT-ONLY.loop-bodies-unscanned": (
        "Required.Bindings.Nesting.NestedInLoopBody", "Required.Bindings.Nesting.NestedInLoopInsideIfBranch"),
    "BIND-ROOT-ONLY.codec-bodies-unscanned": (
        "Recommended.Bindings.Nesting.NestedInDecoderBody", "Recommended.Bindings.Nesting.NestedInEncoderBody"),
    "BIND-SHARED-TYPE.one-slot-per-type": (
        "Required.Bindings.Nesting.SwappedInputsOfOneType", "Required.Bindings.Nesting.TwoBoundInputsOfOneType"),
    "BIND-STATELESS-DEFAULT.bindings-from-names": (
        "Required.Bindings.Stateless.PastPresentNamesWithoutBindings",
        "Required.Bindings.Stateless.PastPresentStructWithoutBindings"),
    "BIND-WHOLE.scalar-fields-kept": (
        "Required.State.Structured.WholeCacheRetained", "Required.State.StructuredRules.ValuesAreViewsOfTheOutputs"),
    "CAT-DECL-CONCRETE.type-ref-declarations-skipped": (
        "Required.Catalogue.Identity.DeclarationIsTypeRef",
        "Required.Catalogue.Identity.ValueThroughTypeRefDeclaration"),
    "CAT-ID-CHANGE.added-fields-not-compared": (
        "Recommended.Structured.Consumers.ConstantAddedUnderRegisteredId",
        "Recommended.Structured.Consumers.FieldAddedUnderRegisteredId"),
    "CAT-ID-UNIQUE.identical-duplicates-merged": (
        "Required.Catalogue.Identity.DuplicateIdenticalDeclaration",
        "Required.Catalogue.Identity.IdenticalDuplicateAtEnds"),
    "CAT-ID-UNIQUE.found-on-lookup-only": (
        "Required.Catalogue.Identity.DuplicateTypeId", "Required.Catalogue.Identity.RepeatedIdApart"),
    "DEC-DEFINES-MAPPING.flat-logical-required": (
        "Required.Encoding.LogicalShape.CodebookColumn", "Required.Encoding.LogicalShape.Linear3D"),
    "DEC-MISSING-INPUT.fed-values-fallback": (
        "Required.Structured.Consumers.DecodeOfFedUnregisteredType",
        "Required.Structured.Consumers.DecodeOfRetainedUnregisteredType",
        "Required.State.Consumers.DecodeNodeOnInlineLayoutFails"),
    "DEC-NO-LOAD-EXEC.decoded-at-load": (
        "Recommended.Encoding.Records.NearLimitRecordWithEmptyPayload", "Recommended.Limits.Depth.LayoutAtTheLimit"),
    "DEC-ROOT-ONLY.nested-decoder-for-root": (
        "Required.Structured.Consumers.RegisteredSubtypeInUnregisteredRoot",
        "Required.Structured.Consumers.TaggedRegisteredSubtypeNoRootDecoder"),
    "DECL-COUNTS-CONCRETE.bit-packing-count-unchecked": (
        "Recommended.Declarations.EmptyFields.NestedBitPackingCountUnset",
        "Recommended.Declarations.Malformed.BitPackingDimensionZero"),
    "DECL-COUNTS-CONCRETE.nested-counts-unchecked": (
        "Recommended.Declarations.EmptyFields.InlineArrayCountUnsetInGraphInput",
        "Recommended.Declarations.EmptyFields.NestedBitPackingCountUnset"),
    "DECL-DEPTH.one-level-over": (
        "Recommended.Limits.Depth.InlineAndReferenceLevelsAddUp", "Recommended.Limits.Depth.UnusedChainJustBeyond"),
    "DECL-DEPTH.one-level-short": (
        "Recommended.Declarations.CountUnset.InlineAndReferenceExactlyAtLimit",
        "Recommended.Limits.Depth.LayoutAtTheLimit"),
    "DECL-DYNAMIC-DIMS.unset-dim-zero": (
        "Required.Declarations.UnknownDims.UnknownDimFieldFedAndRead",
        "Required.Declarations.UnknownDims.UnknownDimFieldRetained"),
    "DECL-FIELD-CONTENT.catalogue-only": (
        "Required.Declarations.EmptyFields.EmptyFieldInGraphInputType",
        "Required.Declarations.EmptyFields.EmptyFieldInNestedInlineType"),
    "GRAPH-TENSOR-OPS.single-field-unwrapped": (
        "Required.Structured.Consumers.NestedOneFieldStructToRelu",
        "Required.Structured.Consumers.OneFieldStructToAdd"),
    "REP-STATIC-SUBSET.graph-values-fixed-size": (
        "Required.Declarations.UnknownDims.UnknownDimFieldFedAndRead",
        "Required.Declarations.UnknownDims.UnknownDimFieldRetained"),
    "WIRE-LOCAL-EXTENSION.local-range-strict": (
        "Recommended.Wire.UnknownFields.StillDecodes_all", "Recommended.Wire.UnknownFields.StillDecodes_graph",
        "Recommended.Wire.UnknownFields.Survive_model"),
    "WIRE-LOCAL-RANGE.bindings-at-18": (
        "Required.Bindings.Nesting.BackslashNameBoundAndRun",
        "Required.Declarations.UnknownDims.UnknownDimFieldRetained"),
    "WIRE-LOCAL-RANGE.struct-types-at-27": (
        "Required.Bindings.Nesting.TwoBoundInputsOfOneType",
        "Recommended.Structured.Consumers.FieldAddedUnderRegisteredId"),
}


@pytest.mark.parametrize(("fault_id", "case_ids"), list(params(CATCHERS)))
def test_fault_is_caught_by_two_independent_cases(fault_id, case_ids):
    assert_caught_by_independent_cases(fault_id, case_ids)


def test_every_new_case_catches_a_fault_listed_here():
    """Each case of declaration_rules.toml is one of the catchers above, so none is there without a bug it kills."""
    assert_every_case_listed(CATCHERS, "cases/bindings/declaration_rules.toml")

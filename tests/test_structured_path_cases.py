"""Representation, payload and export faults that one case alone used to catch are now caught by at least
two independent cases (corpus/cases/affine/representation_paths.toml added the second): each case passes on the
reference and fails on the fault, and no two of a fault's cases share a model. The whole catalogue is
audited by ``python -m conformance audit`` (tests/test_audit.py)."""

from __future__ import annotations

import pytest
from fault_catchers import assert_caught_by_independent_cases, assert_every_case_listed, params

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
    "DEC-NO-LOAD-EXEC.codecs-compiled-at-load": (
        "Required.Structured.Consumers.NestedDecoderIgnored", "Required.State.Consumers.NestedSubtypeCodecsNeverRun"),
    # both cases above allow a refusal with CONSUMER_MISSING, which is how this fault meets a subtype decoder
    # it cannot run: cases whose subtype decoders it can run catch it (corpus/cases/structured/nested_codecs.toml)
    "DEC-ROOT-ONLY.nested-decoders-invoked": (
        "Required.Structured.NestedCodecs.LinearCodesSubtypeDecoderNotRun",
        "Required.State.NestedCodecs.DecodeNodeRunsRootDecoderOnly"),
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
        "Recommended.Limits.FuzzOracle.constant_diamond_layout", "Recommended.Limits.Expansion.BinaryDiamondDecoded"),
    "EXP-DEDUP.payload-bytes-only": (
        "Required.Export.Rewrite.DeduplicationKeepsDistinctProfiles",
        "Required.Export.Rewrite.DeduplicationKeepsDistinctStructTypes",
        "Required.Export.Rewrite.DeduplicatedModelDecodesEachValue"),
    "EXP-STANDARD.bindings-stripped": (
        "Required.Export.Standard.RejectsBindings", "Required.Export.Standard.RejectsKeyValueBindings"),
}


@pytest.mark.parametrize(("fault_id", "case_ids"), list(params(CATCHERS)))
def test_fault_is_caught_by_two_independent_cases(fault_id, case_ids):
    assert_caught_by_independent_cases(fault_id, case_ids)


def test_every_new_case_catches_a_fault_listed_here():
    """Each case of the manifest is one of the catchers above, so none is there without a fault it kills."""
    assert_every_case_listed(CATCHERS, "cases/affine/representation_paths.toml")

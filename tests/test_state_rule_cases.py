"""The cases of corpus/cases/state/state_rules.toml: each fails the second fault it was written for (a bug of
conformance/audit/faults/ that no case, or a single one, caught before), and the
unmodified reference passes every one of them."""

from __future__ import annotations

import pytest
from fault_catchers import assert_caught_by_independent_cases, assert_every_case_listed, params

from conformance.audit.fault import Fault
from conformance.audit.faults.export import SaveKeepsOneBinding
from conformance.audit.faults.kv_contiguous import (
    NegativeBlockSizeMagnitude,
    NegativeMaxTokensUnlimited,
    ScoresForWholeContext,
)
from conformance.audit.faults.state import (
    AliasesOfSelectedRetained,
    DefaultedInputsRequired,
    InitializerAsInitialValue,
    InlineStructsRefused,
    PreviousFeedReused,
    ResetReopensClosedState,
    UnboundInitialAsDefaultFeed,
)
from conformance.audit.faults.zero_copy import OutputBuffersRecycled, ProducerOutputsRetained
from conformance.cases import load_cases, select
from conformance.execute import FAILED, PASSED, run_case
from reference_impl import schema

#: fault -> the cases that must catch it (the new ones, with the one that caught it alone before)
CATCHERS = {
    InitializerAsInitialValue: ("Recommended.State.Initial.InitializerIsNoInitialValue",
                                  "Recommended.State.Initial.ResetWithoutTheDefaultedBinding"),
    PreviousFeedReused: ("Required.State.Feeds.FreshScalarMissingAfterRuns",
                           "Required.State.Feeds.FreshInputSuppliedOnlyByAnEarlierCall",
                           "Recommended.State.Feeds.DefaultedInputMayBeOmitted",
                           "Recommended.State.Feeds.DefaultedScalarStepAfterAFedOne"),
    DefaultedInputsRequired: ("Recommended.State.Feeds.DefaultedInputMayBeOmitted",
                                "Recommended.State.Feeds.DefaultedScalarStepAfterAFedOne"),
    ResetReopensClosedState: ("Recommended.State.ResetClose.ClosedStateRejectsResetAndIgnoresSecondClose",
                                "Recommended.State.Close.ResetDoesNotReopenAClosedState"),
    NegativeBlockSizeMagnitude: ("Required.KV.PagedCapacity.NegativeBlockSize",
                                   "Required.KV.Capacity.NegativeBlockSizeUnderCallerBlocks"),
    NegativeMaxTokensUnlimited: ("Required.KV.PagedCapacity.NegativeMaxTokens",
                                   "Required.KV.Capacity.MinusTwoMaxTokensUnderCallerBlocks"),
    ScoresForWholeContext: ("Recommended.KV.Bounded.DenseWorkspaceDoesNotGrowWithContext",
                              "Recommended.KV.Bounded.Int4WorkspaceDoesNotGrowWithContext"),
    SaveKeepsOneBinding: ("Required.Export.RetainedState.SaveLoadKeepsBothBindings",
                            "Required.Export.RetainedState.RoundTripKeepsBothBindings",
                            "Required.Export.RetainedState.SavedTwoBindingStateRuns"),
    OutputBuffersRecycled: ("Required.ZeroCopy.Arena.UnselectedOutputNotRecycled",
                              "Required.ZeroCopy.ReadOnly.ReferencedBuffersNeverWritten",
                              "Required.ZeroCopy.Outputs.HeldLogitsKeepTheirBuffer"),
    UnboundInitialAsDefaultFeed: ("Recommended.State.Initial.UnboundName",
                                    "Recommended.State.StructuredRules.InitialForFreshInputRejected",
                                    "Required.State.Feeds.InitialValueOfAFreshInputFeedsNothing",
                                    "Required.State.Feeds.InitialValueOfAFreshScalarFeedsNothing"),
    ProducerOutputsRetained: ("Required.State.Unselected.SplitSiblingOfSelectedOutputNotRetained",
                                "Required.KV.PagedOwnership.FailedAppendLeavesCache"),
    InlineStructsRefused: ("Required.State.WholeStruct.InlineStructRetainedWhole",
                             "Recommended.Bindings.Dimensions.AgreeingInlineStruct"),
    AliasesOfSelectedRetained: ("Required.State.Unselected.IdentityOfSelectedOutputNotRetained",
                                  "Required.State.Unselected.ReshapedSelectedOutputNotRetained"),
}


def _cases(case_ids):
    found = {case.id: case for case in select(load_cases(), list(case_ids))}
    assert sorted(found) == sorted(case_ids), "every listed case exists and no pattern matched another"
    return [found[case_id] for case_id in case_ids]


@pytest.mark.parametrize("fault_id,case_ids", params({fault.fault_id: ids for fault, ids in CATCHERS.items()}))
def test_fault_is_caught_by_at_least_two_cases_the_reference_passes(fault_id, case_ids):
    assert_caught_by_independent_cases(fault_id, case_ids)


def test_every_new_case_catches_some_fault():
    """No case of the file is along for the ride: each one is listed against a fault it catches."""
    assert_every_case_listed({fault.fault_id: ids for fault, ids in CATCHERS.items()}, "cases/state/state_rules.toml")


class _IgnoresUnboundInitialValues(Fault):
    """An allowed runtime: it accepts an initial value for an input no binding selects and ignores it."""

    fault_id = "STATE-INITIAL.toy-ignores-unbound-initial-values"
    clauses = ("STATE-INITIAL",)

    def open_state(self, model_bytes, initial, base_dir=None):
        bound = {b.input_name for b in schema.parse_model(model_bytes).graph.persistent_bindings}
        return super().open_state(model_bytes, {k: v for k, v in initial.items() if k in bound}, base_dir)


def test_fresh_input_initial_value_cases_accept_a_runtime_that_ignores_it():
    """The spec does not say an initial value for an unbound input must be refused: a runtime that
    accepts and ignores it passes the Required cases (and only the Recommended ones fail it)."""
    cases = _cases(("Required.State.Feeds.InitialValueOfAFreshInputFeedsNothing",
                    "Required.State.Feeds.InitialValueOfAFreshScalarFeedsNothing",
                    "Recommended.State.Initial.UnboundName"))
    verdicts = {case.id: run_case(case, _IgnoresUnboundInitialValues()).verdict for case in cases}
    assert verdicts == {cases[0].id: PASSED, cases[1].id: PASSED, cases[2].id: FAILED}

"""The feed cases of corpus/cases/state/lifecycle.toml: a wrong fresh feed may be refused at once or left to the
kernels, but a feed that execution takes must never become the retained state. A runtime that checks feeds by
name only and trusts what the graph computes (the audit's STATE-VALIDATE-METADATA.computed-outputs-trusted)
passes the rows where Add cannot take the feed, so the rows where it can (or where the feed is itself the
value to retain) are there to catch it."""

from __future__ import annotations

import pytest
from fault_catchers import assert_caught_by_independent_cases

from conformance.audit.faults.state import ComputedOutputsTrusted
from conformance.cases import load_cases, select
from conformance.execute import FAILED, PASSED, run_case

_FEEDS = "Required.State.Feeds."
FAULT = "STATE-VALIDATE-METADATA.computed-outputs-trusted"
#: one model each: the broadcast through Add (template acc) and the feed retained as it is (compat_through)
CATCHERS = (_FEEDS + "WrongFeedShapeBroadcastsIntoState", _FEEDS + "WrongFeedShapeForwardedIntoState")


def _verdict(adapter, case_id: str):
    (case,) = select(load_cases(), [case_id])
    return run_case(case, adapter, timeout=60)


@pytest.mark.clause("STATE-VALIDATE-METADATA", "STATE-ATOMIC")
def test_trusting_computed_outputs_is_caught_by_two_independent_cases():
    assert_caught_by_independent_cases(FAULT, CATCHERS)


@pytest.mark.clause("STATE-VALIDATE-METADATA", "STATE-ATOMIC")
def test_a_wrong_type_retained_as_fed_is_caught():
    result = _verdict(ComputedOutputsTrusted(), _FEEDS + "WrongFeedTypeForwardedIntoState")
    assert result.verdict == FAILED and "accepted" in result.message


@pytest.mark.clause("STATE-VALIDATE-METADATA")
@pytest.mark.parametrize("row", ["WrongFeedType", "WrongFeedShape"])
def test_the_rows_execution_refuses_cannot_see_the_fault(row):
    """Where Add refuses the feed, the fault's run fails in execution as a right runtime's may: those rows
    accept that failure, so only the rows above can tell the fault from a right runtime."""
    result = _verdict(ComputedOutputsTrusted(), _FEEDS + row)
    assert result.verdict == PASSED, result.message

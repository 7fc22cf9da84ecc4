"""Trace features the KV cases rely on (a STATE_RUN_FAILED that names causes must name the right one,
errors that may come at open or at the first run, cancelled runs, encoded-layout checks) and the
per-case timeout of in-process adapters."""

from __future__ import annotations

import sys
import threading
import time

from conformance import protocol
from conformance.adapters import Rejected, load_adapter
from conformance.adapters.reference import ReferenceAdapter
from conformance.cases import load_cases, select
from conformance.execute import FAILED, NOT_SUPPORTED, PASSED, run_case
from conformance.runner import RunConfig, run
from reference_impl import ContractError

INVALID = "Required.KV.PagedBlockTable.ValidBeyondSlots"


def _case(case_id: str):
    (case,) = select(load_cases(), [case_id])
    return case


class HidesCause(ReferenceAdapter):
    """Reports a failed run without saying why (the spec defines no cause reporting: allowed)."""

    def classify(self, exc):
        found = super().classify(exc)
        return Rejected(found.code, "the run failed") if found is not None else None


class NamesWrongCause(ReferenceAdapter):
    """Names a cause that is not why the run failed; the cause travels in the structured field only."""

    def classify(self, exc):
        found = super().classify(exc)
        if found is None or not found.causes:
            return found
        return Rejected(found.code, f"KV_BLOCK_INVALID {found.message}", ["ATTENTION_INPUT_INVALID"])


class ReportsCause(ReferenceAdapter):
    """Reports the kernel's own code instead of wrapping it in STATE_RUN_FAILED."""

    def classify(self, exc):
        if isinstance(exc, ContractError) and isinstance(exc.__cause__, ContractError):
            exc = exc.__cause__
        return super().classify(exc)


class RejectsAtOpen(ReferenceAdapter):
    def __init__(self, code: str):
        super().__init__()
        self.code = code

    def open_state(self, *args):
        raise Rejected(self.code, "the initial cache was validated when the state opened")


def test_a_failed_run_that_names_a_cause_must_name_the_right_one():
    result = run_case(_case(INVALID), NamesWrongCause())
    assert result.verdict == FAILED and "because of ATTENTION_INPUT_INVALID, not KV_BLOCK_INVALID" in result.message
    assert run_case(_case(INVALID), ReportsCause()).verdict == PASSED
    assert run_case(_case(INVALID), HidesCause()).verdict == PASSED  # message text is never searched


def test_errors_may_come_when_the_state_opens():
    assert run_case(_case(INVALID), RejectsAtOpen("KV_BLOCK_INVALID")).verdict == PASSED
    assert run_case(_case(INVALID), RejectsAtOpen("STATE_VALUE_INCOMPATIBLE")).verdict == FAILED
    valid = run_case(_case("Required.KV.PagedFormats.Int8KeysUint8Values"), RejectsAtOpen("KV_BLOCK_INVALID"))
    assert valid.verdict == FAILED and "should be accepted" in valid.message


def test_cancellation_needs_the_adapter_and_protocol_to_support_it():
    case = _case("Required.KV.PagedOwnership.CancelledAppendLeavesCache")
    adapter = load_adapter(testee=f"{sys.executable} -m conformance.testee")
    try:
        assert adapter.protocol_version == protocol.PROTOCOL_VERSION
        assert run_case(case, adapter).verdict == PASSED
        adapter.protocol_version = 1  # an older testee ignores Run.cancelled: never ask it
        result = run_case(case, adapter)
    finally:
        adapter.shutdown()
    assert result.verdict == NOT_SUPPORTED and "protocol version 1" in result.message


class Hangs(ReferenceAdapter):
    """verify() blocks until released (a sleep releases the GIL, so a timeout can observe it)."""

    def __init__(self, release: threading.Event):
        super().__init__()
        self.release = release

    def verify(self, model_bytes, base_dir):
        self.release.wait(60)
        return super().verify(model_bytes, base_dir)


def test_in_process_cases_time_out_and_the_run_goes_on():
    release = threading.Event()
    case = _case("Required.Catalogue.Accepts.EmptyCatalogue")
    try:
        start = time.perf_counter()
        cases = [case, _case("Required.State.Feedback.EquivalentToManualLoop")]
        results, _ = run(cases, RunConfig(timeout=0.3, progress=False), adapter=Hangs(release))
        assert time.perf_counter() - start < 10
        assert results[0].verdict == FAILED and results[0].message.startswith("timed out")
        assert "--testee" in results[0].message
        assert results[1].verdict == PASSED
    finally:
        release.set()
    assert run_case(case, Hangs(release), timeout=0.3).verdict == PASSED


def test_adapters_with_their_own_timeouts_run_directly():
    class Slow(ReferenceAdapter):
        handles_timeouts = True

        def verify(self, model_bytes, base_dir):
            time.sleep(0.2)
            return super().verify(model_bytes, base_dir)

    assert run_case(_case("Required.Catalogue.Accepts.EmptyCatalogue"), Slow(), timeout=0.05).verdict == PASSED

"""The concurrency and cancellation cases do not depend on timing: run 100 times each on a machine kept
busy by CPU-bound processes, in process and through the testee, they always pass, on the reference
(which rejects a reset or close during a run) and on a runtime whose reset and close wait for the run
(the first call is held at its Hold node until the runner releases it; no sleep decides a verdict)."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest
from test_conformance_alternatives import Waits

from conformance.adapters import load_adapter
from conformance.adapters.reference import ReferenceAdapter
from conformance.cases import load_cases, select
from conformance.execute import PASSED, run_case

TESTS = pathlib.Path(__file__).resolve().parent
ROUNDS = 100
#: A runtime that waits costs the runner's grace period per reset/close case (conformance.trace
#: SECOND_CALL_GRACE): fewer rounds keep the test short.
WAITING_ROUNDS = 25
HELD = ["Required.State.Concurrency", "Required.State.Cancel"]


@pytest.fixture
def busy_machine():
    """Two CPU-bound processes (the machine has two cores) for the duration of the test."""
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2)]
    try:
        yield
    finally:
        for burner in burners:
            burner.kill()
            burner.wait(timeout=10)


def _hammer(adapter, rounds: int = ROUNDS) -> dict[str, list[str]]:
    cases = select(load_cases(), HELD)
    assert len(cases) == 5
    failures: dict[str, list[str]] = {}
    for _ in range(rounds):
        for case in cases:
            result = run_case(case, adapter)
            if result.verdict != PASSED:
                failures.setdefault(case.id, []).append(result.message)
    return failures


@pytest.mark.clause("STATE-NO-CONCURRENCY", "STATE-NO-RACE", "ZC-FAILURE")
@pytest.mark.parametrize("runtime,rounds", [(ReferenceAdapter, ROUNDS), (Waits, WAITING_ROUNDS)],
                         ids=["rejects", "waits"])
def test_held_cases_pass_every_time_in_process(busy_machine, runtime, rounds):
    assert _hammer(runtime(), rounds) == {}


@pytest.mark.clause("STATE-NO-CONCURRENCY", "STATE-NO-RACE", "ZC-FAILURE")
@pytest.mark.parametrize("runtime,rounds", [("reference", ROUNDS),
                                            (f"{TESTS / 'test_conformance_alternatives.py'}:Waits", WAITING_ROUNDS)],
                         ids=["rejects", "waits"])
def test_held_cases_pass_every_time_through_the_testee(busy_machine, runtime, rounds):
    adapter = load_adapter(testee=f"{sys.executable} -m conformance.testee --adapter {runtime}")
    try:
        assert _hammer(adapter, rounds) == {}
    finally:
        adapter.shutdown()

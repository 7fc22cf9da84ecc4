"""Cases that observe cost from outside the runtime (conformance/measured.py) can only watch this process,
so they form a profile of their own that a testee cannot claim: a runtime behind the protocol still
certifies state and zero-copy, and the in-process reference certifies the measured profile too."""

from __future__ import annotations

import json

from conformance.adapters import IN_PROCESS_PROFILES, load_adapter
from conformance.cases import load_cases

MEASURING_STEPS = {"allocations", "addresses", "file_opens"}


def _ops(steps):
    for step in steps or ():
        yield step.get("op")
        for key in ("if_accepted", "if_rejected"):
            yield from _ops(step.get(key))
        if isinstance(step.get("call"), dict):
            yield step["call"].get("op")


def test_every_case_that_measures_the_process_is_in_an_in_process_profile():
    traces = [case for case in load_cases() if case.op == "state"]
    measuring = {case.id for case in traces if MEASURING_STEPS & set(_ops(case.steps or case.extras()["steps"]))}
    assert len(measuring) >= 5
    assert all((case.profile in IN_PROCESS_PROFILES) == (case.id in measuring) for case in traces)


def test_a_testee_does_not_claim_the_in_process_profiles_even_when_its_runtime_does():
    client = load_adapter(testee="python -m conformance.testee", timeout=60.0)
    try:
        assert load_adapter("reference").profiles() >= IN_PROCESS_PROFILES
        assert not client.profiles() & IN_PROCESS_PROFILES
        assert {"state", "zero-copy"} <= client.profiles()
    finally:
        client.shutdown()


def test_a_whole_run_through_the_testee_certifies_state_and_zero_copy(tmp_path):
    from conformance.cli import main

    assert main(["run", "--testee", "python -m conformance.testee", "-j", "2", "--quiet",
                 "--report-dir", str(tmp_path)]) == 0
    profiles = json.loads((tmp_path / "manifest.json").read_text())["profiles"]
    assert profiles["state"] == profiles["zero-copy"] == "certified"
    assert "measured" not in profiles

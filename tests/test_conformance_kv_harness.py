"""The per-case timeout of in-process adapters (the harness the KV cases run in)."""

from __future__ import annotations

import threading
import time

from conformance.adapters.reference import ReferenceAdapter
from conformance.cases import load_cases, select
from conformance.execute import FAILED, PASSED, run_case
from conformance.runner import RunConfig, run


def _case(case_id: str):
    (case,) = select(load_cases(), [case_id])
    return case


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

"""Cases run in worker processes (conformance/workers.py): an in-process adapter that kills its process
on one case (an abort or a segfault in a native runtime) fails exactly that case as ``crashed``, named in
the summary line, results.json and JUnit, and the run goes on; one that holds the interpreter past its
deadline is killed and fails as timed out. The runs that may crash go through a child Python, so that on
a runner without isolation only that child dies."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import pytest
from crashing_adapter import Crashing

from conformance import operators
from conformance.adapters.reference import ReferenceAdapter
from conformance.cases import load_cases, select
from conformance.runner import RunConfig, run

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = os.path.join(ROOT, "tests")
FOUR_DECODES = "Required.Affine.AgreesWithDequantizeLinear.Int4*"
SECOND = "Required.Affine.AgreesWithDequantizeLinear.Int4_blocked_ZeroPoint"

RUN_WITH_OBJECT = """
import json, sys
from crashing_adapter import Crashing
from conformance.cases import load_cases, select
from conformance.runner import RunConfig, run, summary_line

cases = select(load_cases(), [sys.argv[1]], None, None, None)
config = RunConfig(progress=False, jobs=int(sys.argv[4]), timeout=float(sys.argv[5]))
results, info = run(cases, config, adapter=Crashing(sys.argv[2], sys.argv[3]))
print(json.dumps({"results": [r.to_json() for r in results], "summary": summary_line(results)}))
"""


def _second_model_sha256() -> str:
    case = select(load_cases(), [SECOND], None, None, None)[0]
    return hashlib.sha256(operators.model_bytes(case, Crashing())).hexdigest()


def _run_object(how: str, jobs: int, timeout: float = 30.0) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, TESTS]))
    done = subprocess.run([sys.executable, "-c", RUN_WITH_OBJECT, FOUR_DECODES, _second_model_sha256(), how,
                           str(jobs), str(timeout)], capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-2000:])
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.parametrize(("how", "signal_name", "jobs"), [("abort", "SIGABRT", 1), ("segv", "SIGSEGV", 2)])
def test_an_adapter_object_crashing_its_process_fails_only_that_case(how, signal_name, jobs):
    run_ = _run_object(how, jobs)
    verdicts = [(r["id"], r["verdict"]) for r in run_["results"]]
    assert [v for _, v in verdicts] == ["passed", "crashed", "passed", "passed"] and verdicts[1][0] == SECOND
    crashed = run_["results"][1]
    assert crashed["message"].startswith(f"crashed: the worker process running this case was killed by "
                                         f"{signal_name}; the run went on in a new worker")
    # faulthandler's dump of the worker's threads at the crash (a signal sent to the process may land on a
    # thread other than the one in decode, so only the dump itself is certain)
    assert "Fatal Python error" in crashed["traceback"] and "most recent call first" in crashed["traceback"]
    assert run_["summary"] == "3 passed, 0 failed, 0 not supported, 0 expected failures, 1 crashed"


def test_a_crash_is_named_in_the_summary_line_results_and_junit(tmp_path):
    report = tmp_path / "report"
    env = dict(os.environ, CRASH_MODEL_SHA256=_second_model_sha256(), CRASH_HOW="segv")
    done = subprocess.run([sys.executable, "-m", "conformance", "run", "--quiet", "-j", "2",
                           "--adapter", "tests/crashing_adapter.py:Crashing", "--cases", FOUR_DECODES,
                           "--report-dir", str(report)], capture_output=True, text=True, timeout=300, cwd=ROOT,
                          env=env)
    assert done.stdout.splitlines()[-1] == "3 passed, 0 failed, 0 not supported, 0 expected failures, 1 crashed"
    results = json.loads((report / "results.json").read_text())
    assert results["summary"].endswith(", 1 crashed")
    assert {r["id"]: r["verdict"] for r in results["results"]}[SECOND] == "crashed"
    junit = (report / "junit.xml").read_text()
    assert 'errors="1"' in junit and '<error type="crashed" message="crashed: the worker process' in junit
    assert f"- `{SECOND}` — crashed: " in (report / "summary.md").read_text()


def test_a_case_holding_the_interpreter_past_its_deadline_is_killed():
    """No thread can time out native code that keeps the interpreter lock; the worker's deadline can."""
    run_ = _run_object("hold", 1, timeout=1.0)
    assert [r["verdict"] for r in run_["results"]] == ["passed", "failed", "passed", "passed"]
    assert run_["results"][1]["message"].startswith("timed out: the worker process running this case did not "
                                                    "answer within 11 s")


class CountingVerifies(ReferenceAdapter):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def verify(self, model_bytes, base_dir):
        self.calls += 1
        return super().verify(model_bytes, base_dir)


def test_without_isolation_an_adapter_object_runs_in_the_callers_process():
    """The opt-out for debugging; with isolation what the object records stays in the workers."""
    cases = select(load_cases(), ["Required.Catalogue.Accepts.EmptyCatalogue",
                                  "Required.Catalogue.Accepts.SpecCatalogue"], None, None, None)
    inline = CountingVerifies()
    results, info = run(cases, RunConfig(progress=False, isolation=False), adapter=inline)
    assert [r.verdict for r in results] == ["passed", "passed"] and inline.calls == 2
    assert info.platform["isolation"] == "none: cases ran in the runner's process"
    isolated = CountingVerifies()
    results, info = run(cases, RunConfig(progress=False), adapter=isolated)
    assert [r.verdict for r in results] == ["passed", "passed"] and isolated.calls == 0
    assert info.platform["isolation"] == "worker processes"

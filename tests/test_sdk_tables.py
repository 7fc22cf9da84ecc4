"""The generated tables of the C++ SDK's guide (conformance/sdk/cpp/README.md, conformance/sdk_tables.py):
current in the README, and drawn from what the suite really does — every code of reference_impl/errors.py
with the profiles whose cases expect it, and per profile the requests its cases send, which a recording
runtime confirms by running cases of every kind."""

from __future__ import annotations

import subprocess
import sys

import pytest

from conformance import sdk_tables
from conformance.adapters.reference import ReferenceAdapter
from conformance.cases import load_cases
from conformance.execute import run_case
from reference_impl.errors import ErrorCode

#: adapter and handle methods -> the protocol requests the testee client sends for them
REQUESTS = {"verify": {"verify"}, "decode": {"decode"}, "read_fields": {"read_fields"}, "roundtrip": {"roundtrip"},
            "export": {"export"}, "rewrite": {"rewrite"}, "open_state": {"open_state"}, "run": {"run"},
            "run_cancelled": {"run.cancelled"}, "run_held": {"run.hold", "hold"}, "values": {"values"},
            "reset": {"reset"}, "close": {"close"}, "counters": {"counters"}}


class Recording:
    """The reference runtime, recording the request each call would send through a testee."""

    def __init__(self, inner, sent: set[str]):
        self._inner = inner
        self._sent = sent

    def __getattr__(self, name: str):
        found = getattr(self._inner, name)
        if name not in REQUESTS or not callable(found):
            return found

        def call(*args, **keywords):
            self._sent.update(REQUESTS[name])
            result = found(*args, **keywords)
            return Recording(result, self._sent) if name == "open_state" else result

        return call


def _sample():
    """Two cases of each profile and operation, and every state case with a step that sends a request of
    its own kind (held, cancelled, lowered, counters, an open over a rewritten or exported model)."""
    seen: dict[tuple[str, str], int] = {}
    for case in load_cases():
        key = (case.profile, case.op)
        kinds = {step.get("op") for step in sdk_tables._walk(case.state_steps())}
        special = kinds & {"held", "lowered", "counters"} or any(
            step.get("cancel") or "rewrite" in step or "export" in step for step in case.state_steps())
        if seen.get(key, 0) < 2 or special:
            seen[key] = seen.get(key, 0) + 1
            yield case


def test_the_readme_tables_are_current():
    text = sdk_tables.README.read_text()
    assert sdk_tables.updated(text, sdk_tables.render()) == text, \
        "conformance/sdk/cpp/README.md is stale: python -m conformance.sdk_tables --write"


def test_every_error_code_has_a_row_with_its_check_and_clause():
    table = sdk_tables.render()["codes"]
    for code in ErrorCode:
        assert f"| `{code.value}` | {code.summary} | {code.clause} |" in table


def test_the_requests_of_each_case_include_every_request_it_really_sends():
    """Run through a recording reference runtime, no case sends a request its profile's row lacks."""
    missing, every = {}, set()
    for case in _sample():
        sent: set[str] = set()
        run_case(case, Recording(ReferenceAdapter(), sent))
        every |= sent
        if sent - sdk_tables.case_requests(case):
            missing[case.id] = sorted(sent - sdk_tables.case_requests(case))
    assert not missing
    assert every == set(sdk_tables.REQUEST_ORDER)  # the sample sent every kind of request


def test_a_case_expecting_a_code_puts_its_profile_in_that_codes_row():
    case = next(c for c in load_cases() if c.id == "Required.Affine.Axis.Rejects_OutOfRangePositive")
    assert sdk_tables.case_codes(case) >= {"AFFINE_AXIS_INVALID"}
    row = next(line for line in sdk_tables.render()["codes"].splitlines() if "`AFFINE_AXIS_INVALID`" in line)
    assert row.endswith("| affine |")


@pytest.mark.parametrize(("edit", "status"), [(lambda text: text, 0), (lambda text: text.replace(
    "| `AFFINE_AXIS_INVALID` |", "| `AFFINE_AXIS_WRONG` |"), 1)], ids=["current", "stale"])
def test_check_exits_1_on_a_stale_readme(tmp_path, monkeypatch, edit, status):
    readme = tmp_path / "README.md"
    readme.write_text(edit(sdk_tables.README.read_text()))
    monkeypatch.setattr(sdk_tables, "README", readme)
    assert sdk_tables.main(["--check"]) == status


def test_a_readme_without_markers_is_a_one_line_error(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text("# no tables here\n")
    script = ("import sys, pathlib; from conformance import sdk_tables; "
              f"sdk_tables.README = pathlib.Path({str(readme)!r}); sys.exit(sdk_tables.main(['--check']))")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and "no markers" in done.stderr


def test_the_operators_of_a_state_trace_come_from_its_model_and_subgraphs():
    """A state case lists the operators its model runs (control-flow bodies and model-local functions
    included, roles named); cases of other operations run no model and list none."""
    cases = {case.id: case for case in load_cases()}
    assert sdk_tables.case_operators(cases["Required.State.Feedback.EquivalentToManualLoop"]) >= {"Add", "Identity"}
    assert sdk_tables.case_operators(cases["Required.Bindings.Declaration.NestedInFunctionBody"]) == {
        "If", "Identity", sdk_tables.LOCAL_FUNCTION}
    assert sdk_tables.case_operators(cases["Required.Affine.Storage.Int8PerTensor"]) == set()
    table = sdk_tables.render()["operators"]
    state_row = next(line for line in table.splitlines() if line.startswith("| `state` |"))
    assert "`onnx_light.conformance::Hold`" in state_row and "`onnx_light::Decode` (role `decode`)" in state_row
    assert next(line for line in table.splitlines() if line.startswith("| `affine` |")) == "| `affine` | - |"

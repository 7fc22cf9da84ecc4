"""Running one case against one adapter and judging the outcome.

Nothing an adapter does can crash the runner: a ``Rejected`` or ``NotSupported`` is classified, any
other exception fails the case with its traceback recorded.

In-process adapters get a per-case timeout: the case runs on a worker thread and fails when it does
not finish in time. Python cannot stop a thread, so the late case keeps running in the background
(it may still hold the adapter's resources), and native code that never releases the GIL cannot be
timed out at all. A runtime that can truly hang belongs behind the testee, whose process is killed; the
runner also runs cases in worker processes (conformance/workers.py), which it kills when they hang and
replaces when they die, the case in flight then ``crashed``.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
import traceback
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from conformance import operators
from conformance import values as V
from conformance.adapters import NotSupported, SuiteError
from conformance.adapters.testee_client import TesteeAdapter, TesteeFailure
from conformance.cases import Case
from conformance.judging import CaseFailure, call, compare, compare_digest, judge_rejection, one_line
from conformance.trace import run_trace

PASSED, FAILED, NOT_SUPPORTED = "passed", "failed", "not supported"
#: Every expectation held, but a rejection carried no error code, so the suite cannot tell it was for the
#: reason the case tests (a runtime that cannot load UINT4 at all "rejects" bad UINT4 padding). Not a
#: failure; never certifies a profile; ``--require-codes`` makes it a failure.
PASSED_WITHOUT_CODE = "passed without code"
PASSING = (PASSED, PASSED_WITHOUT_CODE)
#: The process running the case died (a signal, an abort, an exit in native code): the case failed, and the
#: runner went on with a new worker process. Reports count it on its own, as JUnit counts errors.
CRASHED = "crashed"

_abandoned = 0  # case threads left running after a timeout (see ``abandoned_cases``)


def abandoned_cases() -> int:
    """How many timed-out cases were left running on their threads in this process: a worker process
    that left one behind is replaced, so the late call cannot touch later cases."""
    return _abandoned


@dataclass
class Result:
    """The verdict of one case: ``passed``, ``passed without code``, ``failed``, ``not supported`` or
    ``crashed`` (expected failures are decided later, against a failure list). ``message`` is kept whole."""

    id: str
    verdict: str
    message: str = ""
    expected: str = ""
    actual: str = ""
    detail: str = ""
    traceback: str = ""
    duration: float = 0.0
    clauses: list[str] = field(default_factory=list)
    profile: str = ""
    level: str = ""
    code_checked: bool | None = None  # False when a rejection carried no error code
    expected_failure: bool = False
    operators: dict = field(default_factory=dict)  # role -> operator the model was rewritten to

    def to_json(self) -> dict:
        return asdict(self)


def run_case(case: Case, adapter: Any, require_codes: bool = False, timeout: float | None = None) -> Result:
    """Execute ``case`` on ``adapter`` and return its verdict, failing it after ``timeout`` seconds.

    Adapters that enforce their own timeouts (``handles_timeouts = True``, like the testee) run the
    case directly; see the module docstring for what an in-process timeout can and cannot do.
    """
    if not timeout or getattr(adapter, "handles_timeouts", False):
        return _run_case(case, adapter, require_codes)
    box: dict[str, Result] = {}
    worker = threading.Thread(target=lambda: box.setdefault("result", _run_case(case, adapter, require_codes)),
                              name=f"conformance case {case.id}", daemon=True)
    start = time.perf_counter()
    worker.start()
    worker.join(timeout)
    if "result" in box:
        return box["result"]
    global _abandoned
    _abandoned += 1
    result = Result(case.id, FAILED, clauses=case.clauses, profile=case.profile, level=case.level,
                    expected=case.summary(), actual=f"still running after {timeout:g} s")
    result.message = (f"timed out: the case did not finish within {timeout:g} s (--timeout). An in-process "
                      "adapter cannot be interrupted; its call was left running in the background. Run a "
                      "runtime that can hang through the testee (--testee), which kills it.")
    result.duration = time.perf_counter() - start
    return result


def _run_case(case: Case, adapter: Any, require_codes: bool) -> Result:
    result = Result(case.id, FAILED, clauses=case.clauses, profile=case.profile, level=case.level)
    result.expected = case.summary()
    start = time.perf_counter()
    workdir = tempfile.mkdtemp(prefix="conformance-")
    try:
        claimed = _claimed(adapter)
        if claimed is not None and case.profile not in claimed:
            raise NotSupported(f"the adapter does not claim profile {case.profile!r}")
        case.write_files(workdir)
        result.operators = operators.bound_model(case, adapter)[1]
        handler = _HANDLERS[case.op]
        code_checked = handler(case, adapter, workdir, require_codes)
        result.verdict = PASSED if code_checked is not False else PASSED_WITHOUT_CODE
        result.code_checked = code_checked
        result.message = "passed" if code_checked is not False else "passed, but a rejection carried no error code"
    except NotSupported as exc:
        result.verdict = NOT_SUPPORTED
        result.message = str(exc) or "not supported"
    except CaseFailure as failure:
        result.message = failure.message
        result.actual = failure.actual
        result.detail = failure.detail
        if failure.expected:
            result.expected = failure.expected
    except SuiteError as exc:
        result.message = f"suite error: {exc}"
    except TesteeFailure as exc:  # it crashed, hung or lied: what happened is the whole story
        result.message = f"testee failure: {one_line(str(exc))}"
        result.actual = one_line(exc.reason)
    except Exception as exc:  # noqa: BLE001 - the runner never crashes on an adapter exception
        result.message = f"unclassified {type(exc).__name__}: {one_line(str(exc))}"
        result.actual = f"raised {type(exc).__name__}"
        result.traceback = traceback.format_exc()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        if isinstance(adapter, TesteeAdapter):
            adapter.end_case()
        result.duration = time.perf_counter() - start
    return result


def _claimed(adapter: Any) -> set[str] | None:
    profiles = getattr(adapter, "profiles", None)
    if profiles is None:
        return None
    return set(profiles() if callable(profiles) else profiles)


def _verify(case: Case, adapter: Any, workdir: str, require_codes: bool):
    outcome = call(adapter, "verify", operators.model_bytes(case, adapter), workdir)
    return judge_rejection(outcome, case.expect, "the model", require_codes)


def _decode(case: Case, adapter: Any, workdir: str, require_codes: bool):
    outcome = call(adapter, "decode", operators.model_bytes(case, adapter), case.value, workdir)
    checked = judge_rejection(outcome, case.expect, f"decoding {case.value!r}", require_codes)
    if "error" in case.expect or outcome.rejected is not None:
        return checked
    if "values_digest" in case.expect:
        compare_digest(case.expect["values_digest"], outcome.value, case.extras().get("samples"), case.expect,
                       f"decoded {case.value!r}")
        return checked
    expected = expected_values(case)
    compare(expected, outcome.value, case.expect, f"decoded {case.value!r}")
    return checked


def expected_values(case: Case) -> Any:
    if "values" in case.expect:
        return V.build(case.expect["values"])
    if "expected" in case.extras():
        return case.extras()["expected"]
    raise SuiteError(f"{case.id}: no expected values")


def _fields(case: Case, adapter: Any, workdir: str, require_codes: bool):
    outcome = call(adapter, "read_fields", operators.model_bytes(case, adapter), case.value, workdir)
    checked = judge_rejection(outcome, case.expect, f"reading fields of {case.value!r}", require_codes)
    if "error" in case.expect or outcome.rejected is not None:
        return checked
    got = outcome.value
    for name, spec in case.expect.get("fields_digest", {}).items():
        if name not in got:
            raise CaseFailure(f"field {name!r} missing; fields are {sorted(got)}", actual=str(sorted(got)))
        samples = case.extras().get("field_samples", {}).get(name)
        compare_digest(spec, got[name], samples, case.expect, f"field {name!r}", name)
    wanted = case.extras()["fields"] if case.expect.get("fields_from_builder") else case.expect.get("fields", {})
    for name, literal in wanted.items():
        if name not in got:
            raise CaseFailure(f"field {name!r} missing; fields are {sorted(got)}", actual=str(sorted(got)))
        want = literal if isinstance(literal, np.ndarray) else V.build(literal)
        have = np.asarray(got[name])
        if want.dtype.kind in "iu" and have.dtype.kind in "iub":
            have = _as_integers(have, want.dtype, f"field {name!r}")
        compare(want, have, case.expect, f"field {name!r}", name)
    return checked


def _as_integers(values: np.ndarray, dtype: np.dtype, what: str) -> np.ndarray:
    """Bit fields: any integer width carries the same values, so ``values`` is compared as ``dtype`` when
    every value fits it. A value that would wrap (a UINT64 field read as a negative INT64) is a different
    value, not a different width."""
    info = np.iinfo(dtype)
    if values.size and (int(values.min()) < info.min or int(values.max()) > info.max):
        low, high = int(values.min()), int(values.max())
        raise CaseFailure(f"{what}: values from {low} to {high} do not fit the field's {dtype}",
                          expected=str(dtype), actual=f"{values.dtype} [{low}, {high}]")
    return values.astype(dtype)


def _roundtrip(case: Case, adapter: Any, workdir: str, require_codes: bool):
    data = operators.model_bytes(case, adapter)
    outcome = call(adapter, "roundtrip", data, base_dir=workdir)
    checked = judge_rejection(outcome, case.expect, "the round trip", require_codes)
    if "error" not in case.expect and outcome.rejected is None:
        check_model_bytes(data, outcome.value, case.expect)
    return checked


def _export(case: Case, adapter: Any, workdir: str, require_codes: bool):
    data = operators.model_bytes(case, adapter)
    outcome = call(adapter, "export", data, case.target or "onnx-light", base_dir=workdir)
    checked = judge_rejection(outcome, case.expect, f"export to {case.target}", require_codes)
    if "error" not in case.expect and outcome.rejected is None:
        produced, feedback = outcome.value, None
        if isinstance(produced, tuple):
            produced, feedback = produced
        if "feedback" in case.expect and [list(p) for p in feedback or []] != case.expect["feedback"]:
            raise CaseFailure(f"feedback mapping {feedback}, expected {case.expect['feedback']}",
                              expected=str(case.expect["feedback"]), actual=str(feedback))
        check_model_bytes(data, produced, case.expect)
    return checked


def _rewrite(case: Case, adapter: Any, workdir: str, require_codes: bool):
    data = operators.model_bytes(case, adapter)
    outcome = call(adapter, "rewrite", data, dict(case.rewrite or {}), base_dir=workdir)
    checked = judge_rejection(outcome, case.expect, f"rewrite {case.rewrite}", require_codes)
    if "error" not in case.expect and outcome.rejected is None:
        check_model_bytes(data, outcome.value, case.expect)
    return checked


def check_model_bytes(original: bytes, produced: Any, expect: dict) -> None:
    """Checks on a model an adapter wrote back: exact survival, bindings, names, absence of extensions."""
    from reference_impl import schema

    if not isinstance(produced, (bytes, bytearray)):
        raise CaseFailure(f"expected model bytes, got {type(produced).__name__}", actual=type(produced).__name__)
    produced = bytes(produced)
    try:
        model = schema.parse_model(produced)
    except Exception as exc:  # noqa: BLE001 - unparsable output is a failure, not a crash
        raise CaseFailure(f"the produced model does not parse: {exc}", actual="unparsable bytes") from None
    if expect.get("same_message"):
        before = schema.parse_model(original).SerializeToString(deterministic=True)
        after = model.SerializeToString(deterministic=True)
        if before != after:
            raise CaseFailure("the produced model differs from the input (fields or unknown fields lost)",
                              expected=f"{len(before)} bytes, identical content", actual=f"{len(after)} bytes",
                              detail=_first_diff(before, after))
    if "bindings" in expect:
        got = [[b.input_name, b.output_name] for b in model.graph.persistent_bindings]
        if got != [list(pair) for pair in expect["bindings"]]:
            raise CaseFailure(f"bindings {got}, expected {expect['bindings']}", expected=str(expect["bindings"]),
                              actual=str(got))
    for key, group in (("inputs", "input"), ("outputs", "output")):
        if key in expect:
            got = [vi.name for vi in getattr(model.graph, group)]
            want = list(expect[key])
            if (sorted(got) != sorted(want)) if expect.get("any_order") else (got != want):
                order = " (in any order)" if expect.get("any_order") else ""
                raise CaseFailure(f"graph {key} {got}, expected {want}{order}", actual=str(got))
    if expect.get("same_contract"):
        from conformance.model_view import contract_difference

        difference = contract_difference(schema.parse_model(original), model)
        if difference:
            raise CaseFailure(f"the produced model changed what the contract preserves: {difference}",
                              expected="the same catalogue, encoded values, bindings and graph",
                              actual=difference)
    if expect.get("standard_onnx"):
        _check_standard(model)
    if "struct_types" in expect and len(model.struct_types) != expect["struct_types"]:
        raise CaseFailure(f"{len(model.struct_types)} struct types, expected {expect['struct_types']}")
    if "keeps_encoded_initializers" in expect:
        have = {v.name for v in model.graph.encoded_initializer}
        lost = [name for name in expect["keeps_encoded_initializers"] if name not in have]
        if lost:
            raise CaseFailure(f"encoded initializers {lost} were dropped or merged away",
                              expected=f"keeps {expect['keeps_encoded_initializers']}", actual=str(sorted(have)))
    if "encoded_initializers" in expect:
        got = sorted(v.name for v in model.graph.encoded_initializer)
        if got != sorted(expect["encoded_initializers"]):
            raise CaseFailure(f"encoded initializers {got}, expected {expect['encoded_initializers']}")


def _check_standard(model) -> None:
    """A standard ONNX export carries no local extension (fields 1000-1099) anywhere."""
    import onnx

    plain = onnx.ModelProto()
    plain.ParseFromString(model.SerializeToString())
    if model.struct_types or model.graph.encoded_initializer or model.graph.persistent_bindings:
        raise CaseFailure("a standard ONNX export still carries local extension fields")
    try:
        onnx.checker.check_model(plain)
    except Exception as exc:  # noqa: BLE001 - the checker's verdict is the point
        raise CaseFailure(f"the standard export fails onnx.checker: {one_line(str(exc))}") from None


def _first_diff(a: bytes, b: bytes) -> str:
    for index, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return f"first difference at byte {index}: {x:#04x} versus {y:#04x}"
    return f"lengths {len(a)} versus {len(b)}"


def _state(case: Case, adapter: Any, workdir: str, require_codes: bool):
    return run_trace(case, adapter, workdir, require_codes)


_HANDLERS = {
    "verify": _verify,
    "decode": _decode,
    "fields": _fields,
    "roundtrip": _roundtrip,
    "state": _state,
    "export": _export,
    "rewrite": _rewrite,
}

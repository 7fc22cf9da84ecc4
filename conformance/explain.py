"""``show`` and ``explain``: a case as a person reads it, and one run of it with expected versus actual.

For a state case ``explain`` records the trace as it runs: every step with what it expects, what each
adapter call returned or raised, and where the case failed. The recording wraps the adapter and its
state handles (``RecordingAdapter``); the trace runner tells it which step is running
(``observe_step``), so nothing else in the runner knows about it.
"""

from __future__ import annotations

import functools
import json
import threading
from typing import Any

import numpy as np

from conformance import values as V
from conformance.cases import Case
from conformance.execute import PASSING, Result, run_case

#: Model text lines ``show`` prints before eliding the rest.
MODEL_LINES = 120
LINE_WIDTH = 160


# ----------------------------------------------------------------------------------------- show
def show(case: Case) -> str:
    """The case: identity, clauses, expectation, its steps (also a builder's) and its model."""
    from reference_impl.clauses import CLAUSES

    lines = [case.id, f"  defined in:   corpus/{case.source}",
             f"  level:        {case.level}    profile: {case.profile}    operation: {case.op}"]
    if case.description:
        lines.append(f"  description:  {case.description}")
    for clause in case.clauses:
        lines.append(f"  clause:       {clause} ({CLAUSES[clause].section}): {CLAUSES[clause].text}")
    lines += [f"  spec says:    \"{quote}\"" for quote in case.quote]
    lines += [f"  expects:      {case.summary()}", f"  expectation source: {case.expectation_source}",
              f"  sha256:       {case.sha256()}"]
    if case.value:
        lines.append(f"  value:        {case.value}")
    if case.expect:
        lines.append(f"  expect:       {json.dumps(case.expect)}")
    for index, step in enumerate(case.state_steps()):
        lines.append(f"  step {index}: {literal_text(step)}")
    if case.builder:
        lines.append(f"  builder:      {case.builder}({json.dumps(case.args)})")
    lines.append("  model (text format):")
    lines += ["    " + line for line in model_text(case)]
    if case.merge:
        lines.append("  merged onto the model:")
        lines += ["    " + line for line in case.merge.strip().splitlines()]
    return "\n".join(lines)


def model_text(case: Case) -> list[str]:
    """The model as the case builds it, in protobuf text format (long lines and long models elided)."""
    from google.protobuf import text_format

    from reference_impl import schema

    if case.model_text is not None and not case.merge and not case.builder:
        text = case.model_text.strip()
    else:
        try:
            text = text_format.MessageToString(schema.parse_model(case.model_bytes())).strip()
        except Exception as error:  # noqa: BLE001 - raw-byte builders may not parse as a model
            return [f"({len(case.model_bytes())} bytes that do not parse as a model: {error})"]
    lines = [line if len(line) <= LINE_WIDTH else line[:LINE_WIDTH] + " …" for line in text.splitlines()]
    if len(lines) > MODEL_LINES:
        lines = lines[:MODEL_LINES] + [f"… {len(lines) - MODEL_LINES} more lines"]
    return lines


def literal_text(obj: Any, items: int = 6) -> str:
    """A step or value literal on one line, tensors shortened to their first values."""
    if isinstance(obj, dict):
        if "dtype" in obj and "data" in obj and isinstance(obj["data"], list) and len(obj["data"]) > items:
            head = ", ".join(_number(x) for x in obj["data"][:items])
            return f"{{{obj['dtype']}{obj.get('shape', [])} [{head}, … {len(obj['data'])} values]}}"
        return "{" + ", ".join(f"{k} = {literal_text(v, items)}" for k, v in obj.items()) + "}"
    if isinstance(obj, list):
        return "[" + ", ".join(literal_text(v, items) for v in obj) + "]"
    return json.dumps(obj) if isinstance(obj, str) else _number(obj)


def _number(x: Any) -> str:
    return f"{x:.6g}" if isinstance(x, float) else str(x)


# -------------------------------------------------------------------------------------- explain
def explain(case: Case, adapter: Any, timeout: float | None = None) -> tuple[Result, str]:
    """Run ``case`` once and describe it: verdict, expected, actual, the whole message, and for a state
    case every step with its expectation and what the adapter did; for any other case the spec's words,
    the model and what the adapter's call returned or raised."""
    if case.op == "state":
        recorder: Any = RecordingAdapter(adapter)
    else:
        recorder = CallRecorder(adapter)
    result = run_case(case, recorder, timeout=timeout)
    return result, describe_result(case, result, recorder)


def explain_reported(case: Case, report_dir: str) -> tuple[Result, str]:
    """Describe ``case`` as a run recorded it in ``report_dir``/results.json, without running anything."""
    import pathlib

    from conformance.adapters import SuiteError

    path = pathlib.Path(report_dir) / "results.json"
    try:
        results = json.loads(path.read_text())["results"]
        found = next((r for r in results if isinstance(r, dict) and r.get("id") == case.id), None)
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise SuiteError(f"{path}: not a run's results.json ({type(error).__name__})") from None
    if found is None:
        raise SuiteError(f"{path} has no result for {case.id}")
    known = set(Result.__dataclass_fields__)
    result = Result(**{key: value for key, value in found.items() if key in known})
    return result, describe_result(case, result, None)


def describe_result(case: Case, result: Result, recorder: Any) -> str:
    """The text of ``explain``: verdict, expected versus actual, and what shows why."""
    actual = result.actual or ('as expected' if result.verdict in PASSING else '-')
    if isinstance(recorder, CallRecorder) and recorder.calls:
        actual = "; ".join(recorder.calls)
    lines = [f"{case.id}: {result.verdict}", f"  clauses:  {', '.join(case.clauses)}"]
    lines += [f"  spec says: \"{quote}\"" for quote in case.quote]
    lines += [f"  expected: {expected_result(case, result)}", f"  actual:   {actual}",
              f"  message:  {result.message}"]
    if result.detail:
        lines.append("  detail:\n" + "\n".join("    " + line for line in result.detail.splitlines()))
    if isinstance(recorder, RecordingAdapter):
        lines.append("  trace:")
        lines += recorder.describe(case, result)
    if case.op != "state":
        lines.append("  model (text format):")
        lines += ["    " + line for line in model_text(case)]
    if result.traceback:
        lines.append("  traceback:\n" + "\n".join("    " + line for line in result.traceback.splitlines()))
    return "\n".join(lines)


def expected_result(case: Case, result: Result) -> str:
    """What the case expects: the run's own words, with the expected values of a decode."""
    from conformance.execute import expected_values

    text = result.expected or case.summary()
    if case.op == "decode" and "values" in case.expect and text == case.summary():
        try:
            text += f": {V.describe(expected_values(case))}"
        except Exception:  # noqa: BLE001 - a case whose values cannot be built says so in the run
            pass
    return text


class CallRecorder:
    """The adapter under test, with what its one-shot calls (verify, decode, ...) returned or raised."""

    OPERATIONS = ("verify", "decode", "read_fields", "roundtrip", "export", "rewrite")

    def __init__(self, adapter: Any):
        self._adapter = adapter
        self.calls: list[str] = []

    def __getattr__(self, name: str):
        member = getattr(self._adapter, name)
        if name not in self.OPERATIONS or not callable(member):
            return member

        @functools.wraps(member)
        def recorded(*args, **keywords):
            try:
                value = member(*args, **keywords)
            except BaseException as exc:
                code = getattr(exc, "code", None)
                self.calls.append(f"{name} raised {type(exc).__name__}" + (f" {code}" if code else "")
                                  + f": {_message(exc)}")
                raise
            self.calls.append(f"{name} -> " + ("accepted" if value is None else _value_text(value)))
            return value

        return recorded


class RecordingAdapter:
    """The adapter under test, with every call it and its state handles answer recorded per step.

    A trace retried with a longer first call (a concurrency step that did not overlap) starts the
    record again, so what is shown is the last attempt, the one that decided the verdict."""

    def __init__(self, adapter: Any):
        self._adapter = adapter
        self._lock = threading.Lock()
        self.steps: list[dict] = []
        self.trace = None

    def __getattr__(self, name: str):
        return getattr(self._adapter, name)

    # the trace runner calls this before each step
    def observe_step(self, trace, index: int, step: dict) -> None:
        with self._lock:
            if index == 0 or trace is not self.trace:
                self.steps = []
            self.trace = trace
            self.steps.append({"index": index, "step": step, "state": trace.current, "calls": []})

    def log(self, text: str) -> None:
        with self._lock:
            if self.steps:
                self.steps[-1]["calls"].append(text)

    def open_state(self, *args):
        handle = _call(self, "open_state", self._adapter.open_state, args)
        return RecordingHandle(handle, self)

    def describe(self, case: Case, result: Result) -> list[str]:
        steps = case.state_steps()
        done = {entry["index"]: entry for entry in self.steps}
        last = max(done) if done else -1
        failed = result.verdict not in PASSING
        lines = []
        for index, step in enumerate(steps):
            where = f" (state {step['state']})" if "state" in step else ""
            lines.append(f"    step {index}: {step.get('op')}{where}")
            lines.append(f"      expected: {expected_text(step)}")
            entry = done.get(index)
            if entry is None:
                lines.append("      actual:   not reached")
                continue
            calls = entry["calls"][:_CALLS.get(step.get("op"), 0) or int(step.get("count", 0))]
            actual = "; ".join(calls) or observed_text(self.trace, step)
            lines.append(f"      actual:   {actual}")
            if failed and index == last:
                lines.append(f"      >>> the case failed here: {result.message}")
        return lines


#: Adapter calls a step makes (the runner closes every state after the last step; those calls are not
#: the step's). ``repeat`` makes ``count`` calls; identity, check and readonly steps make none.
_CALLS = {"open": 1, "run": 1, "values": 1, "reset": 1, "close": 1, "counters": 1, "concurrent": 2}


class RecordingHandle:
    """A state handle whose calls are recorded; every other member is the handle's own."""

    def __init__(self, handle: Any, recorder: RecordingAdapter):
        self._handle = handle
        self._recorder = recorder

    def __getattr__(self, name: str):
        member = getattr(self._handle, name)
        if name in ("run", "run_cancelled", "values", "reset", "close", "counters") and callable(member):
            return lambda *args: _call(self._recorder, name, member, args)
        return member


def _call(recorder: RecordingAdapter, name: str, fn, args: tuple):
    try:
        value = fn(*args)
    except BaseException as exc:
        code = getattr(exc, "code", None)
        kind = type(exc).__name__
        recorder.log(f"{name} raised {kind}" + (f" {code}" if code else "") + f": {_message(exc)}")
        raise
    recorder.log(f"{name} -> {_value_text(value)}")
    return value


def _message(exc: BaseException) -> str:
    return " ".join(str(getattr(exc, "message", "") or exc).split())


def _value_text(value: Any) -> str:
    if isinstance(value, dict) and value:
        return "{" + ", ".join(f"{k}: {V.describe(v)}" for k, v in value.items()) + "}"
    if value is None or isinstance(value, dict):
        return "ok"
    return V.describe(value) if isinstance(value, (np.ndarray, list, V.Struct, V.Encoded)) else type(value).__name__


def expected_text(step: dict) -> str:
    """What a step expects, in words."""
    op = step.get("op")
    error = step.get("error")
    if op == "concurrent":
        second = step.get("second", {}).get("op", "run")
        return f"a {second} issued while a run is active is rejected with {error or 'STATE_BUSY'}"
    if error:
        also = list(step.get("also", [])) + ([step["cause"]] if isinstance(step.get("cause"), str)
                                             else list(step.get("cause", [])))
        text = f"rejected with {error}" + (f" (or {', '.join(also)})" if also else "")
        return text + (", or accepted" if step.get("optional") else "")
    if op == "identity":
        parts = [f"one buffer for {group}" for group in step.get("same", [])]
        parts += [f"distinct buffers for {group}" for group in step.get("distinct", [])]
        return "; ".join(parts)
    if op == "readonly":
        return f"read-only: {step.get('refs')}"
    if op == "check":
        parts = [f"{step['ref']} equals {literal_text(step['equals'])}"] if "equals" in step else []
        if "layout" in step:
            parts.append(f"{step['ref']} has layout {step['layout']}")
        return "; ".join(parts)
    if op == "counters":
        bounds = {k: step[k] for k in ("at_most", "at_least", "equals") if k in step}
        return f"counters {bounds}" + (f" since {step['since']}" if "since" in step else "")
    if op == "repeat":
        return f"{step.get('count')} times: {expected_text(step.get('step', {}))}"
    wanted = step.get("outputs") or step.get("values")
    if wanted:
        return "accepted; " + ", ".join(f"{name} = {literal_text(v)}" for name, v in wanted.items())
    return "accepted"


def observed_text(trace, step: dict) -> str:
    """For steps that make no adapter call: what the runner saw (buffer ids, flags, values)."""
    if trace is None:
        return "-"
    op = step.get("op")
    try:
        if op == "identity":
            refs = [r for group in step.get("same", []) + step.get("distinct", []) for r in group]
            return ", ".join(f"{r} = {_hex(trace.identify(r))}" for r in refs)
        if op == "readonly":
            flags = {r: getattr(trace.ref(r), "flags", None) for r in step.get("refs", [])}
            return ", ".join(f"{r} writable={bool(f is not None and f.writeable)}" for r, f in flags.items())
        if op == "check":
            return f"{step['ref']} = {V.describe(trace.ref(step['ref']))}"
    except Exception as error:  # noqa: BLE001 - an unresolvable reference is shown, not raised
        return f"({error})"
    return "-"


def _hex(value: int | None) -> str:
    return "none" if value is None else hex(value)

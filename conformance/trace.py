"""State traces: scripted open/run/values/reset/close steps with expected outputs, errors and buffer
identities.

Step tables (``[[case.step]]``)::

    {op = "open",   initial = {name = <literal>}, as = "init", error = "CODE"?}
    {op = "run",    feeds = {...}, as = "r1", outputs = {name = <literal>}, output_names = [...], error?}
    {op = "values", as = "v1", values = {...}, names = [...]}
    {op = "reset",  initial = {...}, as = "init2", error?}
    {op = "close",  error?}
    {op = "check",  ref = "r1|present", equals = <literal>}           # an outstanding view is intact
    {op = "check",  ref = "r2|cache|blocks|0|key", layout = "affine", storage_type = 22}  # encoded layout
    {op = "identity", same = [["init|past", "v1|past"]], distinct = [["r1|y", "r2|y"]]}
    {op = "concurrent", first = {feeds = {...}}, second = {op = "run", feeds = {...}}, error = "STATE_BUSY",
     scale_feed = "iterations"}
    {op = "counters", as = "c2", since = "c1", at_most = {payload_bytes_copied = 0}, equals = {...}}

Error keys on any step: ``error`` (the code), ``also`` (codes equally justified), ``cause`` (codes that
may explain a ``STATE_RUN_FAILED``: each is also accepted as the code itself, and when the rejection
names its causes — the structured ``causes`` field, never message text — one of them must be among
these) and ``optional`` (the step may succeed instead; a later step must then raise the error). A run
with ``cancel = true`` is issued with cancellation already requested (handles implement
``run_cancelled(feeds)``).

A ``counters`` step reads the runtime's own counters for the state (``counters()`` on the handle, see
docs/testee-protocol.md for the names) and bounds them, or their growth ``since`` an earlier counters
step. A runtime that reports no counters, or not the one a step needs, gets "not supported" for the case:
the property cannot be observed from outside.

A reference ``label|name[|field...]`` names a value seen at a labelled step: a run's outputs (or its
feeds), a values() result, or the initial values given to open/reset. Literals may be ``{ref = ...}``.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np

from conformance import operators
from conformance import values as V
from conformance.adapters import NotSupported, SuiteError
from conformance.execute import CaseFailure, Outcome, call, classify, compare, judge_rejection

#: How long the first of two concurrent calls is given to start before the second is issued.
CONCURRENT_DELAY = 0.05
CONCURRENT_ATTEMPTS = 4
#: An accepted second call counts against the runtime only if the first call's reply came at least this
#: long after the second was issued; closer than that, the first may simply have finished already (its
#: reply still in flight or unread on a loaded machine), so the step is retried with a longer first call.
CONCURRENT_MARGIN = 0.1


class Inconclusive(Exception):
    """The first call finished before the second could overlap it; retry with a longer first call."""


class Trace:
    def __init__(self, case, adapter, workdir: str, require_codes: bool, scale: int):
        self.case = case
        self.adapter = adapter
        self.workdir = workdir
        self.require_codes = require_codes
        self.scale = scale
        self.handles: dict[str, Any] = {}
        self.current = "main"
        self.seen: dict[str, dict[str, Any]] = {}
        self.code_checked: bool | None = None

    # --------------------------------------------------------------------------------- helpers
    def ref(self, text: str) -> Any:
        label, _, rest = text.partition("|")
        if label not in self.seen:
            raise SuiteError(f"{self.case.id}: reference {text!r} names no labelled step")
        parts = rest.split("|")
        found = self.seen[label]
        if parts[0] not in found:
            raise CaseFailure(f"{text!r}: {parts[0]!r} is not among {sorted(found)}", actual=str(sorted(found)))
        try:
            return V.leaf(found[parts[0]], parts[1:])
        except (KeyError, IndexError, ValueError):
            raise CaseFailure(f"{text!r}: the value has no field path {parts[1:]}") from None

    def build(self, literals: dict) -> dict[str, Any]:
        return {name: V.build(literal, self.ref) for name, literal in (literals or {}).items()}

    def identify(self, value: Any) -> int | None:
        """The buffer id the adapter reports (any open state may know the value), else its address."""
        for handle in self.handles.values():
            probe = getattr(handle, "buffer_id", None)
            found = probe(value) if probe is not None else None
            if found is not None:
                return found
        return V.default_buffer_id(value)

    def judge(self, outcome: Outcome, step: dict, what: str) -> bool:
        """True when the step succeeded (and success was expected, or the error was ``optional``)."""
        if step.get("optional") and outcome.rejected is None:
            return True
        causes = _codes(step.get("cause"))
        expect = {"error": step["error"], "also": list(step.get("also", [])) + causes} if "error" in step else {}
        checked = judge_rejection(outcome, expect, what, self.require_codes)
        named = tuple(getattr(outcome.rejected, "causes", ()) or ()) if outcome.rejected is not None else ()
        if checked and causes and named and outcome.rejected.code not in causes \
                and not any(cause in causes for cause in named):
            raise CaseFailure(f"{what} was rejected with {outcome.rejected.code} because of {', '.join(named)}, "
                              f"not {' or '.join(causes)}", expected=f"rejected because of {causes[0]}",
                              actual=f"rejected with {outcome.rejected.code} ({', '.join(named)})",
                              detail=outcome.rejected.message)
        if checked is not None:
            self.code_checked = checked if self.code_checked is not False else False
        return outcome.rejected is None

    @property
    def handle(self):
        return self.handles.get(self.current)

    def need_handle(self, index: int) -> None:
        if self.handle is None:
            raise SuiteError(f"{self.case.id}: step {index} needs an open state {self.current!r}")

    # ----------------------------------------------------------------------------------- steps
    def step_open(self, index: int, step: dict) -> None:
        initial = self.build(step.get("initial"))
        outcome = call(self.adapter, "open_state", operators.model_bytes(self.case, self.adapter), initial,
                       self.workdir)
        if self.judge(outcome, step, f"step {index} (open)"):
            self.handles[self.current] = outcome.value
            self.remember(step, initial)

    def step_run(self, index: int, step: dict) -> None:
        self.need_handle(index)
        feeds = self.build(step.get("feeds"))
        method = "run_cancelled" if step.get("cancel") else "run"
        if method == "run_cancelled" and getattr(self.handle, method, None) is None:
            raise NotSupported("the adapter cannot request cancellation (its state handle has no run_cancelled())")
        outcome = call(self.handle_with_classifier(), method, feeds)
        if not self.judge(outcome, step, f"step {index} ({method})"):
            return
        outputs = outcome.value
        if not isinstance(outputs, dict):
            raise CaseFailure(f"step {index}: run() returned {type(outputs).__name__}, not a dict")
        if "output_names" in step and sorted(outputs) != sorted(step["output_names"]):
            raise CaseFailure(f"step {index}: outputs {sorted(outputs)}, expected {sorted(step['output_names'])}")
        self.expect_values(index, "output", outputs, step.get("outputs", {}), step)
        self.remember(step, outputs, feeds)

    def step_values(self, index: int, step: dict) -> None:
        self.need_handle(index)
        outcome = call(self.handle_with_classifier(), "values")
        if not self.judge(outcome, step, f"step {index} (values)"):
            return
        current = outcome.value
        if "names" in step and sorted(current) != sorted(step["names"]):
            raise CaseFailure(f"step {index}: retained values {sorted(current)}, expected {sorted(step['names'])}",
                              expected=str(sorted(step["names"])), actual=str(sorted(current)))
        self.expect_values(index, "retained value", current, step.get("values", {}), step)
        self.remember(step, current)

    def step_reset(self, index: int, step: dict) -> None:
        self.need_handle(index)
        initial = self.build(step.get("initial"))
        outcome = call(self.handle_with_classifier(), "reset", initial)
        if self.judge(outcome, step, f"step {index} (reset)"):
            self.remember(step, initial)

    def step_close(self, index: int, step: dict) -> None:
        self.need_handle(index)
        self.judge(call(self.handle_with_classifier(), "close"), step, f"step {index} (close)")

    def step_repeat(self, index: int, step: dict) -> None:
        inner = step["step"]
        handler = _STEPS[inner.get("op", "run")]
        for _ in range(int(step["count"])):
            handler(self, index, inner)

    def step_readonly(self, index: int, step: dict) -> None:
        """A retained or returned view must not be writable through the view the runtime handed out."""
        for ref in step["refs"]:
            value = self.ref(ref)
            flags = getattr(value, "flags", None)
            if flags is not None and flags.writeable:
                raise CaseFailure(f"step {index}: {ref} is writable; shared and retained buffers are read-only",
                                  expected="read-only view", actual="writable array")

    def step_check(self, index: int, step: dict) -> None:
        actual = self.ref(step["ref"])
        if "equals" in step:
            compare(V.build(step["equals"], self.ref), actual, step, f"step {index}: {step['ref']}")
        if "layout" in step:
            _check_layout(actual, step, f"step {index}: {step['ref']}")

    def step_identity(self, index: int, step: dict) -> None:
        for group in step.get("same", []):
            ids = [self.identify(self.ref(r)) for r in group]
            if None in ids or len(set(ids)) != 1:
                raise CaseFailure(f"step {index}: {group} should share one buffer",
                                  expected="one buffer", actual=", ".join(f"{r}={_hex(i)}" for r, i in zip(group, ids)))
        for group in step.get("distinct", []):
            ids = [self.identify(self.ref(r)) for r in group]
            if len(set(ids)) != len(ids):
                raise CaseFailure(f"step {index}: {group} should be distinct buffers",
                                  expected="distinct buffers", actual=", ".join(_hex(i) for i in ids))

    def step_concurrent(self, index: int, step: dict) -> None:
        """Issue ``second`` while ``first`` (a run) is still active; the second must be rejected."""
        self.need_handle(index)
        feeds = self.build(step["first"].get("feeds"))
        scale_feed = step.get("scale_feed")
        if scale_feed and self.scale > 1:
            array = np.asarray(feeds[scale_feed])
            feeds[scale_feed] = np.ascontiguousarray(np.tile(array, (self.scale,) + (1,) * (array.ndim - 1)))
        handle = self.handle_with_classifier()
        box: dict[str, Outcome | BaseException] = {}
        started = threading.Event()

        def first() -> None:
            started.set()
            try:
                box["first"] = call(handle, "run", feeds)
            except BaseException as exc:  # noqa: BLE001 - re-raised in the trace thread
                box["first"] = exc
            box["first_done"] = time.perf_counter()

        worker = threading.Thread(target=first, daemon=True)
        worker.start()
        started.wait()
        time.sleep(CONCURRENT_DELAY)
        overlapped = worker.is_alive()
        second = step["second"]
        op = second.get("op", "run")
        args = (self.build(second.get("feeds")),) if op == "run" else \
            (self.build(second.get("initial")),) if op == "reset" else ()
        second_sent = time.perf_counter()
        try:
            second_outcome = call(handle, op, *args)
        finally:
            worker.join(timeout=120)
        first_outcome = box.get("first")
        if isinstance(first_outcome, BaseException):
            raise first_outcome
        if not overlapped or worker.is_alive():
            if worker.is_alive():
                raise CaseFailure(f"step {index}: the first call did not finish within 120 s")
            raise Inconclusive()
        if second_outcome.rejected is None and box["first_done"] - second_sent < CONCURRENT_MARGIN:
            raise Inconclusive()  # accepted, but possibly only because the first had already finished
        if first_outcome.rejected is not None:
            raise CaseFailure(f"step {index}: the first call failed: {first_outcome.rejected}",
                              actual=str(first_outcome.rejected))
        self.judge(second_outcome, step, f"step {index} ({op} during an active run)")
        self.remember(step, first_outcome.value or {})

    def step_counters(self, index: int, step: dict) -> None:
        """Bound the runtime's own counters (or their growth since an earlier counters step)."""
        self.need_handle(index)
        outcome = call(self.handle_with_classifier(), "counters")
        if not self.judge(outcome, step, f"step {index} (counters)"):
            return
        current = {str(k): int(v) for k, v in dict(outcome.value).items()}
        base = {}
        if "since" in step:
            earlier = self.seen.get(step["since"], {}).get(_COUNTERS)
            if earlier is None:
                raise SuiteError(f"{self.case.id}: step {index} counts since {step['since']!r}, "
                                 "which is not a counters step")
            base = earlier
        checks = (("at_most", lambda have, bound: have <= bound, "at most"),
                  ("at_least", lambda have, bound: have >= bound, "at least"),
                  ("equals", lambda have, bound: have == bound, "exactly"))
        for key, holds, words in checks:
            for name, bound in step.get(key, {}).items():
                if name not in current:
                    raise NotSupported(f"the runtime does not report the counter {name!r}")
                have = current[name] - base.get(name, 0)
                if not holds(have, int(bound)):
                    growth = f" since {step['since']}" if "since" in step else ""
                    raise CaseFailure(f"step {index}: counter {name}{growth} is {have}, expected {words} {bound}",
                                      expected=f"{name} {words} {bound}", actual=str(have))
        label = step.get("as")
        if label:
            self.seen[label] = {_COUNTERS: current}

    # --------------------------------------------------------------------------------- support
    def handle_with_classifier(self):
        """The handle, with the adapter's classifier available to ``call``."""
        return _Classified(self.handle, self.adapter)

    def remember(self, step: dict, named: dict[str, Any], feeds: dict[str, Any] | None = None) -> None:
        """Label a step's values; a run's outputs shadow its feeds of the same name."""
        label = step.get("as")
        if label:
            self.seen[label] = {**(feeds or {}), **named}

    def expect_values(self, index: int, kind: str, got: dict, expected: dict, step: dict) -> None:
        for name, literal in expected.items():
            if name not in got:
                raise CaseFailure(f"step {index}: no {kind} {name!r}; got {sorted(got)}", actual=str(sorted(got)))
            compare(V.build(literal, self.ref), got[name], step, f"step {index}: {kind} {name!r}", name)


class _Classified:
    """A state handle seen through its adapter's exception classifier."""

    def __init__(self, handle, adapter):
        self._handle = handle
        self._adapter = adapter

    def __getattr__(self, name: str):
        return getattr(self._handle, name)

    def classify(self, exc: BaseException):
        own = getattr(self._handle, "classify", None)
        found = own(exc) if own else None
        return found if found is not None else classify(self._adapter, exc)


_COUNTERS = "\0counters"  # where a counters step keeps its snapshot among the labelled values


def _codes(value) -> list[str]:
    return [] if value is None else [value] if isinstance(value, str) else list(value)


def _check_layout(value: Any, step: dict, what: str) -> None:
    """An encoded value's header names the expected layout (``affine`` with ``storage_type``, or
    ``struct_type`` with ``type_ref``)."""
    if not isinstance(value, V.Encoded):
        raise CaseFailure(f"{what}: expected an encoded value, got {V.describe(value)}", actual=V.describe(value))
    header = value.header
    layout = header.WhichOneof("layout")
    found = {"layout": layout}
    if layout == "affine":
        found["storage_type"] = header.affine.storage_type
    elif layout == "struct_type" and header.struct_type.WhichOneof("kind") == "type_ref":
        found["type_ref"] = header.struct_type.type_ref
    wanted = {key: step[key] for key in ("layout", "storage_type", "type_ref") if key in step}
    if any(found.get(key) != item for key, item in wanted.items()):
        raise CaseFailure(f"{what}: encoded layout {found}, expected {wanted}", expected=str(wanted),
                          actual=str(found))


def _hex(value: int | None) -> str:
    return "none" if value is None else hex(value)


_STEPS = {"open": Trace.step_open, "run": Trace.step_run, "values": Trace.step_values, "reset": Trace.step_reset,
          "close": Trace.step_close, "check": Trace.step_check, "identity": Trace.step_identity,
          "concurrent": Trace.step_concurrent, "readonly": Trace.step_readonly, "repeat": Trace.step_repeat,
          "counters": Trace.step_counters}


def run_trace(case, adapter, workdir: str, require_codes: bool) -> bool | None:
    """Run every step; a concurrency step that could not overlap is retried with a longer first call."""
    scale = 1
    for _attempt in range(CONCURRENT_ATTEMPTS):
        trace = Trace(case, adapter, workdir, require_codes, scale)
        try:
            _run_steps(trace)
            return trace.code_checked
        except Inconclusive:
            scale *= 8
        finally:
            _close_quietly(trace)
    raise CaseFailure("could not observe two overlapping calls: the first call always finished first",
                      actual=f"{CONCURRENT_ATTEMPTS} attempts, last scale {scale // 8}")


def _run_steps(trace: Trace) -> None:
    steps = trace.case.steps or trace.case.extras().get("steps", [])
    if not steps:
        raise SuiteError(f"{trace.case.id}: a state case needs steps")
    for index, step in enumerate(steps):
        op = step.get("op")
        handler = _STEPS.get(op)
        if handler is None:
            raise SuiteError(f"{trace.case.id}: unknown step op {op!r}")
        trace.current = step.get("state", "main")
        handler(trace, index, step)
        if op == "open" and trace.handle is None and not step.get("continue"):
            return  # a rejected open ends the trace


def _close_quietly(trace: Trace) -> None:
    for handle in trace.handles.values():
        try:
            handle.close()
        except Exception:  # noqa: BLE001 - closing twice is allowed to fail
            pass

"""State traces: scripted open/run/values/reset/close steps with expected outputs, errors and buffer
identities.

Step tables (``[[case.step]]``)::

    {op = "open",   initial = {name = <literal>}, as = "init", error = "CODE"?}
    {op = "run",    feeds = {...}, as = "r1", feeds_as = "f1", outputs = {name = <literal>}, output_names = [...],
     error?}
    {op = "values", as = "v1", values = {...}, names = [...]}
    {op = "reset",  initial = {...}, as = "init2", error?}
    {op = "close",  error?}
    {op = "check",  ref = "r1|present", equals = <literal>}           # an outstanding view is intact
    {op = "check",  ref = "r2|cache|blocks|0|key", layout = "affine", storage_type = 22}  # encoded layout
    {op = "identity", same = [["init|past", "v1|past"]], distinct = [["r1|y", "r2|y"]]}
    {op = "held", run = {feeds = {...}, as = "r2"}, second = {op = "run|reset|close", ...}, error = "STATE_BUSY",
     may_wait = true, rejected = [steps], waited = [steps]}
    {op = "held", run = {feeds = {...}, as = "r2"}, cancel = true, cancelled = [steps], completed = [steps]}
    {op = "held", run = {...}, second = {state = "b", op = "run", feeds = {...}, as = "rb", outputs = {...}}}
    {op = "counters", as = "c2", since = "c1", at_most = {payload_bytes_copied = 0}, equals = {...}}
    {op = "open",   rewrite = {kind = "rename", ...} | export = "onnx-light", initial = {...}}
    {op = "open",   state = "b", model = "other", initial = {...}}  # one of the case's ``models``
    {op = "file",   path = "weights.bin", replace = {hex = "..."} | remove = true}
    {op = "forget", labels = ["init", "r1"]}        # the caller drops its references to those values
    {op = "lowered", calls = [{feeds = {...}, outputs = {...}}, ...], initial = {...}}

Error keys on any step: ``error`` (the code), ``also`` (codes equally justified), ``cause`` (codes that
may explain a ``STATE_RUN_FAILED``: each is also accepted as the code itself, and when the rejection
names its causes — the structured ``causes`` field, never message text — one of them must be among
these) and ``optional`` (the step may succeed instead; a later step must then raise the error, or the
steps listed under ``if_accepted`` / ``if_rejected`` check what each outcome must leave behind). A run
with ``cancel = true`` is issued with cancellation already requested (handles implement
``run_cancelled(feeds)``).

A ``held`` step issues its ``run`` held at the model's ``Hold`` node (conformance/hold.py), so the call is
certainly active, with no timing involved. With ``second``, that call is issued while the run is parked:
it must be rejected with ``error`` (``STATE_BUSY``); with ``may_wait = true`` (reset and close: "neither may
race with an active call") it may instead wait for the run and take effect after it, but never return while
the run is still parked. With ``cancel = true``, cancellation is requested while the run is parked, then
the run is released: it either ends with ``STATE_CANCELLED`` or completes (the request came too late). The
steps listed under the branch that happened (``rejected``/``waited``, ``cancelled``/``completed``) run next.
A ``second`` naming another ``state`` is a call on an independent state: it must succeed, with its
``outputs``, while the first run stays parked (it is given ``INDEPENDENT_TIMEOUT`` before the run is
released, so load never decides the verdict; only a runtime that holds independent states back waits).
With ``may_wait = true`` (a reset or close: "Reset or close cannot race with a call" may be kept with one
guard per model; a run or a values() call: the spec rejects only simultaneous calls on the same state and
leaves scheduling to other work) it may instead wait for the run, but must still succeed; the run is then
released after ``SECOND_CALL_GRACE``, since no verdict depends on which way the call went.

A ``counters`` step reads the runtime's own counters for the state (``counters()`` on the handle, see
docs/testee-protocol.md for the names) and bounds them, or their growth ``since`` an earlier counters
step. A runtime that reports no counters, or not the one a step needs, gets "not supported" for the case:
the property cannot be observed from outside.

An ``open`` with ``rewrite`` or ``export`` opens the state over the model the adapter produced from the
case's model (a rewrite, or an ``onnx-light`` save/load), so a rename or a round trip is checked by running
it. A ``file`` step replaces (by writing a new file and renaming it over the old one, so existing mappings
keep the old bytes) or removes an external payload file of the case. A ``lowered`` step exports the
model with ``onnx-lowered`` and runs the produced standard model with onnx's reference evaluator, feeding
outputs back through the returned feedback mapping as a caller would; each call's outputs must match.

A reference ``label|name[|field...]`` names a value seen at a labelled step: a run's outputs (or its
feeds), a values() result, or the initial values given to open/reset. Literals may be ``{ref = ...}``.
"""

from __future__ import annotations

import os
import pathlib
import threading
from typing import Any

import numpy as np

from conformance import measured, operators
from conformance import values as V
from conformance.adapters import NotSupported, SuiteError
from conformance.hold import Hold
from conformance.judging import CaseFailure, Outcome, call, classify, compare, judge_rejection

#: How long a second call may take to come back while the first run is parked before the runner releases
#: the run. It only decides which branch is observed (a rejection or a call that waits for the run); no
#: verdict depends on it.
SECOND_CALL_GRACE = 0.2
#: How long a call on another state may take while a run is parked (a correct runtime answers at once).
INDEPENDENT_TIMEOUT = 30.0
#: How long a held run may take to reach its Hold node, and a released call to finish.
HOLD_TIMEOUT = 120.0


class Trace:
    def __init__(self, case, adapter, workdir: str, require_codes: bool):
        self.case = case
        self.adapter = adapter
        self.workdir = workdir
        self.require_codes = require_codes
        self.handles: dict[str, Any] = {}
        self.current = "main"
        self.seen: dict[str, dict[str, Any]] = {}
        self.origin: dict[str, str] = {}  # step label -> the state it ran on
        self.code_checked: bool | None = None
        self.junk: list[np.ndarray] = []  # memory a forget step refilled, kept until the trace ends
        self.last_rejected = False  # whether the last judged call was rejected (for if_rejected/if_accepted)

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

    def identify(self, text: str) -> int | None:
        """The buffer id of the value ``text`` names, as reported by the state whose step produced it
        (another state's answer would mix two id spaces), else the value's data address."""
        value = self.ref(text)
        handle = self.handles.get(self.origin.get(text.partition("|")[0], ""))
        probe = getattr(handle, "buffer_id", None)
        found = probe(value) if probe is not None else None
        return found if found is not None else V.default_buffer_id(value)

    def judge(self, outcome: Outcome, step: dict, what: str) -> bool:
        """True when the step succeeded (and success was expected, or the error was ``optional``)."""
        self.last_rejected = outcome.rejected is not None
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
        outcome = call(self.adapter, "open_state", self.model_for(index, step), initial, self.workdir)
        if self.judge(outcome, step, f"step {index} (open)"):
            self.handles[self.current] = outcome.value
            self.remember(step, initial)

    def step_run(self, index: int, step: dict) -> None:
        self.need_handle(index)
        feeds = self.build(step.get("feeds"))
        if step.get("feeds_as"):  # the caller's own feed buffers, even where an output shares a name
            self.seen[step["feeds_as"]] = dict(feeds)
            self.origin[step["feeds_as"]] = self.current
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
        """A retained or returned view must not be writable through the view the runtime handed out:
        every payload leaf (tensors, encoded payloads, inside structs and sequences) is checked."""
        for ref in step["refs"]:
            for path, leaf in _payload_leaves(self.ref(ref), ref):
                flags = getattr(leaf, "flags", None)
                if flags is None:
                    raise NotSupported(f"cannot tell whether {path} ({type(leaf).__name__}) is writable")
                if flags.writeable:
                    raise CaseFailure(f"step {index}: {path} is writable; shared and retained buffers are "
                                      "read-only", expected="read-only view", actual="writable buffer")

    def step_forget(self, index: int, step: dict) -> None:
        """The caller lets go of the values it gave or got at the labelled steps. Their memory is then
        reused: same-sized buffers full of a junk pattern are allocated (and kept) so that anything still
        reading the released memory without owning it reads junk."""
        import gc

        released = []
        for label in step["labels"]:
            found = self.seen.pop(label, None)
            if found is None:
                raise SuiteError(f"{self.case.id}: step {index} forgets unknown label {label!r}")
            released += [leaf for name, value in found.items() for _, leaf in _payload_leaves(value, name)]
        sizes = [leaf.nbytes for leaf in released if isinstance(leaf, np.ndarray)]
        del released, found
        gc.collect()
        self.junk.extend(np.full(size, 0x5A, dtype=np.uint8) for size in sizes for _ in range(4))

    def step_file(self, index: int, step: dict) -> None:
        """Replace or remove an external payload file after the runtime has loaded it."""
        from conformance.cases import file_bytes

        target = pathlib.Path(self.workdir) / step["path"]
        if step.get("remove"):
            target.unlink()
            return
        fresh = target.with_name(target.name + ".new")
        fresh.write_bytes(file_bytes(step["replace"], self.case.id))
        os.replace(fresh, target)  # a new file: mappings of the old one keep their bytes

    def step_lowered(self, index: int, step: dict) -> None:
        """Run the adapter's ``onnx-lowered`` export as a caller would: a standard model executed by onnx's
        reference evaluator, outputs fed back to inputs through the returned feedback mapping."""
        import onnx
        from onnx.reference import ReferenceEvaluator

        outcome = call(self.adapter, "export", self.case.model_bytes(), "onnx-lowered", base_dir=self.workdir)
        if not self.judge(outcome, step, f"step {index} (export onnx-lowered)"):
            return
        if not isinstance(outcome.value, tuple):
            raise CaseFailure(f"step {index}: the lowered export returned no feedback mapping",
                              expected="(model, feedback)", actual=type(outcome.value).__name__)
        produced, feedback = outcome.value
        model = onnx.ModelProto()
        try:
            model.ParseFromString(bytes(produced))
            evaluator = ReferenceEvaluator(model)
        except Exception as exc:  # noqa: BLE001 - an unusable export is the adapter's failure
            raise CaseFailure(f"step {index}: the lowered model does not load as standard ONNX: {exc}") from None
        values = self.build(step.get("initial"))
        names = list(evaluator.output_names)
        for number, item in enumerate(step["calls"]):
            feeds = {**self.build(item.get("feeds")), **values}
            try:
                results = dict(zip(names, evaluator.run(None, feeds)))
            except Exception as exc:  # noqa: BLE001 - the lowered model fails where the state ran
                raise CaseFailure(f"step {index}: call {number} of the lowered model failed: {exc}") from None
            self.expect_values(index, f"lowered call {number} output", results, item.get("outputs", {}), step)
            try:
                values = {str(i): results[str(o)] for i, o in feedback}
            except KeyError as missing:
                raise CaseFailure(f"step {index}: feedback names output {missing} the lowered model lacks",
                                  actual=str(names)) from None

    def step_check(self, index: int, step: dict) -> None:
        actual = self.ref(step["ref"])
        if "equals" in step:
            compare(V.build(step["equals"], self.ref), actual, step, f"step {index}: {step['ref']}")
        if "layout" in step:
            _check_layout(actual, step, f"step {index}: {step['ref']}")

    def step_identity(self, index: int, step: dict) -> None:
        for group in step.get("same", []):
            ids = [self.identify(r) for r in group]
            if None in ids or len(set(ids)) != 1:
                raise CaseFailure(f"step {index}: {group} should share one buffer",
                                  expected="one buffer", actual=", ".join(f"{r}={_hex(i)}" for r, i in zip(group, ids)))
        for group in step.get("distinct", []):
            ids = [self.identify(r) for r in group]
            if len(set(ids)) != len(ids):
                raise CaseFailure(f"step {index}: {group} should be distinct buffers",
                                  expected="distinct buffers", actual=", ".join(_hex(i) for i in ids))

    def step_held(self, index: int, step: dict) -> None:
        """Run ``run`` held at its Hold node; meanwhile issue ``second`` or request cancellation."""
        self.need_handle(index)
        handle = self.handle_with_classifier()
        if getattr(self.handle, "run_held", None) is None:
            raise NotSupported("the adapter cannot hold a run (its state handle has no run_held())")
        feeds = self.build(step["run"].get("feeds"))
        hold = Hold()
        first = _Call(handle, "run_held", feeds, hold, hold=hold)
        if not hold.wait_parked_or_finished(HOLD_TIMEOUT):
            hold.release()
            first.join(HOLD_TIMEOUT)
            outcome = first.result()
            if outcome is not None and outcome.rejected is not None:
                raise CaseFailure(f"step {index}: the held run failed: {outcome.rejected}",
                                  actual=str(outcome.rejected))
            raise CaseFailure(f"step {index}: the held run never parked at the model's Hold node",
                              expected="run_held() calls hold.park() at the Hold node")
        branch = None
        second = None
        try:
            if "second" in step:
                second = self._second(step["second"], handle, hold)
            if step.get("cancel"):
                hold.request_cancel()
        finally:
            hold.release()
        first.join(HOLD_TIMEOUT)
        if second is not None:
            second.join(HOLD_TIMEOUT)
            branch = self._judge_second(index, step, second)
        branch = self._judge_held_run(index, step, first, feeds) or branch
        for inner in step.get(branch, []) if branch else []:
            _STEPS[inner.get("op", "run")](self, index, inner)

    def _second(self, second: dict, handle, hold: Hold) -> _Call:
        op = second.get("op", "run")
        args = (self.build(second.get("feeds")),) if op == "run" else \
            (self.build(second.get("initial")),) if op == "reset" else ()
        if "state" in second:  # a call on another state: independent of the parked run
            other = self.handles.get(second["state"])
            if other is None:
                raise SuiteError(f"{self.case.id}: a second call names unopened state {second['state']!r}")
            handle = _Classified(other, self.adapter)
        call_ = _Call(handle, op, *args, hold=hold)
        # A prompt answer comes back within the grace; a waiting call is released below. A call on another
        # state that must not wait has to finish while this run stays parked, however loaded the machine: it
        # gets the whole independent timeout before the run is released (only a runtime that holds it back
        # ever waits). One that may wait passes either way, so the grace is enough.
        must_answer = "state" in second and not second.get("may_wait")
        call_.join(INDEPENDENT_TIMEOUT if must_answer else SECOND_CALL_GRACE)
        return call_

    def _judge_second(self, index: int, step: dict, second: _Call) -> str:
        op = step["second"].get("op", "run")
        what = f"step {index} ({op} while a run is active)"
        outcome = second.result()
        if outcome is None:
            raise CaseFailure(f"{what} did not return within {HOLD_TIMEOUT:g} s after the run was released")
        if "state" in step["second"]:
            return self._judge_independent(index, step["second"], second, outcome)
        if outcome.rejected is not None:
            self.judge(outcome, step, what)
            return "rejected"
        if second.returned_while_parked:
            raise CaseFailure(f"{what} was accepted while the run was still active",
                              expected=f"rejected with {step.get('error')}" +
                              (" or waiting for the run" if step.get("may_wait") else ""),
                              actual="accepted during the run")
        if not step.get("may_wait"):
            raise CaseFailure(f"{what} waited for the run and was then accepted; simultaneous calls must be "
                              "rejected, not queued", expected=f"rejected with {step.get('error')}",
                              actual="queued behind the active run")
        return "waited"

    def _judge_independent(self, index: int, second: dict, call_: _Call, outcome: Outcome) -> str:
        """A call on another state while this one is parked: it must succeed, and without waiting for the
        parked run (each request owns its state; only calls on the same state may be refused)."""
        what = (f"step {index} ({second.get('op', 'run')} on state {second['state']!r} while another state's run "
                "is active)")
        self.judge(outcome, {}, what)
        if not call_.returned_while_parked and not second.get("may_wait"):
            raise CaseFailure(f"{what} waited for the other state's run: independent states are held back by "
                              "one another", expected="answered while the other run is parked",
                              actual="answered only after the other run was released")
        if second.get("op", "run") == "run":
            self.expect_values(index, "output", outcome.value or {}, second.get("outputs", {}), second)
            self.remember(second, outcome.value or {})
        return "independent"

    def _judge_held_run(self, index: int, step: dict, first: _Call, feeds: dict) -> str | None:
        what = f"step {index} (held run)"
        outcome = first.result()
        if outcome is None:
            raise CaseFailure(f"{what} did not finish within {HOLD_TIMEOUT:g} s after it was released")
        if step.get("cancel") and outcome.rejected is not None:
            self.judge(outcome, {"error": "STATE_CANCELLED"}, what)
            return "cancelled"
        if outcome.rejected is not None:
            raise CaseFailure(f"{what} failed: {outcome.rejected}", actual=str(outcome.rejected))
        self.remember(step["run"], outcome.value or {}, feeds)
        self.expect_values(index, "output", outcome.value or {}, step["run"].get("outputs", {}), step["run"])
        return "completed" if step.get("cancel") else None

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
    def model_for(self, index: int, step: dict) -> bytes:
        """The case's model (with the adapter's operator roles bound), or the adapter's rewrite or explicit
        save/load of it; ``model = "name"`` takes one of the case's further models instead."""
        data = operators.model_bytes(self.case, self.adapter) if "model" not in step \
            else operators.other_model_bytes(self.case, self.adapter, step["model"])
        if "rewrite" in step:
            outcome = call(self.adapter, "rewrite", data, dict(step["rewrite"]), base_dir=self.workdir)
            judge_rejection(outcome, {}, f"step {index} (rewrite {step['rewrite']})", self.require_codes)
            return bytes(outcome.value)
        if "export" in step:
            outcome = call(self.adapter, "export", data, step["export"], base_dir=self.workdir)
            judge_rejection(outcome, {}, f"step {index} (export {step['export']})", self.require_codes)
            produced = outcome.value[0] if isinstance(outcome.value, tuple) else outcome.value
            return bytes(produced)
        return data

    def handle_with_classifier(self):
        """The handle, with the adapter's classifier available to ``call``."""
        return _Classified(self.handle, self.adapter)

    def remember(self, step: dict, named: dict[str, Any], feeds: dict[str, Any] | None = None) -> None:
        """Label a step's values; a run's outputs shadow its feeds of the same name."""
        label = step.get("as")
        if label:
            self.seen[label] = {**(feeds or {}), **named}
            self.origin[label] = self.current

    def expect_values(self, index: int, kind: str, got: dict, expected: dict, step: dict) -> None:
        for name, literal in expected.items():
            if name not in got:
                raise CaseFailure(f"step {index}: no {kind} {name!r}; got {sorted(got)}", actual=str(sorted(got)))
            compare(V.build(literal, self.ref), got[name], step, f"step {index}: {kind} {name!r}", name)


class _Call:
    """One adapter call on its own thread; notes whether it returned while ``hold`` was still parked."""

    def __init__(self, target, method: str, *args, hold: Hold):
        self._box: dict[str, Any] = {}
        self._hold = hold
        self.returned_while_parked = False
        self._thread = threading.Thread(target=self._run, args=(target, method, args), daemon=True)
        self._thread.start()

    def _run(self, target, method: str, args: tuple) -> None:
        try:
            self._box["outcome"] = call(target, method, *args)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the trace thread
            self._box["error"] = exc
        finally:
            self.returned_while_parked = not self._hold.released
            if method == "run_held":
                self._hold.finish()

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)

    def result(self) -> Outcome | None:
        """The outcome (None while still running); an unclassified exception is raised here."""
        if "error" in self._box:
            raise self._box["error"]
        return self._box.get("outcome")


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


def _payload_leaves(value: Any, path: str):
    """(path, leaf) for every tensor and encoded payload inside a neutral value."""
    if isinstance(value, V.Encoded):
        yield path, value.payload
    elif isinstance(value, dict):
        for name, item in value.items():
            yield from _payload_leaves(item, f"{path}|{name}")
    elif isinstance(value, (list, tuple)):
        for number, item in enumerate(value):
            yield from _payload_leaves(item, f"{path}|{number}")
    elif value is not None:
        yield path, value


def _hex(value: int | None) -> str:
    return "none" if value is None else hex(value)


_STEPS = {"open": Trace.step_open, "run": Trace.step_run, "values": Trace.step_values, "reset": Trace.step_reset,
          "close": Trace.step_close, "check": Trace.step_check, "identity": Trace.step_identity,
          "held": Trace.step_held, "readonly": Trace.step_readonly, "repeat": Trace.step_repeat,
          "counters": Trace.step_counters, "file": Trace.step_file, "forget": Trace.step_forget,
          "lowered": Trace.step_lowered}
_STEPS.update(allocations=measured.step_allocations, addresses=measured.step_addresses,
              file_opens=measured.step_file_opens)


def run_trace(case, adapter, workdir: str, require_codes: bool) -> bool | None:
    """Run every step; returns whether rejection codes were checked (None when none was expected)."""
    if _uses_holds(case.steps or case.extras().get("steps", [])) and not getattr(adapter, "supports_hold", False):
        raise NotSupported("the case holds a run open at a Hold node; the adapter does not support held runs "
                           "(supports_hold, run_held())")
    trace = Trace(case, adapter, workdir, require_codes)
    try:
        _run_steps(trace)
        return trace.code_checked
    finally:
        _close_quietly(trace)


def _uses_holds(steps) -> bool:
    for step in steps:
        if step.get("op") == "held":
            return True
        if step.get("op") == "repeat" and _uses_holds([step["step"]]):
            return True
    return False


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
        trace.last_rejected = False
        observe = getattr(trace.adapter, "observe_step", None)  # conformance.explain records the trace
        if observe is not None:
            observe(trace, index, step)
        handler(trace, index, step)
        if step.get("optional"):  # a step that may fail or succeed continues with the matching branch
            for inner in step.get("if_rejected" if trace.last_rejected else "if_accepted", []):
                trace.current = inner.get("state", trace.current)
                _STEPS[inner.get("op", "run")](trace, index, inner)
        if op == "open" and trace.handle is None and not step.get("continue"):
            return  # a rejected open ends the trace


def _close_quietly(trace: Trace) -> None:
    for handle in trace.handles.values():
        try:
            handle.close()
        except Exception:  # noqa: BLE001 - closing twice is allowed to fail
            pass

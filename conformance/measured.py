"""Trace steps that observe a state's cost from outside the runtime, so the runtime cannot report it:

    {op = "allocations", call = {op = "run|reset|values", ...}, count = 3, at_most = BYTES}
    {op = "addresses", same = [["init|s", "r1|s", "v|s"]]}
    {op = "file_opens", call = {op = "open|run|reset|values|verify|decode", ...}, count = 3,
     file = "payload.bin", at_most = OPENS}

``allocations`` makes the call ``count`` times, each inside a ``tracemalloc`` window opened after its
arguments are built, and bounds the peak bytes allocated above the window's start (the largest over the
calls). ``addresses`` compares the data addresses of the arrays handed over and out, never the runtime's
``buffer_id`` answers. ``file_opens`` makes the call ``count`` times and bounds how often, in all, the
case's external file ``file`` was opened meanwhile (counted by a process-wide audit hook, below).

All three observe this process only. Through the testee protocol every value crosses the wire, so addresses
say nothing, and the runner cannot see another process's allocations without its cooperation (operating
system counters such as page faults or peak resident size depend on the allocator and on whether the
testee command is the runtime's process at all): such adapters get "not supported". ``tracemalloc`` sees
what Python's allocators and NumPy allocate, not a native runtime's own ``malloc``: for a native adapter
the figure is a lower bound, so these cases can miss a native copy but never blame one wrongly.

Opens are counted by one ``sys.addaudithook`` hook, installed on first use (hooks cannot be removed) and
counting only while a window is open. It sees every open made through Python: ``open``/``io.open``,
``os.open`` (also relative to a ``dir_fd``, seen as the bare relative name), ``pathlib`` reads, NumPy's
``fromfile``/``memmap`` given a path, and onnx's external-data loader. It does not see a native library's
own ``open``/``fopen`` (a runtime loaded in process but reading files in C or C++ raises no audit event),
nor reads of a descriptor kept open (``os.read``/``pread`` raise none): as with ``tracemalloc`` the count
is a lower bound, so a case can miss a re-read but never blame one wrongly. Opens are what it counts, not
bytes: a validation that only ``fstat``s an opened descriptor counts as much as one that reads it.
"""

from __future__ import annotations

import os
import sys
import threading
import tracemalloc
from typing import Any

from conformance import values as V
from conformance.adapters import NotSupported, SuiteError
from conformance.judging import CaseFailure, call, compare


def _in_process(trace) -> None:
    if getattr(trace.adapter, "out_of_process", False):
        raise NotSupported("allocations and buffer addresses are observed in process only; the runner cannot "
                           "see them in another process without the runtime's cooperation")


def _measured(target, method: str, *args: Any):
    """The outcome of one call and the peak bytes it allocated (tracemalloc, this process)."""
    started = not tracemalloc.is_tracing()
    if started:
        tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        outcome = call(target, method, *args)
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        if started:
            tracemalloc.stop()
    return outcome, max(peak, 0)


def step_allocations(trace, index: int, step: dict) -> None:
    """Make the inner call ``count`` times; each may allocate at most ``at_most`` bytes."""
    _in_process(trace)
    trace.need_handle(index)
    inner = step["call"]
    op = inner.get("op", "run")
    if op not in ("run", "reset", "values"):
        raise SuiteError(f"{trace.case.id}: step {index} measures {op!r}; only run, reset and values")
    bound = int(step["at_most"])
    worst = 0
    for _ in range(int(step.get("count", 1))):
        args = () if op == "values" else (trace.build(inner.get("feeds" if op == "run" else "initial")),)
        outcome, peak = _measured(trace.handle_with_classifier(), op, *args)
        if not trace.judge(outcome, inner, f"step {index} ({op})"):
            return
        worst = max(worst, peak)
        if op != "reset":
            got = outcome.value
            trace.expect_values(index, "output" if op == "run" else "retained value", got,
                                inner.get("outputs" if op == "run" else "values", {}), inner)
            trace.remember(inner, got, args[0] if op == "run" else None)
        else:
            trace.remember(inner, args[0])
        del outcome, args
    if worst > bound:
        raise CaseFailure(f"step {index}: a {op} allocated {worst} bytes (tracemalloc peak), more than {bound}",
                          expected=f"at most {bound} bytes per {op}", actual=f"{worst} bytes")


def step_addresses(trace, index: int, step: dict) -> None:
    """Each group's values lie at one data address (their own, never the runtime's ``buffer_id``)."""
    _in_process(trace)
    for group in step.get("same", []):
        found = [V.default_buffer_id(trace.ref(ref)) for ref in group]
        if None in found or len(set(found)) != 1:
            shown = ", ".join(f"{ref}={'none' if a is None else hex(a)}" for ref, a in zip(group, found))
            raise CaseFailure(f"step {index}: {group} should lie at one data address", expected="one address",
                              actual=shown)


# ------------------------------------------------------------------------------------------ file opens
class _Window:
    """Counts the opens of one file while it is active: an absolute path naming the file (as given or
    through the working directory's real path), or a relative path whose components end the file's
    location or are ended by it (an open relative to a directory descriptor names only the last ones)."""

    def __init__(self, directory: str, location: str):
        self.tail = _components(location)
        self.paths = frozenset(os.path.normpath(os.path.join(base, *self.tail))
                               for base in (directory, os.path.realpath(directory)))
        self.count = 0

    def matches(self, name: str) -> bool:
        if os.path.isabs(name):
            return os.path.normpath(name) in self.paths
        parts = _components(name)
        shared = min(len(parts), len(self.tail))
        return shared > 0 and parts[-shared:] == self.tail[-shared:]


def _components(path: str) -> tuple[str, ...]:
    return tuple(part for part in path.replace("\\", "/").split("/") if part not in ("", "."))


_windows: tuple[_Window, ...] = ()  # replaced whole under _lock, read without it
_lock = threading.Lock()
_installed = False


def _audit(event: str, args: tuple) -> None:
    """The process-wide hook: counts an ``open`` event for every active window whose file it names. It
    never raises (an exception in a hook would fail the runtime's own open)."""
    if not _windows or event != "open":
        return
    try:
        target = args[0]
        if isinstance(target, int):  # open(fd): the descriptor was counted when it was opened
            return
        name = os.fsdecode(target)
        for window in _windows:
            if window.matches(name):
                with _lock:
                    window.count += 1
    except Exception:  # noqa: BLE001, S110 - whatever the runtime passes, its open must go on
        pass


class _Counting:
    """Opens of ``location`` inside ``directory`` while the ``with`` block runs (every thread)."""

    def __init__(self, directory: str, location: str):
        self.window = _Window(directory, location)

    def __enter__(self) -> _Window:
        global _installed, _windows
        with _lock:
            if not _installed:
                sys.addaudithook(_audit)
                _installed = True
            _windows = (*_windows, self.window)
        return self.window

    def __exit__(self, *exc: object) -> None:
        global _windows
        with _lock:
            _windows = tuple(w for w in _windows if w is not self.window)


def counting_opens(directory: str, location: str) -> _Counting:
    """A context counting the opens of the file ``location`` of ``directory`` made through Python (see the
    module docstring for what it cannot see)."""
    return _Counting(directory, location)


_FILE_CALLS = ("open", "run", "reset", "values", "verify", "decode")


def step_file_opens(trace, index: int, step: dict) -> None:
    """Make the inner call ``count`` times; in all they may open the external file ``file`` at most
    ``at_most`` times."""
    _in_process(trace)
    inner = step["call"]
    op = inner.get("op", "run")
    count = int(step.get("count", 1))
    if op not in _FILE_CALLS:
        raise SuiteError(f"{trace.case.id}: step {index} counts file opens around {op!r}; only {_FILE_CALLS}")
    if op == "open" and count != 1:
        raise SuiteError(f"{trace.case.id}: step {index} opens a state once per step")
    location = step["file"]
    if location not in trace.case.external_files():
        raise SuiteError(f"{trace.case.id}: step {index} counts opens of {location!r}, not a file of the case")
    bound = int(step["at_most"])
    with counting_opens(trace.workdir, location) as window:
        for _ in range(count):
            if op in ("verify", "decode"):
                args = (trace.model_for(index, inner),) + ((inner["value"],) if op == "decode" else ())
                outcome = call(trace.adapter, op, *args, trace.workdir)
                if not trace.judge(outcome, inner, f"step {index} ({op})"):
                    return
                if op == "decode" and "values" in inner:
                    compare(V.build(inner["values"], trace.ref), outcome.value, inner,
                            f"step {index}: decoded {inner['value']}")
            else:
                getattr(trace, f"step_{op}")(index, inner)
    if window.count > bound:
        calls = f"{count} {op} calls" if count > 1 else f"one {op} call"
        raise CaseFailure(f"step {index}: {calls} opened {location} {window.count} times, more than {bound}",
                          expected=f"at most {bound} opens", actual=f"{window.count} opens")

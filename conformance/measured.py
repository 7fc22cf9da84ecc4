"""Trace steps that observe a state's cost from outside the runtime, so the runtime cannot report it:

    {op = "allocations", call = {op = "run|reset|values", ...}, count = 3, at_most = BYTES}
    {op = "addresses", same = [["init|s", "r1|s", "v|s"]]}

``allocations`` makes the call ``count`` times, each inside a ``tracemalloc`` window opened after its
arguments are built, and bounds the peak bytes allocated above the window's start (the largest over the
calls). ``addresses`` compares the data addresses of the arrays handed over and out, never the runtime's
``buffer_id`` answers.

Both observe this process only. Through the testee protocol every value crosses the wire, so addresses
say nothing, and the runner cannot see another process's allocations without its cooperation (operating
system counters such as page faults or peak resident size depend on the allocator and on whether the
testee command is the runtime's process at all): such adapters get "not supported". ``tracemalloc`` sees
what Python's allocators and NumPy allocate, not a native runtime's own ``malloc``: for a native adapter
the figure is a lower bound, so these cases can miss a native copy but never blame one wrongly.
"""

from __future__ import annotations

import tracemalloc
from typing import Any

from conformance import values as V
from conformance.adapters import NotSupported, SuiteError
from conformance.judging import CaseFailure, call


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

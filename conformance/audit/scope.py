"""Which cases can observe a fault, so the audit runs each fault only where its bug can show.

Execution is deterministic up to the first point where a faulty runtime departs from the reference,
and a fault departs only where one of its seams is reached: a patched function is called, or one of
the adapter operations it overrides runs, or its ``prepare`` (``transform``/``precheck``) changes or
refuses the case's model. So a case whose reference run calls none of a fault's patched functions,
whose operation the fault does not override and whose model the fault reads unchanged, passes on the
fault exactly as on the reference. ``trace`` records the functions every case's reference run
calls (all threads); ``cases_for`` keeps, per fault, the cases that reach one of its seams. A patch of
something that is not a function (a constant, a table) puts every case in scope. ``audit --full`` runs
every case on every fault instead, and ``tests/test_audit.py`` checks both give the same kill matrix.
"""

from __future__ import annotations

import sys
import tempfile
import threading
from collections.abc import Iterable

from conformance.adapters.reference import ReferenceAdapter
from conformance.audit.fault import Fault, cache_accessor_codes, cache_resets, patch_codes
from conformance.cases import Case
from conformance.execute import run_case
from reference_impl import schema

#: case operations whose model a fault's ``prepare`` reads (writes only with ``prepares_writes``)
READ_OPS = frozenset({"verify", "decode", "fields", "state"})
WRITE_OPS = frozenset({"roundtrip", "export", "rewrite"})
#: overridable adapter members -> the case operations that call them
_METHOD_OPS = {"verify": ("verify",), "decode": ("decode",), "read_fields": ("fields",), "roundtrip": ("roundtrip",),
               "open_state": ("state",), "make_state": ("state",), "export": ("export",), "rewrite": ("rewrite",),
               "on_save": ("roundtrip", "export"), "executor_kernels": ("state",)}


def trace_ops(case: Case) -> frozenset[str]:
    """The adapter operations a state trace calls besides ``state``: a step opening the state over the
    adapter's rewrite or export of the model, or running its lowered export (at any nesting depth)."""
    found: set[str] = set()
    pending: list = list(case.state_steps())
    while pending:
        item = pending.pop()
        if isinstance(item, list):
            pending.extend(item)
        elif isinstance(item, dict):
            if "rewrite" in item:
                found.add("rewrite")
            if "export" in item or item.get("op") == "lowered":
                found.add("export")
            pending.extend(value for value in item.values() if isinstance(value, (list, dict)))
    return frozenset(found)


def trace(cases: Iterable[Case], timeout: float = 30.0) -> dict[str, frozenset]:
    """The code objects each case's reference run calls, in any thread."""
    adapter = ReferenceAdapter()
    seen: set = set()

    def profile(frame, event, arg):
        if event == "call":
            seen.add(frame.f_code)

    traces = {}
    for case in cases:
        seen = set()
        threading.setprofile(profile)
        sys.setprofile(profile)
        try:
            run_case(case, adapter, timeout=timeout)
        finally:
            sys.setprofile(None)
            threading.setprofile(None)
        traces[case.id] = frozenset(seen)
    return traces


def seams(cls: type[Fault]) -> tuple[frozenset[str], frozenset, bool]:
    """(case operations the fault overrides, code objects of its patched functions, whether a patch
    replaces something that is not a function)."""
    ops = {op for member, members_ops in _METHOD_OPS.items() if getattr(cls, member) is not getattr(Fault, member)
           for op in members_ops}
    patches = cls().patches()
    codes, opaque = patch_codes(patches)
    if cache_resets(patches):  # caches rebuilt under the fault: it acts wherever a case reaches them
        codes |= cache_accessor_codes()
    return frozenset(ops), codes, opaque


def _edits(fault: Fault, case: Case, base_dir: str) -> bool:
    """Whether the fault's ``prepare`` reads this case's model differently from the reference."""
    ops = READ_OPS | (WRITE_OPS if fault.prepares_writes else set())
    if case.op not in ops or type(fault).prepare is Fault.prepare and not fault._edits_model():
        return False
    data = case.model_bytes()
    try:
        plain = schema.parse_model(data).SerializeToString()
    except Exception:  # noqa: BLE001 - unparsable bytes reach the fault's prepare unchanged or not
        plain = data
    try:
        return fault.prepare(data, base_dir) != plain
    except Exception:  # noqa: BLE001 - a refusal (or a crash) is a departure from the reference
        return True


def cases_for(fault_classes: Iterable[type[Fault]], cases: list[Case],
              traces: dict[str, frozenset]) -> dict[str, list[str]]:
    """fault ID -> the IDs of the cases that can observe it."""
    scoped: dict[str, list[str]] = {}
    seam_of = {cls.fault_id: seams(cls) for cls in fault_classes}
    instances = {cls.fault_id: cls() for cls in fault_classes}
    for cls in fault_classes:
        scoped[cls.fault_id] = []
    for case in cases:
        with tempfile.TemporaryDirectory(prefix="audit-scope-") as base_dir:
            case.write_files(base_dir)
            for cls in fault_classes:
                ops, codes, opaque = seam_of[cls.fault_id]
                if opaque or case.op in ops or not ops.isdisjoint(trace_ops(case)) or \
                        not codes.isdisjoint(traces[case.id]) or \
                        _edits(instances[cls.fault_id], case, base_dir):
                    scoped[cls.fault_id].append(case.id)
    return scoped

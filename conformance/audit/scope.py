"""Which cases can observe a fault, so the audit runs each fault only where its bug can show.

Execution is deterministic up to the first point where a faulty runtime departs from the reference,
and a fault departs only where one of its seams is reached: a patched function is called, or one of
the adapter operations it overrides runs, or its ``prepare`` (``transform``/``precheck``) changes or
refuses the case's model. So a case whose reference run calls none of a fault's patched functions,
whose operation the fault does not override and whose model the fault reads unchanged, passes on the
fault exactly as on the reference. ``trace`` records the functions every case's reference run
calls (all threads); ``cases_for`` keeps, per fault, the cases that reach one of its seams. A patch of
something that is not a function (a constant, a table) puts every case in scope. ``scoped_cases`` does
both over worker processes (``audit -j``). ``audit --full`` runs
every case on every fault instead, and ``tests/test_audit.py`` checks both give the same kill matrix.
"""

from __future__ import annotations

import functools
import multiprocessing
import sys
import tempfile
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor

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


def _reserialized(data: bytes) -> bytes:
    """The model bytes as a prepare that edits nothing gives them back (parsed and serialized again)."""
    try:
        return schema.parse_model(data).SerializeToString()
    except Exception:  # noqa: BLE001 - unparsable bytes reach the fault's prepare unchanged or not
        return data


def _edits(fault: Fault, case: Case, base_dir: str, plain: Callable[[], bytes]) -> bool:
    """Whether the fault's ``prepare`` reads this case's model differently from the reference (``plain``:
    the case's model re-serialized, computed once per case)."""
    ops = READ_OPS | (WRITE_OPS if fault.prepares_writes else set())
    if case.op not in ops or type(fault).prepare is Fault.prepare and not fault._edits_model():
        return False
    try:
        return fault.prepare(case.model_bytes(), base_dir) != plain()
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
        case_ops, reached = trace_ops(case), traces[case.id]
        plain = functools.cache(lambda case=case: _reserialized(case.model_bytes()))
        with tempfile.TemporaryDirectory(prefix="audit-scope-") as base_dir:
            case.write_files(base_dir)
            for cls in fault_classes:
                ops, codes, opaque = seam_of[cls.fault_id]
                if opaque or case.op in ops or not ops.isdisjoint(case_ops) or not codes.isdisjoint(reached) or \
                        _edits(instances[cls.fault_id], case, base_dir, plain):
                    scoped[cls.fault_id].append(case.id)
    return scoped


_SCOPING: dict = {}


def _scope_run(bounds: tuple[int, int]) -> dict[str, list[str]]:
    """``cases_for`` over one contiguous run of the cases, traced in this worker."""
    fault_classes, cases, timeout = _SCOPING["args"]
    chunk = cases[bounds[0]:bounds[1]]
    return cases_for(fault_classes, chunk, trace(chunk, timeout))


def _init_scoping(fault_classes: list[type[Fault]], cases: list[Case], timeout: float) -> None:
    _SCOPING["args"] = (fault_classes, cases, timeout)


def scoped_cases(fault_classes: Iterable[type[Fault]], cases: list[Case], jobs: int = 1,
                 timeout: float = 30.0) -> dict[str, list[str]]:
    """fault ID -> the IDs of the cases that can observe it, traced and scoped in ``jobs`` processes.

    The cases are split into contiguous runs, each traced in a fresh worker and merged back in order.
    A run's first cases may call more (memos its worker has not filled yet) than they would after
    their predecessors in one process, so a split can only widen a fault's scope, never narrow it:
    the kill matrix is the same, which ``audit --check`` confirms against the committed one.
    """
    fault_classes = list(fault_classes)
    if jobs <= 1 or len(cases) < 2 * jobs:
        return cases_for(fault_classes, cases, trace(cases, timeout))
    runs = min(len(cases), 4 * jobs)  # more runs than workers, so a run of slow cases does not hold the rest
    edges = [len(cases) * index // runs for index in range(runs + 1)]
    context = multiprocessing.get_context("fork" if sys.platform.startswith("linux") else "spawn")
    scoped: dict[str, list[str]] = {cls.fault_id: [] for cls in fault_classes}
    with ProcessPoolExecutor(jobs, mp_context=context, initializer=_init_scoping,
                             initargs=(fault_classes, cases, timeout)) as pool:
        for part in pool.map(_scope_run, zip(edges, edges[1:])):
            for fault_id, ids in part.items():
                scoped[fault_id].extend(ids)
    return scoped


def claimed_cases(committed: dict, fault_classes: Iterable[type[Fault]], cases: list[Case],
                  scoped: Callable[[list[type[Fault]]], dict[str, list[str]]]) -> dict[str, list[str]]:
    """fault ID -> the cases that verify the committed kill matrix's claims about it: the cases it names
    as catching the fault (those still in the corpus, in corpus order). A fault the matrix does not know,
    or a pending one (whose claim is that nothing catches it), gets its whole scope from ``scoped``.

    Run on these, a fault departs from the committed matrix exactly where a whole run would make
    ``audit --check`` fail: a named catcher no longer catching it, a pending fault caught, the catalogue
    or a fault's metadata changed. Only new catchers, which a whole run reports as a note, go unseen."""
    fault_classes = list(fault_classes)
    claims = {fault["id"]: set(fault["caught_by"]) for fault in committed.get("faults", [])}
    order = [case.id for case in cases]
    unclaimed = [cls for cls in fault_classes if cls.pending or cls.fault_id not in claims]
    chosen = scoped(unclaimed) if unclaimed else {}
    for cls in fault_classes:
        if cls.fault_id not in chosen:
            chosen[cls.fault_id] = [case_id for case_id in order if case_id in claims[cls.fault_id]]
    return chosen

"""Running the suite on every built-in fault: the kill matrix, the mutation score and the gate.

A fault is *caught* when at least one case the reference passes fails on it *through the clause the fault
breaks*: the case names one of the fault's clauses. A case of another clause that happens to trip over the
fault is recorded as an incidental catch, and does not count: a runtime with that bug but without the
incidental trigger would pass. Faults caught only by Recommended cases are listed too. Cases run in process in
worker processes forked after every case is built (``-j``); with ``--testee`` each fault is served by
``python -m conformance.testee --adapter conformance.audit.<module>:<Fault>`` instead, so the audit
proves the suite catches it across the process boundary too.
"""

from __future__ import annotations

import importlib
import inspect
import multiprocessing
import pathlib
import re
import sys
import time
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field

from conformance import SPEC_REVISION, SUITE_VERSION
from conformance.adapters import IN_PROCESS_PROFILES, load_adapter
from conformance.adapters.reference import ReferenceAdapter
from conformance.audit.catalogue import CHECKABLE_KINDS, adapter_spec, checkable_clauses
from conformance.audit.fault import INSTALLER, Fault
from conformance.cases import Case
from conformance.execute import FAILED, NOT_SUPPORTED, PASSED, run_case
from reference_impl.clauses import CLAUSES

REFERENCE = "reference"
DEFAULT_TESTEE = "python3 -m conformance.testee"


@dataclass
class FaultOutcome:
    """What the suite did to one fault: the cases that failed on it, and any it did not support."""

    fault_id: str
    adapter: str
    clauses: tuple[str, ...]
    boundary: bool
    pending: str
    testee_blind: str = ""
    caught_by: list[str] = field(default_factory=list)
    incidental: list[str] = field(default_factory=list)  # failed on it, but test none of its clauses
    not_supported: list[str] = field(default_factory=list)
    #: failed because the fault's own code raised (a defect of the fault, never a catch)
    crashed: list[str] = field(default_factory=list)
    messages: dict[str, str] = field(default_factory=dict)
    duration: float = 0.0

    @property
    def caught(self) -> bool:
        return bool(self.caught_by)


@dataclass
class Audit:
    """The kill matrix of one audit run and what it says about the catalogue."""

    outcomes: list[FaultOutcome]
    case_ids: list[str]
    reference_failures: dict[str, str]
    mode: str = "in process"
    duration: float = 0.0
    jobs: int = 1
    #: the whole catalogue ran (only then does a clause without a fault count against the gate)
    complete: bool = True

    # -------------------------------------------------------------------------------- figures
    @property
    def through_testee(self) -> bool:
        return self.mode != "in process"

    def excused(self, outcome: FaultOutcome) -> str:
        """Why a fault is not expected to be caught in this run (pending, or blind through the testee)."""
        return outcome.pending or (outcome.testee_blind if self.through_testee else "")

    def scored(self) -> list[FaultOutcome]:
        return [o for o in self.outcomes if not self.excused(o)]

    def score(self) -> dict:
        scored = self.scored()
        caught = sum(o.caught for o in scored)
        pending = [o for o in self.outcomes if self.excused(o)]
        return {"faults": len(self.outcomes), "scored": len(scored), "caught": caught,
                "percent": round(100.0 * caught / len(scored), 2) if scored else 100.0,
                "pending": len(pending), "pending_caught": sum(o.caught for o in pending),
                "boundary": sum(o.boundary for o in self.outcomes)}

    def by_clause(self) -> dict[str, dict]:
        return clause_table(self.to_json()["faults"])

    def clauses_without_fault(self) -> list[str]:
        covered = {c for o in self.outcomes for c in o.clauses}
        return [cid for cid in checkable_clauses() if cid not in covered]

    def single_case(self) -> list[tuple[str, str]]:
        """(clause, case) for every checkable clause whose faults are all caught, by one case only."""
        return [(cid, row["caught_by"][0]) for cid, row in self.by_clause().items()
                if row["status"] == "full" and len(row["caught_by"]) == 1]

    def incidental_only(self) -> list[FaultOutcome]:
        """Faults no case of their clauses catches, though a case of another clause fails on them."""
        return [o for o in self.scored() if not o.caught and o.incidental]

    def recommended_only(self) -> list[FaultOutcome]:
        """Faults caught only by Recommended cases: each needs a Required catcher where the spec's words
        force the behaviour, or a justification (docs/audit/recommended-only.md)."""
        return [o for o in self.scored() if o.caught and not any(c.startswith("Required.") for c in o.caught_by)]

    def single_case_faults(self) -> list[tuple[str, str]]:
        """(fault, case) for every fault caught by exactly one case."""
        return [(o.fault_id, o.caught_by[0]) for o in self.outcomes if len(o.caught_by) == 1]

    def problems(self) -> list[str]:
        """Why the gate fails: anything here makes ``audit`` exit non-zero."""
        found = [f"the reference fails {cid}: {message}" for cid, message in self.reference_failures.items()]
        found += [f"fault {o.fault_id} survives: no case of its clauses fails on it ({', '.join(o.clauses)})"
                  + (f"; only {len(o.incidental)} incidental catch(es), e.g. {o.incidental[0]}" if o.incidental else "")
                  for o in self.scored() if not o.caught]
        found += [f"fault {o.fault_id} crashed in its own code on {len(o.crashed)} case(s), e.g. {o.crashed[0]}: "
                  f"{o.messages[o.crashed[0]]} (fix the fault: a crash of it is no runtime's bug)"
                  for o in self.outcomes if o.crashed]
        found += [f"fault {o.fault_id} is marked {'pending' if o.pending else 'testee-blind'} but {len(o.caught_by)} "
                  f"case(s) catch it ({o.caught_by[0]}): remove that note" for o in self.outcomes
                  if self.excused(o) and o.caught]
        if self.complete:
            found += [f"clause {cid} ({CLAUSES[cid].kind}) has no fault" for cid in self.clauses_without_fault()]
        return found

    # --------------------------------------------------------------------------------- output
    def to_json(self) -> dict:
        """The kill matrix, deterministic (no timings): what ``docs/audit/kill-matrix.json`` holds."""
        return {
            "suite": SUITE_VERSION, "spec_revision": SPEC_REVISION, "mode": self.mode,
            "cases": len(self.case_ids), "score": self.score(),
            "faults": [{"id": o.fault_id, "adapter": o.adapter, "clauses": list(o.clauses), "boundary": o.boundary,
                        "pending": o.pending, "testee_blind": o.testee_blind, "caught_by": o.caught_by,
                        "incidental": o.incidental}
                       for o in self.outcomes],
            "clauses_without_fault": self.clauses_without_fault(),
            "reference_failures": sorted(self.reference_failures),
        }


def clause_table(faults: list[dict]) -> dict[str, dict]:
    """Every clause with its kind, its faults (kill-matrix entries), the cases that catch them, the faults
    that survive and its status: ``full``, ``partial`` or ``not observable``."""
    table: dict[str, dict] = {}
    for cid, clause in CLAUSES.items():
        mine = [f for f in faults if cid in f["clauses"]]
        if clause.kind not in CHECKABLE_KINDS:
            status = "not observable"
        elif mine and all(f["caught_by"] for f in mine):
            status = "full"
        else:
            status = "partial"
        table[cid] = {"kind": clause.kind, "faults": [f["id"] for f in mine], "status": status,
                      "caught_by": sorted({case for f in mine for case in f["caught_by"]}),
                      "surviving": [f["id"] for f in mine if not f["caught_by"]]}
    return table


# ------------------------------------------------------------------------------------ running
_WORKER: dict = {}


def _fault_class(spec: str) -> type:
    module, _, name = spec.partition(":")
    return getattr(importlib.import_module(module), name)


#: the packages whose frames are the project's (wherever they are installed), and the audit's own code
_AUDIT = pathlib.Path(__file__).resolve().parent
_PROJECT = (_AUDIT.parent, pathlib.Path(importlib.import_module("reference_impl").__file__).resolve().parent)
_FRAME = re.compile(r'^  File "([^"]+)", line \d+', re.M)
#: what a fault raises on purpose (a runtime exhausting memory, shown without the wait)
SIMULATED_FAILURES = ("MemoryError",)


def crashed_in_fault(message: str, traceback_text: str, own: tuple[pathlib.Path, ...] = (_AUDIT,)) -> bool:
    """Whether a failure is the fault's own code going wrong rather than the bug it models: the unclassified
    exception was raised in the fault's code (``own``: the audit's, and the module defining the fault), or in
    a library that code called (the innermost frame of the project in the traceback is the fault's). A case
    failing that way proves nothing about the suite."""
    if not message.startswith("unclassified ") or message.split()[1].rstrip(":") in SIMULATED_FAILURES:
        return False

    def within(path: pathlib.Path, places) -> bool:
        return any(path == place or path.is_relative_to(place) for place in places)
    ours = [path for path in map(pathlib.Path, _FRAME.findall(traceback_text or "")) if within(path, _PROJECT + own)]
    return bool(ours) and within(ours[-1], own)


def _own_code(spec: str) -> tuple[pathlib.Path, ...]:
    """Where a fault's own code lives: the audit, and the module defining it (a fault may be defined elsewhere)."""
    try:
        return (_AUDIT, pathlib.Path(inspect.getfile(_fault_class(spec))).resolve())
    except (TypeError, OSError):
        return (_AUDIT,)


def _run_unit(unit: tuple[str, list[str], float, str | None]) -> tuple[str, list[tuple[str, str, str, bool]], float]:
    """Run the given cases on one fault (or the reference) in this worker: (spec, results, seconds)."""
    spec, case_ids, timeout, testee = unit
    cases: dict[str, Case] = _WORKER["cases"]
    start = time.perf_counter()
    if testee:
        adapter = load_adapter(None, f"{testee} --adapter {spec}" if spec != REFERENCE else testee, timeout)
    else:
        if not INSTALLER.idle:
            raise RuntimeError(f"patches of fault {INSTALLER.owner.fault_id} are still installed (a case hung)")
        adapter = ReferenceAdapter() if spec == REFERENCE else _fault_class(spec)()
    results = []
    own = _own_code(spec) if spec != REFERENCE else ()
    try:
        for case_id in case_ids:
            result = run_case(cases[case_id], adapter, timeout=timeout)
            crashed = bool(own) and crashed_in_fault(result.message or "", result.traceback or "", own)
            results.append((case_id, result.verdict, result.message, crashed))
    finally:
        if hasattr(adapter, "shutdown"):
            adapter.shutdown()
    return spec, results, time.perf_counter() - start


def _init_worker(cases: dict[str, Case]) -> None:
    _WORKER["cases"] = cases


def run(fault_classes: Iterable[type[Fault]], cases: list[Case], jobs: int = 1, timeout: float = 30.0,
        testee: str | None = None, cases_for: dict[str, list[str]] | None = None,
        progress: bool = True, complete: bool = True) -> Audit:
    """Run ``cases`` on the reference and on every fault; ``cases_for`` narrows the cases per fault ID.
    Through the testee, the cases of profiles observable in process only are left out: no runtime behind
    the protocol can be judged by them, the reference included."""
    fault_classes = list(fault_classes)
    if testee:
        cases = [case for case in cases if case.profile not in IN_PROCESS_PROFILES]
        kept = {case.id for case in cases}
        if cases_for is not None:
            cases_for = {fault_id: [cid for cid in ids if cid in kept] for fault_id, ids in cases_for.items()}
    start = time.perf_counter()
    by_id = {case.id: case for case in cases}
    for case in cases:
        case.build()  # built once here, shared by the forked workers
    all_ids = [case.id for case in cases]
    units = [(REFERENCE, all_ids, timeout, testee)]
    units += [(adapter_spec(cls), (cases_for or {}).get(cls.fault_id, all_ids), timeout, testee)
              for cls in fault_classes]
    outputs: dict[str, tuple[list, float]] = {}
    if jobs <= 1:
        _init_worker(by_id)
        for index, unit in enumerate(units, 1):
            spec, results, seconds = _run_unit(unit)
            outputs[spec] = (results, seconds)
            _progress(progress, index, len(units), spec)
    else:
        context = multiprocessing.get_context("fork" if sys.platform.startswith("linux") else "spawn")
        with ProcessPoolExecutor(jobs, mp_context=context, initializer=_init_worker, initargs=(by_id,)) as pool:
            for index, (spec, results, seconds) in enumerate(pool.map(_run_unit, units, chunksize=1), 1):
                outputs[spec] = (results, seconds)
                _progress(progress, index, len(units), spec)
    reference_results, _ = outputs.pop(REFERENCE)
    reference_failures = {cid: message for cid, verdict, message, _ in reference_results if verdict != PASSED}
    outcomes = []
    for cls in fault_classes:
        results, seconds = outputs[adapter_spec(cls)]
        outcome = FaultOutcome(cls.fault_id, adapter_spec(cls), tuple(cls.clauses), cls.boundary, cls.pending,
                               cls.testee_blind, duration=seconds)
        for case_id, verdict, message, crashed in results:
            if case_id in reference_failures:
                continue
            if crashed:
                outcome.crashed.append(case_id)
                outcome.messages[case_id] = message
            elif verdict == FAILED:
                through_clause = set(by_id[case_id].clauses) & set(cls.clauses)
                (outcome.caught_by if through_clause else outcome.incidental).append(case_id)
                outcome.messages[case_id] = message
            elif verdict == NOT_SUPPORTED:
                outcome.not_supported.append(case_id)
        outcomes.append(outcome)
    mode = f"testee ({testee})" if testee else "in process"
    return Audit(outcomes, all_ids, reference_failures, mode, time.perf_counter() - start, jobs, complete)


def _progress(enabled: bool, done: int, total: int, spec: str) -> None:
    if enabled:
        sys.stderr.write(f"[{done}/{total}] {spec.rsplit(':', 1)[-1]}\n")

"""``python -m conformance audit`` and ``python -m conformance spec-coverage``.

``audit`` exits 0 when every built-in fault that is not pending is caught, no pending fault is caught,
every rule, permission and limit has a fault and the reference passes every case; 1 otherwise (and,
with ``--check``, when the committed kill matrix is stale); 2 on usage or suite errors.
"""

from __future__ import annotations

import fnmatch
import json
import os
import sys
import time
import warnings

from conformance.adapters import SuiteError

DEFAULT_OUT = "audit-report"


def add_parsers(sub) -> None:
    audit = sub.add_parser("audit", help="run the suite on every built-in faulty runtime (kill matrix, score)")
    audit.add_argument("-j", "--jobs", type=int, default=1, help="worker processes")
    audit.add_argument("--faults", action="append", metavar="PATTERN", help="fault ID or glob (repeatable)")
    audit.add_argument("--testee", nargs="?", const="python3 -m conformance.testee", metavar="COMMAND",
                       help="serve each fault through the subprocess testee (COMMAND --adapter module:Fault)")
    audit.add_argument("--sample", action="store_true",
                       help="only the representative subset (catalogue.SAMPLE) used for the testee audit in CI")
    audit.add_argument("--full", action="store_true",
                       help="run every case on every fault (default: only the cases that can reach its bug)")
    audit.add_argument("--timeout", type=float, default=30.0, help="seconds per case")
    audit.add_argument("--out", default=DEFAULT_OUT, help="report directory (kill-matrix.json, summary.md)")
    audit.add_argument("--write", action="store_true",
                       help="update docs/audit/kill-matrix.json and docs/spec-coverage.md from this run")
    audit.add_argument("--check", action="store_true",
                       help="also fail when docs/audit/kill-matrix.json claims what no longer holds")
    audit.add_argument("--claims", action="store_true",
                       help="with --check (or --testee): run each fault only on the cases the committed kill matrix "
                            "says catch it (pending and unknown faults on their whole scope): the same failures as "
                            "a whole run, in a fraction of the time; only new catchers go unseen")
    audit.add_argument("--list", action="store_true", help="list the built-in faults and exit")
    audit.add_argument("--corpus")
    audit.add_argument("--quiet", action="store_true")

    coverage = sub.add_parser("spec-coverage", help="the spec-coverage table rendered from the committed audit")
    coverage.add_argument("--write", action="store_true", help="write docs/spec-coverage.md")
    coverage.add_argument("--check", action="store_true", help="fail when docs/spec-coverage.md is stale")


def cmd_audit(args) -> int:
    from conformance.audit import audit, catalogue, report, scope
    from conformance.cases import load_cases

    classes = catalogue.faults()
    if args.faults:
        classes = [c for c in classes if any(fnmatch.fnmatchcase(c.fault_id, p) or c.fault_id.startswith(p)
                                             for p in args.faults)]
        if not classes:
            raise SuiteError(f"no built-in fault matches {args.faults}")
    if args.sample:
        classes = [c for c in classes if c.fault_id in catalogue.SAMPLE]
    if args.list:
        for cls in classes:
            flags = " [boundary]" if cls.boundary else ""
            flags += " [pending]" if cls.pending else ""
            print(f"{cls.fault_id}  {catalogue.adapter_spec(cls)}{flags}")
        print(f"{len(classes)} faults", file=sys.stderr)
        return 0
    complete = not args.faults and not args.sample and args.testee is None and args.corpus is None
    if (args.write or args.check) and not complete:
        raise SuiteError("--write and --check need the whole catalogue, in process, on the default corpus")
    if args.claims and (not (args.check or args.testee) or args.write or args.full):
        raise SuiteError("--claims checks the committed kill matrix's claims: use it with --check or --testee, "
                         "without --write or --full")
    _refuse_write_outside_checkout(args)
    # A faulty runtime's arithmetic may overflow: that is its bug, not news (testee processes inherit this).
    warnings.simplefilter("ignore", RuntimeWarning)
    os.environ["PYTHONWARNINGS"] = "ignore::RuntimeWarning"
    timing: dict[str, float] = {}
    start = time.perf_counter()
    cases = list(load_cases(args.corpus))
    for case in cases:
        case.build()
    cases_for = None
    if args.claims:
        cases_for = scope.claimed_cases(_committed(), classes, cases, lambda unclaimed: scope.scoped_cases(
            unclaimed, cases, jobs=args.jobs, timeout=args.timeout))
        timing["choosing the claimed cases"] = time.perf_counter() - start
    elif not args.full:
        cases_for = scope.scoped_cases(classes, cases, jobs=args.jobs, timeout=args.timeout)
        timing["scoping (reference traced, cases per fault)"] = time.perf_counter() - start
    result = audit.run(classes, cases, jobs=args.jobs, timeout=args.timeout, testee=args.testee,
                       cases_for=cases_for, progress=not args.quiet, complete=not (args.faults or args.sample))
    timing["running the faults"] = result.duration
    timing["total"] = time.perf_counter() - start
    if cases_for is not None:
        runs = sum(len(ids) for ids in cases_for.values())
        timing_note = f"{runs} fault-case runs instead of {len(cases) * len(classes)}"
        if args.claims:
            timing_note += " (the committed kill matrix's claims)"
    else:
        timing_note = f"{len(cases) * len(classes)} fault-case runs"
    directory = report.write(args.out, result, timing)
    problems = result.problems()
    if args.check:
        stale, notes = report.stale(_committed(), result.to_json())
        where = report.COMMITTED.relative_to(report.ROOT)
        problems += [f"{where} is stale: {item} (run python -m conformance audit --write and commit it with "
                     "docs/spec-coverage.md)" for item in stale]
        for note in notes:
            print(f"note: {note} ({where} could be refreshed with --write)")
    if args.write:
        from conformance.audit import coverage

        report.COMMITTED.parent.mkdir(parents=True, exist_ok=True)
        report.COMMITTED.write_text(report.matrix_text(result))
        coverage.DOCUMENT.write_text(coverage.render(coverage.load_matrix()))
        print(f"wrote {report.COMMITTED.relative_to(report.ROOT)} and {coverage.DOCUMENT.relative_to(report.ROOT)}")
    score = result.score()
    for problem in problems:
        print(f"AUDIT: {problem}")
    print(f"report: {directory}/ (kill-matrix.json, summary.md); {timing_note}; {timing['total']:.1f} s")
    without = f", {len(result.clauses_without_fault())} checkable clauses without a fault" if result.complete else ""
    print(f"{score['caught']} of {score['scored']} faults caught ({score['percent']}%), {score['pending']} pending "
          f"({score['pending_caught']} caught){without}, {len(result.single_case())} clauses caught by a single case "
          f"({result.mode})")
    return 1 if problems else 0


def _committed() -> dict:
    from conformance.audit import report

    return json.loads(report.COMMITTED.read_text()) if report.COMMITTED.exists() else {"faults": []}


def _refuse_write_outside_checkout(args) -> None:
    """``--write`` updates the repository's documents; an installed suite's copies are not its to change."""
    from conformance.locations import source_tree

    if args.write and source_tree() is None:
        raise SuiteError("--write updates the repository's docs/: run it in a source checkout")


def cmd_spec_coverage(args) -> int:
    from conformance.audit import coverage

    _refuse_write_outside_checkout(args)
    text = coverage.render(coverage.load_matrix())
    if args.check:
        current = coverage.DOCUMENT.read_text() if coverage.DOCUMENT.exists() else ""
        if current != text:
            print(f"{coverage.DOCUMENT} is stale: run python -m conformance spec-coverage --write", file=sys.stderr)
            return 1
        total = coverage.counts(coverage.load_matrix())
        print(f"spec coverage current: {total['full']} of {total['statements']} statements fully covered")
        return 0
    if args.write:
        coverage.DOCUMENT.write_text(text)
        print(f"wrote {coverage.DOCUMENT}")
        return 0
    sys.stdout.write(text)
    return 0

"""``python -m conformance``: run, list, show, explain, clauses, verify-bundle, audit, spec-coverage.

Exit status: 0 when every selected case passed or was an expected failure and the failure list is
clean; 1 on failures or failure-list problems; 2 on usage or suite errors.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys

from conformance import SPEC_REVISION, SUITE_VERSION
from conformance.adapters import SuiteError

DEFAULT_REPORT_DIR = "conformance-report"


def _add_adapter_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--adapter", help="reference (default), onnxruntime, onnx-reference, module:attr or "
                                          "path/to/file.py:attr")
    parser.add_argument("--testee", help="command line of a subprocess testee (see docs/testee-protocol.md)")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds per case (in process: the case fails "
                        "but its call cannot be stopped; testee: per request, the process is killed)")
    parser.add_argument("--corpus", help="corpus directory (default: the repository's corpus/)")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m conformance",
                                     description=f"onnx-light conformance suite {SUITE_VERSION} "
                                                 f"(spec revision {SPEC_REVISION})")
    parser.add_argument("--version", action="version", version=f"%(prog)s {SUITE_VERSION} spec {SPEC_REVISION}")
    sub = parser.add_subparsers(dest="command")

    run = sub.add_parser("run", help="run cases and write a report directory")
    _add_adapter_options(run)
    run.add_argument("--cases", action="append", metavar="PATTERN", help="case ID, prefix or glob (repeatable)")
    run.add_argument("--level", choices=["Required", "Recommended"])
    run.add_argument("--profile", action="append", help="only cases of this profile (repeatable)")
    run.add_argument("--shard", help="run shard i of n, e.g. 1/4")
    run.add_argument("-j", "--jobs", type=int, default=1, help="worker processes")
    run.add_argument("--failure-list", help="expected-failure list (protobuf style, with hygiene)")
    run.add_argument("--update-failure-list", action="store_true",
                     help="rewrite --failure-list with the current failures")
    run.add_argument("--report-dir", default=DEFAULT_REPORT_DIR)
    run.add_argument("--require-codes", action="store_true", help="a rejection without an error code fails")
    run.add_argument("--quiet", action="store_true", help="no progress output")

    listing = sub.add_parser("list", help="list case IDs")
    listing.add_argument("--corpus")
    listing.add_argument("--cases", action="append", metavar="PATTERN")
    listing.add_argument("--level", choices=["Required", "Recommended"])
    listing.add_argument("--profile", action="append")
    listing.add_argument("--long", action="store_true", help="with profile, operation and clauses")

    show = sub.add_parser("show", help="a case, its clauses and its expectation")
    show.add_argument("case_id")
    show.add_argument("--corpus")

    explain = sub.add_parser("explain", help="run one case and show expected versus actual")
    explain.add_argument("case_id")
    _add_adapter_options(explain)

    clauses = sub.add_parser("clauses", help="clause coverage table (fails if a clause has no case)")
    clauses.add_argument("--corpus")
    clauses.add_argument("--markdown", action="store_true")
    clauses.add_argument("--cases", action="store_true", help="list the cases of every clause")

    bundle = sub.add_parser("verify-bundle", help="check a certification bundle (a report directory)")
    bundle.add_argument("directory")
    bundle.add_argument("--corpus")
    bundle.add_argument("--rerun", action="store_true", help="also rerun every case and compare verdicts")
    bundle.add_argument("--adapter")
    bundle.add_argument("--testee")

    from conformance.audit.cli import add_parsers

    add_parsers(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        argv = ["run"]
    args = _parser().parse_args(argv)
    try:
        if args.command in (None, "run"):
            return cmd_run(args, argv)
        from conformance.audit.cli import cmd_audit, cmd_spec_coverage

        return {"list": cmd_list, "show": cmd_show, "explain": cmd_explain, "clauses": cmd_clauses,
                "verify-bundle": cmd_verify_bundle, "audit": cmd_audit,
                "spec-coverage": cmd_spec_coverage}[args.command](args)
    except SuiteError as error:
        print(f"conformance: {error}", file=sys.stderr)
        return 2


def _select(args):
    from conformance.cases import load_cases, select

    shard = None
    if getattr(args, "shard", None):
        index, _, count = args.shard.partition("/")
        shard = (int(index), int(count))
        if not 1 <= shard[0] <= shard[1]:
            raise SuiteError("--shard is i/n with 1 <= i <= n")
    cases = load_cases(args.corpus)
    chosen = select(cases, args.cases, args.level, set(args.profile) if args.profile else None, shard)
    return cases, chosen


def cmd_run(args, argv: list[str]) -> int:
    from conformance import bundle, failure_list, reports
    from conformance.clause_table import uncovered
    from conformance.runner import RunConfig, run, summary_line

    cases, chosen = _select(args)
    missing = uncovered(cases)
    if not chosen:
        raise SuiteError("no case matches the selection")
    config = RunConfig(adapter=args.adapter, testee=args.testee, timeout=args.timeout, corpus=args.corpus,
                       jobs=args.jobs, require_codes=args.require_codes, progress=not args.quiet)
    results, info = run(chosen, config)
    info.selection = {"cases": args.cases, "level": args.level, "profile": args.profile, "shard": args.shard,
                      "count": len(chosen), "failure_list": args.failure_list}
    problems: list[str] = []
    waivers: list[dict] = []
    if args.failure_list and args.update_failure_list:
        written = failure_list.write(args.failure_list, results, header=f"Expected failures for "
                                     f"{info.adapter['name']} (suite {SUITE_VERSION})")
        print(f"wrote {written} entries to {args.failure_list}")
    if args.failure_list:
        entries = failure_list.read(args.failure_list)
        problems = failure_list.apply(entries, results, [c.id for c in cases])
        waivers = [{"pattern": e.pattern, "message": e.message} for e in entries]
    failures = [r for r in results if r.verdict == "failed" and not r.expected_failure]
    for result in failures[:20]:
        print(f"FAILED {result.id}: {result.message}")
    if len(failures) > 20:
        print(f"... and {len(failures) - 20} more failures (see the report)")
    for problem in problems:
        print(f"FAILURE LIST: {problem}")
    directory = reports.write_all(args.report_dir, results, info, problems)
    bundle.write(directory, results, info, waivers, args.corpus)
    print(f"report: {directory}/ (summary.md, junit.xml, results.json, manifest.json) in {info.duration:.1f} s")
    if problems or (failures and args.failure_list):
        print("to update the failure list, run:\n  " + _update_command(argv, args))
    print(summary_line(results))
    if missing:
        print(f"SELF-CHECK FAILED: clauses without a case: {', '.join(missing)}")
        return 2
    return 1 if failures or problems else 0


def _update_command(argv: list[str], args) -> str:
    words = ["python", "-m", "conformance"] + [a for a in argv if a != "--update-failure-list"]
    if "run" not in argv:
        words.insert(3, "run")
    if not args.failure_list:
        words += ["--failure-list", "FILE"]
    return " ".join(shlex.quote(w) for w in words + ["--update-failure-list"])


def cmd_list(args) -> int:
    from conformance.cases import load_cases, select

    chosen = select(load_cases(args.corpus), args.cases, args.level, set(args.profile) if args.profile else None)
    for case in chosen:
        if args.long:
            print(f"{case.id}  [{case.profile}; {case.op}; {', '.join(case.clauses)}]")
        else:
            print(case.id)
    print(f"{len(chosen)} cases", file=sys.stderr)
    return 0


def _find(case_id: str, corpus: str | None):
    from conformance.cases import load_cases

    for case in load_cases(corpus):
        if case.id == case_id:
            return case
    raise SuiteError(f"no case {case_id!r} (try: python -m conformance list --cases {case_id.split('.')[0]})")


def cmd_show(args) -> int:
    from reference_impl.clauses import CLAUSES

    case = _find(args.case_id, args.corpus)
    print(f"{case.id}")
    print(f"  defined in:   corpus/{case.source}")
    print(f"  level:        {case.level}    profile: {case.profile}    operation: {case.op}")
    if case.description:
        print(f"  description:  {case.description}")
    for clause in case.clauses:
        print(f"  clause:       {clause} ({CLAUSES[clause].section}): {CLAUSES[clause].text}")
    for quote in case.quote:
        print(f"  spec says:    \"{quote}\"")
    print(f"  expects:      {case.summary()}")
    print(f"  expectation source: {case.expectation_source}")
    print(f"  sha256:       {case.sha256()}")
    if case.value:
        print(f"  value:        {case.value}")
    if case.expect:
        print(f"  expect:       {json.dumps(case.expect)}")
    for index, step in enumerate(case.steps):
        print(f"  step {index}: {json.dumps(step)}")
    if case.builder:
        print(f"  builder:      {case.builder}({json.dumps(case.args)})")
    elif case.model_text is not None:
        print("  model (text format):")
        print("\n".join("    " + line for line in case.model_text.strip().splitlines()))
    if case.merge:
        print("  merged onto the model:")
        print("\n".join("    " + line for line in case.merge.strip().splitlines()))
    return 0


def cmd_explain(args) -> int:
    from conformance.adapters import load_adapter
    from conformance.execute import PASSED, run_case

    case = _find(args.case_id, args.corpus)
    adapter = load_adapter(args.adapter, args.testee, args.timeout)
    try:
        result = run_case(case, adapter, timeout=args.timeout)
    finally:
        if hasattr(adapter, "shutdown"):
            adapter.shutdown()
    print(f"{case.id}: {result.verdict}")
    print(f"  clauses:  {', '.join(case.clauses)}")
    print(f"  expected: {result.expected}")
    print(f"  actual:   {result.actual or ('as expected' if result.verdict == PASSED else '-')}")
    print(f"  message:  {result.message}")
    if result.detail:
        print("  detail:\n" + "\n".join("    " + line for line in result.detail.splitlines()))
    if result.traceback:
        print("  traceback:\n" + "\n".join("    " + line for line in result.traceback.splitlines()))
    return 0 if result.verdict == PASSED else 1


def cmd_clauses(args) -> int:
    from conformance.cases import load_cases
    from conformance.clause_table import render, uncovered

    cases = load_cases(args.corpus)
    print(render(cases, markdown=args.markdown, with_cases=args.cases))
    return 1 if uncovered(cases) else 0


def cmd_verify_bundle(args) -> int:
    from conformance import bundle

    problems = bundle.verify(args.directory, args.corpus, args.rerun, args.adapter, args.testee)
    for problem in problems:
        print(f"BUNDLE: {problem}")
    print(f"bundle {args.directory}: {'OK' if not problems else f'{len(problems)} problem(s)'}")
    return 1 if problems else 0

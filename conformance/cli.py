"""``python -m conformance``: run, list, show, explain, new-adapter, clauses, merge, verify-bundle, sign,
keygen, audit, spec-coverage.

Exit status: 0 when every selected case passed or was an expected failure and the failure list is
clean; 1 on failures or failure-list problems; 2 on usage or suite errors, or (merge) on directories
that are not the shards of one run.
"""

from __future__ import annotations

import argparse
import shlex
import sys

from conformance import SPEC_REVISION, SUITE_VERSION
from conformance.adapters import ADAPTER_CONTRACT_VERSION, SuiteError
from conformance.bundle_files import BundleError
from conformance.text import clip
from reference_impl.broken_pipe import quiet_broken_pipe

DEFAULT_REPORT_DIR = "conformance-report"
#: Width of one-line CLI messages (cut at a word boundary; reports and ``explain`` keep them whole).
MESSAGE_WIDTH = 240


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
    parser.add_argument("--version", action="version", version=f"%(prog)s {SUITE_VERSION} spec {SPEC_REVISION} "
                                                               f"adapter contract {ADAPTER_CONTRACT_VERSION}")
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
    run.add_argument("--quiet", action="store_true",
                     help="print the summary line only (failure-list problems and self-check failures go to "
                          "stderr; everything else is in the report directory)")
    run.add_argument("--no-isolation", action="store_true",
                     help="run cases in the runner's own process, not in worker processes (for debugging: a "
                          "case that crashes the process then ends the run)")

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
    explain.add_argument("--report-dir", help="show the result a run recorded in this report directory instead "
                                              "of running the case")

    scaffold = sub.add_parser("new-adapter", help="write a working adapter skeleton and its first failure list "
                                                   "(docs/adapters.md)")
    scaffold.add_argument("name", help="the runtime's name, e.g. myrt")
    scaffold.add_argument("--lowered", action="store_true",
                          help="a standard ONNX runtime on the lowering base (DequantizeLinear, caller feedback)")
    scaffold.add_argument("--dir", default=".", help="where to write NAME_adapter.py and NAME-failures.txt")
    scaffold.add_argument("--no-run", action="store_true", help="do not run the suite for the first failure list")

    clauses = sub.add_parser("clauses", help="clause coverage table (fails if a clause has no case)")
    clauses.add_argument("--corpus")
    clauses.add_argument("--markdown", action="store_true")
    clauses.add_argument("--cases", action="store_true", help="list the cases of every clause")
    clauses.add_argument("--independent", type=int, metavar="N",
                         help="list the rule clauses with fewer than N independent Required cases (distinct models)")

    merge = sub.add_parser("merge", help="merge the report directories of run --shard i/n into one report and "
                                         "one certification bundle")
    merge.add_argument("shards", nargs="+", metavar="SHARD_DIR")
    merge.add_argument("--report-dir", default=DEFAULT_REPORT_DIR)
    merge.add_argument("--corpus")
    merge.add_argument("--trusted-key", action="append", metavar="PUB",
                       help="every shard must be signed by one of these Ed25519 public keys (PEM; repeatable)")

    bundle = sub.add_parser("verify-bundle", help="check a certification bundle and authenticate its claim "
                                                  "(docs/conformance.md, \"Certificates\")")
    bundle.add_argument("directory")
    bundle.add_argument("--corpus")
    bundle.add_argument("--trusted-key", action="append", metavar="PUB",
                        help="accept the bundle's signature by this Ed25519 public key (PEM; repeatable)")
    bundle.add_argument("--rerun", action="store_true",
                        help="rerun the whole selection of every profile the bundle claims on the runtime named by "
                             "--adapter or --testee (never anything the bundle names) and compare")
    bundle.add_argument("--adapter", help="the runtime to rerun on (as for run --adapter)")
    bundle.add_argument("--testee", help="the runtime to rerun on (as for run --testee)")
    bundle.add_argument("--timeout", type=float, default=30.0, help="seconds per case of a rerun")
    bundle.add_argument("-j", "--jobs", type=int, default=1, help="worker processes of a rerun (as for run -j)")
    bundle.add_argument("--integrity-only", action="store_true",
                        help="only check that the bundle is consistent with itself and this corpus; this does not "
                             "prove who ran it")

    sign = sub.add_parser("sign", help="sign a bundle with an Ed25519 key (an in-toto statement in a DSSE "
                                       "envelope, written to attestation.dsse.json)")
    sign.add_argument("directory")
    sign.add_argument("--key", required=True, help="Ed25519 private key (PEM, unencrypted)")
    sign.add_argument("--corpus")

    keygen = sub.add_parser("keygen", help="write a new Ed25519 key pair for sign / verify-bundle --trusted-key")
    keygen.add_argument("--out", required=True, metavar="PREFIX", help="writes PREFIX.pem (private, 0600) and "
                                                                        "PREFIX.pub.pem (public); never overwrites")

    from conformance.audit.cli import add_parsers
    from conformance.dashboard.cli import add_parser as add_dashboard

    add_parsers(sub)
    add_dashboard(sub)
    return parser


@quiet_broken_pipe
def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv:
        argv = ["run"]
    args = _parser().parse_args(argv)
    try:
        if args.command in (None, "run"):
            return cmd_run(args, argv)
        from conformance.audit.cli import cmd_audit, cmd_spec_coverage
        from conformance.dashboard.cli import cmd_dashboard

        return {"list": cmd_list, "show": cmd_show, "explain": cmd_explain, "clauses": cmd_clauses,
                "verify-bundle": cmd_verify_bundle, "new-adapter": cmd_new_adapter, "merge": cmd_merge,
                "sign": cmd_sign, "keygen": cmd_keygen,
                "audit": cmd_audit, "spec-coverage": cmd_spec_coverage,
                "dashboard": cmd_dashboard}[args.command](args)
    except (SuiteError, BundleError) as error:
        print(f"conformance: {clip(str(error), MESSAGE_WIDTH)}", file=sys.stderr)
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
    _print_rename_notes(args.cases, cases)
    return cases, chosen


def _print_rename_notes(patterns, cases) -> None:
    from conformance.cases import rename_notes

    for line in rename_notes(patterns, cases):
        print(clip(line, MESSAGE_WIDTH), file=sys.stderr)


def cmd_run(args, argv: list[str]) -> int:
    from conformance import bundle, failure_list, renames, reports
    from conformance.adapters.testee_client import TesteeUnavailable
    from conformance.clause_table import uncovered
    from conformance.execute import PASSED_WITHOUT_CODE
    from conformance.runner import RunConfig, run, summary_line

    cases, chosen = _select(args)
    missing = uncovered(cases)
    if not chosen:
        raise SuiteError("no case matches the selection")
    if args.failure_list and not args.update_failure_list:
        failure_list.read(args.failure_list)  # a missing or unreadable list is a one-line error, before the run
    config = RunConfig(adapter=args.adapter, testee=args.testee, timeout=args.timeout, corpus=args.corpus,
                       jobs=args.jobs, require_codes=args.require_codes, progress=not args.quiet,
                       isolation=not args.no_isolation)
    try:
        results, info = run(chosen, config)
    except TesteeUnavailable as error:  # no case can run: one line, the summary, exit 2
        print(f"conformance: {error}", file=sys.stderr)
        print(f"{summary_line([])} ({len(chosen)} cases not run: the testee is unusable)")
        return 2
    info.selection = {"cases": args.cases, "level": args.level, "profile": args.profile, "shard": args.shard,
                      "count": len(chosen), "failure_list": args.failure_list}
    problems: list[str] = []
    waivers: list[dict] = []
    say = _quiet_print if args.quiet else print
    if args.failure_list and args.update_failure_list:
        written = failure_list.write(args.failure_list, results, header=f"Expected failures for "
                                     f"{info.adapter['name']} (suite {SUITE_VERSION})")
        say(f"wrote {written} entries to {args.failure_list}")
    if args.failure_list:
        entries, notes = failure_list.upgrade(failure_list.read(args.failure_list), [c.id for c in cases],
                                              renames.table_of(cases))
        for line in notes:
            print(clip(f"{args.failure_list}: {line}", MESSAGE_WIDTH))
        problems = failure_list.apply(entries, results, [c.id for c in cases])
        waivers = [{"pattern": e.pattern, "message": e.message} for e in entries]
    failures = _print_failures(results, problems, quiet=args.quiet)
    directory = reports.write_all(args.report_dir, results, info, problems, bundle.statuses(results, info, args.corpus))
    manifest = bundle.write(directory, results, info, waivers, args.corpus)
    say(f"report: {directory}/ (summary.md, junit.xml, results.json, manifest.json) in {info.duration:.1f} s")
    say(certification_line(manifest))
    if problems or (failures and args.failure_list):
        (_stderr if args.quiet else print)("to update the failure list, run:\n  " + _update_command(argv, args))
    uncoded = sum(r.verdict == PASSED_WITHOUT_CODE for r in results)
    if uncoded:
        say(f"{uncoded} case(s) passed without an error code: they do not certify their profile "
            "(see summary.md; --require-codes makes them failures)")
    print(summary_line(results))
    if missing:
        (_stderr if args.quiet else print)(f"SELF-CHECK FAILED: clauses without a case: {', '.join(missing)}")
        return 2
    return 1 if failures or problems else 0


def _quiet_print(*_: object) -> None:
    """``run --quiet``: the line is in the report directory, not on the terminal."""


def _stderr(text: str) -> None:
    print(text, file=sys.stderr)


def certification_line(manifest: dict) -> str:
    """One line: which claimed profiles the run certified, and why a partial run certifies none."""
    from conformance.certificate import EARNED

    profiles = manifest["profiles"]
    earned = [p for p, status in sorted(profiles.items()) if status in EARNED]
    others = [f"{p} {status}" for p, status in sorted(profiles.items()) if status not in EARNED]
    line = f"certification: {', '.join(earned) or 'no profile'} certified"
    if not manifest["selection"].get("full"):
        line += " (a partial run — --cases, --level, --profile or --shard — certifies no profile)"
    elif others:
        line += f"; {'; '.join(others)}"
    return line + " (sign with: python -m conformance sign DIR --key KEY)" * bool(earned)


def _print_failures(results, problems: list[str], quiet: bool = False) -> list:
    """Print the first unexpected failures and every failure-list problem; return the failures. Quiet:
    no failure lines (the report has them), and the failure-list problems on stderr."""
    failures = [r for r in results if r.verdict in ("failed", "crashed") and not r.expected_failure]
    for result in [] if quiet else failures[:20]:
        print(clip(f"{result.verdict.upper()} {result.id}: {result.message}", MESSAGE_WIDTH))
    if len(failures) > 20 and not quiet:
        print(f"... and {len(failures) - 20} more failures (see the report)")
    for problem in problems:
        print(f"FAILURE LIST: {problem}", file=sys.stderr if quiet else sys.stdout)
    return failures


def _update_command(argv: list[str], args) -> str:
    words = ["python", "-m", "conformance"] + [a for a in argv if a != "--update-failure-list"]
    if "run" not in argv:
        words.insert(3, "run")
    if not args.failure_list:
        words += ["--failure-list", "FILE"]
    return " ".join(shlex.quote(w) for w in words + ["--update-failure-list"])


def cmd_list(args) -> int:
    from conformance.cases import load_cases, select

    cases = load_cases(args.corpus)
    chosen = select(cases, args.cases, args.level, set(args.profile) if args.profile else None)
    _print_rename_notes(args.cases, cases)
    for case in chosen:
        if args.long:
            print(f"{case.id}  [{case.profile}; {case.op}; {', '.join(case.clauses)}]")
        else:
            print(case.id)
    print(f"{len(chosen)} cases", file=sys.stderr)
    return 0


def _find(case_id: str, corpus: str | None):
    from conformance import renames
    from conformance.cases import load_cases

    cases = load_cases(corpus)
    current = renames.resolve(case_id, renames.table_of(cases))
    for case in cases:
        if case.id == current:
            if current != case_id:
                print(renames.note("case", case_id, [current]), file=sys.stderr)
            return case
    raise SuiteError(f"no case {case_id!r} (try: python -m conformance list --cases {case_id.split('.')[0]})")


def cmd_show(args) -> int:
    from conformance.explain import show

    print(show(_find(args.case_id, args.corpus)))
    return 0


def cmd_explain(args) -> int:
    from conformance.adapters import load_adapter
    from conformance.execute import PASSING
    from conformance.explain import explain

    case = _find(args.case_id, args.corpus)
    if args.report_dir:
        from conformance.explain import explain_reported

        result, text = explain_reported(case, args.report_dir)
        print(text)
        return 0 if result.verdict in PASSING else 1
    adapter = load_adapter(args.adapter, args.testee, args.timeout)
    try:
        result, text = explain(case, adapter, args.timeout)
    finally:
        if hasattr(adapter, "shutdown"):
            adapter.shutdown()
    print(text)
    return 0 if result.verdict in PASSING else 1


def cmd_new_adapter(args) -> int:
    import pathlib

    from conformance import scaffold

    path, spec = scaffold.write(args.name, args.lowered, args.dir, run=not args.no_run)
    print(f"wrote {path}")
    listing = pathlib.Path(args.dir) / f"{args.name}-failures.txt"
    report = pathlib.Path(args.dir) / f"{args.name}-report"
    if not args.no_run:
        line = scaffold.first_failure_list(spec, listing, report)
        print(f"wrote {listing} (the skeleton's failures) and {report}/: {line}")
    print("next (docs/adapters.md):")
    for command in (f"python -m conformance run --adapter {spec} --failure-list {listing} --report-dir {report}",
                    f"python -m conformance explain CASE_ID --adapter {spec}",
                    f"python -m conformance run --adapter {spec} --failure-list {listing} --update-failure-list"):
        print(f"  {command}")
    return 0


def cmd_clauses(args) -> int:
    from conformance.cases import load_cases
    from conformance.clause_table import render, uncovered

    cases = load_cases(args.corpus)
    if args.independent:
        from conformance.clause_table import render_independent

        print(render_independent(cases, args.independent))
        return 0
    print(render(cases, markdown=args.markdown, with_cases=args.cases))
    return 1 if uncovered(cases) else 0


def _trusted_keys(paths: list[str] | None) -> list:
    from conformance.attestation import load_public_key

    return [load_public_key(path) for path in paths or []]


def cmd_verify_bundle(args) -> int:
    from conformance import bundle

    if (args.adapter or args.testee) and not args.rerun:
        raise SuiteError("--adapter/--testee name the runtime of a rerun: add --rerun")
    if args.rerun and not (args.adapter or args.testee):
        raise SuiteError("--rerun needs the runtime to rerun on, named by you: --adapter NAME or --testee COMMAND "
                         "(the bundle's own adapter identity is never executed)")
    if not (args.trusted_key or args.rerun or args.integrity_only):
        raise SuiteError("a bundle's digests can be recomputed by whoever edits it, so they do not prove who ran "
                         "it: pass --trusted-key PUB (its signature) or --rerun with --adapter/--testee, or ask "
                         "for the weaker check with --integrity-only")
    outcome = bundle.verify(args.directory, args.corpus, trusted_keys=_trusted_keys(args.trusted_key),
                            rerun_adapter=args.adapter if args.rerun else None,
                            rerun_testee=args.testee if args.rerun else None, timeout=args.timeout,
                            integrity_only=args.integrity_only, jobs=args.jobs)
    for problem in outcome.problems:
        print(clip(f"BUNDLE: {problem}", MESSAGE_WIDTH * 2))
    if outcome.problems:
        print(f"bundle {args.directory}: {len(outcome.problems)} problem(s)")
        return 1
    profiles = (outcome.manifest or {}).get("profiles", {})
    earned = sorted(p for p, status in profiles.items() if status in ("certified", "certified-with-waivers"))
    print(f"bundle {args.directory}: OK, {outcome.authenticated_by}; certified: {', '.join(earned) or 'none'}")
    return 0


def cmd_sign(args) -> int:
    from conformance import bundle

    key = bundle.sign(args.directory, args.key, args.corpus)
    print(f"signed {args.directory} with key {key[:16]} ({args.directory}/attestation.dsse.json)")
    return 0


def cmd_keygen(args) -> int:
    from conformance.attestation import generate_key

    key = generate_key(f"{args.out}.pem", f"{args.out}.pub.pem")
    print(f"wrote {args.out}.pem (private; keep it secret) and {args.out}.pub.pem (give it to certifiers): "
          f"key {key[:16]}")
    return 0


def cmd_merge(args) -> int:
    from conformance.merge import MergeRejected, merge
    from conformance.runner import summary_line

    try:
        results, info, problems = merge(args.shards, args.report_dir, args.corpus,
                                        _trusted_keys(args.trusted_key))
    except MergeRejected as rejected:
        for problem in rejected.problems:
            print(f"MERGE: {problem}")
        print(f"merge: the {len(args.shards)} director(ies) are not the shards of one run; nothing written")
        return 2
    failures = _print_failures(results, problems)
    print(f"report: {args.report_dir}/ (summary.md, junit.xml, results.json, manifest.json) merged from "
          f"{len(info.selection['shards'])} shards")
    from conformance.bundle_files import read_json

    print(certification_line(read_json(args.report_dir, "manifest.json")))
    print(summary_line(results))
    return 1 if failures or problems else 0


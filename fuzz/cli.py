"""``python -m fuzz`` commands: run, triage, promote, seeds, dict, list.

    python -m fuzz run TARGET --time SECONDS --jobs N     campaign with progress and a report
    python -m fuzz triage DIR                             deduplicate and minimize findings
    python -m fuzz promote FINDING                        regression input + conformance case
    python -m fuzz seeds                                  regenerate corpus/seeds/<target>/
    python -m fuzz dict                                   regenerate corpus/dict/*.dict
    python -m fuzz list                                   targets and what they check
"""

from __future__ import annotations

import argparse
import sys

from reference_impl.broken_pipe import quiet_broken_pipe


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m fuzz", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a fuzz campaign on one target")
    run.add_argument("target")
    run.add_argument("--time", type=float, default=60.0, help="seconds (wall clock)")
    run.add_argument("--jobs", type=int, default=1, help="parallel fuzzing processes")
    run.add_argument("--runs", type=int, default=0, help="stop each job after this many executions (0: no limit)")
    run.add_argument("--out", default=None, help="report directory (default fuzz-runs/<target>-<time>)")
    run.add_argument("--corpus", default=None, help="working corpus kept between runs "
                                                    "(default fuzz-runs/corpus/<target>)")
    run.add_argument("--no-seeds", action="store_true", help="do not read corpus/seeds/<target>")
    run.add_argument("--seed", type=int, default=0, help="libFuzzer -seed for job 0 (others add their index)")
    run.add_argument("--subject", help="differential and statediff targets: adapter spec (FUZZ_SUBJECT)")
    run.add_argument("--testee", help="differential and statediff targets: subprocess testee command (FUZZ_TESTEE)")
    run.add_argument("--fault", help="with fuzz.subjects:faulty_reference as the subject: FUZZ_FAULT")
    run.add_argument("--quiet", action="store_true")
    run.add_argument("--stop-on-finding", action="store_true", help="end the campaign at the first finding")
    run.add_argument("--fail-on-finding", action="store_true", help="exit with status 1 if there are findings")
    triage = sub.add_parser("triage", help="deduplicate findings by origin and minimize them")
    triage.add_argument("directory")
    triage.add_argument("--target", help="target the findings came from (default: read from the report)")
    triage.add_argument("--no-minimize", action="store_true")
    promote = sub.add_parser("promote", help="turn a finding into a regression input and a conformance case")
    promote.add_argument("finding")
    promote.add_argument("--target", required=False)
    promote.add_argument("--cases-dir", default=None, help="where the conformance manifest goes "
                                                           "(default corpus/regressions/cases)")
    promote.add_argument("--note", default="", help="what the finding is (goes into the case description)")
    promote.add_argument("--expect", help="the error code a correct implementation reports (needed when the "
                                          "finding is a crash of the oracle itself)")
    promote.add_argument("--status", choices=["open", "fixed"], help="open: a known oracle issue (the "
                                                                      "regression test is a strict xfail)")
    sub.add_parser("seeds", help="regenerate the seed corpora")
    sub.add_parser("dict", help="regenerate the libFuzzer dictionaries")
    sub.add_parser("list", help="list the targets")
    return parser


@quiet_broken_pipe
def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "seeds":
        from conformance.adapters import SuiteError
        from fuzz.corpus import write_seeds

        try:
            counts = write_seeds()
        except SuiteError as error:
            print(f"fuzz seeds: {error}", file=sys.stderr)
            return 2
        for target, count in counts.items():
            print(f"corpus/seeds/{target}: {count} files")
        return 0
    if args.command == "dict":
        from fuzz.corpus import write_dicts

        for path in write_dicts():
            print(path)
        return 0
    if args.command == "list":
        from fuzz.targets import TARGETS, load

        for name in TARGETS:
            print(f"{name:13s} {load(name).__doc__.strip().splitlines()[0]}")
        return 0
    if args.command == "run":
        from fuzz.campaign import run_campaign

        report = run_campaign(args)
        return 1 if report["findings"] and (args.stop_on_finding or args.fail_on_finding) else 0
    if args.command == "triage":
        from fuzz.triage import triage

        groups = triage(args.directory, args.target, minimize=not args.no_minimize)
        return 1 if groups else 0
    if args.command == "promote":
        from fuzz.promote import promote

        promote(args.finding, args.target, args.cases_dir, args.note, args.expect, args.status)
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())

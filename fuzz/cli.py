"""``python -m fuzz`` commands: run, triage, promote, replay, seeds, dict, list.

    python -m fuzz run TARGET --time SECONDS --jobs N     campaign with progress and a report
    python -m fuzz triage DIR                             deduplicate and minimize findings
    python -m fuzz promote FINDING                        regression input + conformance case
    python -m fuzz replay TARGET FILE...                  run inputs through a target, say what they hit
    python -m fuzz seeds                                  regenerate corpus/seeds/<target>/
    python -m fuzz dict                                   regenerate corpus/dict/*.dict
    python -m fuzz list                                   targets and what they check

Every path is read from where the command is started (relative paths mean what they mean in your
shell), and what a command writes without being told where goes under the current directory
(./fuzz-runs/, ./corpus/regressions/), never into the installed package.
"""

from __future__ import annotations

import argparse
import sys

from fuzz.errors import CommandError
from fuzz.targets import TARGETS
from reference_impl.broken_pipe import quiet_broken_pipe
from reference_impl.cli_paths import user_path

_WHERE = ("Relative paths are read from the current directory; outputs without a named place go under the "
          "current directory, never into the installed package.")


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def _positive_seconds(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError("must be more than 0 seconds")
    return value


def subject_spec(text: str) -> str:
    """An adapter spec with its file part (``path/to/file.py:attribute``) made absolute, so a job or worker
    loads the file the user meant; names and ``module:attribute`` specs are kept as they are."""
    location, colon, attribute = text.rpartition(":")
    if colon and (location.endswith(".py") or "/" in location):
        return f"{user_path(location)}:{attribute}"
    return text


def _subject_options(parser: argparse.ArgumentParser, recorded: bool) -> None:
    note = " (instead of the recorded one)" if recorded else ""
    parser.add_argument("--subject", type=subject_spec,
                        help=f"differential and statediff targets: adapter spec (FUZZ_SUBJECT){note}")
    parser.add_argument("--testee", help="differential and statediff targets: subprocess testee command "
                                         "(FUZZ_TESTEE)" + ("; a testee command recorded in a findings "
                                                            "directory is never run" if recorded else ""))
    parser.add_argument("--fault", help="with fuzz.subjects:faulty_reference as the subject: FUZZ_FAULT")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m fuzz", description=__doc__.split("\n\n")[0],
                                     epilog=_WHERE)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a fuzz campaign on one target", epilog=_WHERE)
    run.add_argument("target", choices=TARGETS)
    run.add_argument("--time", type=_positive_seconds, default=60.0, help="seconds (wall clock)")
    run.add_argument("--jobs", type=_positive_int, default=1, help="parallel fuzzing processes")
    run.add_argument("--runs", type=int, default=0, help="stop each job after this many executions (0: no limit)")
    run.add_argument("--out", type=user_path, default=None,
                     help="report directory (default ./fuzz-runs/<target>-<time> under the current directory)")
    run.add_argument("--corpus", type=user_path, default=None,
                     help="working corpus kept between runs (default ./fuzz-runs/corpus/<target> under the "
                          "current directory)")
    run.add_argument("--no-seeds", action="store_true", help="do not read corpus/seeds/<target>")
    run.add_argument("--seed", type=int, default=0, help="libFuzzer -seed for job 0 (others add their index)")
    _subject_options(run, recorded=False)
    run.add_argument("--quiet", action="store_true")
    run.add_argument("--stop-on-finding", action="store_true", help="end the campaign at the first finding")
    run.add_argument("--fail-on-finding", action="store_true", help="exit with status 1 if there are findings "
                                                                    "(a campaign that could not run exits 2)")
    triage = sub.add_parser("triage", help="deduplicate findings by origin and minimize them", epilog=_WHERE)
    triage.add_argument("directory", type=user_path)
    triage.add_argument("--target", choices=TARGETS,
                        help="target the findings came from (default: read from the report)")
    triage.add_argument("--no-minimize", action="store_true")
    _subject_options(triage, recorded=True)
    promote = sub.add_parser("promote", help="turn a finding into a regression input and a conformance case",
                             epilog=_WHERE)
    promote.add_argument("finding", type=user_path)
    promote.add_argument("--target", choices=TARGETS)
    promote.add_argument("--regressions-dir", type=user_path, default=None,
                         help="where regression inputs go (default $FUZZ_REGRESSIONS_DIR, else "
                              "./corpus/regressions under the current directory)")
    promote.add_argument("--cases-dir", type=user_path, default=None,
                         help="where the conformance manifest goes (default <regressions-dir>/cases)")
    promote.add_argument("--note", default="", help="what the finding is (goes into the case description)")
    promote.add_argument("--expect", type=_error_code, help="the error code a correct implementation reports "
                                                             "(needed when the finding is a crash of the oracle)")
    promote.add_argument("--status", choices=["open", "fixed"], help="open: a known oracle issue (the "
                                                                      "regression test is a strict xfail)")
    _subject_options(promote, recorded=True)
    replay = sub.add_parser("replay", help="run inputs through a target in a worker process and say what "
                                           "each one hits", epilog=_WHERE)
    replay.add_argument("target", choices=TARGETS)
    replay.add_argument("files", nargs="+", type=user_path, metavar="FILE")
    _subject_options(replay, recorded=False)
    sub.add_parser("seeds", help="regenerate the project's seed corpora (corpus/seeds of the package)")
    sub.add_parser("dict", help="regenerate the project's libFuzzer dictionaries (corpus/dict of the package)")
    sub.add_parser("list", help="list the targets")
    return parser


def _error_code(text: str) -> str:
    from reference_impl.errors import ErrorCode

    try:
        return ErrorCode(text).value
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an error code of the contract") from None


def _replay_files(args) -> int:
    from fuzz.findings_io import MAX_FINDING_BYTES, read_file
    from fuzz.replay import ReplayWorker

    inputs = [(path, read_file(path, str(path), MAX_FINDING_BYTES)) for path in args.files]
    environment = {name: value for name, value in (("FUZZ_SUBJECT", args.subject), ("FUZZ_TESTEE", args.testee),
                                                   ("FUZZ_FAULT", args.fault)) if value}
    worker = ReplayWorker(args.target, environment=environment)
    reproduced = 0
    try:
        for path, data in inputs:
            result = worker.run(data)
            if result.get("ok"):
                print(f"{path}: no finding")
            else:
                reproduced += 1
                known = f" (known issue {result['known']})" if result.get("known") else ""
                print(f"{path}: {result.get('signature')}{known}: {str(result.get('detail', ''))[:300]}")
    finally:
        worker.close()
    return 1 if reproduced else 0


#: What ``fuzz run`` needs beyond the suite: the ``fuzz`` extra (pyproject.toml).
FUZZ_MODULES = ("atheris", "hypothesis")


def missing_fuzz_modules() -> list[str]:
    """The modules of the ``fuzz`` extra that are not installed."""
    import importlib.util

    return [name for name in FUZZ_MODULES if importlib.util.find_spec(name) is None]


def _run(args) -> int:
    from fuzz.campaign import campaign_failure, run_campaign

    missing = missing_fuzz_modules()
    if missing:
        print(f"fuzz run: error: {' and '.join(missing)} not installed: install the fuzz extra "
              "(python -m pip install -e \".[fuzz]\")", file=sys.stderr)
        return 2
    report = run_campaign(args)
    failure = campaign_failure(report)
    if failure:
        print(f"fuzz run: error: {failure}", file=sys.stderr)
        return 2
    return 1 if report["findings"] and (args.stop_on_finding or args.fail_on_finding) else 0


def _dispatch(args) -> int:
    if args.command in ("seeds", "dict"):
        from conformance.locations import source_tree

        if source_tree() is None:  # an installed suite's corpus is not its to rewrite
            print(f"fuzz {args.command}: regenerates the repository's corpus/: run it in a source checkout",
                  file=sys.stderr)
            return 2
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
        from fuzz.targets import load

        for name in TARGETS:
            print(f"{name:13s} {load(name).__doc__.strip().splitlines()[0]}")
        return 0
    if args.command == "run":
        return _run(args)
    if args.command == "triage":
        from fuzz.triage import triage

        groups = triage(args.directory, args.target, minimize=not args.no_minimize, subject=args.subject,
                        testee=args.testee, fault=args.fault)
        return 1 if groups else 0
    if args.command == "promote":
        from fuzz.promote import promote

        promote(args.finding, args.target, args.cases_dir, args.note, args.expect, args.status,
                regressions=args.regressions_dir, subject=args.subject, testee=args.testee, fault=args.fault)
        return 0
    if args.command == "replay":
        return _replay_files(args)
    return 2


@quiet_broken_pipe
def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return _dispatch(args)
    except CommandError as error:
        print(f"fuzz {args.command}: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

"""Command line: ``python -m size_gate {measure,check,compare}``.

Exit status: 0 success or within budget, 1 over budget, 2 unusable input
(every :class:`SizeGateError`, printed as one line naming the file and problem).
Paths are made absolute against the current directory before anything runs
(:func:`reference_impl.cli_paths.user_path`).
"""

from __future__ import annotations

import argparse
import functools
import sys
from collections.abc import Sequence
from pathlib import Path

from reference_impl.broken_pipe import quiet_broken_pipe
from reference_impl.cli_paths import user_path
from size_gate import render
from size_gate.errors import SizeGateError
from size_gate.sources import measure_path

EXIT_OK, EXIT_OVER, EXIT_UNUSABLE = 0, 1, 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m size_gate",
        description="Measure ELF shared libraries and gate them against a TOML size budget.",
        epilog="Relative paths are read from the current directory.")
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p: argparse.ArgumentParser, budget_help: str) -> None:
        p.add_argument("--budget", default=None,  # text as typed: ``./onnx_proto`` is a file, ``onnx_proto`` a name
                       help=f"{budget_help}: a path, or a shipped budget's name such as onnx_proto or "
                            f"protoc_lite (default: onnx_proto)")
        p.add_argument("--pattern", default=None,
                       help="file-name pattern selecting the library inside a directory or wheel "
                            "(default: the budget's [library] pattern)")

    m = sub.add_parser("measure", help="print the metrics of one or more libraries")
    m.add_argument("paths", nargs="+", metavar="PATH", help="library file, directory or wheel")
    common(m, "budget file supplying the default --pattern")
    m.add_argument("--json", action="store_true", help="print JSON (always includes the symbol list)")
    m.add_argument("--symbols", action="store_true", help="also list the defined dynamic symbols")

    c = sub.add_parser("check", help="exit 0 within budget, 1 over it, 2 on unusable input")
    c.add_argument("path", metavar="PATH", help="library file, directory or wheel")
    common(c, "budget file")
    c.add_argument("--stage", default=None, help="budget stage to enforce (default: the budget's [gate] stage)")
    c.add_argument("--json", action="store_true", help="print the findings as JSON")

    d = sub.add_parser("compare", help="baseline and candidate side by side (Markdown or JSON)")
    d.add_argument("baseline", metavar="BASELINE")
    d.add_argument("candidate", metavar="CANDIDATE")
    common(d, "budget file; when given, the candidate is also gated (exit 1 when over)")
    d.add_argument("--stage", default=None, help="budget stage to enforce")
    d.add_argument("--format", choices=("markdown", "json"), default="markdown", help="stdout format")
    d.add_argument("--markdown-out", type=Path, default=None, help="also write the Markdown report here")
    d.add_argument("--json-out", type=Path, default=None, help="also write the JSON report here")
    return parser


def _write(path: Path, text: str) -> None:
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise SizeGateError("io-error", path, exc.strerror or str(exc)) from None


def _pattern(args: argparse.Namespace, budget) -> str:
    return args.pattern or budget.pattern


def _load_budget(path: Path | None):
    from size_gate.budget import load_budget  # imported as needed: measuring a library file reads no budget

    return load_budget(path)


def run(args: argparse.Namespace) -> int:
    if args.command == "measure":
        # A library file needs no pattern: the shipped budget is read only when a directory or wheel
        # needs its default one (a budget given with --budget is always read, and so checked).
        pattern = args.pattern or (_load_budget(args.budget).pattern if args.budget is not None
                                   else functools.cache(lambda: _load_budget(None).pattern))
        results = [measure_path(p, pattern) for p in args.paths]
        if args.json:
            data = [r.to_json() for r in results]
            print(render.dumps(data[0] if len(data) == 1 else data), end="")
        else:
            print("\n\n".join(render.measure_text(r, args.symbols) for r in results))
        return EXIT_OK

    from size_gate.compare import compare  # only checking and comparing need these
    from size_gate.gate import delta_findings, evaluate, passed

    budget = _load_budget(args.budget)
    stage = budget.stage(args.stage)
    if args.command == "check":
        if not stage.limits:
            raise SizeGateError("bad-budget", budget.path, f"stage {stage.name} only gates deltas against a baseline "
                                                           f"built side by side; use compare BASELINE CANDIDATE")
        metrics = measure_path(args.path, _pattern(args, budget))
        findings = evaluate(metrics, budget, stage)
        if args.json:
            print(render.dumps(render.check_json(metrics, budget, stage, findings)), end="")
        else:
            print(render.check_text(metrics, budget, stage, findings))
        return EXIT_OK if passed(findings) else EXIT_OVER

    baseline = measure_path(args.baseline, _pattern(args, budget))
    candidate = measure_path(args.candidate, _pattern(args, budget))
    cmp = compare(baseline, candidate)
    gated = args.budget is not None or args.stage is not None
    findings = evaluate(candidate, budget, stage) + delta_findings(baseline, candidate, stage) if gated else None
    shown_stage = stage if gated else None
    markdown = render.compare_markdown(cmp, shown_stage, findings)
    as_json = render.dumps(render.compare_json(cmp, shown_stage, findings))
    if args.markdown_out:
        _write(args.markdown_out, markdown)
    if args.json_out:
        _write(args.json_out, as_json)
    print(markdown if args.format == "markdown" else as_json, end="")
    return EXIT_OK if findings is None or passed(findings) else EXIT_OVER


#: The arguments that name files: resolved by ``main`` once parsed.
_PATH_ARGUMENTS = ("paths", "path", "baseline", "candidate", "budget", "markdown_out", "json_out")


def _is_shipped_name(value: str) -> bool:
    """A bare name of a budget shipped in size_gate/budgets (checked without importing the budget module,
    which measuring does not need)."""
    return "/" not in value and (Path(__file__).parent / "budgets" / f"{value}.toml").is_file()


def _resolve_paths(args: argparse.Namespace) -> None:
    for name in _PATH_ARGUMENTS:
        value = getattr(args, name, None)
        if name == "budget" and value is not None and _is_shipped_name(str(value)):
            setattr(args, name, str(value))  # a shipped budget's name, not a path
        elif isinstance(value, list):
            setattr(args, name, [user_path(item) for item in value])
        elif value is not None:
            setattr(args, name, user_path(value))


@quiet_broken_pipe
def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        _resolve_paths(args)
    except argparse.ArgumentTypeError as exc:
        parser.error(str(exc))
    try:
        return run(args)
    except SizeGateError as exc:
        print(f"size_gate: error {exc}", file=sys.stderr)
        return EXIT_UNUSABLE


__all__ = ["EXIT_OK", "EXIT_OVER", "EXIT_UNUSABLE", "main", "run"]

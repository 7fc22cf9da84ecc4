"""The ``dashboard`` subcommand: its arguments and its run (``conformance/cli.py`` registers both)."""

from __future__ import annotations

import argparse
import time


def add_parser(sub) -> argparse.ArgumentParser:
    """Add ``dashboard`` to the suite's subcommands."""
    parser = sub.add_parser("dashboard", help="a static site comparing result bundles: runs by spec area, "
                                              "down to each case's spec sentences (works from file://)")
    parser.add_argument("bundles", nargs="+", metavar="BUNDLE", help="report directories (run, or merge of shards)")
    parser.add_argument("--out", required=True, metavar="DIR", help="where to write the site (index.html)")
    parser.add_argument("--baseline", metavar="BUNDLE",
                        help="an earlier run of one of the runtimes: the site lists what changed since")
    parser.add_argument("--trusted-key", action="append", metavar="PUB",
                        help="show a signed bundle as verified when signed by this Ed25519 public key (PEM; "
                             "repeatable)")
    parser.add_argument("--corpus", help="corpus directory (default: the repository's corpus/)")
    parser.add_argument("-j", "--jobs", type=int, help="worker processes building case models (default: up to 2)")
    return parser


def cmd_dashboard(args) -> int:
    """Build the site; malformed or hostile bundles are one line and exit 2 (raised to the CLI's handler)."""
    from conformance.adapters import SuiteError

    try:
        import jinja2  # noqa: F401
    except ImportError:
        raise SuiteError("the dashboard needs Jinja2: pip install -e \".[dashboard]\"") from None
    from conformance.attestation import load_public_key
    from conformance.dashboard.build import build

    start = time.perf_counter()
    keys = [load_public_key(path) for path in args.trusted_key or []]
    site = build(args.bundles, args.out, args.baseline, keys, args.corpus, args.jobs)
    line = (f"dashboard: {site.directory}/index.html: {site.runs} run(s), {site.cases} cases, {site.pages} pages, "
            f"{site.size / 1e6:.1f} MB in {time.perf_counter() - start:.1f} s")
    if site.comparison:
        line += f"; {site.comparison.total} change(s) since the baseline (compare.html)"
    print(line)
    return 0

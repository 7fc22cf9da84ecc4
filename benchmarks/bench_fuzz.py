"""Throughput of the fuzz targets, against a peer measured in the same run.

    python benchmarks/bench_fuzz.py                      # every target, 5 s each, in process
    python benchmarks/bench_fuzz.py --campaign 60        # plus a real atheris campaign on the verify target
    python benchmarks/bench_fuzz.py --against REV --targets structured,state   # against an earlier revision

In process, each target replays its seed corpus round-robin against a peer doing only part of the
work on the same inputs (protobuf parsing for raw models, case generation for structure-aware ones,
the oracle side alone for the differential targets), so the ratio is what verification, the invariant
checks (every input runs twice) or the second implementation cost. ``FUZZ_SUBJECT``/``FUZZ_TESTEE`` pick
the differential targets' subject (e.g. ``FUZZ_TESTEE="python -m conformance.testee"``). The campaign figure is
libFuzzer's own rate on one core with atheris instrumentation and mutation: the number the
acceptance criterion (>= 1,000 exec/s for the raw verify target) refers to.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _rate(fn, inputs: list[bytes], seconds: float) -> tuple[float, int]:
    count, deadline = 0, time.perf_counter() + seconds
    start = time.perf_counter()
    while time.perf_counter() < deadline:
        fn(inputs[count % len(inputs)])
        count += 1
    return count / (time.perf_counter() - start), count


def _seeds(target: str) -> list[bytes]:
    return [p.read_bytes() for p in sorted((ROOT / "corpus" / "seeds" / target).iterdir())]


def _peers() -> dict:
    """Per target, the part of its work a peer would do anyway: parse the model, generate the case,
    or observe the oracle alone (so the ratio is what the checks and the second side cost)."""
    from fuzz.source import ByteSource
    from fuzz.statescript import gen_script
    from fuzz.targets import differential, structured
    from reference_impl import schema

    def parse(data: bytes) -> None:
        try:
            schema.parse_model(data)
        except Exception:  # noqa: BLE001 - the peer only parses
            pass

    def oracle_only(data: bytes) -> None:
        from fuzz.cases import scratch
        from fuzz.subjects import observe

        case = differential.case_for(data)
        observe(differential.adapters()[0], case.model_bytes(), scratch().populate(case.files))

    def oracle_plays(data: bytes) -> None:
        from fuzz import statediff as S
        from fuzz.targets import statediff

        oracle, subject = differential.adapters()
        S.play(oracle, statediff.build(data, statediff._holds(subject)), statediff._by_value(subject))

    return {"verify": ("protobuf parse", parse), "structured": ("generation only", structured.build),
            "differential": ("oracle side only", oracle_only),
            "state": ("script generation only", lambda d: gen_script(ByteSource(d))),
            "statediff": ("oracle side only", oracle_plays)}


def in_process(seconds: float, targets: list[str] | None = None) -> None:
    from fuzz.targets import TARGETS, load

    peers = _peers()
    print(f"{'target':13s} {'inputs':>6s} {'exec/s':>8s}  {'peer':24s} {'peer exec/s':>11s} {'ratio':>7s}")
    for name in targets or TARGETS:
        inputs = _seeds(name)
        rate, _ = _rate(load(name).one_input, inputs, seconds)
        label, peer_fn = peers.get(name, ("-", None))
        if peer_fn is None:
            print(f"{name:13s} {len(inputs):6d} {rate:8.0f}  {label:24s} {'-':>11s} {'-':>7s}")
            continue
        peer, _ = _rate(peer_fn, inputs, min(seconds, 2.0))
        print(f"{name:13s} {len(inputs):6d} {rate:8.0f}  {label:24s} {peer:11.0f} {peer / rate:6.1f}x")


#: One target's in-process rate on this checkout's seed corpus, run in a fresh interpreter under ``root``.
_RATE = """
import pathlib, sys, time
root, target, seconds, seeds = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
sys.path.insert(0, root)
from fuzz.targets import load
one_input = load(target).one_input
inputs = [p.read_bytes() for p in sorted(pathlib.Path(seeds).iterdir())]
for data in inputs[:10]:
    one_input(data)
count, start = 0, time.perf_counter()
while time.perf_counter() - start < seconds:
    one_input(inputs[count % len(inputs)])
    count += 1
print(count / (time.perf_counter() - start))
"""


def against(revision: str, seconds: float, targets: list[str], rounds: int = 3) -> None:
    """Each target's rate here and at ``revision`` (a temporary git worktree), on the same inputs (this
    checkout's seeds), in fresh interpreters taking turns, so a busy machine slows both alike."""
    with tempfile.TemporaryDirectory() as tmp:
        other = pathlib.Path(tmp, "other")
        subprocess.run(["git", "worktree", "add", "--detach", "-q", str(other), revision], cwd=ROOT, check=True)
        try:
            print(f"\nin-process exec/s here and at {revision} (same inputs, {rounds} alternating rounds, median)")
            for name in targets:
                rates: dict[str, list[float]] = {"here": [], "then": []}
                for index in range(rounds):
                    order = (("here", ROOT), ("then", other)) if index % 2 == 0 else (("then", other), ("here", ROOT))
                    for side, root in order:
                        out = subprocess.run([sys.executable, "-c", _RATE, str(root), name, str(seconds),
                                              str(ROOT / "corpus" / "seeds" / name)],
                                             cwd=tmp, check=True, capture_output=True, text=True).stdout
                        rates[side].append(float(out.split()[-1]))
                here, then = sorted(rates["here"])[rounds // 2], sorted(rates["then"])[rounds // 2]
                print(f"{name:13s} here {here:7.0f}  then {then:7.0f}  ratio {here / then:5.2f}x")
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(other)], cwd=ROOT, check=False)


def campaign(seconds: float) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        command = [sys.executable, "-m", "fuzz", "run", "verify", "--time", str(seconds), "--jobs", "1",
                   "--out", f"{tmp}/out", "--corpus", f"{tmp}/corpus", "--quiet"]
        subprocess.run(command, cwd=ROOT, check=True)
        report = json.loads(pathlib.Path(f"{tmp}/out/report.json").read_text())
    print(f"\natheris campaign, verify target, 1 job, {report['seconds']} s: {report['executions']:,} executions, "
          f"{report['exec_per_sec']:,.0f} exec/s (target >= 1,000: ratio {report['exec_per_sec'] / 1000:.1f}x), "
          f"coverage {report['coverage_edges']} edges, findings {len(report['findings'])}, "
          f"known-issue hits {report['known_issue_hits']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="per target, in process")
    parser.add_argument("--campaign", type=float, default=0.0, help="also run an atheris campaign this long")
    parser.add_argument("--targets", default=None, help="comma-separated targets (default: every target)")
    parser.add_argument("--against", default=None, metavar="REV",
                        help="also compare each target's rate with the code at git revision REV")
    args = parser.parse_args()
    targets = args.targets.split(",") if args.targets else None
    in_process(args.seconds, targets)
    if args.against:
        from fuzz.targets import TARGETS

        against(args.against, args.seconds, targets or list(TARGETS))
    if args.campaign:
        campaign(args.campaign)


if __name__ == "__main__":
    main()

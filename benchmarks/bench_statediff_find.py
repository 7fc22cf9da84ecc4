"""Time-to-find of the ``statediff`` target per fault class, against the tests' 60 s ceiling.

    python benchmarks/bench_statediff_find.py                  # 5 campaign seeds per class, in process
    python benchmarks/bench_statediff_find.py --testee         # the faulty runtimes behind the subprocess testee
    python benchmarks/bench_statediff_find.py --no-seeds       # starting from an empty corpus
    python benchmarks/bench_statediff_find.py --throughput 60  # plus campaign exec/s on the reference
    python benchmarks/bench_statediff_find.py --runs 0 --catalogue 20   # the audit catalogue's faults found
    python benchmarks/bench_statediff_find.py --runs 0 --planted 1      # the planted faults, 300 s ceiling each
    python benchmarks/bench_statediff_find.py --runs 0 --planted 1 --target differential   # the differential target's

Each run is ``python -m fuzz run statediff --stop-on-finding`` on one injected fault
(``fuzz.subjects.STATE_FAULT_CLASSES``) with a fresh working corpus; time-to-find is the campaign clock
(process start, atheris set-up and the seed corpus included) at the first finding. The ratio is the median
against the 60 s the tests allow. ``--throughput`` adds the campaign rate (atheris, one job) of the target on
the reference subject in process and through the subprocess testee, against the in-process rate.
``--catalogue SECONDS`` plays random scenarios (no libFuzzer, in process) against every state, binding,
zero-copy and KV fault of the audit catalogue for up to SECONDS each and lists which are found, and how.
``--planted RUNS`` runs RUNS campaigns (seeds 1..RUNS) on each fault of ``fuzz.planted_faults.PLANTED`` (a
first-item-only check, a dropped remainder tile, a stale cache keyed on an incomplete identity, a silent copy
of an odd caller buffer, an attribute ignored for one block format) with a ``PLANTED_CEILING`` budget and
prints the time to find each; with ``--target differential`` it runs the differential target's campaigns on
``fuzz.planted_faults.DIFFERENTIAL_PLANTED`` instead (a bit width checked for the first component only, a
dropped partial last block, one decode shared by near-duplicate values, a silent copy into a strided
``out=`` buffer).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
CEILING = 60.0
#: what a planted fault may take to be found (fuzz.planted_faults)
PLANTED_CEILING = 300.0
#: the audit catalogue's modules whose faults the statediff target is meant to reach
AREAS = ("state", "bindings", "zero_copy", "kv_contiguous", "kv_paged", "attention")


def campaign(subject: str, fault: str | None, seed: int, testee: bool, seeds: bool, budget: float,
             stop: bool = True, target: str = "statediff") -> dict:
    """The report of one ``python -m fuzz run TARGET`` campaign with a fresh working corpus."""
    with tempfile.TemporaryDirectory() as tmp:
        command = [sys.executable, "-m", "fuzz", "run", target, "--time", str(budget), "--seed", str(seed),
                   "--quiet", "--out", f"{tmp}/out", "--corpus", f"{tmp}/corpus"]
        if testee:
            command += ["--testee", f"{sys.executable} -m conformance.testee --adapter {subject}"]
        else:
            command += ["--subject", subject]
        if stop:
            command.append("--stop-on-finding")
        if not seeds:
            command.append("--no-seeds")
        env = dict(os.environ, FUZZ_FAULT=fault or "")
        subprocess.run(command, cwd=ROOT, env=env, check=False, capture_output=True, timeout=budget + 120)
        return json.loads(pathlib.Path(f"{tmp}/out/report.json").read_text())


def time_to_find(report: dict) -> float | None:
    """Campaign seconds at the first finding (None: nothing found)."""
    if not report["findings"]:
        return None
    return next((sample["t"] for sample in report["timeline"] if sample["findings"]), report["seconds"])


def catalogue(seconds: float) -> None:
    import time

    from conformance.adapters.reference import ReferenceAdapter
    from conformance.audit.catalogue import faults
    from fuzz import statediff
    from fuzz.invariants import Finding
    from fuzz.source import RandomSource

    oracle, found, total = ReferenceAdapter(), 0, 0
    for cls in faults():
        if cls.__module__.rsplit(".", 1)[-1] not in AREAS:
            continue
        subject, seed, how, start = cls(), 0, "", time.perf_counter()
        while not how and time.perf_counter() - start < seconds:
            scn = statediff.scenario(RandomSource(f"catalogue-{seed}"), True)
            statediff.freeze(scn.initial)
            seed += 1
            try:
                problems = statediff.compare(scn, statediff.play(oracle, scn), statediff.play(subject, scn))
                how = f"{problems[0][1]} at {statediff.where(scn, problems[0][0])}" if problems else ""
            except Finding as finding:
                how = f"{finding.kind} finding"
        total += 1
        found += bool(how)
        print(f"{cls.fault_id:50s} {'found' if how else 'missed':6s} {seed:5d} scenarios "
              f"{time.perf_counter() - start:5.1f} s  {how}")
    print(f"found {found} of {total} catalogue faults")


def planted(runs: int, testee: bool, seeds: bool, target: str = "statediff") -> None:
    from fuzz.planted_faults import DIFFERENTIAL_PLANTED, PLANTED

    print(f"{'planted fault':22s} {'found':>5s} {'median s':>8s} {'max s':>6s}  times "
          f"({target} target, ceiling {PLANTED_CEILING:.0f} s)")
    for name, (subject, needs) in (DIFFERENTIAL_PLANTED if target == "differential" else PLANTED).items():
        times = [time_to_find(campaign(subject, None, seed, testee, seeds, PLANTED_CEILING, target=target))
                 for seed in range(1, runs + 1)]
        found = [t for t in times if t is not None]
        median = statistics.median(found) if found else 0.0
        shown = " ".join("-" if t is None else f"{t:.0f}" for t in times)
        print(f"{name:22s} {len(found):>2d}/{runs:<2d} {median:8.1f} {max(found or [0]):6.1f}  {shown}  ({needs})")


def main() -> None:
    from fuzz.subjects import STATE_FAULT_CLASSES

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="campaign seeds per fault class")
    parser.add_argument("--testee", action="store_true", help="serve each faulty runtime as a subprocess testee")
    parser.add_argument("--no-seeds", action="store_true", help="do not read corpus/seeds/statediff")
    parser.add_argument("--budget", type=float, default=CEILING, help="campaign length (s)")
    parser.add_argument("--throughput", type=float, default=0.0, help="also run reference campaigns this long")
    parser.add_argument("--catalogue", type=float, default=0.0, help="seconds per audit-catalogue fault")
    parser.add_argument("--planted", type=int, default=0, help="campaign seeds per planted fault")
    parser.add_argument("--target", choices=("statediff", "differential"), default="statediff",
                        help="the target whose planted faults --planted times")
    args = parser.parse_args()
    print(f"{'fault class':22s} {'found':>5s} {'median s':>8s} {'max s':>6s} {'ratio to 60 s':>13s}  times")
    for name, (subject, fault, _) in STATE_FAULT_CLASSES.items() if args.runs else ():
        times = [time_to_find(campaign(subject, fault, seed, args.testee, not args.no_seeds, args.budget))
                 for seed in range(1, args.runs + 1)]
        found = [t for t in times if t is not None]
        median = statistics.median(found) if found else None
        shown = " ".join("-" if t is None else f"{t:.0f}" for t in times)
        print(f"{name:22s} {len(found):>2d}/{args.runs:<2d} {median or 0:8.1f} {max(found or [0]):6.1f} "
              f"{(median or 0) / CEILING:12.2f}x  {shown}")
    if args.throughput:
        rates = {mode: campaign("reference", None, 1, mode == "testee", True, args.throughput, stop=False)
                 for mode in ("in process", "testee")}
        base = rates["in process"]["exec_per_sec"]
        for mode, report in rates.items():
            print(f"statediff campaign on the reference, {mode}: {report['executions']:,} executions in "
                  f"{report['seconds']} s, {report['exec_per_sec']:,.0f} exec/s ({report['exec_per_sec'] / base:.2f}x "
                  f"in process), coverage {report['coverage_edges']} edges, findings {len(report['findings'])}")
    if args.catalogue:
        catalogue(args.catalogue)
    if args.planted:
        planted(args.planted, args.testee, not args.no_seeds, args.target)


if __name__ == "__main__":
    main()

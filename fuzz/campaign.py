"""``python -m fuzz run TARGET --time SECONDS --jobs N``: a libFuzzer campaign with live progress and a
JSON + Markdown report with a chart of coverage, corpus size and findings over time.

Each job is one atheris process on the shared working corpus (libFuzzer reloads it, so jobs share
discoveries). A job that stops on a finding is restarted for the remaining time; findings accumulate
in ``<out>/findings`` for ``python -m fuzz triage``. Executions come from each job's in-process
counter (``FUZZ_STATS_FILE``); coverage is libFuzzer's edge count, reported as the maximum over jobs.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import pathlib
import re
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

from fuzz.plot import write_plot

ROOT = pathlib.Path(__file__).resolve().parents[1]
_STATUS = re.compile(r"^#(\d+)\s+(\w+)\s+cov: (\d+) ft: (\d+) corp: (\d+)/")
_ARTIFACT = re.compile(r"Test unit written to (\S+)")
FINDING_PREFIXES = ("crash-", "timeout-", "oom-", "leak-", "slow-unit-")


@dataclass
class Job:
    index: int
    log: pathlib.Path
    stats: pathlib.Path
    process: subprocess.Popen | None = None
    started: float = 0.0
    finished_execs: int = 0  # executions of earlier incarnations
    incarnations: int = 0
    cov: int = 0
    ft: int = 0
    last_line_execs: int = 0
    artifacts: list[str] = field(default_factory=list)
    known: dict = field(default_factory=dict)

    def current_execs(self) -> int:
        count = self.last_line_execs
        try:
            with open(self.stats, "rb") as handle:
                handle.seek(max(0, os.path.getsize(self.stats) - 4096))
                lines = handle.read().decode(errors="replace").strip().splitlines()
            if lines:
                record = json.loads(lines[-1])
                count = max(count, record["execs"])
                self.known = record.get("known", self.known)
        except (OSError, ValueError, KeyError):
            pass
        return count


def _fuzzer_path(target: str) -> pathlib.Path:
    path = ROOT / "fuzz" / f"{target}_fuzzer.py"
    if not path.is_file():
        raise SystemExit(f"no fuzzer for target {target!r} ({path})")
    return path


def _command(target: str, args, corpus: pathlib.Path, findings: pathlib.Path, remaining: float,
             seed: int) -> list[str]:
    from fuzz.targets import load

    module = load(target)
    command = [sys.executable, str(_fuzzer_path(target)), str(corpus)]
    seeds = ROOT / "corpus" / "seeds" / target
    if not args.no_seeds and seeds.is_dir():
        command.append(str(seeds))
    command += [f"-max_total_time={max(1, int(remaining))}", f"-artifact_prefix={findings}/",
                "-print_final_stats=1", f"-seed={seed}", "-timeout=30", "-rss_limit_mb=6144",
                f"-max_len={module.MAX_LEN}"]
    if module.DICTIONARY and (ROOT / "corpus" / "dict" / module.DICTIONARY).is_file():
        command.append(f"-dict={ROOT / 'corpus' / 'dict' / module.DICTIONARY}")
    if args.runs:
        command.append(f"-runs={args.runs}")
    return command


def _env(args, stats: pathlib.Path) -> dict:
    env = dict(os.environ)
    env["FUZZ_STATS_FILE"] = str(stats)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    for option, name in (("subject", "FUZZ_SUBJECT"), ("testee", "FUZZ_TESTEE"), ("fault", "FUZZ_FAULT")):
        value = getattr(args, option, None)
        if value:
            env[name] = value
    return env


def _reader(job: Job, stream) -> None:
    with open(job.log, "a") as log:
        for raw in stream:
            line = raw.decode(errors="replace")
            log.write(line)
            match = _STATUS.match(line)
            if match:
                job.last_line_execs = int(match.group(1))
                job.cov = max(job.cov, int(match.group(3)))
                job.ft = max(job.ft, int(match.group(4)))
            artifact = _ARTIFACT.search(line)
            if artifact:
                job.artifacts.append(artifact.group(1))


def _start(job: Job, target: str, args, corpus, findings, remaining: float) -> None:
    command = _command(target, args, corpus, findings, remaining, args.seed + job.index + 1000 * job.incarnations)
    with open(job.log, "a") as log:
        log.write(f"$ {' '.join(command)}\n")
    job.process = subprocess.Popen(command, cwd=str(ROOT), env=_env(args, job.stats), stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT)
    job.started = time.monotonic()
    job.incarnations += 1
    threading.Thread(target=_reader, args=(job, job.process.stdout), daemon=True).start()


def _count_files(directory: pathlib.Path, prefixes: tuple = ()) -> int:
    if not directory.is_dir():
        return 0
    return sum(1 for p in directory.iterdir() if p.is_file() and (not prefixes or p.name.startswith(prefixes)))


def run_campaign(args) -> dict:
    target = args.target
    _fuzzer_path(target)
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    out = pathlib.Path(args.out or ROOT / "fuzz-runs" / f"{target}-{stamp}")
    corpus = pathlib.Path(args.corpus or ROOT / "fuzz-runs" / "corpus" / target)
    findings = out / "findings"
    for directory in (out, corpus, findings, out / "logs", out / "stats"):
        directory.mkdir(parents=True, exist_ok=True)
    jobs = [Job(i, out / "logs" / f"job-{i}.log", out / "stats" / f"job-{i}.jsonl") for i in range(args.jobs)]
    start = time.monotonic()
    deadline = start + args.time
    for job in jobs:
        _start(job, target, args, corpus, findings, args.time)
    timeline = []
    previous_execs, previous_t = 0, 0.0
    try:
        while True:
            time.sleep(1.0)
            now = time.monotonic()
            for job in jobs:
                if job.process is not None and job.process.poll() is not None:
                    job.process.wait()
                    job.finished_execs += job.current_execs()
                    job.last_line_execs = 0
                    job.stats.unlink(missing_ok=True)
                    job.process = None
                    stop = args.stop_on_finding and _count_files(findings, FINDING_PREFIXES)
                    if now < deadline - 2 and not stop and not args.runs:
                        _start(job, target, args, corpus, findings, deadline - now)
            execs = sum(j.finished_execs + (j.current_execs() if j.process else 0) for j in jobs)
            t = now - start
            rate = (execs - previous_execs) / max(t - previous_t, 1e-9)
            previous_execs, previous_t = execs, t
            sample = {"t": round(t, 1), "execs": execs, "exec_per_sec": round(rate, 1),
                      "cov": max(j.cov for j in jobs), "ft": max(j.ft for j in jobs),
                      "corpus": _count_files(corpus), "findings": _count_files(findings, FINDING_PREFIXES)}
            timeline.append(sample)
            if not args.quiet:
                print(f"[{target}] {sample['t']:7.0f}s execs {execs:>10,} ({rate:8,.0f}/s) cov {sample['cov']:>5} "
                      f"ft {sample['ft']:>6} corpus {sample['corpus']:>6} findings {sample['findings']}", flush=True)
            if all(j.process is None for j in jobs):
                break
            if now > deadline + 60:  # libFuzzer overran its -max_total_time: stop it
                for job in jobs:
                    if job.process:
                        job.process.terminate()
    except KeyboardInterrupt:
        for job in jobs:
            if job.process:
                job.process.terminate()
    report = _report(target, args, out, corpus, findings, jobs, timeline, time.monotonic() - start)
    if not args.quiet:
        print(f"report: {out / 'report.md'}")
    return report


def _report(target, args, out, corpus, findings, jobs, timeline, elapsed) -> dict:
    known: dict[str, int] = {}
    for job in jobs:
        for issue, count in job.known.items():
            known[issue] = known.get(issue, 0) + count
    total = timeline[-1]["execs"] if timeline else 0
    finding_files = sorted(p.name for p in findings.iterdir() if p.name.startswith(FINDING_PREFIXES))
    report = {
        "target": target, "jobs": args.jobs, "seconds": round(elapsed, 1), "executions": total,
        "exec_per_sec": round(total / max(elapsed, 1e-9), 1),
        "exec_per_sec_per_job": round(total / max(elapsed, 1e-9) / max(args.jobs, 1), 1),
        "coverage_edges": timeline[-1]["cov"] if timeline else 0,
        "features": timeline[-1]["ft"] if timeline else 0, "corpus_files": _count_files(corpus),
        "findings": finding_files, "known_issue_hits": known,
        "restarts": sum(max(j.incarnations - 1, 0) for j in jobs), "corpus": str(corpus),
        "environment": {name: value for name, value in _env(args, pathlib.Path()).items()
                        if name in ("FUZZ_SUBJECT", "FUZZ_TESTEE", "FUZZ_FAULT", "FUZZ_STRICT", "FUZZ_PROBE_KNOWN")},
        "python": sys.version.split()[0], "timeline": timeline,
    }
    (out / "report.json").write_text(json.dumps(report, indent=1))
    if timeline:
        write_plot(out / "coverage.png", timeline, f"Fuzz campaign: {target} ({args.jobs} job(s))")
    lines = [f"# Fuzz campaign: {target}", "",
             "| metric | value |", "| --- | --- |",
             f"| wall time | {report['seconds']} s |", f"| jobs | {args.jobs} |",
             f"| executions | {total:,} |", f"| executions per second | {report['exec_per_sec']:,} "
                                             f"({report['exec_per_sec_per_job']:,} per job) |",
             f"| coverage (edges, max over jobs) | {report['coverage_edges']} |",
             f"| features | {report['features']} |", f"| corpus files | {report['corpus_files']} |",
             f"| findings | {len(finding_files)} |", f"| job restarts after findings | {report['restarts']} |",
             "", "![coverage, corpus size and findings over time](coverage.png)", ""]
    if known:
        lines += ["## Known oracle issues hit (see fuzz/known_issues.py)", ""]
        lines += [f"- {issue}: {count:,} inputs" for issue, count in sorted(known.items())] + [""]
    if finding_files:
        lines += ["## Findings", "", f"Run `python -m fuzz triage {out}` to deduplicate and minimize.", ""]
        lines += [f"- `findings/{name}`" for name in finding_files] + [""]
    (out / "report.md").write_text("\n".join(lines))
    return report

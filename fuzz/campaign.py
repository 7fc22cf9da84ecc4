"""``python -m fuzz run TARGET --time SECONDS --jobs N``: a libFuzzer campaign with live progress and a
JSON + Markdown report with a chart of coverage, corpus size and findings over time.

Each job is one atheris process on the shared working corpus (libFuzzer reloads it, so jobs share
discoveries). A job that stops on a finding is restarted for the remaining time; findings accumulate
in ``<out>/findings`` for ``python -m fuzz triage``. A job that ends any other way than on a finding or
at its time limit has failed: it is not restarted, the report lists it with the first error line of its
output, and the command exits non-zero (as it does for a campaign that executed no input at all), so a
campaign that could not run never passes for a clean one. Executions come from each job's in-process
counter (``FUZZ_STATS_FILE``) and libFuzzer's own final count; coverage is libFuzzer's edge count,
reported as the maximum over jobs. Jobs run in the user's current directory (``fuzz.children``).
"""

from __future__ import annotations

import collections
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

from conformance.locations import corpus_dir
from fuzz.children import child_environment, python_command, start
from fuzz.errors import CommandError
from fuzz.finding_env import recordable
from fuzz.findings_io import FINDING_PREFIXES
from fuzz.plot import write_plot
from reference_impl.cli_paths import default_under_cwd, user_path

#: The fuzzer scripts, run as ``python fuzz/<target>_fuzzer.py`` (they live in this package).
FUZZERS = pathlib.Path(__file__).resolve().parent
_STATUS = re.compile(r"^#(\d+)\s+(\w+)\s+cov: (\d+) ft: (\d+) corp: (\d+)/")
_ARTIFACT = re.compile(r"Test unit written to (\S+)")
_FINAL_EXECS = re.compile(r"^stat::number_of_executed_units:\s*(\d+)")
_ERROR_LINE = re.compile(r"^(==\d+==\s*)?ERROR:")
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt|Unavailable)\b(:|$)")


class CampaignError(CommandError):
    """The campaign cannot run or did not run: one line for the user, exit status 2."""


@dataclass
class Job:
    index: int
    log: pathlib.Path
    stats: pathlib.Path
    process: subprocess.Popen | None = None
    reader: threading.Thread | None = None
    started: float = 0.0
    finished_execs: int = 0  # executions of earlier incarnations
    incarnations: int = 0
    restarts_after_findings: int = 0
    cov: int = 0
    ft: int = 0
    last_line_execs: int = 0
    final_execs: int = 0  # libFuzzer's own count, printed when an incarnation ends
    artifacts: list[str] = field(default_factory=list)
    artifacts_before: int = 0  # artifacts of earlier incarnations
    first_error: str = ""  # of the current incarnation
    tail: collections.deque = field(default_factory=lambda: collections.deque(maxlen=40))
    stopped: bool = False  # ended by the campaign itself (deadline overrun, interrupt)
    failure: dict | None = None
    known: dict = field(default_factory=dict)

    def current_execs(self) -> int:
        count = max(self.last_line_execs, self.final_execs)
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
    path = FUZZERS / f"{target}_fuzzer.py"
    if not path.is_file():
        raise CampaignError(f"no fuzzer for target {target!r} ({path})")
    return path


def _command(target: str, args, corpus: pathlib.Path, findings: pathlib.Path, remaining: float,
             seed: int) -> list[str]:
    from fuzz.targets import load

    module = load(target)
    command = python_command(str(_fuzzer_path(target)), str(corpus))
    seeds = corpus_dir() / "seeds" / target
    if not args.no_seeds and seeds.is_dir():
        command.append(str(seeds))
    command += [f"-max_total_time={max(1, int(remaining))}", f"-artifact_prefix={findings}/",
                "-print_final_stats=1", f"-seed={seed}", "-timeout=30", "-rss_limit_mb=6144",
                f"-max_len={module.MAX_LEN}"]
    dictionary = corpus_dir() / "dict" / module.DICTIONARY if module.DICTIONARY else None
    if dictionary and dictionary.is_file():
        command.append(f"-dict={dictionary}")
    if args.runs:
        command.append(f"-runs={args.runs}")
    return command


def _options_environment(args) -> dict[str, str]:
    """The FUZZ_* settings the command line gave (``--subject``, ``--testee``, ``--fault``)."""
    settings = {}
    for option, name in (("subject", "FUZZ_SUBJECT"), ("testee", "FUZZ_TESTEE"), ("fault", "FUZZ_FAULT")):
        value = getattr(args, option, None)
        if value:
            settings[name] = str(value)
    return settings


def _env(args, stats: pathlib.Path) -> dict:
    return child_environment({"FUZZ_STATS_FILE": str(stats), **_options_environment(args)})


def _printable(text: str, limit: int = 300) -> str:
    """One line of a child's output, safe to print: control characters replaced, length bounded."""
    text = "".join(ch if ch.isprintable() else "?" for ch in text.strip())
    return text if len(text) <= limit else text[:limit - 3] + "..."


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
            final = _FINAL_EXECS.match(line)
            if final:
                job.final_execs = int(final.group(1))
            artifact = _ARTIFACT.search(line)
            if artifact:
                job.artifacts.append(artifact.group(1))
            text = line.strip()
            if _ERROR_LINE.match(text) and not job.first_error:
                job.first_error = text
            if text and not text.startswith(("INFO:", "WARNING:", "$ ")):
                job.tail.append(text)


def failure_line(job: Job, status: int) -> str:
    """What the user needs to see of a job that died without a finding, as one line: libFuzzer's first
    ``ERROR:`` line, else the exception a Python traceback ends with, else its last line of output."""
    if job.first_error:
        return _printable(job.first_error)
    for text in reversed(job.tail):
        if _EXCEPTION_LINE.match(text):
            return _printable(text)
    if job.tail:
        return _printable(job.tail[-1])
    return f"exited with status {status} and printed nothing"


def _start(job: Job, target: str, args, corpus, findings, remaining: float) -> None:
    command = _command(target, args, corpus, findings, remaining, args.seed + job.index + 1000 * job.incarnations)
    with open(job.log, "a") as log:
        log.write(f"$ {' '.join(command)}\n")
    job.first_error, job.final_execs, job.last_line_execs = "", 0, 0
    job.tail.clear()
    job.artifacts_before = len(job.artifacts)
    try:
        job.process = start(command, _env(args, job.stats), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    except OSError as error:
        raise CampaignError(f"job {job.index} cannot start {command[0]}: {error.strerror or error}") from None
    job.started = time.monotonic()
    job.incarnations += 1
    job.reader = threading.Thread(target=_reader, args=(job, job.process.stdout), daemon=True)
    job.reader.start()


def _count_files(directory: pathlib.Path, prefixes: tuple = ()) -> int:
    if not directory.is_dir():
        return 0
    return sum(1 for p in directory.iterdir() if p.is_file() and (not prefixes or p.name.startswith(prefixes)))


def _make_directories(*directories: pathlib.Path) -> None:
    for directory in directories:
        try:
            directory.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise CampaignError(f"cannot create the directory {directory}: {error.strerror or error}") from None


def _ended(job: Job, args, now: float, deadline: float, start_job) -> None:
    """Account for an incarnation that ended: a finding restarts the job (when there is time left), a
    natural end (status 0) finishes it, and any other end is a failure of the job, never restarted."""
    status = job.process.wait()
    if job.reader is not None:
        job.reader.join(timeout=5.0)  # its last lines carry the final counts
    job.finished_execs += job.current_execs()
    job.last_line_execs = job.final_execs = 0
    job.stats.unlink(missing_ok=True)
    job.process = None
    if job.stopped:
        return
    if len(job.artifacts) > job.artifacts_before:
        if now < deadline - 2 and not args.stop_on_finding and not args.runs:
            job.restarts_after_findings += 1
            start_job(job, deadline - now)
        return
    if status != 0:
        job.failure = {"job": job.index, "status": status, "error": failure_line(job, status)}


def _stop(jobs: list[Job]) -> None:
    for job in jobs:
        if job.process:
            job.stopped = True
            job.process.terminate()


def run_campaign(args) -> dict:
    """Run the campaign ``args`` describes and write its report; its paths are made absolute against the
    current directory (already done by the command line) before any job starts. Raises
    CampaignError when it cannot start; the report's ``job_failures`` lists jobs that died without a
    finding (``campaign_failure`` turns them, or a campaign of zero executions, into one line)."""
    target = args.target
    _fuzzer_path(target)
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    out = user_path(args.out) if args.out else default_under_cwd("fuzz-runs", f"{target}-{stamp}")
    corpus = user_path(args.corpus) if args.corpus else default_under_cwd("fuzz-runs", "corpus", target)
    findings = out / "findings"
    _make_directories(out, corpus, findings, out / "logs", out / "stats")
    jobs = [Job(i, out / "logs" / f"job-{i}.log", out / "stats" / f"job-{i}.jsonl") for i in range(args.jobs)]
    start_time = time.monotonic()
    deadline = start_time + args.time

    def start_job(job: Job, remaining: float) -> None:
        _start(job, target, args, corpus, findings, remaining)

    timeline = []
    previous_execs, previous_t = 0, 0.0
    try:
        for job in jobs:
            start_job(job, args.time)
        while True:
            time.sleep(1.0)
            now = time.monotonic()
            for job in jobs:
                if job.process is not None and job.process.poll() is not None:
                    _ended(job, args, now, deadline, start_job)
                    if args.stop_on_finding and _count_files(findings, FINDING_PREFIXES):
                        _stop(jobs)
            execs = sum(j.finished_execs + (j.current_execs() if j.process else 0) for j in jobs)
            t = now - start_time
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
                _stop(jobs)
    except KeyboardInterrupt:
        _stop(jobs)
    except CampaignError:
        _stop(jobs)
        raise
    report = _report(target, args, out, corpus, findings, jobs, timeline, time.monotonic() - start_time)
    if not args.quiet:
        print(f"report: {out / 'report.md'}")
    return report


def campaign_failure(report: dict) -> str | None:
    """Why a finished campaign counts as not run, as one line, or None: a job died without a finding,
    or no input was executed at all."""
    failures = report.get("job_failures") or []
    if failures:
        first = failures[0]
        more = f" ({len(failures) - 1} more job(s) died too)" if len(failures) > 1 else ""
        how = f"killed by signal {-first['status']}" if first["status"] < 0 else f"exit status {first['status']}"
        return f"job {first['job']} died without a finding ({how}): {first['error']}{more}"
    if report.get("executions", 0) == 0:
        detail = report.get("first_error") or "the jobs ended without running a single input"
        return f"no input was executed: {detail}"
    return None


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
        "restarts": sum(j.restarts_after_findings for j in jobs),
        "job_failures": [j.failure for j in jobs if j.failure],
        "first_error": next((failure_line(j, 0) for j in jobs if j.first_error), ""), "corpus": str(corpus),
        "environment": recordable(_env(args, pathlib.Path())),
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
             f"| jobs that died without a finding | {len(report['job_failures'])} |",
             "", "![coverage, corpus size and findings over time](coverage.png)", ""]
    if report["job_failures"]:
        lines += ["## Jobs that died without a finding", ""]
        lines += [f"- job {f['job']} (exit status {f['status']}, log `logs/job-{f['job']}.log`): {f['error']}"
                  for f in report["job_failures"]] + [""]
    if known:
        lines += ["## Known oracle issues hit (see fuzz/known_issues.py)", ""]
        lines += [f"- {issue}: {count:,} inputs" for issue, count in sorted(known.items())] + [""]
    if finding_files:
        lines += ["## Findings", "", f"Run `python -m fuzz triage {out}` to deduplicate and minimize.", ""]
        lines += [f"- `findings/{name}`" for name in finding_files] + [""]
    (out / "report.md").write_text("\n".join(lines))
    return report

"""Running a selection of cases, with progress: by default in worker processes (``-j N`` of them,
conformance/workers.py), so that a case crashing its process fails alone and the run goes on; in the
runner's own process with ``isolation=False`` (``--no-isolation``, for debugging) or where workers cannot
be forked."""

from __future__ import annotations

import os
import platform
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from conformance import SPEC_NAME, SPEC_REVISION, SUITE_NAME, SUITE_VERSION, operators, workers
from conformance.adapters import load_adapter
from conformance.cases import Case
from conformance.execute import CRASHED, FAILED, NOT_SUPPORTED, PASSED, PASSED_WITHOUT_CODE, Result, run_case


@dataclass
class RunConfig:
    adapter: str | None = None
    testee: str | None = None
    timeout: float = 30.0
    corpus: str | None = None
    jobs: int = 1
    require_codes: bool = False
    progress: bool = True
    isolation: bool = True  # cases run in worker processes (see the module docstring)


@dataclass
class RunInfo:
    """Who ran what: recorded in every report and in the certificate."""

    suite: dict = field(default_factory=dict)
    spec: dict = field(default_factory=dict)
    adapter: dict = field(default_factory=dict)
    selection: dict = field(default_factory=dict)
    platform: dict = field(default_factory=dict)
    started: float = 0.0
    duration: float = 0.0


def adapter_identity(adapter: Any, config: RunConfig) -> dict:
    profiles = adapter.profiles() if callable(getattr(adapter, "profiles", None)) else []
    return {
        "name": str(getattr(adapter, "name", type(adapter).__name__)),
        "version": str(getattr(adapter, "version", "unknown")),
        "identity": config.testee and f"testee:{config.testee}" or str(getattr(adapter, "identity", config.adapter
                                                                              or "reference")),
        "profiles": sorted(profiles),
        "operators": {role: operators.describe(binding) for role, binding in operators.bindings(adapter).items()},
    }


def _use_safe_reads() -> None:
    """The runner must survive case files changing under it: in-process oracles read external payloads
    into memory instead of mapping them (a truncated mapping would kill the run with SIGBUS)."""
    from reference_impl import payload

    payload.set_external_access("read")


def run(cases: list[Case], config: RunConfig, adapter: Any | None = None) -> tuple[list[Result], RunInfo]:
    """Run ``cases`` and return their results (in case order) with the run's identity.

    With isolation, workers forked from this process run the cases: an ``adapter`` object passed in is
    inherited by them (what it records during the run stays in the workers); one loaded here from
    ``config`` serves only for the run's identity, and each worker loads its own (a testee's pipes and a
    runtime's threads do not survive a fork)."""
    info = RunInfo(suite={"name": SUITE_NAME, "version": SUITE_VERSION},
                   spec={"name": SPEC_NAME, "revision": SPEC_REVISION},
                   platform={"python": platform.python_version(), "system": platform.platform(),
                             "cpus": os.cpu_count()},
                   started=time.time())
    start = time.perf_counter()
    _use_safe_reads()
    progress = Progress(len(cases), config.progress)
    own_adapter = adapter is None
    if adapter is None:
        adapter = load_adapter(config.adapter, config.testee, config.timeout)
    info.adapter = adapter_identity(adapter, config)
    isolated = config.isolation and workers.available() and bool(cases)
    info.platform["isolation"] = "worker processes" if isolated else "none: cases ran in the runner's process"
    if config.isolation and not workers.available():
        sys.stderr.write("conformance: worker processes need fork, which this platform lacks: cases run in the "
                         "runner's process, and one that crashes it ends the run\n")
    elif not config.isolation and config.jobs > 1:
        sys.stderr.write("conformance: without isolation cases run one at a time in the runner's process; "
                         f"-j {config.jobs} is ignored\n")
    results: list[Result] = []
    try:
        if isolated:
            if own_adapter and hasattr(adapter, "shutdown"):
                adapter.shutdown()  # before the fork: no worker inherits its testee
            _build(cases)
            setup = _fresh_adapter(config) if own_adapter else _inherited(adapter, config)
            results = workers.run_cases(cases, config.jobs, setup, workers.deadline_for(adapter, config.timeout),
                                        progress.update)
        else:
            for case in cases:
                result = run_case(case, adapter, config.require_codes, config.timeout)
                results.append(result)
                progress.update(result)
    finally:
        if own_adapter and hasattr(adapter, "shutdown"):
            adapter.shutdown()
        progress.finish()
    info.duration = time.perf_counter() - start
    return results, info


def _build(cases: list[Case]) -> None:
    """Build every case's model before the fork: the workers inherit them, and so does whatever reads
    them after the run (the report's case digests), which would otherwise build each case again."""
    for case in cases:
        try:
            case.build()
        except Exception:  # noqa: BLE001 - the worker meets the same error and fails the case with it
            pass


def _fresh_adapter(config: RunConfig) -> workers.Setup:
    """A worker's setup loading its own adapter from ``config`` and shutting it down when done."""
    def setup():
        adapter = load_adapter(config.adapter, config.testee, config.timeout)
        return _judge(adapter, config), getattr(adapter, "shutdown", None)
    return setup


def _inherited(adapter: Any, config: RunConfig) -> workers.Setup:
    """A worker's setup using the adapter object the worker inherited."""
    return lambda: (_judge(adapter, config), None)


def _judge(adapter: Any, config: RunConfig):
    return lambda case: run_case(case, adapter, config.require_codes, config.timeout)


class Progress:
    """A one-line counter on a terminal; a line per tenth of the run otherwise."""

    def __init__(self, total: int, enabled: bool):
        self.total = total
        self.enabled = enabled
        self.done = 0
        self.counts = {PASSED: 0, PASSED_WITHOUT_CODE: 0, FAILED: 0, NOT_SUPPORTED: 0, CRASHED: 0}
        self.tty = sys.stderr.isatty()
        self.next_mark = 0.1

    def update(self, result: Result) -> None:
        self.done += 1
        self.counts[result.verdict] = self.counts.get(result.verdict, 0) + 1
        if not self.enabled:
            return
        line = (f"[{self.done}/{self.total}] {self.counts[PASSED]} passed, {self.counts[FAILED]} failed, "
                f"{self.counts[NOT_SUPPORTED]} not supported")
        if self.counts[PASSED_WITHOUT_CODE]:
            line += f", {self.counts[PASSED_WITHOUT_CODE]} passed without code"
        if self.counts[CRASHED]:
            line += f", {self.counts[CRASHED]} crashed"
        if self.tty:
            sys.stderr.write("\r" + line)
            sys.stderr.flush()
        elif self.total and self.done / self.total >= self.next_mark:
            sys.stderr.write(line + "\n")
            self.next_mark += 0.1

    def finish(self) -> None:
        if self.enabled and self.tty:
            sys.stderr.write("\n")


def summary_line(results: list[Result]) -> str:
    """``N passed, N failed, N not supported, N expected failures`` (failed excludes expected ones), then
    ``, N passed without code`` when a rejection carried no error code (those are not in ``passed``) and
    ``, N crashed`` when a case killed the process running it (those are not in ``failed``)."""
    passed = sum(r.verdict == PASSED for r in results)
    expected = sum(r.verdict == FAILED and r.expected_failure for r in results)
    failed = sum(r.verdict == FAILED and not r.expected_failure for r in results)
    unsupported = sum(r.verdict == NOT_SUPPORTED for r in results)
    uncoded = sum(r.verdict == PASSED_WITHOUT_CODE for r in results)
    crashed = sum(r.verdict == CRASHED for r in results)
    line = f"{passed} passed, {failed} failed, {unsupported} not supported, {expected} expected failures"
    line += f", {uncoded} passed without code" if uncoded else ""
    return line + (f", {crashed} crashed" if crashed else "")

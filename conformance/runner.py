"""Running a selection of cases: in process, across worker processes (``-j N``), with progress."""

from __future__ import annotations

import multiprocessing
import os
import platform
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from conformance import SPEC_NAME, SPEC_REVISION, SUITE_NAME, SUITE_VERSION, operators
from conformance.adapters import load_adapter
from conformance.cases import Case, load_cases
from conformance.execute import FAILED, NOT_SUPPORTED, PASSED, PASSED_WITHOUT_CODE, Result, run_case


@dataclass
class RunConfig:
    adapter: str | None = None
    testee: str | None = None
    timeout: float = 30.0
    corpus: str | None = None
    jobs: int = 1
    require_codes: bool = False
    progress: bool = True


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


_WORKER: dict = {}


def _worker_init(config: RunConfig) -> None:
    _use_safe_reads()
    _WORKER["adapter"] = load_adapter(config.adapter, config.testee, config.timeout)
    _WORKER["cases"] = {c.id: c for c in load_cases(config.corpus)}
    _WORKER["config"] = config


def _worker_run(case_id: str) -> Result:
    config = _WORKER["config"]
    return run_case(_WORKER["cases"][case_id], _WORKER["adapter"], config.require_codes, config.timeout)


def _use_safe_reads() -> None:
    """The runner must survive case files changing under it: in-process oracles read external payloads
    into memory instead of mapping them (a truncated mapping would kill the run with SIGBUS)."""
    from reference_impl import payload

    payload.set_external_access("read")


def run(cases: list[Case], config: RunConfig, adapter: Any | None = None) -> tuple[list[Result], RunInfo]:
    """Run ``cases`` and return their results (in case order) with the run's identity."""
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
    results: list[Result] = []
    try:
        if config.jobs <= 1 or len(cases) < 2:
            for case in cases:
                result = run_case(case, adapter, config.require_codes, config.timeout)
                results.append(result)
                progress.update(result)
        else:
            context = multiprocessing.get_context("fork" if sys.platform.startswith("linux") else "spawn")
            by_id = {}
            with ProcessPoolExecutor(config.jobs, mp_context=context, initializer=_worker_init,
                                     initargs=(config,)) as pool:
                for result in pool.map(_worker_run, [c.id for c in cases], chunksize=4):
                    by_id[result.id] = result
                    progress.update(result)
            results = [by_id[c.id] for c in cases]
    finally:
        if own_adapter and hasattr(adapter, "shutdown"):
            adapter.shutdown()
        progress.finish()
    info.duration = time.perf_counter() - start
    return results, info


class Progress:
    """A one-line counter on a terminal; a line per tenth of the run otherwise."""

    def __init__(self, total: int, enabled: bool):
        self.total = total
        self.enabled = enabled
        self.done = 0
        self.counts = {PASSED: 0, PASSED_WITHOUT_CODE: 0, FAILED: 0, NOT_SUPPORTED: 0}
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
    ``, N passed without code`` when a rejection carried no error code (those are not in ``passed``)."""
    passed = sum(r.verdict == PASSED for r in results)
    expected = sum(r.verdict == FAILED and r.expected_failure for r in results)
    failed = sum(r.verdict == FAILED and not r.expected_failure for r in results)
    unsupported = sum(r.verdict == NOT_SUPPORTED for r in results)
    uncoded = sum(r.verdict == PASSED_WITHOUT_CODE for r in results)
    line = f"{passed} passed, {failed} failed, {unsupported} not supported, {expected} expected failures"
    return line + (f", {uncoded} passed without code" if uncoded else "")

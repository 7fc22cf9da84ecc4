"""Invariants every target checks on every input, and the ``Finding`` exception that reports a breach.

* only classified errors: anything but ``ContractError`` escaping the implementation is a finding;
* the same verdict twice in a row (and the same output digest);
* bounded time per input: CPU seconds over ``time_budget`` is a ``slow`` finding, and a CPU-time (user + system) alarm
  at ``hang_after`` interrupts a runaway input with a ``hang`` finding (libFuzzer's ``-timeout`` stays
  as a backstop for hangs inside C code);
* bounded memory: ``MemoryError`` (the harness caps the address space) or a peak RSS growth over
  ``memory_budget_mb`` is a ``memory`` finding.

A finding is raised as an exception so libFuzzer records the input as a crash artifact; its
``signature`` (kind plus the innermost frame of the implementation) deduplicates findings in triage.
"""

from __future__ import annotations

import hashlib
import os
import resource
import signal
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from reference_impl import ContractError

#: Packages whose frames name the origin of an exception: the code under test first.
ORIGIN_PACKAGES = ("reference_impl", "conformance")
_HARNESS_FILES = ("invariants.py", "harness.py")


class Finding(Exception):
    """An input on which an implementation broke an invariant or disagreed with the expectation."""

    def __init__(self, kind: str, detail: str, origin: str = ""):
        self.kind = kind
        self.detail = detail
        self.origin = origin
        super().__init__(f"FINDING {kind} at {origin or '?'}: {detail}")

    @property
    def signature(self) -> str:
        return f"{self.kind}|{self.origin}"


class SubjectUnavailable(Exception):
    """The subject a target compares with cannot be set up (an adapter that does not load, a testee that
    does not start). Not a finding about any input: the harness ends the job with an ``ERROR:`` line, the
    campaign reports the job as failed, and a replay reports the subject as unusable."""


class _Hang(BaseException):
    """Raised from the CPU-time alarm; a BaseException so ``except Exception`` cannot swallow it."""


@dataclass
class Limits:
    time_budget: float = float(os.environ.get("FUZZ_TIME_BUDGET", "2.0"))  # CPU seconds per input
    hang_after: float = float(os.environ.get("FUZZ_HANG_AFTER", "10.0"))  # CPU seconds, then interrupt
    memory_budget_mb: int = int(os.environ.get("FUZZ_MEMORY_BUDGET_MB", "1024"))


LIMITS = Limits()


def _located(entries) -> str:
    """``path:line:function`` of the innermost entry in the code under test, else of the innermost
    entry outside this harness."""
    def label(entry, parts, start):
        return f"{'/'.join(parts[start:])}:{entry.lineno}:{entry.name}"

    for preferred in ORIGIN_PACKAGES:
        for entry in reversed(entries):
            parts = entry.filename.replace("\\", "/").split("/")
            if preferred in parts:
                return label(entry, parts, parts.index(preferred))
    for entry in reversed(entries):
        parts = entry.filename.replace("\\", "/").split("/")
        if parts[-1] not in _HARNESS_FILES:
            start = parts.index("fuzz") if "fuzz" in parts[:-1] else len(parts) - 1
            return label(entry, parts, start)
    return ""


def origin(tb) -> str:
    return _located(traceback.extract_tb(tb)) if tb is not None else ""


def _frame_origin(frame) -> str:
    return _located(traceback.extract_stack(frame))


def _raise_hang(signum, frame):
    raise _Hang(_frame_origin(frame))


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


_BASELINE_RSS: float | None = None


def guarded(fn: Callable[[], Any], limits: Limits = LIMITS, what: str = "") -> Any:
    """Run ``fn`` under the time and memory limits, turning every breach into a ``Finding``.

    ``ContractError`` propagates: it is a verdict, not a finding.
    """
    global _BASELINE_RSS
    if _BASELINE_RSS is None:
        _BASELINE_RSS = _peak_rss_mb()
    alarm = limits.hang_after > 0 and hasattr(signal, "SIGPROF")
    if alarm:
        previous = signal.signal(signal.SIGPROF, _raise_hang)
        signal.setitimer(signal.ITIMER_PROF, limits.hang_after)
    start = time.process_time()
    try:
        result = fn()
    except ContractError:
        raise
    except Finding:
        raise
    except _Hang as hang:
        raise Finding("hang", f"{what} exceeded {limits.hang_after}s of CPU", str(hang)) from None
    except MemoryError as error:
        raise Finding("memory", f"{what} MemoryError {error}", origin(error.__traceback__)) from None
    except RecursionError as error:
        raise Finding("unclassified", f"{what} RecursionError", origin(error.__traceback__)) from None
    except Exception as error:  # noqa: BLE001 - every unclassified exception is a finding
        raise Finding("unclassified", f"{what} {type(error).__name__}: {error}",
                      origin(error.__traceback__)) from None
    finally:
        if alarm:
            signal.setitimer(signal.ITIMER_PROF, 0)
            signal.signal(signal.SIGPROF, previous)
    spent = time.process_time() - start
    if spent > limits.time_budget:
        raise Finding("slow", f"{what} took {spent:.2f}s of CPU (budget {limits.time_budget}s)", what)
    grown = _peak_rss_mb() - _BASELINE_RSS
    if grown > limits.memory_budget_mb:
        _BASELINE_RSS = _peak_rss_mb()  # report each new peak once
        raise Finding("memory", f"{what} raised peak RSS by {grown:.0f} MiB (budget "
                      f"{limits.memory_budget_mb} MiB)", what)
    return result


def digest(outputs: Any) -> str:
    """A digest of produced values (arrays by dtype, shape and bytes) for determinism checks."""
    h = hashlib.sha256()

    def feed(obj: Any) -> None:
        if isinstance(obj, np.ndarray):
            h.update(f"{obj.dtype}{obj.shape}".encode())
            h.update(obj.tobytes() if obj.dtype != object else repr(obj.tolist()).encode())
        elif isinstance(obj, dict):
            for key in sorted(obj, key=str):
                h.update(str(key).encode())
                feed(obj[key])
        elif isinstance(obj, (list, tuple)):
            for item in obj:
                feed(item)
        else:
            h.update(repr(obj).encode())

    feed(outputs)
    return h.hexdigest()


def twice(fn: Callable[[], tuple[Any, Any]], limits: Limits = LIMITS, what: str = "") -> tuple[Any, Any]:
    """Run a (verdict, outputs) function twice under guard; a different answer is a finding."""
    first = guarded(fn, limits, what)
    second = guarded(fn, limits, what)
    if first[0] != second[0] or digest(first[1]) != digest(second[1]):
        raise Finding("nondeterministic", f"{what} answered {first[0]} then {second[0]}", what)
    return first


def cap_address_space(extra_mb: int = 4096) -> None:
    """Cap the process address space at its current size plus ``extra_mb`` so that a runaway
    allocation fails with MemoryError (a finding) instead of taking the machine down."""
    try:
        with open("/proc/self/status") as handle:
            size_kb = next(int(line.split()[1]) for line in handle if line.startswith("VmSize:"))
    except (OSError, StopIteration):
        return
    limit = (size_kb * 1024) + extra_mb * 1024 * 1024
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))

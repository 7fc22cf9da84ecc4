"""Judging what an adapter did: calling it with its exceptions classified, and checking an outcome
against a case's expectation (a rejection with the right code, or values equal to the expected ones).

Shared by one-shot operations (conformance/execute.py) and state traces (conformance/trace.py).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from conformance import digests
from conformance import values as V
from conformance.adapters import NotSupported, Rejected
from conformance.adapters.base import accepted_keywords


class CaseFailure(Exception):
    """The adapter's behaviour departs from the case's expectation."""

    def __init__(self, message: str, expected: str = "", actual: str = "", detail: str = ""):
        super().__init__(message)
        self.message, self.expected, self.actual, self.detail = message, expected, actual, detail


class Outcome:
    """What one adapter call did: returned a value, was rejected, or was not supported."""

    def __init__(self, value: Any = None, rejected: Rejected | None = None):
        self.value = value
        self.rejected = rejected


def call(adapter: Any, method: str, *args: Any, **optional: Any) -> Outcome:
    """Call an adapter method, classifying exceptions. NotSupported and unclassified exceptions
    propagate (the first becomes the verdict, the second a failure with traceback). ``optional``
    keywords reach the method only when it accepts them (``accepted_keywords``)."""
    fn = getattr(adapter, method, None)
    if fn is None:
        raise NotSupported(f"the adapter has no {method}()")
    try:
        return Outcome(value=fn(*args, **accepted_keywords(fn, **optional)))
    except Rejected as rejected:
        return Outcome(rejected=rejected)
    except NotSupported:
        raise
    except Exception as exc:
        classified = classify(adapter, exc)
        if isinstance(classified, Rejected):
            return Outcome(rejected=classified)
        if isinstance(classified, NotSupported):
            raise classified from exc
        raise


def classify(adapter: Any, exc: BaseException):
    classifier = getattr(adapter, "classify", None)
    if classifier is None:
        return None
    try:
        return classifier(exc)
    except Exception:  # noqa: BLE001 - a broken classifier must not hide the original exception
        return None


def one_line(text: str) -> str:
    """On one line and whole: reports keep the full message (summaries clip it, conformance.text)."""
    return " ".join(text.split())


def judge_rejection(outcome: Outcome, expect: dict, what: str, require_codes: bool) -> bool | None:
    """Check an outcome against ``expect`` ({error = CODE} or acceptance). Returns whether an error
    code was checked (None when no rejection was expected).

    ``may_reject = [CODES]`` on an acceptance expectation: the spec equally allows rejecting the input
    with one of these codes (the caller then skips the checks on the accepted result)."""
    wanted = expect.get("error")
    if wanted is None and outcome.rejected is not None and expect.get("may_reject"):
        return _judge_code(outcome, list(expect["may_reject"]), what, require_codes)
    if wanted is None:
        if outcome.rejected is not None:
            raise CaseFailure(f"{what} was rejected but should be accepted: {one_line(str(outcome.rejected))}",
                              actual=f"rejected {outcome.rejected.code or '(no code)'}",
                              detail=outcome.rejected.message)
        return None
    if outcome.rejected is None:
        raise CaseFailure(f"{what} was accepted but should be rejected with {wanted}",
                          expected=f"rejected with {wanted}",
                          actual="accepted")
    return _judge_code(outcome, [wanted] + list(expect.get("also", [])), what, require_codes)


def _judge_code(outcome: Outcome, allowed: list[str], what: str, require_codes: bool) -> bool:
    wanted = allowed[0]
    code = outcome.rejected.code
    if code is None:
        if require_codes:
            raise CaseFailure(f"{what} was rejected without an error code; expected {wanted}",
                              actual="rejected (no code)")
        return False
    if code not in allowed:
        raise CaseFailure(f"{what} was rejected with {code}, expected {wanted}", expected=f"rejected with {wanted}",
                          actual=f"rejected with {code}", detail=outcome.rejected.message)
    return True


def compare(expected: Any, actual: Any, expect: dict, what: str, path: str = "value") -> None:
    """``any_shape = true``: only the elements in row-major order count, not the dimensions they are
    exposed in (a struct value without logical_type has decoder-exposed dimensions)."""
    if expect.get("any_shape") and isinstance(expected, np.ndarray) and isinstance(actual, np.ndarray):
        expected, actual = expected.reshape(-1), actual.reshape(-1)
    reason = V.mismatch(expected, actual, expect.get("atol", 0.0), expect.get("rtol", 0.0), path)
    if reason:
        raise CaseFailure(f"{what}: {reason}", expected=V.describe(expected), actual=V.describe(actual),
                          detail=reason)


def compare_digest(spec: dict, actual: Any, samples: dict | None, expect: dict, what: str, path: str = "value") -> None:
    """``values_digest`` / ``fields_digest``: dtype, shape, the builder's sampled elements (within the case's
    ``atol``/``rtol``), then the SHA-256 of the canonical bytes (conformance/digests.py)."""
    reason = digests.mismatch(spec, actual, samples, expect.get("atol", 0.0), expect.get("rtol", 0.0), path)
    if reason:
        raise CaseFailure(f"{what}: {reason}", expected=f"{spec['dtype']}{list(spec['shape'])} with SHA-256 "
                          f"{spec['sha256']}", actual=V.describe(actual) if isinstance(actual, np.ndarray)
                          else type(actual).__name__, detail=reason)

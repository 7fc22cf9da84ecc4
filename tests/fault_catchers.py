"""The check shared by the test files that list, for each audit fault, the cases written to catch it: the
reference passes every listed case, the fault fails each of them, no two of them share a model, and every case
of the file is listed for some fault (none is there without a bug it kills)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import pytest

from conformance.adapters.reference import ReferenceAdapter
from conformance.audit import catalogue
from conformance.cases import load_cases
from conformance.execute import FAILED, PASSED, run_case


@functools.cache
def _faults() -> dict:
    return {cls.fault_id: cls for cls in catalogue.faults()}


@functools.cache
def _cases() -> dict:
    return {case.id: case for case in load_cases()}


def params(catchers: Mapping[str, Sequence[str]]) -> Iterator:
    """One pytest parameter per fault, marked with the clause it breaks."""
    for fault_id, case_ids in catchers.items():
        clause = fault_id.split(".", 1)[0]
        yield pytest.param(fault_id, case_ids, id=fault_id, marks=pytest.mark.clause(clause))


def assert_caught_by_independent_cases(fault_id: str, case_ids: Sequence[str]) -> None:
    cases = [_cases()[case_id] for case_id in case_ids]
    assert len(cases) >= 2
    assert len({case.model_bytes() for case in cases}) == len(cases), "two of the cases share a model"
    reference = {case.id: run_case(case, ReferenceAdapter(), timeout=60) for case in cases}
    assert all(r.verdict == PASSED for r in reference.values()), {i: r.message for i, r in reference.items()
                                                                 if r.verdict != PASSED}
    faulty = {case.id: run_case(case, _faults()[fault_id](), timeout=60) for case in cases}
    missed = [case_id for case_id, result in faulty.items() if result.verdict != FAILED]
    assert not missed, f"{fault_id} survives {missed}"


def assert_every_case_listed(catchers: Mapping[str, Sequence[str]], source: str) -> None:
    new = {case.id for case in _cases().values() if case.source == source}
    listed = {case_id for case_ids in catchers.values() for case_id in case_ids}
    assert new and new <= listed, sorted(new - listed)


def wrong_runtime_tests(cases: Callable[[], Mapping[str, Any]], count: int,
                        catchers: Sequence[tuple[Any, Sequence[str]]]) -> tuple[Callable, Callable, Callable]:
    """The three tests of a file that proves its cases with wrong runtimes written in it (``catchers``: each
    runtime with the cases it must fail): the reference passes each of the ``count`` cases ``cases()`` gives,
    each runtime fails its cases without a traceback, and every case fails some runtime. Assign them to
    ``test_*`` names of the module."""

    @pytest.mark.parametrize("case_id", sorted(cases()))
    def reference_passes(case_id):
        result = run_case(cases()[case_id], ReferenceAdapter())
        assert result.verdict == PASSED, result.message

    @pytest.mark.parametrize(("fault", "case_ids"), catchers, ids=[fault.fault_id for fault, _ in catchers])
    def bug_fails_its_cases(fault, case_ids):
        for case_id in case_ids:
            result = run_case(cases()[case_id], fault)
            assert result.verdict == FAILED and not result.traceback, f"{fault.fault_id} on {case_id}: {result.message}"

    def every_case_fails_some_bug():
        assert {case_id for _, case_ids in catchers for case_id in case_ids} == set(cases()) and len(cases()) == count

    return reference_passes, bug_fails_its_cases, every_case_fails_some_bug

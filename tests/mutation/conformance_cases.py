"""Every Required and Recommended conformance case as one pytest test against the reference adapter.

This module is the test suite ``mutmut`` runs over ``reference_impl`` ([tool.mutmut] in pyproject.toml,
docs/audit/mutation.md): a mutant is killed when a case the unmutated oracle passes fails on it. Its name
does not match ``test_*.py``, so the ordinary ``python -m pytest`` run never collects it; it is collected only
when named on the command line.

The cases are built once, when this module is imported: their expectations come from the builders and
manifests, never from ``reference_impl``'s runtime logic, and mutmut forks every mutant's run from the
process that already holds them, so a mutant never changes what a case expects.

The oracle memoizes a few results (the default decoder registry, dtype and LUT lookups, onnx operator
classes, the affine module's per-byte code tables). Filled by the first case in the parent, a memo would
hide a mutant in the code that fills it from every forked run; each test starts with them empty (or, for
the code tables built at import, rebuilt: ``forget_memos``), so that code runs, mutated, in the case that
needs it.
"""

from __future__ import annotations

import sys

import pytest

from conformance.adapters.reference import ReferenceAdapter
from conformance.cases import Case, load_cases
from conformance.execute import PASSED, run_case
from reference_impl import payload

#: the levels the mutation run holds the oracle to
LEVELS = ("Required", "Recommended")


def mutation_cases() -> dict[str, Case]:
    """The Required and Recommended cases by ID, each built (model bytes, files, builder extras)."""
    cases = {case.id: case for case in load_cases() if case.level in LEVELS}
    for case in cases.values():
        case.build()
    return cases


CASES = mutation_cases()


def forget_memos() -> None:
    """Empty every memo of the oracle: ``functools`` caches of its modules and its module-level memos."""
    for name, module in list(sys.modules.items()):
        if name != "reference_impl" and not name.startswith("reference_impl."):
            continue
        for value in list(vars(module).values()):
            if callable(getattr(value, "cache_clear", None)) and getattr(value, "__module__", "") == name:
                value.cache_clear()
    decode = sys.modules.get("reference_impl.decode")
    if decode is not None:
        decode._DEFAULT_REGISTRY = None
    values = sys.modules.get("reference_impl.values")
    if values is not None:
        values._DTYPE_CACHE.clear()
    affine = sys.modules.get("reference_impl.affine")
    if affine is not None:  # the code tables are built at import, before any mutant is forked
        affine._LUTS = {storage: affine._byte_lut(storage) for storage in affine._LUTS}


@pytest.fixture(autouse=True)
def _fresh_memos() -> None:
    forget_memos()


@pytest.mark.parametrize("case_id", sorted(CASES))
def test_case(case_id: str) -> None:
    """The reference passes the case, with its error code where it rejects (``passed without code`` fails)."""
    result = run_case(CASES[case_id], ReferenceAdapter())
    assert result.verdict == PASSED, f"{case_id}: {result.verdict}: {result.message}"


#: the cases with external files, run again with the bytes read into memory: the oracle reaches external payloads
#: in two ways (``payload.set_external_access``), mapping them (its default, above) or reading them (what
#: ``python -m conformance run`` and the fuzz harness select), and a mutant of either must fail a case
READ_ACCESS = sorted(case_id for case_id, case in CASES.items() if case.external_files())


@pytest.mark.parametrize("case_id", READ_ACCESS)
def test_case_read_access(case_id: str) -> None:
    """The reference passes the case with external payloads read, not mapped."""
    previous = payload.set_external_access("read")
    try:
        result = run_case(CASES[case_id], ReferenceAdapter())
    finally:
        payload.set_external_access(previous)
    assert result.verdict == PASSED, f"{case_id} (read access): {result.verdict}: {result.message}"

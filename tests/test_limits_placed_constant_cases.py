"""The case of corpus/cases/limits/representation_rules.toml that places a structure of 2049 constants twice,
written where the records shard of the mutation run (docs/audit/mutation.md) found no case taking a layout past the
bound of 4096 constants. The reference refuses it with RESOURCE_LIMIT, and it fails a runtime that bounds a layout's
leaves but not its constants, written here as a fault."""

from __future__ import annotations

import functools

from fault_catchers import wrong_runtime_tests

from conformance.audit.fault import Fault, Patch
from conformance.cases import load_cases
from reference_impl import records

_CONSTANTS = "Recommended.Limits.SharedLeaves.ConstantStructureTwice"


@functools.cache
def _cases() -> dict:
    return {case.id: case for case in load_cases() if case.id == _CONSTANTS}


def _add_unbounded(layout, name, constant, path) -> None:
    layout.constants[name] = constant


class ConstantsUnbounded(Fault):
    """Counts a layout's leaves against the bound but adds constants without counting them."""

    fault_id = "RESOURCE-LIMITS.constants-unbounded"

    def patches(self):
        return [Patch(records, "_add_constant", _add_unbounded)]


CATCHERS = [(ConstantsUnbounded(), (_CONSTANTS,))]


test_the_reference_passes, test_the_bug_fails_its_cases, test_every_case_fails_some_bug = \
    wrong_runtime_tests(_cases, 1, CATCHERS)

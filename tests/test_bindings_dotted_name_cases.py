"""The row `Required.Bindings.Declaration.DottedNameOfNoValue` of corpus/cases/bindings/declaration.toml, written
where the payload shard of the mutation run (docs/audit/mutation.md) found no case naming, with a dot, a value
whose part before the dot is not declared either: the rows with dots all start with a declared struct. The
reference passes it, and it fails a runtime that reads such a name as a field path, written here as a fault."""

from __future__ import annotations

import functools

from fault_catchers import wrong_runtime_tests

from conformance.audit.fault import Fault, wrap
from conformance.cases import load_cases
from reference_impl import bindings
from reference_impl.errors import ErrorCode as E
from reference_impl.errors import violation

_DOTTED = "Required.Bindings.Declaration.DottedNameOfNoValue"


@functools.cache
def _cases() -> dict:
    return {case.id: case for case in load_cases() if case.id == _DOTTED}


class DottedNameReadAsFieldPath(Fault):
    """Takes an undeclared dotted name as a field path into the value before the dot, and, finding no struct
    there, reports the binding as incompatible instead of naming nothing."""

    fault_id = "BIND-LITERAL-NAMES.dotted-name-read-as-field-path"

    def patches(self):
        def make(original):
            def check_name(name, declared, path, side):
                if name not in declared and "." in name and name.split(".", 1)[0] not in declared:
                    raise violation(E.BINDING_INCOMPATIBLE, path, f"{name!r} selects a field of no struct {side}")
                return original(name, declared, path, side)
            return check_name
        return [wrap(bindings, "_check_name", make)]


CATCHERS = [(DottedNameReadAsFieldPath(), (_DOTTED,))]


test_the_reference_passes, test_the_bug_fails_its_cases, test_every_case_fails_some_bug = \
    wrong_runtime_tests(_cases, 1, CATCHERS)

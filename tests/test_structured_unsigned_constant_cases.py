"""The case of corpus/cases/structured/unsigned_constants.toml, written where the payload shard of the mutation run
(docs/audit/mutation.md) found no case with a UINT32 or UINT64 constant in its typed field, uint64_data. The
reference passes it, and it fails a runtime that looks for those values in int64_data, written here as a fault."""

from __future__ import annotations

import functools

from fault_catchers import wrong_runtime_tests

from conformance.audit.fault import Fault, wrap
from conformance.cases import load_cases
from reference_impl import dtypes, tensors

_UNSIGNED = "Required.Structured.Fields.UnsignedConstantsInUint64Data"


@functools.cache
def _cases() -> dict:
    return {case.id: case for case in load_cases() if case.id == _UNSIGNED}


class UnsignedReadFromInt64Data(Fault):
    """Keeps every 32- and 64-bit integer type in int64_data, so a UINT32 or UINT64 constant's uint64_data is
    data in the wrong field."""

    fault_id = "DECL-CONSTANT.unsigned-read-from-int64-data"

    def patches(self):
        def make(original):
            def typed_field(tensor):
                if tensor.data_type in (dtypes.UINT32, dtypes.UINT64):
                    return "int64_data", len(tensor.int64_data)
                return original(tensor)
            return typed_field
        return [wrap(tensors, "_typed_field", make)]


CATCHERS = [(UnsignedReadFromInt64Data(), (_UNSIGNED,))]


test_the_reference_passes, test_the_bug_fails_its_cases, test_every_case_fails_some_bug = \
    wrong_runtime_tests(_cases, 1, CATCHERS)

"""Faults in the state's execution path found by mutating the oracle: checks whose removal no Required
case noticed, each written the way a runtime would get the rule wrong."""

from __future__ import annotations

import importlib

from conformance.audit.fault import Fault, wrap
from reference_impl.values import EncodedValue

#: the module (the package re-exports ``make_state`` and ``adopt`` under other names)
state_module = importlib.import_module("reference_impl.state")


class EncodedStringLogicalRetained(Fault):
    """Looks for string tensors in the bound types and in the arrays it retains, but takes an encoded value
    for its payload bytes: one whose logical type is a STRING tensor is retained through a binding whose type
    admits it (a kind-less struct_type, or its layout's type_ref)."""

    fault_id = "BIND-NO-STRINGS.encoded-string-logical-retained"
    clauses = ("BIND-NO-STRINGS",)

    def patches(self):
        def make(original):
            def adopt_encoded(value: EncodedValue, path, counters, persistent):
                return original(value, path, counters, False)  # the payload is bytes, never strings
            return adopt_encoded
        return [wrap(state_module, "_adopt_encoded", make)]

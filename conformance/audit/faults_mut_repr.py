"""Faults in the representation contract found by mutating the oracle: checks whose removal no Required
case noticed, each written the way a runtime would get the rule wrong."""

from __future__ import annotations

from conformance.audit.fault import Fault, wrap
from reference_impl import structs
from reference_impl.tensors import check_tensor_data


class NegativeConstantDimsCounted(Fault):
    """Validates a field constant by counting its elements as the product of its dims and matching the
    data to that count, without rejecting negative dims: two negative dims multiply to a positive count
    (dims [-1, -2] hold two FLOATs) and a negative dim beside a zero counts no elements."""

    fault_id = "DECL-CONSTANT.negative-dims-counted"
    clauses = ("DECL-CONSTANT",)

    def patches(self):
        def make(original):
            def check(tensor, path):
                check_tensor_data(tensor, path)
            return check
        return [wrap(structs, "check_constant", make)]

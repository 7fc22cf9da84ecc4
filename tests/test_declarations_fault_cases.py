"""The faults of conformance/audit/faults/, checks whose removal from the
oracle no Required case used to notice, are each caught by at least two cases of
corpus/cases/declarations/constant_dims.toml
and kindless_strings.toml, each with its own model: every listed case passes on the reference and fails on the
fault. The whole catalogue is audited by ``python -m conformance audit`` (tests/test_audit.py)."""

from __future__ import annotations

import pytest
from fault_catchers import assert_caught_by_independent_cases, assert_every_case_listed, params

from conformance.cases import load_cases

_REPR, _EXEC = "Required.Declarations.ConstantDims.", "Required.Bindings.KindlessStrings."
#: fault ID -> the cases that must catch it
CATCHERS = {
    "DECL-CONSTANT.negative-dims-counted": (
        _REPR + "TwoNegativeDimsOneValue", _REPR + "TwoNegativeDimsRawData", _REPR + "NegativeBesideZeroNoData",
        _REPR + "NestedInlineTwoNegativeDims"),
    "BIND-NO-STRINGS.encoded-string-logical-retained": (
        _EXEC + "InitialEncodedStringRefused", _EXEC + "ForwardedEncodedStringRefused",
        _EXEC + "ResetSequenceEncodedStringRefused", _EXEC + "NestedEncodedStringRefused"),
}


@pytest.mark.parametrize(("fault_id", "case_ids"), list(params(CATCHERS)))
def test_fault_is_caught_by_two_independent_cases(fault_id, case_ids):
    assert_caught_by_independent_cases(fault_id, case_ids)


@pytest.mark.parametrize("source", ["cases/declarations/constant_dims.toml", "cases/bindings/kindless_strings.toml"])
def test_every_new_case_catches_a_fault_listed_here(source):
    assert_every_case_listed(CATCHERS, source)


@pytest.mark.clause("DECL-CONSTANT")
def test_constant_dims_cases_break_only_the_dims():
    """The data of each constant matches the product of its dims (the count a runtime without the sign check
    computes), so only the negative dims can explain the rejection."""
    from reference_impl import schema
    from reference_impl.tensors import check_tensor_data

    cases = {case.id: case for case in load_cases() if case.source == "cases/declarations/constant_dims.toml"}
    assert set(cases) == set(CATCHERS["DECL-CONSTANT.negative-dims-counted"])
    products = {}
    for case_id, case in cases.items():
        model = schema.parse_model(case.model_bytes())
        declaration = model.struct_types[0]
        constants = [field.constant for field in declaration.structure.field if field.HasField("constant")]
        for field in declaration.structure.field:  # the nested inline declaration
            if field.HasField("type") and field.type.HasField("struct_type"):
                constants += [inner.constant for inner in field.type.struct_type.structure.field]
        (constant,) = constants
        assert any(dim < 0 for dim in constant.dims)
        product = 1
        for dim in constant.dims:
            product *= dim
        products[case_id] = product
        assert check_tensor_data(constant, "c") == product  # the data matches the (signed) product
    assert sorted(products.values()) == [0, 1, 2, 3]


_STRING_1 = "logical_type { tensor_type { elem_type: 8 shape { dim { dim_value: 1 } } } } "
_FLOAT_1 = "logical_type { tensor_type { elem_type: 1 shape { dim { dim_value: 1 } } } } "


@pytest.mark.clause("BIND-NO-STRINGS")
@pytest.mark.parametrize(("logical", "code"), [("", None), (_FLOAT_1, None), (_STRING_1, "BINDING_STRING")])
def test_only_the_string_logical_type_is_refused(logical, code):
    """The same four layout-40 bytes, two sequence levels deep, open the kind-less binding without a logical type
    or as a FLOAT[1] tensor; only the STRING[1] logical type is refused, with BINDING_STRING, and the fault
    accepts all three."""
    from conformance.adapters.reference import ReferenceAdapter
    from conformance.audit.faults.bindings import EncodedStringLogicalRetained
    from conformance.values import build
    from reference_impl import ContractError

    case = next(case for case in load_cases() if case.id == _EXEC + "InitialEncodedStringRefused")
    encoded = build({"encoded": f'struct_type {{ type_ref: 40 }} {logical}raw_data: "\\x01\\x02\\x03\\x04"'})
    initial = {"s": [[encoded]]}
    if code is None:
        ReferenceAdapter().open_state(case.model_bytes(), initial).close()
    else:
        with pytest.raises(ContractError) as raised:
            ReferenceAdapter().open_state(case.model_bytes(), initial)
        assert raised.value.code.value == code
        assert raised.value.path == "initial['s'][0][0].logical_type"
    EncodedStringLogicalRetained().open_state(case.model_bytes(), initial).close()


def _renaming(renames: dict[str, tuple[str, list[str]]]):
    """The reference reporting some rejections under another code (with causes): a runtime that orders or
    names its checks differently, as the spec allows."""
    from conformance.adapters import Rejected
    from conformance.adapters.reference import ReferenceAdapter

    class Renaming(ReferenceAdapter):
        def classify(self, exc):
            found = super().classify(exc)
            if found is not None and found.code in renames:
                code, causes = renames[found.code]
                return Rejected(code, found.message, causes)
            return found
    return Renaming()


@pytest.mark.clause("DECL-CONSTANT")
def test_dims_reported_as_unmatched_data_pass():
    """A runtime refusing negative dims in its element count (TENSOR_DATA_INVALID) passes every case."""
    from conformance.execute import PASSED, run_case

    adapter = _renaming({"CONSTANT_DIMS_INVALID": ("TENSOR_DATA_INVALID", [])})
    cases = [case for case in load_cases() if case.id in CATCHERS["DECL-CONSTANT.negative-dims-counted"]]
    assert len(cases) == 4
    assert all(run_case(case, adapter).verdict == PASSED for case in cases)


@pytest.mark.clause("BIND-NO-STRINGS", "STATE-VALIDATE-METADATA")
def test_string_reported_as_incompatible_value_or_failed_run_passes():
    """Naming the incompatible actual value (STATE_VALUE_INCOMPATIBLE) passes every case; a run that fails
    with STATE_RUN_FAILED because of the string passes the run case, and one blaming another cause fails it."""
    from conformance.execute import FAILED, PASSED, run_case

    cases = {case.id: case for case in load_cases()
             if case.id in CATCHERS["BIND-NO-STRINGS.encoded-string-logical-retained"]}
    incompatible = _renaming({"BINDING_STRING": ("STATE_VALUE_INCOMPATIBLE", [])})
    assert all(run_case(case, incompatible).verdict == PASSED for case in cases.values())
    forwarded = cases[_EXEC + "ForwardedEncodedStringRefused"]
    run_failed = _renaming({"BINDING_STRING": ("STATE_RUN_FAILED", ["BINDING_STRING"])})
    assert run_case(forwarded, run_failed).verdict == PASSED
    blamed = _renaming({"BINDING_STRING": ("STATE_RUN_FAILED", ["EXECUTION_FAILED"])})
    assert run_case(forwarded, blamed).verdict == FAILED

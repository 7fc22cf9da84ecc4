"""Operator roles: a runtime binds the suite's paged_attention / decode / get_field / make_struct roles to
its own operators, and the runner rewrites the case models to that binding before the runtime sees them,
in process and through the testee; the default for paged attention is the operator the reference (and
onnx-light) registers."""

from __future__ import annotations

import pathlib
import sys

import pytest

from conformance import operators
from conformance.adapters import load_adapter
from conformance.adapters.reference import ReferenceAdapter
from conformance.cases import load_cases, select
from conformance.execute import FAILED, PASSED, run_case
from conformance.runner import RunConfig, adapter_identity
from reference_impl import schema
from reference_impl.kv.kernels import KV_DOMAIN

VENDOR = ("vendor.kv", "PagedAttentionV2")
PAGED = ["Required.KV.PagedFormats.Int8KeysUint8Values", "Required.KV.PagedOwnership.BranchesFromAHeldCache"]


class VendorPaged(ReferenceAdapter):
    """The reference whose paged attention kernel is registered under its own name only."""

    name = "vendor"

    def operators(self):
        return {"paged_attention": VENDOR}

    def executor_kernels(self):
        kernels = dict(super().executor_kernels())
        kernels[VENDOR] = kernels.pop((KV_DOMAIN, "PagedAttention"))
        return kernels


class UndeclaredVendor(VendorPaged):
    """Registers the vendor operator but does not say so: the default-named nodes reach no kernel."""

    def operators(self):
        return {}


def _cases(ids):
    return select(load_cases(), ids)


def test_the_paged_attention_default_is_the_operator_the_reference_registers():
    assert operators.ROLES["paged_attention"].default == (KV_DOMAIN, "PagedAttention") == ("ai.rt", "PagedAttention")
    assert set(operators.ROLES) == {"paged_attention", "decode", "get_field", "make_struct"}


def test_bind_rewrites_only_the_rebound_role_and_imports_its_domain():
    (case,) = _cases(PAGED[:1])
    data = case.model_bytes()
    assert operators.bind(data, {}) == (data, {})
    assert operators.bind(data, {"decode": ("x", "Y")}) == (data, {})  # no node plays that role
    rewritten, applied = operators.bind(data, {"paged_attention": VENDOR})
    assert applied == {"paged_attention": "vendor.kv::PagedAttentionV2"}
    model = schema.parse_model(rewritten)
    assert [(n.domain, n.op_type) for n in model.graph.node] == [VENDOR]
    assert ("vendor.kv", 1) in [(o.domain, o.version) for o in model.opset_import]
    original = schema.parse_model(data)
    original.graph.node[0].domain, original.graph.node[0].op_type = VENDOR
    assert list(model.graph.node) == list(original.graph.node)  # nothing else changed


def test_a_declared_binding_lets_a_vendor_operator_pass_and_is_recorded():
    for case in _cases(PAGED):
        result = run_case(case, VendorPaged())
        assert result.verdict == PASSED, result.message
        assert result.operators == {"paged_attention": "vendor.kv::PagedAttentionV2"}
        undeclared = run_case(case, UndeclaredVendor())
        assert undeclared.verdict == FAILED  # ai.rt::PagedAttention has no kernel there
        assert run_case(case, ReferenceAdapter()).operators == {}
    identity = adapter_identity(VendorPaged(), RunConfig())
    assert identity["operators"]["paged_attention"] == "vendor.kv::PagedAttentionV2"
    assert identity["operators"]["decode"] == "onnx_light::Decode"


def test_a_testee_declares_its_bindings_in_hello():
    path = pathlib.Path(__file__).resolve()
    adapter = load_adapter(testee=f"{sys.executable} -m conformance.testee --adapter {path}:VendorPaged")
    try:
        assert adapter.operators() == {"paged_attention": VENDOR}
        for case in _cases(PAGED):
            result = run_case(case, adapter)
            assert result.verdict == PASSED, result.message
            assert result.operators == {"paged_attention": "vendor.kv::PagedAttentionV2"}
    finally:
        adapter.shutdown()


@pytest.mark.parametrize("declared, message", [({"paged": ("a", "B")}, "unknown operator role"),
                                               ({"decode": ("a", "")}, "not (domain, op_type)")])
def test_a_malformed_declaration_is_a_suite_error(declared, message):
    class Broken(ReferenceAdapter):
        def operators(self):
            return declared

    result = run_case(_cases(PAGED[:1])[0], Broken())
    assert result.verdict == FAILED and "suite error" in result.message and message in result.message

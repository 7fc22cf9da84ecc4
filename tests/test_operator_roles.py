"""Operator roles: a runtime binds the suite's paged_attention / decode / get_field / make_struct / forward roles to
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
    assert set(operators.ROLES) == {"paged_attention", "decode", "get_field", "make_struct", "forward"}


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


def _identity_over_contract_values(case) -> bool:
    """Whether the case's model passes a struct or encoded value through an Identity node of its graph."""
    try:
        model = schema.parse_model(case.model_bytes() or b"")
    except Exception:  # noqa: BLE001 - a deliberately unparsable model has no Identity to look at
        return False
    declared = {v.name: v.type for v in (*model.graph.input, *model.graph.output, *model.graph.value_info)}
    encoded = {e.name for e in model.graph.encoded_initializer}
    return any(node.op_type == "Identity" and node.domain in ("", "ai.onnx")
               and (node.input[0] in encoded or "struct_type" in str(declared.get(node.input[0], "")))
               for node in model.graph.node)


class TensorOnlyIdentity(ReferenceAdapter):
    """A runtime whose Identity is ONNX's, typed for tensors, sequences and optionals only: a struct or
    encoded value reaching it is refused (CONSUMER_MISSING). Its own pass-through operator, vendor::Forward,
    takes any value; it binds the ``forward`` role to it."""

    name = "tensor-only-identity"

    def operators(self):
        return {"forward": ("vendor", "Forward")}

    def executor_kernels(self):
        from reference_impl.errors import ErrorCode, violation
        from reference_impl.values import EncodedValue, StructValue

        def tensor_identity(inputs, attrs, ctx):
            if isinstance(inputs[0], (StructValue, EncodedValue)):
                raise violation(ErrorCode.CONSUMER_MISSING, ctx.path, "Identity takes tensors, sequences and optionals")
            return [inputs[0]]

        return {**super().executor_kernels(), ("", "Identity"): tensor_identity,
                ("vendor", "Forward"): lambda inputs, attrs, ctx: [inputs[0]]}


class TensorOnlyIdentityUnbound(TensorOnlyIdentity):
    def operators(self):
        return {}


@pytest.mark.clause("ZC-TRANSPORT")
def test_a_runtime_whose_identity_refuses_struct_values_binds_forward_and_passes():
    cases = [case for case in load_cases() if case.level == "Required" and _identity_over_contract_values(case)]
    assert len(cases) >= 40
    unbound = [case.id for case in cases if run_case(case, TensorOnlyIdentityUnbound()).verdict == FAILED]
    assert len(unbound) >= 5  # without the binding its Identity refuses the state the models pass on
    failed = {case.id: result.message for case in cases
              if (result := run_case(case, TensorOnlyIdentity())).verdict != PASSED}
    assert not failed, failed


def test_a_node_rewritten_inside_a_local_function_is_imported_by_that_function():
    """A function imports its own opsets: a role node in its body that moves to another domain needs the
    function to import that domain (the model imports it only for nodes of its own graph)."""
    model = schema.parse_text('''
      ir_version: 13 opset_import { domain: "" version: 23 } opset_import { domain: "local" version: 1 }
      functions { name: "pass" domain: "local" input: "x" output: "y" opset_import { domain: "" version: 23 }
                  node { op_type: "Identity" input: "x" output: "y" } }
      graph { name: "g" node { op_type: "pass" domain: "local" input: "a" output: "b" }
              node { op_type: "Identity" input: "b" output: "c" }
              input { name: "a" type { tensor_type { elem_type: 1 shape { dim { dim_value: 1 } } } } }
              output { name: "c" type { tensor_type { elem_type: 1 shape { dim { dim_value: 1 } } } } } }''')
    rewritten, applied = operators.bind(model.SerializeToString(), {"forward": ("vendor", "Forward")})
    assert applied == {"forward": "vendor::Forward"}
    result = schema.parse_model(rewritten)
    (function,) = result.functions
    assert [(n.domain, n.op_type) for n in function.node] == [("vendor", "Forward")]
    assert ("vendor", 1) in [(o.domain, o.version) for o in function.opset_import]
    assert ("vendor", 1) in [(o.domain, o.version) for o in result.opset_import]  # its graph's Identity moved too

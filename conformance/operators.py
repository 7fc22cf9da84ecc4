"""Operator roles: the operators the suite's models need but the spec does not name.

The contract defines values, layouts and bindings, not operators, yet a case model must consume a paged
cache, decode an encoded value or take a struct apart with *some* node. Each such node plays a **role**
with a documented signature (docs/testee-protocol.md) and a default ``(domain, op_type)``. An adapter
binds a role to its own operator with ``operators() -> {role: (domain, op_type)}`` (a testee declares
``HelloResult.operators``); before the adapter sees a case's model, the runner rewrites every node of a
role from the default to the adapter's binding (only when they differ) and records what it rewrote.
Roles an adapter does not bind keep their default. The reference runtime registers the defaults.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from conformance.adapters import SuiteError


@dataclass(frozen=True)
class Role:
    """One role: its default operator and its signature, as the suite's models use it."""

    name: str
    domain: str
    op_type: str
    signature: str

    @property
    def default(self) -> tuple[str, str]:
        return self.domain, self.op_type


ROLES: dict[str, Role] = {role.name: role for role in (
    # onnx-light registers ai.rt::PagedAttention (opset 1) with these inputs, outputs and attributes.
    Role("paged_attention", "ai.rt", "PagedAttention",
         "(Q, K, V, past[, attn_mask]) -> (Y, present); Q/K/V float [batch, heads, L, head_size]; past and "
         "present are KV_PAGED_CACHE struct values; attributes block_size (INT, 16), is_causal (INT, 1), "
         "left_window_size (INT, -1), max_tokens (INT, 4096); suite extensions: attn_mask input, scale, "
         "softcap (FLOAT, ONNX Attention's meaning), key_format / value_format (STRING, the format full "
         "blocks are sealed in)"),
    Role("decode", "onnx_light", "Decode",
         "(encoded) -> tensor: an encoded value's logical tensor through its layout or registered decoder"),
    Role("get_field", "onnx_light", "GetField",
         "(struct) -> value; attribute field (STRING): one field of a struct value, by reference"),
    Role("make_struct", "onnx_light", "MakeStruct",
         "(values...) -> struct; attributes type_id (INT), fields (STRINGS): a struct from its field values"),
    # ONNX's Identity types no struct or encoded value; the models pass state through it all the same.
    Role("forward", "", "Identity",
         "(value) -> value: its input handed on by reference, whatever it is (tensor, sequence, optional, map, "
         "struct value, encoded value)"),
)}


def declared(adapter: Any) -> dict[str, tuple[str, str]]:
    """The adapter's own bindings (``operators()``), checked: known roles, non-empty op_type."""
    probe = getattr(adapter, "operators", None)
    found = probe() if callable(probe) else probe or {}
    bindings = {}
    for role, binding in dict(found).items():
        if role not in ROLES:
            raise SuiteError(f"the adapter binds unknown operator role {role!r}; roles are {sorted(ROLES)}")
        domain, op_type = binding
        if not isinstance(domain, str) or not isinstance(op_type, str) or not op_type:
            raise SuiteError(f"operator role {role!r} is bound to {binding!r}, not (domain, op_type)")
        bindings[role] = (domain, op_type)
    return bindings


def bindings(adapter: Any) -> dict[str, tuple[str, str]]:
    """Every role's operator for this adapter: its declaration over the defaults."""
    return {**{name: role.default for name, role in ROLES.items()}, **declared(adapter)}


def overrides(adapter: Any) -> dict[str, tuple[str, str]]:
    """The roles whose binding differs from the default (the only ones that need a rewrite)."""
    return {name: binding for name, binding in declared(adapter).items() if binding != ROLES[name].default}


def describe(binding: tuple[str, str]) -> str:
    domain, op_type = binding
    return f"{domain}::{op_type}" if domain else op_type


def bind(model_bytes: bytes, rebound: dict[str, tuple[str, str]]) -> tuple[bytes, dict[str, str]]:
    """``model_bytes`` with every node of a rebound role moved to its binding, and {role: operator} of
    the roles that were rewritten. The bytes are returned untouched when no node plays a rebound role."""
    if not rebound:
        return model_bytes, {}
    from reference_impl import schema

    targets = {ROLES[name].default: (name, binding) for name, binding in rebound.items()}
    try:
        model = schema.parse_model(model_bytes)
    except Exception:  # noqa: BLE001 - an unparsable model is the case's business, not the rewrite's
        return model_bytes, {}
    applied: dict[str, str] = {}
    # the model and each local function import their own opsets: a rewritten node's new domain is imported
    # by the one whose nodes (subgraphs included) it belongs to
    for owner, nodes in [(model, model.graph.node), *((f, f.node) for f in model.functions)]:
        domains = set()
        for node in _nodes(nodes):
            hit = targets.get((node.domain, node.op_type))
            if hit is not None:
                name, (domain, op_type) = hit
                node.domain, node.op_type = domain, op_type
                applied[name] = describe((domain, op_type))
                domains.add(domain)
        imported = {o.domain for o in owner.opset_import}
        for domain in sorted(domains - imported - {"", "ai.onnx"}):
            owner.opset_import.add(domain=domain, version=1)
    if not applied:
        return model_bytes, {}
    return model.SerializeToString(), applied


def _nodes(nodes):
    """Every node of a graph or function body, with those of its subgraphs (If/Loop bodies)."""
    stack = [list(nodes)]
    while stack:
        for node in stack.pop():
            yield node
            for attribute in node.attribute:
                if attribute.HasField("g"):
                    stack.append(list(attribute.g.node))
                stack.extend(list(graph.node) for graph in attribute.graphs)


def model_bytes(case: Any, adapter: Any) -> bytes:
    """The case's model as this adapter must receive it (cached per binding on the case)."""
    return bound_model(case, adapter)[0]


def other_model_bytes(case: Any, adapter: Any, name: str) -> bytes:
    """One of the case's further models (``models``, opened by name in a trace), bound like the main one."""
    return bound_model(case, adapter, name)[0]


def bound_model(case: Any, adapter: Any, name: str | None = None) -> tuple[bytes, dict[str, str]]:
    rebound = overrides(adapter)
    key = (name, tuple(sorted(rebound.items())))
    cache = case.__dict__.setdefault("_bound", {})
    if key not in cache:
        data = case.model_bytes() if name is None else case.other_model_bytes(name)
        cache[key] = bind(data, rebound)
    return cache[key]

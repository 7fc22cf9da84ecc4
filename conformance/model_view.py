"""What an explicit save/load or a rewrite must keep of a model, compared without the incidentals a
conforming writer may change.

``same_message`` (byte-for-byte after parsing) demands more than the spec: a writer may store a
tensor's values in ``raw_data`` instead of ``float_data``, list ``external_data`` entries in another
order, write or omit an external offset of 0 ("offset is optional") or an inline value's data_location
DEFAULT ("Default location uses raw_data"), in subgraphs too, reorder the catalogue ("Reordering
the catalogue does not change identity") or drop fields it does not know. ``same_contract`` compares
what the contract preserves: the catalogue, the encoded initializers (layout, parameters by value,
payload or external extent), the bindings, and the graph's inputs, outputs, initializers (by value),
nodes and opset imports.
"""

from __future__ import annotations

from typing import Any

from google.protobuf.descriptor import FieldDescriptor

_TENSOR = "onnx.TensorProto"
_ENCODED = "onnx.EncodedValueProto"
_DATA_FIELDS = ("float_data", "int32_data", "string_data", "int64_data", "double_data", "uint64_data", "raw_data")


def contract_difference(before, after) -> str | None:
    """The first thing ``after`` lost or changed relative to ``before``, or None."""
    old, new = contract_view(before), contract_view(after)
    for key in old:
        if old[key] != new[key]:
            return f"{key} differ" + _detail(old[key], new[key])
    return None


def contract_view(model) -> dict[str, Any]:
    """A comparable summary of what the contract preserves (see the module docstring)."""
    model = type(model).FromString(model.SerializeToString())
    model.DiscardUnknownFields()
    _canonical_tensors(model)
    _canonical_encoded_values(model)
    graph = model.graph
    return {
        "struct_types": sorted(_bytes(d) for d in model.struct_types),
        "encoded initializers": {v.name: _encoded(v) for v in graph.encoded_initializer},
        "bindings": sorted((b.input_name, b.output_name) for b in graph.persistent_bindings),
        "graph inputs": [_bytes(vi) for vi in graph.input],
        "graph outputs": [_bytes(vi) for vi in graph.output],
        "initializers": {t.name: _bytes(t) for t in graph.initializer},
        "sparse initializers": sorted(_bytes(t) for t in graph.sparse_initializer),
        "nodes": [_bytes(n) for n in graph.node],
        "opset imports": sorted((o.domain, o.version) for o in model.opset_import),
        "functions": sorted(_bytes(f) for f in model.functions),
    }


def _encoded(value) -> tuple:
    header = type(value)()
    header.CopyFrom(value)
    header.ClearField("external_data")
    return _bytes(header), tuple((e.key, e.value) for e in value.external_data)


def _canonical_encoded_values(message) -> None:
    """Every EncodedValueProto (recursively, subgraphs and function bodies included) with its optional
    defaults left out and its external entries in one order: an explicit offset 0 and no offset name the
    same extent ("offset is optional"), as an explicit data_location DEFAULT and none name the inline
    payload ("Default location uses raw_data")."""
    if message.DESCRIPTOR.full_name == _ENCODED:
        from reference_impl import schema

        if message.HasField("data_location") and message.data_location == schema.TensorProto.DEFAULT:
            message.ClearField("data_location")
        entries = sorted((e.key, e.value) for e in message.external_data if (e.key, e.value) != ("offset", "0"))
        del message.external_data[:]
        for key, value in entries:
            message.external_data.add(key=key, value=value)
        return
    for field, value in message.ListFields():
        if field.type != FieldDescriptor.TYPE_MESSAGE:
            continue
        for item in (value if _repeated(field) else [value]):
            _canonical_encoded_values(item)


def _bytes(message) -> bytes:
    return message.SerializeToString(deterministic=True)


def _canonical_tensors(message) -> None:
    """Rewrite every TensorProto (recursively) with its values in one canonical form."""
    if message.DESCRIPTOR.full_name == _TENSOR:
        _canonical_tensor(message)
        return
    for field, value in message.ListFields():
        if field.type != FieldDescriptor.TYPE_MESSAGE:
            continue
        if _repeated(field):
            for item in value:
                _canonical_tensors(item)
        else:
            _canonical_tensors(value)


def _repeated(field) -> bool:
    flag = getattr(field, "is_repeated", None)  # newer protobuf; older ones only have ``label``
    if flag is not None:
        return flag() if callable(flag) else bool(flag)
    return field.label == FieldDescriptor.LABEL_REPEATED


def _canonical_tensor(tensor) -> None:
    from reference_impl import schema
    from reference_impl.tensors import to_array

    if tensor.data_location == schema.TensorProto.EXTERNAL or tensor.data_type == schema.TensorProto.STRING:
        return
    try:
        values = to_array(tensor, "tensor").tobytes()
    except Exception:  # noqa: BLE001 - malformed data is compared as written
        return
    for name in _DATA_FIELDS:
        tensor.ClearField(name)
    tensor.raw_data = values


def _detail(old: Any, new: Any) -> str:
    if isinstance(old, dict) and isinstance(new, dict):
        lost = sorted(set(old) - set(new))
        added = sorted(set(new) - set(old))
        changed = sorted(k for k in set(old) & set(new) if old[k] != new[k])
        parts = [f"{label} {names}" for label, names in (("lost", lost), ("added", added), ("changed", changed))
                 if names]
        return f": {'; '.join(parts)}" if parts else ""
    if isinstance(old, list) and isinstance(new, list) and len(old) != len(new):
        return f": {len(old)} before, {len(new)} after"
    return ""

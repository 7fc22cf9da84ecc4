"""The implementation-limit cases (corpus/cases/limits/nesting.toml) catch runtimes whose limits differ from
onnx-light's: each fault below is the reference with one realistic departure, and some case fails it
while the unmodified reference passes them all."""

from __future__ import annotations

from unittest import mock

import pytest
from test_conformance_faults import _caught

from conformance.adapters.reference import ReferenceAdapter
from reference_impl import ContractError, bindings, payload, schema, structs


def _referenced_ids(model) -> set[int]:
    """Type IDs reachable from the graph's value types and encoded layouts (through references)."""
    declarations = {decl.type_id: decl for decl in model.struct_types}
    pending = [vi.type for vi in list(model.graph.input) + list(model.graph.output) + list(model.graph.value_info)]
    pending += [value.struct_type for value in model.graph.encoded_initializer if value.HasField("struct_type")]
    reached: set[int] = set()
    while pending:
        item = pending.pop()
        if isinstance(item, schema.TypeProto):
            which = item.WhichOneof("value")
            if which == "struct_type":
                pending.append(item.struct_type)
            elif which in ("sequence_type", "optional_type"):
                pending.append(getattr(item, which).elem_type)
            elif which == "map_type":
                pending.append(item.map_type.value_type)
            continue
        kind = item.WhichOneof("kind")
        if kind == "type_ref" and item.type_ref not in reached and item.type_ref in declarations:
            reached.add(item.type_ref)
            pending.append(declarations[item.type_ref])
        elif kind == "array":
            pending.append(item.array.element_type)
        elif kind == "structure":
            pending += [f.type for f in item.structure.field if f.WhichOneof("content") == "type"]
    return reached


class DepthOnlyWhenUsed(ReferenceAdapter):
    """Measures nesting only along types some value uses (unused declarations are never expanded)."""

    def verify(self, model_bytes, base_dir):
        model = schema.parse_model(model_bytes)
        used = _referenced_ids(model)
        kept = [decl for decl in model.struct_types if decl.type_id in used]
        del model.struct_types[:]
        model.struct_types.extend(kept)
        super().verify(model.SerializeToString(), base_dir)


class DeeperLimit(ReferenceAdapter):
    """Allows 128 levels of nesting instead of onnx-light's 64."""

    def verify(self, model_bytes, base_dir):
        with mock.patch.object(structs, "MAX_DEPTH", 128):
            super().verify(model_bytes, base_dir)


class ExtentsWrapInSignedArithmetic(ReferenceAdapter):
    """Adds offset + length in int64: past INT64_MAX the end wraps negative, so the extent looks like it
    ends before the file does and the value is accepted (a C++ runtime using int64_t offsets)."""

    def verify(self, model_bytes, base_dir):
        with mock.patch.object(payload, "INT64_MAX", structs.UINT64_MAX):
            try:
                super().verify(model_bytes, base_dir)
            except ContractError as error:
                if error.code.value not in ("EXTERNAL_FILE_INVALID", "EXTERNAL_EXTENT_OVERFLOW") \
                        or not _extent_wraps(model_bytes):
                    raise


def _extent_wraps(model_bytes: bytes) -> bool:
    from reference_impl import schema

    for value in schema.parse_model(model_bytes).graph.encoded_initializer:
        entries = {e.key: e.value for e in value.external_data}
        if int(entries.get("offset", "0") or 0) + int(entries.get("length", "0") or 0) > structs.INT64_MAX:
            return True
    return False


class ExtentLimitOffByOne(ReferenceAdapter):
    """Rejects an extent that ends exactly at INT64_MAX."""

    def verify(self, model_bytes, base_dir):
        with mock.patch.object(payload, "INT64_MAX", structs.INT64_MAX - 1):
            super().verify(model_bytes, base_dir)


class IgnoresUnknownBindingFields(ReferenceAdapter):
    """Reads a binding carrying the legacy field-path tags as a whole-value binding."""

    def open_state(self, model_bytes, initial, base_dir=None):
        with mock.patch.object(bindings, "_reject_field_selection", lambda binding, path: None):
            return super().open_state(model_bytes, initial, base_dir)


@pytest.mark.clause("DECL-DEPTH")
def test_depth_measured_only_on_use_is_caught():
    caught = _caught(DepthOnlyWhenUsed(), "Recommended.Limits.Depth")
    assert {"Recommended.Limits.Depth.UnusedChainOf2000", "Recommended.Limits.Depth.UnusedChainJustBeyond",
            "Recommended.Limits.Depth.InlineAndReferenceLevelsAddUp"} <= set(caught)


@pytest.mark.clause("DECL-DEPTH")
def test_another_depth_limit_is_caught():
    caught = _caught(DeeperLimit(), "Recommended.Limits.Depth")
    assert {"Recommended.Limits.Depth.UnusedChainJustBeyond", "Recommended.Limits.Depth.LayoutJustBeyond",
            "Recommended.Limits.Depth.InlineAndReferenceLevelsAddUp"} <= set(caught)


@pytest.mark.clause("PAY-EXTERNAL-EXTENT")
def test_extent_limits_other_than_int64_are_caught():
    assert "Recommended.Limits.External.ExtentBeyondInt64" in \
        _caught(ExtentsWrapInSignedArithmetic(), "Recommended.Limits.External")
    assert "Recommended.Limits.External.ExtentEndsAtInt64Max" in \
        _caught(ExtentLimitOffByOne(), "Recommended.Limits.External")


@pytest.mark.clause("BIND-WHOLE")
def test_legacy_field_paths_read_as_whole_bindings_are_caught():
    caught = _caught(IgnoresUnknownBindingFields(), "Recommended.Limits.Bindings")
    assert set(caught) == {"Recommended.Limits.Bindings.LegacyInputFieldPath",
                           "Recommended.Limits.Bindings.LegacyOutputFieldPath"}

"""Soundness of corpus/cases/export/wire_rules.toml and corpus/cases/encoding/struct_values.toml: toy runtimes, each the
reference adapter taking one choice the spec's words allow and the reference does not take, pass every
Required case of both files; the forbidden behaviour next to each choice stays caught."""

from __future__ import annotations

import pytest

import reference_impl
from conformance.adapters import Rejected
from conformance.adapters.reference import ReferenceAdapter
from conformance.cases import load_cases, select
from conformance.execute import FAILED, PASSED, run_case
from reference_impl import ContractError, schema
from reference_impl.decoders import Decoder, decode_linear_int4, decode_scaled_codebook, default_registry
from reference_impl.errors import ErrorCode as E
from reference_impl.errors import violation

CASES = load_cases()
REQUIRED = [case.id for case in CASES if case.id.startswith("Required.")
            and case.source.endswith(("wire_rules.toml", "struct_values.toml"))]


def _verdicts(adapter, *patterns) -> dict:
    chosen = select(CASES, list(patterns))
    assert chosen, patterns
    return {case.id: run_case(case, adapter, timeout=60) for case in chosen}


def _passes(adapter, *patterns) -> None:
    failed = {cid: r.message for cid, r in _verdicts(adapter, *patterns).items() if r.verdict != PASSED}
    assert not failed, failed


def _fails(adapter, case_id: str) -> str:
    result = _verdicts(adapter, case_id)[case_id]
    assert result.verdict == FAILED, (case_id, result.message)
    return result.message


# ------------------------------------------------------------------------ the root's declared decoder
#: the codec functions this runtime ships, by the (domain, name) a declaration's decoder gives
_CODECS = {("", "DecodeLinearInt4"): decode_linear_int4, ("", "DecodeScaledCodebookBlocks"): decode_scaled_codebook}


class InvokesDeclaredDecoder(ReferenceAdapter):
    """Invokes the root declaration's own decoder function ("Only the concrete root's decoder or encoder is
    invoked"; "an explicit decoder or registered consumer"), found by its name among the codecs it ships and
    reading the fields the declaration names, whatever the type_id; a declaration naming no decoder is
    served by the consumers registered by type_id. A declared decoder it does not ship is a missing
    consumer."""

    def decode(self, model_bytes, value_name, base_dir):
        registry = default_registry()
        strict = registry.bind

        def bind(type_id, layout, path, declaration=None):
            if declaration is None or not declaration.HasField("decoder"):
                return strict(type_id, layout, path, declaration)
            function = declaration.decoder
            codec = _CODECS.get((function.domain, function.name))
            if codec is None:
                raise violation(E.CONSUMER_MISSING, path, f"no codec {function.name!r}")

            def checked(layout, payload):
                try:
                    return codec(layout, payload)
                except (KeyError, ContractError) as exc:
                    raise violation(E.DECODER_MISMATCH, path, f"{function.name} cannot read it: {exc}") from None
            return Decoder(function.name, (), checked)

        registry.bind = bind
        return reference_impl.decode(model_bytes, value_name, base_dir=base_dir, registry=registry)


@pytest.mark.clause("DEC-KEYED", "DEC-MISSING", "DEC-ROOT-ONLY")
def test_a_runtime_invoking_the_declared_decoder_passes_and_keying_by_name_is_caught():
    from conformance.audit.faults.structured import DecodersKeyedByName

    _passes(InvokesDeclaredDecoder(), *REQUIRED)
    for case_id in ("Required.Structured.Consumers.RegisteredNameOtherIdMissingLinear",
                    "Required.Structured.Consumers.RegisteredNameOtherIdMissing"):
        _fails(DecodersKeyedByName(), case_id)


# ------------------------------------------------------------------------ encoded values as tensor outputs
def _bodies(model):
    """The root graph and every subgraph, function bodies' subgraphs included."""
    pending = [model.graph, *model.functions]
    while pending:
        body = pending.pop(0)
        if isinstance(body, schema.GraphProto):
            yield body
        for node in body.node:
            for attr in node.attribute:
                pending += [attr.g] if attr.HasField("g") else list(attr.graphs)


class RefusesEncodedTensorOutputs(ReferenceAdapter):
    """Before anything else, refuses a graph output typed as a tensor that names one of its graph's encoded
    initializers: a tensor output is no decoder, and an encoded value reaches a tensor only through one
    ("tensor-only operators do not accept it without an explicit decoder or registered consumer"). It gives
    the code it gives any encoded value left without a consumer."""

    def verify(self, model_bytes, base_dir):
        for graph in _bodies(schema.parse_model(model_bytes)):
            encoded = {value.name for value in graph.encoded_initializer}
            for output in graph.output:
                if output.name in encoded and output.type.HasField("tensor_type"):
                    raise Rejected("CONSUMER_MISSING", f"graph {graph.name!r}: encoded {output.name!r} as a tensor")
        return super().verify(model_bytes, base_dir)


@pytest.mark.clause("INIT-NAMES-UNIQUE", "GRAPH-TENSOR-OPS")
def test_a_runtime_refusing_encoded_tensor_outputs_passes_and_function_subgraph_names_stay_checked():
    from conformance.audit.faults.naming import NamesUncheckedInFunctionBodies

    _passes(RefusesEncodedTensorOutputs(), *REQUIRED)
    for case_id in ("Required.Naming.Initializers.DuplicateInFunctionBodyBranch",
                    "Required.Naming.Initializers.DuplicateEncodedInFunctionBodyLoop"):
        _fails(NamesUncheckedInFunctionBodies(), case_id)


# ------------------------------------------------------------------------------- value_info annotations
class DiscardsValueInfo(ReferenceAdapter):
    """Drops every graph's value_info unread when it loads a model: value_info is an optional annotation of
    intermediates, neither a graph input nor an output, and the spec never asks for it to be type checked.
    A save still writes the model it was given."""

    def verify(self, model_bytes, base_dir):
        model = schema.parse_model(model_bytes)
        for graph in _bodies(model):
            del graph.value_info[:]
        return super().verify(model.SerializeToString(), base_dir)


@pytest.mark.clause("GRAPH-STRUCT-IO", "DECL-WELLFORMED")
def test_a_runtime_discarding_value_info_passes_and_unchecked_outputs_stay_caught():
    from conformance.audit.faults.catalogue import StructOutputTypesUnchecked

    _passes(DiscardsValueInfo(), *REQUIRED)
    _fails(DiscardsValueInfo(), "Recommended.Catalogue.Graph.MalformedValueInfoStruct")
    for case_id in ("Required.Catalogue.Graph.MalformedOutputStructOnly",
                    "Required.Catalogue.Graph.UnresolvedOutputRefOnly"):
        _fails(StructOutputTypesUnchecked(), case_id)


# ------------------------------------------------------------------------------- explicit defaults on save
class ExplicitDefaultsWriter(ReferenceAdapter):
    """Saves every encoded value (subgraphs and function bodies included) with its optional defaults written
    out: data_location DEFAULT on an inline value ("Default location uses raw_data") and offset 0 on an
    external one ("offset is optional")."""

    def _rewrite(self, data: bytes) -> bytes:
        model = schema.parse_model(data)
        for graph in _bodies(model):
            for value in graph.encoded_initializer:
                if value.external_data:
                    if "offset" not in {entry.key for entry in value.external_data}:
                        value.external_data.add(key="offset", value="0")
                elif not value.HasField("data_location"):
                    value.data_location = schema.TensorProto.DEFAULT
        return model.SerializeToString()

    def roundtrip(self, model_bytes, base_dir=None):
        return self._rewrite(super().roundtrip(model_bytes, base_dir))

    def export(self, model_bytes, target, base_dir=None):
        produced = super().export(model_bytes, target, base_dir)
        return self._rewrite(produced) if target == "onnx-light" else produced


@pytest.mark.clause("EXP-PRESERVE-STRUCT", "WIRE-ROUNDTRIP", "PAY-EXTERNAL-KEYS")
def test_a_writer_spelling_out_optional_defaults_passes_every_save_case():
    _passes(ExplicitDefaultsWriter(), *REQUIRED, "Required.Export", "Required.Wire", "Required.External")


def test_the_contract_still_sees_a_changed_extent_or_location_inside_a_subgraph():
    from conformance.model_view import contract_difference

    case = next(case for case in CASES if case.id == "Required.Export.Preserve.IfBranchEncodedInitializerRoundTrip")
    model = schema.parse_model(case.model_bytes())
    nested = list(_bodies(model))[1].encoded_initializer[0]
    nested.ClearField("raw_data")
    nested.data_location = schema.TensorProto.EXTERNAL
    for key, value in (("location", "t.bin"), ("offset", "4"), ("length", "2")):
        nested.external_data.add(key=key, value=value)

    def changed(edit) -> str | None:
        copy = schema.parse_model(model.SerializeToString())
        edit(list(_bodies(copy))[1].encoded_initializer[0])
        return contract_difference(model, copy)

    def reorder(value):
        entries = list(value.external_data)[::-1]
        del value.external_data[:]
        value.external_data.extend(entries)

    assert changed(reorder) is None
    assert changed(lambda value: value.external_data[1].__setattr__("value", "0")) == "nodes differ"
    assert changed(lambda value: value.__setattr__("data_location", schema.TensorProto.DEFAULT)) == "nodes differ"

"""The cases of corpus/cases/structured/nested_codecs.toml: registered roots (1002, 1003, 1102) embedding subtypes whose
own decoders are bodies of standard operators a runtime could run. Each case passes on the reference and
on registries that pin the whole resolved declaration (they refuse, as either code), and fails every
runtime that runs a subtype's decoder: with different values, never by a refusal the case allows."""

from __future__ import annotations

import numpy as np
import pytest
from fault_catchers import assert_caught_by_independent_cases
from test_alternatives_repr import PinsNestedCodecs, PinsNestedCodecsAsMismatch

from conformance.adapters.reference import ReferenceAdapter
from conformance.audit.fault import Fault, decode_module, wrap
from conformance.audit.faults.structured import NestedDecodersInvoked, _nested_codecs, _runnable, _ThroughSubtypeCodecs
from conformance.cases import load_cases
from conformance.execute import FAILED, PASSED, run_case
from reference_impl import records

CASES = {case.id: case for case in load_cases() if case.source.endswith("nested_codecs.toml")}
NEW = sorted(CASES)
#: the cases written before, whose subtype decoders no runtime has (a refusal passes them)
UNRUNNABLE = ("Required.State.Consumers.NestedSubtypeCodecsNeverRun",
              "Required.Structured.Consumers.NestedDecoderIgnored")


def _run(case_id: str, adapter):
    case = CASES.get(case_id) or {c.id: c for c in load_cases()}[case_id]
    return run_case(case, adapter, timeout=120)


# --------------------------------------------------------------------------- another wrong runtime
def _outermost_subtype_decodes(original):
    def decode_value(value, catalogue, base_dir=None, registry=None, path="value", out=None):
        st = value.struct_type
        codecs: list = []
        if value.WhichOneof("layout") == "struct_type" and st.WhichOneof("kind") == "type_ref":
            _nested_codecs(catalogue, st, "", path, codecs, [4096])
        codecs = [codec for codec in codecs if codec[0] and _runnable(codec[2])]
        if not codecs:
            return original(value, catalogue, base_dir, registry, path, **({} if out is None else {"out": out}))
        data = decode_module.payload_array(value, catalogue, base_dir, path)
        layout = records.compile_layout(st, catalogue, f"{path}.struct_type")
        through = _ThroughSubtypeCodecs(layout.record_bits, layout.leaves, layout.constants)
        through.codecs = tuple(codecs)
        prefix = codecs[0][0]
        leaf = next(p for p in layout.leaves if p == prefix or p.startswith(prefix + "."))
        result = through.read(data, leaf).astype(np.float32).reshape(-1)
        return decode_module._check_logical(value, result, path)
    return decode_value


class SubtypeDecoderReplacesRoot(Fault):
    """Finding a subtype with a decoder it can run, decodes the value with that decoder (the outermost one,
    over the fields inside it) and never calls the registered root's."""

    fault_id = "DEC-ROOT-ONLY.subtype-decoder-replaces-root"
    clauses = ("DEC-ROOT-ONLY",)

    def patches(self):
        return [wrap(decode_module, "decode_value", _outermost_subtype_decodes)]


WRONG = (NestedDecodersInvoked, SubtypeDecoderReplacesRoot)


# ---------------------------------------------------------------------------------------- tests
def test_the_file_holds_four_required_cases():
    assert len(NEW) == 4 and all(case_id.startswith("Required.") for case_id in NEW)


@pytest.mark.clause("DEC-ROOT-ONLY")
@pytest.mark.parametrize("case_id", NEW)
def test_the_reference_decodes_with_the_root_decoder_only(case_id):
    result = _run(case_id, ReferenceAdapter())
    assert result.verdict == PASSED, result.message


@pytest.mark.clause("DEC-KEYED", "DEC-ROOT-ONLY")
@pytest.mark.parametrize("adapter", [PinsNestedCodecs, PinsNestedCodecsAsMismatch], ids=lambda a: a.__name__)
@pytest.mark.parametrize("case_id", NEW)
def test_a_registry_pinning_the_resolved_declaration_may_refuse(case_id, adapter):
    result = _run(case_id, adapter())
    assert result.verdict == PASSED, result.message


@pytest.mark.clause("DEC-ROOT-ONLY")
@pytest.mark.parametrize("wrong", WRONG, ids=lambda w: w.__name__)
@pytest.mark.parametrize("case_id", NEW)
def test_running_a_subtype_decoder_gives_other_values(case_id, wrong):
    result = _run(case_id, wrong())
    assert result.verdict == FAILED, result.message
    assert "differs" in result.message, result.message  # wrong values, not a refusal


@pytest.mark.clause("DEC-ROOT-ONLY")
def test_the_audit_fault_is_caught_by_independent_cases():
    assert_caught_by_independent_cases(NestedDecodersInvoked.fault_id, NEW)


@pytest.mark.clause("DEC-ROOT-ONLY")
@pytest.mark.parametrize("case_id", UNRUNNABLE)
def test_a_subtype_decoder_nobody_has_is_refused_as_allowed(case_id):
    """Where the subtype's decoder cannot run, the fault refuses with CONSUMER_MISSING, which those cases
    allow (a pinning registry refuses the same way): only the cases above can catch it."""
    assert _run(case_id, NestedDecodersInvoked()).verdict == PASSED


def test_the_faulty_values_are_what_running_the_subtype_decoders_gives():
    """The fault really decodes through the subtype: 1002's offset-binary subtype adds 8 to each code,
    (code + 8 - 3) * 0.25 = the root's value + 2.0."""
    case = CASES["Required.Structured.NestedCodecs.LinearCodesSubtypeDecoderNotRun"]
    expected = np.asarray(case.expect["values"]["data"], np.float32)
    got = NestedDecodersInvoked().decode(case.model_bytes(), "v", None)
    np.testing.assert_array_equal(np.asarray(got), expected + np.float32(2.0))

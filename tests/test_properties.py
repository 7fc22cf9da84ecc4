"""Laws of the representation contract, checked on generated models (see fuzz/properties.py)."""

from __future__ import annotations

import pytest

from fuzz import properties as P

test_valid_models_decode_as_generated = pytest.mark.clause(
    "ENC-SIZE-TABLE", "ENC-BIT-ORDER", "ENC-RECORD-COUNT", "AFF-DQ", "DEC-KEYED", "PAY-EXTERNAL-EXTENT",
    "BIND-EXACT-NAMES")(P.valid_models_decode_as_generated)
test_near_valid_models_fail_with_their_code = pytest.mark.clause("DECL-WELLFORMED", "PAY-VALIDATE-FIRST")(
    P.near_valid_models_fail_with_their_code)
test_serialization_round_trip = pytest.mark.clause("WIRE-FIELDS", "WIRE-BINDINGS-FIELD")(
    P.serialization_round_trip)
test_catalogue_reordering_changes_nothing = pytest.mark.clause("CAT-REORDER")(
    P.catalogue_reordering_changes_nothing)
test_record_count_is_payload_length_over_element_size = pytest.mark.clause(
    "ENC-RECORD-COUNT", "ENC-NO-COUNT-IN-TYPE", "PAY-EMPTY")(P.record_count_is_payload_length_over_element_size)
test_encode_then_decode_within_rounding = pytest.mark.clause("AFF-DQ", "AFF-PACKING")(
    P.encode_then_decode_within_rounding)
test_encoded_and_decoded_computation_agree = pytest.mark.clause("AFF-DQ")(
    P.encoded_and_decoded_computation_agree)
test_executor_encoded_and_decoded_models_agree = pytest.mark.clause("GRAPH-STRUCT-IO", "DEC-KEYED")(
    P.executor_encoded_and_decoded_models_agree)


def test_properties_catch_a_wrong_oracle(monkeypatch):
    """The valid-model property is not vacuous: an off-by-one in the record count is detected."""
    from fuzz import checks
    from fuzz.models import gen_model
    from fuzz.source import RandomSource
    from reference_impl import verifier

    original = verifier._verify_struct_layout

    def wrong(value, path, extent, catalogue):
        info = original(value, path, extent, catalogue)
        info.record_count += 1
        return info

    monkeypatch.setattr(verifier, "_verify_struct_layout", wrong)
    caught = 0
    for seed in range(30):
        generated = gen_model(RandomSource(seed))
        try:
            checks.check_valid(generated, None if not generated.files else _dir(generated))
        except checks.Mismatch:
            caught += 1
    assert caught > 0


def _dir(generated):
    from fuzz.cases import scratch

    return scratch().populate(generated.files)

"""Parameters in every record (corpus/cases/structured/per_record_parameters.toml): the stated values are hand
arithmetic on the stated bytes, the reference passes the case, and it fails a decoder that applies the
first record's scale and zero point to every record."""

from __future__ import annotations

import functools
import struct

import numpy as np

from conformance.adapters.reference import ReferenceAdapter
from conformance.audit.fault import Fault, wrap
from conformance.cases import load_cases
from conformance.execute import FAILED, PASSED, run_case
from reference_impl import decoders

CASE_ID = "Recommended.Structured.SpecExamples.WithParametersTwoRecords"


@functools.cache
def _case():
    return next(case for case in load_cases() if case.id == CASE_ID)


class FirstRecordParameters(Fault):
    """Reads the per-record scale and zero point once, from the first record, and uses them for all."""

    fault_id = "ENC-PER-VALUE-PARAMS.first-record-parameters"

    def patches(self):
        def make(original):
            def field_or_constant(layout, payload, path):
                return original(layout, payload, path)[:1]
            return field_or_constant
        return [wrap(decoders, "_field_or_constant", make)]


def test_the_values_are_the_records_own_arithmetic():
    def record(scale: float, zero_point: int) -> bytes:
        return b"\x21" * 64 + struct.pack("<f", scale) + struct.pack("<q", zero_point)

    assert record(0.5, 0) + record(2.0, 1) in _case().model_bytes()
    values = np.asarray(_case().expect["values"]["data"], np.float32)
    assert values[:128].tolist() == [0.5, 1.0] * 64 and values[128:].tolist() == [0.0, 2.0] * 64


def test_the_reference_passes():
    result = run_case(_case(), ReferenceAdapter())
    assert result.verdict == PASSED, result.message


def test_first_record_parameters_fail_the_case():
    result = run_case(_case(), FirstRecordParameters())
    assert result.verdict == FAILED and not result.traceback, result.message

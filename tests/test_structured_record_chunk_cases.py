"""Sizes past any internal chunk, byte-encoded records (corpus/cases/structured/chunks.toml): the digests the
cases state are the builder's NumPy formulas, the reference passes every case, and each case fails at least
one runtime that reads records in chunks with one realistic bug: the partial last chunk of records
dropped, every chunk read from the payload's start, an external extent read from a page boundary."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from test_affine_chunk_cases import ExternalOffsetAlignedDown

from conformance.adapters.reference import ReferenceAdapter
from conformance.audit.fault import Fault, wrap
from conformance.cases import load_cases
from conformance.execute import FAILED, PASSED, run_case
from corpus.builders import encoding_chunks as formulas
from reference_impl import records

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


@functools.cache
def _cases() -> dict:
    return {case.id: case for case in load_cases() if case.builder == "record_chunks"}


def _after_read(change):
    """A read_leaf whose result (one row per record) ``change(rows)`` replaces."""
    def make(original):
        def read_leaf(payload, record_bits, leaf):
            return change(original(payload, record_bits, leaf))
        return read_leaf
    return make


class RecordTailDropped(Fault):
    """Reads more than ``chunk`` records in chunks, with ``for first in range(0, n - chunk + 1, chunk)``: the
    records of the partial last chunk are never read and stay zero (fewer records, read in one piece, are
    right)."""

    def __init__(self, chunk: int):
        super().__init__()
        self.chunk, self.fault_id = chunk, f"ENC-TIGHT.record-tail-dropped-{chunk}"

    def patches(self):
        def change(rows):
            if len(rows) > self.chunk:
                rows = rows.copy()
                rows[len(rows) - len(rows) % self.chunk:] = 0
            return rows
        return [wrap(records, "read_leaf", _after_read(change))]


class RecordChunksFromStart(Fault):
    """Reads records in chunks of ``chunk`` but computes each record's byte offset from its index within its
    chunk: every chunk reads the payload's first records again."""

    def __init__(self, chunk: int):
        super().__init__()
        self.chunk, self.fault_id = chunk, f"ENC-TIGHT.record-chunks-from-start-{chunk}"

    def patches(self):
        def change(rows):
            return rows[np.arange(len(rows)) % self.chunk]
        return [wrap(records, "read_leaf", _after_read(change))]


_FIELDS = "Required.Structured.Chunks.NineByteRecordFields1Mi"
_CODEBOOK = "Required.Structured.Chunks.CodebookTwelveByteRecords64Ki"
_EXTERNAL = "Required.Structured.Chunks.NineByteRecordFieldsExternalAtOddOffset"
CATCHERS = [
    (RecordTailDropped(1 << 16), (_FIELDS, _CODEBOOK, _EXTERNAL)),
    (RecordTailDropped(1 << 20), (_FIELDS,)),
    (RecordChunksFromStart(1 << 16), (_FIELDS, _CODEBOOK, _EXTERNAL)),
    (ExternalOffsetAlignedDown(4096), (_EXTERNAL,)),
]


def _digests(case) -> dict:
    if "fields_digest" in case.expect:
        return {name: spec["sha256"] for name, spec in case.expect["fields_digest"].items()}
    return {"": case.expect["values_digest"]["sha256"]}


@pytest.mark.parametrize("case_id", sorted(_cases()))
def test_the_stated_digests_are_the_formulas_and_the_reference_passes(case_id):
    case = _cases()[case_id]
    for name, digest in _digests(case).items():
        assert digest == formulas.expected_digest(field=name or None, **case.args), name
    result = run_case(case, ReferenceAdapter(), timeout=120)
    assert result.verdict == PASSED, result.message


@pytest.mark.parametrize(("fault", "case_ids"), CATCHERS, ids=[fault.fault_id for fault, _ in CATCHERS])
def test_a_record_chunking_bug_fails_its_cases(fault, case_ids):
    for case_id in case_ids:
        result = run_case(_cases()[case_id], fault, timeout=120)
        assert result.verdict == FAILED, f"{fault.fault_id} passes {case_id}"
        assert not result.traceback and "differ" in result.message, result.message


def test_every_case_fails_some_record_chunking_bug():
    listed = {case_id for _, case_ids in CATCHERS for case_id in case_ids}
    assert set(_cases()) == listed


def test_the_payload_is_the_fields_in_declaration_order_little_endian():
    """The builder's payload, read back by hand from the spec's rules (not by the oracle)."""
    count = 70001
    raw = np.frombuffer(formulas.record_payload(count), np.uint8).reshape(count, formulas.RECORD_BYTES)
    r = np.arange(count)
    assert np.array_equal(raw[:, 0].view(np.int8), formulas.field_at("a", r))
    assert np.array_equal(raw[:, 1].astype(np.uint16) | raw[:, 2].astype(np.uint16) << 8, formulas.field_at("b", r))
    c = sum(raw[:, 3 + k].astype(np.uint32) << np.uint32(8 * k) for k in range(4)).view(np.int32)
    assert np.array_equal(c, formulas.field_at("c", r))
    packed = raw[:, 7].astype(np.uint16) | raw[:, 8].astype(np.uint16) << 8
    assert np.array_equal(packed & 0x1F, formulas.field_at("p.x", r)[:, 0])
    assert np.array_equal(packed >> 5, formulas.field_at("p.y", r)[:, 0])
    assert len(np.unique(formulas.field_at("c", np.arange(1 << 21)))) == 1 << 21  # c is distinct for every record


def test_the_codebook_payload_holds_each_records_indices_then_its_scale():
    count = 40001
    raw = np.frombuffer(formulas.codebook_payload(count), np.uint8).reshape(count, 12)
    index = np.stack([(raw[:, :8] >> shift) & 3 for shift in (0, 2, 4, 6)], axis=-1).reshape(count, 32)
    scale = raw[:, 8:].copy().view("<f4")[:, 0]
    decoded = formulas.CODEBOOK[index] * scale[:, None]
    assert np.array_equal(decoded.reshape(-1).astype(np.float32), formulas.codebook_at(np.arange(count * 32)))

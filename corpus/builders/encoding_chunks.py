"""Byte-encoded records past any internal chunk: sizes past any internal chunk a runtime could read records
by (2^16 and 2^20 records, 64 KiB and 1 MiB of payload), with record sizes that are not powers of two (9
and 12 bytes), so records straddle every power-of-two chunk edge and the last chunk is partial.

Every record's fields depend on its position (``field_at``, ``codebook_at``): prime periods or values
distinct for every record, so a dropped, duplicated or shifted chunk of records, or a record index that
restarts after the first chunk, changes them. Expected values are these formulas, written from the spec
(fields in declaration order, tight, multi-byte values little-endian, bits least-significant first; the
codebook type 1102 flattens its decoded blocks in storage order), never the oracle's output: the cases
state SHA-256 digests (``expected_digest``; conformance/digests.py) and the builders add the expected
elements at the standard sample positions.
"""

from __future__ import annotations

import numpy as np

from conformance.digests import Digest, sample_indices
from reference_impl import schema

from . import builder
from .common import model, spec_catalogue

#: The record of the generic-field cases: INT8, UINT16, INT32 and a 16-bit packing of 5 + 11 bits, 9 bytes.
RECORD = '''structure {
  field { name: "a" type { tensor_type { elem_type: 3 shape { } } } }
  field { name: "b" type { tensor_type { elem_type: 4 shape { } } } }
  field { name: "c" type { tensor_type { elem_type: 6 shape { } } } }
  field { name: "p" type { struct_type { bit_packing { component { name: "x" bit_width: 5 }
                                                      component { name: "y" bit_width: 11 } dimension: 1 } } } }
}'''
RECORD_BYTES = 9
#: field -> (dtype, shape of one record's value)
FIELDS = {"a": ("int8", ()), "b": ("uint16", ()), "c": ("int32", ()), "p.x": ("uint8", (1,)),
          "p.y": ("uint16", (1,))}
FILLER = 0xA5
#: SCALED_CODEBOOK2_BLOCK_32: 32 two-bit indices (8 bytes) and a FLOAT scale, 12 bytes a record.
CODEBOOK = np.array([-1.0, -0.25, 0.25, 1.0])
CODEBOOK_PERIOD = 10007


# ------------------------------------------------------------------------------------------ formulas
def field_at(name: str, record: np.ndarray) -> np.ndarray:
    """Field ``name`` of record ``record``: a (period 251), b (period 65521), c (distinct for every record
    below 2^32: an odd multiplier modulo 2^32), p.x (period 31) and p.y (period 2039)."""
    r = np.asarray(record, dtype=np.int64)
    if name == "a":
        return (r % 251 - 125).astype(np.int8)
    if name == "b":
        return (r * 40503 % 65521).astype(np.uint16)
    if name == "c":
        return (r * 2654435761 % (1 << 32)).astype(np.uint32).view(np.int32)
    if name == "p.x":
        return (r % 31).astype(np.uint8)[..., None]
    if name == "p.y":
        return (r * 7 % 2039).astype(np.uint16)[..., None]
    raise KeyError(name)


#: the period of each field's formula (c has none below 2^32)
PERIODS = {"a": 251, "b": 65521, "p.x": 31, "p.y": 2039}


def _periodic(name: str, records: int) -> np.ndarray:
    """``field_at(name, arange(records))``, one period computed and tiled."""
    period = PERIODS[name]
    one = field_at(name, np.arange(min(period, records)))
    return np.tile(one, (-(-records // period),) + (1,) * (one.ndim - 1))[:records]


def record_payload(records: int) -> bytes:
    """``records`` records of ``RECORD``, densely in order: fields in declaration order, no padding,
    little-endian, the bit packing's x in the low 5 bits of its 16."""
    layout = np.dtype([("a", "i1"), ("b", "<u2"), ("c", "<i4"), ("p", "<u2")])
    assert layout.itemsize == RECORD_BYTES
    table = np.empty(records, layout)
    table["a"] = _periodic("a", records)
    table["b"] = _periodic("b", records)
    table["c"] = (np.arange(records, dtype=np.uint32) * np.uint32(2654435761)).view(np.int32)  # mod 2^32
    table["p"] = _periodic("p.x", records)[:, 0].astype(np.uint16) | (_periodic("p.y", records)[:, 0] << 5)
    return table.tobytes()


def codebook_index_at(element: np.ndarray) -> np.ndarray:
    """The codebook index of flat element ``element``: a quadratic residue pattern of prime period."""
    j = np.asarray(element, dtype=np.int64) % CODEBOOK_PERIOD
    return (7 * j * j + 3 * j + 1) % CODEBOOK_PERIOD % 4


def codebook_scale_at(record: np.ndarray) -> np.ndarray:
    """Record ``record``'s FLOAT scale: positive normal numbers, distinct for 8191 consecutive records."""
    step = (np.asarray(record, dtype=np.int64) * 1237 + 611) % 8191
    return (0x3C000000 + step * 1021).astype(np.uint32).view(np.float32)


def codebook_at(element: np.ndarray) -> np.ndarray:
    """Flat element ``element`` of the decoded 1102 value: scale * codebook[index] of its record (element
    // 32), exact in FLOAT (the codebook entries are powers of two)."""
    element = np.asarray(element, dtype=np.int64)
    return (CODEBOOK[codebook_index_at(element)] * codebook_scale_at(element // 32)).astype(np.float32)


def codebook_payload(records: int) -> bytes:
    """Records of 1102: each the 8 bytes of its 32 indices (least-significant bits first), then its scale."""
    # the indices repeat every CODEBOOK_PERIOD elements, so their bytes (four indices each) every
    # CODEBOOK_PERIOD bytes: one period is packed and tiled
    index = codebook_index_at(np.arange(4 * CODEBOOK_PERIOD)).reshape(-1, 4)
    period = (index[:, 0] | index[:, 1] << 2 | index[:, 2] << 4 | index[:, 3] << 6).astype(np.uint8)
    codes = np.tile(period, -(-records * 8 // CODEBOOK_PERIOD))[:records * 8].reshape(records, 8)
    scale = codebook_scale_at(np.arange(records)).astype("<f4").view(np.uint8).reshape(records, 4)
    return np.concatenate([codes, scale], axis=1).tobytes()


def expected_digest(kind: str, records: int, field: str | None = None, part: int = 1 << 20, **_) -> str:
    """SHA-256 of a whole expected field (``kind = "fields"``) or decoded value (``"codebook"``)."""
    if kind == "fields":
        dtype = FIELDS[field][0]
        digest, count, at = Digest(dtype), records, lambda index: field_at(field, index)
    else:
        digest, count, at = Digest(np.float32), records * 32, codebook_at
    for start in range(0, count, part):
        digest.update(at(np.arange(start, min(start + part, count))))
    return digest.hexdigest()


# ------------------------------------------------------------------------------------------ builders
def _place(value, payload: bytes, external: dict | None, files: dict) -> None:
    if external is None:
        value.raw_data = payload
        return
    offset = int(external["offset"])
    value.data_location = 1
    value.external_data.add(key="location", value="records.bin")
    value.external_data.add(key="offset", value=str(offset))
    value.external_data.add(key="length", value=str(len(payload)))
    files["records.bin"] = bytes([FILLER]) * offset + payload + bytes([FILLER]) * 7


@builder
def record_chunks(kind: str, records: int, external: dict | None = None):
    """``kind = "fields"``: value "v" of ``records`` inline ``RECORD`` records, read by generic field access.
    ``kind = "codebook"``: value "v" of ``records`` SCALED_CODEBOOK2_BLOCK_32 records with a flat FLOAT
    logical type of ``records * 32`` elements. ``external = {offset}``: the payload sits at that offset of
    ``records.bin``, between filler bytes."""
    m = model("record_chunks")
    files: dict = {}
    value = m.graph.encoded_initializer.add(name="v")  # filled in place: appending would copy the payload
    if kind == "fields":
        value.struct_type.CopyFrom(schema.parse_text(RECORD, "StructTypeProto"))
        _place(value, record_payload(records), external, files)
        index = sample_indices(records)
        samples = {name: {"index": index, "values": field_at(name, index)[:, 0] if shape else field_at(name, index)}
                   for name, (_, shape) in FIELDS.items()}
        # a (records, 1) field is sampled by flat index, which for one column is the record index
        return {"model": m, "files": files, "field_samples": samples}
    m.struct_types.extend(spec_catalogue())
    value.struct_type.type_ref = 1102
    tensor = value.logical_type.tensor_type
    tensor.elem_type = 1
    tensor.shape.dim.add(dim_value=records * 32)
    _place(value, codebook_payload(records), external, files)
    index = sample_indices(records * 32)
    return {"model": m, "files": files, "samples": {"index": index, "values": codebook_at(index)}}

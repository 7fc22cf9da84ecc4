"""Sizes past any internal chunk, affine values (corpus/cases/affine/chunks.toml and the affine rows of
external_chunks.toml): the digests the cases state are the builder's NumPy formulas, the reference passes
every case, and each case fails at least one runtime that chunks its work with one realistic bug: the
partial last chunk dropped or decoded from the previous chunk's start, parameter indices restarting in
every chunk, the later pieces of one axis position's long run decoded from the run's start, the codes of
the last partial byte (or of a scalar remainder loop) read most-significant first, an external extent read
from its offset rounded down to a page or to 1 MiB."""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np
import pytest

from conformance.adapters.reference import ReferenceAdapter
from conformance.audit.fault import Fault, wrap
from conformance.cases import load_cases
from conformance.execute import FAILED, PASSED, run_case
from corpus.builders import affine_chunks as formulas
from reference_impl import affine, dtypes, payload

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

SOURCES = ("cases/affine/chunks.toml", "cases/external/chunks.toml")


@functools.cache
def _cases() -> dict:
    return {case.id: case for case in load_cases() if case.source in SOURCES and case.builder == "affine_chunks"}


# ---------------------------------------------------------------------------------- faulty runtimes
def _finish(result: np.ndarray, out):
    if out is None:
        return result
    out[...] = result
    return out


def _after_decode(change):
    """A dequantize whose result ``change(flat, storage_type, shape)`` edits in place."""
    def make(original):
        def dequantize(codes, storage_type, scale, zero_point, axis, block_size, shape, output_dtype=None, out=None):
            result = original(codes, storage_type, scale, zero_point, axis, block_size, shape, output_dtype)
            change(result.reshape(-1))
            return _finish(result, out)
        return dequantize
    return make


class TailDropped(Fault):
    """Decodes a value larger than ``chunk`` elements in chunks, with ``for start in range(0, n - chunk + 1,
    chunk)``: the partial last chunk is never decoded and its output stays zero (smaller values, decoded in
    one piece, are right)."""

    def __init__(self, chunk: int):
        super().__init__()
        self.chunk, self.fault_id = chunk, f"AFF-DQ.tail-dropped-{chunk}"

    def patches(self):
        def change(flat):
            if len(flat) > self.chunk:
                flat[len(flat) - len(flat) % self.chunk:] = 0
        return [wrap(affine, "dequantize", _after_decode(change))]


class TailDuplicated(Fault):
    """Decodes in chunks of ``chunk`` elements but does not advance its pointers for the partial last chunk:
    it decodes the previous chunk's first elements again."""

    def __init__(self, chunk: int):
        super().__init__()
        self.chunk, self.fault_id = chunk, f"AFF-DQ.tail-duplicated-{chunk}"

    def patches(self):
        def change(flat):
            full = len(flat) - len(flat) % self.chunk
            if full >= self.chunk:
                flat[full:] = flat[full - self.chunk:full - self.chunk + len(flat) - full].copy()
        return [wrap(affine, "dequantize", _after_decode(change))]


def _parameter_index(index: np.ndarray, shape, axis, block) -> np.ndarray:
    dim, inner = shape[axis], math.prod(shape[axis + 1:])
    position = index // inner % dim
    if not block:
        return position
    return (index // (dim * inner) * -(-dim // block) + position // block) * inner + index % inner


class ParameterIndexPerChunk(Fault):
    """Decodes in chunks of ``chunk`` elements and computes each element's per-axis or blocked parameter
    index from its offset within its chunk, as if every chunk began the tensor: right in the first chunk."""

    def __init__(self, chunk: int):
        super().__init__()
        self.chunk, self.fault_id = chunk, f"AFF-AXIS.parameter-index-per-chunk-{chunk}"

    def patches(self):
        def make(original):
            def dequantize(codes, storage_type, scale, zero_point, axis, block_size, shape, output_dtype=None,
                           out=None):
                if axis is None:
                    return original(codes, storage_type, scale, zero_point, axis, block_size, shape, output_dtype,
                                    out=out)
                count = math.prod(shape)
                local = np.arange(count, dtype=np.int64) % self.chunk
                p = _parameter_index(local, tuple(shape), axis, block_size)
                scales = np.asarray(scale).reshape(-1)[p]
                zeros = None if zero_point is None else np.asarray(zero_point).reshape(-1)[p]
                result = original(codes, storage_type, scales, zeros, 0, 1, (count,), output_dtype)
                return _finish(result.reshape(shape), out)
            return dequantize
        return [wrap(affine, "dequantize", make)]


class PieceFromRunStart(Fault):
    """Splits each axis position's run of ``inner`` consecutive elements (per-axis or blocked along an axis
    that is not the last) into pieces of ``piece`` elements, but decodes every piece after the first from
    the run's start (its codes and parameters addressed without the piece's offset in the run)."""

    def __init__(self, piece: int):
        super().__init__()
        self.piece, self.fault_id = piece, f"AFF-AXIS.long-run-piece-from-run-start-{piece}"

    def patches(self):
        def make(original):
            def dequantize(codes, storage_type, scale, zero_point, axis, block_size, shape, output_dtype=None,
                           out=None):
                result = original(codes, storage_type, scale, zero_point, axis, block_size, shape, output_dtype)
                inner = math.prod(shape[axis + 1:]) if axis is not None else 1
                if inner > self.piece:
                    runs = result.reshape(-1, inner)
                    for start in range(self.piece, inner, self.piece):
                        stop = min(start + self.piece, inner)
                        runs[:, start:stop] = runs[:, :stop - start].copy()
                return _finish(result, out)
            return dequantize
        return [wrap(affine, "dequantize", make)]


def _reverse_codes(raw: np.ndarray, width: int) -> np.ndarray:
    """Each byte's codes in the opposite order (most-significant first)."""
    per_byte, mask = 8 // width, (1 << width) - 1
    reversed_ = np.zeros_like(raw)
    for slot in range(per_byte):
        reversed_ |= ((raw >> (width * slot)) & mask) << (width * (per_byte - 1 - slot))
    return reversed_


class RemainderCodesReversed(Fault):
    """Unpacks four- and two-bit codes with a vector loop over ``group`` codes and a scalar loop for the
    codes after the last whole group, which reads each byte's codes most-significant first.
    ``group = None``: only the codes of a partial last byte are read so."""

    def __init__(self, group: int | None):
        super().__init__()
        self.group, self.fault_id = group, f"AFF-PACKING.remainder-codes-reversed-{group or 'last-byte'}"

    def patches(self):
        def make(original):
            def dequantize(codes, storage_type, scale, zero_point, axis, block_size, shape, output_dtype=None,
                           out=None):
                width = dtypes.BIT_WIDTH[storage_type]
                count = math.prod(shape)
                per_byte = 8 // width
                if width < 8 and (count % per_byte if self.group is None else count % self.group):
                    raw = np.array(np.frombuffer(codes, np.uint8) if isinstance(codes, (bytes, bytearray))
                                   else np.asarray(codes, np.uint8).reshape(-1))
                    first = count // per_byte if self.group is None else count // self.group * self.group // per_byte
                    raw[first:] = _reverse_codes(raw[first:], width)
                    codes = raw
                return original(codes, storage_type, scale, zero_point, axis, block_size, shape, output_dtype,
                                out=out)
            return dequantize
        return [wrap(affine, "dequantize", make)]


class ExternalOffsetAlignedDown(Fault):
    """Reads an external extent from its offset rounded down to a multiple of ``alignment`` (a mapping must
    start on a page), forgetting to skip the bytes between that boundary and the offset."""

    def __init__(self, alignment: int):
        super().__init__()
        self.alignment, self.fault_id = alignment, f"PAY-EXTERNAL-EXTENT.offset-aligned-down-{alignment}"

    def patches(self):
        def make(original):
            def open_payload(value, extent, base_dir, path):
                if extent.external:
                    extent = dataclasses.replace(extent, offset=extent.offset - extent.offset % self.alignment)
                return original(value, extent, base_dir, path)
            return open_payload
        return [wrap(payload, "open_payload", make)]


def _ids(*names: str) -> tuple[str, ...]:
    return tuple(name if name.startswith("Required.") else f"Required.Affine.Chunks.{name}" for name in names)


_STORAGES = ("Int8", "Uint8", "Int4", "Uint4", "Int2", "Uint2")
_SUB_BYTE = ("Int4", "Uint4", "Int2", "Uint2")
#: each faulty runtime -> new cases it must fail (together they list every case)
CATCHERS = [
    (TailDropped(1 << 16), _ids(*(f"{s}PerTensor1Mi" for s in _STORAGES), "Int2BlockedFirst16Mi")),
    (TailDropped(1 << 20), _ids(*(f"{s}BlockedFirst1Mi" for s in _STORAGES), "Uint8PerTensor16Mi")),
    (TailDuplicated(1 << 16), _ids(*(f"{s}PerAxisLast1Mi" for s in _STORAGES), "Int8PerAxisLast16Mi")),
    (TailDuplicated(1 << 20), _ids("Uint4PerAxisFirst16Mi", "Uint8PerTensor1Mi")),
    (ParameterIndexPerChunk(1 << 16), _ids(*(f"{s}PerAxisInner1Mi" for s in _STORAGES),
                                           *(f"{s}BlockedLast1Mi" for s in _STORAGES))),
    (ParameterIndexPerChunk(1 << 20), _ids("Int4BlockedLast16Mi", "Uint2PerAxisInner16Mi", "Int8PerAxisLast16Mi")),
    (RemainderCodesReversed(None), _ids(*(f"{s}PerTensor1Mi" for s in _SUB_BYTE), "Int4BlockedLast16Mi",
                                        "Uint2PerAxisInner16Mi")),
    (RemainderCodesReversed(64), _ids(*(f"{s}BlockedLast1Mi" for s in _SUB_BYTE), "Int2BlockedFirst16Mi")),
    (PieceFromRunStart(1 << 19), _ids("Int4PerAxisLongRows1Mi", "Uint8BlockedLongRows1Mi")),
    (ExternalOffsetAlignedDown(4096), ("Required.External.Chunks.Uint8PerTensor16MiAtUnalignedOffset",
                                       "Required.External.Chunks.Int4BlockedLast1MiAtOddOffset",
                                       "Required.External.Chunks.Uint2PerAxisInner1MiAtOffsetThree")),
    (ExternalOffsetAlignedDown(1 << 20), ("Required.External.Chunks.Uint8PerTensor16MiAtUnalignedOffset",
                                          "Required.External.Chunks.Int4BlockedLast1MiAtOddOffset")),
]


# ------------------------------------------------------------------------------------------ tests
@pytest.mark.parametrize("case_id", sorted(_cases()))
def test_the_stated_digest_is_the_formula_and_the_reference_passes(case_id):
    case = _cases()[case_id]
    assert case.expect["values_digest"]["sha256"] == formulas.expected_digest(**case.args)
    result = run_case(case, ReferenceAdapter(), timeout=120)
    assert result.verdict == PASSED, result.message


@pytest.mark.parametrize(("fault", "case_ids"), CATCHERS, ids=[fault.fault_id for fault, _ in CATCHERS])
def test_a_chunking_bug_fails_its_cases(fault, case_ids):
    for case_id in case_ids:
        result = run_case(_cases()[case_id], fault, timeout=120)
        assert result.verdict == FAILED, f"{fault.fault_id} passes {case_id}"
        # a wrong value (or a valid value refused), not a crash of the faulty runtime itself
        assert not result.traceback and ("differ" in result.message or "rejected" in result.message), result.message


def test_every_case_fails_some_chunking_bug():
    listed = {case_id for _, case_ids in CATCHERS for case_id in case_ids}
    assert set(_cases()) <= listed, sorted(set(_cases()) - listed)
    assert listed <= set(_cases())


def test_every_count_is_odd_and_past_its_size_class():
    for case in _cases().values():
        count = math.prod(case.args["shape"])
        assert count % 2 == 1
        assert count > (1 << 24 if case.args["scale_type"] == 10 else 1 << 20)
        assert count * np.dtype(formulas.OUTPUT[case.args["scale_type"]]).itemsize < 1 << 26  # the testee frame


@pytest.mark.parametrize("storage", sorted(formulas.WIDTH))
def test_the_tiled_payload_is_the_packed_codes(storage):
    """The builder packs one period of codes and tiles it; that is the codes packed one by one."""
    for count in (1, 3, 10007 * 2 + 5, (1 << 20) + (1 << 12) + 7):
        codes = formulas.code_at(np.arange(count), storage)
        assert np.array_equal(formulas.packed_codes(storage, count), formulas.pack(codes, formulas.WIDTH[storage]))


def test_the_formulas_agree_with_onnx_dequantize_linear():
    """On a small value of each form, the formulas give what onnx's reference DequantizeLinear gives."""
    from onnx import TensorProto, helper, numpy_helper
    from onnx.reference import ReferenceEvaluator

    for storage, shape, axis, block in ((3, [5, 7], None, None), (21, [5, 7], 1, None), (22, [5, 7], 0, 2),
                                        (26, [3, 5, 7], 1, None), (25, [5, 7], 1, 3)):
        params = formulas.parameter_shape(tuple(shape), axis, block)
        p = np.arange(math.prod(params)).reshape(params)
        count = math.prod(shape)
        x = helper.make_tensor("x", storage, shape, formulas.pack(formulas.code_at(np.arange(count), storage),
                                                                  formulas.WIDTH[storage]).tobytes(), raw=True)
        zero = helper.make_tensor("z", storage, list(params), formulas.pack(formulas.zero_point_at(p, storage),
                                                                           formulas.WIDTH[storage]).tobytes(), raw=True)
        scale = numpy_helper.from_array(formulas.scale_at(p, 1), "s")
        attrs = {"axis": axis} if axis is not None else {}
        if block:
            attrs["block_size"] = block
        node = helper.make_node("DequantizeLinear", ["x", "s", "z"], ["y"], **attrs)
        graph = helper.make_graph([node], "dq", [], [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
                                  [x, scale, zero])
        onnx_model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 25)])
        want = ReferenceEvaluator(onnx_model).run(None, {})[0]
        got = formulas.expected_at(np.arange(count), storage, shape, axis, block).reshape(shape)
        assert np.array_equal(got, want), (storage, shape, axis, block)


class _Shifted:
    """Decodes the value and moves every element after the 2^16-th one place later (a misplaced chunk)."""

    def decode(self, model_bytes, value_name, base_dir):
        import reference_impl

        out = reference_impl.decode(model_bytes, value_name, base_dir=base_dir).copy()
        flat = out.reshape(-1)
        flat[(1 << 16) + 1:] = flat[1 << 16:-1].copy()
        return out


def test_a_failure_names_the_first_differing_element_and_its_region():
    case = _cases()["Required.Affine.Chunks.Int4BlockedLast1Mi"]
    result = run_case(case, _Shifted())
    assert result.verdict == FAILED
    assert "element 65537 [63, 584] (around 2^16 = 65536)" in result.message
    assert case.expect["values_digest"]["sha256"] in result.expected

"""The cases of corpus/cases/structured/leaf_offsets.toml, written where the records shard of the mutation run
(docs/audit/mutation.md) found no case with a byte-aligned BOOL leaf, with a sub-byte array or a byte-wide leaf at
an odd bit offset, with byte-wide leaves repeating at a 9-bit stride, with a nibble array that does not start at
the record's first byte, or with a field whose referenced declaration is an array of scalars. The reference passes
them, and each fails a runtime whose byte or nibble shortcut ignores where the leaf really is, or which names the
referenced array's values wrongly, written here as faults."""

from __future__ import annotations

import functools

import numpy as np
from fault_catchers import wrong_runtime_tests

from conformance.audit.fault import Fault, wrap
from conformance.cases import load_cases
from reference_impl import dtypes, records

_SOURCE = "leaf_offsets.toml"
_BOOLS = "Required.Structured.Fields.ByteAlignedBools"
_ODD = "Required.Structured.Fields.Int4ArraysAtOddBitOffsets"
_NINE = "Required.Structured.Fields.ArrayOfNineBitElements"
_AFTER_BYTE = "Required.Structured.Fields.Int4ArrayAfterAByte"
_REFERENCED = "Required.Structured.Fields.FieldOfAReferencedArray"
_SUB_BYTE = (dtypes.INT4, dtypes.UINT4, dtypes.INT2, dtypes.UINT2)


@functools.cache
def _cases() -> dict:
    return {case.id: case for case in load_cases() if case.source.endswith(_SOURCE)}


class BoolLeafReadAsByte(Fault):
    """Returns a byte-aligned BOOL leaf as the byte it is stored in (an integer 0 or 1), not as a truth value."""

    fault_id = "ENC-LEAVES.bool-leaf-read-as-byte"

    def patches(self):
        def make(original):
            def read_aligned(matrix, leaf):
                if leaf.elem_type == dtypes.BOOL and leaf.offset % 8 == 0 and not leaf.dims:
                    return np.ascontiguousarray(matrix[:, leaf.offset // 8])
                return original(matrix, leaf)
            return read_aligned
        return [wrap(records, "_read_aligned", make)]


class BitOffsetsFlooredToBytes(Fault):
    """Reads every leaf as if it started, and repeated, on the byte boundary at or below its bit position: the
    shortcut of a reader that keeps positions in bytes."""

    fault_id = "ENC-UNALIGNED.bit-offsets-floored-to-bytes"

    def patches(self):
        def make(original):
            def read_aligned(matrix, leaf):
                if leaf.elem_type is None:
                    return original(matrix, leaf)
                dims = tuple((count, stride - stride % 8 if stride >= 8 else stride) for count, stride in leaf.dims)
                return original(matrix, leaf._replace(offset=leaf.offset - leaf.offset % 8, dims=dims))
            return read_aligned
        return [wrap(records, "_read_aligned", make)]


class NibbleArraysFromRecordStart(Fault):
    """Unpacks a 4- or 2-bit array from the record's first byte, wherever the array starts."""

    fault_id = "ENC-TIGHT.nibble-arrays-from-record-start"

    def patches(self):
        def make(original):
            def read_aligned(matrix, leaf):
                if leaf.elem_type in _SUB_BYTE and leaf.offset % 8 == 0:
                    return original(matrix, leaf._replace(offset=0))
                return original(matrix, leaf)
            return read_aligned
        return [wrap(records, "_read_aligned", make)]


class ReferencedLeafNamedWithTrailingDot(Fault):
    """Names the values of a field whose referenced declaration has no field names of its own (an array of
    scalars) by joining the field's name and the empty inner name with a dot, "codes." instead of "codes"."""

    fault_id = "ENC-TIGHT.referenced-leaf-named-with-trailing-dot"

    def patches(self):
        def make(original):
            def place(relative, prefix, offset, dims, layout, path):
                original(relative, prefix, offset, dims, layout, path)
                if prefix and prefix in layout.leaves and any(not leaf.path for leaf in relative.leaves.values()):
                    leaf = layout.leaves.pop(prefix)
                    layout.leaves[prefix + "."] = leaf._replace(path=prefix + ".")
            return place
        return [wrap(records, "_place", make)]


CATCHERS = [(BoolLeafReadAsByte(), (_BOOLS,)), (BitOffsetsFlooredToBytes(), (_ODD, _NINE)),
            (NibbleArraysFromRecordStart(), (_AFTER_BYTE,)), (ReferencedLeafNamedWithTrailingDot(), (_REFERENCED,))]


test_the_reference_passes, test_the_bug_fails_its_cases, test_every_case_fails_some_bug = \
    wrong_runtime_tests(_cases, 5, CATCHERS)

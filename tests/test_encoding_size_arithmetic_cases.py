"""Size-table rows of corpus/cases/encoding/structs.toml at the edges of the arithmetic: a root of exactly
2**64 - 1 bits (the largest uint64, so no overflow: refused only because it is not a whole number of bytes),
reached by a product and by a sum, and a structure whose constant field comes first (zero bits, the fields
after it still count). The sizes are worked out here by hand from the spec's size table; the reference passes
each row, and each fails a runtime with one plausible bug, written here as a small fault."""

from __future__ import annotations

import functools

from fault_catchers import wrong_runtime_tests

from conformance.audit.fault import Fault, wrap
from conformance.cases import load_cases
from reference_impl import structs
from reference_impl.errors import ErrorCode as E
from reference_impl.errors import violation

UINT64_MAX = (1 << 64) - 1
_PRODUCT = "Required.Encoding.Eligibility.BitPackingOfUint64MaxBits"
_SUM = "Required.Encoding.Eligibility.FieldsSumToUint64MaxBits"
_CONSTANT_FIRST = "Required.Encoding.Records.ConstantFieldFirst"


@functools.cache
def _cases() -> dict:
    return {case.id: case for case in load_cases() if case.id in (_PRODUCT, _SUM, _CONSTANT_FIRST)}


def _checked(symbol: str):
    """A checked operation that refuses a result of UINT64_MAX too (``>=`` for ``>``)."""
    def make(original):
        def checked(a, b, path):
            if (a * b if symbol == "*" else a + b) >= UINT64_MAX:
                raise violation(E.SIZE_OVERFLOW, path, f"{a} {symbol} {b} overflows uint64")
            return original(a, b, path)
        return checked
    return make


class ProductAtUint64MaxOverflows(Fault):
    """Its checked multiplication refuses a product equal to UINT64_MAX (it keeps the largest value as a sentinel)."""

    fault_id = "ENC-OVERFLOW.product-at-max-overflows"

    def patches(self):
        return [wrap(structs, "checked_mul", _checked("*"))]


class SumAtUint64MaxOverflows(Fault):
    """Its checked addition refuses a sum equal to UINT64_MAX."""

    fault_id = "ENC-OVERFLOW.sum-at-max-overflows"

    def patches(self):
        return [wrap(structs, "checked_add", _checked("+"))]


class SizeStopsAtConstant(Fault):
    """Sums a structure's fields up to its first constant field: what follows a constant is not counted."""

    fault_id = "ENC-SIZE-TABLE.size-stops-at-constant"

    def transform(self, model, base_dir):
        for decl in model.struct_types:
            fields = decl.structure.field
            first = next((i for i, f in enumerate(fields) if f.WhichOneof("content") == "constant"), None)
            if decl.WhichOneof("kind") == "structure" and first is not None:
                del fields[first + 1:]


CATCHERS = [
    (ProductAtUint64MaxOverflows(), (_PRODUCT,)),
    (SumAtUint64MaxOverflows(), (_SUM,)),
    (SizeStopsAtConstant(), (_CONSTANT_FIRST,)),
]


def test_the_roots_are_uint64_max_bits_and_the_constant_first_record_three_bytes():
    assert 18446744073709551615 * 1 == UINT64_MAX and UINT64_MAX % 8 == 7  # one 1-bit component, 2**64 - 1 times
    assert 18446744073709551614 * 1 + 1 * 1 == UINT64_MAX  # fields a (2**64 - 2 bits) and b (1 bit)
    assert 0 + 8 + 16 == 3 * 8  # constant c (0 bits), UINT8 a, UINT16 b: 6 payload bytes are two records


test_the_reference_passes, test_the_bug_fails_its_cases, test_every_case_fails_some_bug = \
    wrong_runtime_tests(_cases, 3, CATCHERS)

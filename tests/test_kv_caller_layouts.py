"""The cases of corpus/cases/kv/caller_layouts.toml: the reference passes every one (keeping what it can hold
and refusing the rest), and a runtime that reads a caller's q, k, v or cache buffer by its raw bytes fails
the cases of that layout: one ignoring strides (the bytes from the buffer's lowest address read as
C-contiguous) and one ignoring byte order (the bytes read with the native element type)."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from test_zero_copy_layouts import ReadsBytesAsNative, _Preprocessing

from conformance import layouts
from conformance.adapters.reference import ReferenceAdapter
from conformance.cases import load_cases
from conformance.execute import FAILED, PASSED, run_case
from conformance.trace import Trace

REQ, REC = "Required.KV.CallerLayouts.", "Recommended.KV.CallerLayouts."
LAYOUTS = ("ByteSwapped", "Reversed", "Strided", "Misaligned", "ViewOfView", "ReadOnly", "ReadOnlyViewOfView")


@functools.cache
def _cases() -> dict:
    return {case.id: case for case in load_cases() if case.source == "cases/kv/caller_layouts.toml"}


def _ids(layout: str) -> set[str]:
    """Every case of ``layout``: the cache at open and reset (Required), the q, k and v feeds (Recommended)."""
    return {REQ + f"{layout}{entry}" for entry in ("InitialCache", "ResetCache")} | \
        {REC + f"{layout}{feed}Feed" for feed in "QKV"}


def _failed(adapter) -> set[str]:
    return {case_id for case_id in sorted(_cases()) if run_case(_cases()[case_id], adapter).verdict == FAILED}


class IgnoresStrides(_Preprocessing):
    """Reads a caller's array as its bytes from the lowest address the array touches, laid out C-contiguous
    (as a runtime taking the data pointer and the shape, but not the strides)."""

    def change(self, array):
        if array.flags.c_contiguous:
            return array
        owner = array
        while isinstance(owner.base, np.ndarray):
            owner = owner.base
        start = _lowest(array) - _lowest(owner)
        raw = owner.reshape(-1).view(np.uint8)[start:start + array.nbytes]
        return raw.view(array.dtype).reshape(array.shape)


def _lowest(array: np.ndarray) -> int:
    """The lowest address an array's elements occupy."""
    offset = sum((n - 1) * stride for n, stride in zip(array.shape, array.strides) if stride < 0 and n)
    return array.__array_interface__["data"][0] + offset


def test_the_cases_are_there():
    assert set(_cases()) == set().union(*(_ids(layout) for layout in LAYOUTS))


def test_every_case_passes_on_the_reference():
    assert {i for i in sorted(_cases()) if run_case(_cases()[i], ReferenceAdapter()).verdict != PASSED} == set()


def test_the_reference_refuses_the_caches_it_cannot_hold_and_keeps_the_rest(monkeypatch):
    """Both outcomes of the Required cases are exercised by the reference itself."""
    seen: dict[str, bool] = {}
    original = Trace.judge

    def judge(self, outcome, step, what):
        if step.get("optional"):
            seen.setdefault(self.case.id, outcome.rejected is not None)
        return original(self, outcome, step, what)

    monkeypatch.setattr(Trace, "judge", judge)
    for case_id in sorted(_cases()):
        if case_id.startswith(REQ):
            run_case(_cases()[case_id], ReferenceAdapter())
    refused = {case_id for case_id, rejected in seen.items() if rejected}
    assert {REQ + "ByteSwappedInitialCache", REQ + "ReversedResetCache", REQ + "StridedInitialCache"} <= refused
    assert not refused & {REQ + "MisalignedInitialCache", REQ + "ViewOfViewResetCache", REQ + "ReadOnlyInitialCache"}


@pytest.mark.parametrize(("fault", "wrong"), [
    (IgnoresStrides, ("Reversed", "Strided")),
    (ReadsBytesAsNative, ("ByteSwapped",)),
], ids=lambda item: item.__name__ if isinstance(item, type) else "")
def test_a_raw_reading_of_a_caller_buffer_fails_exactly_the_cases_of_its_layouts(fault, wrong):
    assert _failed(fault()) == set().union(*(_ids(layout) for layout in wrong))


def test_ignoring_strides_reads_other_values():
    """The wrong reading above gives other numbers for the strided and reversed layouts, the same for the
    contiguous ones."""
    plain = np.arange(24, dtype=np.float32).reshape(1, 2, 3, 4)
    read = IgnoresStrides().change
    for keys in ({"reversed": True}, {"offset": 1}, {"window": True}):
        arranged = layouts.arrange(plain.copy(), keys)
        assert np.array_equal(read(arranged), plain) == (not keys.get("reversed")), keys
    strided = np.repeat(plain.reshape(-1), 2).reshape(1, 2, 3, 8)[..., ::2]
    assert np.array_equal(strided, plain) and not np.array_equal(read(strided), plain)

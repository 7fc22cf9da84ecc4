"""The cases of corpus/cases/zero_copy/layouts.toml: the reference passes every one, a runtime that keeps
each layout as it is passes the Required ones, and each plausible wrong way of taking a caller's buffer
fails some: normalizing it to a native, aligned, contiguous, writable copy; copying every view;
reading a byte-swapped buffer as if it were native; and taking a zero-element buffer for a missing one."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import pytest

from conformance import layouts
from conformance import values as V
from conformance.adapters import Rejected
from conformance.adapters.reference import ReferenceAdapter, ReferenceState
from conformance.cases import load_cases
from conformance.execute import FAILED, PASSED, run_case

REQ = "Required.ZeroCopy.CallerLayouts."
REC = "Recommended.ZeroCopy.CallerLayouts."


@functools.cache
def _cases() -> dict:
    return {case.id: case for case in load_cases() if case.source == "cases/zero_copy/layouts.toml"}


def _map(values: dict, change) -> dict:
    return {name: change(value) if isinstance(value, np.ndarray) else value for name, value in values.items()}


class _Preprocessing(ReferenceAdapter):
    """The reference, with every caller array passed through ``change`` before the state sees it."""

    def change(self, array: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def open_state(self, model_bytes, initial, base_dir=None):
        opened = super().open_state(model_bytes, _map(initial, self.change), base_dir)
        return _PreprocessedState(opened.state, opened.slot, self.change)


class _PreprocessedState(ReferenceState):
    def __init__(self, state, slot, change) -> None:
        super().__init__(state, slot)
        self.change = change

    def run(self, feeds: dict[str, Any]) -> dict[str, Any]:
        return super().run(_map(feeds, self.change))

    def reset(self, initial: dict[str, Any]) -> None:
        super().reset(_map(initial, self.change))


class NormalizesCallerBuffers(_Preprocessing):
    """Makes every caller array native, aligned, C-contiguous and writable (``np.require``-style), which
    copies exactly the layouts it was not already in, and never says so."""

    def change(self, array):
        native = array.astype(array.dtype.newbyteorder("=")) if not array.dtype.isnative else array
        return np.require(native, requirements=["C", "A", "W"])


class CopiesViews(_Preprocessing):
    """Owns every buffer it keeps: an array that is a view of another (``base`` set) is copied first."""

    def change(self, array):
        return array.copy() if array.base is not None else array


class CopiesEveryBuffer(_Preprocessing):
    """Keeps a private copy of every caller array (as a runtime converting each input into its own tensor)."""

    def change(self, array):
        return array.copy()


class ReadsBytesAsNative(_Preprocessing):
    """Takes the caller's bytes with the native element type, whatever the array's byte order."""

    def change(self, array):
        return array.view(array.dtype.newbyteorder("=")) if not array.dtype.isnative else array


class EmptyIsMissing(_Preprocessing):
    """Treats a zero-element initial value as none supplied."""

    def open_state(self, model_bytes, initial, base_dir=None):
        _refuse_empty(initial)
        return super().open_state(model_bytes, initial, base_dir)

    def change(self, array):
        return array


def _refuse_empty(values: dict) -> None:
    for name, value in values.items():
        if isinstance(value, np.ndarray) and value.size == 0:
            raise Rejected("STATE_INITIAL_MISSING", f"{name}: no initial contents")


class EmptyResetIsMissing(EmptyIsMissing):
    def open_state(self, model_bytes, initial, base_dir=None):
        opened = ReferenceAdapter.open_state(self, model_bytes, initial, base_dir)
        return _EmptyResetState(opened.state, opened.slot)


class _EmptyResetState(ReferenceState):
    def reset(self, initial):
        _refuse_empty(initial)
        super().reset(initial)


class KeepsEveryLayout(_Preprocessing):
    """An allowed runtime: retains byte-swapped, reversed and strided buffers as they are (the reference
    refuses them), reading them right."""

    def open_state(self, model_bytes, initial, base_dir=None):
        from reference_impl import state as state_module

        original = state_module._adopt_array

        def lenient(array, path, counters, persistent, owned):
            return original(array, path, counters, persistent, True)  # as if the runtime owned every layout

        state_module._adopt_array = lenient
        try:
            return super().open_state(model_bytes, initial, base_dir)
        finally:
            state_module._adopt_array = original

    def change(self, array):
        return array


def _verdicts(adapter, ids) -> dict[str, str]:
    return {case_id: run_case(_cases()[case_id], adapter).verdict for case_id in ids}


def test_every_case_passes_on_the_reference():
    failed = {i: v for i, v in _verdicts(ReferenceAdapter(), sorted(_cases())).items() if v != PASSED}
    assert not failed


def test_the_reference_refuses_what_it_cannot_hold_and_keeps_the_rest():
    """Both branches of the Required cases are exercised by the reference itself."""
    from conformance.trace import Trace

    seen = {}
    original = Trace.judge

    def judge(self, outcome, step, what):
        if step.get("optional"):
            seen.setdefault(self.case.id, outcome.rejected is not None)
        return original(self, outcome, step, what)

    Trace.judge = judge
    try:
        for case_id in sorted(_cases()):
            if case_id.startswith(REQ):
                run_case(_cases()[case_id], ReferenceAdapter())
    finally:
        Trace.judge = original
    refused = {case_id for case_id, rejected in seen.items() if rejected}
    assert {REQ + "ByteSwappedInitial", REQ + "ReversedReset", REQ + "StridedForwardedFeed"} <= refused
    assert not refused & {REQ + "MisalignedInitial", REQ + "ViewOfViewReset", REQ + "ReadOnlyForwardedFeed"}


def test_a_runtime_keeping_every_layout_passes_the_required_cases():
    required = [case_id for case_id in _cases() if case_id.startswith(REQ)]
    failed = {i: v for i, v in _verdicts(KeepsEveryLayout(), required).items() if v != PASSED}
    assert not failed


@pytest.mark.parametrize(("fault", "expected"), [
    (NormalizesCallerBuffers, {REQ + f"{layout}{entry}" for layout in ("ByteSwapped", "Reversed", "Strided",
                                                                       "Misaligned", "ReadOnly", "ReadOnlyViewOfView")
                               for entry in ("Initial", "Reset", "ForwardedFeed")}),
    (CopiesViews, {REQ + f"{layout}{entry}" for layout in ("Reversed", "Strided", "ViewOfView", "ReadOnlyViewOfView")
                   for entry in ("Initial", "Reset", "ForwardedFeed")}),
    (ReadsBytesAsNative, {REQ + "ByteSwappedInitial", REQ + "ByteSwappedReset", REQ + "ByteSwappedForwardedFeed",
                          REC + "ByteSwappedFreshFeed"}),
    (EmptyIsMissing, {REC + "ZeroSizeInitial"}),
    (EmptyResetIsMissing, {REC + "ZeroSizeReset"}),
], ids=lambda item: item.__name__ if isinstance(item, type) else "")
def test_a_wrong_way_of_taking_a_caller_buffer_fails_its_cases(fault, expected):
    verdicts = _verdicts(fault(), sorted(_cases()))
    caught = {case_id for case_id, verdict in verdicts.items() if verdict == FAILED}
    assert expected <= caught, sorted(expected - caught)


def test_every_layout_holds_the_plain_values():
    plain = np.array([1.5, -2.0, 3.25, 7.0], dtype=np.float32)
    for keys in ({"byteswapped": True}, {"reversed": True}, {"offset": 1}, {"offset": 3}, {"window": True},
                 {"window": True, "byteswapped": True}):
        arranged = layouts.arrange(plain.copy(), keys)
        assert np.array_equal(arranged.astype(np.float32), plain), keys
    assert not layouts.arrange(plain, {"offset": 1}).flags.aligned
    assert not layouts.arrange(plain, {"byteswapped": True}).dtype.isnative
    window = layouts.arrange(plain, {"window": True})
    owner = window.base  # NumPy collapses a view of a view onto the owning buffer
    assert owner is not None and window.flags.c_contiguous and owner.size > window.size
    assert V.default_buffer_id(window) != V.default_buffer_id(owner)
    literal = V.build({"dtype": "float32", "shape": [2], "data": [1, 2], "window": True, "readonly": True})
    assert not literal.flags.writeable and literal.base is not None


def test_the_wire_carries_the_values_of_a_byte_swapped_array():
    from conformance import protocol

    swapped = np.array([1.0, 2.0], dtype=">f4")
    message = protocol.MESSAGES["Value"]()
    protocol.to_proto(swapped, message, lambda value: None)
    assert message.tensor.dtype == "float32"
    assert np.array_equal(np.frombuffer(message.tensor.data, dtype="<f4"), [1.0, 2.0])


def test_a_runtime_copying_every_buffer_fails_every_case_that_says_the_buffer_is_retained():
    """The Recommended ``*Retained`` cases check the kept buffer's address, not only that it was accepted."""
    retained = sorted(case_id for case_id in _cases() if case_id.startswith(REC) and case_id.endswith("Retained"))
    assert len(retained) == 12
    verdicts = _verdicts(CopiesEveryBuffer(), retained)
    assert {case_id for case_id, verdict in verdicts.items() if verdict == FAILED} == set(retained)

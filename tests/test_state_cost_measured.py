"""The cases of corpus/cases/zero_copy/cost_measured.toml observe cost the runtime cannot report: bytes
allocated around a call and the data addresses of what a state hands out. The reference passes them; a
state that serializes its model on every run, or copies a retained payload while its counters and
buffer ids say nothing was copied, fails them (and passes the self-reported checks)."""

from __future__ import annotations

import functools

import numpy as np

from conformance.adapters.reference import ReferenceAdapter, ReferenceState
from conformance.cases import load_cases
from conformance.execute import FAILED, NOT_SUPPORTED, PASSED, run_case
from conformance.values import default_buffer_id
from reference_impl import schema

#: the manifests the cases were filed in, one per area
_SOURCES = ("cases/state/cost_measured.toml", "cases/zero_copy/cost_measured.toml")


@functools.cache
def _cases() -> dict:
    return {case.id: case for case in load_cases() if case.source in _SOURCES}


MODEL_SIZE = "Recommended.State.Measured.RunAllocationsIndependentOfModelSize"
COPY = "Recommended.ZeroCopy.Measured.RetainedPayloadNotCopied"
ADDRESS = "Recommended.ZeroCopy.Measured.RetainedAddressStable"


def _verdict(case_id: str, adapter) -> str:
    return run_case(_cases()[case_id], adapter).verdict


def test_every_case_passes_on_the_reference():
    assert {case_id: _verdict(case_id, ReferenceAdapter()) for case_id in _cases()} == dict.fromkeys(_cases(), PASSED)


class _Serializing(ReferenceState):
    def __init__(self, handle: ReferenceState, model):
        super().__init__(handle.state, handle.slot)
        self.model = model

    def run(self, feeds):
        self.model.SerializeToString()  # "has the model changed?" by its bytes, before each call
        return super().run(feeds)


class SerializesModelEachRun(ReferenceAdapter):
    """Keeps the loaded model and serializes it on every run to detect mutation; its counters say nothing."""

    def open_state(self, model_bytes, initial, base_dir=None):
        handle = super().open_state(model_bytes, initial, base_dir)
        return _Serializing(handle, schema.parse_model(model_bytes))


class _Copying(ReferenceState):
    """Every retained array goes out as a fresh copy; buffer_id maps each copy back to the address of the
    runtime buffer it came from, so the suite's identity steps and the counters see no copy."""

    def __init__(self, handle: ReferenceState):
        super().__init__(handle.state, handle.slot)
        self.origin: dict[int, int] = {}
        self.keep: list[np.ndarray] = []

    def _copied(self, values: dict) -> dict:
        out = {}
        for name, value in values.items():
            if isinstance(value, np.ndarray) and value.size:
                copy = value.copy()
                copy.flags.writeable = False
                self.origin[default_buffer_id(copy)] = self.origin.get(default_buffer_id(value),
                                                                       default_buffer_id(value))
                self.keep.append(copy)
                value = copy
            out[name] = value
        return out

    def run(self, feeds):
        return self._copied(super().run(feeds))

    def values(self):
        return self._copied(super().values())

    def reset(self, initial):
        return super().reset(self._copied(initial))

    def buffer_id(self, value):
        found = default_buffer_id(value)
        return self.origin.get(found, found) if found is not None else None


class CopiesRetainedReportingNone(ReferenceAdapter):
    """Copies each retained payload it hands out or takes in, and reports neither the copies (counters) nor
    the new buffers (buffer_id)."""

    def open_state(self, model_bytes, initial, base_dir=None):
        return _Copying(super().open_state(model_bytes, initial, base_dir))


def test_serializing_the_model_each_run_fails_the_model_size_case():
    assert _verdict(MODEL_SIZE, SerializesModelEachRun()) == FAILED


def test_copying_a_retained_payload_fails_every_measured_copy_case():
    verdicts = {case_id: _verdict(case_id, CopiesRetainedReportingNone())
                for case_id in _cases() if case_id != MODEL_SIZE}
    assert verdicts == dict.fromkeys(verdicts, FAILED)


def test_the_copying_runtime_hides_its_copies_from_the_self_reported_checks():
    """Its counters stay at zero and its buffer ids name the original buffer: only a measurement sees it."""
    adapter = CopiesRetainedReportingNone()
    initial = np.arange(8, dtype=np.float32)
    model = _cases()[ADDRESS].model_bytes()
    handle = adapter.open_state(model, {"s": initial}, None)
    out = handle.run({"x": np.ones(2, np.float32)})
    assert default_buffer_id(out["s"]) != default_buffer_id(initial)
    assert handle.buffer_id(out["s"]) == default_buffer_id(initial)
    assert handle.counters()["payload_bytes_copied"] == 0


def test_the_measured_cases_are_not_supported_out_of_process():
    class OutOfProcess(ReferenceAdapter):
        out_of_process = True

    verdicts = {case_id: _verdict(case_id, OutOfProcess()) for case_id in _cases()}
    assert verdicts == dict.fromkeys(_cases(), NOT_SUPPORTED)

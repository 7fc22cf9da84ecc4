"""A deliberately wrong adapter is caught: the reference adapter with one injected fault at a time must
fail at least one case, while the same cases pass on the unmodified reference."""

from __future__ import annotations

import threading
from types import MappingProxyType

import numpy as np
import pytest

from conformance.adapters import Rejected
from conformance.adapters.reference import ReferenceAdapter, ReferenceState, to_neutral, to_runtime
from conformance.cases import load_cases, select
from conformance.execute import FAILED, PASSED, PASSED_WITHOUT_CODE, run_case
from reference_impl import ContractError, schema


def _run(adapter, *patterns):
    cases = select(load_cases(), list(patterns))
    assert cases, patterns
    return {case.id: run_case(case, adapter) for case in cases}


def _caught(adapter, *patterns) -> list[str]:
    baseline = _run(ReferenceAdapter(), *patterns)
    assert all(r.verdict == PASSED for r in baseline.values()), [r.message for r in baseline.values()
                                                                  if r.verdict != PASSED]
    faulty = _run(adapter, *patterns)
    return [case_id for case_id, result in faulty.items() if result.verdict == FAILED]


# ------------------------------------------------------------------------------ a skipped rule
class SkipsDuplicateIds(ReferenceAdapter):
    """Accepts duplicate type IDs (the catalogue uniqueness rule is not enforced)."""

    def verify(self, model_bytes, base_dir):
        try:
            super().verify(model_bytes, base_dir)
        except ContractError as error:
            if error.code.value != "TYPE_ID_DUPLICATE":
                raise


@pytest.mark.clause("CAT-ID-UNIQUE")
def test_skipped_rule_is_caught():
    caught = _caught(SkipsDuplicateIds(), "Required.Catalogue.Identity")
    assert "Required.Catalogue.Identity.DuplicateTypeId" in caught


# ------------------------------------------------------------------------- nibbles high-first
def _swap_nibbles(data: bytes) -> bytes:
    raw = np.frombuffer(data, dtype=np.uint8)
    return ((raw << 4) | (raw >> 4)).astype(np.uint8).tobytes()


class HighNibbleFirst(ReferenceAdapter):
    """Reads four-bit codes high nibble first: equivalent to decoding nibble-swapped payloads."""

    def decode(self, model_bytes, value_name, base_dir):
        model = schema.parse_model(model_bytes)
        for value in model.graph.encoded_initializer:
            if value.WhichOneof("layout") == "affine" and value.affine.storage_type in (21, 22):
                value.raw_data = _swap_nibbles(value.raw_data)
        return super().decode(model.SerializeToString(), value_name, base_dir)


@pytest.mark.clause("AFF-PACKING")
def test_nibbles_read_high_first_is_caught():
    caught = _caught(HighNibbleFirst(), "Required.Affine.Storage", "Required.Affine.AgreesWithDequantizeLinear")
    assert "Required.Affine.Storage.Int4LowNibbleFirst" in caught


# -------------------------------------------------------------------- copies instead of retained
class CopyingState(ReferenceState):
    def run(self, feeds):
        return {k: _deep_copy(v) for k, v in super().run(feeds).items()}

    def values(self):
        return {k: _deep_copy(v) for k, v in super().values().items()}


def _deep_copy(value):
    if isinstance(value, np.ndarray):
        return value.copy()
    if isinstance(value, dict):
        return type(value)({k: _deep_copy(v) for k, v in value.items()}, getattr(value, "type_id", None))
    return value


class CopiesBuffers(ReferenceAdapter):
    """Hands out (and so effectively retains) copies instead of the retained buffers."""

    def open_state(self, model_bytes, initial, base_dir=None):
        initial = {k: _deep_copy(v) for k, v in initial.items()}
        return CopyingState(super().open_state(model_bytes, initial, base_dir).state)


@pytest.mark.clause("ZC-RETAIN", "ZC-VIEWS")
def test_copies_instead_of_retained_buffers_are_caught():
    caught = _caught(CopiesBuffers(), "Required.ZeroCopy.Retain", "Required.ZeroCopy.Views")
    assert "Required.ZeroCopy.Retain.SelectedOutputBecomesState" in caught
    assert "Required.ZeroCopy.Retain.InitialValueRetainedByBuffer" in caught


# ------------------------------------------------------------ state published after a failed run
class PublishingState(ReferenceState):
    """After a failed run, publishes the outputs a stateless execution produced anyway."""

    def __init__(self, state, executor):
        super().__init__(state)
        self.executor = executor
        self.published = None

    def run(self, feeds):
        try:
            outputs = super().run(feeds)
            self.published = None
            return outputs
        except ContractError:
            merged = {**{k: to_runtime(v) for k, v in feeds.items()}, **self.state.values}
            outputs = self.executor.run(merged, check_feeds=False)  # if execution fails, nothing to publish
            self.published = MappingProxyType({b.input_name: outputs[b.output_name] for b in self.state.bindings})
            raise

    def values(self):
        if self.published is not None:
            return {k: to_neutral(v) for k, v in self.published.items()}
        return super().values()


class PublishesAfterFailure(ReferenceAdapter):
    def open_state(self, model_bytes, initial, base_dir=None):
        from reference_impl.executor import Executor

        handle = super().open_state(model_bytes, initial, base_dir)
        return PublishingState(handle.state, Executor(schema.parse_model(model_bytes)))


@pytest.mark.clause("STATE-ATOMIC", "ZC-FAILURE")
def test_state_published_after_failed_run_is_caught():
    caught = _caught(PublishesAfterFailure(), "Required.State.Atomic")
    assert "Required.State.Atomic.OutputFailsValidation" in caught


# ------------------------------------------------------------------- a concurrent call allowed
class SerializingState(ReferenceState):
    """Queues a second call behind the active one instead of rejecting it."""

    def __init__(self, handle):
        super().__init__(handle.state, handle.slot)
        self.lock = threading.Lock()

    def run(self, feeds):
        with self.lock:
            return super().run(feeds)

    def run_held(self, feeds, hold):
        with self.lock:
            return super().run_held(feeds, hold)

    def reset(self, initial):
        with self.lock:
            return super().reset(initial)

    def close(self):
        with self.lock:
            return super().close()


class AllowsConcurrentCalls(ReferenceAdapter):
    def open_state(self, model_bytes, initial, base_dir=None):
        return SerializingState(super().open_state(model_bytes, initial, base_dir))


@pytest.mark.clause("STATE-NO-CONCURRENCY")
def test_concurrent_call_allowed_is_caught():
    faulty = _run(AllowsConcurrentCalls(), "Required.State.Concurrency")
    assert faulty["Required.State.Concurrency.SecondRunRejected"].verdict == FAILED
    assert "queued" in faulty["Required.State.Concurrency.SecondRunRejected"].message
    # waiting for the active run is what reset and close may do
    assert faulty["Required.State.Concurrency.ResetDuringRunDoesNotRace"].verdict == PASSED
    assert faulty["Required.State.Concurrency.CloseDuringRunDoesNotRace"].verdict == PASSED


def test_rejection_without_code_is_not_a_pass_under_require_codes():
    class Uncoded(ReferenceAdapter):
        def classify(self, exc):
            found = super().classify(exc)
            return Rejected(None, found.message) if found is not None else None

    case = select(load_cases(), ["Required.Catalogue.Identity.TypeIdZero"])[0]
    assert run_case(case, Uncoded()).verdict == PASSED_WITHOUT_CODE
    assert run_case(case, Uncoded()).code_checked is False
    assert run_case(case, Uncoded(), require_codes=True).verdict == FAILED

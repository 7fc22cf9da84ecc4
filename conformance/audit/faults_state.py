"""Faults in request-local state: the feedback loop, initial values, feeds, atomic publication,
isolation, concurrency, reset and close.

These bugs live in the runtime's own state management, so most of them are state handles built on
the reference state (``ReferenceState``) that do one thing differently.
"""

from __future__ import annotations

import hashlib
import threading
from types import MappingProxyType

import numpy as np

from conformance.adapters.reference import ReferenceState, to_neutral, to_runtime
from conformance.audit.fault import Fault, FaultState, wrap
from conformance.values import Struct
from reference_impl import ContractError, schema
from reference_impl import state as state_module
from reference_impl.bindings import validate_bindings
from reference_impl.errors import ErrorCode as E
from reference_impl.errors import violation
from reference_impl.executor import Executor
from reference_impl.values import TensorSpec, numpy_dtype


def _bound_outputs(state) -> set[str]:
    return {b.output_name for b in state.bindings}


class _NeverAdvancesState(FaultState):
    def run(self, feeds):
        before = self.state._values
        outputs = super().run(feeds)
        self.state._values = before
        return outputs


class NeverAdvances(Fault):
    """Returns each call's outputs but never stores the selected ones: every call starts again from the
    initial values, unlike the manual output-to-input loop."""

    fault_id = "STATE-EQUIV-LOOP.never-advances"
    clauses = ("STATE-EQUIV-LOOP",)

    def make_state(self, handle):
        return _NeverAdvancesState(handle.state, self)


class _SerializingModelState(FaultState):
    def run(self, feeds):
        executor = self.state._executor
        if executor is not None:
            executor.model.SerializeToString(deterministic=True)  # hashed to detect mutation
            self.state.counters.model_serializations += 1
        return super().run(feeds)


class ModelHashedEachRun(Fault):
    """Serializes and hashes the model on every call to detect whether the caller mutated it (and
    reports it honestly in its ``model_serializations`` counter)."""

    fault_id = "STATE-NO-MODEL-SCAN.model-hashed-each-run"
    clauses = ("STATE-NO-MODEL-SCAN",)

    def make_state(self, handle):
        return _SerializingModelState(handle.state, self)


class _ResolvingState(FaultState):
    def run(self, feeds):
        executor = self.state._executor
        if executor is not None:
            validate_bindings(executor.model, executor.catalogue)
            self.state.counters.binding_resolutions += 1
        return super().run(feeds)


class BindingsResolvedEachRun(Fault):
    """Resolves and validates the model's bindings again on every call instead of once when the state is
    made (reported in its ``binding_resolutions`` counter)."""

    fault_id = "STATE-RESOLVE-ONCE.resolved-each-run"
    clauses = ("STATE-RESOLVE-ONCE",)

    def make_state(self, handle):
        return _ResolvingState(handle.state, self)


class MissingInitialZeroFilled(Fault):
    """Starts a bound input without an initial value from zeros of its declared shape instead of
    requiring the caller to supply it."""

    fault_id = "STATE-INITIAL.zero-filled"
    clauses = ("STATE-INITIAL",)

    def open_state(self, model_bytes, initial, base_dir=None):
        initial = dict(initial)
        try:
            resolved = validate_bindings(schema.parse_model(model_bytes))
        except ContractError:
            resolved = ()
        for binding in resolved:
            spec = binding.spec
            if binding.input_name not in initial and isinstance(spec, TensorSpec) and spec.dims is not None \
                    and all(isinstance(d, int) for d in spec.dims):
                initial[binding.input_name] = np.zeros(spec.dims, numpy_dtype(spec.elem_type))
        return super().open_state(model_bytes, initial, base_dir)


class StructInitialRefused(Fault):
    """Retains tensors only: a whole structured input cannot be bound state."""

    fault_id = "STATE-WHOLE-STRUCT.structs-refused"
    clauses = ("STATE-WHOLE-STRUCT",)

    def open_state(self, model_bytes, initial, base_dir=None):
        for name, value in initial.items():
            if isinstance(value, Struct):
                raise violation(E.STATE_UNRETAINABLE, f"initial[{name!r}]", "only tensors can be retained")
        return super().open_state(model_bytes, initial, base_dir)


class _MovesRetainedState(FaultState):
    def run(self, feeds):
        outputs = super().run(feeds)
        retained = _bound_outputs(self.state)
        return {name: value for name, value in outputs.items() if name not in retained}


class RetainedOutputsNotReturned(Fault):
    """Moves the selected outputs into the state and returns only the others: a call's outputs are no
    longer all returned."""

    fault_id = "STATE-UNSELECTED.selected-outputs-moved"
    clauses = ("STATE-UNSELECTED",)

    def make_state(self, handle):
        return _MovesRetainedState(handle.state, self)


def _casting_initial_values(original):
    def initial_values(self, initial):
        if isinstance(initial, dict | MappingProxyType):
            initial = dict(initial)
            for binding in self._bindings:
                value, spec = initial.get(binding.input_name), binding.spec
                if isinstance(value, np.ndarray) and isinstance(spec, TensorSpec):
                    try:
                        declared = numpy_dtype(spec.elem_type)
                    except ContractError:
                        continue
                    if value.dtype != declared and value.dtype.kind in "biuf":
                        initial[binding.input_name] = value.astype(declared)  # a converting copy
        return original(self, initial)
    return initial_values


class RetentionConvertsValues(Fault):
    """Retains an initial (or reset) value of another numeric element type by converting it to the
    declared type, a copying cast, instead of rejecting the incompatible actual value."""

    fault_id = "STATE-VALIDATE-METADATA.values-converted"
    clauses = ("STATE-VALIDATE-METADATA",)

    def patches(self):
        return [wrap(state_module.State, "_initial_values", _casting_initial_values)]


def _feed_names_only(original):
    def check_feeds(self, feeds, validated=None):
        for name in feeds:
            if name not in self.input_specs and (validated is None or name not in validated):
                raise violation(E.STATE_FEED_UNKNOWN, f"feeds[{name!r}]", f"{name!r} is not a graph input")
        for name in self.required_inputs:
            if name not in feeds and (validated is None or name not in validated):
                raise violation(E.STATE_FEED_MISSING, f"feeds[{name!r}]", f"required input {name!r} has no feed")
    return check_feeds


def _caller_values_only(original):
    def check_value(value, spec, path, *args, **kwargs):
        if path.startswith("outputs["):
            return None  # computed by the graph from its declared inputs: trusted to match its declaration
        return original(value, spec, path, *args, **kwargs)
    return check_value


class ComputedOutputsTrusted(Fault):
    """Checks the values a caller hands the state (initial and reset values) against the declared types, but
    takes fresh feeds by name and presence only, and trusts the graph to produce what its outputs declare: a
    selected output is retained without comparing its actual type and shape to the bound input. A feed the
    kernels accept anyway (a shape Add broadcasts, a type NumPy promotes) reaches the state."""

    fault_id = "STATE-VALIDATE-METADATA.computed-outputs-trusted"
    clauses = ("STATE-VALIDATE-METADATA", "STATE-ATOMIC")

    def patches(self):
        return [wrap(Executor, "check_feeds", _feed_names_only),
                wrap(state_module, "check_value", _caller_values_only, aliases=False)]


class _ZeroFillsMissingFeeds(FaultState):
    def run(self, feeds):
        executor = self.state._executor
        if executor is not None:
            feeds = dict(feeds)
            for name in executor.required_inputs:
                spec = executor.input_specs.get(name)
                if name in feeds or name in self.state.values or not isinstance(spec, TensorSpec) \
                        or spec.dims is None or not all(isinstance(d, int) for d in spec.dims):
                    continue
                try:
                    feeds[name] = np.zeros(spec.dims, numpy_dtype(spec.elem_type))
                except ContractError:
                    continue
        return super().run(feeds)


class MissingFeedsZeroFilled(Fault):
    """Feeds zeros of the declared shape for a required input the call does not supply (and the state
    does not retain) instead of failing the call."""

    fault_id = "STATE-FEEDS.missing-feeds-zero-filled"
    clauses = ("STATE-FEEDS",)

    def make_state(self, handle):
        return _ZeroFillsMissingFeeds(handle.state, self)


class _FeedsOverrideState(FaultState):
    def run(self, feeds):
        bound = {b.input_name for b in self.state.bindings}
        overrides = {name: to_runtime(value) for name, value in feeds.items() if name in bound}
        if overrides:
            self.state._values = MappingProxyType({**self.state._values, **overrides})
        return super().run({name: value for name, value in feeds.items() if name not in bound})


class FeedsOverrideRetained(Fault):
    """Lets a feed for a bound input replace the retained value for that call (the feed wins)."""

    fault_id = "STATE-FEED-OVERRIDE.feed-wins"
    clauses = ("STATE-FEED-OVERRIDE",)

    def make_state(self, handle):
        return _FeedsOverrideState(handle.state, self)


class _PublishingState(FaultState):
    """After a failed run, publishes the outputs a stateless execution produced anyway."""

    def __init__(self, state, fault, executor, like):
        super().__init__(state, fault, like)
        self.executor = executor

    def run(self, feeds):
        try:
            return super().run(feeds)
        except ContractError as error:
            if error.code in (E.STATE_BUSY, E.STATE_CLOSED):
                raise  # refused before it ran: nothing was computed to publish
            merged = {**{k: to_runtime(v) for k, v in feeds.items()}, **self.state.values}
            try:
                outputs = self.executor.run(merged, check_feeds=False)
            except ContractError:
                raise error from None  # execution itself failed: nothing to publish
            self.state._values = MappingProxyType({b.input_name: outputs[b.output_name] for b in self.state.bindings})
            raise


class PublishesAfterFailure(Fault):
    """Publishes the next state before validating it: when a run fails validation (or execution of a
    later step), the outputs it computed still become the retained values."""

    fault_id = "STATE-ATOMIC.published-before-validation"
    clauses = ("STATE-ATOMIC", "ZC-FAILURE")

    def open_state(self, model_bytes, initial, base_dir=None):
        handle = super().open_state(model_bytes, initial, base_dir)
        executor = Executor(schema.parse_model(model_bytes), base_dir=base_dir, kernels=handle.state._executor.kernels)
        return _PublishingState(handle.state, self, executor, handle)

    def make_state(self, handle):
        return handle


class SharedStateAcrossRequests(Fault):
    """Keeps one state container per loaded model: a second request over the same model shares (and
    re-initializes) the first request's retained values."""

    fault_id = "STATE-ISOLATION.state-per-model"
    clauses = ("STATE-ISOLATION",)

    def __init__(self) -> None:
        super().__init__()
        self._shared: dict[bytes, ReferenceState] = {}

    def open_state(self, model_bytes, initial, base_dir=None):
        key = hashlib.sha256(model_bytes).digest()
        shared = self._shared.get(key)
        if shared is not None and not shared.state.closed:
            shared.reset(initial)
            return shared
        self._shared[key] = handle = super().open_state(model_bytes, initial, base_dir)
        return handle


class _SerializingState(FaultState):
    """Queues a second call behind the active one instead of rejecting it."""

    def __init__(self, state, fault):
        super().__init__(state, fault)
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


class AllowsConcurrentCalls(Fault):
    """Serializes simultaneous calls on one state with a lock (the second waits) instead of rejecting
    them."""

    fault_id = "STATE-NO-CONCURRENCY.calls-queued"
    clauses = ("STATE-NO-CONCURRENCY",)

    def make_state(self, handle):
        return _SerializingState(handle.state, self)


class _ResetToOpenState(FaultState):
    def __init__(self, state, fault, initial, like):
        super().__init__(state, fault, like)
        self.initial = initial

    def reset(self, initial):
        return super().reset(self.initial)


class ResetRestoresOpenValues(Fault):
    """``reset(initial)`` restores the values the state was opened with, ignoring the ones passed."""

    fault_id = "STATE-RESET.restores-open-values"
    clauses = ("STATE-RESET",)

    def open_state(self, model_bytes, initial, base_dir=None):
        handle = super().open_state(model_bytes, initial, base_dir)
        return _ResetToOpenState(handle.state, self, dict(initial), handle)

    def make_state(self, handle):
        return handle


class _CloseIgnoredState(FaultState):
    def close(self):
        return None


class CloseIsNoOp(Fault):
    """``close()`` does nothing: the state keeps its values and accepts further calls."""

    fault_id = "STATE-CLOSE.close-ignored"
    clauses = ("STATE-CLOSE",)

    def make_state(self, handle):
        return _CloseIgnoredState(handle.state, self)


class _UnguardedResetCloseState(FaultState):
    """Reset and close that do not take the state's call guard."""

    def reset(self, initial):
        state = self.state
        if state.closed:
            raise violation(E.STATE_CLOSED, "state.reset", "the state is closed")
        state._values = state._initial_values({k: to_runtime(v) for k, v in initial.items()})

    def close(self):
        state = self.state
        state._closed = True
        state._values = MappingProxyType({})


class ResetCloseRaceActiveCall(Fault):
    """Guards runs against each other but lets ``reset`` and ``close`` proceed during an active call."""

    fault_id = "STATE-NO-RACE.reset-close-unguarded"
    clauses = ("STATE-NO-RACE",)

    def make_state(self, handle):
        return _UnguardedResetCloseState(handle.state, self)


class _LastOutputsState(FaultState):
    def __init__(self, state, fault):
        super().__init__(state, fault)
        self.last: dict = {}

    def run(self, feeds):
        outputs = super().run(feeds)
        self.last = outputs
        return outputs

    def values(self):
        current = super().values()
        return current if self.state.bindings else {**self.last, **current}


class StatelessRetainsOutputs(Fault):
    """Without bindings, keeps the last call's outputs as the state's values instead of running
    ordinary stateless execution with nothing retained."""

    fault_id = "BIND-STATELESS-DEFAULT.outputs-retained"
    clauses = ("BIND-STATELESS-DEFAULT",)

    def make_state(self, handle):
        return _LastOutputsState(handle.state, self)


def neutral_copy(value):
    """A deep copy of a neutral value (arrays copied, structure rebuilt)."""
    return to_neutral(_runtime_copy(to_runtime(value)))


def _runtime_copy(value):
    from reference_impl.values import EncodedValue, StructValue

    if isinstance(value, np.ndarray):
        return value.copy()
    if isinstance(value, StructValue):
        return StructValue({k: _runtime_copy(v) for k, v in value.items()}, value.type_id)
    if isinstance(value, EncodedValue):
        return EncodedValue(value.header, value.payload.copy(), value.source, value.base_dir)
    if isinstance(value, list):
        return [_runtime_copy(v) for v in value]
    return value

"""Faults in the state helper: atomic publication, concurrency, feeds, resets and the stateless-loop equivalence."""

from __future__ import annotations

import hashlib
import threading
import weakref
from types import MappingProxyType

import numpy as np

from conformance.adapters.reference import ReferenceState, to_neutral, to_runtime
from conformance.audit.fault import Fault, FaultState, fault, name_faults, wrap
from conformance.audit.faults.shared import _ExtraRetainedState
from conformance.values import Struct
from reference_impl import ContractError, schema
from reference_impl import state as state_module
from reference_impl.bindings import validate_bindings
from reference_impl.errors import ErrorCode as E
from reference_impl.errors import violation
from reference_impl.executor import Executor
from reference_impl.tensors import to_array
from reference_impl.values import TensorSpec, is_struct, numpy_dtype


def _bound_outputs(state) -> set[str]:
    return {b.output_name for b in state.bindings}


class _NeverAdvancesState(FaultState):
    def run(self, feeds):
        before = self.state._values
        outputs = super().run(feeds)
        self.state._values = before
        return outputs


NeverAdvances = fault("STATE-EQUIV-LOOP.never-advances", ("STATE-EQUIV-LOOP",),
    """Returns each call's outputs but never stores the selected ones: every call starts again from the initial values,
    unlike the manual output-to-input loop.""", state=_NeverAdvancesState)


class _SerializingModelState(FaultState):
    def run(self, feeds):
        executor = self.state._executor
        if executor is not None:
            executor.model.SerializeToString(deterministic=True)  # hashed to detect mutation
            self.state.counters.model_serializations += 1
        return super().run(feeds)


ModelHashedEachRun = fault("STATE-NO-MODEL-SCAN.model-hashed-each-run", ("STATE-NO-MODEL-SCAN",),
    """Serializes and hashes the model on every call to detect whether the caller mutated it (and reports it honestly in
    its ``model_serializations`` counter).""", state=_SerializingModelState)


class _ResolvingState(FaultState):
    def run(self, feeds):
        executor = self.state._executor
        if executor is not None:
            validate_bindings(executor.model, executor.catalogue)
            self.state.counters.binding_resolutions += 1
        return super().run(feeds)


BindingsResolvedEachRun = fault("STATE-RESOLVE-ONCE.resolved-each-run", ("STATE-RESOLVE-ONCE",),
    """Resolves and validates the model's bindings again on every call instead of once when the state is made (reported
    in its ``binding_resolutions`` counter).""", state=_ResolvingState)


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


RetainedOutputsNotReturned = fault("STATE-UNSELECTED.selected-outputs-moved", ("STATE-UNSELECTED",),
    """Moves the selected outputs into the state and returns only the others: a call's outputs are no longer all
    returned.""", state=_MovesRetainedState)


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


RetentionConvertsValues = fault("STATE-VALIDATE-METADATA.values-converted", ("STATE-VALIDATE-METADATA",),
    """Retains an initial (or reset) value of another numeric element type by converting it to the declared type, a
    copying cast, instead of rejecting the incompatible actual value.""",
    patches=lambda: [wrap(state_module.State, "_initial_values", _casting_initial_values)])


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


ComputedOutputsTrusted = fault("STATE-VALIDATE-METADATA.computed-outputs-trusted",
    ("STATE-VALIDATE-METADATA", "STATE-ATOMIC"), """Checks the values a caller hands the state (initial and reset
    values) against the declared types, but takes fresh feeds by name and presence only, and trusts the graph to produce
    what its outputs declare: a selected output is retained without comparing its actual type and shape to the bound
    input. A feed the kernels accept anyway (a shape Add broadcasts, a type NumPy promotes) reaches the state.""",
    patches=lambda: [wrap(Executor, "check_feeds", _feed_names_only),
                     wrap(state_module, "check_value", _caller_values_only, aliases=False)])


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


MissingFeedsZeroFilled = fault("STATE-FEEDS.missing-feeds-zero-filled", ("STATE-FEEDS",),
    """Feeds zeros of the declared shape for a required input the call does not supply (and the state does not retain)
    instead of failing the call.""", state=_ZeroFillsMissingFeeds)


class _FeedsOverrideState(FaultState):
    def run(self, feeds):
        bound = {b.input_name for b in self.state.bindings}
        overrides = {name: to_runtime(value) for name, value in feeds.items() if name in bound}
        if overrides:
            self.state._values = MappingProxyType({**self.state._values, **overrides})
        return super().run({name: value for name, value in feeds.items() if name not in bound})


FeedsOverrideRetained = fault("STATE-FEED-OVERRIDE.feed-wins", ("STATE-FEED-OVERRIDE",),
    """Lets a feed for a bound input replace the retained value for that call (the feed wins).""",
    state=_FeedsOverrideState)


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


AllowsConcurrentCalls = fault("STATE-NO-CONCURRENCY.calls-queued", ("STATE-NO-CONCURRENCY",),
    """Serializes simultaneous calls on one state with a lock (the second waits) instead of rejecting them.""",
    state=_SerializingState)


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


CloseIsNoOp = fault("STATE-CLOSE.close-ignored", ("STATE-CLOSE",), """``close()`` does nothing: the state keeps its
    values and accepts further calls.""", state=_CloseIgnoredState)


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


ResetCloseRaceActiveCall = fault("STATE-NO-RACE.reset-close-unguarded", ("STATE-NO-RACE",),
    """Guards runs against each other but lets ``reset`` and ``close`` proceed during an active call.""",
    state=_UnguardedResetCloseState)


_ACTIVE = threading.local()


class _TrackedState(FaultState):
    """Makes the handle's state visible to the fault's patches while one of its calls runs."""

    def run(self, feeds):
        _ACTIVE.state = self.state
        try:
            return super().run(feeds)
        finally:
            _ACTIVE.state = None

    def run_cancelled(self, feeds):
        _ACTIVE.state = self.state
        try:
            return super().run_cancelled(feeds)
        finally:
            _ACTIVE.state = None

    def run_held(self, feeds, hold):
        _ACTIVE.state = self.state
        try:
            return super().run_held(feeds, hold)
        finally:
            _ACTIVE.state = None


def _publishing_each_binding(original):
    def check_value(value, spec, path, *args, **kwargs):
        result = original(value, spec, path, *args, **kwargs)
        state = getattr(_ACTIVE, "state", None)
        if state is not None and path.startswith("outputs["):
            for binding in state.bindings:
                if path == f"outputs[{binding.output_name!r}]":
                    # published as soon as this binding's value is checked, before the next one is
                    state._values = MappingProxyType({**state._values, binding.input_name: value})
        return result
    return check_value


PublishesBindingByBinding = fault("STATE-ATOMIC.published-binding-by-binding", ("STATE-ATOMIC", "ZC-FAILURE"),
    """Publishes each retained value as soon as its own output passed validation: when a later binding's output fails
    validation (or the call is cancelled before publication), the earlier bindings already hold the new values while the
    later ones keep the old.""", boundary=True, state=_TrackedState,
    patches=lambda: [wrap(state_module, "check_value", _publishing_each_binding, aliases=False)])


def _first_step_only(original):
    def check_value(value, spec, path, *args, **kwargs):
        state = getattr(_ACTIVE, "state", None)
        if state is not None and path.startswith("outputs[") and state.steps >= 1:
            return None  # the shapes were checked on the first step and are taken as stable
        return original(value, spec, path, *args, **kwargs)
    return check_value


LaterStepsNotValidated = fault("STATE-VALIDATE-METADATA.later-steps-unchecked",
    ("STATE-VALIDATE-METADATA", "STATE-ATOMIC"), """Validates the selected outputs against the bound inputs' declared
    types on the first call only; later calls publish whatever the graph produced (the shapes are taken as stable).""",
    state=_TrackedState, patches=lambda: [wrap(state_module, "check_value", _first_step_only, aliases=False)])


class _MergingResetState(FaultState):
    def reset(self, initial):
        state = self.state
        if state.closed or not initial:
            return super().reset(initial)
        kept = {name: value for name, value in state._values.items() if name not in initial}
        # the values the caller left out keep their current contents
        merged = {**kept, **{k: to_runtime(v) for k, v in initial.items()}}
        with self.fault.injected():
            values = state._initial_values(merged)
        state._values = values
        state.steps = 0


PartialResetMerged = fault("STATE-RESET.partial-reset-merged", ("STATE-RESET", "STATE-INITIAL"),
    """``reset(initial)`` merges the given values into the current state: a binding the caller left out keeps its
    current (stale) value instead of the reset failing for a missing initial value.""", state=_MergingResetState)


class _EqualFeedsTolerated(FaultState):
    def run(self, feeds):
        retained = self.state.values if not self.state.closed else {}
        kept = {}
        for name, value in feeds.items():
            current = retained.get(name)
            if isinstance(current, np.ndarray) and isinstance(value, np.ndarray) and value.dtype == current.dtype \
                    and value.shape == current.shape and np.array_equal(value, current):
                continue  # the same value as the retained one: not taken as an override, dropped
            kept[name] = value
        return super().run(kept)


EqualFeedNotAnOverride = fault("STATE-FEED-OVERRIDE.equal-feed-tolerated", ("STATE-FEED-OVERRIDE",),
    """Rejects a feed for a retained input only when it conflicts with the retained value: a feed equal to it (the
    caller passing the state's own value back) is silently dropped instead of refused.""", boundary=True,
    state=_EqualFeedsTolerated)


class _SiblingState(FaultState):
    def __init__(self, state, fault, key):
        super().__init__(state, fault)
        self.key = key
        fault.family(key).add(self)

    def close(self):
        result = super().close()
        if self.fault.closes_siblings:
            for other in list(self.fault.family(self.key)):
                if other is not self and not other.state.closed:
                    other.state.close()
        return result

    def reset(self, initial):
        result = super().reset(initial)
        if self.fault.resets_siblings:
            for other in list(self.fault.family(self.key)):
                if other is not self and not other.state.closed:
                    other.state._values = self.state._values
        return result


class _Siblings(Fault):
    closes_siblings = False
    resets_siblings = False

    def family(self, key) -> weakref.WeakSet:
        families = self.__dict__.setdefault("_families", {})
        return families.setdefault(key, weakref.WeakSet())

    def open_state(self, model_bytes, initial, base_dir=None):
        self._key = model_bytes
        return super().open_state(model_bytes, initial, base_dir)

    def make_state(self, handle):
        return _SiblingState(handle.state, self, self._key)


class CloseReleasesSiblings(_Siblings):
    """Keeps one execution context per loaded model and releases it when any state of that model is
    closed, so closing one request's state closes every other state of the same model."""

    fault_id = "STATE-ISOLATION.close-closes-siblings"
    clauses = ("STATE-ISOLATION", "STATE-CLOSE")
    closes_siblings = True


class ResetSharedAcrossStates(_Siblings):
    """Stores the values a reset restores on the loaded model, so resetting one request's state
    replaces the retained values of every other state of the same model."""

    fault_id = "STATE-ISOLATION.reset-shared"
    clauses = ("STATE-ISOLATION", "STATE-RESET")
    resets_siblings = True


class _CachedValuesState(FaultState):
    def __init__(self, state, fault):
        super().__init__(state, fault)
        self.cached = None

    def run(self, feeds):
        self.cached = None
        return super().run(feeds)

    def values(self):
        if self.cached is None:
            self.cached = super().values()
        return self.cached


ValuesCachedAcrossReset = fault("STATE-RESET.values-cache-stale", ("STATE-RESET", "ZC-VIEWS"),
    """Caches the mapping ``values()`` hands out and refreshes it after each run but not after a reset, so values()
    after a reset shows the state before it.""", state=_CachedValuesState)


class _ResetIgnoresUnknownState(FaultState):
    def reset(self, initial):
        bound = {b.input_name for b in self.state.bindings}
        return super().reset({name: value for name, value in initial.items() if name in bound})


ResetIgnoresUnknownNames = fault("STATE-RESET.unknown-names-ignored", ("STATE-RESET", "STATE-INITIAL"),
    """Checks the names of the initial values when the state is opened but not on ``reset``, where values for names that
    are not bound inputs are silently dropped.""", state=_ResetIgnoresUnknownState)


class _ResetBindingByBindingState(FaultState):
    def reset(self, initial):
        from reference_impl.errors import ContractError

        try:
            return super().reset(initial)
        except ContractError:
            if self.state.closed or not isinstance(initial, dict):
                raise
            applied = dict(self.state._values)
            for binding in self.state.bindings:  # the bindings before the failing one were swapped in
                name = binding.input_name
                if name not in initial:
                    break
                try:
                    super().reset({**applied, name: initial[name]})
                except ContractError:
                    break
                applied = dict(self.state._values)
            raise


ResetPublishedBindingByBinding = fault("STATE-RESET.published-binding-by-binding", ("STATE-RESET", "STATE-ATOMIC"),
    """Replaces the retained values of a reset one binding at a time, so a reset whose later value is invalid fails
    after the earlier bindings were already replaced.""", state=_ResetBindingByBindingState)


class _SessionGuardState(FaultState):
    def __init__(self, state, fault, key):
        super().__init__(state, fault)
        self.key = key

    def _active(self):
        return self.fault.active.setdefault(self.key, [0])

    def _counted(self, call):
        counter = self._active()
        with self.fault.lock:
            counter[0] += 1
        try:
            return call()
        finally:
            with self.fault.lock:
                counter[0] -= 1

    def run(self, feeds):
        return self._counted(lambda: super(_SessionGuardState, self).run(feeds))

    def run_cancelled(self, feeds):
        return self._counted(lambda: super(_SessionGuardState, self).run_cancelled(feeds))

    def run_held(self, feeds, hold):
        return self._counted(lambda: super(_SessionGuardState, self).run_held(feeds, hold))

    def _guard(self, what):
        from reference_impl.errors import ErrorCode, violation

        if self._active()[0] and not self.state.closed:
            raise violation(ErrorCode.STATE_BUSY, f"state.{what}", "a call is active on this model's session")

    def reset(self, initial):
        self._guard("reset")
        return super().reset(initial)

    def close(self):
        self._guard("close")
        return super().close()


class ResetCloseGuardedPerModel(Fault):
    """Keeps "reset or close cannot race with a call" with one count of active calls per loaded model, so
    a reset or close of one state is refused while a call on another state of the same model is active."""

    fault_id = "STATE-ISOLATION.reset-close-guarded-per-model"
    clauses = ("STATE-ISOLATION", "STATE-NO-RACE")

    @property
    def active(self) -> dict:
        return self.__dict__.setdefault("_active", {})

    @property
    def lock(self):
        return self.__dict__.setdefault("_lock", threading.Lock())

    def open_state(self, model_bytes, initial, base_dir=None):
        self._key = model_bytes
        return super().open_state(model_bytes, initial, base_dir)

    def make_state(self, handle):
        return _SessionGuardState(handle.state, self, self._key)


class _ValuesAfterCloseState(FaultState):
    def __init__(self, state, fault):
        super().__init__(state, fault)
        self.kept = None

    def close(self):
        if not self.state.closed:
            self.kept = self.state._values
        return super().close()

    def values(self):
        if self.state.closed and self.kept is not None:
            return {name: to_neutral(value) for name, value in self.kept.items()}
        return super().values()


ValuesReadableAfterClose = fault("STATE-CLOSE.values-readable-after-close", ("STATE-CLOSE",),
    """``close()`` refuses further calls but keeps the retained values reachable: the state-value accessor does not
    check whether the state is closed and still hands out the last retained values.""", state=_ValuesAfterCloseState)


class _ReopeningState(FaultState):
    def __init__(self, state, fault):
        super().__init__(state, fault)
        self.executor = state._executor

    def reset(self, initial):
        state = self.state
        if state.closed and self.executor is not None:
            state._closed = False  # reset re-initializes the state from scratch, closed or not
            state._executor = self.executor
        return super().reset(initial)


ResetReopensClosedState = fault("STATE-CLOSE.reset-reopens", ("STATE-CLOSE",),
    """``reset(initial)`` re-initializes a closed state instead of refusing: the state closed by the caller comes back
    to life with the new initial values and accepts calls again.""", state=_ReopeningState)


class BindingsPairedByPosition(Fault):
    """Builds its publication plan by pairing the bound inputs, in graph input order, with the bound
    outputs, in graph output order, instead of following each binding's own output name: correct only
    while both lists happen to be in the same order."""

    fault_id = "STATE-EQUIV-LOOP.paired-by-position"
    clauses = ("STATE-EQUIV-LOOP",)

    def make_state(self, handle):
        state = handle.state
        executor = state._executor
        bound_inputs = [name for name in executor.input_names if name in state._bound]
        selected = {b.output_name for b in state.bindings}
        bound_outputs = [name for name in executor.output_names if name in selected]
        specs = {b.input_name: b.spec for b in state.bindings}
        state._plan = tuple((i, o, specs[i], f"outputs[{o!r}]") for i, o in zip(bound_inputs, bound_outputs))
        return FaultState(state, self)


class _RememberedFeedsState(FaultState):
    def __init__(self, state, fault):
        super().__init__(state, fault)
        self.last: dict = {}

    def run(self, feeds):
        merged = {**self.last, **feeds}
        outputs = super().run(merged)
        self.last = merged
        return outputs


PreviousFeedReused = fault("STATE-FEEDS.previous-feed-reused", ("STATE-FEEDS",),
    """Keeps each successful call's feeds and, when a later call omits a fresh input, reuses the one the previous call
    supplied instead of failing the call.""", state=_RememberedFeedsState)


class _DefaultsRequiredState(FaultState):
    def run(self, feeds):
        executor = self.state._executor
        if executor is not None:
            for name in executor.input_names:
                if name in executor.defaults and name not in feeds and name not in self.state._bound:
                    raise violation(E.STATE_FEED_MISSING, f"feeds[{name!r}]", f"input {name!r} has no feed")
        return super().run(feeds)


DefaultedInputsRequired = fault("STATE-FEEDS.defaulted-inputs-required", ("STATE-FEEDS",),
    """Requires a feed for every graph input, including one whose initializer supplies its default value (an input that
    is not required).""", state=_DefaultsRequiredState)


def _with_defaults(model, initial) -> dict:
    """``initial`` completed by the dense initializers of bound inputs it lacks."""
    initial = dict(initial)
    if model is None or not isinstance(initial, dict):
        return initial
    defaults = {tensor.name: tensor for tensor in model.graph.initializer}
    for binding in model.graph.persistent_bindings:
        name = binding.input_name
        if name not in initial and name in defaults:
            try:
                initial[name] = to_array(defaults[name], f"model.graph.initializer[{name!r}]")
            except ContractError:
                continue
    return initial


class _DefaultedResetState(FaultState):
    def reset(self, initial):
        executor = self.state._executor
        return super().reset(_with_defaults(executor.model if executor is not None else None, initial))


class InitializerAsInitialValue(Fault):
    """Starts a bound input that has a same-named dense initializer (its default value) from that
    initializer when the caller supplies no initial value (at open and at reset), instead of requiring
    the initial contents. One reading of the spec allows this (it never defines which inputs are required
    and lets initializer names appear as graph inputs), so only Recommended cases catch it."""

    fault_id = "STATE-INITIAL.initializer-default"
    clauses = ("STATE-INITIAL",)

    def open_state(self, model_bytes, initial, base_dir=None):
        try:
            model = schema.parse_model(model_bytes)
        except Exception:  # noqa: BLE001 - unparsable bytes go to the oracle, which classifies them
            model = None
        return super().open_state(model_bytes, _with_defaults(model, initial), base_dir)

    def make_state(self, handle):
        return _DefaultedResetState(handle.state, self)


class _ModelLockedState(FaultState):
    def __init__(self, state, fault, lock):
        super().__init__(state, fault)
        self.model_lock = lock

    def _guarded(self, call):
        if not self.model_lock.acquire(blocking=False):
            raise violation(E.STATE_BUSY, "state.run", "a call is already active on this model")
        try:
            return call()
        finally:
            self.model_lock.release()

    def run(self, feeds):
        return self._guarded(lambda: FaultState.run(self, feeds))

    def run_cancelled(self, feeds):
        return self._guarded(lambda: FaultState.run_cancelled(self, feeds))

    def run_held(self, feeds, hold):
        return self._guarded(lambda: FaultState.run_held(self, feeds, hold))


class CallGuardPerModel(Fault):
    """Implements the rejection of simultaneous calls with one busy flag per loaded model instead of per
    state: a call on another request's state over the same model is rejected too."""

    fault_id = "STATE-NO-CONCURRENCY.guard-per-model"
    clauses = ("STATE-NO-CONCURRENCY", "STATE-ISOLATION")

    def __init__(self) -> None:
        super().__init__()
        self._locks: dict[bytes, threading.Lock] = {}
        self._lock = None

    def open_state(self, model_bytes, initial, base_dir=None):
        self._lock = self._locks.setdefault(hashlib.sha256(model_bytes).digest(), threading.Lock())
        return super().open_state(model_bytes, initial, base_dir)

    def make_state(self, handle):
        return _ModelLockedState(handle.state, self, self._lock)


class ModelClonedAtOpen(Fault):
    """Takes a private deep copy of the model when the state is made (to be safe from later edits by the
    caller), and reports the clone honestly in its ``model_serializations`` counter."""

    fault_id = "STATE-NO-MODEL-SCAN.model-cloned-at-open"
    clauses = ("STATE-NO-MODEL-SCAN",)

    def make_state(self, handle):
        state = handle.state
        clone = schema.ModelProto()
        clone.CopyFrom(state._executor.model)
        state.counters.model_serializations += 1
        return FaultState(state, self)


class _DeferredCloseState(FaultState):
    def __init__(self, state, fault):
        super().__init__(state, fault)
        self.close_pending = False

    def close(self):
        if not self.state.closed and self.state._lock.locked():
            self.close_pending = True  # applied when the active call ends; returns at once
            return None
        return super().close()

    def _then_close(self, call):
        try:
            return call()
        finally:
            if self.close_pending:
                self.close_pending = False
                FaultState.close(self)

    def run(self, feeds):
        return self._then_close(lambda: FaultState.run(self, feeds))

    def run_held(self, feeds, hold):
        return self._then_close(lambda: FaultState.run_held(self, feeds, hold))


CloseReturnsDuringRun = fault("STATE-NO-RACE.close-returns-early", ("STATE-NO-RACE", "STATE-CLOSE"),
    """A close issued while a call is active only marks the state for closing and returns at once; the close happens
    when the call ends. The caller believes the state is closed while the run still executes on it.""",
    state=_DeferredCloseState)


class _ResolvingOnResetState(FaultState):
    def reset(self, initial):
        executor = self.state._executor
        if executor is not None:
            validate_bindings(executor.model, executor.catalogue)
            self.state.counters.binding_resolutions += 1
        return super().reset(initial)


BindingsResolvedOnReset = fault("STATE-RESOLVE-ONCE.resolved-on-reset", ("STATE-RESOLVE-ONCE",),
    """Resolves and validates the model's bindings again at every reset (reset rebuilds the state as make_state does)
    instead of once; reported in its ``binding_resolutions`` counter.""", state=_ResolvingOnResetState)


class _TensorsOnlyPublishedState(FaultState):
    def run(self, feeds):
        before = self.state._values
        outputs = super().run(feeds)
        after = dict(self.state._values)
        kept = {name: before[name] for name, value in after.items() if is_struct(value) and name in before}
        if kept:
            self.state._values = MappingProxyType({**after, **kept})
        return outputs


StructOutputsNotPublished = fault("STATE-WHOLE-STRUCT.struct-outputs-not-published",
    ("STATE-WHOLE-STRUCT", "STATE-EQUIV-LOOP"), """Accepts a whole struct as an initial value but publishes only tensor
    and encoded outputs after a call: a bound struct output is returned and validated, yet the state keeps the previous
    struct.""", state=_TensorsOnlyPublishedState)


def _aliases_of_selected(state, outputs) -> list[str]:
    selected = {b.output_name for b in state.bindings}
    buffers = [outputs[name] for name in selected if isinstance(outputs.get(name), np.ndarray)]
    return [name for name, value in outputs.items() if name not in selected and isinstance(value, np.ndarray)
            and any(np.shares_memory(value, kept) for kept in buffers)]


class AliasesOfSelectedRetained(Fault):
    """Tracks retention by buffer instead of by output name: an unselected output that shares the buffer
    of a selected one (an Identity of it, say) is retained too and shows up among the state's values."""

    fault_id = "STATE-UNSELECTED.aliases-of-selected-retained"
    clauses = ("STATE-UNSELECTED", "ZC-EXACT-OUTPUTS")

    def make_state(self, handle):
        return _ExtraRetainedState(handle.state, self, _aliases_of_selected)


class _DefaultFeedsState(FaultState):
    def __init__(self, state, fault, defaults):
        super().__init__(state, fault)
        self.defaults = defaults

    def run(self, feeds):
        return super().run({**self.defaults, **feeds})


class UnboundInitialAsDefaultFeed(Fault):
    """Accepts an initial value for a graph input that no binding selects and feeds it to every call that
    omits that input (a sticky default), instead of refusing a name that is not a bound input."""

    fault_id = "STATE-INITIAL.unbound-initial-as-default-feed"
    clauses = ("STATE-INITIAL", "STATE-FEEDS")

    def __init__(self) -> None:
        super().__init__()
        self._defaults: dict = {}

    def open_state(self, model_bytes, initial, base_dir=None):
        self._defaults = {}
        try:
            graph = schema.parse_model(model_bytes).graph
        except Exception:  # noqa: BLE001 - unparsable bytes go to the oracle, which classifies them
            graph = None
        if graph is not None and isinstance(initial, dict):
            bound = {b.input_name for b in graph.persistent_bindings}
            fresh = {vi.name for vi in graph.input} - bound
            self._defaults = {name: value for name, value in initial.items() if name in fresh}
            initial = {name: value for name, value in initial.items() if name not in self._defaults}
        return super().open_state(model_bytes, initial, base_dir)

    def make_state(self, handle):
        return _DefaultFeedsState(handle.state, self, self._defaults)


class InlineStructsRefused(Fault):
    """Retains structs by their catalogue type_id: a whole struct of an inline declaration (no type_id)
    cannot be bound state."""

    fault_id = "STATE-WHOLE-STRUCT.inline-structs-refused"
    clauses = ("STATE-WHOLE-STRUCT",)

    def open_state(self, model_bytes, initial, base_dir=None):
        from conformance.values import Struct

        for name, value in dict(initial).items():
            if isinstance(value, Struct) and value.type_id is None:
                raise violation(E.STATE_UNRETAINABLE, f"initial[{name!r}]", "a struct without a type_id")
        return super().open_state(model_bytes, initial, base_dir)


class _OneCallLateState(FaultState):
    def __init__(self, state, fault):
        super().__init__(state, fault)
        self.pending = None

    def run(self, feeds):
        before = self.state._values
        outputs = super().run(feeds)
        published, self.pending = self.pending, self.state._values
        self.state._values = published if published is not None else before
        return outputs

    def reset(self, initial):
        super().reset(initial)
        self.pending = None


PublishedOneCallLate = fault("STATE-EQUIV-LOOP.published-one-call-late", ("STATE-EQUIV-LOOP",),
    """Double-buffers the next state and swaps the buffers one call late: each call runs on the values the call before
    the previous one produced (the first two calls both start from the initial values).""", state=_OneCallLateState)


name_faults(globals())

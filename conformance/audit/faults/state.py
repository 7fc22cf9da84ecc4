"""Faults in the state helper: atomic publication, concurrency, feeds, resets and the stateless-loop equivalence."""

from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Callable
from types import MappingProxyType

import numpy as np

from conformance.adapters.reference import to_neutral, to_runtime
from conformance.audit.fault import Fault, FaultState, fault, hooked_state, name_faults, wrap
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


# ------------------------------------------------------ mechanisms (the bindings and payload faults use them too)
def fresh(**values) -> Callable:
    """An ``init`` giving each handle its own attributes (a callable value is a factory, called per handle)."""
    return lambda handle: vars(handle).update({k: v() if callable(v) else v for k, v in values.items()})


def edited(name: str, edit: Callable) -> type[FaultState]:
    """A state handle whose ``name`` call (run or reset) gets ``edit(handle, argument)`` instead of its argument."""
    return hooked_state(**{name: lambda handle, call, argument: call(edit(handle, argument))})


def after_run(edit: Callable, **hooks: Callable) -> type[FaultState]:
    """A state handle whose runs end with ``edit(handle, values_before, outputs)`` (which returns the outputs)."""
    def run(handle, call, feeds):
        before = handle.state._values
        return edit(handle, before, call(feeds))
    return hooked_state(run=run, **hooks)


def opening(edit: Callable) -> Callable:
    """An ``open_state`` on ``edit(fault, model_bytes, initial)`` (which may leave the next handle a ``note``)."""
    def open_state(self, model_bytes, initial, base_dir=None):
        return Fault.open_state(self, model_bytes, edit(self, model_bytes, initial), base_dir)
    return open_state


def flagged(flags: threading.local, name: str, value: Callable) -> Callable:
    """A hook setting ``flags.<name>`` to ``value(handle)`` while the reference call runs (None again after it), so
    that a fault's patches see which handle (or which of its calls) they run under."""
    def hook(handle, call, *args):
        setattr(flags, name, value(handle))
        try:
            return call(*args)
        finally:
            setattr(flags, name, None)
    return hook


def noting(pick: Callable) -> Callable:
    """An ``open_state`` leaving the handle made next the ``note`` ``pick(model_bytes, initial)``."""
    def edit(fault, model_bytes, initial):
        fault.note = pick(model_bytes, initial)
        return initial
    return opening(edit)


#: an ``open_state`` noting the model: the handle made next belongs to it
by_model = noting(lambda model_bytes, initial: model_bytes)


def per_model(fault, name: str, make: Callable):
    """The fault's ``name`` table entry for the model the handle was opened on (made by ``make`` the first time)."""
    return vars(fault).setdefault(name, {}).setdefault(fault.note, make())


def _bound_inputs(state) -> set[str]:
    return {b.input_name for b in state.bindings}


def _publish(state, values: dict) -> None:
    state._values = MappingProxyType(values)


def _zeros(spec):
    """Zeros of a tensor spec's declared static shape (None when it has none)."""
    if isinstance(spec, TensorSpec) and spec.dims is not None and all(isinstance(d, int) for d in spec.dims):
        return np.zeros(spec.dims, numpy_dtype(spec.elem_type))
    return None


def _first(work: Callable, counter: str) -> Callable:
    """A hook (or an ``init``) doing ``work(executor)`` before the reference call, reported honestly in the state's
    ``counter``."""
    def hook(handle, call=None, *args):
        if handle.state._executor is not None:
            work(handle.state._executor)
            setattr(handle.state.counters, counter, getattr(handle.state.counters, counter) + 1)
        return call(*args) if call is not None else None
    return hook


# ------------------------------------------------------------------------------------------------- the faults
def _kept_before(handle, before, outputs):
    handle.state._values = before
    return outputs


_resolving = _first(lambda executor: validate_bindings(executor.model, executor.catalogue), "binding_resolutions")
NeverAdvances = fault("STATE-EQUIV-LOOP.never-advances", ("STATE-EQUIV-LOOP",), """Returns each call's outputs but
    never stores the selected ones: every call starts again from the initial values, unlike the manual output-to-input
    loop.""", state=after_run(_kept_before))
ModelHashedEachRun = fault("STATE-NO-MODEL-SCAN.model-hashed-each-run", ("STATE-NO-MODEL-SCAN",), """Serializes
    and hashes the model on every call to detect whether the caller mutated it (and reports it honestly in its
    ``model_serializations`` counter).""", state=hooked_state(run=_first(  # hashed to detect mutation
        lambda executor: executor.model.SerializeToString(deterministic=True), "model_serializations")))
BindingsResolvedEachRun = fault("STATE-RESOLVE-ONCE.resolved-each-run", ("STATE-RESOLVE-ONCE",), """Resolves and
    validates the model's bindings again on every call instead of once when the state is made (reported in its
    ``binding_resolutions`` counter).""", state=hooked_state(run=_resolving))
BindingsResolvedOnReset = fault("STATE-RESOLVE-ONCE.resolved-on-reset", ("STATE-RESOLVE-ONCE",), """Resolves and
    validates the model's bindings again at every reset (reset rebuilds the state as make_state does) instead of once;
    reported in its ``binding_resolutions`` counter.""", state=hooked_state(reset=_resolving))

ModelClonedAtOpen = fault("STATE-NO-MODEL-SCAN.model-cloned-at-open", ("STATE-NO-MODEL-SCAN",), """Takes a private
    deep copy of the model when the state is made (to be safe from later edits by the caller), and reports the clone
    honestly in its ``model_serializations`` counter.""", state=hooked_state(init=_first(
        lambda executor: schema.ModelProto().CopyFrom(executor.model), "model_serializations")))


def _zero_filled(fault, model_bytes, initial):
    initial = dict(initial)
    try:
        resolved = validate_bindings(schema.parse_model(model_bytes))
    except ContractError:
        resolved = ()
    for binding in resolved:
        if binding.input_name not in initial and (zeros := _zeros(binding.spec)) is not None:
            initial[binding.input_name] = zeros
    return initial


def _structs_refused(which: Callable, why: str) -> Callable:
    """An ``opening`` edit refusing the initial structs ``which`` holds for (they cannot be bound state)."""
    def refuse(fault, model_bytes, initial):
        for name, value in dict(initial).items():
            if isinstance(value, Struct) and which(value):
                raise violation(E.STATE_UNRETAINABLE, f"initial[{name!r}]", why)
        return initial
    return refuse


MissingInitialZeroFilled = fault("STATE-INITIAL.zero-filled", ("STATE-INITIAL",), """Starts a bound input without an
    initial value from zeros of its declared shape instead of requiring the caller to supply it.""",
    open_state=opening(_zero_filled))
StructInitialRefused = fault("STATE-WHOLE-STRUCT.structs-refused", ("STATE-WHOLE-STRUCT",), """Retains tensors only: a
    whole structured input cannot be bound state.""",
    open_state=opening(_structs_refused(lambda struct: True, "only tensors can be retained")))
InlineStructsRefused = fault("STATE-WHOLE-STRUCT.inline-structs-refused", ("STATE-WHOLE-STRUCT",), """Retains structs
    by their catalogue type_id: a whole struct of an inline declaration (no type_id) cannot be bound state.""",
    open_state=opening(_structs_refused(lambda struct: struct.type_id is None, "a struct without a type_id")))

RetainedOutputsNotReturned = fault("STATE-UNSELECTED.selected-outputs-moved", ("STATE-UNSELECTED",), """Moves the
    selected outputs into the state and returns only the others: a call's outputs are no longer all returned.""",
    state=after_run(lambda handle, before, outputs: {name: value for name, value in outputs.items()
                                                     if name not in {b.output_name for b in handle.state.bindings}}))


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


def _missing_zero_filled(handle, feeds):
    executor = handle.state._executor
    if executor is None:
        return feeds
    feeds = dict(feeds)
    for name in executor.required_inputs:
        if name not in feeds and name not in handle.state.values:
            try:
                zeros = _zeros(executor.input_specs.get(name))
            except ContractError:
                continue
            if zeros is not None:
                feeds[name] = zeros
    return feeds


def _feeds_override(handle, feeds):
    bound = _bound_inputs(handle.state)
    overrides = {name: to_runtime(value) for name, value in feeds.items() if name in bound}
    if overrides:
        _publish(handle.state, {**handle.state._values, **overrides})
    return {name: value for name, value in feeds.items() if name not in bound}


def _equal_feeds_dropped(handle, feeds):
    retained = handle.state.values if not handle.state.closed else {}
    kept = {}
    for name, value in feeds.items():
        current = retained.get(name)
        if isinstance(current, np.ndarray) and isinstance(value, np.ndarray) and value.dtype == current.dtype \
                and value.shape == current.shape and np.array_equal(value, current):
            continue  # the same value as the retained one: not taken as an override, dropped
        kept[name] = value
    return kept


def _defaults_required(handle, feeds):
    executor = handle.state._executor
    for name in executor.input_names if executor is not None else ():
        if name in executor.defaults and name not in feeds and name not in handle.state._bound:
            raise violation(E.STATE_FEED_MISSING, f"feeds[{name!r}]", f"input {name!r} has no feed")
    return feeds


def _previous_feeds(handle, run, feeds):
    merged = {**handle.last, **feeds}
    outputs = run(merged)
    handle.last = merged
    return outputs


MissingFeedsZeroFilled = fault("STATE-FEEDS.missing-feeds-zero-filled", ("STATE-FEEDS",), """Feeds zeros of the
    declared shape for a required input the call does not supply (and the state does not retain) instead of failing the
    call.""", state=edited("run", _missing_zero_filled))
FeedsOverrideRetained = fault("STATE-FEED-OVERRIDE.feed-wins", ("STATE-FEED-OVERRIDE",), """Lets a feed for a bound
    input replace the retained value for that call (the feed wins).""", state=edited("run", _feeds_override))
EqualFeedNotAnOverride = fault("STATE-FEED-OVERRIDE.equal-feed-tolerated", ("STATE-FEED-OVERRIDE",), """Rejects a
    feed for a retained input only when it conflicts with the retained value: a feed equal to it (the caller passing the
    state's own value back) is silently dropped instead of refused.""", boundary=True,
    state=edited("run", _equal_feeds_dropped))
DefaultedInputsRequired = fault("STATE-FEEDS.defaulted-inputs-required", ("STATE-FEEDS",), """Requires a feed for
    every graph input, including one whose initializer supplies its default value (an input that is not required).""",
    state=edited("run", _defaults_required))
PreviousFeedReused = fault("STATE-FEEDS.previous-feed-reused", ("STATE-FEEDS",), """Keeps each successful call's
    feeds and, when a later call omits a fresh input, reuses the one the previous call supplied instead of failing the
    call.""", state=hooked_state(init=fresh(last=dict), run=_previous_feeds))


def _published_anyway(handle, run, feeds):
    try:
        return run(feeds)
    except ContractError as error:
        if error.code in (E.STATE_BUSY, E.STATE_CLOSED):
            raise  # refused before it ran: nothing was computed to publish
        merged = {**{k: to_runtime(v) for k, v in feeds.items()}, **handle.state.values}
        try:
            outputs = handle.executor.run(merged, check_feeds=False)
        except ContractError:
            raise error from None  # execution itself failed: nothing to publish
        _publish(handle.state, {b.input_name: outputs[b.output_name] for b in handle.state.bindings})
        raise


_PublishingState = hooked_state(run=_published_anyway)


def _publishing_open(self, model_bytes, initial, base_dir=None):
    handle = Fault.open_state(self, model_bytes, initial, base_dir)
    publishing = _PublishingState(handle.state, self, handle)
    publishing.executor = Executor(schema.parse_model(model_bytes), base_dir=base_dir,
                                   kernels=handle.state._executor.kernels)
    return publishing


PublishesAfterFailure = fault("STATE-ATOMIC.published-before-validation", ("STATE-ATOMIC", "ZC-FAILURE"), """Publishes
    the next state before validating it: when a run fails validation (or execution of a later step), the outputs it
    computed still become the retained values.""", open_state=_publishing_open, make_state=lambda self, handle: handle)


def _one_state_per_model(self, model_bytes, initial, base_dir=None):
    shared = vars(self).setdefault("shared", {})
    if model_bytes in shared and not shared[model_bytes].state.closed:
        shared[model_bytes].reset(initial)
        return shared[model_bytes]
    shared[model_bytes] = handle = Fault.open_state(self, model_bytes, initial, base_dir)
    return handle


SharedStateAcrossRequests = fault("STATE-ISOLATION.state-per-model", ("STATE-ISOLATION",), """Keeps one state
    container per loaded model: a second request over the same model shares (and re-initializes) the first request's
    retained values.""", open_state=_one_state_per_model)


def _queued(handle, call, *args):
    with handle.lock:
        return call(*args)


AllowsConcurrentCalls = fault("STATE-NO-CONCURRENCY.calls-queued", ("STATE-NO-CONCURRENCY",), """Serializes
    simultaneous calls on one state with a lock (the second waits) instead of rejecting them.""",
    state=hooked_state(init=fresh(lock=threading.Lock), run=_queued, run_held=_queued, reset=_queued, close=_queued))


ResetRestoresOpenValues = fault("STATE-RESET.restores-open-values", ("STATE-RESET",), """``reset(initial)`` restores
    the values the state was opened with, ignoring the ones passed.""",
    open_state=noting(lambda model_bytes, initial: initial),
    state=hooked_state(init=lambda handle: setattr(handle, "opened_with", dict(handle.note)),
                 reset=lambda handle, reset, initial: reset(handle.opened_with)))


def _unguarded_reset(handle, reset, initial):
    state = handle.state
    if state.closed:
        raise violation(E.STATE_CLOSED, "state.reset", "the state is closed")
    state._values = state._initial_values({k: to_runtime(v) for k, v in initial.items()})


def _unguarded_close(handle, close):
    handle.state._closed = True
    _publish(handle.state, {})


CloseIsNoOp = fault("STATE-CLOSE.close-ignored", ("STATE-CLOSE",), """``close()`` does nothing: the state keeps its
    values and accepts further calls.""", state=hooked_state(close=lambda handle, close: None))
ResetCloseRaceActiveCall = fault("STATE-NO-RACE.reset-close-unguarded", ("STATE-NO-RACE",), """Guards runs against
    each other but lets ``reset`` and ``close`` proceed during an active call.""",
    state=hooked_state(reset=_unguarded_reset, close=_unguarded_close))


_ACTIVE = threading.local()
_tracked = flagged(_ACTIVE, "state", lambda handle: handle.state)
_TrackedState = hooked_state(run=_tracked, run_cancelled=_tracked, run_held=_tracked)


def _publishing_each_binding(original):
    def check_value(value, spec, path, *args, **kwargs):
        result = original(value, spec, path, *args, **kwargs)
        state = getattr(_ACTIVE, "state", None)
        if state is not None and path.startswith("outputs["):
            for binding in state.bindings:
                if path == f"outputs[{binding.output_name!r}]":
                    # published as soon as this binding's value is checked, before the next one is
                    _publish(state, {**state._values, binding.input_name: value})
        return result
    return check_value


def _first_step_only(original):
    def check_value(value, spec, path, *args, **kwargs):
        state = getattr(_ACTIVE, "state", None)
        if state is not None and path.startswith("outputs[") and state.steps >= 1:
            return None  # the shapes were checked on the first step and are taken as stable
        return original(value, spec, path, *args, **kwargs)
    return check_value


PublishesBindingByBinding = fault("STATE-ATOMIC.published-binding-by-binding", ("STATE-ATOMIC", "ZC-FAILURE"),
    """Publishes each retained value as soon as its own output passed validation: when a later binding's output fails
    validation (or the call is cancelled before publication), the earlier bindings already hold the new values while the
    later ones keep the old.""", boundary=True, state=_TrackedState,
    patches=lambda: [wrap(state_module, "check_value", _publishing_each_binding, aliases=False)])
LaterStepsNotValidated = fault("STATE-VALIDATE-METADATA.later-steps-unchecked",
    ("STATE-VALIDATE-METADATA", "STATE-ATOMIC"), """Validates the selected outputs against the bound inputs' declared
    types on the first call only; later calls publish whatever the graph produced (the shapes are taken as stable).""",
    state=_TrackedState, patches=lambda: [wrap(state_module, "check_value", _first_step_only, aliases=False)])


def _merged_reset(handle, reset, initial):
    state = handle.state
    if state.closed or not initial:
        return reset(initial)
    kept = {name: value for name, value in state._values.items() if name not in initial}
    # the values the caller left out keep their current contents
    merged = {**kept, **{k: to_runtime(v) for k, v in initial.items()}}
    with handle.fault.injected():
        values = state._initial_values(merged)
    state._values = values
    state.steps = 0


def _reset_binding_by_binding(handle, reset, initial):
    try:
        return reset(initial)
    except ContractError:
        if handle.state.closed or not isinstance(initial, dict):
            raise
        applied = dict(handle.state._values)
        for binding in handle.state.bindings:  # the bindings before the failing one were swapped in
            name = binding.input_name
            if name not in initial:
                break
            try:
                reset({**applied, name: initial[name]})
            except ContractError:
                break
            applied = dict(handle.state._values)
        raise


PartialResetMerged = fault("STATE-RESET.partial-reset-merged", ("STATE-RESET", "STATE-INITIAL"), """``reset(initial)``
    merges the given values into the current state: a binding the caller left out keeps its current (stale) value
    instead of the reset failing for a missing initial value.""", state=hooked_state(reset=_merged_reset))
ResetIgnoresUnknownNames = fault("STATE-RESET.unknown-names-ignored", ("STATE-RESET", "STATE-INITIAL"), """Checks the
    names of the initial values when the state is opened but not on ``reset``, where values for names that are not bound
    inputs are silently dropped.""", state=edited("reset", lambda handle, initial: {
        name: value for name, value in initial.items() if name in _bound_inputs(handle.state)}))
ResetPublishedBindingByBinding = fault("STATE-RESET.published-binding-by-binding", ("STATE-RESET", "STATE-ATOMIC"),
    """Replaces the retained values of a reset one binding at a time, so a reset whose later value is invalid fails
    after the earlier bindings were already replaced.""", state=hooked_state(reset=_reset_binding_by_binding))


def _joins_family(handle):
    handle.family = per_model(handle.fault, "families", weakref.WeakSet)
    handle.family.add(handle)


def _siblings(handle) -> list:
    return [other for other in list(handle.family) if other is not handle and not other.state.closed]


def _closes_siblings(handle, close):
    result = close()
    for other in _siblings(handle):
        other.state.close()
    return result


def _resets_siblings(handle, reset, initial):
    result = reset(initial)
    for other in _siblings(handle):
        other.state._values = handle.state._values
    return result


CloseReleasesSiblings = fault("STATE-ISOLATION.close-closes-siblings", ("STATE-ISOLATION", "STATE-CLOSE"), """Keeps
    one execution context per loaded model and releases it when any state of that model is closed, so closing one
    request's state closes every other state of the same model.""", open_state=by_model,
    state=hooked_state(init=_joins_family, close=_closes_siblings))
ResetSharedAcrossStates = fault("STATE-ISOLATION.reset-shared", ("STATE-ISOLATION", "STATE-RESET"), """Stores the
    values a reset restores on the loaded model, so resetting one request's state replaces the retained values of every
    other state of the same model.""", open_state=by_model,
    state=hooked_state(init=_joins_family, reset=_resets_siblings))


def _uncached_run(handle, run, feeds):
    handle.cached = None
    return run(feeds)


def _cached_values(handle, values):
    if handle.cached is None:
        handle.cached = values()
    return handle.cached


ValuesCachedAcrossReset = fault("STATE-RESET.values-cache-stale", ("STATE-RESET", "ZC-VIEWS"), """Caches the mapping
    ``values()`` hands out and refreshes it after each run but not after a reset, so values() after a reset shows the
    state before it.""", state=hooked_state(init=fresh(cached=None), run=_uncached_run, values=_cached_values))


def _counts_model_calls(handle):
    handle.calls = per_model(handle.fault, "calls", lambda: [0])
    handle.lock = vars(handle.fault).setdefault("lock", threading.Lock())


def _counted(handle, call, *args):
    with handle.lock:
        handle.calls[0] += 1
    try:
        return call(*args)
    finally:
        with handle.lock:
            handle.calls[0] -= 1


def _refused_during_model_calls(what: str) -> Callable:
    def hook(handle, call, *args):
        if handle.calls[0] and not handle.state.closed:
            raise violation(E.STATE_BUSY, f"state.{what}", "a call is active on this model's session")
        return call(*args)
    return hook


ResetCloseGuardedPerModel = fault("STATE-ISOLATION.reset-close-guarded-per-model", ("STATE-ISOLATION", "STATE-NO-RACE"),
    """Keeps "reset or close cannot race with a call" with one count of active calls per loaded model, so a reset or
    close of one state is refused while a call on another state of the same model is active.""",
    open_state=by_model,
    state=hooked_state(init=_counts_model_calls, run=_counted, run_cancelled=_counted, run_held=_counted,
                 reset=_refused_during_model_calls("reset"), close=_refused_during_model_calls("close")))


def _guarded_per_model(handle, call, *args):
    if not handle.model_lock.acquire(blocking=False):
        raise violation(E.STATE_BUSY, "state.run", "a call is already active on this model")
    try:
        return call(*args)
    finally:
        handle.model_lock.release()


CallGuardPerModel = fault("STATE-NO-CONCURRENCY.guard-per-model", ("STATE-NO-CONCURRENCY", "STATE-ISOLATION"),
    """Implements the rejection of simultaneous calls with one busy flag per loaded model instead of per state: a call
    on another request's state over the same model is rejected too.""", open_state=by_model,
    state=hooked_state(
        init=lambda handle: setattr(handle, "model_lock", per_model(handle.fault, "locks", threading.Lock)),
        run=_guarded_per_model, run_cancelled=_guarded_per_model, run_held=_guarded_per_model))


def _close_keeping(handle, close):
    if not handle.state.closed:
        handle.kept = handle.state._values
    return close()


def _kept_values(handle, values):
    if handle.state.closed and handle.kept is not None:
        return {name: to_neutral(value) for name, value in handle.kept.items()}
    return values()


def _reopening_reset(handle, reset, initial):
    state = handle.state
    if state.closed and handle.executor is not None:
        state._closed = False  # reset re-initializes the state from scratch, closed or not
        state._executor = handle.executor
    return reset(initial)


def _close_deferred(handle, close):
    if not handle.state.closed and handle.state._lock.locked():
        handle.close_pending = True  # applied when the active call ends; returns at once
        return None
    return close()


def _then_close(handle, call, *args):
    try:
        return call(*args)
    finally:
        if handle.close_pending:
            handle.close_pending = False
            FaultState.close(handle)


ValuesReadableAfterClose = fault("STATE-CLOSE.values-readable-after-close", ("STATE-CLOSE",), """``close()`` refuses
    further calls but keeps the retained values reachable: the state-value accessor does not check whether the state is
    closed and still hands out the last retained values.""",
    state=hooked_state(init=fresh(kept=None), close=_close_keeping, values=_kept_values))
ResetReopensClosedState = fault("STATE-CLOSE.reset-reopens", ("STATE-CLOSE",), """``reset(initial)`` re-initializes a
    closed state instead of refusing: the state closed by the caller comes back to life with the new initial values and
    accepts calls again.""", state=hooked_state(init=lambda handle: setattr(handle, "executor", handle.state._executor),
                                          reset=_reopening_reset))
CloseReturnsDuringRun = fault("STATE-NO-RACE.close-returns-early", ("STATE-NO-RACE", "STATE-CLOSE"), """A close
    issued while a call is active only marks the state for closing and returns at once; the close happens when the call
    ends. The caller believes the state is closed while the run still executes on it.""",
    state=hooked_state(init=fresh(close_pending=False), close=_close_deferred, run=_then_close, run_held=_then_close))


def _paired_by_position(handle):
    state, executor = handle.state, handle.state._executor
    bound_inputs = [name for name in executor.input_names if name in state._bound]
    selected = {b.output_name for b in state.bindings}
    bound_outputs = [name for name in executor.output_names if name in selected]
    specs = {b.input_name: b.spec for b in state.bindings}
    state._plan = tuple((i, o, specs[i], f"outputs[{o!r}]") for i, o in zip(bound_inputs, bound_outputs))


BindingsPairedByPosition = fault("STATE-EQUIV-LOOP.paired-by-position", ("STATE-EQUIV-LOOP",), """Builds its
    publication plan by pairing the bound inputs, in graph input order, with the bound outputs, in graph output order,
    instead of following each binding's own output name: correct only while both lists happen to be in the same
    order.""", state=hooked_state(init=_paired_by_position))


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


def _parsed(model_bytes):
    try:
        return schema.parse_model(model_bytes)
    except Exception:  # noqa: BLE001 - unparsable bytes go to the oracle, which classifies them
        return None


InitializerAsInitialValue = fault("STATE-INITIAL.initializer-default", ("STATE-INITIAL",), """Starts a bound input
    that has a same-named dense initializer (its default value) from that initializer when the caller supplies no
    initial value (at open and at reset), instead of requiring the initial contents. One reading of the spec allows this
    (it never defines which inputs are required and lets initializer names appear as graph inputs), so only Recommended
    cases catch it.""", state=edited("reset", lambda handle, initial: _with_defaults(
        getattr(handle.state._executor, "model", None), initial)),
    open_state=opening(lambda fault, model_bytes, initial: _with_defaults(_parsed(model_bytes), initial)))


def _structs_kept(handle, before, outputs):
    after = dict(handle.state._values)
    kept = {name: before[name] for name, value in after.items() if is_struct(value) and name in before}
    if kept:
        _publish(handle.state, {**after, **kept})
    return outputs


StructOutputsNotPublished = fault("STATE-WHOLE-STRUCT.struct-outputs-not-published",
    ("STATE-WHOLE-STRUCT", "STATE-EQUIV-LOOP"), """Accepts a whole struct as an initial value but publishes only tensor
    and encoded outputs after a call: a bound struct output is returned and validated, yet the state keeps the previous
    struct.""", state=after_run(_structs_kept))


def _aliases_of_selected(state, outputs) -> list[str]:
    selected = {b.output_name for b in state.bindings}
    buffers = [outputs[name] for name in selected if isinstance(outputs.get(name), np.ndarray)]
    return [name for name, value in outputs.items() if name not in selected and isinstance(value, np.ndarray)
            and any(np.shares_memory(value, kept) for kept in buffers)]


AliasesOfSelectedRetained = fault("STATE-UNSELECTED.aliases-of-selected-retained",
    ("STATE-UNSELECTED", "ZC-EXACT-OUTPUTS"), """Tracks retention by buffer instead of by output name: an unselected
    output that shares the buffer of a selected one (an Identity of it, say) is retained too and shows up among the
    state's values.""", state=functools.partial(_ExtraRetainedState, also=_aliases_of_selected))


def _unbound_as_defaults(fault, model_bytes, initial):
    fault.note = {}
    model = _parsed(model_bytes)
    if model is not None and isinstance(initial, dict):
        graph = model.graph
        unbound = {vi.name for vi in graph.input} - {b.input_name for b in graph.persistent_bindings}
        fault.note = {name: value for name, value in initial.items() if name in unbound}
        initial = {name: value for name, value in initial.items() if name not in fault.note}
    return initial


UnboundInitialAsDefaultFeed = fault("STATE-INITIAL.unbound-initial-as-default-feed", ("STATE-INITIAL", "STATE-FEEDS"),
    """Accepts an initial value for a graph input that no binding selects and feeds it to every call that omits that
    input (a sticky default), instead of refusing a name that is not a bound input.""",
    open_state=opening(_unbound_as_defaults), state=edited("run", lambda handle, feeds: {**handle.note, **feeds}))


def _one_call_late(handle, before, outputs):
    published, handle.pending = handle.pending, handle.state._values
    handle.state._values = published if published is not None else before
    return outputs


def _reset_unpending(handle, reset, initial):
    reset(initial)
    handle.pending = None


PublishedOneCallLate = fault("STATE-EQUIV-LOOP.published-one-call-late", ("STATE-EQUIV-LOOP",), """Double-buffers the
    next state and swaps the buffers one call late: each call runs on the values the call before the previous one
    produced (the first two calls both start from the initial values).""",
    state=after_run(_one_call_late, init=fresh(pending=None), reset=_reset_unpending))


name_faults(globals())

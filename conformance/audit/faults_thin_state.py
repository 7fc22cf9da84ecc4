"""Second faults for state, KV, zero-copy and export rules that one fault used to cover: a different
mechanism each (a feed remembered from the previous call, an initializer taken for an initial value,
bindings paired by position, a close that returns before the active run ends, a reset that reopens a
closed state, an append that rewrites the last cached token, scores kept for the whole context, an
output buffer recycled in the next call, a save that keeps one binding, ...).
"""

from __future__ import annotations

import hashlib
import importlib
import threading
from types import MappingProxyType

import numpy as np

from conformance.adapters.reference import to_neutral
from conformance.audit.fault import Fault, FaultState, Patch, wrap
from conformance.audit.faults_bindings import DeferredErrorState
from reference_impl import ContractError, schema
from reference_impl.bindings import validate_bindings
from reference_impl.errors import ErrorCode as E
from reference_impl.errors import violation
from reference_impl.executor import program
from reference_impl.kv import contiguous, kernels
from reference_impl.kv.storage import KVCounters, counting_active, record
from reference_impl.tensors import to_array
from reference_impl.values import is_struct

#: the module (the package re-exports a function of the same name)
paged_attention = importlib.import_module("reference_impl.kv.paged_attention")


# ------------------------------------------------------------------------------------- STATE-CLOSE
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


class ValuesReadableAfterClose(Fault):
    """``close()`` refuses further calls but keeps the retained values reachable: the state-value accessor
    does not check whether the state is closed and still hands out the last retained values."""

    fault_id = "STATE-CLOSE.values-readable-after-close"
    clauses = ("STATE-CLOSE",)

    def make_state(self, handle):
        return _ValuesAfterCloseState(handle.state, self)


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


class ResetReopensClosedState(Fault):
    """``reset(initial)`` re-initializes a closed state instead of refusing: the state closed by the caller
    comes back to life with the new initial values and accepts calls again."""

    fault_id = "STATE-CLOSE.reset-reopens"
    clauses = ("STATE-CLOSE",)

    def make_state(self, handle):
        return _ReopeningState(handle.state, self)


# --------------------------------------------------------------------------------- STATE-EQUIV-LOOP
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


# ------------------------------------------------------------------------------------- STATE-FEEDS
class _RememberedFeedsState(FaultState):
    def __init__(self, state, fault):
        super().__init__(state, fault)
        self.last: dict = {}

    def run(self, feeds):
        merged = {**self.last, **feeds}
        outputs = super().run(merged)
        self.last = merged
        return outputs


class PreviousFeedReused(Fault):
    """Keeps each successful call's feeds and, when a later call omits a fresh input, reuses the one the
    previous call supplied instead of failing the call."""

    fault_id = "STATE-FEEDS.previous-feed-reused"
    clauses = ("STATE-FEEDS",)

    def make_state(self, handle):
        return _RememberedFeedsState(handle.state, self)


class _DefaultsRequiredState(FaultState):
    def run(self, feeds):
        executor = self.state._executor
        if executor is not None:
            for name in executor.input_names:
                if name in executor.defaults and name not in feeds and name not in self.state._bound:
                    raise violation(E.STATE_FEED_MISSING, f"feeds[{name!r}]", f"input {name!r} has no feed")
        return super().run(feeds)


class DefaultedInputsRequired(Fault):
    """Requires a feed for every graph input, including one whose initializer supplies its default value
    (an input that is not required)."""

    fault_id = "STATE-FEEDS.defaulted-inputs-required"
    clauses = ("STATE-FEEDS",)

    def make_state(self, handle):
        return _DefaultsRequiredState(handle.state, self)


# ----------------------------------------------------------------------------------- STATE-INITIAL
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


# ---------------------------------------------------------------------------- STATE-NO-CONCURRENCY
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


# ----------------------------------------------------------------------------- STATE-NO-MODEL-SCAN
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


# ------------------------------------------------------------------------------------ STATE-NO-RACE
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


class CloseReturnsDuringRun(Fault):
    """A close issued while a call is active only marks the state for closing and returns at once; the
    close happens when the call ends. The caller believes the state is closed while the run still
    executes on it."""

    fault_id = "STATE-NO-RACE.close-returns-early"
    clauses = ("STATE-NO-RACE", "STATE-CLOSE")

    def make_state(self, handle):
        return _DeferredCloseState(handle.state, self)


# ------------------------------------------------------------------------------- STATE-RESOLVE-ONCE
class _ResolvingOnResetState(FaultState):
    def reset(self, initial):
        executor = self.state._executor
        if executor is not None:
            validate_bindings(executor.model, executor.catalogue)
            self.state.counters.binding_resolutions += 1
        return super().reset(initial)


class BindingsResolvedOnReset(Fault):
    """Resolves and validates the model's bindings again at every reset (reset rebuilds the state as
    make_state does) instead of once; reported in its ``binding_resolutions`` counter."""

    fault_id = "STATE-RESOLVE-ONCE.resolved-on-reset"
    clauses = ("STATE-RESOLVE-ONCE",)

    def make_state(self, handle):
        return _ResolvingOnResetState(handle.state, self)


# ------------------------------------------------------------------------------- STATE-WHOLE-STRUCT
class _TensorsOnlyPublishedState(FaultState):
    def run(self, feeds):
        before = self.state._values
        outputs = super().run(feeds)
        after = dict(self.state._values)
        kept = {name: before[name] for name, value in after.items() if is_struct(value) and name in before}
        if kept:
            self.state._values = MappingProxyType({**after, **kept})
        return outputs


class StructOutputsNotPublished(Fault):
    """Accepts a whole struct as an initial value but publishes only tensor and encoded outputs after a
    call: a bound struct output is returned and validated, yet the state keeps the previous struct."""

    fault_id = "STATE-WHOLE-STRUCT.struct-outputs-not-published"
    clauses = ("STATE-WHOLE-STRUCT", "STATE-EQUIV-LOOP")

    def make_state(self, handle):
        return _TensorsOnlyPublishedState(handle.state, self)


# ------------------------------------------------------------------------------ KV-CAPACITY-INVALID
def _negative_attribute(name: str, replace):
    def make(original):
        def kernel(args, attrs, ctx):
            value = attrs.get(name)
            if isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value < 0:
                attrs = {**attrs, name: replace(int(value))}
            return original(args, attrs, ctx)
        return kernel
    return make


class NegativeMaxTokensUnlimited(Fault):
    """Reads a negative max_tokens as "no limit" (the -1 convention of other APIs) instead of rejecting it
    as an invalid capacity; zero is still refused."""

    fault_id = "KV-CAPACITY-INVALID.negative-max-tokens-unlimited"
    clauses = ("KV-CAPACITY-INVALID",)

    def patches(self):
        return [wrap(kernels, "paged_attention_kernel", _negative_attribute("max_tokens", lambda v: 1 << 62))]


class NegativeBlockSizeMagnitude(Fault):
    """Parses block_size into an unsigned size by its magnitude: -4 becomes a 4-token block instead of an
    invalid capacity; zero is still refused."""

    fault_id = "KV-CAPACITY-INVALID.negative-block-size-magnitude"
    clauses = ("KV-CAPACITY-INVALID",)

    def patches(self):
        return [wrap(kernels, "paged_attention_kernel", _negative_attribute("block_size", abs))]


# -------------------------------------------------------------------------------- KV-APPEND-INPLACE
def _write_from_last_token(self) -> None:
    """contiguous._Append.write starting one slot early: the past's last token is written again."""
    slots = self.storage.slots()
    past = self.past.shape[2]
    if not self.in_place:
        slots[:, :, :past] = self.past
    if past:
        slots[:, :, past - 1] = self.past[:, :, past - 1]
    slots[:, :, past:self.needed] = self.new


def _commit_from_last_token(self):
    if counting_active():
        again = self.past[:, :, -1:].nbytes if self.in_place and self.past.shape[2] else 0
        record(KVCounters(appended_bytes=self.new.nbytes + again, in_place_appends=int(self.in_place),
                          relocated_bytes=0 if self.in_place else self.past.nbytes))
    return self.storage.publish(self.needed)


class AppendRewritesLastToken(Fault):
    """Starts an in-place append's write at the last cached token (a length taken as the last valid
    index): the values stay right, but every append rewrites one old token besides the new ones."""

    fault_id = "KV-APPEND-INPLACE.last-token-rewritten"
    clauses = ("KV-APPEND-INPLACE",)
    boundary = True

    def patches(self):
        return [Patch(contiguous._Append, "write", _write_from_last_token),
                Patch(contiguous._Append, "commit", _commit_from_last_token)]


# --------------------------------------------------------------------------------------- KV-BOUNDED
_SCORES_HELD = threading.local()


def _two_pass(original):
    def attend_row(q, cache, mask, attrs, offset):
        _, hq, sq, _ = q.shape
        # the logits and weights of every cached token, held next to each group's own scratch
        _SCORES_HELD.nbytes = 2 * hq * sq * cache.count * 4
        try:
            return original(q, cache, mask, attrs, offset)
        finally:
            _SCORES_HELD.nbytes = 0
    return attend_row


def _with_held_scores(original):
    def record(nbytes):
        return original(nbytes + getattr(_SCORES_HELD, "nbytes", 0))
    return record


class ScoresForWholeContext(Fault):
    """Computes paged attention block by block but keeps every block's scores for one softmax at the end
    (a two-pass softmax): the scratch grows with the cached context instead of staying bounded."""

    fault_id = "KV-BOUNDED.scores-for-whole-context"
    clauses = ("KV-BOUNDED",)

    def patches(self):
        return [wrap(paged_attention, "_attend_row", _two_pass),
                wrap(paged_attention, "record_workspace", _with_held_scores, aliases=False)]


# ------------------------------------------------------------------------------------ ZC-NO-INPLACE
_ELEMENTWISE = ("Add", "Sub", "Mul", "Div")


def _in_place_last_operand(original):
    def standard(node, opsets, path):
        kernel = original(node, opsets, path)
        if node.op_type not in _ELEMENTWISE or node.domain not in ("", "ai.onnx"):
            return kernel

        def run(args, ctx, values):
            if len(args) == 2 and all(isinstance(x, np.ndarray) for x in args):
                a, b = args
                shape = np.broadcast_shapes(a.shape, b.shape)
                if b.shape == shape and b.dtype == np.result_type(a, b) and b.dtype.kind in "iuf" and b.size:
                    expected = kernel(args, ctx, values)
                    try:
                        b.flags.writeable = True
                    except ValueError:
                        return expected
                    np.copyto(b, expected[0])  # the output written over its last operand
                    return [b]
            return kernel(args, ctx, values)
        return run
    return standard


class InPlaceLastOperand(Fault):
    """Writes an elementwise Add/Sub/Mul/Div result over its second operand when that operand has the
    output's shape and type, although the buffer is still referenced by the previous state, a feed or a
    returned output."""

    fault_id = "ZC-NO-INPLACE.in-place-last-operand"
    clauses = ("ZC-NO-INPLACE",)

    def patches(self):
        return [wrap(program, "_standard", _in_place_last_operand)]


class _RecyclingState(FaultState):
    def __init__(self, state, fault):
        super().__init__(state, fault)
        self.pool: dict = {}

    def run(self, feeds):
        outputs = super().run(feeds)
        selected = {b.output_name for b in self.state.bindings}
        for name, value in list(outputs.items()):
            if name in selected or not isinstance(value, np.ndarray) or value.dtype.kind not in "biuf":
                continue
            previous = self.pool.get(name)
            if previous is not None and previous.shape == value.shape and previous.dtype == value.dtype \
                    and previous is not value and not np.shares_memory(previous, value):
                previous.flags.writeable = True
                np.copyto(previous, value)  # last call's buffer reused for this call's output
                outputs[name] = previous
            elif value.base is None and value.flags.owndata and value.flags.writeable:
                self.pool[name] = value
        return outputs


class OutputBuffersRecycled(Fault):
    """Keeps an output buffer pool per state: each unselected output is written into the buffer the same
    output had in the previous call, although the caller may still hold that returned output."""

    fault_id = "ZC-NO-INPLACE.output-buffers-recycled"
    clauses = ("ZC-NO-INPLACE", "ZC-OUTSTANDING")

    def make_state(self, handle):
        return _RecyclingState(handle.state, self)


# ------------------------------------------------------------------------------------- EXP-PRESERVE
class SaveKeepsOneBinding(Fault):
    """Writes persistent_bindings as a singular field when it saves a model (explicit save, round trip,
    onnx-light export): only the last binding survives."""

    fault_id = "EXP-PRESERVE.save-keeps-last-binding"
    clauses = ("EXP-PRESERVE",)
    boundary = True

    def on_save(self, model) -> None:
        bindings = list(model.graph.persistent_bindings)
        if len(bindings) > 1:
            del model.graph.persistent_bindings[:]
            model.graph.persistent_bindings.add().CopyFrom(bindings[-1])


# ------------------------------------------------------------------------------- EXP-VALIDATE-FINAL
class BindingTypesCheckedAtFirstRun(Fault):
    """Checks only the binding names when the session is constructed; type and shape compatibility is
    found out when the first call publishes the output, which then fails."""

    fault_id = "EXP-VALIDATE-FINAL.types-checked-at-first-run"
    clauses = ("EXP-VALIDATE-FINAL", "BIND-COMPATIBLE")

    def open_state(self, model_bytes, initial, base_dir=None):
        try:
            return super().open_state(model_bytes, initial, base_dir)
        except ContractError as error:
            if error.code is not E.BINDING_INCOMPATIBLE:
                raise
            model = schema.parse_model(model_bytes)
            model.graph.ClearField("persistent_bindings")
            handle = super().open_state(model.SerializeToString(), {}, base_dir)
            late = violation(E.STATE_RUN_FAILED, error.path, f"{error.code.value}: {error.message}",
                             causes=(error.code,))
            return DeferredErrorState(handle.state, late)


# -------------------------------------------------------------------- STATE-UNSELECTED, ZC-EXACT-OUTPUTS
class _ExtraRetainedState(FaultState):
    """Retains, besides the bound outputs, the unselected outputs ``also(outputs)`` names."""

    def __init__(self, state, fault, also):
        super().__init__(state, fault)
        self.also = also
        self.extra: dict = {}

    def run(self, feeds):
        outputs = super().run(feeds)
        self.extra = {name: outputs[name] for name in self.also(self.state, outputs)}
        return outputs

    def reset(self, initial):
        super().reset(initial)
        self.extra = {}

    def values(self):
        return {**self.extra, **super().values()}


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


def _producer_siblings(state, outputs) -> list[str]:
    executor = state._executor
    if executor is None:
        return []
    selected = {b.output_name for b in state.bindings}
    found = []
    for node in executor.model.graph.node:
        if selected.intersection(node.output):
            found += [name for name in node.output if name in outputs and name not in selected]
    return found


class ProducerOutputsRetained(Fault):
    """Switches persistence on per node: every graph output of a node that produces a bound output (the
    Y of an Attention whose present is bound, the other half of a Split) is retained too."""

    fault_id = "ZC-EXACT-OUTPUTS.producer-outputs-retained"
    clauses = ("ZC-EXACT-OUTPUTS", "STATE-UNSELECTED")

    def make_state(self, handle):
        return _ExtraRetainedState(handle.state, self, _producer_siblings)


# ------------------------------------------------------------------------------ more second faults
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


class PublishedOneCallLate(Fault):
    """Double-buffers the next state and swaps the buffers one call late: each call runs on the values the
    call before the previous one produced (the first two calls both start from the initial values)."""

    fault_id = "STATE-EQUIV-LOOP.published-one-call-late"
    clauses = ("STATE-EQUIV-LOOP",)

    def make_state(self, handle):
        return _OneCallLateState(handle.state, self)

"""Faults in zero-copy ownership: retained buffers, views, read-only values and counters."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from types import MappingProxyType

import numpy as np

from conformance.adapters.reference import to_neutral, to_runtime
from conformance.audit.fault import (
    TESTEE_COPIES_RETURNED_VALUES,
    Fault,
    FaultState,
    fault,
    hooked_state,
    name_faults,
    returning,
    wrap,
)
from conformance.audit.faults.shared import _INDEX_PATH, _ExtraRetainedState, _map_neutral
from conformance.values import Encoded
from reference_impl import state as state_module
from reference_impl.errors import ContractError, violation
from reference_impl.errors import ErrorCode as E
from reference_impl.executor import kernels, program
from reference_impl.values import EncodedValue, StructValue, leaves


# ------------------------------------------------------------------------------------ copies
def _detached(value):
    """A deep copy of a runtime value: what a deep-copy or serialization-based detachment helper gives."""
    if isinstance(value, np.ndarray):
        return value.copy()
    if isinstance(value, StructValue):
        return StructValue({k: _detached(v) for k, v in value.items()}, value.type_id)
    if isinstance(value, EncodedValue):
        return EncodedValue(value.header, value.payload.copy())
    if isinstance(value, list):
        return [_detached(v) for v in value]
    return value


def neutral_copy(value):
    """A deep copy of a neutral value (arrays copied, structure rebuilt)."""
    return to_neutral(_detached(to_runtime(value)))


def _copied(values: dict, copy=neutral_copy) -> dict:
    """Named values, each replaced by ``copy(value)``."""
    return {name: copy(value) for name, value in values.items()}


def _encoded_copied(value):
    return _map_neutral(value, on_encoded=lambda e: Encoded(e.header, e.payload.copy()))


def _fields_copied(value, strings: bool = True):
    """The value with the tensor fields of its structs copied (string fields too, unless not ``strings``)."""
    def copy(array, inside):
        return array.copy() if inside and (strings or array.dtype.kind not in "OUS") else array
    return _map_neutral(value, on_array=copy)


def _arrays(values: dict, strings: bool = True) -> list:
    """The array leaves of named (neutral or runtime) values; string tensors too unless not ``strings``."""
    return [leaf for name, value in values.items() for _, leaf in leaves(to_runtime(value), name)
            if isinstance(leaf, np.ndarray) and (strings or leaf.dtype.kind not in "OUS")]


def _shares(name: str, value, arrays: list) -> bool:
    """Whether an array of ``value`` shares memory with one of ``arrays``."""
    return any(np.shares_memory(leaf, other) for leaf in _arrays({name: value}) for other in arrays)


def _buffers(value, name: str = "value", encoded_only: bool = False) -> list:
    """The arrays behind the leaves of a runtime value (an encoded value's payload), or of its encoded leaves only."""
    return [leaf.payload if isinstance(leaf, EncodedValue) else leaf for _, leaf in leaves(value, name)
            if not encoded_only or isinstance(leaf, EncodedValue)]


def _root(array: np.ndarray) -> np.ndarray:
    """The array owning the memory behind a view."""
    while isinstance(array.base, np.ndarray):
        array = array.base
    return array


def _bound(handle) -> set:
    return {b.output_name for b in handle.state.bindings}


# ------------------------------------------------------------------------------- state hooks
def _copying_arguments(copy):
    """A hook (run, reset) giving the call ``copy(value)`` for each value it was given."""
    return lambda handle, call, values, *rest: call(_copied(values, copy), *rest)


def _copying_results(copy):
    """A hook (run, values) handing out ``copy(value)`` for each value the call returned."""
    return lambda handle, call, *args: _copied(call(*args), copy)


def _initial_copied(copy) -> dict:
    """The adapter members of a runtime taking the initial values given to open and reset on as ``copy(value)``."""
    return {"open_state": lambda self, model_bytes, initial, base_dir=None: Fault.open_state(
                self, model_bytes, _copied(initial, copy), base_dir),
            "state": hooked_state(reset=_copying_arguments(copy))}


def _outputs_retained_copied(handle, call, feeds):
    outputs = call(feeds)
    retained = _bound(handle)
    return {name: neutral_copy(value) if name in retained else value for name, value in outputs.items()}


def _defensive_copy(handle, call, feeds):
    outputs = call(feeds)
    state = handle.state
    copies = _copied(state._values, _detached)
    state.counters.payload_bytes_copied += sum(leaf.nbytes for name, value in copies.items()
                                               for _, leaf in leaves(value, name) if hasattr(leaf, "nbytes"))
    state._values = MappingProxyType(copies)
    return outputs


def _strings_refused(where: str, message: str):
    """A run hook refusing string tensors among the feeds (before the call) or the outputs (after it)."""
    def run(handle, call, feeds):
        given = feeds if where == "feeds" else call(feeds)
        for name, value in given.items():
            if isinstance(value, np.ndarray) and value.dtype.kind in "OUS":
                raise violation(E.BINDING_STRING, f"{where}[{name!r}]", message)
        return call(feeds) if where == "feeds" else given
    return run


def _aliasing_refused(handle, call, feeds):
    before = handle.state._values
    outputs = call(feeds)
    retained = _arrays(handle.state._values)
    for name, value in outputs.items():
        if _shares(name, value, retained):
            handle.state._values = before
            raise violation(E.STATE_UNRETAINABLE, f"outputs[{name!r}]", "an output aliases retained state")
    return outputs


def scrub(value, encoded_only: bool = False) -> None:
    """Zero the memory behind every leaf of ``value`` (or behind its encoded payloads only), through the base
    arrays, as a runtime scrubbing what it releases would."""
    for root in [_root(array) for array in _buffers(value, encoded_only=encoded_only) if isinstance(array, np.ndarray)]:
        if root.size:
            try:
                root.flags.writeable = True
            except ValueError:
                continue
            root[...] = 0


def _scrubbed_on_close(encoded_only: bool):
    """A close hook scrubbing the retained values once the state is closed (or their encoded payloads only)."""
    def close(handle, call):
        retained = list(handle.state._values.values()) if not handle.state.closed else []
        call()
        for value in retained:
            scrub(value, encoded_only)
    return close


def restoring_backup(state, call, caught: type[BaseException] | tuple = ContractError):
    """``call()`` after taking a backup copy of ``state``'s retained values, put back (unless the state
    was closed) when the call raises ``caught``: a rollback by copies instead of by keeping the buffers."""
    backup = _copied(state._values, _detached)
    try:
        return call()
    except caught:
        if not state.closed:
            state._values = MappingProxyType(backup)
        raise


def _backed_up(caught=ContractError):
    """A hook running its call under ``restoring_backup``."""
    return lambda handle, call, *args: restoring_backup(handle.state, lambda: call(*args), caught)


def _keep_last(handle, call, feeds):
    handle.last = call(feeds)
    return handle.last


def _reset_writable(handle, call, initial):
    result = call(initial)
    for name, value in handle.state._values.items():
        for array in _buffers(value, name):
            if isinstance(array, np.ndarray) and not array.flags.writeable:
                with contextlib.suppress(ValueError):
                    array.flags.writeable = True
    return result


def _forwarded_feed_copied(handle, call, feeds):
    fed = _arrays(feeds, strings=False)
    outputs = call(feeds)
    bound = {b.output_name: b.input_name for b in handle.state.bindings}
    retained = dict(handle.state._values)
    for name, value in list(outputs.items()):
        if name in bound and _shares(name, value, fed):
            outputs[name] = neutral_copy(value)
            retained[bound[name]] = to_runtime(outputs[name])
    handle.state._values = MappingProxyType(retained)
    return outputs


def _views_counted(handle, call):
    found = call()
    handle.state.counters.payload_bytes_copied += sum(array.nbytes for name, value in found.items()
                                                      for array in _buffers(to_runtime(value), name)
                                                      if isinstance(array, np.ndarray))
    return found


def _reset_in_place(handle, call, initial):
    state = handle.state
    previous = dict(state._values) if not state.closed else {}
    call(initial)
    restored = dict(state._values)
    for name, old in previous.items():
        new = restored.get(name)
        if isinstance(old, np.ndarray) and isinstance(new, np.ndarray) and old.shape == new.shape \
                and old.dtype == new.dtype and old.dtype.kind not in "OUS":
            try:
                _root(old).flags.writeable = True
            except ValueError:
                continue
            old.flags.writeable = True
            old[...] = new  # the initial values restored into the state's existing buffers
            old.flags.writeable = False
            restored[name] = old
    state._values = MappingProxyType(restored)


def _initial_snapshotted(handle, call):
    found = call()
    return found if handle.state.steps else _copied(found)


def _unselected_aliases_copied(handle, call, feeds):
    outputs = call(feeds)
    bound = _bound(handle)
    retained = _arrays(handle.state._values, strings=False)
    for name, value in list(outputs.items()):
        if name not in bound and _shares(name, value, retained):
            outputs[name] = neutral_copy(value)  # "an unselected output must not alias retained state"
    return outputs


class _PoisonedState(FaultState):
    """After a failed run, refuses every later run (the state is marked broken)."""

    broken = False

    def run(self, feeds):
        if self.broken:
            raise violation(E.STATE_RUN_FAILED, "state.run", "an earlier run failed; the state is unusable")
        try:
            return super().run(feeds)
        except ContractError as error:
            if error.code is E.STATE_RUN_FAILED:
                self.broken = True
            raise

    def reset(self, initial):
        super().reset(initial)
        self.broken = False


class _ViewedGuardState(FaultState):
    """Refuses its fault's ``guards`` call (close or reset) while the caller holds views from ``values()``."""

    viewed = False

    def values(self):
        found = super().values()
        self.viewed = True
        return found

    def run(self, feeds):
        outputs = super().run(feeds)
        self.viewed = False
        return outputs

    def _guard(self, what):
        if self.fault.guards == what and self.viewed and not self.state.closed:
            raise violation(E.STATE_BUSY, f"state.{what}", "retained values are still viewed by the caller")

    def close(self):
        self._guard("close")
        return super().close()

    def reset(self, initial):
        self._guard("reset")
        result = super().reset(initial)
        self.viewed = False
        return result


class _RecyclingState(FaultState):
    def __init__(self, state, fault):
        super().__init__(state, fault)
        self.pool: dict = {}

    def run(self, feeds):
        outputs = super().run(feeds)
        selected = _bound(self)
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


# ---------------------------------------------------------------------------- kernel patches
def _local_kernel(change):
    """A local kernel factory wrapper: its kernels run as ``change(kernel, inputs, ctx)``."""
    def make(factory):
        def build(node, session):
            kernel = factory(node, session)
            return lambda inputs, ctx: change(kernel, inputs, ctx)
        return build
    return make


def _scribble(value) -> None:
    """Overwrite an encoded value's bytes in place: its owner's buffer when it is writable, else the value."""
    root = _root(value.payload)
    if root.flags.writeable:
        root[...] = 0
    else:
        value.payload = np.zeros_like(value.payload)
        value.source = None


def _decoded_in_place(kernel, inputs, ctx):
    result = kernel(inputs, ctx)
    if isinstance(inputs[0], EncodedValue):
        _scribble(inputs[0])  # the encoded input used as scratch once it is decoded
    return result


def _program_kernel(change):
    """A kernel builder wrapper (If, function call): its kernels run as ``change(kernel, args, ctx, values)``."""
    def make(original):
        def build(*given, **options):
            kernel, height = original(*given, **options)
            return (lambda args, ctx, values: change(kernel, args, ctx, values)), height
        return build
    return make


class _DetachedScope(Mapping):
    """An If branch's view of the enclosing scope that hands out deep copies of the captured values."""

    def __init__(self, values):
        self.values = values

    def __getitem__(self, name):
        return _detached(self.values[name])

    def __iter__(self):
        return iter(self.values)

    def __len__(self):
        return len(self.values)


#: a kernel builder wrapper (If, function call) whose kernels deep-copy every value they return
detached_outputs = _program_kernel(lambda kernel, args, ctx, values: [_detached(v) for v in kernel(args, ctx, values)])


def _in_place_add(original):
    def standard(node, opsets, path):
        kernel = original(node, opsets, path)
        if node.op_type != "Add" or node.domain not in ("", "ai.onnx"):
            return kernel

        def run(args, ctx, values):
            a, b = args
            if isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.shape == np.broadcast_shapes(
                    a.shape, b.shape) and a.dtype == np.result_type(a, b):
                try:
                    a.flags.writeable = True
                except ValueError:
                    return kernel(args, ctx, values)
                np.add(a, b, out=a)
                return [a]
            return kernel(args, ctx, values)
        return run
    return standard


def _in_place_last_operand(original):
    def standard(node, opsets, path):
        kernel = original(node, opsets, path)
        if node.op_type not in ("Add", "Sub", "Mul", "Div") or node.domain not in ("", "ai.onnx"):
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


def _adopted_copy(copies, copy=np.array):
    """state._adopt_array taking a (non-string) array on as ``copy(array)`` when ``copies(array, path)``."""
    def make(original):
        def adopt_array(array, path, counters, persistent, owned):
            if array.dtype.kind not in "OUS" and copies(array, path):
                array = copy(array)
            return original(array, path, counters, persistent, owned)
        return adopt_array
    return make


def _encoded_counted(adopted, value, path, counters, persistent):
    counters.payload_bytes_copied += adopted.payload.nbytes  # the repackaged value counted as a copy
    counters.payload_allocations += 1
    return adopted


def _feeds_adopted_persistent(original):
    def adopting(value, path, counters, *, persistent, **options):
        if path.startswith("feeds["):
            persistent = True  # one adoption routine for everything entering the state
        return original(value, path, counters, persistent=persistent, **options)
    return adopting


# ------------------------------------------------------------------------------------ faults
InitialValuesCopied = fault("ZC-RETAIN.initial-values-copied", ("ZC-RETAIN",),
    """Takes a private copy of the initial values given to ``open`` and ``reset`` instead of retaining the caller's
    buffers.""", **_initial_copied(neutral_copy))

ValuesAreSnapshots = fault("ZC-VIEWS.values-snapshots", ("ZC-VIEWS",),
    """``values()`` returns deep-copy snapshots of the retained values instead of shared views.""",
    state=hooked_state(values=_copying_results(neutral_copy)))

RetainedOutputsDuplicated = fault("ZC-NO-DUPLICATE.returned-outputs-duplicated", ("ZC-NO-DUPLICATE",),
    """Retains the selected outputs but returns duplicates of them to the caller.""",
    state=hooked_state(run=_outputs_retained_copied))

DefensiveCopyRetained = fault("ZC-NO-PAYLOAD-COPY.defensive-copy", ("ZC-NO-PAYLOAD-COPY",),
    """Retains a defensive copy of each selected output (state management copies payload bytes), so the next call does
    not receive the buffer the previous call returned.""", state=hooked_state(run=_defensive_copy))

FeedsCopiedAtEntry = fault("ZC-ENTRY-POINTS.feeds-copied", ("ZC-ENTRY-POINTS",),
    """Converts every NumPy feed into a tensor of its own (a copy) at the entry point, so a fed buffer forwarded to a
    bound output is not the caller's buffer.""",
    state=hooked_state(run=_copying_arguments(lambda v: np.array(v) if isinstance(v, np.ndarray) else v)))

StringFeedsRefused = fault("ZC-STRINGS-NONPERSISTENT.string-feeds-refused", ("ZC-STRINGS-NONPERSISTENT",),
    """Adopts every feed of a stateful session as if it were persistent, so ordinary string feeds are refused.""",
    state=hooked_state(run=_strings_refused("feeds", "string tensors are not supported by a state")))

AliasingRefused = fault("ZC-SHARED-STORAGE.aliasing-refused", ("ZC-SHARED-STORAGE",),
    """Refuses to return an output that shares storage with the retained state (an alias check), instead of letting
    returned outputs and retained state share storage.""", state=hooked_state(run=_aliasing_refused))

ScrubsOnClose = fault("ZC-OUTSTANDING.scrub-on-close", ("ZC-OUTSTANDING",),
    """Zeroes the retained buffers when the state is closed (a security scrub), invalidating views the caller still
    holds.""", testee_blind=TESTEE_COPIES_RETURNED_VALUES, state=hooked_state(close=_scrubbed_on_close(False)))

FieldTransportCopies = fault("ZC-TRANSPORT.field-transport-copies", ("ZC-TRANSPORT", "PAY-FIELD-OWNERS"),
    """Reads struct fields (GetField) and assembles structs (MakeStruct) into detached copies instead of handing the
    fields' buffers and owners through.""",
    patches=lambda: [wrap(kernels.LOCAL_KERNELS, op, _local_kernel(
        lambda kernel, inputs, ctx: [_detached(v) for v in kernel(inputs, ctx)])) for op in ("GetField", "MakeStruct")])

FunctionInputsDetached = fault("ZC-TRANSPORT.function-inputs-detached", ("ZC-TRANSPORT",),
    """Detaches the values passed into a function call (each argument deep-copied into the function's scope, struct
    fields and encoded payloads included) instead of handing the caller's buffers through.""", boundary=True,
    patches=lambda: [wrap(program, "_function_call", _program_kernel(
        lambda kernel, args, ctx, values: kernel([_detached(a) for a in args], ctx, values)))])

IfOutputsDetached = fault("ZC-TRANSPORT.if-outputs-detached", ("ZC-TRANSPORT",),
    """Deep-copies the values an If branch returns to the enclosing graph (struct fields and encoded payloads included)
    instead of passing their owners on.""", boundary=True, patches=lambda: [wrap(program, "_if", detached_outputs)])

DecodeScratchesInput = fault("ZC-READ-ONLY.decode-scratches-input", ("ZC-READ-ONLY", "PAY-READ-ONLY"),
    """Uses an encoded input's payload as scratch space once its Decode has produced the values, although the buffer is
    still shared or retained (the state's own value, the caller's feed or initializer).""",
    patches=lambda: [wrap(kernels.LOCAL_KERNELS, "Decode", _local_kernel(_decoded_in_place))])

InPlaceAdd = fault("ZC-NO-INPLACE.in-place-add", ("ZC-NO-INPLACE",), """Reuses an Add's first input buffer for its
    output when the shapes allow, even though that buffer is still referenced by the previous state or a returned
    output.""", patches=lambda: [wrap(program, "_standard", _in_place_add)])

RollbackFromBackup = fault("ZC-FAILURE.backup-copy-restored", ("ZC-FAILURE",),
    """Takes a backup copy of the state before each call and restores the copy when the call fails.""",
    state=hooked_state(run=_backed_up()))

ContextWidePersistence = fault("ZC-EXACT-OUTPUTS.every-output-retained", ("ZC-EXACT-OUTPUTS",),
    """Switches the whole call into a persistence mode that retains every output, not just the exact outputs the
    bindings select.""",
    state=hooked_state(run=_keep_last, values=lambda handle, call: {**getattr(handle, "last", {}), **call()}))

FailedRunPoisonsState = fault("ZC-FAILURE.failed-run-poisons-state", ("ZC-FAILURE", "STATE-ATOMIC"),
    """Marks the state broken when a run fails: the previous values stay readable, but every later run is refused until
    a reset, instead of the state staying valid for the next call.""", state=_PoisonedState)

EncodedValuesSnapshotted = fault("ZC-VIEWS.encoded-payloads-snapshotted", ("ZC-VIEWS", "ZC-NO-PAYLOAD-COPY"),
    """``values()`` shares retained tensors but hands out a copy of every encoded value's payload (the encoded wrapper
    is rebuilt with its bytes detached).""", state=hooked_state(values=_copying_results(_encoded_copied)))

StructFieldsSnapshotted = fault("ZC-VIEWS.struct-fields-snapshotted", ("ZC-VIEWS", "ZC-TRANSPORT"),
    """``values()`` shares retained whole tensors but copies the tensor fields of retained structs (the struct view is
    materialized field by field).""", state=hooked_state(values=_copying_results(_fields_copied)))

ResetCopiesInitialValues = fault("ZC-RETAIN.reset-copies", ("ZC-RETAIN", "STATE-RESET"),
    """Retains the initial values given to ``open`` by reference but takes a private copy of the values given to
    ``reset`` (the reset path reuses a "restore a snapshot" helper).""",
    state=hooked_state(reset=_copying_arguments(neutral_copy)))

ResetValuesLeftWritable = fault("ZC-READ-ONLY.reset-values-writable", ("ZC-READ-ONLY",),
    """The reset path retains the caller's buffers without freezing them, so the values handed out after a reset are
    writable views (open and run freeze them).""", state=hooked_state(reset=_reset_writable))

SequenceElementsCopied = fault("ZC-RETAIN.sequence-elements-copied", ("ZC-RETAIN", "ZC-NO-PAYLOAD-COPY"),
    """Retains whole tensors and struct fields by reference but rebuilds everything inside a sequence (a paged cache's
    blocks and their fields) as new arrays when a sequence is taken on.""",
    patches=lambda: [wrap(state_module, "_adopt_array", _adopted_copy(lambda array, path: _INDEX_PATH.search(path)))])

ScalarValuesCopied = fault("ZC-RETAIN.scalars-copied", ("ZC-RETAIN", "ZC-NO-PAYLOAD-COPY"),
    """Takes 0-d tensors (a cache length, a step counter) on as Python scalars and rebuilds them, so a retained scalar
    is a new buffer each time it is retained.""", boundary=True,
    patches=lambda: [wrap(state_module, "_adopt_array", _adopted_copy(lambda array, path: array.ndim == 0))])

ForwardedFeedCopied = fault("ZC-NO-DUPLICATE.forwarded-feed-copied", ("ZC-NO-DUPLICATE", "ZC-RETAIN"),
    """Copies a selected output that aliases one of the call's feeds (to avoid retaining caller memory), instead of
    retaining and returning the caller's buffer.""", state=hooked_state(run=_forwarded_feed_copied))

ViewsCountedAsCopies = fault("ZC-NO-PAYLOAD-COPY.views-counted-as-copies", ("ZC-NO-PAYLOAD-COPY",),
    """Counts the bytes of every view ``values()`` hands out as copied payload bytes (the counter is bumped in a shared
    "export value" helper), so the copy counters misreport state-view access.""",
    state=hooked_state(values=_views_counted))

EncodedScrubbedOnClose = fault("ZC-OUTSTANDING.encoded-scrubbed-on-close", ("ZC-OUTSTANDING", "PAY-READ-ONLY"),
    """Zeroes retained encoded payloads (quantized weights, KV blocks) when the state closes, leaving plain tensors
    alone, so an outstanding view of an encoded value reads zeros.""", testee_blind=TESTEE_COPIES_RETURNED_VALUES,
    state=hooked_state(close=_scrubbed_on_close(True)))

ResetRestoresInPlace = fault("ZC-OUTSTANDING.reset-writes-previous-buffers",
    ("ZC-OUTSTANDING", "ZC-NO-INPLACE", "ZC-RETAIN"), """Restores the initial values of a reset by writing them into the
    buffers the state already holds (when shape and type match), instead of retaining the caller's new buffers;
    outstanding views of the previous state change.""", state=hooked_state(reset=_reset_in_place))

ReadOnlyBuffersCopied = fault("ZC-ENTRY-POINTS.read-only-buffers-copied", ("ZC-ENTRY-POINTS", "ZC-RETAIN"),
    """Takes a caller's read-only buffer (a memory-mapped or frozen array) on by copying it into a writable array
    instead of sharing it.""", patches=lambda: [wrap(state_module, "_adopt_array", _adopted_copy(
        lambda array, path: not array.flags.writeable, np.ndarray.copy))])

EncodedOutputsDuplicated = fault("ZC-NO-DUPLICATE.encoded-outputs-duplicated", ("ZC-NO-DUPLICATE",),
    """Retains encoded outputs by reference but returns a duplicate of every encoded output's payload to the caller
    (plain tensor outputs are returned as they are).""",
    state=hooked_state(run=_copying_results(_encoded_copied)))

CancelRestoresBackup = fault("ZC-FAILURE.cancel-backup-restored", ("ZC-FAILURE",),
    """On the cancellable path only, takes a backup copy of the state before the call and restores the copy when the
    call is cancelled or fails (plain runs keep the previous buffers as they should).""",
    state=hooked_state(run_cancelled=_backed_up(Exception), run_held=_backed_up(Exception)))

CloseRefusedWhileViewed = fault("ZC-OUTSTANDING.close-refused-while-viewed", ("ZC-OUTSTANDING", "STATE-CLOSE"),
    """Refuses to close a state while the caller holds views from ``values()`` (reference-counted buffers in use),
    instead of letting outstanding views outlive the state.""", guards="close", state=_ViewedGuardState)

ResetRefusedWhileViewed = fault("ZC-OUTSTANDING.reset-refused-while-viewed", ("ZC-OUTSTANDING", "STATE-RESET"),
    """Refuses to reset a state while the caller holds views from ``values()``, instead of letting the outstanding
    views outlive the values they show.""", guards="reset", state=_ViewedGuardState)

StructInitialFieldsCopied = fault("ZC-RETAIN.struct-initial-fields-copied", ("ZC-RETAIN", "PAY-FIELD-OWNERS"),
    """Takes each tensor field of a whole struct initial value (open and reset) on as its own private copy (fields are
    re-materialized one by one), while whole tensors are retained by reference.""",
    **_initial_copied(lambda value: _fields_copied(value, strings=False)))

InitialValuesSnapshotted = fault("ZC-VIEWS.initial-values-snapshotted", ("ZC-VIEWS", "ZC-RETAIN"),
    """``values()`` hands out copies while the state still holds the caller's initial values (no call yet since open or
    reset, "to protect the caller's buffers"), and shared views afterwards.""",
    state=hooked_state(values=_initial_snapshotted))

StringOutputsRefused = fault("ZC-STRINGS-NONPERSISTENT.string-outputs-refused", ("ZC-STRINGS-NONPERSISTENT",),
    """Adopts every output of a stateful call as if it were retained, so an ordinary (unselected) string output makes
    the call fail.""", state=hooked_state(run=_strings_refused("outputs", "string tensors cannot be held by a state")))

AliasedOutputsSplit = fault("ZC-SHARED-STORAGE.unselected-aliases-copied", ("ZC-SHARED-STORAGE", "ZC-NO-DUPLICATE"),
    """Copies an unselected returned output that shares storage with the retained state (the input the call received, or
    the value it retains), instead of letting returned outputs and state share it.""",
    state=hooked_state(run=_unselected_aliases_copied))

FunctionOutputsDetached = fault("ZC-TRANSPORT.function-outputs-detached", ("ZC-TRANSPORT",),
    """Deep-copies the values a function call returns to its caller (struct fields and encoded payloads included)
    instead of passing their owners on; the arguments go in as they are.""", boundary=True,
    patches=lambda: [wrap(program, "_function_call", detached_outputs)])

IfCapturesDetached = fault("ZC-TRANSPORT.if-captures-detached", ("ZC-TRANSPORT",),
    """Builds an If branch's scope from deep copies of the enclosing values it captures, instead of handing the outer
    buffers and owners into the branch.""", boundary=True, patches=lambda: [wrap(program, "_if", _program_kernel(
        lambda kernel, args, ctx, values: kernel(args, ctx, _DetachedScope(values))))])

EncodedAdoptionCountedAsCopy = fault("ZC-NO-PAYLOAD-COPY.encoded-counted-as-copied", ("ZC-NO-PAYLOAD-COPY",),
    """Shares encoded payloads correctly but reports each encoded value it takes on as a payload copy (the counter is
    bumped where the encoded wrapper is rebuilt), so its copy counters misreport.""",
    patches=lambda: [returning(state_module, "_adopt_encoded", _encoded_counted)])

StructFeedStringsRefused = fault("ZC-STRINGS-NONPERSISTENT.struct-feed-strings-refused", ("ZC-STRINGS-NONPERSISTENT",),
    """Adopts fresh structured feeds with the rules for retained values, so a string field in a fresh (non-persistent)
    struct feed is refused; plain string tensor feeds still work.""",
    patches=lambda: [wrap(state_module, "adopt", _feeds_adopted_persistent, aliases=False)])

InPlaceLastOperand = fault("ZC-NO-INPLACE.in-place-last-operand", ("ZC-NO-INPLACE",),
    """Writes an elementwise Add/Sub/Mul/Div result over its second operand when that operand has the output's shape and
    type, although the buffer is still referenced by the previous state, a feed or a returned output.""",
    patches=lambda: [wrap(program, "_standard", _in_place_last_operand)])

OutputBuffersRecycled = fault("ZC-NO-INPLACE.output-buffers-recycled", ("ZC-NO-INPLACE", "ZC-OUTSTANDING"),
    """Keeps an output buffer pool per state: each unselected output is written into the buffer the same output had in
    the previous call, although the caller may still hold that returned output.""", state=_RecyclingState)

ProducerOutputsRetained = fault("ZC-EXACT-OUTPUTS.producer-outputs-retained", ("ZC-EXACT-OUTPUTS", "STATE-UNSELECTED"),
    """Switches persistence on per node: every graph output of a node that produces a bound output (the Y of an
    Attention whose present is bound, the other half of a Split) is retained too.""",
    make_state=lambda self, handle: _ExtraRetainedState(handle.state, self, _producer_siblings))

name_faults(globals())

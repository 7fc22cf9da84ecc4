"""Request-local persistent state: selected outputs retained whole to feed the next call.

Every buffer the state takes on (initial values, feeds, selected outputs) passes through ``adopt``,
which retains it by reference, makes the retained view read-only and records in ``Counters`` whether
anything was copied. Unsupported layouts and ownership are rejected, never repaired by a hidden copy
(clauses ZC-RETAIN, ZC-ENTRY-POINTS, PAY-UNSUPPORTED-OWNERSHIP, PAY-OWNERLESS).
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Container, Mapping
from dataclasses import asdict, dataclass
from types import MappingProxyType
from typing import Any

import numpy as np
from google.protobuf.message import Message

from reference_impl import dtypes
from reference_impl.errors import ContractError, violation
from reference_impl.errors import ErrorCode as E
from reference_impl.executor import CancelToken, Executor
from reference_impl.executor.session import reject_borrows
from reference_impl.structs import MAX_DEPTH
from reference_impl.values import (
    EncodedValue,
    InvocationBorrow,
    StructValue,
    check_encoded_parts,
    check_value,
    holds_strings,
    is_struct,
    leaves,
)

_CDATA = ctypes.c_char.__mro__[-2]  # _ctypes._CData, the base of every ctypes instance
_POINTER = ctypes.POINTER(ctypes.c_char).__mro__[1]  # _ctypes._Pointer
_DLPACK_CPU = 1


@dataclass
class Counters:
    """What state management did to payloads. Copies and allocations must stay zero."""

    payload_bytes_copied: int = 0
    payload_allocations: int = 0
    adopted_leaves: int = 0
    adopted_bytes: int = 0
    views_created: int = 0
    #: times the model's bindings and types were resolved: once, when the state is made (STATE-RESOLVE-ONCE)
    binding_resolutions: int = 0
    #: the state never serializes, clones, hashes or compares the model (STATE-NO-MODEL-SCAN); a test
    #: traces every protobuf call made while a state is built and run to keep this figure honest
    model_serializations: int = 0

    def snapshot(self) -> dict[str, int]:
        return asdict(self)


# ----------------------------------------------------------------------------------------- adoption
def adopt(value: Any, path: str, counters: Counters, *, persistent: bool, owned: bool = False,
          caller_objects: frozenset[int] = frozenset(), trusted: Mapping[int, _Entry] | None = None,
          adopted: dict[int, tuple[Any, Any]] | None = None) -> Any:
    """Take ``value`` on without copying its payload; the result is what the state holds or passes.

    ``owned`` marks values the executor produced for this call: their arrays are frozen in place.
    Caller values (and arrays listed in ``caller_objects``) get a read-only view instead, so the
    caller's own objects are never modified. A sub-value shared by several parents is adopted once
    (the result shares it too), and containers nested deeper than MAX_DEPTH are refused. Struct values
    in ``trusted`` (unchanged retained values, see ``_Validated``) are taken as they are; ``adopted``, when
    given, receives every container's (source, result) by the source's id.
    """
    if type(value) is np.ndarray:
        return _adopt_array(value, path, counters, persistent, owned and id(value) not in caller_objects)
    walk = _Adoption(counters, persistent, owned, caller_objects, trusted or {})
    if adopted is not None:
        walk.done = adopted
    return walk.adopt(value, path, 0)


class _Adoption:
    """One adoption walk: its flags, and the results of the containers already adopted."""

    def __init__(self, counters: Counters, persistent: bool, owned: bool, caller_objects: frozenset[int],
                 trusted: Mapping[int, _Entry]):
        self.counters = counters
        self.persistent = persistent
        self.owned = owned
        self.caller_objects = caller_objects
        self.trusted = trusted
        self.done: dict[int, tuple[Any, Any]] = {}  # id -> (source, result); the source keeps the id

    def adopt(self, value: Any, path: str, depth: int) -> Any:
        if type(value) is np.ndarray or isinstance(value, np.ndarray):
            owned = self.owned and id(value) not in self.caller_objects
            return _adopt_array(value, path, self.counters, self.persistent, owned)
        if isinstance(value, EncodedValue):
            return _adopt_encoded(value, path, self.counters, self.persistent)
        if value is None:
            return None
        struct = is_struct(value)
        if not struct and not isinstance(value, (list, dict)):
            return _adopt_other(value, path, self.counters, self.persistent)
        found = self.done.get(id(value))
        if found is not None:
            return found[1]
        if self._trusted(value):
            return value
        if depth >= MAX_DEPTH:
            raise violation(E.NESTING_TOO_DEEP, path, f"the value nests containers deeper than {MAX_DEPTH}")
        if struct:
            changed = {}
            counters, persistent, owned, callers = self.counters, self.persistent, self.owned, self.caller_objects
            for name, item in value.items():
                if type(item) is np.ndarray:  # the common field, without another level of this walk
                    new = _adopt_array(item, f"{path}.{name}", counters, persistent,
                                       owned and id(item) not in callers)
                else:
                    new = self.adopt(item, f"{path}.{name}", depth + 1)
                if new is not item:
                    changed[name] = new
            result = StructValue({name: changed.get(name, item) for name, item in value.items()}, value.type_id) \
                if changed else value
        elif isinstance(value, list):
            result = [item if self._trusted(item) else self.adopt(item, f"{path}[{i}]", depth + 1)
                      for i, item in enumerate(value)]
        else:
            if self.persistent and any(isinstance(key, str) for key in value):
                raise violation(E.BINDING_STRING, path, "a persistent map cannot have string keys")
            result = {key: self.adopt(item, f"{path}[{key!r}]", depth + 1) for key, item in value.items()}
        self.done[id(value)] = (value, result)
        return result

    def _trusted(self, value: Any) -> bool:
        """Whether ``value`` is an unchanged retained struct: then it is adopted as it is (and counted)."""
        entry = self.trusted.get(id(value))
        if entry is None or entry.value is not value:
            return False
        self.counters.adopted_leaves += entry.leaves
        self.counters.adopted_bytes += entry.nbytes
        self.done[id(value)] = (value, value)
        return True


def _adopt_other(value: Any, path: str, counters: Counters, persistent: bool) -> Any:
    """Anything but arrays, encoded values and containers: DLPack producers, or refused."""
    if isinstance(value, InvocationBorrow):
        raise violation(E.OWNERLESS_BORROW, path,
                        "an invocation-only borrow cannot become a returned output or retained state")
    try:
        exports_dlpack = hasattr(value, "__dlpack__")
    except Exception:  # noqa: BLE001 - a foreign object whose attribute lookup itself fails
        exports_dlpack = False
    if exports_dlpack:
        return _adopt_dlpack(value, path, counters, persistent)
    raise violation(E.STATE_UNRETAINABLE, path,
                    f"{type(value).__name__} is not a buffer the state can retain without materializing a copy")


def _adopt_array(array: np.ndarray, path: str, counters: Counters, persistent: bool,
                 owned: bool) -> np.ndarray:
    dtype, flags = array.dtype, array.flags
    if dtype.kind in "OUS":
        if persistent and holds_strings(array):
            raise violation(E.BINDING_STRING, path, "string tensors cannot be persistent")
        if persistent:
            raise violation(E.STATE_UNRETAINABLE, path,
                            "an object array holds Python objects, not tensor data the state can retain")
        return array  # ordinary string feeds keep their materialized form
    if not dtype.isnative:
        raise violation(E.STATE_UNRETAINABLE, path,
                        f"byte order of {array.dtype} would need a converting copy")
    if not owned and not flags.c_contiguous:
        # A caller's strided buffer is refused (a runtime would have to copy it); a strided view the
        # executor produced this call (e.g. a KV cache prefix of its capacity buffer) is retained as is.
        raise violation(E.STATE_UNRETAINABLE, path,
                        f"non-contiguous layout (strides {array.strides}) would need a copy")
    if array.base is not None and _ownerless(array):  # an array without a base owns its memory
        raise violation(E.OWNERLESS_BORROW, path,
                        "the buffer has no owner the state can keep alive (borrowed raw pointer)")
    if flags.writeable and not owned:
        result = array.view()
        result.flags.writeable = False
        counters.views_created += 1
        _record(counters, array, result)
        return result
    flags.writeable = False  # frozen in place (an owned array), or read-only already
    counters.adopted_leaves += 1  # the result is the array itself: nothing can have been copied
    counters.adopted_bytes += array.nbytes
    return array


def _record(counters: Counters, source: np.ndarray, result: np.ndarray) -> None:
    """Measure, not assume: a new result object whose data pointer moved was a copy."""
    counters.adopted_leaves += 1
    counters.adopted_bytes += result.nbytes
    if result is not source and result.nbytes and _address(result) != _address(source):
        counters.payload_bytes_copied += result.nbytes
        counters.payload_allocations += 1


def _address(array: np.ndarray) -> int:
    return array.__array_interface__["data"][0]


def _ownerless(array: np.ndarray) -> bool:
    """True when the memory ultimately belongs to nobody the array can keep alive: a ctypes object
    created over a raw address (``from_address``, ``np.ctypeslib.as_array(pointer)``)."""
    owner: Any = array.base
    if type(owner) is np.ndarray and owner.base is None:
        return False  # the common case: a view of an array that owns its memory
    owner = array
    for _ in range(64):
        if isinstance(owner, np.ndarray):
            if owner.base is None:
                return False
            owner = owner.base
        elif isinstance(owner, memoryview):
            owner = owner.obj
        elif isinstance(owner, _CDATA):
            if owner._b_needsfree_ or owner._objects:
                return False
            base = owner._b_base_
            if base is None or isinstance(base, _POINTER):
                return True
            owner = base
        else:
            return False
    return True


def _output_leaves(outputs: Mapping[str, Any], skip: Container[int]) -> dict[str, list[tuple[str, Any]]]:
    """Every leaf of every output with its path below the output, in one walk that serves the borrow
    check and the ownership check (containers in ``skip``, unchanged retained structs, are not entered)."""
    return {name: [("", value)] if type(value) is np.ndarray else list(leaves(value, "", skip))
            for name, value in outputs.items()}


def _reject_borrowed_outputs(found: Mapping[str, list[tuple[str, Any]]]) -> None:
    """An invocation-only borrow can never leave the invocation (the executor's own check)."""
    for name, pairs in found.items():
        for where, leaf in pairs:
            if isinstance(leaf, InvocationBorrow):
                reject_borrows(leaf, f"output {name!r}{where}")


def _reject_ownerless_outputs(found: Mapping[str, list[tuple[str, Any]]]) -> None:
    """A returned output may not alias memory nobody owns (e.g. a borrowed feed forwarded unchanged).
    ``found`` holds the outputs' leaves as they were produced: retention freezes arrays in place or views
    them, and a view is owned exactly as the array it views, so the verdicts are the retained values'."""
    for name, pairs in found.items():
        for where, leaf in pairs:
            if isinstance(leaf, np.ndarray) and leaf.base is not None and _ownerless(leaf):
                raise violation(E.OWNERLESS_BORROW, f"outputs[{name!r}]{where}",
                                "an output aliases a borrowed buffer without an owner; it cannot be returned")


def _run_failed(err: ContractError) -> ContractError:
    """A failure of the graph run (or a borrow it returned) as the state reports it (not cancellation)."""
    return violation(E.STATE_RUN_FAILED, err.path, f"{err.code.value}: {err.message} (state unchanged)",
                     causes=(err.code, *err.causes))


def _adopt_encoded(value: EncodedValue, path: str, counters: Counters, persistent: bool) -> EncodedValue:
    check_encoded_parts(value, path, E.STATE_UNRETAINABLE)
    logical = value.header.logical_type
    if persistent and logical.tensor_type.elem_type == dtypes.STRING and \
            logical.WhichOneof("value") == "tensor_type":
        raise violation(E.BINDING_STRING, f"{path}.logical_type", "an encoded string tensor cannot be persistent")
    payload = _adopt_array(value.payload, f"{path}.payload", counters, persistent, owned=False)
    if payload is value.payload:
        return value
    return EncodedValue(value.header, payload, value.source, value.base_dir)


def _adopt_dlpack(value: Any, path: str, counters: Counters, persistent: bool) -> np.ndarray:
    """PyTorch (or any DLPack producer) on CPU: shared through DLPack, never copied. The producer is
    foreign code: whatever its methods raise or return, the value is refused with STATE_UNRETAINABLE."""
    try:
        device = value.__dlpack_device__()[0]
        on_cpu = bool(device == _DLPACK_CPU)
    except Exception:  # noqa: BLE001 - a producer without (usable) device information is unsupported
        device, on_cpu = None, False
    if not on_cpu:
        shown = device if isinstance(device, int) else type(device).__name__
        raise violation(E.STATE_UNRETAINABLE, path, f"DLPack device {shown} is not CPU memory")
    try:
        contiguous = getattr(value, "is_contiguous", None)
        if contiguous is not None and not contiguous():
            raise violation(E.STATE_UNRETAINABLE, path, "non-contiguous tensor would need a copy")
        array = np.from_dlpack(value)
        pointer = getattr(value, "data_ptr", None)
        address = int(pointer()) if pointer is not None else None
    except ContractError:
        raise
    except Exception as err:  # noqa: BLE001 - e.g. a tensor that requires grad, or a broken producer
        raise violation(E.STATE_UNRETAINABLE, path, f"DLPack export refused: {type(err).__name__}: {err}") from err
    if not isinstance(array, np.ndarray):
        raise violation(E.STATE_UNRETAINABLE, path, "DLPack export did not produce an array")
    result = _adopt_array(array, path, counters, persistent, owned=False)
    if address is not None and result.nbytes and address != _address(result):
        counters.payload_bytes_copied += result.nbytes
        counters.payload_allocations += 1
    return result


# ------------------------------------------------------------------------------- unchanged structs
#: A field of a remembered struct: (name, item, header, header bytes, array, dtype, shape, strides, writeable);
#: ``array`` is the field itself or an encoded value's payload, ``header`` None for a plain array or absent field.
_Field = tuple


@dataclass(frozen=True)
class _Entry:
    """A flat struct value of the published state (its fields are arrays, encoded values or None) and
    everything its checks read, by reference: its class, type_id and field objects; each array's dtype
    object, shape, strides and writable flag (all settable in place, even on a read-only view); each encoded
    value's header bytes and payload. Holding the objects keeps their ids from being reused."""

    value: StructValue
    cls: type
    type_id: Any
    mapping: Any  # a StructValue's read-only fields mapping: while it is the same object, so are the fields
    fields: tuple[_Field, ...]
    leaves: int  # what adopting the struct counts (Counters.adopted_leaves, adopted_bytes)
    nbytes: int
    specs: frozenset  # ids of the declared types it was checked against (the executor keeps them alive)

    def unchanged(self) -> bool:
        """Whether the struct still holds exactly what it held when it was checked (stops at the first
        difference; a field that cannot even be read counts as changed)."""
        value = self.value
        if type(value) is not self.cls or value.type_id != self.type_id:
            return False
        same_mapping = self.mapping is not None and getattr(value, "_fields", None) is self.mapping
        if not same_mapping and len(value) != len(self.fields):
            return False
        for name, item, header, header_bytes, array, dtype, shape, strides, writeable in self.fields:
            if not same_mapping and value.get(name, _ABSENT) is not item:
                return False
            if item is None:
                continue
            if header is not None and (item.header is not header or item.payload is not array
                                       or header.SerializeToString() != header_bytes):
                return False
            if array.dtype is not dtype or array.shape != shape or array.strides != strides \
                    or array.flags.writeable != writeable:
                return False  # (the dtype by identity: an equal dtype object set in its place costs a full check)
        return True


_ABSENT = object()


def _remember(value: StructValue, specs: frozenset) -> _Entry | None:
    """The entry for a flat struct value just checked, or None for a struct holding anything else."""
    fields: list[_Field] = []
    leaves_count = nbytes = 0
    for name, item in value.items():
        if item is None:
            fields.append((name, None, None, None, None, None, None, None, None))
            continue
        if type(item) is EncodedValue:
            header, array = item.header, item.payload
            if type(array) is not np.ndarray or not isinstance(header, Message):
                return None
            header_bytes = header.SerializeToString()
        elif type(item) is np.ndarray:
            header = header_bytes = None
            array = item
        else:
            return None
        fields.append((name, item, header, header_bytes, array, array.dtype, array.shape, array.strides,
                       array.flags.writeable))
        leaves_count += 1
        nbytes += array.nbytes
    mapping = value._fields if isinstance(value, StructValue) and type(value._fields) is MappingProxyType else None
    return _Entry(value, type(value), value.type_id, mapping, tuple(fields), leaves_count, nbytes, specs)


class _Validated:
    """The flat struct values of the published state, by identity, with a record of what their
    checks read.

    The sealed blocks of a paged KV cache come back unchanged in every step's outputs: checking their type,
    retention and ownership again on every call would make state management grow with the context. A
    struct that comes back as the very same object holding the same things passed every one of those
    checks when it was published, and is not walked again (for the declared types it was checked against).
    Anything else (a new object, a field replaced, an array reshaped, re-typed or made writable, a header
    edited) is checked in full.

    ``new_call`` verifies every entry's record once per call; the entries found unchanged are ``hits``, which
    the walks over a call's outputs skip and the adoption takes as they are."""

    def __init__(self) -> None:
        self._entries: dict[int, _Entry] = {}
        self.hits: dict[int, _Entry] = {}
        self._first_seen: dict[int, Any] = {}  # flat structs published once, not yet remembered (by id)

    def new_call(self) -> None:
        """Start a call: find which remembered structs still hold exactly what they held (the hits)."""
        hits = {}
        for key, entry in self._entries.items():
            try:
                same = entry.unchanged()
            except Exception:  # noqa: BLE001 - e.g. a foreign header: not trusted, checked in full
                same = False
            if same:
                hits[key] = entry
        self.hits = hits

    def checked(self) -> set[tuple[int, int]]:
        """``check_value``'s keys for the hits: (struct, declared type) pairs already checked."""
        return {(key, spec) for key, entry in self.hits.items() for spec in entry.specs}

    def publish(self, adopted: Mapping[int, tuple[Any, Any]], checked: set[tuple[int, int]]) -> None:
        """Remember the flat structs just published: the hits, and every struct the adoption published as
        it is (``adopted``: id -> (source, result)) for the second time in a row, with the declared types
        ``check_value`` checked it against (``checked``). A struct published for the first time is only
        noted: a struct replaced on every call (a paged cache's open block) is never worth a record, and
        one that does come back (a sealed block) is checked in full once more, then remembered."""
        entries = {key: entry for key, entry in self.hits.items() if key in adopted}  # still in the state
        first_seen, self._first_seen = self._first_seen, {}
        if not adopted:
            self._entries = entries
            self.hits = {}
            return
        specs: dict[int, set[int]] = {}
        for key, spec in checked:
            specs.setdefault(key, set()).add(spec)
        for key, (source, result) in adopted.items():
            if result is not source or key in entries or key not in specs or not is_struct(source):
                continue
            if first_seen.get(key) is not source:
                self._first_seen[key] = source
                continue
            try:
                entry = _remember(source, frozenset(specs[key]))
            except Exception:  # noqa: BLE001 - not remembered: the next call checks it in full
                entry = None
            if entry is not None:
                entries[key] = entry
        self._entries = entries
        self.hits = {}


# -------------------------------------------------------------------------------------------- state
class State:
    """Retained values for one request over one loaded model (see ``make_state``)."""

    def __init__(self, executor: Executor, initial: Mapping[str, Any]):
        self.counters = Counters(binding_resolutions=1)  # the executor resolved them, once, when loaded
        self._executor: Executor | None = executor
        self._bindings = executor.bindings
        self._bound = {b.input_name: b for b in self._bindings}
        self._plan = tuple((b.input_name, b.output_name, b.spec, f"outputs[{b.output_name!r}]")
                           for b in self._bindings)
        self._bound_outputs = frozenset(b.output_name for b in self._bindings)
        self._inputs = frozenset(executor.input_names)
        self._lock = threading.Lock()
        self._closed = False
        self.steps = 0
        self._validated = _Validated()
        self._values: Mapping[str, Any] = self._initial_values(initial)

    # ------------------------------------------------------------------------------------ public
    @property
    def values(self) -> Mapping[str, Any]:
        """The retained values: a read-only mapping of read-only views that stays valid after later
        runs, reset or close."""
        if self._closed:
            raise violation(E.STATE_CLOSED, "state.values", "the state is closed")
        return self._values

    @property
    def bindings(self):
        return self._bindings

    @property
    def closed(self) -> bool:
        return self._closed

    def run(self, feeds: Mapping[str, Any], *, cancel: CancelToken | None = None) -> dict[str, Any]:
        """One call: feeds plus retained values in, every output out; selected outputs retained.

        The next state is validated in full before it is published; any failure or cancellation
        leaves the previous state (and its buffers) untouched.
        """
        self._enter("state.run")
        try:
            executor = self._executor
            current = self._values
            merged, caller_objects = self._feeds(feeds)
            executor.check_feeds(merged, validated=current)
            merged.update(current)
            try:
                outputs = executor.run(merged, cancel=cancel, check_feeds=False, check_outputs=False)
            except ContractError as err:
                if err.code is E.STATE_CANCELLED:
                    raise
                raise _run_failed(err) from err
            self._validated.new_call()
            counted = dict(vars(self.counters))
            try:
                next_values, adopted, checked = self._retain_valid(outputs, caller_objects)
            except ContractError:  # the ordered checks below name the first problem, as the contract orders them
                vars(self.counters).update(counted)
                next_values, adopted, checked = self._retain_checked(outputs, caller_objects, cancel)
            if cancel is not None and cancel.cancelled:
                raise violation(E.STATE_CANCELLED, "state.run", "cancelled before publication; state unchanged")
            for input_name, output_name, _, _ in self._plan:
                outputs[output_name] = next_values[input_name]
            self._values = MappingProxyType(next_values)  # the atomic publication
            self._validated.publish(adopted, checked)
            self.steps += 1
            return outputs
        finally:
            self._lock.release()

    def reset(self, initial: Mapping[str, Any]) -> None:
        """Restore caller-supplied initial values (validated in full before they replace the state)."""
        self._enter("state.reset")
        try:
            values = self._initial_values(initial)
            self._values = values
            self.steps = 0
        finally:
            self._lock.release()

    def close(self) -> None:
        """Release the retained values. Outstanding views stay valid; closing twice is harmless."""
        if self._closed:
            return
        if not self._lock.acquire(blocking=False):
            raise violation(E.STATE_BUSY, "state.close", "a call is active on this state")
        try:
            self._closed = True
            self._values = MappingProxyType({})
            self._validated = _Validated()
            self._executor = None
        finally:
            self._lock.release()

    def __enter__(self) -> State:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ----------------------------------------------------------------------------------- helpers
    def _enter(self, what: str) -> None:
        if self._closed:
            raise violation(E.STATE_CLOSED, what, "the state is closed")
        if not self._lock.acquire(blocking=False):
            raise violation(E.STATE_BUSY, what, "a call is already active on this state; simultaneous or "
                            "re-entrant calls are rejected, not serialized")
        if self._closed:
            self._lock.release()
            raise violation(E.STATE_CLOSED, what, "the state is closed")

    def _retain_checked(self, outputs: dict[str, Any], caller_objects: frozenset[int], cancel: CancelToken | None
                        ) -> tuple[dict[str, Any], dict[int, tuple[Any, Any]], set[tuple[int, int]]]:
        """Every check of a call's outputs in the contract's order: borrows anywhere in the outputs, then each
        bound output's type and retention, cancellation, then ownerless outputs. Returns the next values, the
        adopted containers and the (container, type) pairs checked."""
        validated = self._validated
        try:
            found = _output_leaves(outputs, validated.hits)
            _reject_borrowed_outputs(found)
        except ContractError as err:
            raise _run_failed(err) from err
        next_values, adopted, checked = self._adopt_bound(outputs, caller_objects)
        if cancel is not None and cancel.cancelled:
            raise violation(E.STATE_CANCELLED, "state.run", "cancelled before publication; state unchanged")
        _reject_ownerless_outputs(found)
        return next_values, adopted, checked

    def _retain_valid(self, outputs: dict[str, Any], caller_objects: frozenset[int]
                      ) -> tuple[dict[str, Any], dict[int, tuple[Any, Any]], set[tuple[int, int]]]:
        """``_retain_checked`` for outputs that pass every check, without its walk over the bound outputs:
        adopting a bound output visits every leaf that walk would, refusing borrows and ownerless buffers
        there. Any error may be reported out of order, so the caller then runs ``_retain_checked``."""
        unbound = {name: value for name, value in outputs.items() if name not in self._bound_outputs}
        found = _output_leaves(unbound, self._validated.hits)
        _reject_borrowed_outputs(found)
        retained = self._adopt_bound(outputs, caller_objects)
        _reject_ownerless_outputs(found)
        return retained

    def _adopt_bound(self, outputs: dict[str, Any], caller_objects: frozenset[int]
                     ) -> tuple[dict[str, Any], dict[int, tuple[Any, Any]], set[tuple[int, int]]]:
        """Check each bound output against its input's declared type and adopt it as the next value."""
        validated = self._validated
        checked = validated.checked()  # check_value adds what it checks (once per value and type)
        adopted: dict[int, tuple[Any, Any]] = {}
        next_values = {}
        for input_name, output_name, spec, path in self._plan:
            value = outputs[output_name]
            check_value(value, spec, path, checked=checked)
            containers: dict[int, tuple[Any, Any]] = {}
            next_values[input_name] = adopt(value, path, self.counters, persistent=True, owned=True,
                                            caller_objects=caller_objects, trusted=validated.hits,
                                            adopted=containers)
            adopted.update(containers)
        return next_values, adopted, checked

    def _initial_values(self, initial: Mapping[str, Any]) -> Mapping[str, Any]:
        if not isinstance(initial, Mapping):
            raise violation(E.STATE_INITIAL_MISSING, "initial",
                            f"initial values are a mapping of bound input names, not {type(initial).__name__}")
        for name in initial:
            if name not in self._bound:
                raise violation(E.STATE_INITIAL_UNKNOWN, f"initial[{name!r}]", f"{name!r} is not a bound input")
        values = {}
        adopted: dict[int, tuple[Any, Any]] = {}
        checked: set[tuple[int, int]] = set()
        for binding in self._bindings:
            path = f"initial[{binding.input_name!r}]"
            if binding.input_name not in initial:
                raise violation(E.STATE_INITIAL_MISSING, path, f"bound input {binding.input_name!r} needs an "
                                "initial value")
            containers: dict[int, tuple[Any, Any]] = {}
            value = adopt(initial[binding.input_name], path, self.counters, persistent=True, adopted=containers)
            keys: set[tuple[int, int]] = set()
            check_value(value, binding.spec, path, checked=keys)
            values[binding.input_name] = value
            # what was checked is the adopted value: remember the structs adopted as they were
            adopted.update((key, pair) for key, pair in containers.items() if pair[1] is pair[0])
            checked |= keys
        self._validated.new_call()
        self._validated.publish(adopted, checked)
        return MappingProxyType(values)

    def _feeds(self, feeds: Mapping[str, Any]) -> tuple[dict[str, Any], frozenset[int]]:
        """Per-call feeds by reference. NumPy arrays pass as they are (they are not retained unless a
        graph forwards them to a bound output, where they are adopted then); other entry points
        (PyTorch, structs of them) are adopted now. Returns the ids of caller-owned arrays."""
        if not isinstance(feeds, Mapping):
            raise violation(E.STATE_FEED_MISSING, "feeds",
                            f"feeds are a mapping of input names, not {type(feeds).__name__}")
        merged = {}
        caller = []
        for name, value in feeds.items():
            path = f"feeds[{name!r}]"
            if name in self._bound:
                raise violation(E.STATE_FEED_OVERRIDES, path, f"{name!r} is supplied by the retained state")
            if name not in self._inputs:
                raise violation(E.STATE_FEED_UNKNOWN, path, f"{name!r} is not a graph input")
            if type(value) is not np.ndarray:
                value = adopt(value, path, self.counters, persistent=False)
            merged[name] = value
            if type(value) is np.ndarray:
                caller.append(id(value))
            else:
                caller.extend(id(leaf) for _, leaf in leaves(value, path))
        return merged, frozenset(caller)


def make_state(model, initial: Mapping[str, Any], **executor_options: Any) -> State:
    """A request-local state over a loaded model.

    Pass an ``Executor`` (the explicitly loaded session) to keep construction free of any model
    serialization; passing a ModelProto performs that one explicit load first.
    """
    executor = model if isinstance(model, Executor) else Executor(model, **executor_options)
    return State(executor, initial)


__all__ = ["Counters", "State", "adopt", "make_state"]

"""Faults in payload ownership and lifetime: arenas, inline defaults, exclusivity, owners and read-only bytes."""

from __future__ import annotations

import contextlib
import re
import threading
from types import MappingProxyType

import numpy as np

from conformance.audit.fault import (
    INSTALLER,
    TESTEE_COPIES_RETURNED_VALUES,
    Fault,
    FaultState,
    Patch,
    encoded_values,
    fault,
    name_faults,
    wrap,
)
from conformance.audit.fault import decode_module as decode
from conformance.audit.faults.shared import _EXTERNAL, _INDEX_PATH, _map_neutral
from conformance.values import Struct
from reference_impl import payload, records, verifier
from reference_impl import state as state_module
from reference_impl.errors import ContractError, violation
from reference_impl.errors import ErrorCode as E
from reference_impl.executor import kernels
from reference_impl.values import EncodedValue


def _empty_extent_refused(original):
    def open_payload(value, extent, base_dir, path):
        if extent.external and extent.length == 0:
            raise violation(E.EXTERNAL_FILE_INVALID, path, "mmap: cannot map an empty extent")
        return original(value, extent, base_dir, path)
    return open_payload


EmptyExternalExtentRefused = fault("PAY-EMPTY.empty-external-refused", ("PAY-EMPTY", "PAY-EXTERNAL-EXTENT"),
    """Maps every external extent with mmap, which refuses a length of zero: an external payload of zero bytes (zero
    records, zero codes) fails instead of reading as empty.""", boundary=True,
    patches=lambda: [wrap(payload, "open_payload", _empty_extent_refused)])


class ExternalWinsOverRawData(Fault):
    """Reads the external payload whenever external_data entries are present and ignores raw_data,
    instead of rejecting a value that carries both."""

    fault_id = "PAY-EXCLUSIVE.external-wins"
    clauses = ("PAY-EXCLUSIVE",)

    def transform(self, model, base_dir):
        for value in encoded_values(model):
            if len(value.external_data) and value.HasField("raw_data"):
                value.ClearField("raw_data")


class LocationFlagInferred(Fault):
    """Treats a value with external_data entries as external even when data_location is left at its
    default, instead of reading the default location as raw_data."""

    fault_id = "PAY-DEFAULT-INLINE.location-inferred"
    clauses = ("PAY-DEFAULT-INLINE",)

    def transform(self, model, base_dir):
        for value in encoded_values(model):
            if len(value.external_data) and value.data_location != _EXTERNAL and not value.HasField("raw_data"):
                value.data_location = _EXTERNAL


class EmptyPayloadRejected(Fault):
    """Takes an empty inline payload for a missing one and refuses it, instead of reading zero records."""

    fault_id = "PAY-EMPTY.empty-payload-rejected"
    clauses = ("PAY-EMPTY",)

    def precheck(self, model, base_dir):
        for value in encoded_values(model):
            if value.data_location != _EXTERNAL and not value.raw_data:
                raise violation(E.PAYLOAD_PARTIAL_RECORD, f"model.graph.encoded_initializer[{value.name!r}]",
                                "the encoded value has no payload")


def _bounds_deferred(original):
    def verify_struct_layout(value, path, extent, catalogue):
        try:
            return original(value, path, extent, catalogue)
        except ContractError as error:
            if error.code is not E.PAYLOAD_PARTIAL_RECORD:
                raise
            size = catalogue.bit_size(value.struct_type, path) // 8
            return verifier.EncodedInfo(path, extent, element_bytes=size, record_count=extent.length // size)
    return verify_struct_layout


def _decoder_first(original):
    def decode_value(value, catalogue, base_dir=None, registry=None, path="value"):
        st = value.struct_type
        if value.WhichOneof("layout") == "struct_type" and st.WhichOneof("kind") == "type_ref":
            data = payload.open_payload(value, payload.payload_extent(value, path), base_dir, path)
            layout = records.compile_layout(st, catalogue, f"{path}.struct_type")
            declaration, _ = catalogue.lookup(st.type_ref, f"{path}.struct_type.type_ref")
            decoder = decode._registry(registry).bind(st.type_ref, layout, f"{path}.struct_type", declaration)
            whole = len(data) - len(data) % layout.record_bytes
            decode._check_logical(value, decoder.decode(layout, data[:whole]), path)  # the decoder runs first
            if whole != len(data):
                raise violation(E.PAYLOAD_PARTIAL_RECORD, path,
                                f"{len(data) - whole} bytes after the last whole record")
        return original(value, catalogue, base_dir, registry, path)
    return decode_value


class DecoderBeforeBounds(Fault):
    """Checks a struct payload's bounds only when the value is decoded, and only after handing its whole
    records to the registered decoder: loading accepts a partial record, and decoding reports what the
    decoder made of the short payload instead of the partial record."""

    fault_id = "PAY-VALIDATE-FIRST.decoder-before-bounds"
    clauses = ("PAY-VALIDATE-FIRST",)

    def patches(self):
        return [wrap(verifier, "_verify_struct_layout", _bounds_deferred), wrap(decode, "decode_value", _decoder_first)]


def pad_records(raw: bytes, size: int, padded: int) -> bytes:
    """Records of ``size`` bytes each, every one followed by zero bytes up to ``padded`` (native padding)."""
    rows = np.frombuffer(raw, np.uint8).reshape(-1, size)
    out = np.zeros((len(rows), padded), np.uint8)
    out[:, :size] = rows
    return out.tobytes()


class NativePaddingSaved(Fault):
    """Saves struct records as its in-memory structs, each padded to an 8-byte boundary (native
    padding), instead of the tight serialized records."""

    fault_id = "PAY-NO-POINTERS.native-padding-saved"
    clauses = ("PAY-NO-POINTERS",)

    def on_save(self, model):
        try:
            verified = verifier.verify_model(model)
        except Exception:  # noqa: BLE001 - a model the oracle refuses is saved as it is
            return
        for value in model.graph.encoded_initializer:
            info = verified.encoded.get(value.name)
            size = info.element_bytes if info is not None else None
            if not size or size % 8 == 0 or not value.raw_data:
                continue
            value.raw_data = pad_records(value.raw_data, size, -(-size // 8) * 8)


def _regrouped(value):
    """A struct whose array fields are copied into one shared allocation."""
    arrays = {name: item for name, item in value.items()
              if isinstance(item, np.ndarray) and item.dtype.kind not in "OUS"}
    if not arrays:
        return value
    block = np.zeros(sum(item.nbytes for item in arrays.values()), np.uint8)
    fields, offset = dict(value), 0
    for name, item in arrays.items():
        view = block[offset:offset + item.nbytes].view(item.dtype).reshape(item.shape)
        view[...] = item
        fields[name] = view
        offset += item.nbytes
    return Struct(fields, value.type_id)


class StructFieldsRegrouped(Fault):
    """Packs the fields of a whole struct into one allocation when it takes the struct on, instead of
    retaining each field's own buffer and owner."""

    fault_id = "PAY-FIELD-OWNERS.fields-regrouped"
    clauses = ("PAY-FIELD-OWNERS",)

    def open_state(self, model_bytes, initial, base_dir=None):
        initial = {name: _regrouped(value) if isinstance(value, Struct) else value for name, value in initial.items()}
        return super().open_state(model_bytes, initial, base_dir)


def _contiguous_copy(original):
    def adopt_array(array, path, counters, persistent, owned):
        if not array.flags.c_contiguous:
            array = np.ascontiguousarray(array)
        return original(array, path, counters, persistent, owned)
    return adopt_array


StridedBuffersCopied = fault("PAY-UNSUPPORTED-OWNERSHIP.hidden-copy", ("PAY-UNSUPPORTED-OWNERSHIP",),
    """Repairs an unsupported (strided) buffer with a hidden contiguous copy instead of rejecting it.""",
    patches=lambda: [wrap(state_module, "_adopt_array", _contiguous_copy)])

CallerBuffersTakenAsOwned = fault("PAY-OWNERLESS.borrowed-feed-retained", ("PAY-OWNERLESS",),
    """Does not track which buffers the caller only lent for the call: a borrowed raw pointer (an ownerless borrow) is
    retained or returned like any buffer, although nothing keeps its memory alive after the call.""",
    patches=lambda: [Patch(state_module, "_ownerless", lambda array: False)])


class _ArenaState(FaultState):
    def __init__(self, state, fault):
        super().__init__(state, fault)
        self.arena: dict[str, np.ndarray] = {}

    def run(self, feeds):
        outputs = super().run(feeds)
        bound = {b.output_name: b.input_name for b in self.state.bindings}
        retained = dict(self.state._values)
        for name, value in outputs.items():
            if not isinstance(value, np.ndarray) or value.dtype.kind in "OUS":
                continue
            slot = self.arena.get(name)
            if slot is None or slot.shape != value.shape or slot.dtype != value.dtype:
                self.arena[name] = value  # this call's buffer becomes the arena slot
                continue
            slot.flags.writeable = True
            slot[...] = value  # recycled while the previous call's output still refers to it
            slot.flags.writeable = False
            outputs[name] = slot
            if name in bound:
                retained[bound[name]] = slot
        self.state._values = MappingProxyType(retained)
        return outputs


OutputArenaRecycled = fault("PAY-ARENA.output-buffers-recycled", ("PAY-ARENA",),
    """Writes each call's outputs into the previous call's output buffers (an arena recycled per call) while those
    buffers are still referenced by returned outputs.""", state=_ArenaState)


def _encoded_copy(original):
    def adopt_encoded(value, path, counters, persistent):
        adopted = original(value, path, counters, persistent)
        return EncodedValue(adopted.header, adopted.payload.copy(), adopted.source, adopted.base_dir)
    return adopt_encoded


EncodedInputsCopiedForWriting = fault("PAY-READ-ONLY.encoded-inputs-copied", ("PAY-READ-ONLY",),
    """Takes a private writable copy of every encoded input so its kernels may write into it, instead of treating
    encoded inputs as read-only shared payloads.""",
    patches=lambda: [wrap(state_module, "_adopt_encoded", _encoded_copy)])


def _contiguous(array, in_struct):
    return np.ascontiguousarray(array) if array.dtype.kind not in "OUS" else array


class _ResetRepairsLayoutState(FaultState):
    def reset(self, initial):
        return super().reset({name: _map_neutral(value, on_array=_contiguous) for name, value in initial.items()})


ResetRepairsStridedLayout = fault("PAY-UNSUPPORTED-OWNERSHIP.reset-strided-copied",
    ("PAY-UNSUPPORTED-OWNERSHIP", "ZC-ENTRY-POINTS"), """The reset path normalizes every initial value with a contiguous
    conversion, so a strided buffer given to ``reset`` is silently copied (``open`` and ``run`` still reject it).""",
    state=_ResetRepairsLayoutState)


#: per-thread flags a fault sets around one path of the oracle (reset, a struct field, a sequence element)
_FLAGS = threading.local()


class _ResetOwnerlessState(FaultState):
    def reset(self, initial):
        _FLAGS.on = True
        try:
            return super().reset(initial)
        finally:
            _FLAGS.on = False


class ResetAcceptsOwnerless(Fault):
    """Checks ownership of initial values when the state is opened but not on ``reset``: an ownerless
    borrow given to reset becomes retained state."""

    fault_id = "PAY-OWNERLESS.reset-borrow-retained"
    clauses = ("PAY-OWNERLESS", "STATE-RESET")

    def patches(self):
        def make(original):
            return lambda array: False if getattr(_FLAGS, "on", False) else original(array)
        return [wrap(state_module, "_ownerless", make)]

    def make_state(self, handle):
        return _ResetOwnerlessState(handle.state, self)


_FIELD_PATH = re.compile(r"\]\.|^\.")


def _ownership_unchecked_at(where: re.Pattern, flag: str) -> list:
    """Patches under which adopting a tensor whose path matches ``where`` skips the ownership check (the
    oracle's ``_ownerless`` answers False while such a tensor is adopted)."""
    def adopt_array(original):
        def adopting(array, path, counters, persistent, owned):
            if not where.search(path):
                return original(array, path, counters, persistent, owned)
            setattr(_FLAGS, flag, True)
            try:
                return original(array, path, counters, persistent, owned)
            finally:
                setattr(_FLAGS, flag, False)
        return adopting

    def ownerless(original):
        return lambda array: False if getattr(_FLAGS, flag, False) else original(array)
    return [wrap(state_module, "_adopt_array", adopt_array), wrap(state_module, "_ownerless", ownerless)]


class StructFieldOwnershipUnchecked(Fault):
    """Checks that a retained or returned tensor has an owner only for whole tensors, not for the tensor
    fields of a struct: an ownerless borrow inside a struct becomes retained state or a returned output."""

    fault_id = "PAY-OWNERLESS.struct-fields-unchecked"
    clauses = ("PAY-OWNERLESS", "PAY-FIELD-OWNERS")

    def patches(self):
        def reject_outputs(original):
            def rejecting(found):
                return original({name: [(where, leaf) for where, leaf in pairs if not where]
                                 for name, pairs in found.items()})
            return rejecting
        return _ownership_unchecked_at(_FIELD_PATH, "field") + [
            wrap(state_module, "_reject_ownerless_outputs", reject_outputs)]


class _UnboundArenaState(FaultState):
    def __init__(self, state, fault):
        super().__init__(state, fault)
        self.arena: dict[str, np.ndarray] = {}

    def run(self, feeds):
        outputs = super().run(feeds)
        bound = {b.output_name for b in self.state.bindings}
        for name, value in outputs.items():
            if name in bound or not isinstance(value, np.ndarray) or value.dtype.kind in "OUS":
                continue
            slot = self.arena.get(name)
            if slot is None or slot.shape != value.shape or slot.dtype != value.dtype:
                self.arena[name] = value
                continue
            slot.flags.writeable = True
            slot[...] = value  # the previous call's returned output, still held by the caller
            outputs[name] = slot
        return outputs


UnboundOutputArenaRecycled = fault("PAY-ARENA.unretained-outputs-recycled", ("PAY-ARENA", "ZC-OUTSTANDING"),
    """Keeps retained outputs alive but recycles the buffers of the outputs that are not retained (returned only) from
    one call to the next, although the caller still holds the previous ones.""", state=_UnboundArenaState)


class _PooledState(FaultState):
    def __init__(self, state, fault, key):
        super().__init__(state, fault)
        self.pool = fault.pools.setdefault(key, [])

    def run(self, feeds):
        outputs = super().run(feeds)
        bound = {b.output_name: b.input_name for b in self.state.bindings}
        retained = dict(self.state._values)
        for name, value in outputs.items():
            if not isinstance(value, np.ndarray) or value.dtype.kind in "OUS":
                continue
            slot = next((s for s in self.pool if s.shape == value.shape and s.dtype == value.dtype), None)
            if slot is None:
                continue
            self.pool.remove(slot)
            slot.flags.writeable = True
            slot[...] = value  # a buffer "released" by a closed state, still held by its caller
            slot.flags.writeable = False
            outputs[name] = slot
            if name in bound:
                retained[bound[name]] = slot
        self.state._values = MappingProxyType(retained)
        return outputs

    def close(self):
        produced = [] if self.state.closed else [v for v in self.state._values.values()
                                                 if isinstance(v, np.ndarray) and v.base is None]
        result = super().close()
        self.pool.extend(produced)
        return result


class ClosedStateBuffersPooled(Fault):
    """Returns the buffers a closed state retained to a per-model pool, from which the next call of
    any state of that model takes its output buffers, although the caller may still hold views of them."""

    fault_id = "PAY-ARENA.closed-state-buffers-pooled"
    clauses = ("PAY-ARENA", "ZC-OUTSTANDING", "STATE-CLOSE")
    testee_blind = TESTEE_COPIES_RETURNED_VALUES

    @property
    def pools(self) -> dict:
        return self.__dict__.setdefault("_pools", {})

    def open_state(self, model_bytes, initial, base_dir=None):
        self._key = model_bytes
        return super().open_state(model_bytes, initial, base_dir)

    def make_state(self, handle):
        return _PooledState(handle.state, self, self._key)


class SequenceOwnershipUnchecked(Fault):
    """Checks that a retained tensor has an owner for whole tensors and struct fields but not for the
    elements of a sequence: an ownerless borrow inside a sequence becomes retained state."""

    fault_id = "PAY-OWNERLESS.sequence-elements-unchecked"
    clauses = ("PAY-OWNERLESS",)

    def patches(self):
        return _ownership_unchecked_at(_INDEX_PATH, "element")


def _field_layout_repaired(original):
    def adopt_array(array, path, counters, persistent, owned):
        if _FIELD_PATH.search(path) and not array.flags.c_contiguous and array.dtype.kind not in "OUS":
            array = np.ascontiguousarray(array)  # the struct packer wants dense fields
        return original(array, path, counters, persistent, owned)
    return adopt_array


StridedStructFieldsCopied = fault("PAY-UNSUPPORTED-OWNERSHIP.strided-fields-copied",
    ("PAY-UNSUPPORTED-OWNERSHIP", "PAY-FIELD-OWNERS"), """Rejects a strided whole tensor but silently repairs a strided
    struct field with a contiguous copy (the struct path packs its fields densely).""",
    patches=lambda: [wrap(state_module, "_adopt_array", _field_layout_repaired)])


class _BoundOnlyState(FaultState):
    def run(self, feeds):
        _FLAGS.bound = {b.output_name for b in self.state.bindings}
        try:
            return super().run(feeds)
        finally:
            _FLAGS.bound = None


class UnboundOutputsOwnershipUnchecked(Fault):
    """Checks that outputs have an owner only for the outputs it retains: an ownerless borrow fed for the
    call and returned directly as an unselected output leaves the call."""

    fault_id = "PAY-OWNERLESS.unselected-outputs-unchecked"
    clauses = ("PAY-OWNERLESS",)

    def patches(self):
        def reject_outputs(original):
            def rejecting(found):
                bound = getattr(_FLAGS, "bound", None)
                if bound is None:
                    return original(found)
                return original({name: pairs for name, pairs in found.items() if name in bound})
            return rejecting
        return [wrap(state_module, "_reject_ownerless_outputs", reject_outputs)]

    def make_state(self, handle):
        return _BoundOnlyState(handle.state, self)


class RawDataWinsOverExternal(Fault):
    """Reads raw_data whenever it is non-empty and ignores external_data and the location flag, instead of
    rejecting a value that carries both."""

    fault_id = "PAY-EXCLUSIVE.raw-data-wins"
    clauses = ("PAY-EXCLUSIVE",)

    def transform(self, model, base_dir):
        for value in encoded_values(model):
            if value.raw_data and len(value.external_data):
                value.ClearField("external_data")
                value.ClearField("data_location")


class ExclusiveOnlyWhenExternal(Fault):
    """Checks raw_data against external_data only on the EXTERNAL branch: a value left at the default
    location reads its raw_data and ignores the external_data entries next to it."""

    fault_id = "PAY-EXCLUSIVE.checked-on-external-branch-only"
    clauses = ("PAY-EXCLUSIVE",)

    def transform(self, model, base_dir):
        for value in encoded_values(model):
            if value.data_location != _EXTERNAL and value.HasField("raw_data") and len(value.external_data):
                value.ClearField("external_data")


class ExplicitDefaultReadAsExternal(Fault):
    """Decides the payload location by whether data_location is present, not by its value: a value that
    spells out ``data_location: DEFAULT`` is read as external (and, having no external_data, refused)."""

    fault_id = "PAY-DEFAULT-INLINE.explicit-default-read-as-external"
    clauses = ("PAY-DEFAULT-INLINE",)

    def transform(self, model, base_dir):
        for value in encoded_values(model):
            if value.HasField("data_location") and value.data_location != _EXTERNAL:
                value.data_location = _EXTERNAL


def _whole_records_only(original):
    def decode_value(value, catalogue, base_dir=None, registry=None, path="value", **kw):
        if value.WhichOneof("layout") == "struct_type" and value.raw_data:
            try:
                size = catalogue.bit_size(value.struct_type, path)
            except Exception:  # noqa: BLE001 - a layout that cannot be sized goes to the full check
                size = None
            if isinstance(size, int) and size and size % 8 == 0 and len(value.raw_data) % (size // 8):
                whole = type(value)()
                whole.CopyFrom(value)
                whole.raw_data = value.raw_data[: len(value.raw_data) - len(value.raw_data) % (size // 8)]
                value = whole  # the kernel trusts the load to have checked bounds, and reads whole records
        return original(value, catalogue, base_dir, registry, path, **kw)
    return decode_value


DecodeKernelTrustsFeeds = fault("PAY-VALIDATE-FIRST.decode-kernel-trusts-feeds", ("PAY-VALIDATE-FIRST",),
    """Checks payload bounds when a model's encoded initializers are loaded, but the Decode kernel assumes every value
    reaching it was checked there: a fed or retained encoded value with a partial trailing record is handed to the
    decoder, which reads the whole records and drops the rest.""",
    patches=lambda: [wrap(kernels, "decode_value", _whole_records_only, aliases=False)])


class TailAlignedRecordsSaved(Fault):
    """Saves each struct record as its native struct would be laid out in memory: tail-padded to the
    alignment of its widest scalar leaf (a record holding an INT64 grows to a multiple of eight bytes),
    instead of the tight serialized record."""

    fault_id = "PAY-NO-POINTERS.tail-aligned-records-saved"
    clauses = ("PAY-NO-POINTERS",)

    def on_save(self, model):
        try:
            verified = verifier.verify_model(model)
        except Exception:  # noqa: BLE001 - a model the oracle refuses is saved as it is
            return
        for value in model.graph.encoded_initializer:
            info = verified.encoded.get(value.name)
            if info is None or not info.element_bytes or not value.raw_data or \
                    value.WhichOneof("layout") != "struct_type":
                continue
            layout = records.compile_layout(value.struct_type, verified.catalogue)
            align = max([1] + [leaf.width // 8 for leaf in layout.leaves.values() if leaf.elem_type is not None])
            size = info.element_bytes
            padded = -(-size // align) * align
            if padded != size:
                value.raw_data = pad_records(value.raw_data, size, padded)


class _BorrowingResetState(FaultState):
    """A state whose reset takes the new initial structs the way FirstFieldOwnerOnly takes them at open."""

    def reset(self, initial):
        return super().reset({name: self.fault._borrowed(value) for name, value in initial.items()})


class FirstFieldOwnerOnly(Fault):
    """Retains one owner per struct, its first field's: the other fields of an initial struct are held as
    views into the call's scratch memory, which is reused (reads zeros) once the call that took them
    returns, instead of each field keeping its own owner."""

    fault_id = "PAY-FIELD-OWNERS.first-field-owner-only"
    clauses = ("PAY-FIELD-OWNERS",)

    def __init__(self) -> None:
        super().__init__()
        self._scratch: list[bytearray] = []

    def _borrowed(self, value):
        if not isinstance(value, Struct):
            return value
        fields = dict(value)
        for name in list(fields)[1:]:
            item = fields[name]
            if isinstance(item, np.ndarray) and item.dtype.kind not in "OUS" and item.size:
                scratch = bytearray(np.ascontiguousarray(item).tobytes())
                self._scratch.append(scratch)
                fields[name] = np.frombuffer(scratch, item.dtype).reshape(item.shape)
        return Struct(fields, value.type_id)

    def open_state(self, model_bytes, initial, base_dir=None):
        initial = {name: self._borrowed(value) for name, value in initial.items()}
        return super().open_state(model_bytes, initial, base_dir)

    def make_state(self, handle):
        return _BorrowingResetState(handle.state, self)

    @contextlib.contextmanager
    def injected(self):
        with super().injected():
            yield
        if INSTALLER.idle:  # the call that took the fields returned: its scratch is reused
            for scratch in self._scratch:
                scratch[:] = bytes(len(scratch))
            self._scratch.clear()


name_faults(globals())

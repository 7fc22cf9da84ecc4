"""Faults in payload ownership and lifetime: arenas, inline defaults, exclusivity, owners and read-only bytes."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from types import MappingProxyType

import numpy as np

from conformance.audit.fault import (
    TESTEE_COPIES_RETURNED_VALUES,
    Patch,
    encoded_values,
    fault,
    hooked_state,
    name_faults,
    returning,
    wrap,
)
from conformance.audit.fault import decode_module as decode
from conformance.audit.faults.external import ReusedAfterCall, refusing
from conformance.audit.faults.shared import _EXTERNAL, _INDEX_PATH, _map_neutral
from conformance.audit.faults.state import after_run, by_model, edited, flagged, opening, per_model
from conformance.values import Struct
from reference_impl import payload, records, verifier
from reference_impl import state as state_module
from reference_impl.errors import ContractError, violation
from reference_impl.errors import ErrorCode as E
from reference_impl.executor import kernels
from reference_impl.values import EncodedValue


def _encoded_edit(when: Callable, clear: tuple[str, ...] = (), location: int | None = None) -> Callable:
    """A transform clearing the fields ``clear`` of (or setting ``data_location`` on) each encoded value ``when``
    holds for."""
    def transform(model, base_dir):
        for value in encoded_values(model):
            if when(value):
                for name in clear:
                    value.ClearField(name)
                if location is not None:
                    value.data_location = location
    return transform


def _no_payload(model, base_dir):
    for value in encoded_values(model):
        if value.data_location != _EXTERNAL and not value.raw_data:
            raise violation(E.PAYLOAD_PARTIAL_RECORD, f"model.graph.encoded_initializer[{value.name!r}]",
                            "the encoded value has no payload")


ExternalWinsOverRawData = fault("PAY-EXCLUSIVE.external-wins", ("PAY-EXCLUSIVE",), """Reads the external payload
    whenever external_data entries are present and ignores raw_data, instead of rejecting a value that carries
    both.""", transform=_encoded_edit(lambda v: len(v.external_data) and v.HasField("raw_data"), clear=("raw_data",)))
RawDataWinsOverExternal = fault("PAY-EXCLUSIVE.raw-data-wins", ("PAY-EXCLUSIVE",), """Reads raw_data whenever it is
    non-empty and ignores external_data and the location flag, instead of rejecting a value that carries both.""",
    transform=_encoded_edit(lambda v: v.raw_data and len(v.external_data), clear=("external_data", "data_location")))
ExclusiveOnlyWhenExternal = fault("PAY-EXCLUSIVE.checked-on-external-branch-only", ("PAY-EXCLUSIVE",), """Checks
    raw_data against external_data only on the EXTERNAL branch: a value left at the default location reads its raw_data
    and ignores the external_data entries next to it.""", transform=_encoded_edit(
        lambda v: v.data_location != _EXTERNAL and v.HasField("raw_data") and len(v.external_data),
        clear=("external_data",)))
LocationFlagInferred = fault("PAY-DEFAULT-INLINE.location-inferred", ("PAY-DEFAULT-INLINE",), """Treats a value with
    external_data entries as external even when data_location is left at its default, instead of reading the default
    location as raw_data.""", transform=_encoded_edit(
        lambda v: len(v.external_data) and v.data_location != _EXTERNAL and not v.HasField("raw_data"),
        location=_EXTERNAL))
ExplicitDefaultReadAsExternal = fault("PAY-DEFAULT-INLINE.explicit-default-read-as-external", ("PAY-DEFAULT-INLINE",),
    """Decides the payload location by whether data_location is present, not by its value: a value that spells out
    ``data_location: DEFAULT`` is read as external (and, having no external_data, refused).""",
    transform=_encoded_edit(lambda v: v.HasField("data_location") and v.data_location != _EXTERNAL,
                            location=_EXTERNAL))
EmptyPayloadRejected = fault("PAY-EMPTY.empty-payload-rejected", ("PAY-EMPTY",), """Takes an empty inline payload for
    a missing one and refuses it, instead of reading zero records.""", precheck=_no_payload)
EmptyExternalExtentRefused = fault("PAY-EMPTY.empty-external-refused", ("PAY-EMPTY", "PAY-EXTERNAL-EXTENT"), """Maps
    every external extent with mmap, which refuses a length of zero: an external payload of zero bytes (zero records,
    zero codes) fails instead of reading as empty.""", boundary=True, patches=lambda: [refusing(
        "open_payload", lambda extent: extent.external and extent.length == 0, "mmap: cannot map an empty extent")])


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


DecoderBeforeBounds = fault("PAY-VALIDATE-FIRST.decoder-before-bounds", ("PAY-VALIDATE-FIRST",), """Checks a struct
    payload's bounds only when the value is decoded, and only after handing its whole records to the registered decoder:
    loading accepts a partial record, and decoding reports what the decoder made of the short payload instead of the
    partial record.""", patches=lambda: [wrap(verifier, "_verify_struct_layout", _bounds_deferred),
                                         wrap(decode, "decode_value", _decoder_first)])
DecodeKernelTrustsFeeds = fault("PAY-VALIDATE-FIRST.decode-kernel-trusts-feeds", ("PAY-VALIDATE-FIRST",), """Checks
    payload bounds when a model's encoded initializers are loaded, but the Decode kernel assumes every value reaching it
    was checked there: a fed or retained encoded value with a partial trailing record is handed to the decoder, which
    reads the whole records and drops the rest.""",
    patches=lambda: [wrap(kernels, "decode_value", _whole_records_only, aliases=False)])


def pad_records(raw: bytes, size: int, padded: int) -> bytes:
    """Records of ``size`` bytes each, every one followed by zero bytes up to ``padded`` (native padding)."""
    rows = np.frombuffer(raw, np.uint8).reshape(-1, size)
    out = np.zeros((len(rows), padded), np.uint8)
    out[:, :size] = rows
    return out.tobytes()


def _saved_padded(alignment: Callable) -> Callable:
    """An ``on_save`` writing each record padded to a multiple of ``alignment(value, verified_model)`` bytes (None: the
    value is saved as it is)."""
    def on_save(model):
        try:
            verified = verifier.verify_model(model)
        except Exception:  # noqa: BLE001 - a model the oracle refuses is saved as it is
            return
        for value in model.graph.encoded_initializer:
            info = verified.encoded.get(value.name)
            size = info.element_bytes if info is not None else None
            align = alignment(value, verified) if size and value.raw_data else None
            if align and size % align:
                value.raw_data = pad_records(value.raw_data, size, -(-size // align) * align)
    return on_save


def _widest_leaf(value, verified):
    if value.WhichOneof("layout") != "struct_type":
        return None
    layout = records.compile_layout(value.struct_type, verified.catalogue)
    return max([1] + [leaf.width // 8 for leaf in layout.leaves.values() if leaf.elem_type is not None])


NativePaddingSaved = fault("PAY-NO-POINTERS.native-padding-saved", ("PAY-NO-POINTERS",), """Saves struct records as
    its in-memory structs, each padded to an 8-byte boundary (native padding), instead of the tight serialized
    records.""", on_save=_saved_padded(lambda value, verified: 8))
TailAlignedRecordsSaved = fault("PAY-NO-POINTERS.tail-aligned-records-saved", ("PAY-NO-POINTERS",), """Saves each
    struct record as its native struct would be laid out in memory: tail-padded to the alignment of its widest scalar
    leaf (a record holding an INT64 grows to a multiple of eight bytes), instead of the tight serialized record.""",
    on_save=_saved_padded(_widest_leaf))


def _regrouped(value):
    """A struct whose array fields are copied into one shared allocation."""
    arrays = {name: item for name, item in value.items()
              if isinstance(item, np.ndarray) and item.dtype.kind not in "OUS"} if isinstance(value, Struct) else {}
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


def _contiguous_when(copied: Callable) -> Callable:
    """Patches adopting a tensor ``copied(array, path)`` holds for as a hidden contiguous copy."""
    def make(original):
        def adopt_array(array, path, *args, **kwargs):
            return original(np.ascontiguousarray(array) if copied(array, path) else array, path, *args, **kwargs)
        return adopt_array
    return lambda: [wrap(state_module, "_adopt_array", make)]


_FIELD_PATH = re.compile(r"\]\.|^\.")

StructFieldsRegrouped = fault("PAY-FIELD-OWNERS.fields-regrouped", ("PAY-FIELD-OWNERS",), """Packs the fields of a
    whole struct into one allocation when it takes the struct on, instead of retaining each field's own buffer and
    owner.""", open_state=opening(lambda fault, model_bytes, initial: {
        name: _regrouped(value) for name, value in initial.items()}))
StridedBuffersCopied = fault("PAY-UNSUPPORTED-OWNERSHIP.hidden-copy", ("PAY-UNSUPPORTED-OWNERSHIP",), """Repairs an
    unsupported (strided) buffer with a hidden contiguous copy instead of rejecting it.""",
    patches=_contiguous_when(lambda array, path: not array.flags.c_contiguous))
StridedStructFieldsCopied = fault("PAY-UNSUPPORTED-OWNERSHIP.strided-fields-copied",
    ("PAY-UNSUPPORTED-OWNERSHIP", "PAY-FIELD-OWNERS"), """Rejects a strided whole tensor but silently repairs a strided
    struct field with a contiguous copy (the struct path packs its fields densely).""",
    patches=_contiguous_when(lambda array, path: _FIELD_PATH.search(path) and not array.flags.c_contiguous
                             and array.dtype.kind not in "OUS"))
ResetRepairsStridedLayout = fault("PAY-UNSUPPORTED-OWNERSHIP.reset-strided-copied",
    ("PAY-UNSUPPORTED-OWNERSHIP", "ZC-ENTRY-POINTS"), """The reset path normalizes every initial value with a contiguous
    conversion, so a strided buffer given to ``reset`` is silently copied (``open`` and ``run`` still reject it).""",
    state=edited("reset", lambda handle, initial: {
        name: _map_neutral(value, on_array=lambda array, in_struct: np.ascontiguousarray(array)
                          if array.dtype.kind not in "OUS" else array) for name, value in initial.items()}))
CallerBuffersTakenAsOwned = fault("PAY-OWNERLESS.borrowed-feed-retained", ("PAY-OWNERLESS",), """Does not track which
    buffers the caller only lent for the call: a borrowed raw pointer (an ownerless borrow) is retained or returned like
    any buffer, although nothing keeps its memory alive after the call.""",
    patches=lambda: [Patch(state_module, "_ownerless", lambda array: False)])
EncodedInputsCopiedForWriting = fault("PAY-READ-ONLY.encoded-inputs-copied", ("PAY-READ-ONLY",), """Takes a private
    writable copy of every encoded input so its kernels may write into it, instead of treating encoded inputs as
    read-only shared payloads.""", patches=lambda: [returning(state_module, "_adopt_encoded", lambda adopted, *_:
        EncodedValue(adopted.header, adopted.payload.copy(), adopted.source, adopted.base_dir))])


def _recycling(take: Callable, unretained_only: bool = False) -> Callable:
    """An ``after_run`` edit writing each array output into the buffer ``take(handle, name, value)`` recycles (None:
    the output keeps its own), while whoever had that buffer before may still hold it."""
    def edit(handle, before, outputs):
        bound = {b.output_name: b.input_name for b in handle.state.bindings}
        retained = dict(handle.state._values)
        for name, value in outputs.items():
            if unretained_only and name in bound or not isinstance(value, np.ndarray) or value.dtype.kind in "OUS":
                continue
            slot = take(handle, name, value)
            if slot is None:
                continue
            try:
                slot.flags.writeable = True
            except ValueError:  # a view of memory the runtime does not own: never an arena buffer
                continue
            slot[...] = value  # recycled while the previous call's output (or its caller) still refers to it
            slot.flags.writeable = unretained_only
            outputs[name] = slot
            if name in bound:
                retained[bound[name]] = slot
        if not unretained_only:
            handle.state._values = MappingProxyType(retained)
        return outputs
    return edit


def _arena_slot(handle, name, value):
    slot = handle.arena.get(name)
    if slot is None or slot.shape != value.shape or slot.dtype != value.dtype:
        handle.arena[name] = value  # this call's buffer becomes the arena slot
        return None
    return slot


def _pooled_slot(handle, name, value):
    slot = next((s for s in handle.pool if s.shape == value.shape and s.dtype == value.dtype), None)
    if slot is not None:
        handle.pool[:] = [s for s in handle.pool if s is not slot]  # "released" by a closed state, still held
    return slot


def _close_to_pool(handle, close):
    produced = [] if handle.state.closed else [v for v in handle.state._values.values()
                                               if isinstance(v, np.ndarray) and v.base is None]
    result = close()
    handle.pool.extend(produced)
    return result


OutputArenaRecycled = fault("PAY-ARENA.output-buffers-recycled", ("PAY-ARENA",), """Writes each call's outputs into
    the previous call's output buffers (an arena recycled per call) while those buffers are still referenced by returned
    outputs.""", state=after_run(_recycling(_arena_slot), init=lambda handle: setattr(handle, "arena", {})))
UnboundOutputArenaRecycled = fault("PAY-ARENA.unretained-outputs-recycled", ("PAY-ARENA", "ZC-OUTSTANDING"), """Keeps
    retained outputs alive but recycles the buffers of the outputs that are not retained (returned only) from one call
    to the next, although the caller still holds the previous ones.""",
    state=after_run(_recycling(_arena_slot, unretained_only=True), init=lambda handle: setattr(handle, "arena", {})))
ClosedStateBuffersPooled = fault("PAY-ARENA.closed-state-buffers-pooled",
    ("PAY-ARENA", "ZC-OUTSTANDING", "STATE-CLOSE"),
    """Returns the buffers a closed state retained to a per-model pool, from which the next call of any state of that
    model takes its output buffers, although the caller may still hold views of them.""",
    testee_blind=TESTEE_COPIES_RETURNED_VALUES, open_state=by_model,
    state=after_run(_recycling(_pooled_slot), close=_close_to_pool,
                    init=lambda handle: setattr(handle, "pool", per_model(handle.fault, "pools", list))))

#: per-thread flags a fault sets around one path of the oracle (reset, a struct field, a sequence element)
_FLAGS = threading.local()


def _unchecked_while(flag: str) -> Callable:
    """A wrap of the oracle's ``_ownerless`` answering False while ``_FLAGS.<flag>`` is set."""
    return lambda original: lambda array: False if getattr(_FLAGS, flag, None) else original(array)


def _ownership_unchecked_at(where: re.Pattern, flag: str) -> list:
    """Patches under which adopting a tensor whose path matches ``where`` skips the ownership check (the
    oracle's ``_ownerless`` answers False while such a tensor is adopted)."""
    def adopt_array(original):
        def adopting(array, path, *args, **kwargs):
            if not where.search(path):
                return original(array, path, *args, **kwargs)
            setattr(_FLAGS, flag, True)
            try:
                return original(array, path, *args, **kwargs)
            finally:
                setattr(_FLAGS, flag, False)
        return adopting
    return [wrap(state_module, "_adopt_array", adopt_array), wrap(state_module, "_ownerless", _unchecked_while(flag))]


def _outputs_checked(keep: Callable) -> Patch:
    """A patch of the oracle's ``_reject_ownerless_outputs`` checking only what ``keep(found)`` leaves of the ownerless
    leaves it found."""
    return wrap(state_module, "_reject_ownerless_outputs", lambda original: lambda found: original(keep(found)))


ResetAcceptsOwnerless = fault("PAY-OWNERLESS.reset-borrow-retained", ("PAY-OWNERLESS", "STATE-RESET"), """Checks
    ownership of initial values when the state is opened but not on ``reset``: an ownerless borrow given to reset
    becomes retained state.""", patches=lambda: [wrap(state_module, "_ownerless", _unchecked_while("on"))],
    state=hooked_state(reset=flagged(_FLAGS, "on", lambda handle: True)))
StructFieldOwnershipUnchecked = fault("PAY-OWNERLESS.struct-fields-unchecked", ("PAY-OWNERLESS", "PAY-FIELD-OWNERS"),
    """Checks that a retained or returned tensor has an owner only for whole tensors, not for the tensor fields of a
    struct: an ownerless borrow inside a struct becomes retained state or a returned output.""",
    patches=lambda: _ownership_unchecked_at(_FIELD_PATH, "field") + [_outputs_checked(lambda found: {
        name: [(where, leaf) for where, leaf in pairs if not where] for name, pairs in found.items()})])
SequenceOwnershipUnchecked = fault("PAY-OWNERLESS.sequence-elements-unchecked", ("PAY-OWNERLESS",), """Checks that a
    retained tensor has an owner for whole tensors and struct fields but not for the elements of a sequence: an
    ownerless borrow inside a sequence becomes retained state.""",
    patches=lambda: _ownership_unchecked_at(_INDEX_PATH, "element"))
UnboundOutputsOwnershipUnchecked = fault("PAY-OWNERLESS.unselected-outputs-unchecked", ("PAY-OWNERLESS",), """Checks
    that outputs have an owner only for the outputs it retains: an ownerless borrow fed for the call and returned
    directly as an unselected output leaves the call.""", patches=lambda: [_outputs_checked(
        lambda found: found if getattr(_FLAGS, "bound", None) is None else {
            name: pairs for name, pairs in found.items() if name in _FLAGS.bound})],
    state=hooked_state(run=flagged(_FLAGS, "bound", lambda handle: {b.output_name for b in handle.state.bindings})))


class FirstFieldOwnerOnly(ReusedAfterCall):
    """Retains one owner per struct, its first field's: the other fields of an initial struct are held as
    views into the call's scratch memory, which is reused (reads zeros) once the call that took them
    returns, instead of each field keeping its own owner."""

    fault_id = "PAY-FIELD-OWNERS.first-field-owner-only"
    clauses = ("PAY-FIELD-OWNERS",)

    def borrowed(self, initial: dict) -> dict:
        return {name: self._borrowed(value) if isinstance(value, Struct) else value for name, value in initial.items()}

    def _borrowed(self, value):
        fields = dict(value)
        for name in list(fields)[1:]:
            item = fields[name]
            if isinstance(item, np.ndarray) and item.dtype.kind not in "OUS" and item.size:
                scratch = bytearray(np.ascontiguousarray(item).tobytes())
                self.scratch.append(scratch)
                fields[name] = np.frombuffer(scratch, item.dtype).reshape(item.shape)
        return Struct(fields, value.type_id)

    def open_state(self, model_bytes, initial, base_dir=None):
        return super().open_state(model_bytes, self.borrowed(initial), base_dir)

    def make_state(self, handle):
        return _BorrowingResetState(handle.state, self)


#: a state whose reset takes the new initial structs the way FirstFieldOwnerOnly takes them at open
_BorrowingResetState = edited("reset", lambda handle, initial: handle.fault.borrowed(initial))

name_faults(globals())

"""Faults in payloads: inline versus external data, external keys, extents and files, validation
order, the mapping owner, and what saved records may contain."""

from __future__ import annotations

import contextlib
import os
import pathlib
import stat

import numpy as np

from conformance.audit.fault import INSTALLER, Fault, Patch, encoded_values, skip, wrap
from conformance.audit.fault import decode_module as decode
from reference_impl import payload, records, verifier
from reference_impl.errors import ContractError, violation
from reference_impl.errors import ErrorCode as E

_EXTERNAL = payload.EXTERNAL


def _entries(value) -> dict[str, str]:
    return {entry.key: entry.value for entry in value.external_data}


class ExternalWinsOverRawData(Fault):
    """Reads the external payload whenever external_data entries are present and ignores raw_data,
    instead of rejecting a value that carries both."""

    fault_id = "PAY-EXCLUSIVE.external-wins"
    clauses = ("PAY-EXCLUSIVE",)

    def transform(self, model, base_dir):
        for value in encoded_values(model):
            if len(value.external_data) and value.HasField("raw_data"):
                value.ClearField("raw_data")


class LengthDefaultsToRestOfFile(Fault):
    """Follows the ONNX TensorProto convention where ``length`` is optional: a missing length means the
    rest of the backing file, instead of requiring an explicit length."""

    fault_id = "PAY-EXTERNAL-KEYS.length-optional"
    clauses = ("PAY-EXTERNAL-KEYS",)

    def transform(self, model, base_dir):
        for value in encoded_values(model):
            entries = _entries(value)
            if value.data_location != _EXTERNAL or "length" in entries or "location" not in entries:
                continue
            target = pathlib.Path(base_dir or ".") / entries["location"]
            if base_dir is not None and target.is_file():
                offset = int(entries["offset"]) if entries.get("offset", "").isdigit() else 0
                value.external_data.add(key="length", value=str(max(target.stat().st_size - offset, 0)))


def _lenient_number(text, path):
    try:
        return int(text, 0)
    except (TypeError, ValueError):
        raise violation(E.EXTERNAL_NUMBER_INVALID, path, f"{text!r} is not a number") from None


class LenientExternalNumbers(Fault):
    """Parses offset and length with a general integer parser (``strtoll``-like: spaces, signs and
    ``0x`` prefixes accepted) instead of as decimal uint64 strings."""

    fault_id = "PAY-EXTERNAL-KEYS.lenient-numbers"
    clauses = ("PAY-EXTERNAL-KEYS",)
    boundary = True

    def patches(self):
        return [Patch(payload, "_decimal", _lenient_number)]


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


class MappingReleasedEarly(Fault):
    """Maps the backing file in a scoped block and unmaps it when the load returns, although the
    payload views still point into the mapping (the mapping's owner is not retained).

    Touching unmapped pages would crash the process; the fault shows what a runtime whose pages were
    reused reads instead: the views it handed out (decoded values, a state's initial values) read zeros
    once the call that loaded them has returned."""

    fault_id = "PAY-EXTERNAL-OWNER.mapping-released"
    clauses = ("PAY-EXTERNAL-OWNER",)

    def __init__(self) -> None:
        super().__init__()
        self._mapped: list[bytearray] = []

    def patches(self):
        def make(original):
            def open_payload(value, extent, base_dir, path):
                if not extent.external or extent.length == 0:
                    return original(value, extent, base_dir, path)
                fd = payload.open_external(extent, base_dir, path)
                try:
                    pages = bytearray(os.pread(fd, extent.length, extent.offset))
                finally:
                    os.close(fd)
                self._mapped.append(pages)
                view = np.frombuffer(pages, dtype=np.uint8)
                view.flags.writeable = False
                return view
            return open_payload
        return [wrap(payload, "open_payload", make)]

    @contextlib.contextmanager
    def injected(self):
        with super().injected():
            yield
        if INSTALLER.idle:  # the loading call returned: its scoped mappings are gone
            for pages in self._mapped:
                pages[:] = bytes(len(pages))
            self._mapped.clear()


class BackingFileNotChecked(Fault):
    """Never checks at load that the backing file exists and covers offset + length (reads fail later,
    or read short)."""

    fault_id = "PAY-EXTERNAL-EXTENT.file-unchecked"
    clauses = ("PAY-EXTERNAL-EXTENT",)

    def patches(self):
        return [skip(payload, "check_file", "EXTERNAL_FILE_INVALID")]


def _offset_ignored(original):
    def open_payload(value, extent, base_dir, path):
        if extent.external:
            extent = type(extent)(extent.length, extent.location, 0)
        return original(value, extent, base_dir, path)
    return open_payload


class ExternalOffsetIgnored(Fault):
    """Maps an external payload from the start of its file, ignoring the offset."""

    fault_id = "PAY-EXTERNAL-EXTENT.offset-ignored"
    clauses = ("PAY-EXTERNAL-EXTENT",)
    boundary = True

    def patches(self):
        return [wrap(payload, "open_payload", _offset_ignored)]


def _uncontained_open(extent, base_dir, path):
    """The backing file opened by joining its location to the model directory, as written: absolute
    locations, '..' components and links lead wherever they point."""
    if base_dir is None:
        raise violation(E.EXTERNAL_FILE_INVALID, path, "external payload needs a base directory to resolve")
    target = os.path.join(os.fspath(base_dir), extent.location.replace("\\", "/"))
    try:
        fd = os.open(target, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except (OSError, ValueError) as err:
        raise violation(E.EXTERNAL_FILE_INVALID, path,
                        f"backing file {extent.location!r} cannot be opened: {err}") from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode) or info.st_size < extent.offset + extent.length:
        os.close(fd)
        raise violation(E.EXTERNAL_FILE_INVALID, path, "backing file is not a regular file covering offset + length")
    return fd


class LocationNotContained(Fault):
    """Joins the location to the model directory without checking that the result stays inside it
    (absolute paths, '..', drive letters and NUL characters pass)."""

    fault_id = "PAY-EXTERNAL-CONTAINED.no-containment"
    clauses = ("PAY-EXTERNAL-CONTAINED",)

    def patches(self):
        return [Patch(payload, "check_location", lambda location, path: None),
                Patch(payload, "open_external", _uncontained_open)]


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

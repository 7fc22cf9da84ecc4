"""Faults in payloads: inline versus external data, external keys, extents and files, validation
order, the mapping owner, and what saved records may contain."""

from __future__ import annotations

import mmap
import os
import pathlib

import numpy as np

from conformance.audit.fault import Fault, Patch, encoded_values, skip, wrap
from reference_impl import payload, verifier
from reference_impl.errors import ErrorCode as E
from reference_impl.errors import fail

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
        raise fail(E.EXTERNAL_NUMBER_INVALID, path, f"{text!r} is not a number") from None


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
                raise fail(E.PAYLOAD_PARTIAL_RECORD, f"model.graph.encoded_initializer[{value.name!r}]",
                           "the encoded value has no payload")


def _file_first(original):
    def verify_encoded_value(value, path, catalogue, base_dir=None):
        if base_dir is not None and value.data_location == _EXTERNAL:
            payload.check_file(payload.payload_extent(value, path), base_dir, path)
        return original(value, path, catalogue, base_dir)
    return verify_encoded_value


class FileOpenedBeforeLayout(Fault):
    """Opens and checks the backing file first, and validates the payload against the layout only
    afterwards."""

    fault_id = "PAY-VALIDATE-FIRST.file-before-layout"
    clauses = ("PAY-VALIDATE-FIRST",)

    def patches(self):
        return [wrap(verifier, "verify_encoded_value", _file_first)]


def _scoped_mapping(original):
    def open_payload(value, extent, base_dir, path):
        if not extent.external or extent.length == 0:
            return original(value, extent, base_dir, path)
        target = payload._resolve_file(extent, base_dir, path)
        with open(target, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as mapping:
            return np.frombuffer(mapping, dtype=np.uint8, count=extent.length, offset=extent.offset)
    return open_payload


class MappingReleasedEarly(Fault):
    """Maps the backing file in a scoped block and unmaps it when the load returns, although the
    payload views still point into the mapping (the mapping's owner is not retained)."""

    fault_id = "PAY-EXTERNAL-OWNER.mapping-released"
    clauses = ("PAY-EXTERNAL-OWNER",)

    def patches(self):
        return [wrap(payload, "open_payload", _scoped_mapping)]


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


def _uncontained_file(extent, base_dir, path):
    """The backing file, resolved without checking that it stays inside the model directory."""
    if base_dir is None:
        raise fail(E.EXTERNAL_FILE_INVALID, path, "external payload needs a base directory to resolve")
    target = pathlib.Path(base_dir) / extent.location.replace("\\", "/")
    if not target.is_file():
        raise fail(E.EXTERNAL_FILE_INVALID, path, f"backing file {extent.location!r} does not exist")
    if os.stat(target).st_size < extent.offset + extent.length:
        raise fail(E.EXTERNAL_FILE_INVALID, path, "backing file is shorter than offset + length")
    return target


class LocationNotContained(Fault):
    """Joins the location to the model directory without checking that the result stays inside it
    (absolute paths, '..', drive letters and NUL characters pass)."""

    fault_id = "PAY-EXTERNAL-CONTAINED.no-containment"
    clauses = ("PAY-EXTERNAL-CONTAINED",)

    def patches(self):
        return [Patch(payload, "check_location", lambda location, path: None),
                Patch(payload, "_resolve_file", _uncontained_file)]


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
            padded = -(-size // 8) * 8
            records = np.frombuffer(value.raw_data, np.uint8).reshape(-1, size)
            out = np.zeros((len(records), padded), np.uint8)
            out[:, :size] = records
            value.raw_data = out.tobytes()

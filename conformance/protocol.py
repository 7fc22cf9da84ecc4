"""The testee protocol in Python: message classes built from the protocol's one definition
(``conformance/protocol_schema.py``, which also renders ``conformance/testee.proto``; a test compiles the
.proto with protoc and checks the descriptors agree), the 4-byte little-endian length framing, and
conversion between protocol values and neutral values.

Building the descriptor here needs no protoc at install time and no generated code pinned to one
protobuf release.
"""

from __future__ import annotations

import struct
from typing import IO, Any

import numpy as np
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError

from conformance.protocol_schema import PACKAGE, SCHEMA
from conformance.values import Encoded, Struct, borrow, default_buffer_id, dtype_of, is_ownerless

PROTOCOL_VERSION = 5  # 2: Run.cancelled; 3: names as bytes, Rejection.causes, Counters; 4: Run.hold, Hold;
#                       5: base_dir on RoundTrip, Export and Rewrite
#: Default cap on one frame's length (bytes). A longer length prefix is a framing error before anything
#: is read; ``read_frame`` takes another cap, the testee adapter reads it from CONFORMANCE_MAX_FRAME.
MAX_FRAME = 1 << 26
_CHUNK = 1 << 20  # frames are read in chunks, so memory grows only with bytes that actually arrive

_F = descriptor_pb2.FieldDescriptorProto
_SCALARS = {"string": _F.TYPE_STRING, "bytes": _F.TYPE_BYTES, "int64": _F.TYPE_INT64, "uint64": _F.TYPE_UINT64,
            "uint32": _F.TYPE_UINT32, "bool": _F.TYPE_BOOL}

# name -> [(field, number, type (trailing * = repeated), oneof or None)], in .proto order
def file_descriptor() -> descriptor_pb2.FileDescriptorProto:
    """The protocol's descriptor, built from the schema (testee.proto is rendered from the same)."""
    fdp = descriptor_pb2.FileDescriptorProto(name="conformance/testee.proto", package=PACKAGE, syntax="proto3")
    for message in SCHEMA:
        msg = fdp.message_type.add(name=message.name)
        oneofs: list[str] = []
        for entry in message.fields:
            field_name, number, kind, oneof = entry.name, entry.number, entry.kind, entry.oneof
            repeated = kind.endswith("*")
            kind = kind.rstrip("*")
            field = msg.field.add(name=field_name, number=number, json_name=_camel(field_name),
                                  label=_F.LABEL_REPEATED if repeated else _F.LABEL_OPTIONAL)
            if kind in _SCALARS:
                field.type = _SCALARS[kind]
            else:
                field.type = _F.TYPE_MESSAGE
                field.type_name = f".{PACKAGE}.{kind}"
            if oneof:
                if oneof not in oneofs:
                    oneofs.append(oneof)
                    msg.oneof_decl.add(name=oneof)
                field.oneof_index = oneofs.index(oneof)
    return fdp


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.capitalize() for part in rest)


_POOL = descriptor_pool.DescriptorPool()
_POOL.Add(file_descriptor())
MESSAGES = {message.name: message_factory.GetMessageClass(_POOL.FindMessageTypeByName(f"{PACKAGE}.{message.name}"))
            for message in SCHEMA}
Request = MESSAGES["Request"]
Response = MESSAGES["Response"]


# ------------------------------------------------------------------------------------------ framing
class FramingError(Exception):
    """The peer closed the stream or sent a malformed frame."""


def write_frame(stream: IO[bytes], message) -> None:
    data = message.SerializeToString()
    stream.write(struct.pack("<I", len(data)) + data)
    stream.flush()


def read_exact(stream: IO[bytes], count: int) -> bytes:
    """Exactly ``count`` bytes, read in chunks (never asking the stream for more than one chunk, so a
    claimed length reserves nothing until the bytes arrive)."""
    buffer = bytearray()
    while len(buffer) < count:
        chunk = stream.read(min(_CHUNK, count - len(buffer)))
        if not chunk:
            raise FramingError(f"stream closed after {len(buffer)} of {count} bytes")
        buffer += chunk
    return bytes(buffer)


def read_frame(stream: IO[bytes], cls, max_frame: int = MAX_FRAME):
    """One length-prefixed message; FramingError on a closed stream, an over-long length prefix or
    bytes that do not parse as ``cls``."""
    (length,) = struct.unpack("<I", read_exact(stream, 4))
    if length > max_frame:
        raise FramingError(f"frame of {length} bytes exceeds the limit of {max_frame} bytes")
    message = cls()
    try:
        message.ParseFromString(read_exact(stream, length))
    except DecodeError as error:
        raise FramingError(f"a {length}-byte frame is not a {cls.DESCRIPTOR.name}: {error}") from None
    return message


# ---------------------------------------------------------------------------------- value transport
def encode_name(name: str | bytes) -> bytes:
    """Names travel as bytes: a model's names need not be valid UTF-8 (proto2 does not check strings)."""
    if isinstance(name, (bytes, bytearray)):
        return bytes(name)
    return name.encode("utf-8", "surrogateescape")


def decode_name(raw: bytes) -> str | bytes:
    """A name as protobuf itself gives it: ``str`` when it is valid UTF-8, else the exact bytes."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return bytes(raw)


def to_proto(value: Any, out, buffer_id=default_buffer_id, with_data: bool = True) -> None:
    """Fill a protocol Value from a neutral value (only shapes and buffer ids without ``with_data``)."""
    if value is None:
        out.none = True
    elif isinstance(value, Encoded):
        out.encoded.header = value.header.SerializeToString()
        if with_data:
            out.encoded.payload = np.ascontiguousarray(value.payload).tobytes()
        _set_buffer_id(out.encoded, buffer_id(value))
        out.encoded.read_only = not value.payload.flags.writeable
    elif isinstance(value, dict):
        out.struct.SetInParent()
        for name, item in value.items():
            to_proto(item, out.struct.fields.add(name=encode_name(name)).value, buffer_id, with_data)
        type_id = getattr(value, "type_id", None)
        if type_id is not None:
            out.struct.type_id = type_id
            out.struct.has_type_id = True
    elif isinstance(value, (list, tuple)):
        out.sequence.SetInParent()
        for item in value:
            to_proto(item, out.sequence.items.add(), buffer_id, with_data)
    else:
        array = np.asarray(value)
        tensor = out.tensor
        tensor.shape.extend(array.shape)
        if array.dtype.kind in "OUS":
            items = array.reshape(-1).tolist()
            if array.dtype.kind == "S" or any(isinstance(s, (bytes, bytearray)) for s in items):
                tensor.dtype = "bytes"  # ONNX strings are byte strings; they travel unchanged
                if with_data:
                    tensor.byte_strings.extend(bytes(s) if isinstance(s, (bytes, bytearray)) else str(s).encode()
                                               for s in items)
            else:
                tensor.dtype = "str"
                if with_data:
                    tensor.strings.extend(str(s) for s in items)
        else:
            tensor.dtype = array.dtype.name
            strided = _span(array)
            if strided is not None:
                span, strides = strided
                tensor.strides.extend(strides)
                if with_data:
                    tensor.data = span.tobytes()
            elif with_data:
                tensor.data = np.ascontiguousarray(array).tobytes()
        _set_buffer_id(tensor, buffer_id(value))
        tensor.read_only = bool(isinstance(value, np.ndarray) and not value.flags.writeable)
        tensor.ownerless = is_ownerless(value)


def _set_buffer_id(message, found: int | None) -> None:
    """A Tensor's or Encoded's buffer id; None (no identity) leaves it absent, 0 is an id like any other."""
    message.buffer_id = found or 0
    message.has_buffer_id = found is not None


def reported_id(message) -> int | None:
    """The buffer id a Tensor or Encoded reports, or None; a sender without has_buffer_id reports 0 as none."""
    return message.buffer_id if message.has_buffer_id or message.buffer_id else None


def _span(array: np.ndarray):
    """(covering span, element strides) of a non-contiguous array with positive strides, else None."""
    if array.flags.c_contiguous or array.size == 0 or any(s <= 0 for s in array.strides):
        return None
    if any(s % array.itemsize for s in array.strides):
        return None
    strides = [s // array.itemsize for s in array.strides]
    count = sum((n - 1) * s for n, s in zip(array.shape, strides)) + 1
    span = np.lib.stride_tricks.as_strided(array, (count,), (array.itemsize,))
    return np.array(span), strides


def from_proto(value, ids: dict[int, int] | None = None) -> Any:
    """A neutral value from a protocol Value; ``ids`` collects python id -> reported buffer id."""
    kind = value.WhichOneof("kind")
    if kind == "tensor" or kind is None:
        tensor = value.tensor
        shape = tuple(tensor.shape)
        if tensor.dtype == "str":
            array = np.array(list(tensor.strings), dtype=object).reshape(shape)
        elif tensor.dtype == "bytes":
            array = np.empty(len(tensor.byte_strings), dtype=object)
            array[:] = list(tensor.byte_strings)
            array = array.reshape(shape)
        elif tensor.strides:
            dtype = dtype_of(tensor.dtype)
            span = np.frombuffer(tensor.data, dtype=dtype).copy()
            array = np.lib.stride_tricks.as_strided(span, shape, [s * dtype.itemsize for s in tensor.strides])
        else:
            array = np.frombuffer(tensor.data, dtype=dtype_of(tensor.dtype)).reshape(shape)
            if tensor.ownerless and array.size:
                array = borrow(array)
            elif not tensor.read_only:
                array = array.copy()
        if ids is not None and reported_id(tensor) is not None:
            ids[id(array)] = tensor.buffer_id
        return array
    if kind == "struct":
        fields = {decode_name(field.name): from_proto(field.value, ids) for field in value.struct.fields}
        return Struct(fields, value.struct.type_id if value.struct.has_type_id else None)
    if kind == "sequence":
        return [from_proto(item, ids) for item in value.sequence.items]
    if kind == "encoded":
        from reference_impl import schema

        header = schema.EncodedValueProto()
        header.ParseFromString(value.encoded.header)
        payload = np.frombuffer(value.encoded.payload, dtype=np.uint8)
        result = Encoded(header, payload if value.encoded.read_only else payload.copy())
        if ids is not None and reported_id(value.encoded) is not None:
            ids[id(result)] = value.encoded.buffer_id
        return result
    return None


def named_to_proto(values: dict[str, Any], repeated, buffer_id=default_buffer_id, with_data: bool = True) -> None:
    for name, value in values.items():
        to_proto(value, repeated.add(name=encode_name(name)).value, buffer_id, with_data)


def adopt_ids(values: dict[str, Any], received, ids: dict[int, int]) -> None:
    """Map the runner's own leaves to the buffer ids the testee reported for its copies of them."""
    reported = {decode_name(item.name): item.value for item in received}
    for name, value in values.items():
        if name in reported:
            _adopt(value, reported[name], ids)


def _adopt(value: Any, proto, ids: dict[int, int]) -> None:
    kind = proto.WhichOneof("kind")
    if kind == "tensor" and reported_id(proto.tensor) is not None:
        ids[id(value)] = proto.tensor.buffer_id
    elif kind == "encoded" and reported_id(proto.encoded) is not None:
        ids[id(value)] = proto.encoded.buffer_id
    elif kind == "struct" and isinstance(value, dict):
        fields = {decode_name(f.name): f.value for f in proto.struct.fields}
        for name, item in value.items():
            if name in fields:
                _adopt(item, fields[name], ids)
    elif kind == "sequence" and isinstance(value, (list, tuple)):
        for item, sub in zip(value, proto.sequence.items):
            _adopt(item, sub, ids)


def named_from_proto(repeated, ids: dict[int, int] | None = None) -> dict[str, Any]:
    return {decode_name(item.name): from_proto(item.value, ids) for item in repeated}

"""The testee protocol in Python: message classes built from the protocol's one definition
(``conformance/protocol_schema.py``, which also renders ``conformance/testee.proto``; a test compiles the
.proto with protoc and checks the descriptors agree), the 4-byte little-endian length framing, and
conversion between protocol values and neutral values.

Building the descriptor here needs no protoc at install time and no generated code pinned to one
protobuf release.
"""

from __future__ import annotations

import ctypes
import re
import struct
from typing import IO, Any

import numpy as np
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.message import DecodeError

from conformance import wire
from conformance.protocol_schema import PACKAGE, SCHEMA
from conformance.values import Encoded, Struct, borrow, default_buffer_id, dtype_of, is_ownerless

PROTOCOL_VERSION = 5  # 2: Run.cancelled; 3: names as bytes, Rejection.causes, Counters; 4: Run.hold, Hold;
#                       5: base_dir on RoundTrip, Export and Rewrite
#: Default cap on one frame's length (bytes). A longer length prefix is a framing error before anything
#: is read; ``read_frame`` takes another cap, the testee adapter reads it from CONFORMANCE_MAX_FRAME.
MAX_FRAME = 1 << 26
#: Default cap on the objects one frame may hold: sub-messages (values, tensors, fields) and elements of
#: repeated fields. Parsing costs memory per object, not per byte (an empty tensor is two bytes on the wire
#: and a hundred once parsed), so frames are counted before they are parsed; ``read_frame`` takes another
#: cap, the testee adapter reads it from CONFORMANCE_MAX_OBJECTS.
MAX_OBJECTS = 1 << 18
#: Messages nest at most this deep in a frame: protobuf's own parser stops there too, and counting stops
#: before the runner's own recursion could.
MAX_DEPTH = 100
MAX_DIMS = 64  # NumPy's own limit on dimensions
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
    """The peer closed the stream or sent a malformed frame. ``prefix`` holds the four bytes of a length
    prefix beyond the cap (``read_frame``), so a reader can tell text written to the stream; ``closed``
    is set when the stream simply ended where a frame would start."""

    def __init__(self, message: str, prefix: bytes = b"", closed: bool = False):
        super().__init__(message)
        self.prefix = prefix
        self.closed = closed


def write_frame(stream: IO[bytes], message) -> None:
    data = message.SerializeToString()
    stream.write(struct.pack("<I", len(data)) + data)
    stream.flush()


def read_exact(stream: IO[bytes], count: int) -> bytes:
    """Exactly ``count`` bytes, read in chunks (never asking the stream for more than one chunk, so a
    claimed length reserves nothing until the bytes arrive)."""
    return bytes(_read_exact(stream, count))


def _read_exact(stream: IO[bytes], count: int) -> bytearray:
    buffer = bytearray()
    while len(buffer) < count:
        chunk = stream.read(min(_CHUNK, count - len(buffer)))
        if not chunk:
            raise FramingError(f"stream closed after {len(buffer)} of {count} bytes", closed=not buffer)
        buffer += chunk
    return buffer


def read_frame(stream: IO[bytes], cls, max_frame: int = MAX_FRAME, max_objects: int = MAX_OBJECTS):
    """One length-prefixed message; FramingError on a closed stream, an over-long length prefix, a frame
    holding more than ``max_objects`` objects or nesting values deeper than ``MAX_DEPTH`` (counted on the
    wire bytes before anything is parsed), or bytes that do not parse as ``cls``."""
    prefix = bytes(_read_exact(stream, 4))
    (length,) = struct.unpack("<I", prefix)
    if length > max_frame:
        raise FramingError(f"frame of {length} bytes exceeds the limit of {max_frame} bytes", prefix)
    try:
        data = _read_exact(stream, length)
    except FramingError as error:
        raise FramingError(str(error)) from None  # a frame cut short: not a clean end of the stream
    name = cls.DESCRIPTOR.name
    try:
        wire.count_objects(data, layout(cls.DESCRIPTOR), max_objects, MAX_DEPTH)
    except wire.TooManyObjects as error:
        raise FramingError(f"a {length}-byte {name} frame holds {error}") from None
    except wire.WireError as error:
        raise FramingError(f"a {length}-byte frame is not a {name}: {error}") from None
    message = cls()
    try:
        message.ParseFromString(data)
    except DecodeError as error:
        raise FramingError(f"a {length}-byte frame is not a {name}: {error}") from None
    return message


_LAYOUTS: dict[str, wire.Layout] = {}


def layout(descriptor) -> wire.Layout:
    """How the fields of a message count in ``wire.count_objects``: its message fields and repeated fields
    (a recursive message shares its layout)."""
    found = _LAYOUTS.get(descriptor.full_name)
    if found is not None:
        return found
    table: wire.Layout = {}
    _LAYOUTS[descriptor.full_name] = table
    for field in descriptor.fields:
        if field.type == _F.TYPE_MESSAGE:
            table[field.number] = (wire.MESSAGE, layout(field.message_type))
        elif field.is_repeated:
            scalar = field.type not in (_F.TYPE_STRING, _F.TYPE_BYTES)
            table[field.number] = (wire.PACKED if scalar else wire.ELEMENT, None)
    return table


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
            if not array.dtype.isnative:  # the wire carries values in native order; byte order is a layout
                array = array.astype(array.dtype.newbyteorder("="))
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


class ProtocolError(ValueError):
    """A message that parses but describes a value that cannot be: a shape, strides or dtype that do not
    fit the bytes sent with them, or more elements than the reader allows. Untrusted numbers never reach
    NumPy unchecked (a stride past the data would read the reader's own memory)."""


class Budget:
    """What one message's values may add up to once decoded: elements times item size, in bytes. Honest
    data never decodes to more than it occupies on the wire; zero or overlapping strides could."""

    def __init__(self, limit: int = MAX_FRAME):
        self.limit = limit
        self.used = 0

    def take(self, nbytes: int) -> None:
        self.used += nbytes
        if self.used > self.limit:
            raise ProtocolError(f"the values decode to more than {self.limit} bytes")


class Lending:
    """The memory behind ownerless values received from a peer: views of it own nothing (see
    ``values.borrow``), so it is kept here until ``release``, called when the case that received them
    ends; at most ``limit`` bytes are held at once."""

    def __init__(self, limit: int = MAX_FRAME):
        self.limit = limit
        self.held = 0
        self._arrays: list[np.ndarray] = []

    def lend(self, array: np.ndarray) -> np.ndarray:
        if self.held + array.nbytes > self.limit:
            raise ProtocolError(f"ownerless values received in one case exceed {self.limit} bytes")
        array = np.ascontiguousarray(array)
        self._arrays.append(array)
        self.held += array.nbytes
        raw = (ctypes.c_char * array.nbytes).from_address(array.__array_interface__["data"][0])
        return np.frombuffer(raw, dtype=array.dtype).reshape(array.shape)  # type: ignore[call-overload]

    def release(self) -> None:
        self._arrays.clear()
        self.held = 0


_DTYPE_NAME = re.compile(r"[a-z][a-z0-9_]{0,31}")


def tensor_dtype(name: str) -> np.dtype:
    """The fixed-width dtype a tensor names (NumPy's or ml_dtypes'), or ProtocolError: no object, string,
    structured, datetime or zero-size dtype is built from a peer's bytes."""
    dtype = None
    if _DTYPE_NAME.fullmatch(name):
        try:
            dtype = dtype_of(name)
        except Exception:  # noqa: BLE001 - any name NumPy and ml_dtypes do not know is refused below
            dtype = None
    if (dtype is None or dtype.name != name or dtype.itemsize == 0 or dtype.hasobject or dtype.fields is not None
            or dtype.subdtype is not None
            or not (dtype.kind in "biufc" or (dtype.kind == "V" and dtype.type.__module__.startswith("ml_dtypes")))):
        raise ProtocolError(f"tensor dtype {name[:40]!r} is not a fixed-width numeric type")
    return dtype


def _shape(tensor) -> tuple[int, ...]:
    if len(tensor.shape) > MAX_DIMS:
        raise ProtocolError(f"a tensor of {len(tensor.shape)} dimensions (at most {MAX_DIMS})")
    shape = tuple(tensor.shape)
    if any(n < 0 for n in shape):
        raise ProtocolError(f"tensor shape {list(shape)} has a negative dimension")
    return shape


def _count(shape: tuple[int, ...]) -> int:
    count = 1
    for n in shape:
        count *= n  # Python ints: no overflow
    return count


def _tensor(tensor, budget: Budget, lending: Lending | None) -> np.ndarray:
    """The array a protocol Tensor describes, built only after its shape, strides and dtype are checked
    against the bytes that came with it."""
    shape = _shape(tensor)
    count = _count(shape)
    if tensor.dtype in ("str", "bytes"):
        items = tensor.strings if tensor.dtype == "str" else tensor.byte_strings
        if len(items) != count:
            raise ProtocolError(f"a {tensor.dtype} tensor of shape {list(shape)} carries {len(items)} strings, "
                                f"not {count}")
        budget.take(count)
        array = np.empty(count, dtype=object)
        array[:] = list(items)
        return array.reshape(shape)
    dtype = tensor_dtype(tensor.dtype)
    data = tensor.data
    if tensor.strides:
        return _strided(data, shape, list(tensor.strides), dtype, count, budget)
    if len(data) != count * dtype.itemsize:
        raise ProtocolError(f"a {dtype.name} tensor of shape {list(shape)} needs {count * dtype.itemsize} bytes "
                            f"of data; {len(data)} came")
    budget.take(len(data))
    array = np.frombuffer(data, dtype=dtype).reshape(shape)
    if tensor.ownerless and array.size:
        return lending.lend(array) if lending is not None else borrow(array)
    return array if tensor.read_only else array.copy()


def _strided(data: bytes, shape: tuple[int, ...], strides: list[int], dtype: np.dtype, count: int,
             budget: Budget) -> np.ndarray:
    """A view onto a private copy of ``data`` with element ``strides``: the first element at the start of
    the data, every other within it. Reach is computed exactly before NumPy sees a stride."""
    if len(strides) != len(shape):
        raise ProtocolError(f"{len(strides)} strides for a tensor of {len(shape)} dimensions")
    if len(data) % dtype.itemsize:
        raise ProtocolError(f"{len(data)} bytes of data are not a whole number of {dtype.name} elements")
    if count == 0:
        return np.empty(shape, dtype=dtype)
    reach = 0
    for dim, (n, stride) in enumerate(zip(shape, strides)):
        if n > 1 and stride < 0:
            raise ProtocolError(f"stride {stride} of dimension {dim} reaches before the start of the data")
        reach += (n - 1) * stride
    held = len(data) // dtype.itemsize
    if reach >= held:
        raise ProtocolError(f"shape {list(shape)} with strides {strides} reaches element {reach}, but the data "
                            f"holds {held} {dtype.name} element(s) ({len(data)} bytes)")
    budget.take(max(count * dtype.itemsize, len(data)))
    span = np.frombuffer(data, dtype=dtype).copy()
    byte_strides = [stride * dtype.itemsize if n > 1 else 0 for n, stride in zip(shape, strides)]
    return np.lib.stride_tricks.as_strided(span, shape, byte_strides)


def from_proto(value, ids: dict[int, int] | None = None, lending: Lending | None = None,
               budget: Budget | None = None) -> Any:
    """A neutral value from a protocol Value; ``ids`` collects python id -> reported buffer id. Ownerless
    tensors are lent through ``lending`` (else ``values.borrow``, kept for the process's life); a value
    that cannot be is a ProtocolError, and all of one message's values share one ``budget``."""
    budget = budget if budget is not None else Budget()
    kind = value.WhichOneof("kind")
    if kind == "tensor" or kind is None:
        array = _tensor(value.tensor, budget, lending)
        if ids is not None and reported_id(value.tensor) is not None:
            ids[id(array)] = value.tensor.buffer_id
        return array
    if kind == "struct":
        fields = {decode_name(field.name): from_proto(field.value, ids, lending, budget)
                  for field in value.struct.fields}
        return Struct(fields, value.struct.type_id if value.struct.has_type_id else None)
    if kind == "sequence":
        return [from_proto(item, ids, lending, budget) for item in value.sequence.items]
    if kind == "encoded":
        from reference_impl import schema

        header = schema.EncodedValueProto()
        try:
            header.ParseFromString(value.encoded.header)
        except DecodeError as error:
            raise ProtocolError(f"an encoded value's header does not parse: {error}") from None
        budget.take(len(value.encoded.payload))
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


def named_from_proto(repeated, ids: dict[int, int] | None = None, lending: Lending | None = None,
                     budget: Budget | None = None) -> dict[str, Any]:
    """Named values from one message, sharing one budget (see ``from_proto``)."""
    budget = budget if budget is not None else Budget()
    return {decode_name(item.name): from_proto(item.value, ids, lending, budget) for item in repeated}

"""Protobuf wire encoding by hand, for inputs that must not depend on any schema: wire-level cases that
check the frozen field numbers, fuzz dictionaries, and bytes that text format cannot express."""

from __future__ import annotations


def varint(value: int) -> bytes:
    """Base-128 varint, least significant group first."""
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def tag(number: int, wire_type: int) -> bytes:
    return varint(number << 3 | wire_type)


def field(number: int, payload: bytes) -> bytes:
    """A length-delimited field (wire type 2)."""
    return tag(number, 2) + varint(len(payload)) + payload


def field_varint(number: int, value: int) -> bytes:
    """A varint field (wire type 0)."""
    return tag(number, 0) + varint(value)


# ------------------------------------------------------------------------------ counting before parsing
#: How a field counts in ``count_objects``: a sub-message, one element of a repeated string/bytes/scalar
#: field, or a packed run of varints (one element per varint).
MESSAGE, ELEMENT, PACKED = "message", "element", "packed"
#: field number -> (how it counts, the layout of a sub-message or None)
Layout = dict[int, tuple[str, "Layout | None"]]

_LOW_BYTES = bytes(range(0x80))  # the last byte of a varint is below 0x80; deleting these leaves the others


class WireError(ValueError):
    """Bytes that are not a protobuf message: a truncated or over-long varint, a field running past its
    message, a group (proto3 has none)."""


class TooManyObjects(WireError):
    """A message holding more objects, or nesting deeper, than its reader allows."""


def count_objects(data: bytes | bytearray, layout: Layout, limit: int, max_depth: int) -> int:
    """The objects parsing ``data`` as ``layout`` creates (sub-messages and repeated elements), counted
    from the wire bytes alone. Parsing costs memory per object rather than per byte, so an untrusted
    frame is counted first: ``TooManyObjects`` is raised as soon as the count passes ``limit`` or messages
    nest deeper than ``max_depth``, after looking at no more of the frame than that."""
    count = 0
    pos, end = 0, len(data)
    parents: list[tuple[int, Layout]] = []
    while True:
        if pos >= end:
            if pos > end:
                raise WireError("a field runs past the end of its message")
            if not parents:
                return count
            end, layout = parents.pop()
            continue
        key = data[pos]
        pos += 1
        if key >= 0x80:
            key, pos = _varint_rest(data, pos, key)
        number, wire_type = key >> 3, key & 7
        entry = layout.get(number)
        if wire_type == 2:
            length = data[pos] if pos < len(data) else 0x80
            if length < 0x80:
                pos += 1
            else:
                length, pos = _varint_rest(data, pos + 1, length)
            stop = pos + length
            if stop > end:
                raise WireError("a field runs past the end of its message")
            if entry is None:
                pos = stop
            elif entry[0] == MESSAGE:
                count += 1
                if count > limit:
                    raise TooManyObjects(f"more than {limit} objects")
                if len(parents) >= max_depth:
                    raise TooManyObjects(f"messages nested deeper than {max_depth} levels")
                parents.append((end, layout))
                end, layout = stop, entry[1] or {}
            else:
                count += 1 if entry[0] == ELEMENT else length - len(data[pos:stop].translate(None, _LOW_BYTES))
                if count > limit:
                    raise TooManyObjects(f"more than {limit} objects")
                pos = stop
        elif wire_type == 0:
            while True:
                if pos >= end:
                    raise WireError("a varint runs past the end of its message")
                pos += 1
                if data[pos - 1] < 0x80:
                    break
            if entry is not None and entry[0] != MESSAGE:
                count += 1
                if count > limit:
                    raise TooManyObjects(f"more than {limit} objects")
        elif wire_type == 1:
            pos += 8
        elif wire_type == 5:
            pos += 4
        else:
            raise WireError(f"field {number} has wire type {wire_type} (groups and unknown types are not accepted)")


def _varint_rest(data: bytes | bytearray, pos: int, first: int) -> tuple[int, int]:
    """The varint whose first byte ``first`` (>= 0x80) was read just before ``pos``; (value, next pos)."""
    value, shift = first & 0x7F, 7
    while True:
        if pos >= len(data) or shift > 63:
            raise WireError("a varint is truncated or longer than 10 bytes")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7

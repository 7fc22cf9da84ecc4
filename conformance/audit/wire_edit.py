"""Field renumbering on raw protobuf bytes: how a runtime compiled against a misnumbered schema reads a
conforming model (the fields it expects elsewhere look unknown to it)."""

from __future__ import annotations

from conformance.wire import tag, varint


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


def _fields(data: bytes):
    """(number, wire type, raw value bytes) of every top-level field; raises ValueError when malformed."""
    pos = 0
    while pos < len(data):
        key, pos = _read_varint(data, pos)
        number, wire_type = key >> 3, key & 7
        start = pos
        if wire_type == 0:
            _, pos = _read_varint(data, pos)
        elif wire_type == 1:
            pos += 8
        elif wire_type == 5:
            pos += 4
        elif wire_type == 2:
            length, start = _read_varint(data, pos)
            pos = start + length
        else:
            raise ValueError(f"wire type {wire_type} is not handled")
        if pos > len(data):
            raise ValueError("truncated field")
        yield number, wire_type, data[start:pos]


def renumber(data: bytes, path: tuple[int, ...], mapping: dict[int, int]) -> bytes:
    """``data`` with the fields of the message at ``path`` (field numbers of nested length-delimited
    messages, every occurrence) renumbered by ``mapping``. Malformed bytes come back unchanged."""
    try:
        return _renumber(data, path, mapping)
    except (ValueError, IndexError):
        return data


def _renumber(data: bytes, path: tuple[int, ...], mapping: dict[int, int]) -> bytes:
    out = bytearray()
    for number, wire_type, value in _fields(data):
        if path and number == path[0] and wire_type == 2:
            value = _renumber(value, path[1:], mapping)
        elif not path:
            number = mapping.get(number, number)
        out += tag(number, wire_type)
        out += varint(len(value)) + value if wire_type == 2 else value
    return bytes(out)

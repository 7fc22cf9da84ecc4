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

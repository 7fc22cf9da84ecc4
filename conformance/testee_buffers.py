"""The testee server's record of the buffers it reported, per state: what keeps each alive until its state
closes (a reported address must not be reused by another buffer while the state is open), and how a value
the runner sends back is matched to the very object the adapter handed out.

In process the runner hands an adapter back its own objects (a present fed to another state, a retained
value given to reset); through the testee it sends a copy that names the buffer it came from
(``has_buffer_id``). The server gives the adapter that buffer's own object when the copy is identical to
it (kind, dtype, shape and contents), else the copy: a runner's id never makes the adapter read other
data than the runner sent.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from conformance import protocol as P
from conformance.values import Encoded, Struct


class HandedOut:
    """state -> buffer id -> the values reported under that id, oldest first."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._states: dict[int, dict[int, list[Any]]] = {}

    def record(self, state_id: int, buffer_id: int, value: Any) -> None:
        """``value`` was reported under ``buffer_id``; it stays referenced until ``forget(state_id)``."""
        with self._lock:
            self._states.setdefault(state_id, {}).setdefault(buffer_id, []).append(value)

    def forget(self, state_id: int) -> None:
        """The state closed: its buffers may go (and their addresses be reused)."""
        with self._lock:
            self._states.pop(state_id, None)

    def find(self, buffer_id: int, copy: Any) -> Any | None:
        """The latest value reported under ``buffer_id`` (by any open state) that ``copy`` reproduces."""
        with self._lock:
            candidates = [value for ids in self._states.values() for value in ids.get(buffer_id, ())]
        for value in reversed(candidates):
            if same_value(value, copy):
                return value
        return None

    def values(self, repeated) -> dict[str, Any]:
        """A request's named values with every leaf that names a reported buffer, and reproduces it, replaced
        by that buffer's own object."""
        return {P.decode_name(item.name): self._own(P.from_proto(item.value), item.value) for item in repeated}

    def _own(self, value: Any, proto) -> Any:
        kind = proto.WhichOneof("kind")
        if kind in ("tensor", "encoded"):
            message = getattr(proto, kind)
            if not message.has_buffer_id or (kind == "tensor" and message.ownerless):
                return value  # an ownerless loan is a fresh borrow in process too, never a handed-out buffer
            found = self.find(message.buffer_id, value)
            return value if found is None else found
        if kind == "struct" and isinstance(value, Struct):
            protos = {P.decode_name(field.name): field.value for field in proto.struct.fields}
            return Struct({name: self._own(item, protos[name]) for name, item in value.items()}, value.type_id)
        if kind == "sequence" and isinstance(value, list):
            return [self._own(item, sub) for item, sub in zip(value, proto.sequence.items)]
        return value


def same_value(original: Any, copy: Any) -> bool:
    """Whether ``copy`` (decoded from the wire) is an exact copy of ``original``: kind, dtype, shape and
    contents (headers of encoded values too)."""
    if isinstance(original, Encoded) and isinstance(copy, Encoded):
        return (original.header.SerializeToString(deterministic=True) == copy.header.SerializeToString(
            deterministic=True) and same_value(original.payload, copy.payload))
    if not isinstance(original, np.ndarray) or not isinstance(copy, np.ndarray) or original.shape != copy.shape:
        return False
    if original.dtype.kind in "OUS" or copy.dtype.kind in "OUS":
        return original.dtype.kind in "OUS" and copy.dtype.kind in "OUS" and original.tolist() == copy.tolist()
    return original.dtype == copy.dtype and original.tobytes() == copy.tobytes()

"""Faults in mechanisms more than one area's faults use (registries with decoders added, neutral-value walks)."""

from __future__ import annotations

import dataclasses
import functools
import importlib
import re

import numpy as np

from conformance.audit.fault import FaultState, Patch
from conformance.audit.fault import decode_module as decode
from conformance.values import Encoded, Struct
from reference_impl import decoders, dtypes, payload
from reference_impl.values import EncodedValue, StructValue


@functools.cache
def _with_decoders(replacements: tuple) -> decoders.DecoderRegistry:
    """The default registry with the decode functions of some type IDs replaced (same registrations).
    Built once per replacement set, while no fault is installed."""
    registry = decoders.default_registry()
    for type_id, decode_fn in replacements:
        registry._decoders[type_id] = dataclasses.replace(registry._decoders[type_id], decode=decode_fn)
    return registry


def _registry_patch(*replacements: tuple[int, object]) -> Patch:
    """The default decoder registry, with some decoders replaced, as the one ``decode`` uses."""
    registry = _with_decoders(tuple(replacements))
    return Patch(decode, "_registry", lambda given=None: given if given is not None else registry)


def _implicit_operand(struct_to_tensor=None, encoded_to_tensor=None):
    def make(original):
        def tensor_operand(value, op_type, path):
            if isinstance(value, StructValue) and struct_to_tensor is not None:
                return struct_to_tensor(value)
            if isinstance(value, EncodedValue) and encoded_to_tensor is not None:
                return encoded_to_tensor(value)
            return original(value, op_type, path)
        return tensor_operand
    return make


_SUB_BYTE = (dtypes.INT4, dtypes.UINT4, dtypes.INT2, dtypes.UINT2)
_EXTERNAL = payload.EXTERNAL
_INDEX_PATH = re.compile(r"\[\d+\]")
# the modules (``reference_impl.kv`` re-exports functions of the same names)
attention_module = importlib.import_module("reference_impl.kv.attention")
paged_attention_module = importlib.import_module("reference_impl.kv.paged_attention")


def _map_neutral(value, on_array=None, on_encoded=None, in_struct: bool = False):
    """``value`` rebuilt with ``on_array(array, in_struct)`` / ``on_encoded(encoded)`` applied to its leaves."""
    if isinstance(value, np.ndarray):
        return on_array(value, in_struct) if on_array else value
    if isinstance(value, Encoded):
        return on_encoded(value) if on_encoded else value
    if isinstance(value, Struct):
        return Struct({k: _map_neutral(v, on_array, on_encoded, True) for k, v in value.items()}, value.type_id)
    if isinstance(value, list):
        return [_map_neutral(v, on_array, on_encoded, in_struct) for v in value]
    return value


def _name(value) -> str:
    return f"model.graph.encoded_initializer[{value.name!r}]"


class _ExtraRetainedState(FaultState):
    """Retains, besides the bound outputs, the unselected outputs ``also(outputs)`` names."""

    def __init__(self, state, fault, also):
        super().__init__(state, fault)
        self.also = also
        self.extra: dict = {}

    def run(self, feeds):
        outputs = super().run(feeds)
        self.extra = {name: outputs[name] for name in self.also(self.state, outputs)}
        return outputs

    def reset(self, initial):
        super().reset(initial)
        self.extra = {}

    def values(self):
        return {**self.extra, **super().values()}

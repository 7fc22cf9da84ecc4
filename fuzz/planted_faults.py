"""Faults that hide where random scripts rarely look, planted to show the ``statediff`` target reaches them.

Each is the reference adapter with one realistic bug, written on the audit catalogue's ``Fault`` seam
(``conformance.audit.fault``) and kept out of the catalogue: they measure the generators' dimensions
(``fuzz.dimensions``), not the conformance cases. Each needs one dimension to show:

* ``FirstBindingOnly``: binding types are checked for the first persistent binding only (a bad binding
  placed in the middle or last);
* ``DroppedRemainderTile``: element-wise kernels tile by 64 and drop the last partial tile of a tensor
  larger than one tile (a size with a remainder);
* ``StalePreparedModel``: prepared models are cached under a key that leaves out constant values and float
  attributes, so a near-duplicate model gets the first one's results (a twin in the same script);
* ``OddLayoutCopied``: misaligned and strided caller buffers are silently copied into aligned contiguous
  ones (a fresh feed Identity passes on is then a new buffer);
* ``SoftcapIgnoredForInt4Keys``: paged attention leaves the softcap out when a key block is INT4 (an
  attribute meeting one block format).

Subjects: ``python -m fuzz run statediff --subject fuzz.planted_faults:FirstBindingOnly --stop-on-finding``
(``PLANTED`` lists them; ``benchmarks/bench_statediff_find.py --planted`` times each).

Four more are for the ``differential`` target (``DIFFERENTIAL_PLANTED``; ``bench_statediff_find.py --planted 1
--target differential`` times them), each needing one dimension of the generated models (``fuzz.gen``,
``fuzz.twins``, ``fuzz.mutators``):

* ``FirstComponentWidthOnly``: bit widths are range-checked for a bit packing's first component only (a bad
  component placed in the middle or last);
* ``DroppedPartialBlock``: blocked affine values with 16 or more elements along the axis are decoded whole
  block by whole block and the partial last block is never written (a large size with a remainder);
* ``SharedInitializerDecode``: encoded values with equal payload bytes and logical type share one decode,
  scale, zero point, axis, type_id and field names left out of the key (a twin in the same model);
* ``OutBufferCopied``: a strided caller buffer (``out=``) is accepted by decoding elsewhere and copying in,
  where the contract refuses it (a caller buffer in an odd layout).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import threading
from typing import Any

import numpy as np

from conformance.audit.fault import Fault, FaultState, wrap
from reference_impl import schema

#: the element-wise operators the tiling fault reaches, and its tile
TILED = ("Add", "Sub", "Mul")
TILE = 64

_counts = threading.local()


def _first_binding_only(original, per_binding: int, slot: str):
    """``original`` for the first binding's calls (``per_binding`` of them); later ones find nothing."""
    def check(*args, **kwargs):
        seen = getattr(_counts, slot, 0)
        setattr(_counts, slot, seen + 1)
        return original(*args, **kwargs) if seen < per_binding else None
    return check


def _counting_from_zero(original):
    def validate(*args, **kwargs):
        _counts.incompatibility = _counts.string_path = 0
        return original(*args, **kwargs)
    return validate


class FirstBindingOnly(Fault):
    fault_id = "fuzz.first-binding-only"
    clauses = ("BIND-COMPATIBLE", "BIND-NO-STRINGS")

    def patches(self):
        bindings = importlib.import_module("reference_impl.bindings")
        return [wrap(bindings, "validate_bindings", _counting_from_zero),
                wrap(bindings, "incompatibility", lambda f: _first_binding_only(f, 1, "incompatibility"),
                     aliases=False),
                wrap(bindings, "string_path", lambda f: _first_binding_only(f, 2, "string_path"), aliases=False)]


def _drop_tail(result):
    """The vector loop's result: tiles of ``TILE`` elements; the scalar tail after them is never written."""
    if not isinstance(result, np.ndarray) or result.size <= TILE or result.size % TILE == 0:
        return result
    out = np.array(result)
    out.reshape(-1)[result.size - result.size % TILE:] = 0
    return out


def _tiled(original):
    def standard(node, opsets, path):
        run = original(node, opsets, path)
        if node.op_type not in TILED:
            return run

        def tiled(args, ctx, values):
            return tuple(_drop_tail(item) for item in run(args, ctx, values))
        return tiled
    return standard


class DroppedRemainderTile(Fault):
    fault_id = "fuzz.dropped-remainder-tile"
    clauses = ("STATE-RUN",)

    def patches(self):
        return [wrap(importlib.import_module("reference_impl.executor.program"), "_standard", _tiled)]


def prepared_key(model_bytes: bytes) -> str:
    """What the faulty cache keys a model by: everything but initializer values and float attributes."""
    try:
        model = schema.parse_model(model_bytes)
    except Exception:  # noqa: BLE001 - unparsable bytes are keyed as they are
        return hashlib.sha256(model_bytes).hexdigest()
    for tensor in model.graph.initializer:
        del tensor.float_data[:]
        tensor.raw_data = b""
    for node in model.graph.node:
        for attribute in node.attribute:
            attribute.ClearField("f")
    return hashlib.sha256(model.SerializeToString(deterministic=True)).hexdigest()


class StalePreparedModel(Fault):
    fault_id = "fuzz.stale-prepared-model"
    clauses = ("STATE-RUN",)

    def __init__(self) -> None:
        super().__init__()
        self._prepared: dict[str, bytes] = {}
        self._lock = threading.Lock()

    def open_state(self, model_bytes, initial, base_dir=None):
        with self._lock:
            model_bytes = self._prepared.setdefault(prepared_key(model_bytes), model_bytes)
        return super().open_state(model_bytes, initial, base_dir)


def _settled(value: Any) -> Any:
    """A caller buffer as the faulty runtime hands it on: misaligned or strided arrays copied."""
    if isinstance(value, np.ndarray) and value.size and not (value.flags.aligned and value.flags.c_contiguous):
        copy = np.require(value, requirements=["C", "A"]).copy()
        copy.flags.writeable = False
        return copy
    return value


class _CopyingState(FaultState):
    def run(self, feeds):
        return super().run({name: _settled(value) for name, value in feeds.items()})

    def run_cancelled(self, feeds):
        return super().run_cancelled({name: _settled(value) for name, value in feeds.items()})

    def run_held(self, feeds, hold):
        return super().run_held({name: _settled(value) for name, value in feeds.items()}, hold)

    def reset(self, initial):
        return super().reset({name: _settled(value) for name, value in initial.items()})


class OddLayoutCopied(Fault):
    fault_id = "fuzz.odd-layout-copied"
    clauses = ("ZC-ENTRY-POINTS",)

    def make_state(self, handle):
        return _CopyingState(handle.state, self)


def _softcap_off_for_int4(original):
    def attend_row(q, cache, mask, attrs, offset):
        if attrs.softcap and any(key == "int4" for key, _ in cache.formats):
            attrs = dataclasses.replace(attrs, softcap=0.0)
        return original(q, cache, mask, attrs, offset)
    return attend_row


class SoftcapIgnoredForInt4Keys(Fault):
    fault_id = "fuzz.softcap-ignored-int4"
    clauses = ("KV-ATTENTION",)

    def patches(self):
        return [wrap(importlib.import_module("reference_impl.kv.paged_attention"), "_attend_row",
                     _softcap_off_for_int4, aliases=False)]


class FirstComponentWidthOnly(Fault):
    fault_id = "fuzz.first-component-width-only"
    clauses = ("DECL-WELLFORMED",)

    def transform(self, model, base_dir):
        """The packer reads every later out-of-range width as 64, the verifier having looked at the first."""
        from conformance.audit.fault import struct_types

        for st, _ in struct_types(model):
            if st.WhichOneof("kind") == "bit_packing":
                for component in list(st.bit_packing.component)[1:]:
                    if not 1 <= component.bit_width <= 64:
                        component.bit_width = 64


#: axes at least this long take the whole-block path of ``DroppedPartialBlock``
WHOLE_BLOCK_PATH = 16


def _whole_blocks_only(original):
    def dequantize(codes, storage_type, scale, zero_point, axis, block_size, shape, output_dtype=None, out=None):
        result = original(codes, storage_type, scale, zero_point, axis, block_size, shape, output_dtype, out)
        if axis is None or not block_size or len(shape) == 0:
            return result
        length = shape[axis]
        if length < WHOLE_BLOCK_PATH or length % block_size == 0 or length < block_size:
            return result
        tail = [slice(None)] * len(shape)
        tail[axis] = slice(length - length % block_size, length)
        result[tuple(tail)] = 0
        return result
    return dequantize


class DroppedPartialBlock(Fault):
    fault_id = "fuzz.dropped-partial-block"
    clauses = ("AFF-BLOCK",)

    def patches(self):
        return [wrap(importlib.import_module("reference_impl.affine"), "dequantize", _whole_blocks_only)]


def shared_key(value) -> tuple | None:
    """What the faulty loader shares a decode by: payload bytes (or extent) and the logical type, nothing
    of the layout (None: an empty payload is never shared)."""
    extent = tuple((entry.key, entry.value) for entry in value.external_data)
    if not value.raw_data and not extent:
        return None
    return value.raw_data, extent, value.logical_type.SerializeToString(deterministic=True)


class SharedInitializerDecode(Fault):
    fault_id = "fuzz.shared-initializer-decode"
    clauses = ("AFF-DQ", "DEC-MISSING")

    def _first_alike(self, model_bytes: bytes, name: str) -> str:
        try:
            values = list(schema.parse_model(model_bytes).graph.encoded_initializer)
        except Exception:  # noqa: BLE001 - unparsable bytes are the reference's to refuse
            return name
        mine = next((value for value in values if value.name == name), None)
        key = None if mine is None else shared_key(mine)
        return next((value.name for value in values if key is not None and shared_key(value) == key), name)

    def decode(self, model_bytes, value_name, base_dir):
        return super().decode(model_bytes, self._first_alike(model_bytes, value_name), base_dir)

    def read_fields(self, model_bytes, value_name, base_dir):
        return super().read_fields(model_bytes, self._first_alike(model_bytes, value_name), base_dir)


class OutBufferCopied(Fault):
    fault_id = "fuzz.out-buffer-copied"
    clauses = ("ZC-ENTRY-POINTS",)

    def decode(self, model_bytes, value_name, base_dir, out=None):
        from conformance.adapters.reference import ReferenceAdapter

        if out is None or out.flags.c_contiguous or not out.flags.writeable:
            with self.injected():
                return ReferenceAdapter.decode(self, model_bytes, value_name, base_dir, out=out)
        decoded = super().decode(model_bytes, value_name, base_dir)
        if decoded.shape == out.shape and decoded.dtype == out.dtype:
            np.copyto(out, decoded)
            return out
        with self.injected():
            return ReferenceAdapter.decode(self, model_bytes, value_name, base_dir, out=out)


#: name -> (subject spec, what the fault needs to show)
PLANTED = {
    "first item only": ("fuzz.planted_faults:FirstBindingOnly", "a bad binding placed middle or last"),
    "dropped remainder": ("fuzz.planted_faults:DroppedRemainderTile", "a size with a partial last tile"),
    "stale cache": ("fuzz.planted_faults:StalePreparedModel", "a near-duplicate model in one script"),
    "odd layout copied": ("fuzz.planted_faults:OddLayoutCopied", "a misaligned or strided caller buffer"),
    "attribute x format": ("fuzz.planted_faults:SoftcapIgnoredForInt4Keys", "softcap over INT4 key blocks"),
}

#: the differential target's planted faults: name -> (subject spec, what the fault needs to show)
DIFFERENTIAL_PLANTED = {
    "first component only": ("fuzz.planted_faults:FirstComponentWidthOnly",
                             "a bad bit-packing component placed middle or last"),
    "dropped partial block": ("fuzz.planted_faults:DroppedPartialBlock",
                              "a blocked value of 16+ elements along the axis with a partial last block"),
    "shared decode": ("fuzz.planted_faults:SharedInitializerDecode", "a near-duplicate value in one model"),
    "out buffer copied": ("fuzz.planted_faults:OutBufferCopied", "a strided out= buffer"),
}

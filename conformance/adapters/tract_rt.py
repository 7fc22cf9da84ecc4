"""The tract adapter: affine values through DequantizeLinear and state lowered to caller-managed
feedback (conformance/adapters/lowering.py). tract loads models from files, so each model is written
to a temporary file first. Its Python binding copies a NumPy array into a new tract tensor
(``Tensor.from_numpy``); outputs are read as NumPy views over tract's own tensors (kept alive by the
session), and retained outputs are fed back as the tract tensors themselves. Buffer identity is the
tract tensor's data address. Outputs are matched to the ONNX graph's outputs by position: tract
renames an output that is an optimized-away Identity after its source.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

import numpy as np

from conformance.adapters import Rejected
from conformance.adapters.lowering import LoweredAdapter


class TractSession:
    def __init__(self, model_bytes: bytes):
        import onnx
        import tract

        self.tract = tract
        proto = onnx.ModelProto()
        proto.ParseFromString(model_bytes)
        self.input_names = [vi.name for vi in proto.graph.input
                            if vi.name not in {t.name for t in proto.graph.initializer}]
        self.output_names = [vi.name for vi in proto.graph.output]
        if _empty_dequantize_scale(proto.graph):
            raise Rejected(None, "a DequantizeLinear scale with no elements is not handed to tract: it reads the "
                           "scale's first element and panics, aborting the process (docs/peer-deviations.md, "
                           "T-EMPTY-SCALE)")
        handle, path = tempfile.mkstemp(suffix=".onnx")
        try:
            with os.fdopen(handle, "wb") as file:
                file.write(model_bytes)
            self.runnable = tract.onnx().load(path).into_model().into_runnable()
        finally:
            os.unlink(path)
        self.ids: dict[int, int | None] = {}
        self._keep: list = []

    def adopt(self, value: Any):
        """A caller array as a tract tensor (tract's binding copies it), or a tensor this session returned."""
        if isinstance(value, self.tract.Tensor):
            return value
        array = np.asarray(value)
        if array.dtype.kind in "OUS":
            raise Rejected(None, "tract's binding has no string tensors (docs/peer-deviations.md, T-STRINGS)")
        tensor = self.tract.Tensor.from_numpy(array)
        self._keep.append(tensor)
        return tensor

    def run_handles(self, feeds: dict) -> dict:
        missing = [name for name in self.input_names if name not in feeds]
        if missing:
            raise ValueError(f"tract needs every graph input; missing {missing}")
        outputs = self.runnable.run([feeds[name] for name in self.input_names])
        return dict(zip(self.output_names, outputs))

    def to_numpy(self, handle) -> np.ndarray:
        """A NumPy view over the tract tensor's memory; the view keeps the tensor alive."""
        dtype, shape, data = handle._parts()
        if not int(np.prod(shape, dtype=np.int64)):
            array = handle.to_numpy()
        else:
            array = np.asarray(_View(handle, np.dtype(dtype.ctype()), shape, data.value))
            if dtype == self.tract.DatumType.F16:
                array = array.view(np.float16)
        self.ids[id(array)] = _data_address(handle)
        self._keep.append(array)
        return array

    def buffer_id(self, value: Any) -> int | None:
        return self.ids.get(id(value))


def _empty_dequantize_scale(graph) -> bool:
    """Whether a DequantizeLinear node of ``graph`` takes a scale initializer with a zero dimension."""
    empty = {tensor.name for tensor in graph.initializer if 0 in list(tensor.dims)}
    return any(node.op_type == "DequantizeLinear" and len(node.input) > 1 and node.input[1] in empty
               for node in graph.node)


class _View:
    """Exposes a tract tensor's memory to NumPy; the array's base holds it, and so the tensor."""

    def __init__(self, tensor, dtype: np.dtype, shape: list[int], address: int):
        self.tensor = tensor
        self.__array_interface__ = {"shape": tuple(shape), "typestr": dtype.str, "data": (address, False),
                                    "version": 3}


def _data_address(tensor) -> int | None:
    _, shape, data = tensor._parts()
    return int(data.value) if data.value and int(np.prod(shape, dtype=np.int64)) else None


class TractAdapter(LoweredAdapter):
    name = "tract"

    def __init__(self) -> None:
        import tract

        self.version = tract.version()

    def stateless(self, model_bytes: bytes) -> TractSession:
        return TractSession(model_bytes)

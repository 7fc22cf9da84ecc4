"""The onnxruntime adapter: affine values through DequantizeLinear (codes as initializers of the
storage type) and state lowered to caller-managed feedback with OrtValues and IO binding. Buffer
identity is the OrtValue's data pointer."""

from __future__ import annotations

from typing import Any

import numpy as np

from conformance.adapters import Rejected
from conformance.adapters.lowering import LoweredAdapter

#: onnxruntime log severity (0 verbose, 1 info, 2 warning, 3 error, 4 fatal): a rejected run is a verdict
#: the suite reports itself, so onnxruntime's own error lines would only clutter its output.
FATAL_ONLY = 4


class OrtSession:
    def __init__(self, model_bytes: bytes):
        import onnxruntime as ort

        ort.set_default_logger_severity(FATAL_ONLY)
        options = ort.SessionOptions()
        options.log_severity_level = FATAL_ONLY
        self.ort = ort
        self.session = ort.InferenceSession(model_bytes, options, providers=["CPUExecutionProvider"])
        self.output_names = [o.name for o in self.session.get_outputs()]
        self.ids: dict[int, int] = {}
        self._keep: list = []

    def adopt(self, value: Any):
        """A caller array as an OrtValue over the same memory (CPU), or a retained OrtValue as is."""
        if isinstance(value, self.ort.OrtValue):
            return value
        array = np.asarray(value)
        if array.dtype.kind in "OUS":
            return array  # strings travel materialized, as ONNX strings always do (never retained state)
        if not array.flags.c_contiguous:
            raise Rejected("STATE_UNRETAINABLE", "onnxruntime binds only contiguous buffers; holding this one "
                           "would need a copy")
        handle = self.ort.OrtValue.ortvalue_from_numpy(array)
        self._keep.append(array)
        return handle

    def run_handles(self, feeds: dict) -> dict:
        if any(not isinstance(handle, self.ort.OrtValue) for handle in feeds.values()):
            # IO binding takes no string tensors: run with plain arrays; outputs are new arrays.
            plain = {name: handle if isinstance(handle, np.ndarray) else handle.numpy()
                     for name, handle in feeds.items()}
            return dict(zip(self.output_names, self.session.run(self.output_names, plain)))
        binding = self.session.io_binding()
        for name, handle in feeds.items():
            binding.bind_ortvalue_input(name, handle)
        for name in self.output_names:
            binding.bind_output(name, "cpu")
        self.session.run_with_iobinding(binding)
        return dict(zip(self.output_names, binding.get_outputs()))

    def to_numpy(self, handle) -> np.ndarray:
        if isinstance(handle, np.ndarray):
            self._keep.append(handle)
            return handle
        array = handle.numpy()
        self.ids[id(array)] = handle.data_ptr()
        self._keep.append(array)
        return array

    def buffer_id(self, value: Any) -> int | None:
        found = self.ids.get(id(value))
        if found is None and isinstance(value, np.ndarray) and value.size:
            return int(value.__array_interface__["data"][0])
        return found


class OnnxRuntimeAdapter(LoweredAdapter):
    name = "onnxruntime"

    def __init__(self) -> None:
        import onnxruntime

        self.version = onnxruntime.__version__

    def stateless(self, model_bytes: bytes) -> OrtSession:
        return OrtSession(model_bytes)

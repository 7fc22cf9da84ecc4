"""The OpenVINO adapter: affine values through DequantizeLinear and state lowered to caller-managed
feedback (conformance/adapters/lowering.py). Inputs are ``ov.Tensor`` objects sharing the caller's
memory; every call gets a fresh infer request, so an earlier call's output tensors are never
overwritten and can be fed back as they are. Buffer identity is the tensor's data address (every
tensor handed out is kept alive, so addresses are never reused while the session lives).

Precision is pinned: OpenVINO's CPU plugin computes in bfloat16 or float16 by default on CPUs that
have them (``INFERENCE_PRECISION_HINT``), which would change decoded values; the adapter compiles
every model with ``INFERENCE_PRECISION_HINT = f32`` so results are the model's own precision.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from conformance.adapters.lowering import LoweredAdapter

#: Compile options: f32 inference precision instead of the CPU's reduced-precision default.
COMPILE_CONFIG = {"INFERENCE_PRECISION_HINT": "f32"}


class OpenVinoSession:
    def __init__(self, model_bytes: bytes, core: Any):
        import openvino as ov

        self.ov = ov
        model = core.read_model(model_bytes, b"")
        self.compiled = core.compile_model(model, "CPU", COMPILE_CONFIG)
        self.output_names = [output.get_any_name() for output in self.compiled.outputs]
        self.ids: dict[int, int] = {}
        self._keep: list = []

    def adopt(self, value: Any):
        """A caller array as an ``ov.Tensor`` over the same memory, or a tensor this session returned."""
        if isinstance(value, self.ov.Tensor):
            return value
        array = np.asarray(value)
        tensor = self.ov.Tensor(array, shared_memory=True)
        self._keep.append((array, tensor))
        return tensor

    def run_handles(self, feeds: dict) -> dict:
        request = self.compiled.create_infer_request()
        for name, tensor in feeds.items():
            request.set_tensor(name, tensor)
        request.infer()
        outputs = {name: request.get_tensor(name) for name in self.output_names}
        self._keep.append(request)
        return outputs

    def to_numpy(self, handle) -> np.ndarray:
        array = handle.data
        self.ids[id(array)] = _address(array)
        self._keep.append((array, handle))
        return array

    def buffer_id(self, value: Any) -> int | None:
        return self.ids.get(id(value))


def _address(array: np.ndarray) -> int | None:
    return int(array.__array_interface__["data"][0]) if array.size else None


class OpenVinoAdapter(LoweredAdapter):
    name = "openvino"

    def __init__(self) -> None:
        import openvino as ov

        self.version = ov.__version__.split("-")[0]
        self.core = ov.Core()

    def stateless(self, model_bytes: bytes) -> OpenVinoSession:
        return OpenVinoSession(model_bytes, self.core)

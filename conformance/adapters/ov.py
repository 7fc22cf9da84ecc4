"""The OpenVINO adapter: affine values through DequantizeLinear and state lowered to caller-managed
feedback (conformance/adapters/lowering.py). Inputs are ``ov.Tensor`` objects sharing the caller's
memory; every call gets a fresh infer request, so an earlier call's output tensors are never
overwritten and can be fed back as they are. An array over a tensor OpenVINO handed out (in any state
of this adapter, so a state can start from another's output) is fed as that tensor: ``ov.Tensor`` does
not share read-only memory, and the suite hands views out read-only. Buffer identity is the tensor's
data address (every tensor handed out is kept alive, so addresses are never reused). NumPy has no
bfloat16, and the binding labels bf16 memory float16: bf16 tensors are read and fed as ``ml_dtypes``
bfloat16 views of the same bits. String tensors are not handed over: OpenVINO takes them, but freeing a
request that ran Identity over one aborts the process (docs/peer-deviations.md, OV-STRING).
A call reaches OpenVINO with every input set (the lowering refuses a call missing a required feed):
``infer()`` would otherwise run over the unset input's memory as allocated (OV-UNSET-INPUT).

Precision is pinned: OpenVINO's CPU plugin computes in bfloat16 or float16 by default on CPUs that
have them (``INFERENCE_PRECISION_HINT``), which would change decoded values; the adapter compiles
every model with ``INFERENCE_PRECISION_HINT = f32`` so results are the model's own precision.
"""

from __future__ import annotations

import weakref
from typing import Any

import ml_dtypes
import numpy as np

from conformance.adapters import Rejected
from conformance.adapters.lowering import LoweredAdapter

#: Compile options: f32 inference precision instead of the CPU's reduced-precision default.
COMPILE_CONFIG = {"INFERENCE_PRECISION_HINT": "f32"}
BFLOAT16 = np.dtype(ml_dtypes.bfloat16)


class OpenVinoSession:
    def __init__(self, model_bytes: bytes, core: Any, handed_out: dict):
        import openvino as ov

        self.ov = ov
        # (address, shape, dtype) -> (the ov.Tensor behind it, a weak reference to the array handed out),
        # adapter-wide. An entry counts only while that array is alive: once it is gone (its session and
        # the caller let go), the address may belong to a new caller array.
        self.handed_out = handed_out
        model = core.read_model(model_bytes, b"")
        self.compiled = core.compile_model(model, "CPU", COMPILE_CONFIG)
        self.output_ports = output_ports(model_bytes, self.compiled.outputs)
        self.ids: dict[int, int | None] = {}
        self._keep: list = []

    def adopt(self, value: Any):
        """A caller array as an ``ov.Tensor`` over the same memory, or a tensor this session returned."""
        if isinstance(value, self.ov.Tensor):
            return value
        array = np.asarray(value)
        known = self.handed_out.get(_key(array))
        if known is not None and known[1]() is not None:
            return known[0]
        if array.dtype.kind in "OUS":
            raise Rejected(None, "string tensors are not handed to OpenVINO: freeing a request that ran Identity "
                           "over one aborts the process (docs/peer-deviations.md, OV-STRING)")
        if not array.flags.writeable:
            raise Rejected("STATE_UNRETAINABLE", "OpenVINO shares only writable memory; holding this buffer "
                           "would need a copy (docs/peer-deviations.md, OV-READ-ONLY)")
        if not array.flags.c_contiguous:
            raise Rejected("STATE_UNRETAINABLE", "OpenVINO shares only contiguous buffers; holding this one "
                           "would need a copy")
        if array.dtype == BFLOAT16:  # NumPy has no bfloat16: share the bits, typed as OpenVINO's bf16
            tensor = self.ov.Tensor(array.view(np.uint16), list(array.shape), self.ov.Type.bf16)
        else:
            tensor = self.ov.Tensor(array, shared_memory=True)
        self._keep.append((array, tensor))
        return tensor

    def run_handles(self, feeds: dict) -> dict:
        request = self.compiled.create_infer_request()
        for name, tensor in feeds.items():
            request.set_tensor(name, tensor)
        request.infer(share_outputs=True)  # the default returns NumPy copies of every output, unused here
        outputs = {name: request.get_output_tensor(index) for name, index in self.output_ports.items()}
        self._keep.append(request)
        return outputs

    def to_numpy(self, handle) -> np.ndarray:
        array = handle.data
        if handle.get_element_type() == self.ov.Type.bf16:
            array = array.view(BFLOAT16)  # the binding labels bf16 memory float16; the bits are bfloat16
        self.ids[id(array)] = _address(array)
        self._keep.append((array, handle))
        if array.size:
            self.handed_out[_key(array)] = (handle, weakref.ref(array))
        return array

    def buffer_id(self, value: Any) -> int | None:
        return self.ids.get(id(value))


def output_ports(model_bytes: bytes, ports: list) -> dict[str, int]:
    """Each ONNX graph output's name -> the index of the compiled model's output port for it. A port has
    several names when OpenVINO folds a node away (a DequantizeLinear of FLOAT codes answers to its input
    ``x`` and its output ``y``), so ``get_any_name()`` may give either: a port is found by the graph output's
    own name among its names, else by the graph output's position."""
    import onnx

    proto = onnx.ModelProto()
    proto.ParseFromString(model_bytes)
    names = [output.name for output in proto.graph.output]
    if len(names) != len(ports):
        raise Rejected(None, f"OpenVINO compiled {len(ports)} outputs for the model's {len(names)}")
    found = {}
    for position, name in enumerate(names):
        found[name] = next((index for index, port in enumerate(ports) if name in port.get_names()), position)
    return found


def _key(array: np.ndarray) -> tuple:
    return (_address(array), array.shape, array.dtype.str)


def _address(array: np.ndarray) -> int | None:
    return int(array.__array_interface__["data"][0]) if array.size else None


class OpenVinoAdapter(LoweredAdapter):
    name = "openvino"

    def __init__(self) -> None:
        import openvino as ov

        self.version = ov.__version__.split("-")[0]
        self.core = ov.Core()
        self.handed_out: dict = {}

    def stateless(self, model_bytes: bytes) -> OpenVinoSession:
        return OpenVinoSession(model_bytes, self.core, self.handed_out)

"""The ``onnx`` package's reference evaluator behind the same lowering: DequantizeLinear for affine
values and caller-managed feedback for state. Buffer identity is the NumPy data address."""

from __future__ import annotations

from typing import Any

import numpy as np

from conformance.adapters.lowering import LoweredAdapter
from conformance.values import default_buffer_id


class EvaluatorSession:
    def __init__(self, model_bytes: bytes):
        import onnx
        from onnx.reference import ReferenceEvaluator

        model = onnx.ModelProto()
        model.ParseFromString(model_bytes)
        self.evaluator = ReferenceEvaluator(model)
        self.output_names = list(self.evaluator.output_names)

    def adopt(self, value: Any) -> np.ndarray:
        return np.asarray(value)

    def run_handles(self, feeds: dict) -> dict:
        return dict(zip(self.output_names, self.evaluator.run(None, feeds)))

    def to_numpy(self, handle) -> np.ndarray:
        return handle

    def buffer_id(self, value: Any) -> int | None:
        return default_buffer_id(value)


class OnnxReferenceAdapter(LoweredAdapter):
    name = "onnx-reference"

    def __init__(self) -> None:
        import onnx

        self.version = onnx.__version__

    def stateless(self, model_bytes: bytes) -> EvaluatorSession:
        return EvaluatorSession(model_bytes)

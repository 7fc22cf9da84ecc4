"""A case's model as standard ONNX, for onnx's checker, its reference evaluator and onnxruntime: the
persistent bindings (the suite's one extension field in an otherwise standard model) are cleared and the
bytes are read into onnx's own ModelProto."""

from __future__ import annotations

import onnx

from reference_impl import schema


def plain_onnx(case) -> onnx.ModelProto:
    model = schema.parse_model(case.model_bytes())
    model.graph.ClearField("persistent_bindings")
    plain = onnx.ModelProto()
    plain.ParseFromString(model.SerializeToString())
    return plain

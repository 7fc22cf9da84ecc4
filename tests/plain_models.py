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


def assert_refusable_trace_matches_onnx_reference(case, atol: float = 1e-6) -> None:
    """For a state case built with ``refusal_allowed`` (an open, then a first run whose later runs are
    ``if_accepted``): onnx's reference evaluator, given the past back by hand, gives every expected output."""
    import numpy as np
    from onnx.reference import ReferenceEvaluator

    from conformance import values as V

    plain = plain_onnx(case)
    names = [o.name for o in plain.graph.output]
    evaluator = ReferenceEvaluator(plain)
    opened, first = case.extras()["steps"]
    past = {name: V.build(value) for name, value in opened["initial"].items()}
    for step in [first, *first["if_accepted"]]:
        got = dict(zip(names, evaluator.run(None, {**{n: V.build(v) for n, v in step["feeds"].items()}, **past}),
                       strict=True))
        for name, want in step["outputs"].items():
            np.testing.assert_allclose(got[name], V.build(want), rtol=atol, atol=atol)
        past = {"past_key": got["present_key"], "past_value": got["present_value"]}

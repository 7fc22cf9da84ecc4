"""What a standard ONNX runtime can do with the contract: affine values through DequantizeLinear and
state by lowering bindings to a stateless model with caller-managed feedback (the spec's explicit
lowering). Structured values, catalogues and verification are not supported by such runtimes.

The feedback loop here is the caller's side of that lowering: it checks what a careful caller can
check (initial values, feed overrides) and maps those to the suite's codes; everything else is the
runtime's own behaviour, whose errors carry no code.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from conformance.adapters import NotSupported, Rejected
from conformance.values import Encoded


class LoweredAdapter:
    """Base for stateless runtimes; subclasses supply ``stateless(model_bytes)`` -> Session."""

    name = "lowered"
    version = ""

    def profiles(self) -> set[str]:
        return {"affine", "state", "zero-copy", "kv-contiguous", "decode-e2e"}

    def stateless(self, model_bytes: bytes):
        raise NotImplementedError

    def classify(self, exc: BaseException):
        if isinstance(exc, (Rejected, NotSupported)):
            return exc
        return Rejected(None, f"{type(exc).__name__}: {exc}")

    # ---------------------------------------------------------------------------------- affine
    def verify(self, model_bytes: bytes, base_dir: str | None) -> None:
        raise NotSupported("a standard ONNX runtime has no verifier for the extended representation")

    def decode(self, model_bytes: bytes, value_name: str, base_dir: str | None) -> np.ndarray:
        from reference_impl import schema

        model = schema.parse_model(model_bytes)
        for value in model.graph.encoded_initializer:
            if value.name == value_name:
                if value.WhichOneof("layout") != "affine":
                    raise NotSupported("structured layouts have no standard ONNX form")
                if value.data_location == 1:
                    raise NotSupported("external affine payloads are not lowered")
                session = self.stateless(dequantize_model(value))
                return session.run({})["y"]
        raise Rejected(None, f"no encoded value named {value_name!r}")

    # ----------------------------------------------------------------------------------- state
    def open_state(self, model_bytes: bytes, initial: dict, base_dir: str | None = None):
        from reference_impl import schema

        model = schema.parse_model(model_bytes)
        if len(model.struct_types) or len(model.graph.encoded_initializer):
            raise NotSupported("structured and encoded values have no standard ONNX form")
        if any(_is_struct(vi) for vi in list(model.graph.input) + list(model.graph.output)):
            raise NotSupported("struct-typed graph inputs and outputs have no standard ONNX form")
        bindings = [(b.input_name, b.output_name) for b in model.graph.persistent_bindings]
        model.graph.ClearField("persistent_bindings")
        session = self.stateless(schema.to_onnx(model).SerializeToString())
        return LoweredState(session, bindings, initial)


def _is_struct(vi) -> bool:
    return vi.HasField("type") and vi.type.WhichOneof("value") == "struct_type"


def dequantize_model(value) -> bytes:
    """A one-node DequantizeLinear model with the codes as an initializer of the storage type."""
    from onnx import helper

    from reference_impl import schema

    layout = value.affine
    dims = [d.dim_value for d in value.logical_type.tensor_type.shape.dim]
    codes = helper.make_tensor("x", layout.storage_type, dims, vals=value.raw_data, raw=True)
    initializers = [codes, schema.to_onnx(_named(layout.scale, "s"))]
    inputs = ["x", "s"]
    if layout.HasField("zero_point"):
        initializers.append(schema.to_onnx(_named(layout.zero_point, "z")))
        inputs.append("z")
    attrs = {}
    if layout.HasField("axis"):
        attrs["axis"] = layout.axis
    if layout.HasField("block_size"):
        attrs["block_size"] = layout.block_size
    if value.logical_type.tensor_type.elem_type != layout.scale.data_type:
        attrs["output_dtype"] = value.logical_type.tensor_type.elem_type  # DequantizeLinear-23 onwards
    node = helper.make_node("DequantizeLinear", inputs, ["y"], **attrs)
    output = helper.make_tensor_value_info("y", value.logical_type.tensor_type.elem_type, dims)
    graph = helper.make_graph([node], "dq", [], [output], initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 25)], ir_version=11).SerializeToString()


def _named(tensor, name: str):
    copy = type(tensor)()
    copy.CopyFrom(tensor)
    copy.name = name
    return copy


class LoweredState:
    """Caller-managed feedback over a stateless session: retained values are the session's own
    output buffers, fed back without copies where the runtime allows it."""

    def __init__(self, session, bindings: list[tuple[str, str]], initial: dict):
        self.session = session
        self.bindings = bindings
        self.bound = {i for i, _ in bindings}
        self.closed = False
        self.retained = self._initial(initial)

    def _initial(self, initial: dict) -> dict:
        for name in initial:
            if name not in self.bound:
                raise Rejected("STATE_INITIAL_UNKNOWN", f"{name!r} is not a bound input")
        missing = self.bound - set(initial)
        if missing:
            raise Rejected("STATE_INITIAL_MISSING", f"no initial value for {sorted(missing)}")
        for value in initial.values():
            if isinstance(value, (dict, list, Encoded)):
                raise NotSupported("only tensors can be carried by a lowered state")
        return {name: self.session.adopt(value) for name, value in initial.items()}

    def _open(self) -> None:
        if self.closed:
            raise Rejected("STATE_CLOSED", "the state is closed")

    def run(self, feeds: dict) -> dict:
        self._open()
        for name in feeds:
            if name in self.bound:
                raise Rejected("STATE_FEED_OVERRIDES", f"{name!r} is supplied by the retained state")
        for value in feeds.values():
            if isinstance(value, (dict, list, Encoded)):
                raise NotSupported("only tensors can be fed to a lowered model")
        merged = {name: self.session.adopt(value) for name, value in feeds.items()}
        merged.update(self.retained)
        outputs = self.session.run_handles(merged)
        self.retained = {input_name: outputs[output_name] for input_name, output_name in self.bindings}
        return {name: self.session.to_numpy(handle) for name, handle in outputs.items()}

    def values(self) -> dict:
        self._open()
        return {name: self.session.to_numpy(handle) for name, handle in self.retained.items()}

    def reset(self, initial: dict) -> None:
        self._open()
        self.retained = self._initial(initial)

    def close(self) -> None:
        self.closed = True
        self.retained = {}

    def buffer_id(self, value: Any) -> int | None:
        return self.session.buffer_id(value)

"""What a standard ONNX runtime can do with the contract: affine values through DequantizeLinear and
state by lowering bindings to a stateless model with caller-managed feedback (the spec's explicit
lowering). An inline affine initializer read through an explicit ``Decode`` is lowered to DequantizeLinear
too; structured values, catalogues and verification are not supported by such runtimes.

The feedback loop here is the caller's side of that lowering, and it enforces every rule a caller can
enforce: initial values and feeds checked against the model's declared inputs (at open, reset and every
run), outputs checked against the inputs they will feed before they are retained, a failed call leaving
the state as it was (STATE_RUN_FAILED), no concurrent calls on one state, retained and returned views
handed out read-only, an ownerless borrow never becoming retained state or an output (OWNERLESS_BORROW),
and a fresh feed the runtime cannot share copied for its call only, never retained (STATE_UNRETAINABLE).
What is left for a case to find is the runtime's own behaviour (copies, strides, kernels, types), whose
errors carry no code. A runtime joins by implementing ``LoweredSession`` (see docs/adapters.md).
"""

from __future__ import annotations

import threading
from typing import Any, Protocol

import numpy as np

from conformance.adapters import NotSupported, Rejected, required
from conformance.values import Encoded, is_ownerless

#: Floating scale types the spec allows that ONNX's DequantizeLinear does not admit (its T2 is FLOAT,
#: FLOAT16, BFLOAT16): DOUBLE is lowered to Cast/Sub/Mul in double instead of an invalid model. Any
#: other scale type goes to DequantizeLinear as it is, for the runtime to accept or reject.
LOWERED_SCALE_TYPES = {11}  # DOUBLE
#: The opset of lowered DequantizeLinear models: INT2 and UINT2 codes need opset 25; output_dtype needs 23.
OPSET = 25
DEQUANTIZE_OUTPUT_OPSET = 23
INT2_TYPES = {25, 26}  # UINT2, INT2
#: The domain of onnx-light's explicit decoder node, ``Decode(encoded) -> logical tensor``.
DECODE_DOMAIN = "onnx_light"


class ModelRefused(Exception):
    """Raised by a ``LoweredSession`` whose runtime loads models lazily when, at a call, it cannot load or
    compile the model at all (an operator or type it lacks). It is not a failed call: the base reports the
    case as not supported, naming why, and never as ``STATE_RUN_FAILED``, which a case may expect."""


class LoweredSession(Protocol):
    """One stateless model loaded in the runtime. Handles are the runtime's own value objects."""

    @required
    def adopt(self, value: Any) -> Any:
        """A caller array as an input handle sharing its memory (raise ``Rejected("STATE_UNRETAINABLE")``
        when the runtime cannot hold it without a copy), or a handle this session returned, unchanged."""

    @required
    def run_handles(self, feeds: dict[str, Any]) -> dict[str, Any]:
        """One call: input name -> handle in, every output name -> handle out. A runtime that loads the
        model only now raises ``ModelRefused`` when it cannot load it at all."""

    @required
    def to_numpy(self, handle: Any) -> np.ndarray:
        """A NumPy array over the handle's memory where the runtime allows it (else a copy); the array
        must keep the memory alive."""

    @required
    def buffer_id(self, value: Any) -> int | None:
        """The runtime buffer behind an array this session returned, else None."""


class LoweredAdapter:
    """Base for stateless runtimes; subclasses supply ``stateless(model_bytes) -> LoweredSession``."""

    name = "lowered"
    version = ""

    def profiles(self) -> set[str]:
        return {"affine", "state", "zero-copy", "kv-contiguous", "decode-e2e", "measured"}

    def stateless(self, model_bytes: bytes) -> LoweredSession:
        raise NotImplementedError

    def classify(self, exc: BaseException):
        if isinstance(exc, (Rejected, NotSupported)):
            return exc
        if isinstance(exc, ModelRefused):
            return NotSupported(f"the runtime cannot load the model: {exc}")
        return Rejected(None, f"{type(exc).__name__}: {exc}")

    # ---------------------------------------------------------------------------------- affine
    def verify(self, model_bytes: bytes, base_dir: str | None) -> None:
        """What a standard runtime can check: every encoded value is lowered and loaded and run by the
        runtime, whose own checks are the verdict (rejections carry no code)."""
        from reference_impl import schema

        model = schema.parse_model(model_bytes)
        if len(model.struct_types):
            raise NotSupported("struct declarations have no standard ONNX form")
        for value in model.graph.encoded_initializer:
            self._decode_value(value)

    def decode(self, model_bytes: bytes, value_name: str, base_dir: str | None) -> np.ndarray:
        from reference_impl import schema

        model = schema.parse_model(model_bytes)
        for value in model.graph.encoded_initializer:
            if value.name == value_name:
                return self._decode_value(value)
        raise Rejected(None, f"no encoded value named {value_name!r}")

    def _decode_value(self, value) -> np.ndarray:
        layout = value.WhichOneof("layout")
        if layout == "struct_type":
            raise NotSupported("structured layouts have no standard ONNX form")
        if layout is None:
            raise Rejected(None, f"{value.name!r} selects no layout: nothing to lower")
        if value.data_location == 1:
            raise NotSupported("external affine payloads are not lowered")
        session = self.stateless(dequantize_model(value))
        return session.to_numpy(session.run_handles({})["y"])

    # ----------------------------------------------------------------------------------- state
    def open_state(self, model_bytes: bytes, initial: dict, base_dir: str | None = None):
        from reference_impl import schema

        model = schema.parse_model(model_bytes)
        # A missing type inside a claimed profile is a failure, not "not supported" (docs/adapters.md).
        if len(model.struct_types):
            raise Rejected(None, "structured and encoded values have no standard ONNX form")
        lower_affine_initializers(model)
        if any(_is_struct(vi) for vi in list(model.graph.input) + list(model.graph.output)):
            raise Rejected(None, "struct-typed graph inputs and outputs have no standard ONNX form")
        bindings = [(b.input_name, b.output_name) for b in model.graph.persistent_bindings]
        model.graph.ClearField("persistent_bindings")
        declared = declared_inputs(model)
        defaults = take_input_defaults(model)
        session = self.stateless(schema.to_onnx(model).SerializeToString())
        return LoweredState(session, bindings, initial, declared, defaults)


def lower_affine_initializers(model) -> None:
    """Lower every encoded initializer of a state model in place, or reject the model: an inline affine
    value read only by explicit ``onnx_light`` ``Decode`` nodes of the root graph becomes its codes, scale
    and zero point as standard initializers and each of those nodes the DequantizeLinear of them (the
    affine branch follows DequantizeLinear). Structured layouts have no standard form; a tensor operator
    reading encoded bytes directly is an error the lowering reports; external payloads are not lowered,
    since the lowered model reaches the runtime as bytes, with no directory to resolve external data in."""
    from reference_impl import schema

    graph = model.graph
    encoded = {value.name: value for value in graph.encoded_initializer}
    if not encoded:
        return
    for value in encoded.values():
        if value.WhichOneof("layout") != "affine":
            raise Rejected(None, "structured and encoded values have no standard ONNX form")
        if value.data_location == 1:
            raise Rejected(None, f"{value.name!r}: external payloads are not lowered (the lowered model reaches "
                           "the runtime as bytes)")
    decodes = {index for index, node in enumerate(graph.node)
               if _is_decode(node) and len(node.input) == 1 and node.input[0] in encoded}
    readers = [node for index, node in enumerate(graph.node) if index not in decodes]
    readers += [inner for node in graph.node for inner in _subgraph_nodes(node)]
    other_readers = {name for node in readers for name in node.input if name in encoded}
    named_io = {vi.name for vi in list(graph.input) + list(graph.output)} & set(encoded)
    if other_readers or named_io:
        raise Rejected(None, f"encoded values {sorted(other_readers | named_io)} are read as tensors without an "
                       "explicit Decode: a standard operator cannot take encoded bytes")
    lowered_nodes = []
    for index, node in enumerate(graph.node):
        if index not in decodes:
            lowered_nodes.append(node)
            continue
        nodes, initializers = dequantize_nodes(encoded[node.input[0]], f"{node.input[0]}/{node.output[0]}/",
                                               node.output[0])
        lowered_nodes += [schema.from_onnx(lowered) for lowered in nodes]
        graph.initializer.extend(schema.from_onnx(tensor) for tensor in initializers)
    kept = [type(node)() for node in lowered_nodes]
    for copy, node in zip(kept, lowered_nodes):
        copy.CopyFrom(node)
    graph.ClearField("node")
    graph.node.extend(kept)
    graph.ClearField("encoded_initializer")
    # DequantizeLinear needs opset 23 (output_dtype) or 25 (INT2/UINT2 codes) in the default domain.
    needed = OPSET if any(v.affine.storage_type in INT2_TYPES for v in encoded.values()) else DEQUANTIZE_OUTPUT_OPSET
    opsets = {entry.domain: entry for entry in model.opset_import}
    if "" in opsets and opsets[""].version < needed:
        opsets[""].version = needed
    still_used = any(_is_decode(node) or any(_is_decode(inner) for inner in _subgraph_nodes(node))
                     for node in graph.node)
    if DECODE_DOMAIN in opsets and not still_used:
        model.opset_import.remove(opsets[DECODE_DOMAIN])


def _is_decode(node) -> bool:
    return node.domain == DECODE_DOMAIN and node.op_type == "Decode"


def _subgraph_nodes(node):
    """Every node of ``node``'s subgraphs (If branches, loop bodies), depth first."""
    for attribute in node.attribute:
        for subgraph in ([attribute.g] if attribute.HasField("g") else []) + list(attribute.graphs):
            for inner in subgraph.node:
                yield inner
                yield from _subgraph_nodes(inner)


def _is_struct(vi) -> bool:
    return vi.HasField("type") and vi.type.WhichOneof("value") == "struct_type"


def take_input_defaults(model) -> dict[str, np.ndarray]:
    """Remove every root-graph initializer that names a graph input and return its value: the input's
    default, which the feedback loop feeds when a call omits the input. ONNX lets a runtime either take a
    feed for such an input or treat the initializer as a constant (OpenVINO folds it away and refuses the
    feed, tract loads it as a constant), so the lowered model states no default and every runtime sees a
    plain input."""
    from onnx import numpy_helper

    from reference_impl import schema

    inputs = {vi.name for vi in model.graph.input}
    defaults = {t.name: np.array(numpy_helper.to_array(schema.to_onnx(t)), order="C", copy=True)
                for t in model.graph.initializer if t.name in inputs}
    kept = [t for t in model.graph.initializer if t.name not in defaults]
    if defaults:
        copies = [type(t)() for t in kept]
        for copy, tensor in zip(copies, kept):
            copy.CopyFrom(tensor)
        model.graph.ClearField("initializer")
        model.graph.initializer.extend(copies)
    return defaults


# -------------------------------------------------------------------------------- declared types
class Declared:
    """A graph input's declared tensor type: NumPy dtype and dims (None where a dim is symbolic)."""

    def __init__(self, dtype: np.dtype | None, dims: tuple[int | None, ...] | None, required: bool):
        self.dtype, self.dims, self.required = dtype, dims, required

    def mismatch(self, value: Any) -> str | None:
        """Why ``value`` cannot be this input, or None."""
        if isinstance(value, (dict, list, Encoded)) or value is None or not hasattr(value, "dtype"):
            return f"a {type(value).__name__} is not a tensor"
        if self.dtype is not None and np.dtype(value.dtype) != self.dtype:
            return f"element type {value.dtype}, declared {self.dtype}"
        if self.dims is not None:
            shape = tuple(np.shape(value))
            if len(shape) != len(self.dims):
                return f"rank {len(shape)}, declared {len(self.dims)}"
            if any(want is not None and want != have for want, have in zip(self.dims, shape)):
                return f"shape {list(shape)}, declared {[d if d is not None else '?' for d in self.dims]}"
        return None


def declared_inputs(model) -> dict[str, Declared]:
    """Every graph input's declared tensor type (inputs with an initializer of the same name are optional)."""
    from onnx import helper

    initialized = {t.name for t in model.graph.initializer}
    found = {}
    for vi in model.graph.input:
        tensor = vi.type.tensor_type if vi.type.WhichOneof("value") == "tensor_type" else None
        dtype = dims = None
        if tensor is not None and tensor.elem_type:
            try:
                dtype = np.dtype(helper.tensor_dtype_to_np_dtype(tensor.elem_type))
            except (KeyError, TypeError, ValueError):
                dtype = None
        if tensor is not None and tensor.HasField("shape"):
            dims = tuple(d.dim_value if d.HasField("dim_value") else None for d in tensor.shape.dim)
        found[vi.name] = Declared(dtype, dims, vi.name not in initialized)
    return found


# --------------------------------------------------------------------------------- DequantizeLinear
def dequantize_model(value) -> bytes:
    """A model with one output ``y``: the affine value decoded by DequantizeLinear, the codes as an
    initializer of the storage type. A scale type DequantizeLinear does not admit (DOUBLE) is decoded
    exactly the same way in that type: (Cast(x) - Cast(zero_point)) * scale, one rounding per element."""
    from onnx import helper

    nodes, initializers = dequantize_nodes(value, "", "y")
    output = helper.make_tensor_value_info("y", value.logical_type.tensor_type.elem_type, _concrete_dims(value))
    graph = helper.make_graph(nodes, "dq", [], [output], initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=11).SerializeToString()


def dequantize_nodes(value, prefix: str, output: str) -> tuple[list, list]:
    """The nodes and initializers decoding the inline affine value into ``output``: codes ``{prefix}x``,
    scale ``{prefix}s`` and zero point ``{prefix}z`` as initializers, every other name also prefixed."""
    from onnx import helper

    from reference_impl import schema

    layout = value.affine
    dims = _concrete_dims(value)
    codes = _codes(prefix + "x", layout.storage_type, dims, value.raw_data)
    scale = schema.to_onnx(_named(layout.scale, prefix + "s"))
    zero_point = schema.to_onnx(_named(layout.zero_point, prefix + "z")) if layout.HasField("zero_point") else None
    elem = value.logical_type.tensor_type.elem_type
    if layout.scale.data_type in LOWERED_SCALE_TYPES:
        return _arithmetic_dequantize(layout, codes, scale, zero_point, dims, prefix, output)
    initializers = [codes, scale] + ([zero_point] if zero_point is not None else [])
    attrs = {}
    if layout.HasField("axis"):
        attrs["axis"] = layout.axis
    if layout.HasField("block_size"):
        attrs["block_size"] = layout.block_size
    if elem != layout.scale.data_type:
        attrs["output_dtype"] = elem  # DequantizeLinear-23 onwards
    return [helper.make_node("DequantizeLinear", [t.name for t in initializers], [output], **attrs)], initializers


def _codes(name: str, storage_type: int, dims: list[int], raw: bytes):
    """The codes initializer. A storage type ONNX gives no element type (UNDEFINED, or a number ONNX does
    not define) is passed on as it is, like every other storage type, for the runtime to accept or reject:
    ``helper.make_tensor`` cannot build it (a KeyError), and that failure is no check by the runtime."""
    from onnx import TensorProto, helper

    try:
        helper.tensor_dtype_to_np_dtype(storage_type)
    except KeyError:
        return TensorProto(name=name, data_type=storage_type, dims=dims, raw_data=raw)
    return helper.make_tensor(name, storage_type, dims, vals=raw, raw=True)


def _concrete_dims(value) -> list[int]:
    """The logical tensor's dims; a value without a concrete tensor type cannot be lowered."""
    logical = value.logical_type
    if not value.HasField("logical_type") or logical.WhichOneof("value") != "tensor_type" \
            or not logical.tensor_type.HasField("shape") \
            or not all(d.HasField("dim_value") for d in logical.tensor_type.shape.dim):
        raise Rejected(None, f"{value.name!r}: no concrete logical tensor type to lower to")
    return [d.dim_value for d in logical.tensor_type.shape.dim]


def _arithmetic_dequantize(layout, codes, scale, zero_point, dims: list[int], prefix: str, output: str):
    """(Cast(x) - Cast(z)) * s in the scale's type, with per-axis and blocked parameters laid out to
    broadcast against x (a constant reshape or repeat of the parameter tensors, no arithmetic)."""
    from onnx import helper, numpy_helper

    target = layout.scale.data_type
    params = [numpy_helper.to_array(scale)] + ([numpy_helper.to_array(zero_point)] if zero_point is not None else [])
    if layout.HasField("axis") and len(dims):
        axis = layout.axis + len(dims) if layout.axis < 0 else layout.axis
        if layout.HasField("block_size") and layout.block_size:
            params = [np.repeat(p, int(layout.block_size), axis=axis).take(range(dims[axis]), axis=axis)
                      for p in params]
        else:
            shape = [1] * len(dims)
            shape[axis] = dims[axis]
            params = [p.reshape(shape) for p in params]
    x, s, z, xf, zf, centred = (prefix + name for name in ("x", "s", "z", "xf", "zf", "centred"))
    initializers = [codes, numpy_helper.from_array(params[0], s)]
    nodes = [helper.make_node("Cast", [x], [xf], to=target)]
    if zero_point is None:
        centred = xf
    else:
        initializers.append(numpy_helper.from_array(params[1], z))
        nodes += [helper.make_node("Cast", [z], [zf], to=target), helper.make_node("Sub", [xf, zf], [centred])]
    nodes.append(helper.make_node("Mul", [centred, s], [output]))
    return nodes, initializers


def _named(tensor, name: str):
    copy = type(tensor)()
    copy.CopyFrom(tensor)
    copy.name = name
    return copy


# ----------------------------------------------------------------------------- caller feedback
class LoweredState:
    """Caller-managed feedback over a stateless session: retained values are the session's own
    output handles, fed back as they are (zero-copy wherever the runtime allows it)."""

    def __init__(self, session: LoweredSession, bindings: list[tuple[str, str]], initial: dict,
                 declared: dict[str, Declared] | None = None, defaults: dict[str, np.ndarray] | None = None):
        self.session = session
        self.bindings = bindings
        self.bound = {i for i, _ in bindings}
        self.declared = declared or {}
        # A fresh input's default (its initializer), fed when a call omits the input; a bound input's
        # initializer is no initial value (the state always feeds it).
        self.defaults = {name: session.adopt(value) for name, value in (defaults or {}).items()
                         if name not in self.bound}
        self.closed = False
        self._busy = threading.Lock()
        self.retained = self._initial(initial)

    def _initial(self, initial: dict) -> dict:
        for name in initial:
            if name not in self.bound:
                raise Rejected("STATE_INITIAL_UNKNOWN", f"{name!r} is not a bound input")
        missing = self.bound - set(initial)
        if missing:
            raise Rejected("STATE_INITIAL_MISSING", f"no initial value for {sorted(missing)}")
        self._check_types(initial)
        for name, value in initial.items():
            if is_ownerless(value):
                raise Rejected("OWNERLESS_BORROW", f"{name!r}: a borrow lent for one call cannot become retained "
                               "state")
        return {name: self.session.adopt(value) for name, value in initial.items()}

    def _check_types(self, values: dict) -> None:
        for name, value in values.items():
            declared = self.declared.get(name)
            reason = declared.mismatch(value) if declared is not None else None
            if reason:
                raise Rejected("STATE_VALUE_INCOMPATIBLE", f"{name!r}: {reason}")

    def _enter(self) -> None:
        if not self._busy.acquire(blocking=False):
            raise Rejected("STATE_BUSY", "another call on this state is active")
        if self.closed:
            self._busy.release()
            raise Rejected("STATE_CLOSED", "the state is closed")

    def run(self, feeds: dict) -> dict:
        self._enter()
        try:
            self._check_feeds(feeds)
            copies: dict[str, np.ndarray] = {}
            merged = {name: handle for name, handle in self.defaults.items() if name not in feeds}
            merged.update({name: self._adopt_feed(name, value, copies) for name, value in feeds.items()})
            merged.update(self.retained)
            try:
                outputs = self.session.run_handles(merged)
            except (Rejected, NotSupported):
                raise
            except ModelRefused as exc:  # the runtime cannot run this model at all: no failed call
                raise NotSupported(f"the runtime cannot load the model: {exc}") from exc
            except Exception as exc:  # the runtime's own failure: the call failed, the state is unchanged
                raise Rejected("STATE_RUN_FAILED", f"{type(exc).__name__}: {exc}") from exc
            raw = {name: self.session.to_numpy(handle) for name, handle in outputs.items()}
            self._refuse_escapes(raw, {name: value for name, value in feeds.items() if is_ownerless(value)}, copies)
            arrays = {name: _read_only(array) for name, array in raw.items()}
            # Validate what will be retained against the bound inputs' declared types before publishing.
            self._check_types({input_name: arrays[output_name] for input_name, output_name in self.bindings})
            self.retained = {input_name: outputs[output_name] for input_name, output_name in self.bindings}
            return arrays
        finally:
            self._busy.release()

    def _adopt_feed(self, name: str, value: Any, copies: dict[str, np.ndarray]) -> Any:
        """A feed as the session's input handle. A fresh feed the runtime cannot share (strided, or
        read-only memory it would write-protect) is copied for this call only; ``_refuse_escapes`` then
        rejects the call if the copy would become retained state."""
        try:
            return self.session.adopt(value)
        except Rejected as exc:
            if exc.code != "STATE_UNRETAINABLE" or not isinstance(value, np.ndarray) or is_ownerless(value):
                raise
        copies[name] = np.array(value, order="C", copy=True)
        return self.session.adopt(copies[name])

    def _refuse_escapes(self, outputs: dict[str, np.ndarray], lent: dict[str, np.ndarray],
                        copies: dict[str, np.ndarray]) -> None:
        """No output may be an ownerless borrow (PAY-OWNERLESS), and no retained output a copy made of a
        feed (it would be a hidden repair): such a call fails and the state is unchanged."""
        for output, array in outputs.items():
            for fed, borrowed in lent.items():
                if self._shares(array, borrowed):
                    raise Rejected("OWNERLESS_BORROW", f"output {output!r} is the ownerless borrow fed as {fed!r}")
        for _, output in self.bindings:
            for fed, copy in copies.items():
                if self._shares(outputs[output], copy):
                    raise Rejected("STATE_UNRETAINABLE", f"{output!r} would retain a copy of the feed {fed!r} "
                                   "(the runtime cannot hold the caller's buffer itself)")

    def _shares(self, output: np.ndarray, fed: np.ndarray) -> bool:
        """Whether the runtime buffer behind ``output`` overlaps the memory of the array ``fed``."""
        start = self.session.buffer_id(output)
        if start is None or not getattr(output, "size", 0) or not fed.size:
            return False
        begin = int(fed.__array_interface__["data"][0])
        return start < begin + fed.nbytes and begin < start + output.nbytes

    def _check_feeds(self, feeds: dict) -> None:
        for name in feeds:
            if name in self.bound:
                raise Rejected("STATE_FEED_OVERRIDES", f"{name!r} is supplied by the retained state")
            if self.declared and name not in self.declared:
                raise Rejected("STATE_FEED_UNKNOWN", f"{name!r} is not a graph input")
        missing = sorted(n for n, d in self.declared.items() if d.required and n not in self.bound and n not in feeds)
        if missing:
            raise Rejected("STATE_FEED_MISSING", f"no value for {missing}")
        self._check_types(feeds)

    def values(self) -> dict:
        if self.closed:
            raise Rejected("STATE_CLOSED", "the state is closed")
        retained = self.retained
        return {name: _read_only(self.session.to_numpy(handle)) for name, handle in retained.items()}

    def reset(self, initial: dict) -> None:
        self._enter()
        try:
            self.retained = self._initial(initial)
        finally:
            self._busy.release()

    def close(self) -> None:
        if not self._busy.acquire(blocking=False):
            raise Rejected("STATE_BUSY", "close during an active call")
        try:
            self.closed = True
            self.retained = {}
        finally:
            self._busy.release()

    def buffer_id(self, value: Any) -> int | None:
        return self.session.buffer_id(value)


def _read_only(array: Any) -> Any:
    """Retained and returned views are shared: hand them out read-only (ZC-READ-ONLY), as a new view
    over the same memory, so an array the caller gave us keeps its own flags."""
    if isinstance(array, np.ndarray) and array.flags.writeable:
        array = array.view()
        array.flags.writeable = False
    return array

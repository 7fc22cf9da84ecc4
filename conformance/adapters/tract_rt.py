"""The tract adapter: affine values through DequantizeLinear and state lowered to caller-managed
feedback (conformance/adapters/lowering.py). tract loads models from files, so each model is written
to a temporary file first. Its Python binding copies a NumPy array into a new tract tensor
(``Tensor.from_numpy``); outputs are read as NumPy views over tract's own tensors (kept alive by the
session), and retained outputs are fed back as the tract tensors themselves. Buffer identity is the
tract tensor's data address. Outputs are matched to the ONNX graph's outputs by position: tract
renames an output that is an optimized-away Identity after its source, and its ``output_name`` gives node
names, not the graph's output names (docs/peer-deviations.md, T-OUTPUT-NAME).

tract is given each graph input's declared type as its input fact (a symbol for a dim the model names,
a fresh one for an unnamed dim): its ONNX loader drops the declared type of an input that is also a graph
output (T-PASSTHROUGH). A model tract cannot load with those facts (Attention whose K and V lengths are distinct
symbols) but with each symbol made 1 is loaded again for each call with the fed tensors' concrete
types, one runnable per set of types; a model tract refuses either way is refused when it is loaded (an
operator or type tract lacks). A load refused at a call for the fed types is a failed call; for an
operator tract lacks it is ``ModelRefused``, never a failed call.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Sequence
from typing import Any

import numpy as np

from conformance.adapters import Rejected
from conformance.adapters.lowering import LoweredAdapter, ModelRefused


class TractSession:
    def __init__(self, model_bytes: bytes):
        import onnx
        import tract

        self.tract = tract
        proto = onnx.ModelProto()
        proto.ParseFromString(model_bytes)
        initialized = {t.name for t in proto.graph.initializer}
        inputs = [vi for vi in proto.graph.input if vi.name not in initialized]
        self.input_names = [vi.name for vi in inputs]
        self.output_names = [vi.name for vi in proto.graph.output]
        if _empty_dequantize_scale(proto.graph):
            raise Rejected(None, "a DequantizeLinear scale with no elements is not handed to tract: it reads the "
                           "scale's first element and panics, aborting the process (docs/peer-deviations.md, "
                           "T-EMPTY-SCALE)")
        self.model_bytes = model_bytes
        self.by_types: dict[tuple, Any] = {}
        facts = declared_facts(inputs)
        try:
            self.runnable = self._load(facts)
        except tract.TractError:
            # Refused for its symbolic dims only (it loads with each symbol made 1)? Then it is loaded per
            # call with the fed types; refused for anything else, it is refused now, at load.
            self._load([_probe(fact) for fact in facts])
            self.runnable = None
        self.ids: dict[int, int | None] = {}
        self._keep: list = []

    def _load(self, facts: Sequence[str | None]):
        """The model made runnable by tract, its inputs given these facts (None: tract's own)."""
        handle, path = tempfile.mkstemp(suffix=".onnx")
        try:
            with os.fdopen(handle, "wb") as file:
                file.write(self.model_bytes)
            model = self.tract.onnx().load(path)
            for index, fact in enumerate(facts):
                if fact is not None:
                    model.set_input_fact(index, fact)
            return model.into_model().into_runnable()
        finally:
            os.unlink(path)

    def _runnable_for(self, handles: list):
        """The runnable for a call: the declared-type one, else one loaded for the fed tensors' types."""
        if self.runnable is not None:
            return self.runnable
        facts = [_concrete_fact(handle) for handle in handles]
        key = tuple(facts)
        if key not in self.by_types:
            try:
                self.by_types[key] = self._load(facts)
            except self.tract.TractError as error:
                if "Unimplemented(" in str(error):  # an operator tract lacks: no failed call
                    raise ModelRefused(f"tract lacks an operator of the model: {_first_line(error)}") from error
                raise  # the model loads (see __init__): these inputs are refused (K and V of other lengths)
        return self.by_types[key]

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
        handles = [feeds[name] for name in self.input_names]
        outputs = self._runnable_for(handles).run(handles)
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


#: tract's fact mnemonic of each NumPy element type it takes.
FACT_TYPES = {"float32": "f32", "float16": "f16", "float64": "f64", "int8": "i8", "int16": "i16", "int32": "i32",
              "int64": "i64", "uint8": "u8", "uint16": "u16", "uint32": "u32", "uint64": "u64", "bool": "bool"}


def declared_facts(inputs) -> list[str | None]:
    """Each input's declared tensor type as a tract fact ("n,4,f32"), or None where tract cannot say it."""
    from onnx import helper

    facts: list[str | None] = []
    for position, vi in enumerate(inputs):
        tensor = vi.type.tensor_type if vi.type.WhichOneof("value") == "tensor_type" else None
        if tensor is None or not tensor.elem_type or not tensor.HasField("shape"):
            facts.append(None)
            continue
        try:
            mnemonic = FACT_TYPES.get(np.dtype(helper.tensor_dtype_to_np_dtype(tensor.elem_type)).name)
        except (KeyError, TypeError, ValueError):
            mnemonic = None
        dims = [str(d.dim_value) if d.HasField("dim_value") else _symbol(d.dim_param, position, axis)
                for axis, d in enumerate(tensor.shape.dim)]
        facts.append(",".join(dims + [mnemonic]) if mnemonic else None)
    return facts


def _symbol(name: str, position: int, axis: int) -> str:
    """A tract symbol for a symbolic dim: the model's name (made an identifier), or a fresh one."""
    cleaned = re.sub(r"\W", "_", name)
    return f"S_{cleaned}" if cleaned else f"U_{position}_{axis}"


def _concrete_fact(handle) -> str:
    """The fed tract tensor's type as a fact ("2,3,f32")."""
    datum_type, shape, _ = handle._parts()
    return ",".join([str(int(d)) for d in shape] + [str(datum_type).rsplit(".", 1)[-1].lower()])


def _probe(fact: str | None) -> str | None:
    """A declared fact with every symbolic dim made 1: whether tract can load the model at all."""
    if fact is None:
        return None
    *dims, element = fact.split(",")
    return ",".join([dim if dim.isdigit() else "1" for dim in dims] + [element])


def _first_line(error: Exception) -> str:
    return " ".join(str(error).split("Stack backtrace")[0].split())[:300]


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

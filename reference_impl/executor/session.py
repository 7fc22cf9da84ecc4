"""The reference executor: an explicitly loaded, immutable model bound to compiled programs.

Loading converts the extended model to plain onnx once (the explicit load), validates the persistent
bindings against that final graph, compiles type specs and node kernels, and adopts initializers.
Running never serializes, clones, hashes or re-reads the model (clause STATE-NO-MODEL-SCAN).
"""

from __future__ import annotations

from collections.abc import Container, Mapping
from typing import Any

import numpy as np
from onnx import numpy_helper

from reference_impl import schema
from reference_impl.bindings import Binding, validate_bindings
from reference_impl.errors import ErrorCode as E
from reference_impl.errors import violation
from reference_impl.executor.program import CancelToken, Program, RunContext
from reference_impl.tensors import to_array
from reference_impl.values import (
    EncodedValue,
    InvocationBorrow,
    Spec,
    check_value,
    compile_struct,
    compile_type,
    leaves,
)
from reference_impl.verifier import verify_model


class Executor:
    """A loaded model. ``run(feeds)`` is stateless and thread-safe; ``make_state`` builds on it.

    ``kernels`` registers consumers by (domain, op_type): ``fn(inputs, attributes, context) -> outputs``;
    unlike standard operators they may take struct and encoded values. ``registry`` is the decoder
    registry handed to ``decode_value``.
    """

    def __init__(self, model, *, base_dir: str | None = None,
                 kernels: Mapping[tuple[str, str], Any] | None = None, registry=None):
        verified = verify_model(model, base_dir=base_dir)
        model = verified.model
        #: The model stays owned (and must stay unmodified) for the executor's lifetime.
        self.model = model
        self.base_dir = base_dir
        self.registry = registry
        self.kernels = dict(kernels or {})
        self.catalogue = verified.catalogue
        self.bindings: tuple[Binding, ...] = validate_bindings(model, self.catalogue)
        graph = model.graph
        self.input_names = tuple(vi.name for vi in graph.input)
        self.output_names = tuple(vi.name for vi in graph.output)
        self.input_specs: dict[str, Spec] = {
            vi.name: compile_type(vi.type if vi.HasField("type") else None, self.catalogue,
                                  f"model.graph.input[{i}].type") for i, vi in enumerate(graph.input)}
        self.output_specs: dict[str, Spec] = {
            vi.name: compile_type(vi.type if vi.HasField("type") else None, self.catalogue,
                                  f"model.graph.output[{i}].type") for i, vi in enumerate(graph.output)}
        self._struct_constants: dict[tuple[int, str], np.ndarray] = {}
        plain = schema.to_onnx(model)  # the one explicit conversion
        self.opsets = {o.domain: o.version for o in plain.opset_import}
        self.functions = {(f.domain, f.name): f for f in plain.functions}
        self.function_paths = {(f.domain, f.name): f"model.functions[{i}]" for i, f in enumerate(plain.functions)}
        #: Function bodies compile once per session, however many call sites they have.
        self.function_programs: dict[tuple[str, str], Program] = {}
        self.compiling_functions: set[tuple[str, str]] = set()
        constants = self.graph_constants(plain.graph)
        for index, encoded in enumerate(graph.encoded_initializer):
            constants[encoded.name] = EncodedValue.from_proto(
                encoded, self.catalogue, base_dir, f"model.graph.encoded_initializer[{index}]")
        self.defaults = frozenset(name for name in self.input_names if name in constants)
        self.required_inputs = tuple(name for name in self.input_names if name not in constants)
        self._root = Program(plain.graph.node, self.input_names, self.output_names, constants, self,
                             self.opsets, "model.graph")

    # -------------------------------------------------------------------------------- load helpers
    def graph_constants(self, graph, path: str = "model.graph") -> dict[str, Any]:
        """Dense initializers of a plain graph as read-only arrays (shared by every call). They are plain
        ONNX, converted by onnx's ``numpy_helper``; whatever it refuses is TENSOR_DATA_INVALID."""
        constants = {}
        for index, tensor in enumerate(graph.initializer):
            where = f"{path}.initializer[{index}]"
            try:
                array = numpy_helper.to_array(tensor)
            except MemoryError:
                raise violation(E.RESOURCE_LIMIT, where, "the dense initializer does not fit in memory") from None
            except Exception as err:  # noqa: BLE001 - onnx raises ValueError, TypeError, OSError ...
                raise violation(E.TENSOR_DATA_INVALID, where,
                                f"onnx cannot convert the dense initializer: {type(err).__name__}: {err}") from None
            array.flags.writeable = False
            constants[tensor.name] = array
        return constants

    def struct_constant(self, type_id: int | None, name: str) -> np.ndarray | None:
        """A field constant of a catalogue struct, converted once and shared read-only."""
        if type_id is None:
            return None
        key = (type_id, name)
        found = self._struct_constants.get(key)
        if found is None:
            spec = compile_struct(schema.StructTypeProto(type_ref=type_id), self.catalogue, "struct")
            for field, tensor in getattr(spec, "constants", ()):
                if field == name:
                    found = to_array(tensor, f"struct {type_id}.{name}")
                    found.flags.writeable = False
                    self._struct_constants[key] = found
        return found

    # ------------------------------------------------------------------------------------ running
    def run(self, feeds: Mapping[str, Any], *, cancel: CancelToken | None = None,
            check_feeds: bool = True, check_outputs: bool = True) -> dict[str, Any]:
        """Run once: feeds by input name -> every graph output by name. Values pass by reference.
        ``check_outputs=False`` leaves the borrow check of the outputs to a caller that does it itself
        (a state, which knows the outputs it retained and checked before)."""
        if check_feeds:
            self.check_feeds(feeds)
        ctx = RunContext(self, cancel)
        results = self._root.run(feeds, ctx)
        outputs = dict(zip(self.output_names, results))
        if check_outputs:
            for name, value in outputs.items():
                reject_borrows(value, f"output {name!r}")
        return outputs

    def check_feeds(self, feeds: Mapping[str, Any], validated: Mapping[str, Any] | None = None) -> None:
        """Names, presence and type metadata of feeds. Values in ``validated`` (a state's retained
        values, checked when they were published) count as present without being checked again."""
        for name, value in feeds.items():
            if validated is not None and name in validated:
                continue
            spec = self.input_specs.get(name)
            if spec is None:
                raise violation(E.STATE_FEED_UNKNOWN, f"feeds[{name!r}]", f"{name!r} is not a graph input")
            check_value(value, spec, f"feeds[{name!r}]")
        for name in self.required_inputs:
            if name not in feeds and (validated is None or name not in validated):
                raise violation(E.STATE_FEED_MISSING, f"feeds[{name!r}]", f"required input {name!r} has no feed")


def reject_borrows(value: Any, path: str, skip: Container[int] = frozenset()) -> None:
    """An invocation-only borrow can never leave the invocation (clause PAY-OWNERLESS). Containers whose
    ids are in ``skip`` were checked before and are not entered."""
    if type(value) is np.ndarray:
        return
    for leaf_path, leaf in leaves(value, path, skip):
        if isinstance(leaf, InvocationBorrow):
            raise violation(E.OWNERLESS_BORROW, leaf_path,
                            "an invocation-only borrow cannot become a returned output or retained state; "
                            "the producer must supply a lifetime owner")


def run_model(model, feeds: Mapping[str, Any], **options: Any) -> dict[str, Any]:
    """Load and run once (stateless): convenience for tests and the manual feedback loop."""
    executor = model if isinstance(model, Executor) else Executor(model, **options)
    return executor.run(feeds)

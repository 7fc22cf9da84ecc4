"""Compiled graphs: one step per node, values passed between steps by reference.

Standard operators run through onnx's reference implementations; function calls and ``If`` run their
bodies as nested programs over the same values, so payloads cross those boundaries without copies
(clause ZC-TRANSPORT). A struct or encoded value reaching a tensor operator fails with CONSUMER_MISSING
(clauses GRAPH-STRUCT-IO, ENC-NO-IMPLICIT-TENSOR).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from onnx.reference import ReferenceEvaluator
from onnx.reference.op_run import OpRun

from reference_impl.errors import ContractError, violation
from reference_impl.errors import ErrorCode as E
from reference_impl.executor.kernels import (
    LOCAL_DOMAIN,
    LOCAL_KERNELS,
    TRANSPORT,
    Kernel,
    attribute_values,
    convert_attribute,
)
from reference_impl.structs import MAX_DEPTH
from reference_impl.values import EncodedValue, InvocationBorrow, is_struct


class CancelToken:
    """Cooperative cancellation: the executor checks it between nodes."""

    __slots__ = ("cancelled",)

    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


@dataclass
class RunContext:
    """Per-invocation context handed to kernels."""

    session: Any
    cancel: CancelToken | None = None
    linked: Mapping[str, Any] = field(default_factory=dict)
    path: str = "graph"

    def check_cancel(self) -> None:
        if self.cancel is not None and self.cancel.cancelled:
            raise violation(E.STATE_CANCELLED, self.path, "execution was cancelled")


@dataclass(frozen=True)
class Step:
    kernel: Kernel
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    path: str
    op: str
    height: int = 0  # levels of bodies (If branches, function calls) nested below this step


def _no_log(*_args) -> None:
    return None


class Program:
    """A compiled graph or function body. ``depth`` counts the bodies enclosing it (If branches and
    function calls), bounded by MAX_DEPTH like type nesting."""

    def __init__(self, nodes, input_names: Sequence[str], output_names: Sequence[str],
                 constants: Mapping[str, Any], session, opsets: Mapping[str, int], path: str,
                 depth: int = 0):
        if depth > MAX_DEPTH:
            raise violation(E.NESTING_TOO_DEEP, path, f"graphs and function calls nest deeper than {MAX_DEPTH}")
        self.input_names = tuple(input_names)
        self.output_names = tuple(output_names)
        self.constants = dict(constants)
        self.path = path
        self.depth = depth
        self.steps = [compile_node(node, session, opsets, f"{path}.node[{i}]", depth)
                      for i, node in enumerate(nodes)]
        #: Levels of bodies nested below this one (0: no If branch or function call inside).
        self.height = max((step.height for step in self.steps), default=0)

    def run(self, feeds: Mapping[str, Any], ctx: RunContext, outer: Mapping[str, Any] | None = None) -> list:
        values: dict[str, Any] = dict(outer) if outer is not None else {}
        values.update(self.constants)
        values.update(feeds)
        values[""] = None
        for step in self.steps:
            ctx.path = step.path
            ctx.check_cancel()
            try:
                args = [values[name] for name in step.inputs]
            except KeyError as err:
                raise violation(E.EXECUTION_FAILED, step.path,
                                f"{step.op}: input {err.args[0]!r} has no value") from None
            try:
                results = step.kernel(args, ctx, values)
            except ContractError:
                raise
            except Exception as err:  # an operator failed: classify it, keep the cause
                raise violation(E.EXECUTION_FAILED, step.path, f"{step.op}: {type(err).__name__}: {err}") from err
            if len(results) < len(step.outputs):
                raise violation(E.EXECUTION_FAILED, step.path, f"{step.op} produced {len(results)} outputs")
            for name, value in zip(step.outputs, results):
                if name:
                    values[name] = value
        ctx.path = self.path
        ctx.check_cancel()
        try:
            return [values[name] for name in self.output_names]
        except KeyError as err:
            raise violation(E.EXECUTION_FAILED, self.path, f"output {err.args[0]!r} was never produced") from None


def compile_node(node, session, opsets: Mapping[str, int], path: str, depth: int = 0) -> Step:
    label = f"{node.domain + '.' if node.domain else ''}{node.op_type}"
    kernel, height = _kernel_for(node, session, opsets, path, depth)
    return Step(kernel, tuple(node.input), tuple(node.output), path, label, height)


def _plain(kernel: Kernel) -> Kernel:
    return lambda args, ctx, values: kernel(args, ctx)


def _kernel_for(node, session, opsets: Mapping[str, int], path: str, depth: int) -> tuple[Kernel, int]:
    """The node's kernel and the height of the bodies it runs (0 for plain operators)."""
    key = (node.domain, node.op_type)
    if key in session.kernels:
        return _custom(session.kernels[key], node), 0
    if node.domain == LOCAL_DOMAIN:
        factory = LOCAL_KERNELS.get(node.op_type)
        if factory is None:
            raise violation(E.OPERATOR_UNSUPPORTED, path, f"{LOCAL_DOMAIN}.{node.op_type} is not a known consumer")
        return _plain(factory(node, session)), 0
    if key in session.functions:
        return _function_call(node, session, key, path, depth)
    if node.domain in ("", "ai.onnx"):
        if node.op_type == "If":
            return _if(node, session, opsets, path, depth)
        if node.op_type in TRANSPORT:
            return _plain(TRANSPORT[node.op_type]), 0
    return _standard(node, opsets, path), 0


def _custom(fn, node) -> Kernel:
    attrs = attribute_values(node)
    return lambda args, ctx, values: fn(args, attrs, ctx)


@functools.lru_cache(maxsize=1024)
def _operator_class(domain: str, op_type: str, version: int | None) -> type:
    """onnx's reference implementation of an operator (looked up once per operator and version)."""
    if domain == "":
        from onnx.reference.ops import load_op

        return load_op("", op_type, version, evaluator_cls=ReferenceEvaluator)
    if domain == "ai.onnx.ml":
        from onnx.reference.ops.aionnxml import load_op as load_ml

        return load_ml(domain, op_type, version)
    raise NotImplementedError(f"domain {domain!r} has no reference implementation")


def _standard(node, opsets: Mapping[str, int], path: str) -> Kernel:
    domain = "" if node.domain == "ai.onnx" else node.domain
    version = opsets.get(domain, opsets.get("ai.onnx"))
    try:
        cls = _operator_class(domain, node.op_type, version)
        run_params = {"log": _no_log, "opsets": dict(opsets), "verbose": 0, "new_ops": {},
                      "existing_functions": {}, "evaluator_cls": ReferenceEvaluator}
        op: OpRun = cls(node, run_params)
    except ContractError:
        raise
    except Exception as err:
        raise violation(E.OPERATOR_UNSUPPORTED, path, f"{node.domain}.{node.op_type}: {err}") from err
    needs_context = op.need_context()
    linked = op.has_linked_attribute
    op_type = node.op_type

    def run(args, ctx, values):
        args = [_tensor_operand(arg, op_type, ctx.path) for arg in args]
        if needs_context:
            return op.run(*args, context=values)
        if linked:
            return op.run(*args, linked_attributes=ctx.linked)
        return op.run(*args)
    return run


def _tensor_operand(value: Any, op_type: str, path: str) -> Any:
    """Refuse structured values at a tensor operator; unwrap invocation borrows (valid here)."""
    if type(value) is np.ndarray:  # the common case, before the checks for anything else
        return value
    if is_struct(value) or isinstance(value, EncodedValue):
        raise violation(E.CONSUMER_MISSING, path,
                        f"{type(value).__name__} reaches tensor operator {op_type} without an explicit "
                        "decoder or registered consumer")
    if isinstance(value, InvocationBorrow):
        return value.array
    if isinstance(value, list):
        for item in value:
            _tensor_operand(item, op_type, path)
    return value


def _if(node, session, opsets: Mapping[str, int], path: str, depth: int) -> tuple[Kernel, int]:
    branches = {}
    for att in node.attribute:
        if att.name in ("then_branch", "else_branch"):
            graph = att.g
            branches[att.name] = Program(graph.node, [], [o.name for o in graph.output],
                                         session.graph_constants(graph, f"{path}.{att.name}"), session, opsets,
                                         f"{path}.{att.name}", depth + 1)
    if set(branches) != {"then_branch", "else_branch"}:
        raise violation(E.OPERATOR_UNSUPPORTED, path, "If needs then_branch and else_branch")

    def run(args, ctx, values):
        cond = args[0]
        if not isinstance(cond, np.ndarray) or cond.size != 1:
            raise violation(E.EXECUTION_FAILED, ctx.path, "If condition must be a one-element tensor")
        branch = branches["then_branch" if bool(cond.reshape(-1)[0]) else "else_branch"]
        return branch.run({}, ctx, outer=values)
    return run, 1 + max(branch.height for branch in branches.values())


def function_program(session, key: tuple[str, str], depth: int, path: str) -> Program:
    """The compiled body of a local function, compiled once per session and shared by every call
    site (a function calling another twice per level would otherwise compile 2**levels bodies). A
    function that reaches itself is refused: its body could never finish compiling or running."""
    program = session.function_programs.get(key)
    if program is not None:
        if depth + 1 + program.height > MAX_DEPTH:
            raise violation(E.NESTING_TOO_DEEP, path, f"graphs and function calls nest deeper than {MAX_DEPTH}")
        return program
    if key in session.compiling_functions:
        raise violation(E.OPERATOR_UNSUPPORTED, path, f"local function {key[0]}.{key[1]} calls itself (directly or "
                        "through other functions); recursive functions are not supported")
    function = session.functions[key]
    body_opsets = dict(session.opsets)
    body_opsets.update({o.domain: o.version for o in function.opset_import})
    session.compiling_functions.add(key)
    try:
        program = Program(function.node, function.input, function.output, {}, session, body_opsets,
                          session.function_paths[key], depth + 1)
    finally:
        session.compiling_functions.discard(key)
    session.function_programs[key] = program
    return program


def _function_call(node, session, key: tuple[str, str], path: str, depth: int) -> tuple[Kernel, int]:
    function = session.functions[key]
    program = function_program(session, key, depth, path)
    defaults = {att.name: convert_attribute(att) for att in function.attribute_proto}
    static = {}
    references = {}
    for att in node.attribute:
        if att.ref_attr_name:
            references[att.name] = att.ref_attr_name
        else:
            static[att.name] = convert_attribute(att)

    def run(args, ctx, values):
        linked = dict(defaults)
        linked.update(static)
        for name, ref in references.items():
            if ref in ctx.linked:
                linked[name] = ctx.linked[ref]
        feeds = dict(zip(program.input_names, args))
        outer_linked, outer_path = ctx.linked, ctx.path
        ctx.linked = linked
        try:
            return program.run(feeds, ctx)
        finally:
            ctx.linked, ctx.path = outer_linked, outer_path
    return run, 1 + program.height

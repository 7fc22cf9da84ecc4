"""The reference adapter: the oracle in ``reference_impl``. It must pass every Required and Recommended
case; the suite's own self-check runs it in process and through the testee."""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np

import reference_impl
from conformance.adapters import PROFILES, NotSupported, Rejected
from conformance.hold import HOLD_DOMAIN, HOLD_OP, Hold
from conformance.values import Encoded, Struct
from reference_impl import ContractError, graph_utils
from reference_impl import state as state_module
from reference_impl.kv import kv_kernels
from reference_impl.kv.storage import KVCounters, counting


def _rejected(error: ContractError) -> Rejected:
    return Rejected(error.code.value, f"{error.path}: {error.message}", [c.value for c in error.causes])


class ReferenceAdapter:
    """In-process oracle. Every ContractError becomes ``Rejected`` with its stable code."""

    name = "reference"
    #: runs issued with a hold park at the model's Hold node (conformance/hold.py)
    supports_hold = True

    def __init__(self) -> None:
        self.version = f"reference_impl (spec {reference_impl.SPEC_REVISION})"

    def profiles(self) -> set[str]:
        """The oracle implements the whole contract: every profile."""
        return set(PROFILES)

    def classify(self, exc: BaseException):
        if isinstance(exc, ContractError):
            return _rejected(exc)
        return None

    # ------------------------------------------------------------------------- representation
    def verify(self, model_bytes: bytes, base_dir: str | None) -> None:
        reference_impl.verify_model(model_bytes, base_dir=base_dir)

    def decode(self, model_bytes: bytes, value_name: str, base_dir: str | None,
               out: np.ndarray | None = None) -> np.ndarray:
        """The decoded value; into ``out`` (a caller's buffer, checked first) when given."""
        return reference_impl.decode(model_bytes, value_name, base_dir=base_dir, out=out)

    def read_fields(self, model_bytes: bytes, value_name: str, base_dir: str | None) -> dict[str, np.ndarray]:
        verified = reference_impl.verify_model(model_bytes, base_dir=base_dir)
        for index, value in enumerate(verified.model.graph.encoded_initializer):
            if value.name == value_name:
                return reference_impl.read_fields(value, verified.catalogue, base_dir,
                                                  path=f"model.graph.encoded_initializer[{index}]")
        raise Rejected("VALUE_NOT_FOUND", f"no encoded value named {value_name!r}")

    def roundtrip(self, model_bytes: bytes, base_dir: str | None = None) -> bytes:
        """Explicit load then save: parse with the extended schema and serialize again. The oracle's load
        reads no external payload, so it needs nothing from ``base_dir``."""
        model = reference_impl.verify_model(model_bytes).model
        return model.SerializeToString()

    # ---------------------------------------------------------------------------------- state
    def open_state(self, model_bytes: bytes, initial: dict[str, Any], base_dir: str | None = None):
        model = reference_impl.schema.parse_model(model_bytes)
        options: dict[str, Any] = {"base_dir": base_dir}
        kernels = dict(self.executor_kernels())
        slot = _HoldSlot()
        if any(o.domain == HOLD_DOMAIN for o in model.opset_import):
            kernels[(HOLD_DOMAIN, HOLD_OP)] = slot.kernel
        if kernels:
            options["kernels"] = kernels
        state = state_module.make_state(model, initial={k: to_runtime(v) for k, v in initial.items()}, **options)
        return ReferenceState(state, slot)

    def executor_kernels(self) -> dict:
        """Executor kernels by (domain, op_type): the KV kernels, i.e. Attention with in-place appends and
        the paged_attention role's default operator (docs/testee-protocol.md, "Operator roles")."""
        return kv_kernels()

    # --------------------------------------------------------------------------- export/rewrite
    def export(self, model_bytes: bytes, target: str, base_dir: str | None = None):
        """``onnx-light``: explicit save/load; ``onnx``: standard export; ``onnx-lowered``: standard
        export lowered to a stateless model plus its feedback mapping."""
        utils = graph_utils
        model = reference_impl.schema.parse_model(model_bytes)
        if target == "onnx-light":
            return utils.copy_model(model).SerializeToString()
        if target in ("onnx", "onnx-lowered"):
            exported = utils.export_standard(model, lower=target == "onnx-lowered")
            data = exported.model.SerializeToString()
            return (data, [list(pair) for pair in exported.feedback]) if target == "onnx-lowered" else data
        raise NotSupported(f"export target {target!r}")

    def rewrite(self, model_bytes: bytes, rewrite: dict, base_dir: str | None = None) -> bytes:
        """The rewrites cases ask for, done the way the graph builder does them (bindings checked)."""
        utils = graph_utils
        model = reference_impl.schema.parse_model(model_bytes)
        kind = rewrite.get("kind")
        if kind == "rename":
            return utils.rename_value(model, rewrite["old"], rewrite["new"]).SerializeToString()
        if kind == "deduplicate":
            return utils.deduplicate_initializers(model).SerializeToString()
        if kind == "remove_binding":  # an explicit unbinding, not a rewrite that loses a binding
            return utils.unbind(model, rewrite["input"]).SerializeToString()
        edits = {"remove_output": _remove_output, "remove_input": _remove_input,
                 "retype_output": _retype_output, "copy": lambda m, r: None, "prune_unused": _prune_unused}
        if kind not in edits:
            raise NotSupported(f"rewrite kind {kind!r}")
        return utils.apply_rewrite(model, lambda m: edits[kind](m, rewrite)).SerializeToString()


def _remove_output(model, rewrite: dict) -> None:
    keep = [vi for vi in model.graph.output if vi.name != rewrite["name"]]
    del model.graph.output[:]
    model.graph.output.extend(keep)


def _remove_input(model, rewrite: dict) -> None:
    keep = [vi for vi in model.graph.input if vi.name != rewrite["name"]]
    del model.graph.input[:]
    model.graph.input.extend(keep)


def _retype_output(model, rewrite: dict) -> None:
    for vi in model.graph.output:
        if vi.name == rewrite["name"]:
            vi.type.tensor_type.elem_type = rewrite["elem_type"]


def _prune_unused(model, rewrite: dict) -> None:
    """Drop nodes whose outputs nobody reads (an optimization that must keep bindings)."""
    graph = model.graph
    needed = {vi.name for vi in graph.output}
    kept = []
    for node in reversed(list(graph.node)):
        if any(out in needed for out in node.output):
            kept.append(node)
            needed.update(node.input)
    del graph.node[:]
    graph.node.extend(reversed(kept))


class _HoldSlot:
    """The hold of the call in progress, read by the state's Hold kernel (an identity that parks)."""

    def __init__(self) -> None:
        self.current: Hold | None = None

    def kernel(self, inputs, attributes, context):
        hold = self.current
        if hold is not None:
            hold.park()
        return list(inputs)


class ReferenceState:
    """A reference state behind the neutral handle protocol; values pass through without copies."""

    def __init__(self, state, slot: _HoldSlot | None = None) -> None:
        self.state = state
        self.slot = slot or _HoldSlot()
        self._kv = KVCounters()

    def run(self, feeds: dict[str, Any]) -> dict[str, Any]:
        with self._counting():
            outputs = self.state.run({k: to_runtime(v) for k, v in feeds.items()})
        return {k: to_neutral(v) for k, v in outputs.items()}

    def run_cancelled(self, feeds: dict[str, Any]) -> dict[str, Any]:
        """A run whose cancellation was requested before it started (the executor's CancelToken)."""
        from reference_impl.executor import CancelToken

        token = CancelToken()
        token.cancel()
        with self._counting():
            outputs = self.state.run({k: to_runtime(v) for k, v in feeds.items()}, cancel=token)
        return {k: to_neutral(v) for k, v in outputs.items()}

    def run_held(self, feeds: dict[str, Any], hold: Hold) -> dict[str, Any]:
        """A run that parks at the model's Hold node until the runner releases it; cancellation the
        runner requests meanwhile goes to the executor's CancelToken (checked between nodes)."""
        from reference_impl.executor import CancelToken

        token = CancelToken()
        hold.on_cancel(token.cancel)
        self.slot.current = hold
        try:
            with self._counting():
                outputs = self.state.run({k: to_runtime(v) for k, v in feeds.items()}, cancel=token)
        finally:
            self.slot.current = None
        return {k: to_neutral(v) for k, v in outputs.items()}

    @contextlib.contextmanager
    def _counting(self):
        """Accumulate what the KV kernels report during one call into this state's KV counters."""

        with counting() as call:
            try:
                yield
            finally:
                self._kv.add(call)

    def values(self) -> dict[str, Any]:
        return {k: to_neutral(v) for k, v in self.state.values.items()}

    def reset(self, initial: dict[str, Any]) -> None:
        self.state.reset({k: to_runtime(v) for k, v in initial.items()})

    def close(self) -> None:
        self.state.close()

    def counters(self) -> dict[str, int]:
        """The state's own counters and the KV kernels' under the suite's names (docs/testee-protocol.md)."""
        found = dict(self.state.counters.snapshot())
        found["kv_bytes_written"] = self._kv.written_bytes
        found["attention_peak_workspace_bytes"] = self._kv.workspace_peak
        return found


def to_runtime(value: Any) -> Any:
    """Neutral value -> reference runtime value, sharing every buffer."""
    from reference_impl.values import EncodedValue, StructValue

    if isinstance(value, Struct):
        return StructValue({k: to_runtime(v) for k, v in value.items()}, value.type_id)
    if isinstance(value, Encoded):
        return EncodedValue(value.header, value.payload)
    if isinstance(value, list):
        return [to_runtime(v) for v in value]
    return value


def to_neutral(value: Any) -> Any:
    """Reference runtime value -> neutral value, sharing every buffer."""
    from reference_impl.values import EncodedValue, StructValue

    if isinstance(value, StructValue):
        return Struct({k: to_neutral(v) for k, v in value.items()}, value.type_id)
    if isinstance(value, EncodedValue):
        return Encoded(value.header, value.payload)
    if isinstance(value, list):
        return [to_neutral(v) for v in value]
    return value

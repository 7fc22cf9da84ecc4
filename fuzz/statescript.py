"""State operation scripts: a small stateful model, a sequence of operations, and their known outcomes.

The model has a fresh input ``x`` (FLOAT["n"]), retained inputs ``s0..`` (FLOAT[n]) bound to outputs
``next0..`` computed by Add/Sub/Mul/Identity, unselected outputs ``y = x + s0`` and ``x_out = x``, and a
``Probe`` node (a registered kernel) through which an operation can re-enter the state during a call. Each
operation states its outcome by construction: a valid run, or one broken rule with its code.

``Runner`` applies operations to a ``State`` and checks every answer three ways: against NumPy, against
the spec's manual output-to-input loop over the stateless executor, and against the rules (failed
operations leave the previous mapping object in place, retained outputs are returned as the same
objects, no payload byte is copied).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from fuzz import dimensions
from fuzz import layouts as L
from fuzz.source import Source
from reference_impl import ContractError, dtypes, schema
from reference_impl.errors import ErrorCode as E
from reference_impl.executor import CancelToken, Executor
from reference_impl.state import make_state
from reference_impl.values import InvocationBorrow

UPDATES = ("Add", "Sub", "Mul", "Identity", "AddState")
PROBE = ("fuzz", "Probe")
#: The conformance suite's ``Hold`` operator (conformance/hold.py): an identity every adapter runs, on which
#: a held run parks. It takes the Probe's place when a script runs through adapters.
HOLD = ("onnx_light.conformance", "Hold")


class Mismatch(AssertionError):
    """The state's answer differs from the script's expectation."""


@dataclass
class StateModel:
    model: object
    n: int
    updates: list[tuple[str, int]]  # per retained input: (update op, partner state index for AddState)
    bias: float = 0.0  # the constant initializer added to y
    transport: tuple[str, str] = PROBE
    tags: tuple[str, ...] = ()  # deliberate generator choices (fuzz.dimensions)

    @property
    def bound(self) -> list[str]:
        return [f"s{i}" for i in range(len(self.updates))]

    def step(self, values: dict[str, np.ndarray], x: np.ndarray) -> tuple[dict, dict]:
        """NumPy outputs and next retained values of one call."""
        with np.errstate(all="ignore"):
            y = (x + values["s0"]).astype(np.float32) + np.float32(self.bias)
            outputs = {"y": y.astype(np.float32), "probe_out": values["s0"], "x_out": x}
            nxt = {}
            for index, (op, partner) in enumerate(self.updates):
                s = values[f"s{index}"]
                other = x if op in ("Add", "Sub", "Mul") else values[f"s{partner}"]
                result = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply,
                          "Identity": lambda a, _: a, "AddState": np.add}[op](s, other)
                nxt[f"s{index}"] = np.asarray(result, dtype=np.float32)
                outputs[f"next{index}"] = nxt[f"s{index}"]
        return outputs, nxt


def _vi(name: str, dims) -> object:
    info = schema.ValueInfoProto(name=name)
    info.type.CopyFrom(L.tensor_type(dtypes.FLOAT, dims))
    return info


def gen_state_model(src: Source, transport: tuple[str, str] = PROBE) -> StateModel:
    """``transport`` is the identity node between ``s0`` and ``probe_out``: the in-process ``Probe`` (a
    re-entry point) or ``HOLD`` (a park point any adapter supports). One model in four has a large state
    whose element count leaves a partial tile (``dimensions.remainder_size``)."""
    large = src.chance(1, 4)
    n = dimensions.remainder_size(src) if large else src.integer(1, 4)
    count = src.integer(1, 4)
    updates = [(src.choice(UPDATES), src.integer(0, count - 1)) for _ in range(count)]
    bias = src.integer(-8, 8) / 4
    return build_state_model(n, updates, bias, transport, ("size:remainder",) if large else ("size:small",))


def build_state_model(n: int, updates: list[tuple[str, int]], bias: float, transport: tuple[str, str] = PROBE,
                      tags: tuple[str, ...] = ()) -> StateModel:
    """The state model of ``n`` elements per state, one retained input per update, ``bias`` added to y."""
    model = schema.ModelProto(ir_version=10, producer_name="fuzz-state")
    model.opset_import.add(domain="", version=23)
    model.opset_import.add(domain=transport[0], version=1)
    graph = model.graph
    graph.name = "state"
    graph.input.append(_vi("x", ("n",)))
    graph.output.extend([_vi("y", ("n",)), _vi("probe_out", (n,))])
    graph.initializer.add(name="bias", data_type=dtypes.FLOAT, dims=[1], float_data=[bias])
    graph.node.add(op_type="Add", input=["x", "s0"], output=["x_plus_s0"])
    graph.node.add(op_type="Add", input=["x_plus_s0", "bias"], output=["y"])
    graph.node.add(op_type=transport[1], domain=transport[0], input=["s0"], output=["probe_out"])
    for index, (op, partner) in enumerate(updates):
        graph.input.append(_vi(f"s{index}", (n,)))
        graph.output.append(_vi(f"next{index}", (n,)))
        if op == "Identity":
            graph.node.add(op_type="Identity", input=[f"s{index}"], output=[f"next{index}"])
        elif op == "AddState":
            graph.node.add(op_type="Add", input=[f"s{index}", f"s{partner}"], output=[f"next{index}"])
        else:
            graph.node.add(op_type=op, input=[f"s{index}", "x"], output=[f"next{index}"])
        graph.persistent_bindings.add(input_name=f"s{index}", output_name=f"next{index}")
    graph.output.append(_vi("x_out", ("n",)))
    graph.node.add(op_type="Identity", input=["x"], output=["x_out"])  # a fresh feed passed on by reference
    return StateModel(model, n, list(updates), bias, transport, tags)


#: The parts of a state model's identity a near-duplicate changes, one at a time.
TWIN_PARTS = ("dim", "constant", "update")


def twin_state_model(src: Source, sm: StateModel) -> StateModel:
    """A model that differs from ``sm`` in exactly one part of its identity: the declared state size, the
    bias constant's value, or one update operator (at a position chosen by ``dimensions.place``)."""
    part = src.choice(TWIN_PARTS)
    n, updates, bias = sm.n, list(sm.updates), sm.bias
    tags = [f"twin:{part}"]
    if part == "dim":
        n = sm.n + src.integer(1, 3) if src.boolean() or sm.n < 8 else sm.n - src.integer(1, 3)
    elif part == "constant":
        bias = sm.bias + src.choice((0.25, -0.25, 1.0, 2.0))
    else:
        index, where = dimensions.place(src, len(updates))
        op, partner = updates[index]
        updates[index] = (src.choice([u for u in UPDATES if u != op]), partner)
        tags.append(f"position:{where}")
    return build_state_model(n, updates, bias, sm.transport, tuple(tags))


def _floats(src: Source, shape: tuple) -> np.ndarray:
    return src.floats(shape, 4)


# ------------------------------------------------------------------------------------------ operations
@dataclass
class Op:
    kind: str
    feeds: dict = field(default_factory=dict)
    initial: dict = field(default_factory=dict)
    expected: str | None = None  # the code the operation must fail with (None: it succeeds)
    inner: str | None = None  # for re-entrant and held operations: the code the inner call must get
    second: Op | None = None  # for held operations: the call made while the run is parked
    tags: tuple[str, ...] = ()  # deliberate generator choices (fuzz.dimensions)

    def __str__(self) -> str:
        return f"{self.kind}({', '.join(sorted(self.feeds or self.initial))}) -> {self.expected or 'ok'}"


@dataclass(frozen=True)
class Earlier:
    """A value an earlier operation of the script produced, passed back by reference: output ``name`` of
    operation ``index`` (``index`` None: the initial value ``name`` the state was opened with)."""

    index: int | None
    name: str


RUNS = ("run", "reenter_run", "reenter_reset", "reenter_close")
GRAPH_OPS = ("graph_export", "graph_export_structured", "graph_export_lowered", "graph_rename", "graph_rename_conflict",
             "graph_rewrite_drop", "graph_stateless_failed", "graph_unknown_operator")
OP_KINDS = ("run", "run", "run", "values", "reset", "close", "run_bad_shape", "run_override", "run_unknown",
            "run_missing", "run_wrong_dtype", "run_cancelled", "reenter_run", "reenter_reset", "reenter_close",
            "reset_missing", "reset_unknown", "reset_incompatible", "reset_noncontiguous", "reset_borrow") + GRAPH_OPS
#: Operations any adapter can run through its state handle: the Probe's re-entry and the graph operations need
#: the executor itself.
ADAPTER_KINDS = tuple(kind for kind in OP_KINDS if kind not in GRAPH_OPS and not kind.startswith("reenter"))
#: Operations on a run held at the model's Hold node (``HOLD`` transport, adapters with ``supports_hold``): a
#: second call on the same state while it is parked (rejected with STATE_BUSY; a reset or close may instead
#: wait for the run), cancellation requested while it is parked, or a run on another, independent state.
HELD_KINDS = ("held_run", "held_reset", "held_close", "held_cancel", "held_other")


def initial_values(src: Source, sm: StateModel) -> dict:
    return {name: _floats(src, (sm.n,)) for name in sm.bound}


def gen_op(src: Source, sm: StateModel, kind: str | None = None) -> Op:
    """One operation of ``kind`` (drawn when None) with its known outcome; see ``_GENERATORS``."""
    kind = kind or src.choice(OP_KINDS)
    x_len = src.choice((sm.n, sm.n, 1))
    x = _floats(src, (x_len,))
    if kind in GRAPH_OPS:
        return gen_graph_op(src, sm, kind, x)
    if kind in HELD_KINDS:
        return gen_held_op(src, sm, kind, x)
    return _GENERATORS[kind](src, sm, kind, x)


def _pick_bound(src: Source, sm: StateModel) -> tuple[str, tuple[str, ...]]:
    """The bound input an operation breaks, placed first, in the middle or last among the bound inputs."""
    index, where = dimensions.place(src, len(sm.bound))
    return sm.bound[index], (f"position:{where}",) if len(sm.bound) > 1 else ()


def _run(src: Source, sm: StateModel, kind: str, x: np.ndarray) -> Op:
    return Op(kind, {"x": x}, inner=E.STATE_BUSY.value if kind.startswith("reenter") else None)


def _bare(src: Source, sm: StateModel, kind: str, x: np.ndarray) -> Op:
    return Op(kind)


def _reset(src: Source, sm: StateModel, kind: str, x: np.ndarray) -> Op:
    return Op(kind, initial=initial_values(src, sm))


def _run_bad_shape(src: Source, sm: StateModel, kind: str, x: np.ndarray) -> Op:
    if sm.n > 1:
        return Op(kind, {"x": _floats(src, (sm.n + src.integer(1, 3),))}, expected=E.STATE_RUN_FAILED.value)
    # x broadcasts against the one-element states: the call runs, but a next state that took x's shape
    # contradicts its declared [1] and is refused before publication.
    grows = any(op in ("Add", "Sub", "Mul") for op, _ in sm.updates)
    return Op("run_broadcast", {"x": _floats(src, (src.integer(2, 4),))},
              expected=E.STATE_VALUE_INCOMPATIBLE.value if grows else None)


def _run_override(src: Source, sm: StateModel, kind: str, x: np.ndarray) -> Op:
    name, tags = _pick_bound(src, sm)
    return Op(kind, {"x": x, name: _floats(src, (sm.n,))}, expected=E.STATE_FEED_OVERRIDES.value, tags=tags)


def _run_unknown(src: Source, sm: StateModel, kind: str, x: np.ndarray) -> Op:
    return Op(kind, {"x": x, src.choice(("zz", "y", "next0", "s0.x")): x}, expected=E.STATE_FEED_UNKNOWN.value)


def _run_missing(src: Source, sm: StateModel, kind: str, x: np.ndarray) -> Op:
    return Op(kind, {}, expected=E.STATE_FEED_MISSING.value)


def _run_wrong_dtype(src: Source, sm: StateModel, kind: str, x: np.ndarray) -> Op:
    return Op(kind, {"x": x.astype(src.choice((np.float64, np.int64, np.float16)))},
              expected=E.STATE_VALUE_INCOMPATIBLE.value)


def _run_cancelled(src: Source, sm: StateModel, kind: str, x: np.ndarray) -> Op:
    return Op(kind, {"x": x}, expected=E.STATE_CANCELLED.value)


def _reset_missing(src: Source, sm: StateModel, kind: str, x: np.ndarray) -> Op:
    initial = initial_values(src, sm)
    name, tags = _pick_bound(src, sm)
    del initial[name]
    return Op(kind, initial=initial, expected=E.STATE_INITIAL_MISSING.value, tags=tags)


def _reset_unknown(src: Source, sm: StateModel, kind: str, x: np.ndarray) -> Op:
    initial = initial_values(src, sm)
    initial[src.choice(("x", "next0", "zz"))] = _floats(src, (sm.n,))
    return Op(kind, initial=initial, expected=E.STATE_INITIAL_UNKNOWN.value)


def _reset_incompatible(src: Source, sm: StateModel, kind: str, x: np.ndarray) -> Op:
    initial = initial_values(src, sm)
    name, tags = _pick_bound(src, sm)
    initial[name] = src.choice((_floats(src, (sm.n + 1,)), initial[name].astype(np.float64),
                                initial[name].reshape(1, sm.n)))
    return Op(kind, initial=initial, expected=E.STATE_VALUE_INCOMPATIBLE.value, tags=tags)


def _reset_noncontiguous(src: Source, sm: StateModel, kind: str, x: np.ndarray) -> Op:
    if sm.n == 1:  # one element is contiguous whatever its stride
        return _reset_borrow(src, sm, "reset_borrow", x)
    initial = initial_values(src, sm)
    name, tags = _pick_bound(src, sm)
    initial[name] = _floats(src, (sm.n * 2,))[::2]
    return Op(kind, initial=initial, expected=E.STATE_UNRETAINABLE.value, tags=tags)


def _reset_borrow(src: Source, sm: StateModel, kind: str, x: np.ndarray) -> Op:
    initial = initial_values(src, sm)
    name, tags = _pick_bound(src, sm)
    initial[name] = InvocationBorrow(initial[name])
    return Op(kind, initial=initial, expected=E.OWNERLESS_BORROW.value, tags=tags)


#: kind -> generator(src, state model, kind, x): each builds the operation and states its outcome (the
#: code it must fail with, or the code a re-entrant inner call must get).
_GENERATORS = {
    **{kind: _run for kind in RUNS},
    "values": _bare, "close": _bare, "reset": _reset,
    "run_bad_shape": _run_bad_shape, "run_override": _run_override, "run_unknown": _run_unknown,
    "run_missing": _run_missing, "run_wrong_dtype": _run_wrong_dtype, "run_cancelled": _run_cancelled,
    "reset_missing": _reset_missing, "reset_unknown": _reset_unknown, "reset_incompatible": _reset_incompatible,
    "reset_noncontiguous": _reset_noncontiguous, "reset_borrow": _reset_borrow,
}


def gen_graph_op(src: Source, sm: StateModel, kind: str, x: np.ndarray) -> Op:
    """Operations on the loaded model itself (export, rename, rewrite, stateless run, loading)."""
    expected = {"graph_export": E.EXPORT_PERSISTENCE, "graph_export_structured": E.EXPORT_UNSUPPORTED,
                "graph_rename_conflict": E.REWRITE_NAME_CONFLICT, "graph_rewrite_drop": E.REWRITE_DROPS_BINDING,
                "graph_stateless_failed": E.EXECUTION_FAILED,
                "graph_unknown_operator": E.OPERATOR_UNSUPPORTED}.get(kind)
    feeds: dict = {"x": x}
    if kind == "graph_rename":
        feeds = {"old": src.choice(sm.bound + ["x", "y"]), "new": src.choice(("renamed", "a.b", "c\\d"))}
    elif kind == "graph_rename_conflict":
        feeds = {"old": src.choice(sm.bound + ["x", "missing"]), "new": src.choice(("y", "x", "probe_out"))}
        if feeds["old"] == feeds["new"]:
            feeds["old"] = "missing"
    elif kind == "graph_rewrite_drop":
        feeds = {"how": src.choice(("binding", "input", "output", "retype"))}
    elif kind == "graph_stateless_failed":
        # n == 1 broadcasts against any x, so the mismatch is put into s0 (feed checks off: the
        # operator must fail, not the metadata check).
        feeds = {"x": _floats(src, (sm.n + src.integer(1, 3),))} if sm.n > 1 else \
            {"x": _floats(src, (2,)), "s0": np.zeros(3, np.float32)}
    return Op(kind, feeds, expected=expected.value if expected else None)


def gen_held_op(src: Source, sm: StateModel, kind: str, x: np.ndarray) -> Op:
    """A run of ``x`` parked at the Hold node, and what happens meanwhile (see ``HELD_KINDS``)."""
    if kind == "held_cancel":
        return Op(kind, {"x": x}, expected=E.STATE_CANCELLED.value)
    second = {"held_run": lambda: Op("run", {"x": _floats(src, (sm.n,))}),
              "held_other": lambda: Op("run", {"x": _floats(src, (sm.n,))}),
              "held_reset": lambda: Op("reset", initial=initial_values(src, sm)),
              "held_close": lambda: Op("close")}[kind]()
    return Op(kind, {"x": x}, second=second, inner=None if kind == "held_other" else E.STATE_BUSY.value)


#: Caller buffer layouts a run's fresh feed may come in (zero-size feeds fail to broadcast: both sides reject).
RUN_LAYOUTS = ("strided", "readonly", "misaligned", "view_of_view", "zero_size")
#: Layouts of one initial value in a reset: a runtime may refuse big-endian and strided buffers as
#: unretainable without a copy, or retain them (statediff lets both pass); zero-size ones are incompatible.
RESET_LAYOUTS = ("misaligned", "readonly", "strided", "view_of_view", "big_endian", "zero_size")


def odd_layouts(src: Source, op: Op) -> Op:
    """``op`` with, one time in three, its fresh feed ``x`` or one initial value (placed first, in the middle
    or last) handed over in an odd caller buffer (``dimensions.lay_out``): what the protocol lets a caller
    pass. For adapter scripts only (the local Runner's expectations assume plain buffers)."""
    if not src.chance(1, 3):
        return op
    if isinstance(op.feeds.get("x"), np.ndarray) and not op.kind.startswith("reset"):
        layout = src.choice(RUN_LAYOUTS)
        op.feeds["x"] = dimensions.lay_out(op.feeds["x"], layout)
        op.tags += (f"layout:{layout}",)
    elif op.kind == "reset" and op.initial:
        names = sorted(op.initial)
        index, where = dimensions.place(src, len(names))
        layout = src.choice(RESET_LAYOUTS)
        op.initial[names[index]] = dimensions.lay_out(op.initial[names[index]], layout)
        op.tags += (f"layout:{layout}",) + ((f"position:{where}",) if len(names) > 1 else ())
    return op


@dataclass
class Script:
    sm: StateModel
    initial: dict
    ops: list[Op]


def gen_script(src: Source, max_ops: int = 12) -> Script:
    sm = gen_state_model(src)
    initial = initial_values(src, sm)
    return Script(sm, initial, [gen_op(src, sm) for _ in range(src.integer(1, max_ops))])


# ---------------------------------------------------------------------------------------------- runner
def _same(a: np.ndarray, b: np.ndarray) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    # identical bits (the usual case) are equal without the element-wise comparison
    return a.tobytes() == b.tobytes() or bool(np.all((a == b) | (np.isnan(a) & np.isnan(b))))


class LoadedModel:
    """A state model loaded into the executor once, for every ``Runner`` of a script: the Probe kernel's
    calls go to the runner attached last (a script's runs are sequential)."""

    def __init__(self, sm: StateModel):
        self.runner: Runner | None = None
        self.executor = Executor(sm.model, kernels={PROBE: self._probe})

    def _probe(self, args, attrs, ctx):
        assert self.runner is not None, "a Probe call outside a runner"
        return self.runner._probe(args, attrs, ctx)


class Runner:
    """One ``State`` plus the two references it must agree with."""

    def __init__(self, sm: StateModel, initial: dict, loaded: LoadedModel | None = None):
        self.sm = sm
        self.hook = None
        self.inner_codes: list[str] = []
        loaded = loaded or LoadedModel(sm)
        loaded.runner = self
        self.executor = loaded.executor
        self.state = make_state(self.executor, initial={k: v.copy() for k, v in initial.items()})
        self.expected = {k: v.copy() for k, v in initial.items()}  # NumPy reference
        self.manual = dict(self.state.values)  # the spec's manual loop over the executor
        self.closed = False

    def _probe(self, args, attrs, ctx):
        if self.hook is not None:
            hook, self.hook = self.hook, None
            try:
                hook()
                self.inner_codes.append("ok")
            except ContractError as error:
                self.inner_codes.append(error.code.value)
        return [args[0]]

    def apply(self, op: Op) -> str:
        """Run ``op``; return its outcome ("ok" or a code) after checking it against the references."""
        before = None if self.closed else self.state.values
        state_op = op.kind not in GRAPH_OPS and op.kind != "close"
        expected_code = E.STATE_CLOSED.value if self.closed and state_op else op.expected
        try:
            outputs = self._do(op)
            outcome = "ok"
        except ContractError as error:
            outputs, outcome = None, error.code.value
        if outcome != (expected_code or "ok"):
            raise Mismatch(f"{op}: expected {expected_code or 'ok'}, state says {outcome}")
        if op.inner is not None and outcome == "ok" and self.inner_codes[-1:] != [op.inner]:
            raise Mismatch(f"{op}: the re-entrant call got {self.inner_codes[-1:]}, expected {op.inner}")
        if outcome != "ok":
            if before is not None and not self.closed and self.state.values is not before:
                raise Mismatch(f"{op}: a failed operation replaced the retained values")
        elif op.kind in RUNS or op.kind == "run_broadcast":
            self._check_run(op, outputs)
        elif op.kind == "reset":
            self.expected = {k: v.copy() for k, v in op.initial.items()}
            self.manual = dict(self.state.values)
        elif op.kind == "close":
            self.closed = True
        self.check_values()
        return outcome

    def _graph(self, op: Op):
        from reference_impl import graph_utils

        model = self.sm.model
        if op.kind == "graph_export":
            return graph_utils.export_standard(model)
        if op.kind == "graph_export_structured":
            structured = graph_utils.copy_model(model)
            structured.struct_types.add(type_id=1).bit_packing.component.add(name="b", bit_width=8)
            structured.struct_types[0].bit_packing.dimension = 1
            return graph_utils.export_standard(structured, lower=True)
        if op.kind == "graph_export_lowered":
            exported = graph_utils.export_standard(model, lower=True)
            if [list(p) for p in exported.feedback] != [[f"s{i}", f"next{i}"] for i in range(len(self.sm.updates))]:
                raise Mismatch(f"lowered export feedback {exported.feedback}")
            return exported
        if op.kind.startswith("graph_rename"):
            renamed = graph_utils.rename_value(model, op.feeds["old"], op.feeds["new"])
            bound = [(b.input_name, b.output_name) for b in renamed.graph.persistent_bindings]
            want = [(op.feeds["new"] if f"s{i}" == op.feeds["old"] else f"s{i}", f"next{i}")
                    for i in range(len(self.sm.updates))]
            if bound != want:
                raise Mismatch(f"rename {op.feeds}: bindings {bound}, expected {want}")
            return renamed
        if op.kind == "graph_rewrite_drop":
            return graph_utils.apply_rewrite(model, lambda m: _drop(m, op.feeds["how"]))
        if op.kind == "graph_stateless_failed":
            return self.executor.run({**dict(self.expected), **op.feeds}, check_feeds="s0" not in op.feeds)
        broken = graph_utils.copy_model(model)
        broken.graph.node.add(op_type="NoSuchConsumer", domain="onnx_light", input=["x"], output=["extra"])
        return Executor(broken)

    def _do(self, op: Op):
        if op.kind in GRAPH_OPS:
            return self._graph(op)
        state = self.state
        if op.kind == "values":
            return dict(state.values)
        if op.kind == "close":
            return state.close()
        if op.kind.startswith("reset"):
            return state.reset(op.initial)
        if op.kind == "reenter_run":
            self.hook = lambda: state.run(op.feeds)
        elif op.kind == "reenter_reset":
            self.hook = lambda: state.reset(dict(self.expected))
        elif op.kind == "reenter_close":
            self.hook = state.close
        cancel = None
        if op.kind == "run_cancelled":
            cancel = CancelToken()
            cancel.cancel()
        try:
            return state.run(op.feeds, cancel=cancel)
        finally:
            self.hook = None

    def _check_run(self, op: Op, outputs: dict) -> None:
        want, nxt = self.sm.step(self.expected, op.feeds["x"])
        manual_out = self.executor.run({**op.feeds, **self.manual})
        for name, value in want.items():
            if not _same(outputs[name], value):
                raise Mismatch(f"{op}: output {name} = {outputs[name]!r}, NumPy says {value!r}")
            if not _same(outputs[name], manual_out[name]):
                raise Mismatch(f"{op}: output {name} differs from the manual loop's {manual_out[name]!r}")
        for index, name in enumerate(self.sm.bound):
            if outputs[f"next{index}"] is not self.state.values[name]:
                raise Mismatch(f"{op}: retained {name} is not the returned next{index} object")
        self.expected = nxt
        self.manual = {name: manual_out[f"next{index}"] for index, name in enumerate(self.sm.bound)}

    def check_values(self) -> None:
        if self.closed:
            return
        values = self.state.values
        if set(values) != set(self.sm.bound):
            raise Mismatch(f"retained names {sorted(values)} != bound {self.sm.bound}")
        for name in self.sm.bound:
            if not _same(values[name], self.expected[name]) or not _same(values[name], self.manual[name]):
                raise Mismatch(f"retained {name} = {values[name]!r}, expected {self.expected[name]!r}")
            if values[name].flags.writeable:
                raise Mismatch(f"retained {name} is writeable")
        counters = self.state.counters
        if counters.payload_bytes_copied or counters.payload_allocations:
            raise Mismatch(f"state management copied payloads: {counters.snapshot()}")


def _drop(model, how: str) -> None:
    """A rewrite that loses a binding in one of the ways the contract forbids."""
    graph = model.graph
    if how == "binding":
        del graph.persistent_bindings[-1]
    elif how == "input":
        keep = [vi for vi in graph.input if vi.name != "s0"]
        del graph.input[:]
        graph.input.extend(keep)
    elif how == "output":
        keep = [vi for vi in graph.output if vi.name != "next0"]
        del graph.output[:]
        graph.output.extend(keep)
    else:
        graph.output[2].type.tensor_type.elem_type = dtypes.DOUBLE


def run_script(script: Script, loaded: LoadedModel | None = None) -> list[str]:
    """Apply every operation of ``script`` to a new state (over ``loaded``, or a model loaded now)."""
    runner = Runner(script.sm, script.initial, loaded)
    return [runner.apply(op) for op in script.ops]


#: Codes the script operations produce (checked by tests/test_fuzz_state.py).
STATE_CODES = frozenset({
    E.OWNERLESS_BORROW, E.EXPORT_PERSISTENCE, E.EXPORT_UNSUPPORTED, E.REWRITE_NAME_CONFLICT, E.REWRITE_DROPS_BINDING,
    E.EXECUTION_FAILED, E.OPERATOR_UNSUPPORTED, E.STATE_RUN_FAILED, E.STATE_FEED_OVERRIDES, E.STATE_FEED_UNKNOWN,
    E.STATE_FEED_MISSING, E.STATE_VALUE_INCOMPATIBLE, E.STATE_CANCELLED, E.STATE_BUSY, E.STATE_INITIAL_MISSING,
    E.STATE_INITIAL_UNKNOWN, E.STATE_UNRETAINABLE, E.STATE_CLOSED,
})



"""State, binding and KV scripts played on the oracle and on a subject adapter, and compared step by step.

A ``Scenario`` is a model with persistent bindings, its initial values and a list of operations
(``fuzz.statescript.Op``): runs (valid or broken), cancelled runs, ``values()``, resets (to new values or,
through ``Earlier``, back to values an earlier run returned), ``close()``, and held runs (a run parked at
the model's ``Hold`` node while a second call on the same state, a cancellation, or a call on an
independent state happens; conformance/hold.py, so nothing depends on timing). ``play`` runs it on one
adapter and records, per step, the verdict and code (``fuzz.subjects.Outcome``), the values returned, the
retained values read after the step, the runtime's counters, and the buffer id of every value leaf seen.
``compare`` lists what a subject does differently:

* verdicts and codes: a rejection with one of the causes the oracle named counts as the same code
  (a runtime may report ``KV_CAPACITY_EXCEEDED`` where the oracle says ``STATE_RUN_FAILED`` because of it);
* returned and retained values: exact, except outputs a scenario names approximate (Attention's ``y``:
  the operator fixes its formula, not the order of its float32 sums, so a conforming runtime may differ
  from the oracle by rounding; ``APPROXIMATE`` is the tolerance);
* buffer identity: ids from two processes cannot be compared, so the *relations* are: which leaves share
  one buffer on each side. Scenarios compare every relation (a selected output is the next input, values()
  are shared views, an Identity passes a buffer on, in-place KV appends share one allocation, everything
  computed anew is distinct) or, where the layout of a value is the runtime's choice (paged caches), only
  that values() returns what the state retained;
* counters both sides report (``COUNTERS``): their growth over each step;
* what the spec leaves open is not a disagreement: a reset or close that waits for a held run instead of
  being rejected, and a cancellation that comes too late, end the comparison there (the plays diverge
  legitimately).
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from conformance.hold import Hold
from conformance.values import Encoded, Struct, default_buffer_id, mismatch
from fuzz.source import Source
from fuzz.statescript import Earlier, Op
from fuzz.subjects import Outcome, _call
from reference_impl import ContractError

FAMILIES = ("state", "state", "kv", "bindings")
#: Attention's y: absolute and relative tolerance (float32 reassociation; see the module docstring).
APPROXIMATE = (1e-4, 1e-4)
#: Counters compared by growth per step: documented in docs/testee-protocol.md, and fixed by the script for
#: every conforming runtime (no model scans, no payload copies, one binding resolution, and the bytes the
#: appends of a contiguous cache write). attention_peak_workspace_bytes is the runtime's own business.
COUNTERS = ("model_serializations", "binding_resolutions", "payload_bytes_copied")
KV_COUNTERS = COUNTERS + ("kv_bytes_written",)
#: A second call on the same state gets this long to come back while the first run is parked (a
#: rejection is immediate; a call that waits is released with the run): it picks the branch, no verdict.
SECOND_CALL_GRACE = 0.2
#: A call on an independent state must finish while the other run stays parked.
INDEPENDENT_TIMEOUT = 30.0
HOLD_TIMEOUT = 60.0


@dataclass
class Scenario:
    family: str
    model: object
    bound: dict[str, str]  # bound input -> the output that feeds it
    initial: dict
    ops: list[Op]
    other: bool = False  # held_other operations run on a second state over the same model
    approximate: tuple[str, ...] = ()  # outputs compared within APPROXIMATE
    identity: str = "full"  # "full" or "views" (see the module docstring)
    counters: tuple[str, ...] = COUNTERS
    #: for caches whose blocks are sealed in a quantized format (how they are quantized is the runtime's
    #: choice): (feeds, outputs) -> the approximate outputs recomputed over the subject's own cache
    recompute: Callable[[dict, dict], Any] | None = None
    #: near-duplicate models a ``reopen`` operation opens a new state over (``feeds["twin"]`` indexes them)
    twins: list = field(default_factory=list)
    #: the step of the reopen from which ``twin_recompute`` replaces ``recompute``
    twin_at: int | None = None
    twin_recompute: Callable[[dict, dict], Any] | None = None
    #: the generator's deliberate choices (fuzz.dimensions), for counting; not compared
    tags: tuple[str, ...] = ()

    def describe(self) -> str:
        return f"{self.family}: {', '.join(str(op) for op in self.ops)}"

    def recompute_at(self, step: int) -> Callable[[dict, dict], Any] | None:
        """The recomputation that holds at ``step`` (the twin's once its reopen has run)."""
        if self.twin_at is not None and step >= self.twin_at:
            return self.twin_recompute
        return self.recompute


#: One scenario in TWIN_CHANCE[0]/TWIN_CHANCE[1] ends by reopening on a near-duplicate of its model.
TWIN_CHANCE = (1, 3)


def _op_tags(ops: list[Op]) -> tuple[str, ...]:
    return tuple(tag for op in ops for part in (op, op.second) if part is not None for tag in part.tags)


def _twin_prefix(src: Source, ops: list[Op], reset: Op) -> tuple[list[Op], tuple[str, ...]]:
    """The operations that lead to a reopen: sometimes a reset of the first state first (the twin then
    follows a reset, not a fresh open)."""
    if src.boolean():
        return [reset], ("twin:after_reset",)
    return [], ()


def scenario(src: Source, held: bool) -> Scenario:
    """A scenario of a family chosen by ``src``; ``held``: the subject supports held runs."""
    from fuzz import bindscript, kvscript, statescript

    family = src.choice(FAMILIES)
    if family == "state":
        sm = statescript.gen_state_model(src, statescript.HOLD)
        initial = statescript.initial_values(src, sm)
        if src.chance(1, 16):  # a bound input without its initial value: the state cannot be made
            del initial[src.choice(sorted(initial))]
        kinds = statescript.ADAPTER_KINDS + (statescript.HELD_KINDS if held else ())
        ops = [statescript.odd_layouts(src, statescript.gen_op(src, sm, src.choice(kinds)))
               for _ in range(src.integer(1, 12))]
        bound = {f"s{i}": f"next{i}" for i in range(len(sm.updates))}
        tags = sm.tags
        twins = []
        if src.chance(*TWIN_CHANCE):
            twin = statescript.twin_state_model(src, sm)
            prefix, extra = _twin_prefix(src, ops, Op("reset", initial=statescript.initial_values(src, sm)))
            ops += prefix + [Op("reopen", {"twin": 0}, statescript.initial_values(src, twin))]
            twin_kinds = [kind for kind in kinds if kind != "held_other"]
            ops += [statescript.odd_layouts(src, statescript.gen_op(src, twin, src.choice(twin_kinds)))
                    for _ in range(src.integer(1, 6))]
            twins, tags = [twin.model], tags + twin.tags + extra
        return Scenario(family, sm.model, bound, initial, ops, other=any(op.kind == "held_other" for op in ops),
                        twins=twins, tags=tags + _op_tags(ops))
    if family == "kv":
        dm = kvscript.gen_decode_model(src)
        ops = kvscript.gen_decode_ops(src, dm, held)
        scn = Scenario("paged" if dm.paged else "contiguous", dm.model, dm.bound, dm.empty(), ops,
                       approximate=("y",), identity="views" if dm.paged else "full",
                       counters=COUNTERS if dm.paged else KV_COUNTERS, recompute=_recompute(dm), tags=dm.tags)
        if src.chance(*TWIN_CHANCE):
            twin = kvscript.twin_decode_model(src, dm)
            prefix, extra = _twin_prefix(src, ops, Op("reset", initial=dm.empty()))
            ops += prefix
            scn.twin_at = len(ops)
            ops.append(Op("reopen", {"twin": 0}, twin.empty()))
            ops += kvscript.gen_decode_ops(src, twin, held, base=len(ops), origin=scn.twin_at)
            scn.twins, scn.twin_recompute = [twin.model], _recompute(twin)
            scn.tags += twin.tags + extra
        scn.tags += _op_tags(ops)
        return scn
    bm = bindscript.gen_binding_model(src)
    return Scenario(f"bindings/{bm.twist}", bm.model, bm.bound, bindscript.initial_values(src, bm),
                    bindscript.gen_binding_ops(src, bm), tags=bm.tags)


def _recompute(dm) -> Callable[[dict, dict], Any] | None:
    """Dense attention over the subject's own cache, where blocks are sealed in a quantized format."""
    quantized = any(dm.attrs.get(name, "dense") != "dense" for name in ("key_format", "value_format"))
    return dm.attend_over_cache if quantized else None


# ------------------------------------------------------------------------------------------- playing
@dataclass
class Record:
    """What one adapter did with a scenario."""

    outcomes: dict[str, Outcome] = field(default_factory=dict)
    ids: dict[str, int] = field(default_factory=dict)  # leaf label -> buffer id
    views: list[tuple[str, str]] = field(default_factory=list)  # (values() leaf, the leaf it retains)
    counters: dict[str, dict] = field(default_factory=dict)
    waited: dict[str, bool] = field(default_factory=dict)  # second call of a held step: came back late


class _Unresolved(Exception):
    """An ``Earlier`` value names an operation that produced nothing on this side."""


class _Call:
    """One adapter call on its own thread (``fuzz.subjects._call`` semantics; a Finding is re-raised)."""

    def __init__(self, fn, after=None):
        self.box: dict[str, Any] = {}
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(fn, after), daemon=True)
        self.thread.start()

    def _run(self, fn, after) -> None:
        try:
            self.box["outcome"] = fn()
        except BaseException as error:  # noqa: BLE001 - re-raised by result()
            self.box["error"] = error
        finally:
            self.done.set()
            if after is not None:
                after()

    def result(self) -> Outcome:
        self.thread.join(HOLD_TIMEOUT)
        if "error" in self.box:
            raise self.box["error"]
        return self.box.get("outcome", Outcome("unsupported"))


class Player:
    """Plays one scenario on one adapter (see ``play``)."""

    def __init__(self, adapter, scn: Scenario, by_value: bool):
        from conformance import operators

        self.adapter = adapter
        self.scn = scn
        self.by_value = by_value
        self.model = operators.bind(scn.model.SerializeToString(), operators.overrides(adapter))[0]
        self.twins = [operators.bind(twin.SerializeToString(), operators.overrides(adapter))[0] for twin in scn.twins]
        self.handles: dict[str, Any] = {}
        self.record = Record()
        self.returned: dict[int | None, dict] = {None: scn.initial}
        self.sources: dict[str, str] = {}  # bound input -> label prefix of the value it retains
        self.tracking = True  # ids are recorded until a state closes (a testee may then reuse addresses)
        self.keep: list = []  # everything handed over stays alive, so in-process addresses stay unique

    # ------------------------------------------------------------------------------- helpers
    def call(self, fn, *args) -> Outcome:
        return _call(self.adapter, fn, *args)

    def note_ids(self, prefix: str, values: dict, handle) -> None:
        self.keep.append(values)
        if not self.tracking or not isinstance(values, dict):
            return
        probe = getattr(handle, "buffer_id", None)
        for path, leaf in _leaves(values, prefix):
            if _nbytes(leaf) < 2:  # a testee may read single bytes into Python's shared one-byte objects
                continue
            found = probe(leaf) if probe is not None else None
            found = found if found is not None else default_buffer_id(leaf)
            if found is not None:
                self.record.ids[path] = found

    def resolve(self, values: dict) -> dict:
        from reference_impl.values import InvocationBorrow

        resolved = {}
        for name, value in values.items():
            if isinstance(value, Earlier):
                found = self.returned.get(value.index, {}).get(value.name)
                if found is None:
                    raise _Unresolved(value)
                value = _copy(found) if self.by_value else found
            elif isinstance(value, InvocationBorrow):
                value = _ownerless(value.array)
            resolved[name] = value
        return resolved

    # ------------------------------------------------------------------------------- operations
    def open(self) -> bool:
        outcome = self.call(self.adapter.open_state, self.model, self.scn.initial, None)
        self.record.outcomes["open"] = _bare(outcome)
        if outcome.kind != "ok":
            return False
        self.handles["main"] = outcome.value
        self.note_ids("open.in", self.scn.initial, outcome.value)
        self.sources = {name: f"open.in|{name}" for name in self.scn.bound}
        if self.scn.other:
            other = {name: _copy(value) for name, value in self.scn.initial.items()}
            second = self.call(self.adapter.open_state, self.model, other, None)
            self.record.outcomes["open:other"] = _bare(second)
            if second.kind == "ok":
                self.handles["other"] = second.value
        self.after("open")
        return True

    def step(self, index: int, op: Op) -> None:
        label = f"{index}:{op.kind}"
        handle = self.handles["main"]
        try:
            feeds = self.resolve(op.feeds)
            initial = self.resolve(op.initial)
        except _Unresolved:
            self.record.outcomes[label] = Outcome("skipped")
            return
        if op.kind == "reopen":
            self.reopen(index, label, op, handle, initial)
        elif op.kind in ("values", "close") or op.kind.startswith("reset"):
            self.simple(index, label, op, handle, initial)
        elif op.kind.startswith("held"):
            self.held(index, label, op, handle, feeds)
        else:
            method = "run_cancelled" if op.kind == "run_cancelled" else "run"
            fn = getattr(handle, method, None)
            outcome = Outcome("unsupported") if fn is None else self.call(fn, feeds)
            self.ran(index, label, outcome, feeds, handle)
        self.after(str(index))

    def simple(self, index: int, label: str, op: Op, handle, initial: dict) -> None:
        if op.kind == "values":
            outcome = self.call(handle.values)
            self.record.outcomes[label] = outcome
            if outcome.kind == "ok":
                self.note_views(f"{index}.values", outcome.value, handle)
        elif op.kind == "close":
            self.record.outcomes[label] = _bare(self.call(handle.close))
            self.tracking = False
        else:
            outcome = self.call(handle.reset, initial)
            self.record.outcomes[label] = _bare(outcome)
            if outcome.kind == "ok":
                self.note_ids(f"{index}.in", initial, handle)
                self.returned[index] = initial
                self.sources = {name: f"{index}.in|{name}" for name in self.scn.bound}

    def reopen(self, index: int, label: str, op: Op, handle, initial: dict) -> None:
        """Close the state and open a new one over a near-duplicate model (``Scenario.twins``): a runtime
        that caches what it prepared for a model must tell the two apart."""
        self.record.outcomes[f"{label}:close"] = _bare(self.call(handle.close))
        self.tracking = False  # a testee may reuse the closed state's addresses
        outcome = self.call(self.adapter.open_state, self.twins[op.feeds["twin"]], initial, None)
        self.record.outcomes[label] = _bare(outcome)
        if outcome.kind == "ok":
            self.handles["main"] = outcome.value
            self.returned[index] = initial
            self.sources = {name: f"{index}.in|{name}" for name in self.scn.bound}

    def ran(self, index: int, label: str, outcome: Outcome, feeds: dict, handle, prefix: str = "") -> None:
        self.record.outcomes[label] = outcome
        stem = f"{index}{prefix}"
        self.note_ids(f"{stem}.in", feeds, handle)
        if outcome.kind == "ok" and isinstance(outcome.value, dict):
            self.note_ids(f"{stem}.out", outcome.value, handle)
            if handle is self.handles.get("main"):
                self.returned[index] = outcome.value
                self.sources = {name: f"{stem}.out|{output}" for name, output in self.scn.bound.items()}

    def held(self, index: int, label: str, op: Op, handle, feeds: dict) -> None:
        if not hasattr(handle, "run_held"):
            self.record.outcomes[label] = Outcome("unsupported")
            return
        hold = Hold()
        first = _Call(lambda: self.call(handle.run_held, feeds, hold), after=hold.finish)
        second = None
        if hold.wait_parked_or_finished(HOLD_TIMEOUT):
            if op.second is not None:
                target = self.handles.get("other") if op.kind == "held_other" else handle
                second = _Call(lambda: self.second(target, op.second))
                second.done.wait(INDEPENDENT_TIMEOUT if op.kind == "held_other" else SECOND_CALL_GRACE)
                self.record.waited[label] = not second.done.is_set()
            if op.kind == "held_cancel":
                hold.request_cancel()
        hold.release()
        self.ran(index, label, first.result(), feeds, handle)
        if second is not None:
            outcome, second_feeds = second.result()
            self.record.outcomes[f"{label}:second"] = outcome
            if op.second.kind == "run":
                target = self.handles.get("other") if op.kind == "held_other" else handle
                self.note_ids(f"{index}.second.in", second_feeds, target)
                if outcome.kind == "ok":
                    self.note_ids(f"{index}.second.out", outcome.value, target)
            elif op.second.kind == "close" and outcome.kind == "ok":
                self.tracking = False

    def second(self, handle, op: Op) -> tuple[Outcome, dict]:
        if handle is None:
            return Outcome("unsupported"), {}
        if op.kind == "run":
            return self.call(handle.run, op.feeds), op.feeds
        if op.kind == "reset":
            return _bare(self.call(handle.reset, op.initial)), {}
        return _bare(self.call(handle.close)), {}

    def note_views(self, prefix: str, values: dict, handle) -> None:
        """values() leaves, paired with the leaves of what the state should retain for them."""
        self.note_ids(prefix, values, handle)
        for name, value in values.items():
            if name in self.sources:
                for path, _ in _leaves({name: value}, prefix):
                    self.record.views.append((path, self.sources[name] + path[len(f"{prefix}|{name}"):]))

    def after(self, label: str) -> None:
        """The retained values and the counters after a step (read on every open state)."""
        handle = self.handles["main"]
        outcome = self.call(handle.values)
        self.record.outcomes[f"{label}:after"] = outcome
        if outcome.kind == "ok":
            self.note_views(f"{label}.after", outcome.value, handle)
        probe = getattr(handle, "counters", None)
        if probe is not None:
            counted = self.call(probe)
            if counted.kind == "ok":
                self.record.counters[label] = dict(counted.value)

    def close(self) -> None:
        for handle in self.handles.values():
            try:
                handle.close()
            except Exception:  # noqa: BLE001 - closing a closed or broken state may fail
                pass


def play(adapter, scn: Scenario, by_value: bool = False) -> Record:
    """Run ``scn`` on ``adapter``. ``by_value``: values passed back (``Earlier``) go as copies, as they
    must through a subprocess testee, so both sides of a comparison see the same ownership."""
    player = Player(adapter, scn, by_value)
    try:
        if player.open():
            for index, op in enumerate(scn.ops):
                player.step(index, op)
    finally:
        player.close()
    return player.record


# ----------------------------------------------------------------------------------------- comparing
def compare(scn: Scenario, want: Record, got: Record) -> list[tuple[str, str, str]]:
    """Disagreements (step, kind, message) of a subject's record with the oracle's, in step order; the
    comparison stops where the plays may legitimately diverge."""
    cut = len(scn.ops)  # the first step whose effects are not compared
    for key, expected in want.outcomes.items():
        actual = got.outcomes.get(key)
        if actual is None or "unsupported" in (expected.kind, actual.kind) or \
                _allowed_divergence(key, expected, actual, got):
            cut = _step(key)  # the states may differ from here on
            break
        problem = _outcome_problem(scn, key, expected, actual, got)
        if problem:
            return [problem]
    return _counter_problems(scn, want, got, cut) or _identity_problems(scn, want, got, cut)


def where(scn: Scenario, key: str) -> str:
    """``family:operation`` of a disagreement's step, for a finding's signature (the same bug gives the same
    signature whichever step of a script it shows at)."""
    step = _step(key)
    operation = "open" if step < 0 or step >= len(scn.ops) else scn.ops[step].kind
    return f"{scn.family.split('/')[0]}:{operation}"


def _step(label: str) -> int:
    """The step a record label belongs to ("open..." is -1): ``3:run``, ``3.out|y``, ``3`` -> 3."""
    head = label.replace(":", ".").replace("|", ".").split(".")[0]
    return -1 if head == "open" else int(head)


def _allowed_divergence(key: str, expected: Outcome, actual: Outcome, got: Record) -> bool:
    """A held reset/close that waited for the run, a cancellation that came too late, or a caller buffer
    the oracle refuses as unretainable without a copy (a strided view) that the subject retains as it is
    (ZC-ENTRY-POINTS: retaining without a copy and refusing explicitly both conform)."""
    if expected.kind == "reject" and expected.code == "STATE_UNRETAINABLE" and actual.kind == "ok":
        return True
    kind = key.split(":")[1] if ":" in key else ""
    if key.endswith(":second") and kind in ("held_reset", "held_close"):
        return expected.kind == "reject" and actual.kind == "ok" and got.waited.get(key[:-len(":second")], False)
    if kind == "held_cancel" and key.count(":") == 1:
        return expected.kind == "reject" and expected.code == "STATE_CANCELLED" and actual.kind == "ok"
    return False


def _codes_agree(want: Outcome, got: Outcome) -> bool:
    return want.code == got.code or got.code in want.causes or want.code in got.causes


def _outcome_problem(scn: Scenario, key: str, want: Outcome, got: Outcome, record: Record):
    if want.kind != got.kind:
        return key, "verdict", f"{key}: oracle {want}, subject {got}"
    if want.kind == "reject" and not _codes_agree(want, got):
        return key, "code", f"{key}: oracle rejects with {want.code}, subject with {got.code}"
    if key.endswith(":second"):
        late = record.waited.get(key[:-len(":second")], False)
        if got.kind == "ok" and late:
            what = "held back by another state's active run" if ":held_other" in key else \
                "queued behind the active run instead of rejected"
            return key, "concurrency", f"{key}: {what}"
    if want.kind != "ok" or not isinstance(want.value, dict):
        return None
    recompute = scn.recompute_at(_step(key))
    if not isinstance(got.value, dict) or sorted(want.value) != sorted(got.value):
        return key, "values", f"{key}: names {sorted(want.value)} versus {sorted(_names(got.value))}"
    for name in want.value:
        expected, actual = want.value[name], got.value[name]
        atol, rtol = APPROXIMATE if name in scn.approximate else (0.0, 0.0)
        if recompute is not None:
            expected, actual = _layouts_only(expected), _layouts_only(actual)
            if name in scn.approximate:
                try:
                    expected = recompute(_feeds_of(scn, key), got.value)
                except ContractError as error:
                    return key, "values", f"{key}: the subject's cache does not decode: {error}"
        reason = mismatch(expected, actual, atol=atol, rtol=rtol, path=name)
        if reason:
            return key, "values", f"{key}: {reason}"
    return None


def _feeds_of(scn: Scenario, key: str) -> dict:
    op = scn.ops[_step(key)]
    return op.second.feeds if key.endswith(":second") else op.feeds


def _layouts_only(value):
    """A value with every encoded leaf replaced by what its header says of the layout (kind, storage type or
    type reference, logical type): how a block is quantized (its scales, its codes) is the runtime's choice."""
    if isinstance(value, Struct):
        return Struct({name: _layouts_only(item) for name, item in value.items()}, value.type_id)
    if isinstance(value, dict):
        return {name: _layouts_only(item) for name, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_layouts_only(item) for item in value]
    if isinstance(value, Encoded):
        header = value.header
        layout = header.WhichOneof("layout")
        detail = header.affine.storage_type if layout == "affine" else header.struct_type.type_ref \
            if layout == "struct_type" else ""
        summary = np.empty(1, dtype=object)
        summary[0] = f"{layout}:{detail}:{header.logical_type.SerializeToString(deterministic=True).hex()}"
        return summary
    return value


def _names(value) -> list:
    return list(value) if isinstance(value, dict) else [type(value).__name__]


def _counter_problems(scn: Scenario, want: Record, got: Record, cut: int) -> list:
    labels = [label for label in want.counters if _step(label) < cut and label in got.counters]
    previous: tuple[dict, dict] | None = None
    for label in labels:
        a, b = want.counters[label], got.counters[label]
        for name in scn.counters:
            if name not in a or name not in b:
                continue
            grown_a = a[name] - (previous[0].get(name, 0) if previous else 0)
            grown_b = b[name] - (previous[1].get(name, 0) if previous else 0)
            if grown_a != grown_b:
                step = "open" if label == "open" else f"step {label}"
                return [(label, "counters", f"{step}: counter {name} grew by {grown_a} on the oracle, "
                                            f"{grown_b} on the subject")]
        previous = (a, b)
    return []


def _identity_problems(scn: Scenario, want: Record, got: Record, cut: int) -> list:
    if scn.identity == "views":
        views = set(got.views)
        for leaf, source in want.views:
            if (leaf, source) not in views or _step(leaf) >= cut:
                continue
            same_a = want.ids.get(leaf) is not None and want.ids.get(leaf) == want.ids.get(source)
            same_b = got.ids.get(leaf) is not None and got.ids.get(leaf) == got.ids.get(source)
            if same_a != same_b:
                return [(leaf, "identity", _relation(leaf, source, same_a))]
        return []
    labels = [label for label in want.ids if label in got.ids and _step(label) < cut]
    first_a: dict[int, str] = {}
    first_b: dict[int, str] = {}
    for label in labels:
        a, b = first_a.setdefault(want.ids[label], label), first_b.setdefault(got.ids[label], label)
        if a != b:  # the first label sharing this leaf's buffer differs between the sides
            other = a if a != label else b
            return [(label, "identity", _relation(label, other, want.ids[label] == want.ids[other]))]
    return []


def _relation(a: str, b: str, same: bool) -> str:
    oracle, subject = ("one buffer", "distinct buffers") if same else ("distinct buffers", "one buffer")
    return f"{a} and {b}: the oracle gives {oracle}, the subject {subject}"


# ---------------------------------------------------------------------------------------- helpers
def _bare(outcome: Outcome) -> Outcome:
    """An outcome without its value (reset, close, open: what they return is not compared)."""
    return Outcome(outcome.kind, outcome.code, None, outcome.causes)


def _leaves(values: dict, prefix: str):
    """(label, leaf) of every tensor or encoded value inside named values."""
    stack = [(f"{prefix}|{name}", value) for name, value in values.items()]
    while stack:
        path, value = stack.pop(0)
        if isinstance(value, dict):
            stack[:0] = [(f"{path}|{key}", item) for key, item in value.items()]
        elif isinstance(value, (list, tuple)):
            stack[:0] = [(f"{path}|{number}", item) for number, item in enumerate(value)]
        elif value is not None:
            yield path, value


def _nbytes(leaf) -> int:
    data = leaf.payload if isinstance(leaf, Encoded) else leaf
    return int(getattr(data, "nbytes", 0))


def _copy(value):
    """A deep copy of a neutral value (read-only arrays, as the caller's buffers are)."""
    if isinstance(value, Struct):
        return Struct({name: _copy(item) for name, item in value.items()}, value.type_id)
    if isinstance(value, (list, tuple)):
        return [_copy(item) for item in value]
    if isinstance(value, Encoded):
        return Encoded(value.header, _frozen(np.array(value.payload)))
    if isinstance(value, np.ndarray):
        return _frozen(np.array(value))
    return value


def _frozen(array: np.ndarray) -> np.ndarray:
    array.flags.writeable = False
    return array


def _ownerless(array: np.ndarray) -> np.ndarray:
    """A view of ``array`` with no owner a runtime could keep (``conformance.values.borrow``'s kind of
    value); the scenario's operation keeps ``array`` alive, so nothing accumulates across inputs."""
    raw = (ctypes.c_char * array.nbytes).from_address(array.__array_interface__["data"][0])
    return np.frombuffer(raw, dtype=array.dtype).reshape(array.shape)


def freeze(values: dict) -> dict:
    """Make every array of a scenario's values read-only: both sides get the same caller buffers, so a
    runtime writing into one is caught (an unclassified ValueError) instead of corrupting the other side."""
    for _, leaf in _leaves(values, ""):
        if isinstance(leaf, np.ndarray):
            leaf.flags.writeable = False
        elif isinstance(leaf, Encoded):
            leaf.payload.flags.writeable = False
    return values


def digest(record: Record) -> str:
    """Verdicts and values of a record (not buffer ids), for the same-answer-twice invariant."""
    from fuzz.invariants import digest as value_digest

    return value_digest([(key, o.kind, o.code, o.value) for key, o in record.outcomes.items()])

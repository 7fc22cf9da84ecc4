"""Testee parity: ``--testee "python -m conformance.testee --adapter NAME"`` gives exactly the verdicts
of ``--adapter NAME`` in process.

The fast tests run the cases whose verdicts once differed (held runs of an adapter that cannot hold one,
a rewrite the adapter lacks, buffer identities the handle does not know or numbers from 0, values the
runner hands back to the adapter that gave them out) for the reference and onnxruntime adapters and for
small adapters below that behave as OpenVINO and tract do. Whole runs are slower: they run for the
adapters ``CONFORMANCE_PARITY`` names (``CONFORMANCE_PARITY=reference,onnxruntime``).
"""

from __future__ import annotations

import os
import pathlib
import sys
from typing import Any

import numpy as np
import pytest

from conformance import protocol
from conformance.adapters import BUILTIN, IN_PROCESS_PROFILES, Rejected, load_adapter
from conformance.adapters.reference import ReferenceAdapter, ReferenceState
from conformance.cases import load_cases, select
from conformance.execute import NOT_SUPPORTED, Result, run_case
from conformance.runner import RunConfig, run
from conformance.values import default_buffer_id

#: Cases whose verdicts differed, by why.
HELD = ["Required.State.Concurrency.SecondRunRejected", "Required.State.Cancel.DuringRunAllOldOrAllNew",
        "Required.State.Independent.TwoStatesRunAtOnce"]
REWRITE = ["Required.State.ModelUse.RenamedModelResolvedOnce"]
IDENTITY = ["Required.ZeroCopy.Retain.InitialValueRetainedByBuffer", "Required.ZeroCopy.Views.ValuesAreSharedViews",
            "Required.ZeroCopy.Retain.NextCallReceivesSameBuffer", "Required.State.ResetClose.ResetRestoresInitial"]
HANDED_BACK = ["Required.KV.Contiguous.BranchFromAnOlderPresent",
               "Required.KV.Contiguous.ResetToAnEarlierPresentKeepsHeldOutputs"]
PARITY_VARIABLE = "CONFORMANCE_PARITY"
ROOT = pathlib.Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------------------- adapters under test
class UnknownIdsState(ReferenceState):
    """Knows no buffer identity: the runner takes each value's data address (as OpenVINO's and tract's
    handles do for every value they did not create)."""

    def buffer_id(self, value: Any) -> int | None:
        return None


class NoBufferIds(ReferenceAdapter):
    def open_state(self, model_bytes, initial, base_dir=None):
        opened = super().open_state(model_bytes, initial, base_dir)
        return UnknownIdsState(opened.state, opened.slot)


class SerialIdsState(ReferenceState):
    """Buffer identities are serials numbered from 0 in the order the state first sees each buffer."""

    def __init__(self, state, slot) -> None:
        super().__init__(state, slot)
        self.serials: dict[int, int] = {}

    def buffer_id(self, value: Any) -> int | None:
        address = default_buffer_id(value)
        return None if address is None else self.serials.setdefault(address, len(self.serials))


class SerialBufferIds(ReferenceAdapter):
    def open_state(self, model_bytes, initial, base_dir=None):
        opened = super().open_state(model_bytes, initial, base_dir)
        return SerialIdsState(opened.state, opened.slot)


class OwnBuffersState(ReferenceState):
    def __init__(self, state, slot, owned: set[int]) -> None:
        super().__init__(state, slot)
        self.owned = owned

    def run(self, feeds):
        _check_read_only(feeds, self.owned)
        return _own(super().run(feeds), self.owned)

    def values(self):
        return _own(super().values(), self.owned)

    def reset(self, initial):
        _check_read_only(initial, self.owned)
        super().reset(initial)


class OwnBuffersOnly(ReferenceAdapter):
    """Shares only writable memory, except the buffers its states handed out (as OpenVINO, which
    recognizes the arrays over its own tensors): a read-only copy of one of them is refused."""

    def __init__(self) -> None:
        super().__init__()
        self.owned: set[int] = set()

    def open_state(self, model_bytes, initial, base_dir=None):
        _check_read_only(initial, self.owned)
        opened = super().open_state(model_bytes, initial, base_dir)
        return OwnBuffersState(opened.state, opened.slot, self.owned)


def _own(values: dict, owned: set[int]) -> dict:
    owned.update(default_buffer_id(v) for v in values.values() if isinstance(v, np.ndarray) and v.size)
    return values


def _check_read_only(values: dict, owned: set[int]) -> None:
    for name, value in values.items():
        if isinstance(value, np.ndarray) and value.size and not value.flags.writeable \
                and default_buffer_id(value) not in owned:
            raise Rejected("STATE_UNRETAINABLE", f"{name}: read-only memory that is not ours would need a copy")


# ---------------------------------------------------------------------------------------- comparing
def serve_command(spec: str) -> str:
    return f"{sys.executable} -m conformance.testee --adapter {spec}"


def differences(in_process: list[Result], through_testee: list[Result]) -> list[str]:
    """One line per case whose verdict differs (or that only one run has)."""
    testee = {result.id: result for result in through_testee}
    lines = [f"{result.id}: only in process" for result in in_process if result.id not in testee]
    for result in in_process:
        other = testee.get(result.id)
        if other is not None and other.verdict != result.verdict:
            lines.append(f"{result.id}: {result.verdict} in process ({result.message[:160]}), {other.verdict} "
                         f"through the testee ({other.message[:160]})")
    known = {result.id for result in in_process}
    return lines + [f"{result.id}: only through the testee" for result in through_testee if result.id not in known]


def _in_process(spec: str) -> Any:
    local = {"NoBufferIds": NoBufferIds, "SerialBufferIds": SerialBufferIds, "OwnBuffersOnly": OwnBuffersOnly}
    name = spec.rpartition(":")[2]
    return local[name]() if spec.startswith(__file__) else _load_or_skip(spec)


def _load_or_skip(name: str) -> Any:
    try:
        return load_adapter(name)
    except ImportError as missing:
        pytest.skip(f"{name} is not installed ({missing})")


@pytest.fixture
def at_root(monkeypatch):
    """The testee command imports this checkout's conformance package (python -m from the root)."""
    monkeypatch.chdir(ROOT)


# ------------------------------------------------------------------------------------------ the tests
FAST = [("reference", HELD + REWRITE + IDENTITY + HANDED_BACK),
        ("onnxruntime", HELD + REWRITE + IDENTITY + HANDED_BACK),
        (f"{__file__}:NoBufferIds", IDENTITY),
        (f"{__file__}:SerialBufferIds", IDENTITY),
        (f"{__file__}:OwnBuffersOnly", HANDED_BACK)]


@pytest.mark.parametrize("spec,case_ids", FAST, ids=[spec.rpartition(":")[2] for spec, _ in FAST])
def test_cases_that_differed_get_the_in_process_verdicts_through_the_testee(at_root, spec, case_ids):
    adapter = _in_process(spec)
    cases = select(load_cases(), case_ids)
    assert sorted(case.id for case in cases) == sorted(case_ids)
    in_process = [run_case(case, adapter) for case in cases]
    testee = load_adapter(testee=serve_command(spec), timeout=60.0)
    try:
        through_testee = [run_case(case, testee) for case in cases]
    finally:
        testee.shutdown()
    assert differences(in_process, through_testee) == []


def test_a_buffer_id_of_0_is_an_id_and_none_is_no_id():
    ids: dict[int, int] = {}
    received = []  # kept, so no python id is reused
    for reported in (0, None, 7):
        message = protocol.MESSAGES["Value"]()
        protocol.to_proto(np.ones(2, np.float32), message, lambda value, found=reported: found)
        received.append(protocol.from_proto(message, ids))
        assert ids.get(id(received[-1])) == reported
    older = protocol.MESSAGES["Value"]()  # a sender without has_buffer_id: 0 meant "unknown"
    older.tensor.dtype, older.tensor.data, older.tensor.buffer_id = "float32", b"\0" * 4, 0
    older.tensor.shape.append(1)
    received.append(protocol.from_proto(older, ids))
    assert id(received[-1]) not in ids


def test_the_hello_lists_held_runs_only_for_an_adapter_that_holds_them(at_root):
    for spec, holds in (("reference", True), ("onnx-reference", False)):
        testee = load_adapter(testee=serve_command(spec), timeout=60.0)
        try:
            assert testee.supports_hold is holds
        finally:
            testee.shutdown()


def _parity_names() -> set[str]:
    return {name.strip() for name in os.environ.get(PARITY_VARIABLE, "").split(",") if name.strip()}


def test_the_parity_variable_names_shipped_adapters():
    if not _parity_names():
        pytest.skip(f"{PARITY_VARIABLE} is not set (e.g. {PARITY_VARIABLE}=reference,onnxruntime; CI sets it)")
    assert _parity_names() <= set(BUILTIN), f"{PARITY_VARIABLE} names no shipped adapter: " \
                                            f"{sorted(_parity_names() - set(BUILTIN))}"


@pytest.mark.parametrize("name", sorted(BUILTIN))
def test_a_whole_run_through_the_testee_gets_the_in_process_verdicts(at_root, name):
    if name not in _parity_names():
        pytest.skip(f"whole runs compare the adapters {PARITY_VARIABLE} names (e.g. "
                    f"{PARITY_VARIABLE}=reference,onnxruntime)")
    adapter = _load_or_skip(name)
    cases = load_cases()
    try:
        in_process, _ = run(cases, RunConfig(adapter=name, progress=False), adapter)
    finally:
        if hasattr(adapter, "shutdown"):
            adapter.shutdown()
    through_testee, _ = run(cases, RunConfig(testee=serve_command(name), progress=False))
    # Profiles observable only in process (the testee client never claims them) are not supported
    # through the testee by design; every other verdict must be the same.
    in_process_only = {case.id for case in cases if case.profile in IN_PROCESS_PROFILES}
    unclaimed = [result.id for result in through_testee
                 if result.id in in_process_only and result.verdict != NOT_SUPPORTED]
    assert unclaimed == [], f"in-process-only cases ran through the testee: {unclaimed}"
    found = differences([result for result in in_process if result.id not in in_process_only],
                        [result for result in through_testee if result.id not in in_process_only])
    assert found == [], f"{len(found)} of {len(cases)} verdicts differ:\n" + "\n".join(found)

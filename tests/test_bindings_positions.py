"""The cases of corpus/cases/bindings/positions.toml: one offending binding, initial or reset value, bound
output or paged-cache block at the first, a middle and the last of three positions. The reference passes
every case; a runtime that checks only the first item (or only the last) fails the cases of the other
positions."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from conformance.adapters.reference import ReferenceAdapter
from conformance.audit.fault import Fault, wrap
from conformance.cases import load_cases
from conformance.execute import FAILED, PASSED, run_case
from reference_impl import ContractError
from reference_impl import bindings as bindings_module
from reference_impl import state as state_module
from reference_impl.kv import paged
from reference_impl.values import StructValue, compile_type

#: the manifests the cases were filed in, one per area
_SOURCES = ("cases/bindings/positions.toml", "cases/kv/positions.toml", "cases/state/positions.toml",
            "cases/zero_copy/positions.toml")


@functools.cache
def _cases() -> dict:
    return {case.id: case for case in load_cases() if case.source in _SOURCES}


def _ids(*parts: str, where=("First", "Middle", "Last")) -> set[str]:
    return {f"{part}{w}" for part in parts for w in where}


class BindingsCheckedAt(Fault):
    """Validates one binding (the first, or the last) and resolves the others unchecked."""

    def __init__(self, which: int, retains_strings: bool = False):
        super().__init__()
        self.which, self.retains_strings = which, retains_strings
        self.fault_id = f"BIND-COMPATIBLE.only-binding-{which}-checked"

    def patches(self):
        which = self.which

        def make(original):
            def validate(model, catalogue=None):
                checked = type(model)()
                checked.CopyFrom(model)
                chosen = model.graph.persistent_bindings[which]
                del checked.graph.persistent_bindings[:]
                checked.graph.persistent_bindings.add().CopyFrom(chosen)
                original(checked, catalogue)
                inputs = {vi.name: vi for vi in model.graph.input}
                return tuple(bindings_module.Binding(b.input_name, b.output_name,
                                                     compile_type(inputs[b.input_name].type, catalogue or
                                                                  bindings_module.Catalogue(model.struct_types), ""),
                                                     f"model.graph.persistent_bindings[{i}]")
                             for i, b in enumerate(model.graph.persistent_bindings))
            return validate
        patches = [wrap(bindings_module, "validate_bindings", make)]
        if self.retains_strings:  # and its retention takes a string array like any other object array
            patches.append(wrap(state_module, "holds_strings", lambda original: lambda array: False, aliases=False))
        return patches


class ValuesCheckedAt(Fault):
    """Checks one of the values a call hands over (initial or reset values, or the bound outputs about to
    be published): the first, or the last; the others are taken as they come (missing ones as zeros,
    ownerless ones copied)."""

    def __init__(self, which: int):
        super().__init__()
        self.which = which
        self.fault_id = f"STATE-VALIDATE-METADATA.only-value-{which}-checked"

    def patches(self):
        which = self.which

        def lenient(state, values, names):
            chosen = names[which]
            for name in names:
                if name != chosen:
                    value = values.get(name)
                    values[name] = np.zeros(2, np.float32) if value is None or value.shape != (2,) \
                        or value.dtype != np.float32 else value.copy()
            return values

        def make_initial(original):
            def initial_values(self, initial):
                names = [b.input_name for b in self._bindings]
                return original(self, lenient(self, dict(initial), names))
            return initial_values

        def make_adopt_any(original):
            def adopt_bound(self, outputs, caller_objects):
                names = [output for _, output, _, _ in self._plan]
                return original(self, lenient(self, dict(outputs), names), caller_objects)
            return adopt_bound

        return [wrap(state_module.State, "_initial_values", make_initial, aliases=False),
                wrap(state_module.State, "_adopt_bound", make_adopt_any, aliases=False)]


class BlocksCheckedAt(Fault):
    """Checks one block of a caller's paged cache (the first, or the last); a bad block elsewhere is
    dropped from the table instead of refused."""

    def __init__(self, which: int):
        super().__init__()
        self.which = which
        self.fault_id = f"KV-PAGED-RANGE.only-block-{which}-checked"

    def patches(self):
        which = self.which

        def make(original):
            def from_struct(cls, value, *args, **kwargs):
                try:
                    return original.__func__(cls, value, *args, **kwargs)
                except ContractError:
                    blocks = list(value["blocks"])
                    if not blocks:
                        raise
                    chosen = blocks[which]
                    kept = StructValue({"blocks": [chosen], "length": np.array(int(chosen["valid_length"]))},
                                       value.type_id)
                    return original.__func__(cls, kept, *args, **kwargs)
            return classmethod(from_struct)
        return [wrap(paged.PagedKVCache, "from_struct", lambda original: make(
            paged.PagedKVCache.__dict__["from_struct"]), aliases=False)]


def test_every_case_passes_on_the_reference():
    failed = {case_id: run_case(case, ReferenceAdapter()).message for case_id, case in sorted(_cases().items())
              if run_case(case, ReferenceAdapter()).verdict != PASSED}
    assert not failed


REQ_B, REQ_S, REQ_Z, REQ_K = ("Required.Bindings.Positions.", "Required.State.Positions.",
                              "Required.ZeroCopy.Positions.", "Required.KV.PagedBlockPositions.")


@pytest.mark.parametrize(("fault", "caught_at"), [
    (lambda: BindingsCheckedAt(0), ("Middle", "Last")),
    (lambda: BindingsCheckedAt(-1), ("First", "Middle")),
])
def test_a_runtime_checking_one_binding_fails_the_other_positions(fault, caught_at):
    wanted = _ids(REQ_B + "UnknownOutput", REQ_B + "ElementType", REQ_B + "Dimension", where=caught_at)
    verdicts = {case_id: run_case(_cases()[case_id], fault()).verdict for case_id in sorted(wanted)}
    assert {case_id for case_id, verdict in verdicts.items() if verdict != FAILED} == set()


@pytest.mark.parametrize(("which", "caught_at"), [(0, ("Middle", "Last")), (-1, ("First", "Middle"))])
def test_a_runtime_checking_one_binding_for_strings_fails_the_other_positions(which, caught_at):
    """The reference's retention refuses a string array too; a runtime whose retention takes it as an
    object array leaves the one-binding check alone to catch it."""
    wanted = _ids(REQ_B + "String", where=caught_at)
    fault = BindingsCheckedAt(which, retains_strings=True)
    verdicts = {case_id: run_case(_cases()[case_id], fault).verdict for case_id in sorted(wanted)}
    assert {case_id for case_id, verdict in verdicts.items() if verdict != FAILED} == set()


@pytest.mark.parametrize(("fault", "caught_at"), [
    (lambda: ValuesCheckedAt(0), ("Middle", "Last")),
    (lambda: ValuesCheckedAt(-1), ("First", "Middle")),
])
def test_a_runtime_checking_one_value_fails_the_other_positions(fault, caught_at):
    wanted = _ids(REQ_S + "InitialMissing", REQ_S + "ResetMissing", REQ_S + "InitialShape", REQ_S + "ResetShape",
                  REQ_S + "InitialElementType", REQ_S + "ResetElementType", REQ_S + "OutputGrows",
                  REQ_Z + "OwnerlessInitial", REQ_Z + "OwnerlessReset", where=caught_at)
    verdicts = {case_id: run_case(_cases()[case_id], fault()).verdict for case_id in sorted(wanted)}
    assert {case_id for case_id, verdict in verdicts.items() if verdict != FAILED} == set()


@pytest.mark.parametrize(("fault", "caught_at"), [
    (lambda: BlocksCheckedAt(0), ("Middle", "Last")),
    (lambda: BlocksCheckedAt(-1), ("First", "Middle")),
])
def test_a_runtime_checking_one_block_fails_the_other_positions(fault, caught_at):
    wanted = _ids(REQ_K + "WrongHeads", REQ_K + "ValidBeyondSlots", REQ_K + "AffinePayloadShort", where=caught_at)
    # A 3-head key block ahead of the blocks a last-only check reads is still refused: the declared block
    # type fixes the head count, and the reference's type check reads every block.
    wanted -= {REQ_K + "WrongHeadsFirst"}
    verdicts = {case_id: run_case(_cases()[case_id], fault()).verdict for case_id in sorted(wanted)}
    assert {case_id for case_id, verdict in verdicts.items() if verdict != FAILED} == set()

"""Position cases (corpus/cases/<area>/positions.toml): every list a check walks, with the offending item first,
in the middle and last. The reference rejects all three; a check that looks only at the first item, only
at the last, or only at both ends (the unchecked items taken as valid: here replaced by a copy of a checked
item under their own name or type_id, or for a retained value's sequence elements and struct fields by a
checked item's value) accepts exactly the positions it skips."""

from __future__ import annotations

import functools

import pytest

from conformance import values as V
from conformance.adapters.reference import ReferenceAdapter
from conformance.cases import load_cases
from conformance.execute import FAILED, PASSED, run_case
from reference_impl import schema

SOURCES = {f"cases/{area}/positions.toml"
           for area in ("affine", "catalogue", "declarations", "encoding", "export", "external", "structured")}
POSITIONS = ("First", "Middle", "Last")


@functools.cache
def _cases() -> dict:
    return {case.id: case for case in load_cases() if case.source in SOURCES}


def _lists(model, slot: str):
    """The repeated fields the slot's check walks."""
    if slot == "catalogue":
        return [model.struct_types]
    if slot in ("field", "encoded_field"):
        return [d.structure.field for d in model.struct_types if d.HasField("structure")]
    if slot == "component":
        return [d.bit_packing.component for d in model.struct_types if d.HasField("bit_packing")]
    if slot in ("input", "output", "value_info"):
        return [getattr(model.graph, slot)]
    if slot == "export_input":
        return [model.graph.input]
    if slot in ("if_node", "loop_node"):
        return [model.graph.node]
    return [model.graph.encoded_initializer]


class ChecksOnly(ReferenceAdapter):
    """The reference, except that the check of ``slot`` looks only at the items ``keep`` selects."""

    def __init__(self, slot: str, keep: str) -> None:
        super().__init__()
        self.slot, self.keep = slot, keep

    def _seen(self, model_bytes: bytes) -> bytes:
        model = schema.parse_model(bytes(model_bytes))
        for items in _lists(model, self.slot):
            count = len(items)
            checked = {"first": [0], "last": [count - 1], "ends": [0, count - 1]}[self.keep]
            for index in range(count):
                if index in checked:
                    continue
                item = items[index]
                kept = {key: getattr(item, key) for key in ("name", "type_id") if item.HasField(key)} \
                    if hasattr(item, "type_id") else {}
                name = getattr(item, "name", None)
                outputs = list(item.output) if self.slot in ("if_node", "loop_node") else None
                item.CopyFrom(items[checked[0]])
                for key, value in kept.items():
                    setattr(item, key, value)
                if name is not None and not kept:
                    item.name = name
                if outputs is not None:
                    del item.output[:]
                    item.output.extend(outputs)
        return model.SerializeToString()

    def verify(self, model_bytes, base_dir=None):
        return super().verify(self._seen(model_bytes), base_dir)

    def export(self, model_bytes, target, base_dir=None):
        return super().export(self._seen(model_bytes), target, base_dir)


class ValuesCheckedOnly(ReferenceAdapter):
    """The reference, except that the metadata of a retained value's sequence elements or struct fields
    is checked for the items ``keep`` selects only (the others are taken as valid: replaced by a copy of
    a checked item)."""

    def __init__(self, keep: str) -> None:
        super().__init__()
        self.keep = keep

    def open_state(self, model_bytes, initial, base_dir=None):
        return super().open_state(model_bytes, {name: self._seen(value) for name, value in initial.items()}, base_dir)

    def _seen(self, value):
        if isinstance(value, list):
            return [value[index] for index in self._indices(len(value))]
        if isinstance(value, V.Struct):
            names = list(value)
            return V.Struct({name: value[names[index]] for name, index in zip(names, self._indices(len(names)))},
                            value.type_id)
        return value

    def _indices(self, count: int) -> list[int]:
        """For each item, the checked item whose metadata stands for it."""
        checked = {"first": [0], "last": [count - 1], "ends": [0, count - 1]}[self.keep]
        return [index if index in checked else checked[0] for index in range(count)]


def _families() -> dict:
    """{case ID without its position: the slot (``value`` for a retained value's items)}"""
    return {case_id[: -len(position)]: _cases()[case_id].args.get("slot", "value")
            for case_id in _cases() for position in POSITIONS if case_id.endswith(position)}


def test_every_family_has_the_three_positions():
    families = _families()
    assert len(families) * 3 == len(_cases()) >= 100
    for family in families:
        assert {family + position for position in POSITIONS} <= set(_cases())


@pytest.mark.parametrize("case_id", sorted(_cases()))
def test_the_reference_rejects_every_position(case_id):
    result = run_case(_cases()[case_id], ReferenceAdapter(), require_codes=True)
    assert result.verdict == PASSED, result.message


#: which positions a check of only these items lets through
SKIPPED = {"first": ("Middle", "Last"), "last": ("First", "Middle"), "ends": ("Middle",)}


@pytest.mark.parametrize("family", sorted(_families()))
@pytest.mark.parametrize("keep", sorted(SKIPPED))
def test_a_check_of_some_items_only_fails_the_positions_it_skips(family, keep):
    slot = _families()[family]
    adapter = ValuesCheckedOnly(keep) if slot == "value" else ChecksOnly(slot, keep)
    for position in POSITIONS:
        result = run_case(_cases()[family + position], adapter)
        expected = FAILED if position in SKIPPED[keep] else PASSED
        assert result.verdict == expected, f"{keep}-only check on {family}{position}: {result.message}"

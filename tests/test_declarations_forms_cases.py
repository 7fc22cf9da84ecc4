"""Declaration forms (corpus/cases/declarations/declaration_forms.toml): a malformed declaration is rejected wherever
it stands and however it is written. The reference rejects every case and accepts each place's valid
body; each faulty validator below skips the structural checks of one form of declaration and fails
exactly the cases of that form."""

from __future__ import annotations

import functools

import pytest

from conformance.adapters.reference import ReferenceAdapter
from conformance.audit.fault import Fault, wrap
from conformance.cases import load_cases
from conformance.execute import FAILED, PASSED, run_case
from reference_impl import structs

PREFIX = "Required.Declarations.Forms."
NESTED = ("ArrayElement", "SequenceElement", "MapValue", "OptionalElement", "InputSequence")
#: the places inside a catalogue declaration (declaration 5 of the builder)
IN_CATALOGUE = ("Field", "ArrayElement", "SequenceElement", "MapValue", "OptionalElement")


@functools.cache
def _cases() -> dict:
    return {case.id: case for case in load_cases() if case.source == "cases/declarations/declaration_forms.toml"}


class SkipsStructuralChecks(Fault):
    """``check_struct`` returns at once for the declarations ``skipped(role, path)`` selects (their
    fields, components and counts are never looked at); every other declaration is checked."""

    def __init__(self, label: str, skipped) -> None:
        super().__init__()
        self.fault_id, self.skipped = f"DECL-WELLFORMED.unchecked-{label}", skipped

    def patches(self):
        def make(original):
            def check_struct(st, path, catalogue, role, depth=0, refs=None):
                if structs.struct_kind(st) not in (None, "type_ref") and self.skipped(role, path):
                    return depth
                return original(st, path, catalogue, role, depth, refs)
            return check_struct
        return [wrap(structs, "check_struct", make)]


def _nested(path: str) -> bool:
    return any(part in path for part in (".array.element_type", ".sequence_type", ".map_type", ".optional_type"))


FAULTS = {
    # trusts the catalogue: only bodies written in the graph are checked (a declaration's own inline
    # fields are never reached)
    "graph-only": (SkipsStructuralChecks("catalogue", lambda role, path: role == "declaration"),
                   lambda case_id: case_id.endswith("Referenced")
                   or any(case_id.endswith(form + "Inline") for form in IN_CATALOGUE)),
    # checks the catalogue only: inline bodies (in types and layouts) are never looked at
    "catalogue-only": (SkipsStructuralChecks("inline", lambda role, path: role != "declaration"),
                       lambda case_id: case_id.endswith("Inline")),
    # inline bodies are checked at the top of a type only, not inside arrays, sequences, maps, optionals
    "top-level-only": (SkipsStructuralChecks("nested-inline", lambda role, path: role != "declaration"
                                             and _nested(path)),
                       lambda case_id: case_id.endswith("Inline") and any(f + "Inline" in case_id for f in NESTED)),
}


def test_every_fault_form_and_writing_is_present():
    forms = ("Field", "ArrayElement", "SequenceElement", "MapValue", "OptionalElement", "Input", "InputSequence",
             "BoundInput", "Layout", "IfBranch")
    faults = ("DuplicateField", "BitWidthZero", "FieldContentMissing", "ArrayDimensionZero")
    # a zero array length is refused by the suite's choice (docs/audit/recommended-only.md): Recommended
    level = {fault: "Recommended." if fault == "ArrayDimensionZero" else "Required." for fault in faults}
    assert set(_cases()) == {PREFIX.replace("Required.", level[fault]) + fault + form + written
                             for fault in faults for form in forms for written in ("Inline", "Referenced")}


@pytest.mark.parametrize("case_id", sorted(_cases()))
def test_the_reference_rejects_every_form(case_id):
    result = run_case(_cases()[case_id], ReferenceAdapter(), require_codes=True)
    assert result.verdict == PASSED, result.message


def test_the_valid_body_is_accepted_in_every_form():
    from corpus.builders.declarations_forms import FORMS, declaration_form
    from reference_impl.verifier import verify_model

    for form in FORMS:
        for written in ("Inline", "Referenced"):
            verify_model(declaration_form(form, "Valid", written)["model"])


@pytest.mark.parametrize("label", sorted(FAULTS))
def test_a_validator_skipping_one_form_fails_exactly_its_cases(label):
    fault, misses = FAULTS[label]
    failed = {case_id for case_id, case in _cases().items() if run_case(case, fault).verdict == FAILED}
    assert failed == {case_id for case_id in _cases() if misses(case_id)}

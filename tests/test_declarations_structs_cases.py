"""Declaration rows and depth cases of corpus/cases/declarations/structs.toml that reach rules no other case
did: sparse tensor types inside a declaration, a zero-length constant, and the 64-level nesting limit reached
through a graph input's type and through a layout whose deepest level is a type_ref expansion. The reference
passes each case, and each fails a runtime with one plausible bug, written here as a small fault. Levels are
counted by hand in corpus/builders/limits.py."""

from __future__ import annotations

import functools

import pytest
from fault_catchers import wrong_runtime_tests

from conformance.audit.fault import Fault, wrap
from conformance.cases import load_cases
from corpus.builders import limits
from reference_impl import structs
from reference_impl.errors import ErrorCode as E
from reference_impl.errors import violation

_SPARSE = ("Required.Declarations.Malformed.SparseUnknownElementType",
           "Required.Declarations.Malformed.SparseNegativeDimension")
_ZERO_LENGTH = "Required.Declarations.Valid.ConstantZeroLength"
_INPUT_BEYOND = "Recommended.Declarations.Depth.GraphInputReferenceJustBeyond"
_INPUT_AT = "Recommended.Declarations.Depth.GraphInputReferenceAtTheLimit"
_LAYOUT_AT = "Recommended.Declarations.Depth.LayoutReferenceAtTheLimit"


@functools.cache
def _cases() -> dict:
    wanted = {*_SPARSE, _ZERO_LENGTH, _INPUT_BEYOND, _INPUT_AT, _LAYOUT_AT}
    return {case.id: case for case in load_cases() if case.id in wanted}


class SparseTypesUnchecked(Fault):
    """Applies ONNX's type rules to tensor_type only: a sparse_tensor_type is taken as it is."""

    fault_id = "DECL-TYPE-RULES.sparse-types-unchecked"

    def patches(self):
        def make(original):
            def check_type(tp, path, catalogue, depth=0, refs=None):
                if tp.WhichOneof("value") == "sparse_tensor_type":
                    return depth + 1
                return original(tp, path, catalogue, depth, refs)
            return check_type
        return [wrap(structs, "check_type", make)]


class ZeroLengthConstantRefused(Fault):
    """Reads "concrete dimensions" as positive ones: a constant with a zero dimension is refused."""

    fault_id = "DECL-CONSTANT.zero-length-refused"

    def patches(self):
        def make(original):
            def check_constant(tensor, path):
                if any(dim == 0 for dim in tensor.dims):
                    raise violation(E.CONSTANT_DIMS_INVALID, path, "a dimension is zero")
                return original(tensor, path)
            return check_constant
        return [wrap(structs, "check_constant", make)]


class GraphTypeReferencesUnmeasured(Fault):
    """Measures the depth of references inside declarations only: a type_ref in a graph value's type is
    resolved but its expansion's levels are not added to the levels around it."""

    fault_id = "DECL-DEPTH.graph-type-references-unmeasured"

    def patches(self):
        return [wrap(structs.Catalogue, "check_reference_depth", lambda original: lambda self, *args: None)]


class ReferenceLevelCountedTwice(Fault):
    """Counts a type_ref met outside the catalogue as two levels: one level short of the limit there."""

    fault_id = "DECL-DEPTH.reference-level-counted-twice"

    def patches(self):
        def make(original):
            def check_reference_depth(self, type_id, depth, path):
                return original(self, type_id, depth + 1, path)
            return check_reference_depth
        return [wrap(structs.Catalogue, "check_reference_depth", make)]


class LastExpansionRefused(Fault):
    """Sizing a layout, refuses a type_ref expansion that reaches level 64 (``>=`` for ``>``)."""

    fault_id = "DECL-DEPTH.last-expansion-refused"

    def patches(self):
        def make(original):
            def bit_size(self, st, path, depth=0):
                if structs.struct_kind(st) == "type_ref" and depth + 1 >= structs.MAX_DEPTH:
                    raise violation(E.NESTING_TOO_DEEP, path, "64 levels")
                return original(self, st, path, depth)
            return bit_size
        return [wrap(structs.Catalogue, "bit_size", make)]


CATCHERS = [
    (SparseTypesUnchecked(), _SPARSE),
    (ZeroLengthConstantRefused(), (_ZERO_LENGTH,)),
    (GraphTypeReferencesUnmeasured(), (_INPUT_BEYOND,)),
    (ReferenceLevelCountedTwice(), (_INPUT_AT,)),
    (LastExpansionRefused(), (_LAYOUT_AT,)),
]


test_the_reference_passes, test_the_bug_fails_its_cases, test_every_case_fails_some_bug = \
    wrong_runtime_tests(_cases, 6, CATCHERS)


def _levels(tp, level: int = 1) -> int:
    """Levels below and including ``tp``, following the declarations of the catalogue in ``_DECLS``."""
    which = tp.WhichOneof("value")
    if which == "sequence_type":
        return _levels(tp.sequence_type.elem_type, level + 1)
    if which == "struct_type":
        return _struct_levels(tp.struct_type, level)
    return level


_DECLS: dict = {}


def _struct_levels(st, level: int) -> int:
    kind = st.WhichOneof("kind")
    if kind == "type_ref":
        return _struct_levels(_DECLS[st.type_ref], level + 1)
    if kind == "structure":
        return max([level] + [_levels(f.type, level + 1) for f in st.structure.field if f.HasField("type")])
    return level


@pytest.mark.parametrize(("args", "deepest"),
                         [({"sequences": 30, "chain": 17}, 65), ({"sequences": 31, "chain": 16}, 64)])
def test_the_graph_input_levels_are_as_the_builder_says(args, deepest):
    """An independent count of the builder's model (every TypeProto and type_ref expansion one level)."""
    m = limits.inline_and_reference_nesting(graph_input=True, **args)["model"]
    _DECLS.clear()
    _DECLS.update({decl.type_id: decl for decl in m.struct_types})
    assert _levels(m.graph.input[0].type) == deepest


def test_the_layout_chain_reaches_level_64_at_its_last_expansion():
    m = limits.reference_chain_to_packing(depth=32)["model"]
    _DECLS.clear()
    _DECLS.update({decl.type_id: decl for decl in m.struct_types})
    layout = m.graph.encoded_initializer[0].struct_type
    assert _struct_levels(layout, 0) == 64 and _DECLS[32].WhichOneof("kind") == "bit_packing"
    assert len(m.graph.encoded_initializer[0].raw_data) == 31 + 1  # 31 UINT8 fields and one 8-bit component

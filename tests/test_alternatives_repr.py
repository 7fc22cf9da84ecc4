"""Soundness of the Required cases of corpus/cases/<area>/axes_and_tails.toml, boundaries.toml and
representation_paths.toml: toy runtimes, each the reference taking one choice the spec allows, pass
every one of them (and the forbidden behaviour each case is written against is still caught)."""

from __future__ import annotations

import pytest
from test_conformance_alternatives import ChecksOnnxTyping, _bodies

from conformance.adapters import Rejected
from conformance.adapters.reference import ReferenceAdapter
from conformance.cases import load_cases, select
from conformance.execute import FAILED, PASSED, run_case
from reference_impl import schema

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # decoded infinities and NaNs

CASES = load_cases()
SOURCES = ("axes_and_tails.toml", "boundaries.toml", "representation_paths.toml")
#: every Required case of the three files
REQUIRED = sorted(case.id for case in CASES if case.level == "Required" and case.source.endswith(SOURCES))


def _failures(adapter, *case_ids) -> dict[str, str]:
    chosen = select(CASES, list(case_ids))
    assert chosen, case_ids
    results = {case.id: run_case(case, adapter, timeout=120) for case in chosen}
    return {case_id: r.message for case_id, r in results.items() if r.verdict != PASSED}


def _fails(adapter, case_id: str) -> str:
    result = run_case(select(CASES, [case_id])[0], adapter, timeout=120)
    assert result.verdict == FAILED, (case_id, result.message)
    return result.message


# ------------------------------------------------------------------------------ ONNX's Loop typing
class ChecksLoopArity(ChecksOnnxTyping):
    """Also types every Loop node as ONNX does before anything else: its body takes the iteration count,
    the condition and the N carried values, and returns the condition, the N carried values and the K scan
    outputs, of which the node returns the last N + K. onnx.checker refuses a Loop breaking this ("Graph
    attribute inferencing returned type information for 1 outputs. Expected 2"), and so does this
    runtime, with its own code."""

    def _check(self, model_bytes: bytes) -> None:
        for body, _ in _bodies(schema.parse_model(model_bytes)):
            for node in body.node:
                if (node.domain, node.op_type) != ("", "Loop"):
                    continue
                loop = next(a.g for a in node.attribute if a.name == "body")
                carried = len(node.input) - 2
                if len(loop.input) != 2 + carried or len(node.output) != len(loop.output) - 1 \
                        or len(loop.output) < 1 + carried:
                    raise Rejected("TYPE_INVALID", f"Loop {node.name!r}: outputs do not match its body")
        super()._check(model_bytes)


@pytest.mark.clause("INIT-NAMES-UNIQUE")
def test_a_runtime_typing_loops_as_onnx_does_passes_every_required_case_of_the_files():
    assert len(REQUIRED) == 79
    assert not _failures(ChecksLoopArity(), *REQUIRED)
    # while a runtime checking initializer names in the root graph only is still caught by the Loop body
    from conformance.audit.faults.naming import NamesUniqueInRootGraphOnly

    assert "accepted" in _fails(NamesUniqueInRootGraphOnly(), "Required.Naming.Initializers.DuplicateInLoopBody")


# --------------------------------------------------------------- a registry pinning nested codecs too
def _nested_codecs(model) -> set[int]:
    """The IDs of catalogue declarations that a registered root reaches through type_refs and that name a
    decoder or encoder of their own (the spec's registered declarations reach none)."""
    from conformance.audit.fault import type_refs
    from reference_impl.decoders import default_registry

    declarations = {d.type_id: d for d in model.struct_types}
    registered = default_registry()
    found = set()
    for graph in _bodies(model):
        for value in getattr(graph[0], "encoded_initializer", ()):
            if value.WhichOneof("layout") != "struct_type" or value.struct_type.type_ref not in registered:
                continue
            pending, seen = [value.struct_type.type_ref], set()
            while pending:
                type_id = pending.pop()
                if type_id in seen or type_id not in declarations:
                    continue
                seen.add(type_id)
                nested = declarations[type_id]
                if type_id != value.struct_type.type_ref and (nested.HasField("decoder") or nested.HasField("encoder")):
                    found.add(type_id)
                pending += type_refs(nested)
    return found


class PinsNestedCodecs(ReferenceAdapter):
    """Its registrations pin the whole resolved declaration, the codecs its subtypes declare included
    ("Native bindings are keyed by type_id and verify the resolved declaration"): a registered root whose
    subtype gained a decoder or encoder under its ID is a declaration it has no consumer for, refused with
    CONSUMER_MISSING, as MismatchIsMissingConsumer (tests/test_conformance_alternatives.py) reports a
    mismatch. It never invokes the subtype's codec."""

    code = "CONSUMER_MISSING"

    def _check(self, model_bytes: bytes) -> None:
        changed = _nested_codecs(schema.parse_model(model_bytes))
        if changed:
            raise Rejected(self.code, f"no consumer for a root whose subtypes {sorted(changed)} name codecs")

    def decode(self, model_bytes, value_name, base_dir):
        self._check(model_bytes)
        return super().decode(model_bytes, value_name, base_dir)

    def open_state(self, model_bytes, initial, base_dir=None):
        self._check(model_bytes)
        return super().open_state(model_bytes, initial, base_dir)


#: the two cases whose subtypes name codecs no runtime has; a refusal, with either code, is allowed by both
NESTED_CODEC_CASES = ("Required.State.Consumers.NestedSubtypeCodecsNeverRun",
                      "Required.Structured.Consumers.NestedDecoderIgnored")


class PinsNestedCodecsAsMismatch(PinsNestedCodecs):
    """The same refusal, reported as DECODER_MISMATCH."""

    code = "DECODER_MISMATCH"


@pytest.mark.clause("DEC-KEYED", "DEC-ROOT-ONLY")
def test_a_registry_pinning_nested_codecs_passes_every_required_case_of_the_files():
    assert not _failures(PinsNestedCodecs(), *REQUIRED, *NESTED_CODEC_CASES)
    assert not _failures(PinsNestedCodecsAsMismatch(), *REQUIRED, *NESTED_CODEC_CASES)


@pytest.mark.clause("DEC-KEYED", "DEC-ROOT-ONLY")
def test_a_registry_pinning_nested_codecs_may_refuse_with_either_code():
    """A mismatch is the same refusal as a missing consumer (MismatchIsMissingConsumer): both codes are
    allowed, and both runtimes really refuse here rather than pass by decoding."""
    for adapter in (PinsNestedCodecs(), PinsNestedCodecsAsMismatch()):
        assert not _failures(adapter, *NESTED_CODEC_CASES)
        assert "no consumer for a root whose subtypes [1101]" in _refusal(adapter, NESTED_CODEC_CASES[1])


def _refusal(adapter, case_id: str) -> str:
    """The message of the refusal ``adapter`` gives when decoding the case's value."""
    case = select(CASES, [case_id])[0]
    with pytest.raises(Rejected) as refused:
        adapter.decode(case.model_bytes(), case.value, None)
    assert refused.value.code == adapter.code
    return refused.value.message


# ------------------------------------------------------------------- the order of the affine checks
class ChecksScaleRankBeforeAxis(ReferenceAdapter):
    """Refuses a per-axis scale that is not one-dimensional before it normalizes the axis: "Setting axis
    selects per-axis parameters", and a per-axis parameter is a vector whatever the axis says. The spec
    orders no two checks, so a layout breaking both rules may be refused for either; a case expecting one
    code must break one rule only."""

    def _check(self, model_bytes: bytes) -> None:
        for value in schema.parse_model(model_bytes).graph.encoded_initializer:
            layout = value.affine
            if value.WhichOneof("layout") == "affine" and layout.HasField("axis") and not layout.block_size \
                    and len(layout.scale.dims) != 1:
                raise Rejected("AFFINE_PARAM_SHAPE", f"{value.name}: a per-axis scale is one-dimensional")

    def verify(self, model_bytes, base_dir):
        self._check(model_bytes)
        return super().verify(model_bytes, base_dir)

    def decode(self, model_bytes, value_name, base_dir, *args, **kwargs):
        self._check(model_bytes)
        return super().decode(model_bytes, value_name, base_dir, *args, **kwargs)


AXIS_CASES = ["Required.Affine.Positions.AxisOutOfRange*", "Required.Affine.Axis.*"]


@pytest.mark.clause("AFF-AXIS", "AFF-DQ")
def test_a_runtime_checking_the_scale_rank_before_the_axis_passes_the_axis_cases():
    assert len(select(CASES, ["Required.Affine.Positions.AxisOutOfRange*"])) == 3
    assert not _failures(ChecksScaleRankBeforeAxis(), *AXIS_CASES)


def test_a_scalar_scale_with_an_axis_out_of_range_breaks_two_rules():
    """Why the out-of-range axis cases give a one-dimensional scale: with a scalar one, the reference and a
    runtime checking the scale first refuse the same layout with different codes, both right."""
    case = select(CASES, ["Required.Affine.Positions.AxisOutOfRangeFirst"])[0]
    model = schema.parse_model(case.model_bytes())
    scale = model.graph.encoded_initializer[0].affine.scale
    del scale.dims[:]
    del scale.float_data[1:]
    both = model.SerializeToString()
    codes = []
    for adapter in (ReferenceAdapter(), ChecksScaleRankBeforeAxis()):
        with pytest.raises(Exception) as refused:
            adapter.verify(both, None)
        codes.append(getattr(refused.value, "code", None))
    assert [getattr(code, "value", code) for code in codes] == ["AFFINE_AXIS_INVALID", "AFFINE_PARAM_SHAPE"]

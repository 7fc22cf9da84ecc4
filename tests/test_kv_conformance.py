"""KV conformance cases: the reference passes them in process and through the testee, the peers pass
or answer "not supported", injected KV faults are caught, and the builders' format arithmetic agrees
with onnx's DequantizeLinear and the spec's codebook example."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from conformance.adapters import Rejected, load_adapter
from conformance.adapters.reference import ReferenceAdapter
from conformance.audit.fault import Fault, wrap
from conformance.audit.faults.kv_paged import KVZeroPointsDropped
from conformance.cases import builders, load_cases, select
from conformance.execute import FAILED, NOT_SUPPORTED, PASSED, run_case
from reference_impl import affine
from reference_impl.clauses import CLAUSES
from reference_impl.errors import ErrorCode

KV = ["Required.KV", "Recommended.KV"]
CASES = select(load_cases(), KV)
NEW_TOPICS = ("PagedFormats", "PagedConversion", "PagedBlockTable", "PagedCapacity", "PagedOwnership", "Capacity")


def _verdicts(adapter, patterns=KV) -> dict:
    return {case.id: run_case(case, adapter) for case in select(load_cases(), patterns)}


def _failed(results: dict) -> list[str]:
    return sorted(case_id for case_id, r in results.items() if r.verdict == FAILED)


# ---------------------------------------------------------------------------------- catalogue
def test_kv_cases_cover_the_topics_cite_clauses_and_say_where_expectations_come_from():
    topics = {case.id.split(".")[2] for case in CASES}
    assert set(NEW_TOPICS) <= topics
    codes = {code.value for code in ErrorCode}
    for case in CASES:
        assert case.clauses and set(case.clauses) <= set(CLAUSES), case.id
        assert case.expectation_source in ("numpy", "hand", "spec"), case.id
        for step in case.extras()["steps"]:
            cause = step.get("cause", [])
            assert set([step.get("error", "STATE_BUSY"), *step.get("also", []), *cause]) <= codes, case.id
    formats = " ".join(str(case.args) for case in CASES)
    for name in ("int8", "uint8", "int4", "uint4", "int2", "uint2", "codebook2"):
        assert f"'{name}" in formats or f"{name}:" in formats, name


# ---------------------------------------------------------------------------------- execution
def test_reference_passes_every_kv_case_in_process():
    results = _verdicts(ReferenceAdapter())
    assert all(r.verdict == PASSED for r in results.values()), [(k, r.message) for k, r in results.items()
                                                                 if r.verdict != PASSED]


def test_reference_passes_every_kv_case_through_the_testee():
    adapter = load_adapter(testee=f"{sys.executable} -m conformance.testee")
    try:
        results = _verdicts(adapter)
    finally:
        adapter.shutdown()
    assert all(r.verdict == PASSED for r in results.values()), [(k, r.message) for k, r in results.items()
                                                                 if r.verdict != PASSED]


@pytest.mark.parametrize("peer", ["onnx-reference", "onnxruntime"])
def test_peers_pass_or_do_not_support_the_new_kv_cases(peer):
    if peer == "onnxruntime":
        pytest.importorskip("onnxruntime")
    results = _verdicts(load_adapter(peer), [f"*.KV.{topic}.*" for topic in NEW_TOPICS] + ["Required.KV.Contiguous"])
    assert _failed(results) == []
    verdicts = {case_id: r.verdict for case_id, r in results.items()}
    assert verdicts["Required.KV.Contiguous.CancelledAppendLeavesCache"] == NOT_SUPPORTED  # no cancellation
    assert verdicts["Required.KV.Contiguous.BranchesFromASharedPrefix"] == PASSED
    assert {v for k, v in verdicts.items() if ".Paged" in k} == {NOT_SUPPORTED}


# ------------------------------------------------------------------------------ injected faults
def test_in_place_append_behind_a_shared_prefix_is_caught(monkeypatch):
    """Appending into spare capacity whenever it fits, ignoring who else extends the same prefix."""
    from reference_impl.kv.storage import KVStorage

    def naive(storage, length, needed):
        if needed > storage.capacity:
            return False
        storage.claimed = needed
        return True

    monkeypatch.setattr(KVStorage, "reserve", naive)
    assert _failed(_verdicts(ReferenceAdapter(), ["*.KV.*.Branches*"])) == [
        "Required.KV.Contiguous.BranchesFromASharedPrefix", "Required.KV.PagedOwnership.BranchesFromAHeldCache"]


def test_a_cancellation_that_keeps_the_new_values_is_caught():
    """The run completes and publishes its values, then reports STATE_CANCELLED: the caller is told nothing
    changed while the state moved on. (Completing the run and saying so is allowed:
    tests/test_kv_alternatives.py.)"""
    class CancelledButPublished(ReferenceAdapter):
        def open_state(self, *args):
            handle = super().open_state(*args)

            def run_cancelled(feeds):
                handle.run(feeds)
                raise Rejected("STATE_CANCELLED", "cancelled")

            handle.run_cancelled = run_cancelled
            return handle

    assert _failed(_verdicts(CancelledButPublished(), ["*.KV.*.Cancelled*"])) == [
        "Required.KV.Contiguous.CancelledAppendLeavesCache", "Required.KV.PagedOwnership.CancelledAppendLeavesCache"]


def test_dropped_zero_points_and_skipped_conversion_are_caught(monkeypatch):
    from reference_impl.kv import paged

    decoding = ["Required.KV.PagedFormats", "Recommended.KV.PagedFormats"]
    caught = _failed(_verdicts(KVZeroPointsDropped(), decoding))
    assert caught == sorted(c.id for c in select(load_cases(), decoding))  # all use uint*
    monkeypatch.setattr(paged, "seal", lambda block, *args: block)  # full blocks stay dense
    results = _verdicts(ReferenceAdapter(), ["Recommended.KV.PagedConversion"])
    assert all(r.verdict == FAILED and "expected an encoded value" in r.message for r in results.values())


# --------------------------------------------------------------------------- builder arithmetic
@pytest.mark.parametrize("fmt", ["int8", "uint8", "int4", "uint4", "int2", "uint2", "int4/4", "uint2/2"])
def test_affine_blocks_decode_as_onnx_dequantize_linear(fmt):
    from onnx import TensorProto, helper, numpy_helper
    from onnx.reference import ReferenceEvaluator

    builders()  # loads the builder package
    from corpus.builders.kv_formats import AFFINE, dequantize_affine, encode

    x = np.random.default_rng(3).standard_normal((3, 2, 8)).astype(np.float32) * 2
    value, decoded = encode(x, fmt)
    layout = value.affine
    data_type = AFFINE[fmt.partition("/")[0]][0]
    inputs = [helper.make_tensor("codes", data_type, x.shape, vals=value.raw_data, raw=True),
              numpy_helper.from_array(np.frombuffer(layout.scale.raw_data, "<f4").reshape(layout.scale.dims), "s")]
    if layout.HasField("zero_point"):
        inputs.append(helper.make_tensor("z", data_type, layout.scale.dims, vals=layout.zero_point.raw_data, raw=True))
    node = helper.make_node("DequantizeLinear", [t.name for t in inputs], ["y"], axis=2, block_size=layout.block_size)
    graph = helper.make_graph([node], "dq", [], [helper.make_tensor_value_info("y", TensorProto.FLOAT, x.shape)],
                              inputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 25)], ir_version=11)
    (reference,) = ReferenceEvaluator(model).run(None, {})
    np.testing.assert_array_equal(decoded, reference)
    np.testing.assert_array_equal(dequantize_affine(value), reference)
    step = np.max(np.abs(np.frombuffer(layout.scale.raw_data, "<f4")))
    assert np.max(np.abs(decoded - x)) <= step * (1.0 if fmt.startswith("u") else 0.5) + 1e-6


def test_codebook_block_matches_the_spec_example():
    """The spec: indices 0, 1, 2, 3 pack as E4; 00 00 00 40 is the FLOAT scale 2.0; the block decodes to
    [-2.0, -0.5, 0.5, 2.0] repeated eight times."""
    builders()
    from corpus.builders.kv_formats import encode

    x = np.tile(np.array([-2.0, -0.5, 0.5, 2.0], np.float32), 8).reshape(4, 2, 4)
    value, decoded = encode(x, "codebook2")
    assert value.struct_type.type_ref == 1102
    assert value.raw_data == bytes.fromhex("E4" * 8 + "00000040")
    np.testing.assert_array_equal(decoded, x)


# ------------------------------------------------------------------------------ valid fixtures
def _kindless_outside_collections(model) -> list[str]:
    """Paths of kind-less struct types that are not a sequence or map element (the spec permits an
    unconstrained category only there)."""
    found = []

    def visit(tp, path, element=False):
        which = tp.WhichOneof("value")
        if which == "struct_type":
            st = tp.struct_type
            if st.WhichOneof("kind") is None and not element:
                found.append(path)
            for index, field in enumerate(st.structure.field):
                if field.HasField("type"):
                    visit(field.type, f"{path}.structure.field[{index}]")
            if st.HasField("array"):
                visit(st.array.element_type, f"{path}.array.element_type")
        elif which == "sequence_type":
            visit(tp.sequence_type.elem_type, f"{path}.sequence_type", element=True)
        elif which == "map_type":
            visit(tp.map_type.value_type, f"{path}.map_type", element=True)
        elif which == "optional_type":
            visit(tp.optional_type.elem_type, f"{path}.optional_type")

    from reference_impl import schema

    for index, st in enumerate(model.struct_types):
        visit(schema.TypeProto(struct_type=st), f"struct_types[{index}]")
    for group in ("input", "output", "value_info"):
        for index, vi in enumerate(getattr(model.graph, group)):
            if vi.HasField("type"):
                visit(vi.type, f"graph.{group}[{index}]")
    return found


def test_every_kv_fixture_model_satisfies_the_spec():
    """The suite's own KV models verify and declare no kind-less struct outside a sequence/map element
    (the KV block once typed its key and value fields as unconstrained structs)."""
    from reference_impl import schema, verify_model
    from reference_impl.kv import qwen

    models = {case.id: schema.parse_model(case.model_bytes()) for case in CASES}
    models.update({f"qwen.{variant}": qwen.build(variant=variant) for variant in qwen.VARIANTS})
    for name, model in models.items():
        verify_model(model.SerializeToString())
        assert _kindless_outside_collections(model) == [], name
    from reference_impl.kv.formats import kv_struct_types

    broken = schema.ModelProto(struct_types=kv_struct_types())
    broken.struct_types[-2].structure.field[2].type.Clear()
    broken.struct_types[-2].structure.field[2].type.struct_type.SetInParent()
    assert _kindless_outside_collections(broken) == ["struct_types[2].structure.field[2]"]


class _GroupedBlocksSealedPerHead(Fault):
    """Seals a block of a grouped format (group smaller than head_size) with the first group's scale and
    zero point over the whole head: the layout says groups, the codes were quantized per head."""

    fault_id = "KV-PAGED-FORMATS.grouped-block-sealed-per-head"

    def patches(self):
        def make(original):
            def quantize(x, storage_type, scale, zero_point=None, axis=None, block_size=None):
                if axis is not None and block_size and block_size < np.shape(x)[axis]:
                    first = np.take(np.asarray(scale), [0], axis=axis)
                    zero = None if zero_point is None else np.take(np.asarray(zero_point), [0], axis=axis)
                    return original(x, storage_type, first, zero, axis, np.shape(x)[axis])
                return original(x, storage_type, scale, zero_point, axis, block_size)
            return quantize
        return [wrap(affine, "quantize", make)]


@pytest.mark.clause("KV-PAGED-FORMATS")
def test_a_grouped_block_sealed_per_head_fails_the_grouped_conversion_case():
    (case,) = select(load_cases(), ["Recommended.KV.PagedConversion.GroupedInt8KeysGroupedUint4Values"])
    assert run_case(case, ReferenceAdapter()).verdict == PASSED
    result = run_case(case, _GroupedBlocksSealedPerHead())
    assert result.verdict == FAILED and not result.traceback, result.message

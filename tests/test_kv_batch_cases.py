"""The KV and payload faults of conformance/audit/faults/ are each caught by at least two cases of
corpus/cases/kv/batches_and_masks.toml, each with its own model: every case passes on the reference and fails on the
fault. The contiguous cases' NumPy expectations agree with onnx's reference Attention and onnxruntime (the
caches fed back by hand). The whole catalogue is audited by ``python -m conformance audit``
(tests/test_audit.py)."""

from __future__ import annotations

import numpy as np
import pytest
from fault_catchers import assert_caught_by_independent_cases, assert_every_case_listed, params
from plain_models import plain_onnx

from conformance.cases import load_cases, select

#: the topics of the KV batch, mask, head and external-cache cases (Required)
_KV_BATCH_TOPICS = tuple(f"Required.{topic}" for topic in (
    "External.KVCache", "External.KVCacheOverflow", "External.KVCachePath", "External.KVCacheWide",
    "KV.BatchExternalCache", "KV.BatchMask", "KV.Mask2D", "KV.Mask3D", "KV.PackedHeads", "KV.PagedBlockAxes",
    "KV.PagedHeadScales", "KV.PagedMaxTokens", "KV.QkGrouped", "KV.ScatteredCache"))
#: fault ID -> the new cases that must catch it
CATCHERS = {
    "PAY-EXTERNAL-EXTENT.offset-length-checked-apart": (
        "Required.External.KVCache.AffineExtentRunsPastEnd", "Required.External.KVCache.StructExtentRunsPastEnd"),
    "PAY-EXTERNAL-EXTENT.extent-sum-wraps": (
        "Required.External.KVCacheOverflow.AffineEndIsTwoToThe64",
        "Required.External.KVCacheOverflow.StructEndWrapsToFour"),
    "PAY-EXTERNAL-EXTENT.location-basename-only": (
        "Required.External.KVCachePath.AffineSubdirectoryBesideSameName",
        "Required.External.KVCachePath.StructSubdirectoryBesideSameName"),
    "KV-ATTENTION.nonpad-first-row-for-all": (
        "Required.KV.BatchExternalCache.RowsPaddedApart", "Required.KV.BatchExternalCache.RowsCausalApart",
        "Required.KV.BatchExternalCache.RowsCausalGroupedQuery"),
    "KV-APPEND-EQUIV.scatter-first-write-index": (
        "Required.KV.BatchExternalCache.RowsPaddedApart", "Required.KV.BatchExternalCache.RowsCausalApart",
        "Required.KV.BatchExternalCache.RowsCausalGroupedQuery"),
    "KV-APPEND-EQUIV.scatter-axis-fixed": (
        "Required.KV.ScatteredCache.TokenMajorCausal", "Required.KV.ScatteredCache.TokenMajorGroupedQuery",
        "Required.KV.ScatteredCache.TokenMajorRing"),
    "KV-APPEND-EQUIV.scatter-circular-as-linear": ("Required.KV.ScatteredCache.TokenMajorRing",
                                                   "Required.KV.ScatteredCache.HeadMajorRing"),
    "KV-ATTENTION.mask-first-batch-row-for-all": (
        "Required.KV.BatchMask.BoolPerRow", "Required.KV.BatchMask.FloatPerRow",
        "Required.KV.BatchMask.BoolPerRowCausal"),
    "KV-ATTENTION.two-d-mask-as-key-padding": ("Required.KV.Mask2D.BoolRowPerQuery",
    "Required.KV.Mask2D.FloatRowPerQuery"),
    "KV-ATTENTION.three-d-mask-batch-first": ("Required.KV.Mask3D.BoolPerHead", "Required.KV.Mask3D.FloatPerHead"),
    "PAY-EXTERNAL-EXTENT.numbers-thirty-two-bit": (
        "Required.External.KVCacheWide.AffineOffsetTwoToThe32",
        "Required.External.KVCacheWide.StructOffsetBeyondTwoToThe32"),
    "KV-ATTENTION.zero-scale-defaulted": ("Recommended.KV.ZeroScale.PackedHeadsCausal",
    "Recommended.KV.ZeroScale.FloatMaskOnly"),
    "KV-ATTENTION.qk-output-per-kv-head": (
        "Required.KV.QkGrouped.Mode0ScoresPerQueryHead", "Required.KV.QkGrouped.Mode3WeightsPerQueryHeadCausal"),
    "KV-ATTENTION.packed-heads-not-transposed": ("Required.KV.PackedHeads.TwoOnTwo",
    "Required.KV.PackedHeads.FourOnTwo"),
    "KV-PAGED-RANGE.queries-placed-by-count": (
        "Recommended.KV.PagedLateStart.CausalDecode", "Recommended.KV.PagedLateStart.CausalChunkGroupedQuery"),
    "KV-PAGED-RANGE.mask-indexed-by-position": ("Recommended.KV.PagedLateStart.BoolMask",
    "Recommended.KV.PagedLateStart.FloatMask"),
    "KV-PAGED-FORMATS.factored-scale-heads-interleaved": (
        "Required.KV.PagedHeadScales.Int8KeysGroupedQuery", "Required.KV.PagedHeadScales.Int8ValuesGroupedQuery",
        "Required.KV.PagedHeadScales.Int4KeysValuesGroupedQuery"),
    "KV-PAGED-FORMATS.filled-block-left-open": (
        "Recommended.KV.PagedSealing.Int2KeysUint2ValuesFilledByLastCall",
        "Recommended.KV.PagedSealing.Uint4KeysInt8ValuesFilledByLastCall"),
    "KV-PAGED-FORMATS.block-axis-assumed-head-size": (
        "Required.KV.PagedBlockAxes.PerTokenKeysPerHeadValues", "Required.KV.PagedBlockAxes.PerHeadKeysPerTokenValues",
        "Required.KV.PagedBlockAxes.PerTensorKeysPerTokenValues"),
    "KV-MUTATION-FAILED.max-tokens-counts-slots": (
        "Required.KV.PagedMaxTokens.PartialBlockFilledToTheLimit",
        "Required.KV.PagedMaxTokens.PartialSecondBlockToTheLimit"),
    "KV-PAGED-FORMATS.value-scale-in-normalizer": (
        "Required.KV.PagedHeadScales.Int8ValuesGroupedQuery", "Required.KV.PagedHeadScales.Int4KeysValuesGroupedQuery"),
}


@pytest.mark.parametrize(("fault_id", "case_ids"), list(params(CATCHERS)))
def test_fault_is_caught_by_two_independent_cases(fault_id, case_ids):
    assert_caught_by_independent_cases(fault_id, case_ids)


def test_every_new_case_catches_a_fault_listed_here():
    assert_every_case_listed(CATCHERS, "cases/kv/batches_and_masks.toml")


# --------------------------------------------------------------------------- peers agree (contiguous)
CONTIGUOUS = {case.id: case for case in select(load_cases(), ["Required.KV.Batch*", "Required.KV.Mask2D.*",
                                                               "Required.KV.Mask3D.*", "Required.KV.PackedHeads.*",
                                                               "Required.KV.ScatteredCache.*",
                                                               "Required.KV.QkGrouped.*"])}
#: onnxruntime refuses an explicit scale of 0 when the model is loaded (the cases are Recommended)
ZERO_SCALE = {case.id: case for case in select(load_cases(), ["Recommended.KV.ZeroScale.*"])}
_FED_BACK = {"cache_key": "next_key", "cache_value": "next_value", "past_key": "present_key",
             "past_value": "present_value"}


def _array(literal):
    from conformance import values as V

    return V.build(literal)


def _runner(case, peer: str):
    if peer == "onnxruntime":
        ort = pytest.importorskip("onnxruntime")
        session = ort.InferenceSession(plain_onnx(case).SerializeToString())
        names = [o.name for o in session.get_outputs()]
        return lambda feeds: dict(zip(names, session.run(None, feeds), strict=True))
    from onnx.reference import ReferenceEvaluator

    evaluator = ReferenceEvaluator(plain_onnx(case))
    names = [o.name for o in plain_onnx(case).graph.output]
    return lambda feeds: dict(zip(names, evaluator.run(None, feeds), strict=True))


def _replay(case, peer: str) -> None:
    """Run the case's calls on the peer with the plain model, feeding the caches back by hand, and compare
    every expected output."""
    run = _runner(case, peer)
    steps = case.extras()["steps"]
    cache = {name: _array(value) for name, value in steps[0]["initial"].items()}
    assert len(steps) > 2
    for step in steps[1:]:
        got = run({**{name: _array(value) for name, value in step["feeds"].items()}, **cache})
        for name, want in step["outputs"].items():
            np.testing.assert_allclose(got[name], _array(want), rtol=1e-5, atol=1e-5)
        cache = {name: got[_FED_BACK[name]] for name in cache}


@pytest.mark.clause("KV-ATTENTION")
@pytest.mark.parametrize("peer", ["onnx-reference", "onnxruntime"])
@pytest.mark.parametrize("case_id", sorted(CONTIGUOUS))
def test_contiguous_expectations_agree_with_peers(case_id, peer):
    _replay(CONTIGUOUS[case_id], peer)


@pytest.mark.clause("KV-ATTENTION")
@pytest.mark.parametrize("case_id", sorted(ZERO_SCALE))
def test_zero_scale_expectations_agree_with_onnx_reference(case_id):
    _replay(ZERO_SCALE[case_id], "onnx-reference")


@pytest.mark.clause("KV-ATTENTION")
def test_batch_rows_and_mask_rows_really_differ():
    """The cases reach the faults' paths: the external cache's rows hold different lengths, the per-row
    masks differ between the rows, and every rank-2 mask call of several queries has distinct rows."""
    steps = CONTIGUOUS["Required.KV.BatchExternalCache.RowsPaddedApart"].extras()["steps"]
    assert all(len(set(_array(step["feeds"]["nonpad"]).tolist())) == 2 for step in steps[1:])
    assert all(len(set(_array(step["feeds"]["write_indices"]).tolist())) == 2 for step in steps[1:])
    for step in CONTIGUOUS["Required.KV.BatchMask.BoolPerRow"].extras()["steps"][1:]:
        mask = _array(step["feeds"]["attn_mask"])
        assert mask.shape[0] == 2 and not np.array_equal(mask[0], mask[1])
    for step in CONTIGUOUS["Required.KV.Mask2D.FloatRowPerQuery"].extras()["steps"][1:]:
        mask = _array(step["feeds"]["attn_mask"])
        assert mask.ndim == 2 and (mask.shape[0] == 1 or not np.array_equal(mask[0], mask[1]))


def test_a_fault_overriding_the_executor_kernels_acts_on_state_cases():
    """The TensorScatter faults only replace the kernels a state's executor runs: the audit's scoping must
    still run them on the state cases (otherwise they are reported as surviving every case)."""
    from conformance.audit.faults.kv_contiguous import (
        ScatterAxisFixedAtMinusTwo,
        ScatterCircularAsLinear,
        ScatterFirstWriteIndexForAll,
    )
    from conformance.audit.scope import seams

    for cls in (ScatterFirstWriteIndexForAll, ScatterAxisFixedAtMinusTwo, ScatterCircularAsLinear):
        assert "state" in seams(cls)[0]


@pytest.mark.clause("AFF-DQ")
@pytest.mark.parametrize("fmt", ["int8@0", "uint8@1", "uint4@1", "int4@0", "uint8@tensor", "int4@tensor", "uint4@0"])
def test_blocks_along_other_axes_decode_as_onnx_dequantize_linear(fmt):
    """The per-axis and per-tensor blocks of the PagedBlockAxes cases (corpus/builders/kv_batches.py) decode,
    by onnx's reference DequantizeLinear on the same codes and parameters, to the values the cases' Y uses."""
    from onnx import TensorProto, helper
    from onnx.reference import ReferenceEvaluator

    from corpus.builders.kv_batches import encode_along

    x = np.random.default_rng(5).standard_normal((4, 2, 8)).astype(np.float32) * np.float32(3)
    value, decoded = encode_along(x, fmt)
    layout = value.affine
    codes = helper.make_tensor("x", layout.storage_type, [4, 2, 8], value.raw_data, raw=True)
    inputs = [codes, TensorProto.FromString(layout.scale.SerializeToString())]
    inputs[1].name = "scale"
    if layout.HasField("zero_point"):
        inputs.append(TensorProto.FromString(layout.zero_point.SerializeToString()))
        inputs[2].name = "zero_point"
    attrs = {"axis": layout.axis} if layout.HasField("axis") else {}
    node = helper.make_node("DequantizeLinear", [t.name for t in inputs], ["y"], **attrs)
    graph = helper.make_graph([node], "dq", [], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              initializer=inputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)])
    (got,) = ReferenceEvaluator(model).run(None, {})
    np.testing.assert_array_equal(got, decoded)
    assert np.max(np.abs(decoded - x)) < np.max(np.abs(x)) / 2  # the encoding is a real approximation


def test_standard_onnx_models_are_otherwise_valid_onnx():
    """A runtime that checks the graph strictly first (onnx's full check) must not refuse a contiguous case
    for a reason unrelated to its clause: every standard-ONNX model passes once its bindings are cleared."""
    import onnx

    checked = []
    for case in select(load_cases(), list(_KV_BATCH_TOPICS)):
        plain = plain_onnx(case)
        if not plain.graph.node or any(o.domain not in ("", "ai.onnx") for o in plain.opset_import):
            continue  # external payload cases (no graph) and paged cases (the ai.rt role)
        onnx.checker.check_model(plain, full_check=True)
        checked.append(case.id)
    assert len(checked) == len(CONTIGUOUS), sorted(set(CONTIGUOUS) - set(checked))

"""The reference Attention against the onnx backend collection, onnx's evaluator and onnxruntime.

Expected values come from the onnx package (its backend data sets and ReferenceEvaluator) and from
onnxruntime; nothing here is hard-coded. Where onnx and onnxruntime disagree, ``ORT_DIVERGENCES`` names
the case, what differs, and which side the oracle follows.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper
from onnx_cases import node_cases

from reference_impl.errors import ContractError, ErrorCode
from reference_impl.kv.attention import attention

try:
    import onnxruntime as ort
except ImportError:  # the onnx comparisons still run; the onnxruntime ones skip
    ort = None
needs_ort = pytest.mark.skipif(ort is None, reason="onnxruntime (the peers extra) is not installed")

OUTPUTS = ("y", "present_key", "present_value", "qk_matmul_output")
TOLERANCE = {np.dtype(np.float32): (1e-5, 1e-6), np.dtype(np.float16): (2e-3, 2e-3),
             np.dtype(ml_dtypes.bfloat16): (2e-2, 2e-2), np.dtype(np.float64): (1e-12, 1e-12)}

#: Backend cases where onnxruntime and onnx differ; the oracle follows onnx in each, for the reason given.
ORT_DIVERGENCES = {
    "test_attention_4d_with_past_and_present_qk_matmul_bias_3d_mask_causal":
        "qk_matmul_output mode 2: onnxruntime writes -FLT_MAX where the causal bias is -inf; the schema "
        "defines the bias as -inf, so the oracle follows onnx (the probabilities and Y agree).",
    "test_attention_4d_with_past_and_present_qk_matmul_bias_4d_mask_causal":
        "as above (causal positions -FLT_MAX in onnxruntime, -inf in onnx and the oracle).",
    "test_attention_4d_diff_heads_mask4d_padded_kv":
        "attn_mask shorter than the total sequence: opset 24 pads it with -inf; onnxruntime rejects the "
        "shape. The oracle follows the schema and onnx.",
}
#: Outside the collection: with past_key and q_len != kv_len, onnxruntime places the causal frontier at
#: total - q_len, the schema (and onnx) at past_sequence_length. The oracle follows the schema.
CAUSAL_OFFSET_DIVERGENCE = "causal + past_key + q_len != kv_len: offset past_len (schema) vs total - q_len (ORT)"
#: Backend cases onnxruntime cannot load (no bfloat16 kernels for the nodes it lowers Attention to).
ORT_UNLOADABLE = {"test_attention_4d_causal_bf16", "test_attention_4d_padded_kv_bf16",
                  "test_attention_4d_causal_padded_kv_bf16", "test_attention_4d_attn_mask_causal_bf16",
                  "test_attention_3d_causal_bf16"}


def _collect():
    # The op-level cases; each "_expanded" twin runs the function body on the same data.
    return {c.name: c for c in node_cases("Attention") if len(c.model.graph.node) == 1}


CASES = _collect()


def _run_oracle(case, inputs):
    node = case.model.graph.node[0]
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    feeds = dict(zip([i.name for i in case.model.graph.input], inputs))
    args = [feeds[name] if name else None for name in node.input]
    result = attention(*args, **attrs)
    produced = {}
    for index, name in enumerate(node.output):
        if name:
            produced[name] = getattr(result, OUTPUTS[index])
    return produced


def _assert_close(got: np.ndarray, want: np.ndarray, what: str) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape, what
    got64, want64 = got.astype(np.float64), want.astype(np.float64)
    np.testing.assert_array_equal(np.isnan(got64), np.isnan(want64), err_msg=what)
    np.testing.assert_array_equal(np.isinf(got64) * np.sign(got64), np.isinf(want64) * np.sign(want64),
                                  err_msg=what)
    finite = np.isfinite(want64)
    rtol, atol = TOLERANCE[want.dtype]
    np.testing.assert_allclose(got64[finite], want64[finite], rtol=rtol, atol=atol, err_msg=what)


def test_collection_is_not_empty():
    assert len(CASES) >= 90
    opsets = {c.model.opset_import[0].version for c in CASES.values()}
    assert {23, 24} <= opsets


@pytest.mark.clause("KV-ATTENTION")
@pytest.mark.parametrize("name", sorted(CASES))
def test_backend_case(name):
    case = CASES[name]
    for inputs, outputs in case.data_sets:
        produced = _run_oracle(case, inputs)
        for info, want in zip(case.model.graph.output, outputs):
            _assert_close(produced[info.name], want, f"{name}:{info.name}")


def _ort_session(model):
    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


@needs_ort
@pytest.mark.clause("KV-ATTENTION")
@pytest.mark.parametrize("name", sorted(CASES))
def test_backend_case_against_onnxruntime(name):
    case = CASES[name]
    if name in ORT_UNLOADABLE:
        with pytest.raises(Exception, match="NOT_IMPLEMENTED"):
            _ort_session(case.model)
        pytest.skip("onnxruntime has no kernel for this case's element type")
    session = _ort_session(case.model)
    for inputs, _ in case.data_sets:
        feeds = dict(zip([i.name for i in case.model.graph.input], inputs))
        produced = _run_oracle(case, inputs)
        if name == "test_attention_4d_diff_heads_mask4d_padded_kv":
            with pytest.raises(Exception, match="total_sequence_length"):
                session.run(None, feeds)
            continue
        got = session.run(None, feeds)
        for info, theirs in zip(case.model.graph.output, got):
            ours = produced[info.name]
            if name in ORT_DIVERGENCES and info.name == "qk_matmul_output":
                lowest = np.finfo(theirs.dtype).min
                assert np.any(theirs == lowest) and not np.any(np.isneginf(theirs))
                theirs = np.where(theirs == lowest, -np.inf, theirs).astype(theirs.dtype)
            _assert_close(ours, theirs.astype(ours.dtype), f"{name}:{info.name} vs onnxruntime")


# ----------------------------------------------------------------------------- beyond the collection
def _model(n_inputs: list[str], outputs: list[str], attrs: dict, elem=TensorProto.FLOAT, opset=24):
    bool_mask = attrs.pop("_bool_mask", False)
    node = helper.make_node("Attention", n_inputs, outputs, **attrs)
    names = [n for n in n_inputs if n]
    types = {"attn_mask": TensorProto.BOOL if bool_mask else elem,
             "nonpad_kv_seqlen": TensorProto.INT64}
    graph = helper.make_graph(
        [node], "attention",
        [helper.make_tensor_value_info(n, types.get(n, elem), None) for n in names],
        [helper.make_tensor_value_info(n, elem, None) for n in outputs if n])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


@needs_ort
@pytest.mark.clause("KV-ATTENTION")
def test_mode0_with_softcap_is_the_raw_product():
    """Mode 0 is "the output of qk matmul" (schema). onnx's evaluator returns the softcapped value here;
    onnxruntime returns the raw product. The oracle follows the schema and onnxruntime."""
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in ((1, 2, 3, 8), (1, 2, 5, 8), (1, 2, 5, 8)))
    ours = attention(q, k, v, softcap=1.0, qk_matmul_output_mode=0)
    raw = attention(q, k, v).qk_matmul_output
    np.testing.assert_array_equal(ours.qk_matmul_output, raw)
    theirs = _ort_session(_model(["Q", "K", "V"], ["Y", "", "", "qk"], {"softcap": 1.0}))
    got = theirs.run(None, {"Q": q, "K": k, "V": v})
    np.testing.assert_allclose(ours.qk_matmul_output, got[1], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ours.y, got[0], rtol=1e-5, atol=1e-6)


@st.composite
def _configs(draw):
    kv_heads = draw(st.sampled_from([1, 2, 3]))  # 1 with several query heads is MQA
    group = draw(st.sampled_from([1, 2, 4]))
    return {
        "batch": draw(st.integers(1, 2)), "q_heads": kv_heads * group, "kv_heads": kv_heads,
        "q_len": draw(st.integers(1, 4)), "kv_len": draw(st.integers(1, 6)), "past": draw(st.integers(0, 5)),
        "head": draw(st.sampled_from([4, 8])), "v_head": draw(st.sampled_from([4, 6])),
        "rank": draw(st.sampled_from([3, 4])), "causal": draw(st.booleans()),
        "mask": draw(st.sampled_from([None, "bool", "float"])),
        "scale": draw(st.sampled_from([None, 0.3])), "softcap": draw(st.sampled_from([0.0, 2.5])),
        "mode": draw(st.sampled_from([0, 1, 2, 3])), "seed": draw(st.integers(0, 2**16))}


@needs_ort
@pytest.mark.clause("KV-ATTENTION")
@settings(max_examples=40, deadline=None, database=None)
@given(_configs())
def test_random_configurations_match_onnx_and_onnxruntime(cfg):
    from onnx.reference import ReferenceEvaluator

    rng = np.random.default_rng(cfg["seed"])
    b, hq, hkv, sq, sk, p = cfg["batch"], cfg["q_heads"], cfg["kv_heads"], cfg["q_len"], cfg["kv_len"], cfg["past"]
    d, dv = cfg["head"], cfg["v_head"]
    f = lambda *s: rng.standard_normal(s).astype(np.float32)
    q4, k4, v4 = f(b, hq, sq, d), f(b, hkv, sk, d), f(b, hkv, sk, dv)
    attrs = {"is_causal": int(cfg["causal"]), "qk_matmul_output_mode": cfg["mode"]}
    if cfg["scale"] is not None:
        attrs["scale"] = cfg["scale"]
    if cfg["softcap"]:
        attrs["softcap"] = cfg["softcap"]
    feeds = {}
    if cfg["rank"] == 3:
        feeds.update(Q=q4.transpose(0, 2, 1, 3).reshape(b, sq, hq * d),
                     K=k4.transpose(0, 2, 1, 3).reshape(b, sk, hkv * d),
                     V=v4.transpose(0, 2, 1, 3).reshape(b, sk, hkv * dv))
        attrs.update(q_num_heads=hq, kv_num_heads=hkv)
    else:
        feeds.update(Q=q4, K=k4, V=v4)
    names = ["Q", "K", "V", "", "", ""]
    outputs = ["Y", "", "", "qk"]
    if cfg["mask"]:
        mask = rng.random((sq, p + sk)) > 0.3 if cfg["mask"] == "bool" else f(sq, p + sk)
        feeds["attn_mask"] = mask
        names[3] = "attn_mask"
        attrs["_bool_mask"] = cfg["mask"] == "bool"
    if p:
        feeds.update(past_key=f(b, hkv, p, d), past_value=f(b, hkv, p, dv))
        names[4:6] = ["past_key", "past_value"]
        outputs[1:3] = ["present_key", "present_value"]
    while not names[-1]:
        names.pop()
    model = _model(names, outputs, dict(attrs))
    attrs.pop("_bool_mask", None)
    ours = attention(feeds["Q"], feeds["K"], feeds["V"], feeds.get("attn_mask"), feeds.get("past_key"),
                     feeds.get("past_value"), **attrs)
    mine = {"Y": ours.y, "present_key": ours.present_key, "present_value": ours.present_value,
            "qk": ours.qk_matmul_output}
    wanted = [o for o in outputs if o]
    reference = ReferenceEvaluator(model).run(None, feeds)
    runtime = _ort_session(model).run(None, feeds)
    # With a cache and fewer queries than new keys, onnxruntime aligns the causal frontier to the total
    # length (offset = total - q_len); the schema sets offset = past_sequence_length, as onnx does and the
    # oracle follows (see CAUSAL_OFFSET_DIVERGENCE).
    frontier_differs = cfg["causal"] and p and sq != sk
    for name, ref, rt in zip(wanted, reference, runtime):
        if name == "qk" and cfg["mode"] == 0 and cfg["softcap"]:
            ref = None  # onnx's evaluator softcaps mode 0; see test_mode0_with_softcap_is_the_raw_product
        if ref is not None:
            _assert_close(mine[name], ref, f"{name} vs onnx")
        if frontier_differs and name in ("Y", "qk"):
            continue
        if name == "qk" and cfg["mode"] == 2:
            rt = np.where(rt == np.finfo(np.float32).min, -np.inf, rt).astype(np.float32)
        np.testing.assert_allclose(mine[name], rt, rtol=1e-4, atol=1e-5, err_msg=f"{name} vs onnxruntime")


# ----------------------------------------------------------------------------- rejections
def _arrays(*shapes):
    return [None if s is None else np.zeros(s, np.float32) for s in shapes]


@pytest.mark.clause("KV-ATTENTION")
@pytest.mark.parametrize("case, kwargs", [
    ("rank mismatch", {"args": _arrays((1, 2, 3, 4), (1, 2, 3), (1, 2, 3, 4))}),
    ("3-D without head counts", {"args": _arrays((1, 3, 8), (1, 3, 8), (1, 3, 8))}),
    ("hidden not divisible", {"args": _arrays((1, 3, 9), (1, 3, 8), (1, 3, 8)), "q_num_heads": 2, "kv_num_heads": 2}),
    ("heads not a multiple", {"args": _arrays((1, 3, 2, 4), (1, 2, 2, 4), (1, 2, 2, 4))}),
    ("head size mismatch", {"args": _arrays((1, 2, 2, 4), (1, 2, 2, 8), (1, 2, 2, 4))}),
    ("K/V length mismatch", {"args": _arrays((1, 2, 2, 4), (1, 2, 3, 4), (1, 2, 2, 4))}),
    ("4-D with wrong head count", {"args": _arrays((1, 2, 2, 4), (1, 2, 2, 4), (1, 2, 2, 4)), "q_num_heads": 4}),
    ("past without value", {"args": _arrays((1, 2, 2, 4), (1, 2, 2, 4), (1, 2, 2, 4), None, (1, 2, 1, 4))}),
    ("past heads mismatch", {"args": _arrays((1, 2, 2, 4), (1, 2, 2, 4), (1, 2, 2, 4)) + [None]
                                 + _arrays((1, 1, 1, 4), (1, 1, 1, 4))}),
    ("mask too long", {"args": _arrays((1, 2, 2, 4), (1, 2, 2, 4), (1, 2, 2, 4), (2, 3))}),
    ("mask not broadcastable", {"args": _arrays((1, 2, 2, 4), (1, 2, 2, 4), (1, 2, 2, 4), (3, 2))}),
    ("mask integer", {"args": _arrays((1, 2, 2, 4), (1, 2, 2, 4), (1, 2, 2, 4)) + [np.zeros((2, 2), np.int32)]}),
    ("nonpad with past", {"args": _arrays((1, 2, 2, 4), (1, 2, 2, 4), (1, 2, 2, 4)) + [None]
                              + _arrays((1, 2, 1, 4), (1, 2, 1, 4)) + [np.array([1])]}),
    ("nonpad out of range", {"args": _arrays((1, 2, 2, 4), (1, 2, 2, 4), (1, 2, 2, 4)) + [None, None, None,
                                                                                         np.array([3])]}),
    ("integer inputs", {"args": [np.zeros((1, 2, 2, 4), np.int32)] * 3}),
    ("mode 4", {"args": _arrays((1, 2, 2, 4), (1, 2, 2, 4), (1, 2, 2, 4)), "qk_matmul_output_mode": 4}),
    ("softmax precision", {"args": _arrays((1, 2, 2, 4), (1, 2, 2, 4), (1, 2, 2, 4)), "softmax_precision": 6}),
    ("window", {"args": _arrays((1, 2, 2, 4), (1, 2, 2, 4), (1, 2, 2, 4)), "left_window_size": -2}),
])
def test_invalid_inputs_are_classified(case, kwargs):
    args = kwargs.pop("args")
    with pytest.raises(ContractError) as info:
        attention(*args, **kwargs)
    assert info.value.code == ErrorCode.ATTENTION_INPUT_INVALID
    assert info.value.path.startswith("Attention")


@needs_ort
@pytest.mark.clause("KV-ATTENTION")
def test_causal_frontier_with_past_follows_the_schema():
    """Query i attends key j iff j <= i + past_sequence_length (schema, onnx). onnxruntime instead aligns
    to total - q_len; reproducing that with an explicit mask shows the divergence is exactly the offset."""
    from onnx.reference import ReferenceEvaluator

    rng = np.random.default_rng(7)
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in ((1, 2, 1, 4), (1, 2, 3, 4), (1, 2, 3, 4)))
    past_k, past_v = (rng.standard_normal((1, 2, 2, 4)).astype(np.float32) for _ in range(2))
    feeds = {"Q": q, "K": k, "V": v, "past_key": past_k, "past_value": past_v}
    model = _model(["Q", "K", "V", "", "past_key", "past_value"], ["Y", "present_key", "present_value"],
                   {"is_causal": 1})
    ours = attention(q, k, v, None, past_k, past_v, is_causal=1)
    _assert_close(ours.y, ReferenceEvaluator(model).run(None, feeds)[0], "Y vs onnx")
    runtime_y = _ort_session(model).run(None, feeds)[0]
    total, q_len = 5, 1
    ort_like = np.arange(total)[None, :] <= np.arange(q_len)[:, None] + (total - q_len)
    np.testing.assert_allclose(attention(q, k, v, ort_like, past_k, past_v).y, runtime_y, rtol=1e-5, atol=1e-6)
    assert not np.allclose(ours.y, runtime_y)

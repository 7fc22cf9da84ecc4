"""Attention semantics cases (corpus/cases/kv/attention_semantics.toml): their NumPy expectations agree with onnx's
reference Attention and onnxruntime at each call's own tolerance (exactly, for the large-logit calls), the
paged and contiguous rows expect the same Y, the paged rows that are Required use no suite extension of
the paged_attention role, and a reference with one realistic attention bug fails them: wrong GQA head
mapping, causal frontier aligned to the start, softcap after the mask or not at all, scale ignored,
inverted boolean mask, float mask values ignored, softmax without a running maximum."""

from __future__ import annotations

import numpy as np
import pytest

from conformance.adapters.reference import ReferenceAdapter
from conformance.cases import builders, load_cases, select
from conformance.execute import FAILED, PASSED, run_case
from reference_impl import schema
from reference_impl.kv import attention as A
from reference_impl.kv.paged_attention import OnlineSoftmax, _scaled

pytestmark = pytest.mark.clause("KV-ATTENTION")

PATTERNS = ["Required.KV.Attention", "Required.KV.PagedAttention", "Recommended.KV.PagedAttention"]
CASES = {case.id: case for case in select(load_cases(), PATTERNS) if case.builder == "kv_attention_semantics"}
SCENARIOS = sorted({case_id.rsplit(".", 1)[1] for case_id in CASES})
#: Scenarios whose model needs a suite extension of the paged_attention role (scale, softcap, attn_mask)
EXTENSIONS = {"ExplicitScale", "ExplicitScaleCausal", "Softcap", "SoftcapWithMask", "FloatMask", "BoolMask",
              "BoolMaskCausal"}


def _paged(name: str) -> str:
    """The paged row's ID: Recommended where the scenario needs an extension of the role."""
    return f"{'Recommended' if name in EXTENSIONS else 'Required'}.KV.PagedAttention.{name}"


def _runs(case):
    return [step for step in case.extras()["steps"] if step["op"] == "run"]


def _array(literal):
    from conformance import values as V

    return V.build(literal)


def _plain_model(case):
    """The case's Attention model as standard ONNX: the bindings become the caller's loop."""
    from onnx import ModelProto

    model = schema.parse_model(case.model_bytes())
    model.graph.ClearField("persistent_bindings")
    plain = ModelProto()
    plain.ParseFromString(model.SerializeToString())
    return plain


def _loop(run, case):
    """Y of every call of a contiguous case, with present fed back as past by hand."""
    s = _runs(case)
    heads, size = _array(s[0]["feeds"]["k"]).shape[1], _array(s[0]["feeds"]["k"]).shape[3]
    past = {"past_key": np.zeros((1, heads, 0, size), np.float32), "past_value": np.zeros((1, heads, 0, size),
                                                                                          np.float32)}
    got = []
    for step in s:
        feeds = {name: _array(value) for name, value in step["feeds"].items()}
        y, present_key, present_value = run({**feeds, **past})
        past = {"past_key": present_key, "past_value": present_value}
        got.append(y)
    return got


def _expected(case):
    return [_array(step["outputs"]["y"]) for step in _runs(case)]


def test_every_scenario_runs_on_both_paths_with_the_same_expectations():
    assert len(SCENARIOS) >= 15
    for name in SCENARIOS:
        contiguous, paged = CASES[f"Required.KV.Attention.{name}"], CASES[_paged(name)]
        for want, have in zip(_expected(contiguous), _expected(paged), strict=True):
            np.testing.assert_array_equal(want, have)


@pytest.mark.parametrize("name", SCENARIOS)
def test_expectations_agree_with_onnx_reference_attention(name):
    from onnx.reference import ReferenceEvaluator

    case = CASES[f"Required.KV.Attention.{name}"]
    session = ReferenceEvaluator(_plain_model(case))
    got = _loop(lambda feeds: session.run(None, feeds), case)
    for index, (step, want, have) in enumerate(zip(_runs(case), _expected(case), got, strict=True)):
        assert np.all(np.isfinite(have))
        np.testing.assert_allclose(have, want, rtol=step["rtol"], atol=step["atol"], err_msg=f"{name} call {index}")


@pytest.mark.parametrize("name", SCENARIOS)
def test_expectations_agree_with_onnxruntime(name):
    ort = pytest.importorskip("onnxruntime")
    case = CASES[f"Required.KV.Attention.{name}"]
    session = ort.InferenceSession(_plain_model(case).SerializeToString(), providers=["CPUExecutionProvider"])
    got = _loop(lambda feeds: session.run(None, feeds), case)
    for index, (step, want, have) in enumerate(zip(_runs(case), _expected(case), got, strict=True)):
        np.testing.assert_allclose(have, want, rtol=step["rtol"], atol=step["atol"], err_msg=f"{name} call {index}")


#: The other contiguous KV cases whose trace is one state's plain run after run (their Y comes from the
#: same formula through corpus/builders/kv.py and kv_contiguous.py).
LINEAR = ["Required.KV.Contiguous.DecodeMatchesFunctionalAttention", "Required.KV.Contiguous.LongerDecode",
          "Required.KV.EndToEnd.PrefillOnly", "Required.KV.CapacityReuse", "Recommended.KV.CapacityReuse"]


@pytest.mark.parametrize("case", select(load_cases(), LINEAR), ids=lambda case: case.id)
def test_linear_contiguous_traces_agree_with_onnx_reference_attention(case):
    """Y and the presents of every call equal onnx's reference Attention fed back by hand."""
    from onnx.reference import ReferenceEvaluator

    session = ReferenceEvaluator(_plain_model(case))
    outputs = []
    _loop(lambda feeds: outputs.append(session.run(None, feeds)) or outputs[-1], case)
    for index, (step, got) in enumerate(zip(_runs(case), outputs, strict=True)):
        for name, have in zip(("y", "present_key", "present_value"), got):
            np.testing.assert_allclose(have, _array(step["outputs"][name]), rtol=step["rtol"], atol=step["atol"],
                                       err_msg=f"{case.id} call {index} {name}")


def test_required_paged_rows_use_only_the_roles_own_signature():
    """A Required paged row's model has the role's four inputs and no attribute beyond onnx-light's
    (block_size, is_causal, left_window_size, max_tokens); the rows that need more are Recommended."""
    own = {"block_size", "is_causal", "left_window_size", "max_tokens"}
    for name in SCENARIOS:
        (node,) = schema.parse_model(CASES[_paged(name)].model_bytes()).graph.node
        extended = len(node.input) > 4 or bool({a.name for a in node.attribute} - own)
        assert extended == (name in EXTENSIONS), name


def test_large_logit_expectations_are_exact_and_checked_exactly():
    builders()
    from corpus.builders.kv_semantics import SCENARIOS as DEFINED

    for name in ("LargeLogits", "LargeLogitsLateBlocks", "LargeLogitsFirstBlock"):
        logits = np.asarray(DEFINED[name].logits)
        assert np.max(np.abs(logits)) >= 1000
        runs = _runs(CASES[_paged(name)])
        exact = [step for step in runs if step["atol"] == 0.0]
        assert len(exact) >= 3, name  # once a dominant score arrives, every Y is exact
        for step in exact:
            y = _array(step["outputs"]["y"])
            assert np.array_equal(y, np.round(y * 2) / 2)  # one integer value or the mean of two


# ------------------------------------------------------------------------------------------ faults
def _gqa_modulo(monkeypatch):
    """Query head h reads KV head h % kv_heads instead of h // (q_heads / kv_heads)."""
    def scores(q, k):
        index = np.arange(q.shape[1]) % k.shape[1]
        return np.matmul(q, np.swapaxes(k[:, index], -1, -2)).astype(q.dtype, copy=False)

    def values(p, v):
        index = np.arange(p.shape[1]) % v.shape[1]
        return np.matmul(p, v[:, index]).astype(p.dtype, copy=False)

    monkeypatch.setattr(A, "grouped_scores", scores)
    monkeypatch.setattr(A, "grouped_values", values)


def _causal_from_start(monkeypatch):
    """The causal frontier aligned to the start (query i sees keys 0..i) instead of the end."""
    original = A.position_bias
    monkeypatch.setattr(A, "position_bias", lambda q_len, start, stop, offset, attrs, dtype:
                        original(q_len, start, stop, 0, attrs, dtype))


def _softcap_after_mask(monkeypatch):
    def logits(raw, bias, softcap):
        biased = raw if bias is None else raw + bias
        return A.apply_softcap(raw, softcap), A.apply_softcap(biased, softcap)

    monkeypatch.setattr(A, "biased_logits", logits)


def _softcap_ignored(monkeypatch):
    monkeypatch.setattr(A, "apply_softcap", lambda scores, softcap: scores)


def _scale_ignored(monkeypatch):
    original = A.sqrt_scale
    monkeypatch.setattr(A, "sqrt_scale", lambda attrs, head, dtype: original(A.AttentionAttrs(), head, dtype))


def _bool_mask_inverted(monkeypatch):
    original = A.mask_bias
    monkeypatch.setattr(A, "mask_bias", lambda mask, dtype, start, stop:
                        original(~mask if mask is not None and mask.dtype == bool else mask, dtype, start, stop))


def _float_mask_values_ignored(monkeypatch):
    """A float mask used only to exclude keys (its -inf entries); its finite additive values are dropped."""
    original = A.mask_bias

    def bias(mask, dtype, start, stop):
        if mask is not None and mask.dtype != bool:
            mask = np.where(np.isneginf(mask), mask, mask.dtype.type(0))
        return original(mask, dtype, start, stop)

    monkeypatch.setattr(A, "mask_bias", bias)


def _no_running_maximum(monkeypatch):
    """Softmax as exp(x) / sum(exp(x)), dense and online (no maximum subtracted, none carried)."""
    def softmax(x):
        e = np.exp(x)
        return e / np.sum(e, axis=-1, keepdims=True)

    def add(self, logits, v, bias, v_scale=None):
        self.attended |= True
        weights = np.exp(logits)
        total, part = np.sum(weights, axis=-1, keepdims=True), A.grouped_values(_scaled(weights, v_scale), v)
        self.normalizer = total if self.normalizer is None else self.normalizer + total
        self.acc = part if self.acc is None else self.acc + part
        return weights

    monkeypatch.setattr(A, "softmax_rows", softmax)
    monkeypatch.setattr(OnlineSoftmax, "add", add)


FAULTS = {
    "gqa_modulo": (_gqa_modulo, {"GroupedQuery8On2", "GroupedQuery8On4Chunked"}),
    "causal_from_start": (_causal_from_start, {"CausalPrefill", "CausalChunkedPrefill", "GroupedQuery8On2",
                                               "MultiQuery8On1", "ExplicitScaleCausal", "Softcap", "BoolMaskCausal"}),
    "softcap_after_mask": (_softcap_after_mask, {"Softcap", "SoftcapWithMask"}),
    "softcap_ignored": (_softcap_ignored, {"Softcap", "SoftcapWithMask"}),
    "scale_ignored": (_scale_ignored, {"ExplicitScale", "ExplicitScaleCausal"}),
    "bool_mask_inverted": (_bool_mask_inverted, {"BoolMask", "BoolMaskCausal", "SoftcapWithMask"}),
    "float_mask_values_ignored": (_float_mask_values_ignored, {"FloatMask"}),
    "no_running_maximum": (_no_running_maximum, {"LargeLogits", "LargeLogitsLateBlocks", "LargeLogitsFirstBlock"}),
}


def _verdicts() -> dict[str, str]:
    adapter = ReferenceAdapter()
    return {case_id: run_case(case, adapter).verdict for case_id, case in CASES.items()}


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("fault", list(FAULTS))
def test_a_reference_with_one_attention_bug_fails_the_cases_for_it(fault, monkeypatch):
    patch, scenarios = FAULTS[fault]
    patch(monkeypatch)
    verdicts = _verdicts()
    caught = {case_id.rsplit(".", 1)[1] for case_id, verdict in verdicts.items() if verdict == FAILED}
    assert scenarios <= caught, f"{fault} escaped {sorted(scenarios - caught)}"
    for name in scenarios:  # on both paths
        assert verdicts[f"Required.KV.Attention.{name}"] == FAILED
        assert verdicts[_paged(name)] == FAILED


def test_every_semantics_case_is_caught_by_some_fault_and_passes_on_the_reference():
    assert set().union(*(scenarios for _, scenarios in FAULTS.values())) == set(SCENARIOS)
    assert set(_verdicts().values()) == {PASSED}

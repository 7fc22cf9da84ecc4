"""The contiguous-only rows of corpus/cases/kv/attention_semantics.toml (builder kv_attention_contiguous_trace):
softmax_precision = FLOAT on float inputs, and a prefill of over a thousand keys. Their expectations agree with
onnx's reference Attention, the reference passes them, and each fails a runtime with one plausible bug."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from fault_catchers import wrong_runtime_tests
from plain_models import plain_onnx

from conformance.audit.fault import Fault, wrap
from conformance.cases import load_cases
from reference_impl.errors import ErrorCode as E
from reference_impl.errors import violation
from reference_impl.kv import attention as A

_PRECISION = "Required.KV.Attention.SoftmaxPrecisionFloat"
_LONG = "Required.KV.Attention.LongPrefill"
#: keys the runtime of ``KeysScoredUpToAThousand`` scores; the rest are never attended
_SCRATCH_KEYS = 1000


@functools.cache
def _cases() -> dict:
    return {case.id: case for case in load_cases() if case.builder == "kv_attention_contiguous_trace"}


class SoftmaxPrecisionRefused(Fault):
    """Implements the softmax in the input precision only and refuses any softmax_precision attribute."""

    fault_id = "KV-ATTENTION.softmax-precision-refused"

    def patches(self):
        def make(original):
            def check_attrs(attrs):
                if attrs.softmax_precision is not None:
                    raise violation(E.ATTENTION_INPUT_INVALID, "Attention.softmax_precision", "not supported")
                return original(attrs)
            return check_attrs
        return [wrap(A, "check_attrs", make)]


class KeysScoredUpToAThousand(Fault):
    """Scores keys in a fixed scratch of a thousand: keys beyond it get no score and are never attended."""

    fault_id = "KV-ATTENTION.keys-scored-up-to-a-thousand"

    def patches(self):
        def make(original):
            def scaled_scores(qs, k, s):
                scores = original(qs, k[:, :, :_SCRATCH_KEYS], s)
                missing = qs.shape[:3] + (k.shape[2] - scores.shape[3],)
                return np.concatenate([scores, np.full(missing, -np.inf, scores.dtype)], axis=-1)
            return scaled_scores
        return [wrap(A, "scaled_scores", make)]


test_the_reference_passes, test_the_bug_fails_its_cases, test_every_case_fails_some_bug = \
    wrong_runtime_tests(_cases, 2, [(SoftmaxPrecisionRefused(), (_PRECISION,)), (KeysScoredUpToAThousand(), (_LONG,))])


@pytest.mark.clause("KV-ATTENTION")
@pytest.mark.parametrize("case_id", [_PRECISION, _LONG])
def test_expectations_agree_with_onnx_reference_attention(case_id):
    """Y and the presents of every call equal onnx's reference Attention, the presents fed back by hand."""
    from onnx.reference import ReferenceEvaluator

    from conformance import values as V

    case = _cases()[case_id]
    evaluator = ReferenceEvaluator(plain_onnx(case))
    runs = [step for step in case.extras()["steps"] if step["op"] == "run"]
    heads, size = V.build(runs[0]["feeds"]["k"]).shape[1], V.build(runs[0]["feeds"]["k"]).shape[3]
    past = {"past_key": np.zeros((1, heads, 0, size), np.float32),
            "past_value": np.zeros((1, heads, 0, size), np.float32)}
    for index, step in enumerate(runs):
        feeds = {name: V.build(value) for name, value in step["feeds"].items()}
        got = dict(zip(("y", "present_key", "present_value"), evaluator.run(None, {**feeds, **past}), strict=True))
        for name, want in step["outputs"].items():
            np.testing.assert_allclose(got[name], V.build(want), rtol=step["rtol"], atol=step["atol"],
                                       err_msg=f"{case_id} call {index} {name}")
        past = {"past_key": got["present_key"], "past_value": got["present_value"]}

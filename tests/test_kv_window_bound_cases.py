"""The zero sliding-window rows of corpus/cases/kv/attention_attributes.toml (SlidingWindowLeftZero,
SlidingWindowRightZero): Attention-25's "A value of 0 allows the current position but no preceding position",
so a window of 0 on one side alone bounds that side. Their expectations agree with onnx's reference Attention,
the reference passes them, and a runtime reading 0 as "no window" fails them."""

from __future__ import annotations

import dataclasses
import functools

import pytest
from fault_catchers import wrong_runtime_tests
from plain_models import assert_refusable_trace_matches_onnx_reference

from conformance.audit.fault import Fault, wrap
from conformance.cases import load_cases
from reference_impl.kv import attention as A

_ROWS = ("Required.KV.Attention.SlidingWindowLeftZero", "Required.KV.Attention.SlidingWindowRightZero")


@functools.cache
def _cases() -> dict:
    return {case.id: case for case in load_cases() if case.id in _ROWS}


class ZeroWindowUnbounded(Fault):
    """Tests a window size for being set with ``> 0``: a window of 0 on either side is no window at all."""

    fault_id = "KV-ATTENTION.zero-window-unbounded"

    def patches(self):
        def make(original):
            def position_bias(q_len, start, stop, offset, attrs, dtype):
                attrs = dataclasses.replace(attrs, left_window_size=attrs.left_window_size or -1,
                                            right_window_size=attrs.right_window_size or -1)
                return original(q_len, start, stop, offset, attrs, dtype)
            return position_bias
        return [wrap(A, "position_bias", make)]


test_the_reference_passes, test_the_bug_fails_its_cases, test_every_case_fails_some_bug = \
    wrong_runtime_tests(_cases, 2, [(ZeroWindowUnbounded(), _ROWS)])


@pytest.mark.clause("KV-ATTENTION")
@pytest.mark.parametrize("case_id", _ROWS)
def test_zero_window_expectations_agree_with_onnx_reference(case_id):
    """Attention-25 in onnx's reference evaluator gives every expected output of both calls, the past fed
    back by hand."""
    assert_refusable_trace_matches_onnx_reference(_cases()[case_id])

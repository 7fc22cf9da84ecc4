"""The cases of corpus/cases/kv/attention_inputs.toml: a decode run whose inputs break one of ONNX Attention's
shape relations fails and leaves the cache as it was. The reference passes each case, and each fails a runtime
with one plausible bug, written here as a small fault: it computes something for the inputs instead of
refusing them."""

from __future__ import annotations

import functools

import numpy as np
from fault_catchers import wrong_runtime_tests

from conformance.audit.fault import Fault, wrap
from conformance.cases import load_cases, select
from reference_impl.kv import attention as A
from reference_impl.kv import kernels

_ID = "Required.KV.AttentionInputs."


@functools.cache
def _cases() -> dict:
    return {case.id: case for case in select(load_cases(), [f"{_ID}*"])}


def _head_of(q_heads: int, kv_heads: int) -> np.ndarray:
    """Query head h reads key/value head h * kv_heads // q_heads: the grouping stretched over any head counts."""
    return np.arange(q_heads) * kv_heads // q_heads


class HeadsGroupedWithoutDivisibility(Fault):
    """Groups query heads over key/value heads proportionally, so 3 query heads on 2 key/value heads run."""

    fault_id = "KV-ATTENTION.heads-grouped-without-divisibility"

    def patches(self):
        def geometry(original):
            def check_geometry(q, k, v):
                return original(q[:, :k.shape[1]] if q.shape[1] % k.shape[1] else q, k, v)
            return check_geometry

        def scores(original):
            def grouped_scores(q, k):
                k = k[:, _head_of(q.shape[1], k.shape[1])]
                return np.matmul(q, np.swapaxes(k, -1, -2)).astype(q.dtype, copy=False)
            return grouped_scores

        def values(original):
            def grouped_values(p, v):
                return np.matmul(p, v[:, _head_of(p.shape[1], v.shape[1])]).astype(p.dtype, copy=False)
            return grouped_values

        return [wrap(A, "check_geometry", geometry), wrap(A, "grouped_scores", scores),
                wrap(A, "grouped_values", values)]


class QueryHeadTruncated(Fault):
    """Dots only as many query components as the keys have: a query head size of 8 over keys of 4 runs."""

    fault_id = "KV-ATTENTION.query-head-truncated"

    def patches(self):
        def geometry(original):
            def check_geometry(q, k, v):
                return original(q[..., :k.shape[3]], k, v)
            return check_geometry

        def scores(original):
            def grouped_scores(q, k):
                return original(q[..., :k.shape[3]], k)
            return grouped_scores

        return [wrap(A, "check_geometry", geometry), wrap(A, "grouped_scores", scores)]


class MismatchedPastDiscarded(Fault):
    """Takes a past whose heads or head sizes do not fit the new tokens as stale and starts the cache over
    from the new tokens, instead of refusing the run."""

    fault_id = "KV-APPEND-EQUIV.mismatched-past-discarded"

    def patches(self):
        def make(original):
            def attention(q, k, v, attn_mask=None, past_key=None, past_value=None, *args, **kwargs):
                if past_key is not None and (past_key.shape[1::2] != k.shape[1::2]
                                             or past_value.shape[1::2] != v.shape[1::2]):
                    past_key = past_value = None
                return original(q, k, v, attn_mask, past_key, past_value, *args, **kwargs)
            return attention
        return [wrap(kernels, "attention", make)]


class MaskCutToKeys(Fault):
    """Reads a mask longer than past plus new tokens up to the last key and ignores the rest."""

    fault_id = "KV-ATTENTION.mask-cut-to-keys"

    def patches(self):
        def make(original):
            def check_mask(mask, q_dtype, target):
                return original(None if mask is None else np.asarray(mask)[..., :target[3]], q_dtype, target)
            return check_mask
        return [wrap(A, "check_mask", make)]


class MaskHeadsCutToQueries(Fault):
    """Reads a mask with more heads than the queries by its first q_num_heads heads."""

    fault_id = "KV-ATTENTION.mask-heads-cut-to-queries"

    def patches(self):
        def make(original):
            def check_mask(mask, q_dtype, target):
                if mask is not None and np.ndim(mask) == 4:
                    mask = np.asarray(mask)[:, :target[1]]
                return original(mask, q_dtype, target)
            return check_mask
        return [wrap(A, "check_mask", make)]


class MaskLeadingUnitAxesDropped(Fault):
    """Takes a mask of rank above 4 whose leading axes are 1 as the 4-D mask of its last four axes."""

    fault_id = "KV-ATTENTION.mask-leading-unit-axes-dropped"

    def patches(self):
        def make(original):
            def check_mask(mask, q_dtype, target):
                if mask is not None and np.ndim(mask) > 4 and set(np.shape(mask)[:-4]) == {1}:
                    mask = np.asarray(mask).reshape(np.shape(mask)[-4:])
                return original(mask, q_dtype, target)
            return check_mask
        return [wrap(A, "check_mask", make)]


CATCHERS = [
    (HeadsGroupedWithoutDivisibility(), (f"{_ID}QueryHeadsNotAMultiple",)),
    (QueryHeadTruncated(), (f"{_ID}QueryHeadSizeDiffers",)),
    (MismatchedPastDiscarded(), (f"{_ID}KeyHeadsDifferFromPast", f"{_ID}KeyHeadSizeDiffersFromPast",
                                 f"{_ID}ValueHeadSizeDiffersFromPast")),
    (MaskCutToKeys(), (f"{_ID}MaskLongerThanKeys",)),
    (MaskHeadsCutToQueries(), (f"{_ID}MaskHeadsDoNotBroadcast",)),
    (MaskLeadingUnitAxesDropped(), (f"{_ID}MaskRankFive",)),
]


test_the_reference_passes, test_the_bug_fails_its_cases, test_every_case_fails_some_bug = \
    wrong_runtime_tests(_cases, 8, CATCHERS)

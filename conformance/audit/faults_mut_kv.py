"""Faults in the KV attention path found by mutating the oracle: ``nonpad_kv_seqlen`` values of 0 (a batch
row of an external cache with no valid key), which no Required case used to feed, and values beyond the
cache's length, which no case fed. Each is written the way a runtime would get the rule wrong: refusing the
length 0, reading it as "no padding", dividing by the empty row's zero softmax normalizer, or not bounding
the length by the cache. Also Attention-25's sliding windows read with exclusive bounds: no case used them."""

from __future__ import annotations

import importlib

import numpy as np

from conformance.audit.fault import Fault, wrap
from reference_impl.errors import ErrorCode as E
from reference_impl.errors import violation
from reference_impl.kv import kernels

#: the module (``reference_impl.kv`` does not re-export it, but keeps the name for the package's helpers)
attention_module = importlib.import_module("reference_impl.kv.attention")


def _zero_refused(original):
    def check_nonpad(nonpad, batch, total):
        checked = original(nonpad, batch, total)
        if checked is not None and np.any(checked < 1):
            raise violation(E.ATTENTION_INPUT_INVALID, "Attention.nonpad_kv_seqlen",
                            f"values must lie in [1, {total}]")
        return checked
    return check_nonpad


class NonpadZeroRejected(Fault):
    """Requires every ``nonpad_kv_seqlen`` value to be at least 1 (a sequence length taken to be positive):
    a batch row that holds no valid key yet (ONNX: its keys are all padding, its output rows zeros) is
    refused with ATTENTION_INPUT_INVALID."""

    fault_id = "KV-ATTENTION.nonpad-zero-rejected"
    clauses = ("KV-ATTENTION",)
    boundary = True

    def patches(self):
        return [wrap(attention_module, "check_nonpad", _zero_refused)]


def _zero_as_full(original):
    def check_nonpad(nonpad, batch, total):
        checked = original(nonpad, batch, total)
        if checked is None:
            return None
        return np.where(checked == 0, total, checked)  # 0 read as "not given": the whole cache is valid
    return check_nonpad


class NonpadZeroAsFullLength(Fault):
    """Reads a ``nonpad_kv_seqlen`` value of 0 as "no padding" (0 as the unset sentinel of a length field):
    a row with no valid key attends every slot of the cache, padding included, and its causal frontier is
    placed at the end of the cache."""

    fault_id = "KV-ATTENTION.nonpad-zero-as-full-length"
    clauses = ("KV-ATTENTION",)
    boundary = True

    def patches(self):
        return [wrap(attention_module, "check_nonpad", _zero_as_full)]


def _empty_rows_nan(original):
    def attention(q, k, v, attn_mask=None, past_key=None, past_value=None, nonpad_kv_seqlen=None, **kwargs):
        out = original(q, k, v, attn_mask, past_key, past_value, nonpad_kv_seqlen, **kwargs)
        if nonpad_kv_seqlen is None:
            return out
        empty = np.asarray(nonpad_kv_seqlen) == 0
        if not empty.any():
            return out
        y = out.y.copy()
        y[empty] = np.nan  # softmax over no key: 0 / 0 in every output element of the row
        return out._replace(y=y)
    return attention


class NonpadEmptyRowNaN(Fault):
    """Attends each batch row over its first ``nonpad_kv_seqlen`` keys only (the slice, not a -inf padding
    bias) and normalizes by the sum of their weights: a row with no valid key divides 0 by 0, so its output
    rows are NaN instead of the zeros ONNX gives a fully-masked row."""

    fault_id = "KV-ATTENTION.nonpad-empty-row-nan"
    clauses = ("KV-ATTENTION",)
    boundary = True

    def patches(self):
        return [wrap(kernels, "attention", _empty_rows_nan)]


def _upper_bound_unchecked(original):
    def check_nonpad(nonpad, batch, total):
        if nonpad is None:
            return None
        array = np.asarray(nonpad)
        longest = max(int(array.max(initial=0)), total)
        return original(nonpad, batch, longest)  # checked against no cache length: only the sign and shape
    return check_nonpad


class NonpadBeyondCacheAccepted(Fault):
    """Checks ``nonpad_kv_seqlen`` for its type, shape and sign but not against the cache's length: a value
    beyond the slots K and V hold is taken as "every slot valid" (and its causal frontier placed beyond the
    cache), where a kernel bounding its key loop by the value would read past the buffer."""

    fault_id = "KV-ATTENTION.nonpad-beyond-cache-accepted"
    clauses = ("KV-ATTENTION",)
    boundary = True

    def patches(self):
        return [wrap(attention_module, "check_nonpad", _upper_bound_unchecked)]


def _window_exclusive(original):
    def position_bias(q_len, start, stop, offset, attrs, dtype):
        """attention.position_bias with ``distance < size`` for each bounded window side."""
        if attrs.left_window_size < 0 and attrs.right_window_size < 0:
            return original(q_len, start, stop, offset, attrs, dtype)
        offset = np.asarray(offset, np.int64).reshape(-1, 1, 1, 1) if np.ndim(offset) else int(offset)
        query = np.arange(q_len, dtype=np.int64).reshape(q_len, 1) + offset
        key = np.arange(start, stop, dtype=np.int64).reshape(1, stop - start)
        allowed = np.ones(np.broadcast_shapes(np.shape(query), key.shape), dtype=bool)
        if attrs.is_causal:
            allowed &= key <= query
        if attrs.left_window_size >= 0:
            allowed &= query - key < attrs.left_window_size
        if attrs.right_window_size >= 0:
            allowed &= key - query < attrs.right_window_size
        return np.where(allowed, dtype.type(0), dtype.type(-np.inf))
    return position_bias


class SlidingWindowExclusive(Fault):
    """Reads Attention-25's ``left_window_size`` / ``right_window_size`` as exclusive bounds (``distance <
    size``, a common off-by-one): a window of 1 holds only the query's own position and a window of 0 none."""

    fault_id = "KV-ATTENTION.sliding-window-exclusive"
    clauses = ("KV-ATTENTION",)
    boundary = True

    def patches(self):
        return [wrap(attention_module, "position_bias", _window_exclusive)]

"""Faults in the KV attention path found by mutating the oracle: ``nonpad_kv_seqlen`` values of 0 (a batch
row of an external cache with no valid key), which no Required case used to feed. Each is written the way a
runtime would get the rule wrong: refusing the length, reading it as "no padding", or dividing by the empty
row's zero softmax normalizer."""

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

"""Capacity, reuse and bounded-workspace KV cases: the reference passes them; a reference with one
realistic bug fails them (a whole-cache copy per append, contiguous or paged; attention over the whole
dequantized or copied cache; max_tokens not enforced; TensorScatter clipping what does not fit), the
Required cases as far as the spec's words reach and the Recommended ones at the suite's tighter figures; a
runtime without counters gets "not supported" for the counter cases, never a pass; onnxruntime, which
copies the past into every present, fails the Recommended buffer-sharing cases (tests/
test_kv_alternatives.py shows the behaviours the spec allows pass every Required case)."""

from __future__ import annotations

import numpy as np
import pytest

from conformance.adapters import load_adapter
from conformance.adapters.reference import ReferenceAdapter, ReferenceState
from conformance.audit.faults.kv_contiguous import CopiesEveryAppend, MaxTokensPerCall, WholeCacheDequantized
from conformance.cases import load_cases, select
from conformance.execute import FAILED, NOT_SUPPORTED, PASSED, run_case
from reference_impl.kv import contiguous, kernels, paged
from reference_impl.kv.storage import KVCounters, record

REUSE = "Required.KV.CapacityReuse"
BOUNDED = "Required.KV.PagedBounded"
REUSE_REC = "Recommended.KV.CapacityReuse"
BOUNDED_REC = "Recommended.KV.PagedBounded"
COUNTER_CASES = {f"{REUSE}.NoWholeCacheCopyPerAppend", f"{REUSE}.ChunkedNoWholeCacheCopyPerAppend",
                 f"{REUSE_REC}.AppendWritesOnlyNewTokens", f"{REUSE_REC}.ChunkedAppendWritesOnlyNewTokens",
                 f"{BOUNDED}.DenseWorkspaceHoldsNoWholeCache", f"{BOUNDED}.Int4WorkspaceHoldsNoWholeCache",
                 f"{BOUNDED}.AppendWritesAtMostOneBlock",
                 f"{BOUNDED_REC}.DenseWorkspaceIndependentOfContext",
                 f"{BOUNDED_REC}.Int4WorkspaceIndependentOfContext", f"{BOUNDED_REC}.AppendWritesOnlyNewTokens",
                 f"{REUSE_REC}.AppendFillingCapacityWritesOnlyNewTokens",
                 f"{BOUNDED_REC}.AppendFillingSlabWritesOnlyNewTokens"}


def _verdicts(adapter, *patterns) -> dict[str, str]:
    return {case.id: run_case(case, adapter).verdict for case in select(load_cases(), list(patterns))}


def _failed(adapter, *patterns) -> set[str]:
    return {case_id for case_id, verdict in _verdicts(adapter, *patterns).items() if verdict == FAILED}


@pytest.mark.clause("KV-CAPACITY-REUSE", "KV-APPEND-INPLACE", "KV-BOUNDED", "KV-CAPACITY-INVALID",
                    "KV-MUTATION-FAILED")
def test_the_reference_passes_the_capacity_and_bounded_cases():
    verdicts = _verdicts(ReferenceAdapter(), REUSE, BOUNDED, REUSE_REC, BOUNDED_REC, "Required.KV.Capacity",
                         "Required.KV.PagedCapacity")
    assert len(verdicts) >= 20 and set(verdicts.values()) == {PASSED}, verdicts


@pytest.mark.clause("KV-CAPACITY-REUSE", "KV-APPEND-INPLACE")
def test_a_whole_cache_copy_per_append_is_caught():
    """Every append relocates: a fresh allocation holding past and new tokens, as a copying runtime does,
    although nothing but the state refers to the cache."""
    assert _failed(CopiesEveryAppend(), REUSE) == {f"{REUSE}.NoWholeCacheCopyPerAppend",
                                                   f"{REUSE}.ChunkedNoWholeCacheCopyPerAppend"}
    assert _failed(CopiesEveryAppend(), REUSE_REC) == {f"{REUSE_REC}.{name}" for name in (
        "PresentsShareOneAllocation", "GroupedQueryPresentsShareOneAllocation", "AppendWritesOnlyNewTokens",
        "ChunkedAppendWritesOnlyNewTokens", "AppendFillingCapacityWritesOnlyNewTokens")}


@pytest.mark.clause("KV-BOUNDED", "KV-APPEND-INPLACE")
def test_a_paged_append_that_rewrites_every_block_is_caught(monkeypatch):
    """The new cache gets a fresh copy of every dense block (and honestly counts the bytes it copied)."""
    append = paged.PagedKVCache.append

    def copying(self, *args, **kwargs):
        grown = append(self, *args, **kwargs)
        blocks = []
        for block in grown.blocks:
            key, value = np.array(block.key_codec.decode(block.key)), np.array(block.value_codec.decode(block.value))
            record(KVCounters(relocated_bytes=key.nbytes + value.nbytes))
            blocks.append(paged.make_block(block.start, block.valid, key, value, grown.geometry))
        return paged.PagedKVCache(grown.kv_heads, grown.head_size, grown.v_head_size, grown.block_size, tuple(blocks))

    monkeypatch.setattr(paged.PagedKVCache, "append", copying)
    assert _failed(ReferenceAdapter(), BOUNDED, BOUNDED_REC) == {f"{BOUNDED}.AppendWritesAtMostOneBlock",
                                                                 f"{BOUNDED_REC}.AppendWritesOnlyNewTokens",
                                                                 f"{BOUNDED_REC}.AppendFillingSlabWritesOnlyNewTokens"}


@pytest.mark.clause("KV-BOUNDED")
def test_attention_over_the_whole_dequantized_cache_is_caught():
    """Every block decoded (dense ones copied) into one group before attending: all keys at once, then all
    values."""
    assert _failed(WholeCacheDequantized(), BOUNDED, BOUNDED_REC) == {
        f"{BOUNDED}.DenseWorkspaceHoldsNoWholeCache", f"{BOUNDED}.Int4WorkspaceHoldsNoWholeCache",
        f"{BOUNDED_REC}.DenseWorkspaceIndependentOfContext", f"{BOUNDED_REC}.Int4WorkspaceIndependentOfContext"}


@pytest.mark.clause("KV-MUTATION-FAILED")
def test_max_tokens_checked_against_the_call_alone_is_caught():
    assert _failed(MaxTokensPerCall(), "Required.KV.PagedCapacity") == {
        "Required.KV.PagedCapacity.MaxTokensExceededWritesNothing",
        "Required.KV.PagedCapacity.MaxTokensCountsCallerBlocks"}


@pytest.mark.clause("KV-CAPACITY-INVALID", "KV-MUTATION-FAILED")
def test_an_unenforced_max_tokens_is_caught(monkeypatch):
    original = kernels._int_attribute
    monkeypatch.setattr(kernels, "_int_attribute", lambda attrs, name, default:
                        1 << 30 if name == "max_tokens" else original(attrs, name, default))
    assert _failed(ReferenceAdapter(), "Required.KV.PagedCapacity") >= {
        "Required.KV.PagedCapacity.ZeroMaxTokens", "Required.KV.PagedCapacity.NegativeMaxTokens",
        "Required.KV.PagedCapacity.MaxTokensExceededWritesNothing"}


class ClippingScatter(ReferenceAdapter):
    """TensorScatter that writes whatever part of the update fits instead of rejecting it."""

    def executor_kernels(self):
        def scatter(args, attrs, ctx):
            past, update, indices = args
            capacity = past.shape[2]
            if capacity == 0:
                return [past.copy()]
            mode = attrs.get("mode", "linear")
            return [contiguous.tensor_scatter(past, update[:, :, :capacity], indices, mode)]

        return {**super().executor_kernels(), ("", "TensorScatter"): scatter}


@pytest.mark.clause("KV-CAPACITY-INVALID")
def test_a_scatter_that_clips_what_does_not_fit_is_caught():
    assert _failed(ClippingScatter(), "Required.KV.Capacity") >= {"Required.KV.Capacity.ZeroCapacityCache",
                                                                  "Required.KV.Capacity.UpdateLongerThanRing"}


class NoCounters(ReferenceAdapter):
    def open_state(self, *args):
        state = super().open_state(*args)

        class Plain:
            def __getattr__(self, name):
                if name == "counters":
                    raise AttributeError(name)
                return getattr(state, name)

        return Plain()


def test_counter_cases_are_not_supported_without_counters():
    verdicts = _verdicts(NoCounters(), REUSE, BOUNDED, REUSE_REC, BOUNDED_REC)
    assert {case_id for case_id, verdict in verdicts.items() if verdict == NOT_SUPPORTED} == COUNTER_CASES
    assert set(verdicts.values()) <= {PASSED, NOT_SUPPORTED}


def test_reference_counters_name_the_kv_bytes_and_workspace():
    state = ReferenceAdapter().open_state(select(load_cases(), [f"{BOUNDED}.AppendWritesAtMostOneBlock"])[0]
                                          .model_bytes(), {"cache": _empty_cache()})
    assert isinstance(state, ReferenceState)
    before = state.counters()
    assert before["kv_bytes_written"] == 0 and before["attention_peak_workspace_bytes"] == 0
    rng = np.random.default_rng(0)
    state.run({"q": rng.standard_normal((1, 4, 1, 8)).astype(np.float32),
               "k": rng.standard_normal((1, 2, 1, 8)).astype(np.float32),
               "v": rng.standard_normal((1, 2, 1, 8)).astype(np.float32)})
    after = state.counters()
    assert after["kv_bytes_written"] == 2 * 2 * 8 * 4 and after["attention_peak_workspace_bytes"] > 0


def _empty_cache():
    from conformance.values import Struct

    return Struct({"blocks": [], "length": np.array(0, np.int64)}, 3101)


@pytest.mark.parametrize("peer", ["onnxruntime", "onnx-reference"])
def test_a_runtime_that_copies_the_past_into_every_present_fails_the_recommended_sharing(peer):
    """A peer copies past into each present while the caller holds every present: allowed (ownership does
    not permit reuse there), so only the Recommended sharing case tells it apart; the Required reuse cases
    need counters it does not report."""
    if peer == "onnxruntime":
        pytest.importorskip("onnxruntime")
    verdicts = _verdicts(load_adapter(peer), REUSE, REUSE_REC)
    assert verdicts[f"{REUSE_REC}.PresentsShareOneAllocation"] == FAILED
    assert verdicts[f"{REUSE}.NoWholeCacheCopyPerAppend"] == NOT_SUPPORTED  # it reports no counters
    assert verdicts[f"{REUSE_REC}.AppendWritesOnlyNewTokens"] == NOT_SUPPORTED

"""Contiguous KV caches: append equals concatenation and TensorScatter, writes only new tokens, never
changes a handed-out view, and leaves the cache untouched when it fails or is cancelled."""

from __future__ import annotations

import threading
import tracemalloc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx_cases import node_cases

from reference_impl.errors import ContractError, ErrorCode
from reference_impl.kv import contiguous as kvc
from reference_impl.kv.attention import attention
from reference_impl.kv.storage import KVCounters, counting

F32 = np.float32


def _tokens(rng, batch, heads, count, head=4):
    return rng.standard_normal((batch, heads, count, head)).astype(F32)


# ----------------------------------------------------------------------------- append == concat
@pytest.mark.clause("KV-APPEND-EQUIV")
@settings(max_examples=60, deadline=None, database=None)
@given(chunks=st.lists(st.integers(0, 5), min_size=1, max_size=12), capacity=st.integers(1, 16),
       start=st.sampled_from(["empty_cache", "plain"]), seed=st.integers(0, 1000))
def test_append_then_read_equals_concatenation(chunks, capacity, start, seed):
    rng = np.random.default_rng(seed)
    parts = [_tokens(rng, 2, 3, n) for n in chunks]
    with kvc.capacity_policy(initial=capacity):
        past = kvc.empty_cache(2, 3, 4, capacity, fixed=False) if start == "empty_cache" \
            else np.zeros((2, 3, 0, 4), F32)
        history = [past]
        for part in parts:
            past = kvc.append(past, part)
            history.append(past)
    expected = np.zeros((2, 3, 0, 4), F32)
    for view, part in zip(history[1:], parts):
        expected = np.concatenate([expected, part], axis=2)
        np.testing.assert_array_equal(view, expected)  # every earlier view still reads its own prefix
    assert not past.flags.writeable


@pytest.mark.clause("KV-APPEND-EQUIV")
@settings(max_examples=40, deadline=None, database=None)
@given(chunks=st.lists(st.integers(1, 4), min_size=1, max_size=10), seed=st.integers(0, 1000))
def test_cache_object_appends_equal_concatenation(chunks, seed):
    rng = np.random.default_rng(seed)
    cache = kvc.ContiguousKVCache(1, 2, 4, 3, v_head_size=6, grow=True)
    keys, values = np.zeros((1, 2, 0, 4), F32), np.zeros((1, 2, 0, 6), F32)
    for n in chunks:
        k, v = _tokens(rng, 1, 2, n), _tokens(rng, 1, 2, n, 6)
        cache.append(k, v)
        keys, values = np.concatenate([keys, k], 2), np.concatenate([values, v], 2)
        np.testing.assert_array_equal(cache.keys(), keys)
        np.testing.assert_array_equal(cache.values(), values)


# ----------------------------------------------------------------------------- bytes written
@pytest.mark.clause("KV-APPEND-INPLACE", "KV-CAPACITY-REUSE")
def test_in_place_append_writes_only_new_tokens():
    rng = np.random.default_rng(1)
    past = kvc.empty_cache(1, 2, 4, 4096)
    written = []
    for step in range(300):
        new = _tokens(rng, 1, 2, 1)
        with counting() as counters:
            present = kvc.append(past, new)
        written.append((counters.appended_bytes, counters.relocated_bytes, counters.allocated_bytes))
        assert np.shares_memory(present, past) or step == 0
        past = present
    assert set(written) == {(new.nbytes, 0, 0)}  # the same few bytes at context 1 and at context 300


@pytest.mark.clause("KV-APPEND-INPLACE", "KV-BOUNDED")
def test_append_allocates_nothing_proportional_to_context():
    """tracemalloc sees NumPy allocations: an in-place append at context 4000 allocates no more than at 40."""
    rng = np.random.default_rng(2)
    new = _tokens(rng, 1, 4, 1, 64)
    peaks = {}
    for context in (40, 4000):
        past = kvc.append(kvc.empty_cache(1, 4, 64, 8192), _tokens(rng, 1, 4, context, 64))
        tracemalloc.start()
        kvc.append(past, new)
        peaks[context] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    context_bytes = 4000 * new.nbytes
    assert peaks[4000] < 16 * 1024 < context_bytes
    assert peaks[4000] <= peaks[40] + 1024


@pytest.mark.clause("KV-APPEND-EQUIV")
def test_attention_with_cache_append_equals_concat_attention():
    rng = np.random.default_rng(3)
    past_k = past_v = None
    cache_k, cache_v = kvc.empty_cache(1, 2, 8, 64), kvc.empty_cache(1, 2, 8, 64)
    ref_k, ref_v = np.zeros((1, 2, 0, 8), F32), np.zeros((1, 2, 0, 8), F32)
    for _ in range(20):
        q, k, v = _tokens(rng, 1, 4, 1, 8), _tokens(rng, 1, 2, 1, 8), _tokens(rng, 1, 2, 1, 8)
        with counting() as counters:
            ours = attention(q, k, v, None, cache_k, cache_v, is_causal=1, append=kvc.append)
        want = attention(q, k, v, None, ref_k, ref_v, is_causal=1)
        np.testing.assert_array_equal(ours.y, want.y)
        np.testing.assert_array_equal(ours.present_key, want.present_key)
        assert counters.appended_bytes == k.nbytes + v.nbytes and counters.relocated_bytes == 0
        cache_k, cache_v, ref_k, ref_v = ours.present_key, ours.present_value, want.present_key, want.present_value
    del past_k, past_v


# ----------------------------------------------------------------------------- capacity
@pytest.mark.clause("KV-CAPACITY-INVALID")
@pytest.mark.parametrize("capacity", [0, -3, 1.5, True, "8", None, 2**40])
def test_invalid_capacities_are_rejected(capacity):
    builders = [lambda: kvc.empty_cache(1, 2, 4, capacity), lambda: kvc.ContiguousKVCache(1, 2, 4, capacity)]
    if capacity != 2**40:  # a policy is only a number; the allocation limit applies when storage is made
        builders.append(lambda: kvc.capacity_policy(initial=capacity).__enter__())
    for build in builders:
        with pytest.raises(ContractError) as info:
            build()
        assert info.value.code == ErrorCode.KV_CAPACITY_INVALID


@pytest.mark.clause("KV-CAPACITY-INVALID")
def test_circular_cache_cannot_grow():
    with pytest.raises(ContractError) as info:
        kvc.ContiguousKVCache(1, 1, 4, 8, mode="circular", grow=True)
    assert info.value.code == ErrorCode.KV_CAPACITY_INVALID


def _snapshot(cache):
    return cache.keys().copy(), cache.values().copy(), cache.lengths.copy(), cache.storage_ids()


def _assert_unchanged(cache, snapshot):
    keys, values, lengths, ids = snapshot
    np.testing.assert_array_equal(cache.keys(), keys)
    np.testing.assert_array_equal(cache.values(), values)
    np.testing.assert_array_equal(cache.lengths, lengths)
    assert cache.storage_ids() == ids


@pytest.mark.clause("KV-MUTATION-FAILED", "ZC-FAILURE")
def test_fixed_capacity_is_an_error_and_the_cache_is_unchanged():
    rng = np.random.default_rng(4)
    cache = kvc.ContiguousKVCache(1, 2, 4, 5)
    cache.append(_tokens(rng, 1, 2, 4), _tokens(rng, 1, 2, 4))
    before = _snapshot(cache)
    with pytest.raises(ContractError) as info:
        cache.append(_tokens(rng, 1, 2, 2), _tokens(rng, 1, 2, 2))
    assert info.value.code == ErrorCode.KV_CAPACITY_EXCEEDED
    _assert_unchanged(cache, before)
    past = kvc.empty_cache(1, 2, 4, 3)
    with pytest.raises(ContractError) as info:
        kvc.append(past, _tokens(rng, 1, 2, 4))
    assert info.value.code == ErrorCode.KV_CAPACITY_EXCEEDED


@pytest.mark.clause("KV-CAPACITY-REUSE", "ZC-NO-INPLACE")
def test_growth_moves_to_larger_storage_and_keeps_old_views():
    rng = np.random.default_rng(5)
    cache = kvc.ContiguousKVCache(1, 2, 4, 4, grow=True)
    cache.append(_tokens(rng, 1, 2, 3), _tokens(rng, 1, 2, 3))
    old_keys = cache.keys()
    saved = old_keys.copy()
    stats = cache.append(_tokens(rng, 1, 2, 3), _tokens(rng, 1, 2, 3))
    assert stats.relocated and cache.capacity == 8
    assert stats.relocated_bytes == 2 * saved.nbytes  # K and V moved once; the append itself wrote 3 tokens
    np.testing.assert_array_equal(old_keys, saved)
    np.testing.assert_array_equal(cache.keys()[:, :, :3], saved)


# ----------------------------------------------------------------------------- views never change
@pytest.mark.clause("ZC-NO-INPLACE", "ZC-OUTSTANDING")
def test_branching_from_an_older_prefix_moves_to_fresh_storage():
    rng = np.random.default_rng(6)
    base = kvc.append(kvc.empty_cache(1, 1, 4, 16), _tokens(rng, 1, 1, 3))
    first = kvc.append(base, _tokens(rng, 1, 1, 2))
    first_saved = first.copy()
    with counting() as counters:
        second = kvc.append(base, _tokens(rng, 1, 1, 2))  # the slots behind ``base`` are already claimed
    assert counters.relocated_bytes == base.nbytes and not np.shares_memory(first, second)
    np.testing.assert_array_equal(first, first_saved)
    np.testing.assert_array_equal(second[:, :, :3], base)
    with counting() as counters:
        kvc.append(first, _tokens(rng, 1, 1, 1))  # ``first`` is still the claimed prefix: in place
    assert counters.in_place_appends == 1


@pytest.mark.clause("ZC-NO-INPLACE", "ZC-OUTSTANDING")
def test_circular_overwrite_moves_while_a_view_is_held_and_stays_in_place_otherwise():
    rng = np.random.default_rng(7)
    cache = kvc.ContiguousKVCache(1, 2, 4, 4, mode="circular")
    cache.append(_tokens(rng, 1, 2, 4), _tokens(rng, 1, 2, 4))
    held = cache.keys()
    saved = held.copy()
    ids = cache.storage_ids()
    stats = cache.append(_tokens(rng, 1, 2, 1), _tokens(rng, 1, 2, 1))
    assert stats.relocated and cache.storage_ids() != ids
    np.testing.assert_array_equal(held, saved)
    del held
    ids = cache.storage_ids()
    stats = cache.append(_tokens(rng, 1, 2, 1), _tokens(rng, 1, 2, 1))
    assert not stats.relocated and cache.storage_ids() == ids and stats.relocated_bytes == 0


# ----------------------------------------------------------------------------- view tracking
def _bases(array):
    """The array and every array on its base chain."""
    chain = [array]
    while isinstance(chain[-1].base, np.ndarray):
        chain.append(chain[-1].base)
    return chain


@pytest.mark.clause("ZC-READ-ONLY", "ZC-NO-INPLACE")
def test_no_handed_out_view_or_its_base_can_be_made_writable():
    rng = np.random.default_rng(14)
    cache = kvc.ContiguousKVCache(1, 2, 4, 4)
    cache.append(_tokens(rng, 1, 2, 2), _tokens(rng, 1, 2, 2))
    present = kvc.append(kvc.empty_cache(1, 2, 4, 8, token_major=True), _tokens(rng, 1, 2, 3))
    for view in (present, kvc.append(present, _tokens(rng, 1, 2, 1)), cache.keys(), cache.full_values(),
                 kvc.empty_cache(1, 1, 4, 2)):
        for array in _bases(view):
            assert not array.flags.writeable
            with pytest.raises(ValueError):
                array.flags.writeable = True


@pytest.mark.clause("ZC-NO-INPLACE", "ZC-OUTSTANDING")
@pytest.mark.parametrize("derive", ["view", "slice", "bytes", "buffer"])
def test_liveness_does_not_depend_on_reference_counts(monkeypatch, derive):
    """Reference counts are an interpreter detail (a borrowed reference is not counted); a view and
    anything derived from it must hold the storage's claim whatever ``sys.getrefcount`` says."""
    import sys

    monkeypatch.setattr(sys, "getrefcount", lambda obj: 2)  # "nobody else refers to it"
    rng = np.random.default_rng(15)
    cache = kvc.ContiguousKVCache(1, 2, 4, 4, mode="circular")
    cache.append(_tokens(rng, 1, 2, 4), _tokens(rng, 1, 2, 4))
    held = {"view": lambda x: x, "slice": lambda x: x[:, :1, :2].transpose(0, 2, 1, 3),
            "bytes": lambda x: x.reshape(-1).view(np.uint8),
            "buffer": lambda x: np.frombuffer(memoryview(x[0, 0, 0]), np.uint8)}[derive](cache.keys())
    saved = held.copy()
    ids = cache.storage_ids()
    stats = cache.append(_tokens(rng, 1, 2, 1), _tokens(rng, 1, 2, 1))  # overwrites slot 0, which is visible
    assert stats.relocated and cache.storage_ids() != ids
    np.testing.assert_array_equal(held, saved)


@pytest.mark.clause("KV-APPEND-INPLACE", "ZC-NO-INPLACE")
def test_an_abandoned_branch_frees_its_slots_for_in_place_appends():
    """Positions only a dropped view could see are unseen again: the older prefix appends in place."""
    rng = np.random.default_rng(16)
    base = kvc.append(kvc.empty_cache(1, 2, 4, 16), _tokens(rng, 1, 2, 3))
    longer = kvc.append(base, _tokens(rng, 1, 2, 2))
    with counting() as counters:
        kvc.append(base, _tokens(rng, 1, 2, 1))
    assert counters.relocated_bytes == base.nbytes  # ``longer`` is alive: its slots are off limits
    saved = longer.copy()
    derived = longer[:, :, 3:]  # still sees the branch's tokens
    del longer
    with counting() as counters:
        kvc.append(base, _tokens(rng, 1, 2, 1))
    assert counters.relocated_bytes == base.nbytes
    np.testing.assert_array_equal(derived, saved[:, :, 3:])
    del derived
    new = _tokens(rng, 1, 2, 2)
    with counting() as counters:
        present = kvc.append(base, new)
    assert counters.in_place_appends == 1 and counters.relocated_bytes == 0
    np.testing.assert_array_equal(present, np.concatenate([base, new], axis=2))


# ----------------------------------------------------------------------------- failure and cancellation
class _CancelOnCall:
    def __init__(self, call: int):
        self.call, self.calls = call, 0

    def __call__(self) -> bool:
        self.calls += 1
        return self.calls == self.call


@pytest.mark.clause("ZC-FAILURE", "KV-MUTATION-FAILED")
@pytest.mark.parametrize("mode, hold_view", [("linear", False), ("linear", True), ("circular", True),
                                             ("circular", False)])
@pytest.mark.parametrize("cancel_at", [1, 2])
def test_cancelled_append_leaves_the_cache_as_it_was(mode, hold_view, cancel_at):
    rng = np.random.default_rng(8)
    cache = kvc.ContiguousKVCache(1, 2, 4, 8 if mode == "linear" else 6, mode=mode)  # circular wraps
    cache.append(_tokens(rng, 1, 2, 5), _tokens(rng, 1, 2, 5))
    held = cache.keys() if hold_view else None
    before = _snapshot(cache)
    cancel = _CancelOnCall(cancel_at)
    try:
        cache.append(_tokens(rng, 1, 2, 2), _tokens(rng, 1, 2, 2), cancel=cancel)
    except ContractError as error:
        assert error.code == ErrorCode.STATE_CANCELLED
        _assert_unchanged(cache, before)
    else:
        # circular, no view held: the key overwrote live slots in place, so the only checkpoint was the
        # one before the first write and the append had to complete.
        assert (mode, hold_view, cancel_at) == ("circular", False, 2)
    del held


@pytest.mark.clause("ZC-FAILURE")
def test_cancelled_functional_append_releases_its_reservation():
    rng = np.random.default_rng(9)
    past = kvc.append(kvc.empty_cache(1, 1, 4, 8), _tokens(rng, 1, 1, 2))
    with pytest.raises(ContractError) as info:
        kvc.append(past, _tokens(rng, 1, 1, 1), cancel=lambda: True)
    assert info.value.code == ErrorCode.STATE_CANCELLED
    with counting() as counters:
        kvc.append(past, _tokens(rng, 1, 1, 1))
    assert counters.in_place_appends == 1 and counters.relocated_bytes == 0


def _pasts(rng, capacities=(8, 8), fixed=True):
    return tuple(kvc.append(kvc.empty_cache(1, 2, 4, capacity, fixed=fixed), _tokens(rng, 1, 2, 2))
                 for capacity in capacities)


@pytest.mark.clause("ZC-FAILURE", "KV-MUTATION-FAILED")
@pytest.mark.parametrize("cancel_at", [1, 2])
def test_a_cancelled_key_value_update_publishes_nothing_and_gives_back_both_reservations(cancel_at):
    """Cancelled before the key write or between the key and value writes: while the error is still
    held, both allocations are claimed exactly to the kept pasts, and nothing was committed."""
    rng = np.random.default_rng(17)
    past_k, past_v = _pasts(rng)
    storages = kvc.storage_of(past_k), kvc.storage_of(past_v)
    new_k, new_v = _tokens(rng, 1, 2, 1), _tokens(rng, 1, 2, 1)
    with counting() as counters:
        with pytest.raises(ContractError) as info:
            kvc.append_kv(past_k, new_k, past_v, new_v, cancel=_CancelOnCall(cancel_at))
        assert info.value.code == ErrorCode.STATE_CANCELLED
        assert [s.claimed for s in storages] == [2, 2]
    assert counters == KVCounters()
    with counting() as counters:
        present_k, present_v = kvc.append_kv(past_k, new_k, past_v, new_v)
    assert (counters.in_place_appends, counters.relocated_bytes) == (2, 0)
    np.testing.assert_array_equal(present_v, np.concatenate([past_v, new_v], axis=2))


@pytest.mark.clause("ZC-FAILURE", "KV-MUTATION-FAILED")
def test_a_value_that_cannot_grow_fails_the_whole_update_before_the_key_is_written():
    rng = np.random.default_rng(18)
    past_k, past_v = _pasts(rng, capacities=(8, 2))  # the value allocation is full and fixed
    with counting() as counters:
        with pytest.raises(ContractError) as info:
            kvc.append_kv(past_k, _tokens(rng, 1, 2, 1), past_v, _tokens(rng, 1, 2, 1))
        assert info.value.code == ErrorCode.KV_CAPACITY_EXCEEDED and info.value.path == "kv.append.value"
        assert kvc.storage_of(past_k).claimed == 2
    assert counters == KVCounters()


@pytest.mark.clause("ZC-FAILURE", "KV-ATTENTION")
def test_attention_validates_every_input_before_the_cache_is_touched():
    rng = np.random.default_rng(19)
    past_k, past_v = _pasts(rng)
    q, k, v = _tokens(rng, 1, 2, 1), _tokens(rng, 1, 2, 1), _tokens(rng, 1, 2, 1)
    bad_mask = np.ones((1, 2, 1, 5), np.float16)  # neither bool nor the query type
    for append in ({"append": kvc.append}, {"append_kv": kvc.append_kv}):
        with counting() as counters:
            with pytest.raises(ContractError) as info:
                attention(q, k, v, bad_mask, past_k, past_v, **append)
        assert info.value.code == ErrorCode.ATTENTION_INPUT_INVALID and counters == KVCounters()
        assert kvc.storage_of(past_k).claimed == 2


@pytest.mark.clause("ZC-FAILURE", "KV-MUTATION-FAILED")
@pytest.mark.parametrize("key_shape, value_shape, dtype", [
    ((1, 2, 1, 4), (1, 2, 1, 5), F32),   # value head size wrong
    ((1, 2, 1, 4), (1, 2, 2, 4), F32),   # token counts differ
    ((1, 3, 1, 4), (1, 3, 1, 4), F32),   # heads wrong
    ((1, 2, 1, 4), (1, 2, 1, 4), np.float16),
])
def test_failed_append_is_classified_and_changes_nothing(key_shape, value_shape, dtype):
    rng = np.random.default_rng(10)
    cache = kvc.ContiguousKVCache(1, 2, 4, 8)
    cache.append(_tokens(rng, 1, 2, 2), _tokens(rng, 1, 2, 2))
    before = _snapshot(cache)
    with pytest.raises(ContractError) as info:
        cache.append(np.zeros(key_shape, dtype), np.zeros(value_shape, dtype))
    assert info.value.code == ErrorCode.KV_SHAPE_MISMATCH
    _assert_unchanged(cache, before)
    with pytest.raises(ContractError):
        kvc.append(cache.keys(), np.zeros((1, 2, 1, 5), F32))


@pytest.mark.clause("STATE-ISOLATION", "ZC-NO-INPLACE")
def test_concurrent_appends_to_one_prefix_do_not_interfere():
    rng = np.random.default_rng(11)
    base = kvc.append(kvc.empty_cache(1, 2, 4, 64), _tokens(rng, 1, 2, 4))
    updates = [_tokens(rng, 1, 2, 3) for _ in range(8)]
    results = [None] * len(updates)
    barrier = threading.Barrier(len(updates))

    def worker(i):
        barrier.wait()
        results[i] = kvc.append(base, updates[i])

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(updates))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for result, update in zip(results, updates):
        np.testing.assert_array_equal(result, np.concatenate([base, update], axis=2))


# ----------------------------------------------------------------------------- TensorScatter


def _onnx_tensor_scatter(past, update, indices, mode, axis):
    from onnx.reference.ops.op_tensor_scatter import TensorScatter

    return TensorScatter.eval(past, update, indices, mode=mode, axis=axis)


@pytest.mark.clause("KV-APPEND-EQUIV")
@settings(max_examples=60, deadline=None, database=None)
@given(mode=st.sampled_from(kvc.MODES), axis=st.sampled_from([-2, 2, 1, -1]), batch=st.integers(1, 3),
       capacity=st.integers(1, 7), data=st.data())
def test_tensor_scatter_matches_onnx(mode, axis, batch, capacity, data):
    rng = np.random.default_rng(data.draw(st.integers(0, 1000)))
    shape = [batch, 2, 3, 4]
    shape[axis] = capacity
    count = data.draw(st.integers(0, capacity))
    update_shape = list(shape)
    update_shape[axis] = count
    high = capacity - count + 1 if mode == "linear" else 3 * capacity
    indices = rng.integers(0, high, size=batch).astype(np.int64)
    past, update = rng.standard_normal(shape).astype(F32), rng.standard_normal(update_shape).astype(F32)
    want = _onnx_tensor_scatter(past, update, indices, mode, axis)
    np.testing.assert_array_equal(kvc.tensor_scatter(past, update, indices, mode, axis), want)


@pytest.mark.clause("KV-APPEND-EQUIV")
def test_tensor_scatter_backend_cases():
    from onnx import helper

    cases = [c for c in node_cases("TensorScatter") if len(c.model.graph.node) == 1]
    assert cases
    for case in cases:
        node = case.model.graph.node[0]
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        attrs = {k: v.decode() if isinstance(v, bytes) else v for k, v in attrs.items()}
        for inputs, outputs in case.data_sets:
            got = kvc.tensor_scatter(*inputs, **attrs)
            np.testing.assert_array_equal(got, outputs[0], err_msg=case.name)


@pytest.mark.clause("KV-APPEND-EQUIV")
@pytest.mark.parametrize("mode", kvc.MODES)
def test_cache_object_equals_chained_tensor_scatter(mode):
    rng = np.random.default_rng(12)
    capacity = 7
    cache = kvc.ContiguousKVCache(2, 2, 4, capacity, mode=mode)
    ref_k, ref_v = np.zeros((2, 2, capacity, 4), F32), np.zeros((2, 2, capacity, 4), F32)
    for count in [3, 1, 2, 1] + ([4, 3, 5] if mode == "circular" else []):
        k, v = _tokens(rng, 2, 2, count), _tokens(rng, 2, 2, count)
        indices = cache.write_indices
        ref_k = _onnx_tensor_scatter(ref_k, k, indices, mode, -2)
        ref_v = _onnx_tensor_scatter(ref_v, v, indices, mode, -2)
        stats = cache.append(k, v)
        assert stats.appended_bytes == k.nbytes + v.nbytes
        np.testing.assert_array_equal(cache.full_keys(), ref_k)
        np.testing.assert_array_equal(cache.full_values(), ref_v)


@pytest.mark.clause("KV-APPEND-EQUIV")
def test_tensor_scatter_rejections():
    past = np.zeros((2, 2, 4, 3), F32)
    for args, code in [((past, np.zeros((2, 2, 5, 3), F32)), ErrorCode.KV_SHAPE_MISMATCH),
                       ((past, np.zeros((2, 3, 1, 3), F32)), ErrorCode.KV_SHAPE_MISMATCH),
                       ((past, np.zeros((2, 2, 2, 3), F32), np.array([3, 0])), ErrorCode.KV_CAPACITY_EXCEEDED),
                       ((past, np.zeros((2, 2, 1, 3), F32), np.array([-1, 0])), ErrorCode.KV_SHAPE_MISMATCH)]:
        with pytest.raises(ContractError) as info:
            kvc.tensor_scatter(*args)
        assert info.value.code == code
    with pytest.raises(ContractError):
        kvc.tensor_scatter(past, past, axis=0)
    with pytest.raises(ContractError):
        kvc.tensor_scatter(past, past, mode="ring")


@pytest.mark.clause("KV-APPEND-INPLACE", "ZC-RETAIN")
def test_token_major_cache_stays_c_contiguous_while_growing_in_place():
    """(1, S, H, D) views of a token-major allocation are contiguous prefixes: retainable as they are."""
    rng = np.random.default_rng(13)
    past = kvc.empty_cache(1, 2, 4, 32, token_major=True)
    expected = np.zeros((1, 2, 0, 4), F32)
    for _ in range(10):
        new = _tokens(rng, 1, 2, 2)
        with counting() as counters:
            present = kvc.append(past, new)
        expected = np.concatenate([expected, new], axis=2)
        bshd = present.transpose(0, 2, 1, 3)
        assert bshd.flags.c_contiguous and counters.in_place_appends == 1
        np.testing.assert_array_equal(present, expected)
        past = bshd.transpose(0, 2, 1, 3)  # the model transposes the retained (B, S, H, D) back

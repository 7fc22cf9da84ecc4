"""Faults in contiguous KV caches: appends, capacity, bounded work and failed mutations."""

from __future__ import annotations

import threading

import numpy as np

from conformance.audit.fault import TESTEE_COPIES_RETURNED_VALUES, Fault, Patch, fault, name_faults, wrap
from conformance.audit.faults.shared import paged_attention_module as paged_attention
from reference_impl.errors import ContractError, violation
from reference_impl.errors import ErrorCode as E
from reference_impl.kv import contiguous, kernels, paged, storage
from reference_impl.kv.storage import KVCounters, counting_active, record


def _write_one_early(self) -> None:
    """contiguous._Append.write with the new tokens written one slot too early."""
    slots = self.storage.slots()
    past = self.past.shape[2]
    if not self.in_place:
        slots[:, :, :past] = self.past
    start = max(past - 1, 0)
    slots[:, :, start:start + self.new.shape[2]] = self.new


def _claim_if_it_fits(storage, past, needed):
    """Claims the slots behind any prefix view with room, without asking whether another branch holds
    a longer view of the same allocation."""
    if storage is None or not storage.is_prefix_view(past) or needed > storage.capacity:
        return False
    storage.claimed = needed
    return True


def _unbounded_groups(original):
    def block_groups(blocks, budget=paged.GROUP_BYTES):
        return original(blocks, budget=1 << 62)  # its own memo key: groups the reference made are not reused
    return block_groups


def _extends_without_bound(group, in_place, block, budget):
    """paged._extends without the byte, token and slab bounds: every run of compatible blocks is one group."""
    previous = group[-1]
    if previous.valid != previous.tokens:
        return False
    if in_place:
        return paged._adjacent(previous, block)
    return block.signature is not None and block.valid == block.tokens and block.signature == previous.signature


def _paged_attributes(read) -> Patch:
    """kernels.paged_attention_kernel reading its attributes as ``read(args, attrs)`` gives them (or refusing)."""
    def make(original):
        def kernel(args, attrs, ctx):
            return original(args, read(args, attrs), ctx)
        return kernel
    return wrap(kernels, "paged_attention_kernel", make)


def _count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _max_tokens_per_call(args, attrs):
    limit = attrs.get("max_tokens", 4096)
    if len(args) >= 4 and _count(limit) and limit > 0:
        new = args[1]
        if isinstance(new, np.ndarray) and new.ndim == 4 and new.shape[2] > limit:
            raise violation(E.KV_CAPACITY_EXCEEDED, "PagedAttention.max_tokens",
                            f"{new.shape[2]} new tokens exceed max_tokens {limit}")
        attrs = {**attrs, "max_tokens": 1 << 62}
    return attrs


def _reserve_below_capacity(self, length, needed):
    """KVStorage.reserve with ``>=``: a reservation ending exactly at the capacity is refused."""
    with self.lock:
        if needed >= self.capacity or self._claimed() != length:
            return False
        self._reservations.append(needed)
        return True


def _scatter(sequence_axis: int | None = None, wrap: bool = True, first_index: bool = False):
    """The ``executor_kernels`` of a runtime whose TensorScatter kernel has one bug: it writes along ``sequence_axis``
    whatever the axis attribute says (None: the attribute's axis), treats circular mode as linear (``wrap`` False), or
    writes every batch row at the first row's write index (``first_index``)."""
    def kernel(args, attrs, ctx):
        past, update = args[0], args[1]
        indices = args[2] if len(args) > 2 else None
        if first_index and indices is not None and np.size(indices):
            indices = np.full(np.shape(indices), np.asarray(indices).reshape(-1)[0], np.int64)
        mode = attrs.get("mode", "linear")
        mode = mode.decode() if isinstance(mode, bytes) else mode
        axis = int(attrs.get("axis", -2)) if sequence_axis is None else sequence_axis
        return [contiguous.tensor_scatter(past, update, indices, mode=mode if wrap else "linear", axis=axis)]
    return lambda self: {**Fault.executor_kernels(self), ("", "TensorScatter"): kernel}


def _max_tokens_exclusive(args, attrs):
    limit = attrs.get("max_tokens", 4096)
    return {**attrs, "max_tokens": limit - 1} if _count(limit) and limit > 1 else attrs  # ``>=`` where it is ``>``


def _slots_against_max_tokens(args, attrs):
    limit = attrs.get("max_tokens", 4096)
    try:
        value, block_size = args[3], int(attrs.get("block_size", 16))
        geometry = paged.struct_geometry(value, "PagedAttention.past")
        cache = paged.PagedKVCache.from_struct(value, *geometry, block_size) if geometry else None
        new = args[1].shape[2]
    except (ContractError, AttributeError, IndexError, TypeError, ValueError):
        cache = None  # the kernel itself reports what is wrong with its inputs
    if cache is not None and isinstance(limit, int) and sum(b.tokens for b in cache.blocks) + new > limit:
        raise violation(E.KV_CAPACITY_EXCEEDED, "PagedAttention.max_tokens",
                        f"{sum(b.tokens for b in cache.blocks)} slots + {new} tokens exceed max_tokens {limit}")
    return attrs


def _negative_attribute(name: str, replace):
    """An attribute reader taking a negative ``name`` as ``replace(value)``."""
    def read(args, attrs):
        value = attrs.get(name)
        if isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value < 0:
            attrs = {**attrs, name: replace(int(value))}
        return attrs
    return read


def _write_from_last_token(self) -> None:
    """contiguous._Append.write starting one slot early: the past's last token is written again."""
    slots = self.storage.slots()
    past = self.past.shape[2]
    if not self.in_place:
        slots[:, :, :past] = self.past
    if past:
        slots[:, :, past - 1] = self.past[:, :, past - 1]
    slots[:, :, past:self.needed] = self.new


def _commit_from_last_token(self):
    if counting_active():
        again = self.past[:, :, -1:].nbytes if self.in_place and self.past.shape[2] else 0
        record(KVCounters(appended_bytes=self.new.nbytes + again, in_place_appends=int(self.in_place),
                          relocated_bytes=0 if self.in_place else self.past.nbytes))
    return self.storage.publish(self.needed)


_SCORES_HELD = threading.local()


def _two_pass(original):
    def attend_row(q, cache, mask, attrs, offset):
        _, hq, sq, _ = q.shape
        # the logits and weights of every cached token, held next to each group's own scratch
        _SCORES_HELD.nbytes = 2 * hq * sq * cache.count * 4
        try:
            return original(q, cache, mask, attrs, offset)
        finally:
            _SCORES_HELD.nbytes = 0
    return attend_row


def _with_held_scores(original):
    def record(nbytes):
        return original(nbytes + getattr(_SCORES_HELD, "nbytes", 0))
    return record


AppendOneSlotEarly = fault("KV-APPEND-EQUIV.off-by-one-slot", ("KV-APPEND-EQUIV",),
    """Writes appended tokens starting at ``length - 1``: each append overwrites the last cached token and leaves the
    final slot unwritten, so present is no longer Concat(past, new).""",
    patches=lambda: [Patch(contiguous._Append, "write", _write_one_early)])

BranchAppendsInPlace = fault("KV-APPEND-INPLACE.branch-overwrites-prefix", ("KV-APPEND-INPLACE", "ZC-NO-INPLACE"),
    """Appends in place whenever the allocation behind the past has room, ignoring that another state (a branch from the
    same prefix) already wrote its tokens there.""", boundary=True, testee_blind=TESTEE_COPIES_RETURNED_VALUES,
    patches=lambda: [Patch(contiguous, "_claim_in_place", _claim_if_it_fits)])

WholeCacheDequantized = fault("KV-BOUNDED.whole-cache-dequantized", ("KV-BOUNDED",),
    """Dequantizes (or copies) the whole paged cache into one dense K and V workspace before every Attention step
    instead of walking it in groups of bounded size: the workspace grows with the context.""",
    patches=lambda: [wrap(paged, "block_groups", _unbounded_groups), Patch(paged, "_extends", _extends_without_bound)])

CopiesEveryAppend = fault("KV-CAPACITY-REUSE.copy-per-append", ("KV-CAPACITY-REUSE", "KV-APPEND-INPLACE"),
    """Appends by copying the past and the new tokens into a fresh allocation every time, even when the past owns spare
    capacity no one else can see (ownership permits reuse): no fixed-capacity reuse, and every append rewrites the whole
    cache.""", patches=lambda: [Patch(contiguous, "_claim_in_place", lambda storage, past, needed: False)])

MaxTokensPerCall = fault("KV-MUTATION-FAILED.max-tokens-per-call", ("KV-MUTATION-FAILED",),
    """Checks max_tokens against the tokens of the current call only, not the cached ones plus the new: an append past
    the cache's capacity is not refused, and the cache grows beyond it.""",
    patches=lambda: [_paged_attributes(_max_tokens_per_call)])

ZeroBlockSizeDefaulted = fault("KV-CAPACITY-INVALID.zero-block-size-defaulted", ("KV-CAPACITY-INVALID",),
    """Reads the block size as ``attrs.get("block_size") or 16``: a zero block size silently becomes the default instead
    of being rejected as an invalid capacity.""",
    patches=lambda: [_paged_attributes(
        lambda args, attrs: attrs if attrs.get("block_size") else {**attrs, "block_size": 16})])

CopyAtExactCapacity = fault("KV-CAPACITY-REUSE.copy-at-exact-capacity", ("KV-CAPACITY-REUSE",),
    """Reserves room in an allocation only while the append ends strictly below its capacity: the append that fills an
    allocation exactly (a contiguous cache at its capacity, a paged block's last slot) relocates the tokens into a fresh
    allocation, a copy of every token already there.""", boundary=True,
    patches=lambda: [Patch(storage.KVStorage, "reserve", _reserve_below_capacity)])

MaxTokensExclusive = fault("KV-MUTATION-FAILED.max-tokens-exclusive", ("KV-MUTATION-FAILED",),
    """Refuses an append that brings the cache to exactly max_tokens (``count + new >= max_tokens``) instead of only one
    that goes beyond it: a cache can never be filled to its declared limit.""", boundary=True,
    patches=lambda: [_paged_attributes(_max_tokens_exclusive)])

ScatterFirstWriteIndexForAll = fault("KV-APPEND-EQUIV.scatter-first-write-index", ("KV-APPEND-EQUIV", "KV-ATTENTION"),
    """TensorScatter writes every batch row's update at ``write_indices[0]`` (one write position for the batch) instead
    of each row's own index: rows whose caches hold different numbers of tokens overwrite or leave gaps in each other's
    positions.""", boundary=True, executor_kernels=_scatter(first_index=True))

ScatterAxisFixedAtMinusTwo = fault("KV-APPEND-EQUIV.scatter-axis-fixed", ("KV-APPEND-EQUIV", "KV-ATTENTION"),
    """TensorScatter always writes along axis -2 (the head-major (batch, heads, sequence, head_size) cache layout),
    ignoring the axis attribute: a token-major (batch, sequence, heads, head_size) cache scattered along axis 1 is
    written across its heads, or refused.""", executor_kernels=_scatter(sequence_axis=-2))

ScatterCircularAsLinear = fault("KV-APPEND-EQUIV.scatter-circular-as-linear", ("KV-APPEND-EQUIV",),
    """TensorScatter ignores mode = "circular": writes that run past the cache's end are refused as in linear mode
    instead of wrapping to its start.""", boundary=True, executor_kernels=_scatter(wrap=False))

MaxTokensCountsSlots = fault("KV-MUTATION-FAILED.max-tokens-counts-slots", ("KV-MUTATION-FAILED", "KV-PAGED-RANGE"),
    """Checks max_tokens against the cache's physical slots plus the new tokens instead of its valid tokens: a cache
    holding a partial block (a payload with unused slots) is refused an append that stays within max_tokens.""",
    boundary=True, patches=lambda: [_paged_attributes(_slots_against_max_tokens)])

NegativeMaxTokensUnlimited = fault("KV-CAPACITY-INVALID.negative-max-tokens-unlimited", ("KV-CAPACITY-INVALID",),
    """Reads a negative max_tokens as "no limit" (the -1 convention of other APIs) instead of rejecting it as an invalid
    capacity; zero is still refused.""",
    patches=lambda: [_paged_attributes(_negative_attribute("max_tokens", lambda value: 1 << 62))])

NegativeBlockSizeMagnitude = fault("KV-CAPACITY-INVALID.negative-block-size-magnitude", ("KV-CAPACITY-INVALID",),
    """Parses block_size into an unsigned size by its magnitude: -4 becomes a 4-token block instead of an invalid
    capacity; zero is still refused.""",
    patches=lambda: [_paged_attributes(_negative_attribute("block_size", abs))])

AppendRewritesLastToken = fault("KV-APPEND-INPLACE.last-token-rewritten", ("KV-APPEND-INPLACE",),
    """Starts an in-place append's write at the last cached token (a length taken as the last valid index): the values
    stay right, but every append rewrites one old token besides the new ones.""", boundary=True,
    patches=lambda: [Patch(contiguous._Append, "write", _write_from_last_token),
                     Patch(contiguous._Append, "commit", _commit_from_last_token)])

ScoresForWholeContext = fault("KV-BOUNDED.scores-for-whole-context", ("KV-BOUNDED",),
    """Computes paged attention block by block but keeps every block's scores for one softmax at the end (a two-pass
    softmax): the scratch grows with the cached context instead of staying bounded.""",
    patches=lambda: [wrap(paged_attention, "_attend_row", _two_pass),
                     wrap(paged_attention, "record_workspace", _with_held_scores, aliases=False)])

name_faults(globals())

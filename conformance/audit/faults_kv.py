"""Faults in KV caches carried by the same feedback: contiguous appends, paged blocks and their
token ranges, capacities, Attention over the cache, and bounded workspace."""

from __future__ import annotations

import dataclasses
import importlib

import numpy as np

from conformance.audit.fault import TESTEE_COPIES_RETURNED_VALUES, Fault, Patch, wrap
from reference_impl.kv import contiguous, kernels, paged

# the modules (``reference_impl.kv`` re-exports functions of the same names)
attention_module = importlib.import_module("reference_impl.kv.attention")
paged_attention_module = importlib.import_module("reference_impl.kv.paged_attention")


def _write_one_early(self) -> None:
    """contiguous._Append.write with the new tokens written one slot too early."""
    slots = self.storage.slots()
    past = self.past.shape[2]
    if not self.in_place:
        slots[:, :, :past] = self.past
    start = max(past - 1, 0)
    slots[:, :, start:start + self.new.shape[2]] = self.new


class AppendOneSlotEarly(Fault):
    """Writes appended tokens starting at ``length - 1``: each append overwrites the last cached token and
    leaves the final slot unwritten, so present is no longer Concat(past, new)."""

    fault_id = "KV-APPEND-EQUIV.off-by-one-slot"
    clauses = ("KV-APPEND-EQUIV",)

    def patches(self):
        return [Patch(contiguous._Append, "write", _write_one_early)]


def _claim_if_it_fits(storage, past, needed):
    """Claims the slots behind any prefix view with room, without asking whether another branch holds
    a longer view of the same allocation."""
    if storage is None or not storage.is_prefix_view(past) or needed > storage.capacity:
        return False
    storage.claimed = needed
    return True


class BranchAppendsInPlace(Fault):
    """Appends in place whenever the allocation behind the past has room, ignoring that another state
    (a branch from the same prefix) already wrote its tokens there."""

    fault_id = "KV-APPEND-INPLACE.branch-overwrites-prefix"
    clauses = ("KV-APPEND-INPLACE", "ZC-NO-INPLACE")
    boundary = True
    testee_blind = TESTEE_COPIES_RETURNED_VALUES

    def patches(self):
        return [Patch(contiguous, "_claim_in_place", _claim_if_it_fits)]


def _every_slot_valid(original):
    def make_block(start, valid, key, value, geometry, path="kv.block", places=(None, None)):
        block = original(start, valid, key, value, geometry, path, places)
        return dataclasses.replace(block, valid=block.tokens)
    return make_block


class PayloadSlotsAsValidTokens(Fault):
    """Takes a block's token count from its payload's physical slots instead of its valid_length, so a
    partially filled block contributes its unused slots too."""

    fault_id = "KV-PAGED-RANGE.slots-as-valid-tokens"
    clauses = ("KV-PAGED-RANGE",)

    def patches(self):
        return [wrap(paged, "make_block", _every_slot_valid)]


def _whole_cache_attention(q, caches, attn_mask=None, attrs=None, offset=None, **kwargs):
    """Attention over the cache dequantized to one dense tensor first (not block by block)."""
    caches = [caches] if isinstance(caches, paged.PagedKVCache) else caches
    rows = []
    for index, cache in enumerate(caches):
        keys, values = cache.dequantized()
        rows.append(attention_module.attention(q[index:index + 1], keys, values, attrs=attrs).y)
    return np.concatenate(rows, axis=0)


class WholeCacheDequantized(Fault):
    """Dequantizes the entire paged cache into dense K and V before every Attention step instead of
    walking the blocks with bounded workspace."""

    fault_id = "KV-BOUNDED.whole-cache-dequantized"
    clauses = ("KV-BOUNDED",)
    pending = ("a case bounding the workspace of a paged decode step: a counters step on a runtime-reported "
               "dequantized/allocated-bytes counter, or a cache large enough that a whole-cache copy exceeds "
               "a stated memory bound; Attention values alone cannot tell the two apart")

    def patches(self):
        return [Patch(paged_attention_module, "paged_attention", _whole_cache_attention)]


def _zero_means_default(original):
    def kernel(args, attrs, ctx):
        if not attrs.get("block_size"):
            attrs = {**attrs, "block_size": 16}
        return original(args, attrs, ctx)
    return kernel


class ZeroBlockSizeDefaulted(Fault):
    """Reads the block size as ``attrs.get("block_size") or 16``: a zero block size silently becomes
    the default instead of being rejected as an invalid capacity."""

    fault_id = "KV-CAPACITY-INVALID.zero-block-size-defaulted"
    clauses = ("KV-CAPACITY-INVALID",)

    def patches(self):
        return [wrap(kernels, "paged_attention_kernel", _zero_means_default)]


def _one_over_head_size(attrs, head_size, dtype):
    scale = attrs.scale if attrs.scale is not None else 1.0 / head_size
    return dtype.type(np.sqrt(scale))


class AttentionScaleWrong(Fault):
    """Scales attention scores by ``1 / head_size`` instead of ``1 / sqrt(head_size)``."""

    fault_id = "KV-ATTENTION.scale-one-over-d"
    clauses = ("KV-ATTENTION",)

    def patches(self):
        return [Patch(attention_module, "sqrt_scale", _one_over_head_size)]

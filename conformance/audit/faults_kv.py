"""Faults in KV caches carried by the same feedback: contiguous appends, paged blocks and their
token ranges, capacities, Attention over the cache, and bounded workspace."""

from __future__ import annotations

import dataclasses
import importlib

import numpy as np

from conformance.audit.fault import TESTEE_COPIES_RETURNED_VALUES, Fault, Patch, wrap
from reference_impl.errors import ErrorCode as E
from reference_impl.errors import violation
from reference_impl.kv import contiguous, formats, kernels, paged

# the modules (``reference_impl.kv`` re-exports functions of the same names)
attention_module = importlib.import_module("reference_impl.kv.attention")


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


class WholeCacheDequantized(Fault):
    """Dequantizes (or copies) the whole paged cache into one dense K and V workspace before every
    Attention step instead of walking it in groups of bounded size: the workspace grows with the context."""

    fault_id = "KV-BOUNDED.whole-cache-dequantized"
    clauses = ("KV-BOUNDED",)

    def patches(self):
        return [wrap(paged, "block_groups", _unbounded_groups), Patch(paged, "_extends", _extends_without_bound)]


class CopiesEveryAppend(Fault):
    """Appends by copying the past and the new tokens into a fresh allocation every time, even when the
    past owns spare capacity no one else can see (ownership permits reuse): no fixed-capacity reuse, and
    every append rewrites the whole cache."""

    fault_id = "KV-CAPACITY-REUSE.copy-per-append"
    clauses = ("KV-CAPACITY-REUSE", "KV-APPEND-INPLACE")

    def patches(self):
        return [Patch(contiguous, "_claim_in_place", lambda storage, past, needed: False)]


def _symmetric_heads(original):
    def dequantize_heads(payload, storage_type, scale, zero_point, shape, group):
        return original(payload, storage_type, scale, None, shape, group)
    return dequantize_heads


class KVZeroPointsDropped(Fault):
    """Decodes affine K/V blocks as if they were symmetric (codes times scale), ignoring the zero point
    each block carries: only the per-block formats without a zero point decode right."""

    fault_id = "KV-PAGED-FORMATS.zero-points-dropped"
    clauses = ("KV-PAGED-FORMATS",)

    def patches(self):
        return [wrap(formats, "_dequantize_heads", _symmetric_heads)]


def _max_tokens_per_call(original):
    def kernel(args, attrs, ctx):
        limit = attrs.get("max_tokens", 4096)
        if len(args) >= 4 and isinstance(limit, int) and not isinstance(limit, bool) and limit > 0:
            new = args[1]
            if isinstance(new, np.ndarray) and new.ndim == 4 and new.shape[2] > limit:
                raise violation(E.KV_CAPACITY_EXCEEDED, "PagedAttention.max_tokens",
                                f"{new.shape[2]} new tokens exceed max_tokens {limit}")
            attrs = {**attrs, "max_tokens": 1 << 62}
        return original(args, attrs, ctx)
    return kernel


class MaxTokensPerCall(Fault):
    """Checks max_tokens against the tokens of the current call only, not the cached ones plus the new:
    an append past the cache's capacity is not refused, and the cache grows beyond it."""

    fault_id = "KV-MUTATION-FAILED.max-tokens-per-call"
    clauses = ("KV-MUTATION-FAILED",)

    def patches(self):
        return [wrap(kernels, "paged_attention_kernel", _max_tokens_per_call)]


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

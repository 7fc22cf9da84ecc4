"""Soundness of the KV cases: every behaviour the spec's words allow passes every Required KV case, and
the forbidden behaviour next to it fails. Each test runs a toy runtime (the reference with one allowed
choice) through the Required KV cases, then shows the Recommended case that tells the choice apart, and
a runtime that crosses the line into what the spec forbids failing a Required case."""

from __future__ import annotations

import contextlib
import weakref

import numpy as np
import pytest

from conformance.adapters import Rejected
from conformance.adapters.reference import ReferenceAdapter, ReferenceState
from conformance.cases import load_cases, select
from conformance.execute import FAILED, PASSED, run_case
from conformance.values import Encoded, Struct
from reference_impl.errors import ErrorCode as E
from reference_impl.errors import violation
from reference_impl.kv import contiguous, kernels, paged
from reference_impl.kv.storage import KVCounters, KVStorage, record
from reference_impl.values import EncodedValue, StructValue

CASES = load_cases()
REQUIRED_KV = "Required.KV"


def _verdicts(adapter, *patterns) -> dict:
    chosen = select(CASES, list(patterns))
    assert chosen, patterns
    return {case.id: run_case(case, adapter) for case in chosen}


def _passes(adapter, *patterns) -> None:
    failed = {cid: r.message for cid, r in _verdicts(adapter, *patterns).items() if r.verdict != PASSED}
    assert not failed, failed


def _fails(adapter, case_id: str) -> str:
    result = _verdicts(adapter, case_id)[case_id]
    assert result.verdict == FAILED, (case_id, result.message)
    return result.message


@contextlib.contextmanager
def _patched(owner, name: str, value):
    """``owner.name`` is ``value`` for the duration (one call of a toy runtime)."""
    original = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, original)


def _no_in_place():
    """Every cache write goes to a fresh allocation (KVStorage never grants a reservation behind a view)."""
    return _patched(KVStorage, "reserve", lambda self, length, needed: False)


class _Adapter(ReferenceAdapter):
    """The reference with some kernels swapped (``swapped``) and every call of its states made inside
    ``during()`` (the toy's one behaviour)."""

    swapped: dict = {}

    def executor_kernels(self):
        return {**super().executor_kernels(), **self.swapped}

    def open_state(self, model_bytes, initial, base_dir=None):
        return self.state(super().open_state(model_bytes, initial, base_dir))

    def state(self, handle):
        during = self.during

        class Handle(ReferenceState):
            def run(self, feeds):
                with during():
                    return super().run(feeds)

            def run_cancelled(self, feeds):
                with during():
                    return super().run_cancelled(feeds)

        return Handle(handle.state, handle.slot)

    def during(self):
        return contextlib.nullcontext()


# ----------------------------------------------------------------------- ownership: in-place is conditional
class _StrictState(ReferenceState):
    """Hands the caller its own view objects and watches them: while the caller still holds any value it
    was handed, no cache is appended in place (the allocation is still referenced by a returned output)."""

    def __init__(self, handle):
        super().__init__(handle.state, handle.slot)
        self.handed: list[weakref.ref] = []

    def _hand(self, value):
        if isinstance(value, np.ndarray):
            view = value.view()
            self.handed.append(weakref.ref(view))
            return view
        if isinstance(value, Struct):
            return Struct({k: self._hand(v) for k, v in value.items()}, value.type_id)
        if isinstance(value, dict):  # a call's outputs or values, by name
            return {k: self._hand(v) for k, v in value.items()}
        if isinstance(value, list):
            return [self._hand(v) for v in value]
        if isinstance(value, Encoded):
            return Encoded(value.header, self._hand(value.payload))
        return value

    def _call(self, method, *args):
        held = any(ref() is not None for ref in self.handed)
        with _no_in_place() if held else contextlib.nullcontext():
            return self._hand(method(*args))

    def run(self, feeds):
        return self._call(super().run, feeds)

    def run_cancelled(self, feeds):
        return self._call(super().run_cancelled, feeds)

    def values(self):
        return self._hand(super().values())


class StrictOwnership(ReferenceAdapter):
    def open_state(self, model_bytes, initial, base_dir=None):
        return _StrictState(super().open_state(model_bytes, initial, base_dir))


@pytest.mark.clause("KV-APPEND-INPLACE", "ZC-NO-INPLACE", "KV-CAPACITY-REUSE")
def test_a_runtime_that_never_appends_into_a_referenced_allocation_passes():
    """"It must not silently enable in-place reuse of an allocation still referenced by ... a returned
    output": a runtime reading it strictly moves to fresh storage while a caller holds an earlier present,
    and appends in place once nothing but the state refers to the cache."""
    _passes(StrictOwnership(), REQUIRED_KV)
    assert "share one buffer" in _fails(StrictOwnership(), "Recommended.KV.CapacityReuse.PresentsShareOneAllocation")
    _passes(StrictOwnership(), "Recommended.KV.CapacityReuse.AppendWritesOnlyNewTokens")  # nothing held there


class CopiesEveryAppend(_Adapter):
    """Copies the whole cache on every append, although nothing but the state refers to it (forbidden)."""

    def during(self):
        return _patched(contiguous, "_claim_in_place", lambda storage, past, needed: False)


class TightGrowth(_Adapter):
    """Sizes a cache's first allocation to exactly the prefill and doubles it when full, so the first
    appends relocate: a capacity policy the spec leaves to the runtime."""

    swapped = {("", "Attention"): kernels.kv_kernels(capacity=1)[("", "Attention")]}


@pytest.mark.clause("KV-CAPACITY-REUSE", "KV-APPEND-INPLACE")
def test_any_capacity_policy_that_leaves_room_passes_and_a_copy_per_append_fails():
    _passes(TightGrowth(), REQUIRED_KV)
    assert "kv_bytes_written" in _fails(TightGrowth(), "Recommended.KV.CapacityReuse.AppendWritesOnlyNewTokens")
    for case_id in ("Required.KV.CapacityReuse.NoWholeCacheCopyPerAppend",
                    "Required.KV.CapacityReuse.ChunkedNoWholeCacheCopyPerAppend"):
        assert "kv_bytes_written" in _fails(CopiesEveryAppend(), case_id)


# ----------------------------------------------------------------------------- paged appends and workspace
class RewritesOpenBlock(_Adapter):
    """Paged appends copy the open block's tokens into a fresh block every time (copy-on-write blocks): a
    blockwise append that never copies the whole cache."""

    def during(self):
        grow = paged._grow

        def copy_on_write(*args):
            with _no_in_place():
                return grow(*args)

        return _patched(paged, "_grow", copy_on_write)


class CopiesWholePagedCache(_Adapter):
    """Every paged append rebuilds every block (and counts what it copied): forbidden."""

    def during(self):
        append = paged.PagedKVCache.append

        def rebuilt(cache, *args, **kwargs):
            grown = append(cache, *args, **kwargs)
            blocks = []
            for block in grown.blocks:
                key = np.array(block.key_codec.decode(block.key))
                value = np.array(block.value_codec.decode(block.value))
                record(KVCounters(relocated_bytes=key.nbytes + value.nbytes))
                blocks.append(paged.make_block(block.start, block.valid, key, value, grown.geometry))
            return paged.PagedKVCache(grown.kv_heads, grown.head_size, grown.v_head_size, grown.block_size,
                                      tuple(blocks))

        return _patched(paged.PagedKVCache, "append", rebuilt)


@pytest.mark.clause("KV-BOUNDED", "KV-APPEND-INPLACE")
def test_a_blockwise_append_that_rewrites_its_open_block_passes():
    _passes(RewritesOpenBlock(), REQUIRED_KV)
    assert "kv_bytes_written" in _fails(RewritesOpenBlock(), "Recommended.KV.PagedBounded.AppendWritesOnlyNewTokens")
    assert "kv_bytes_written" in _fails(CopiesWholePagedCache(), "Required.KV.PagedBounded.AppendWritesAtMostOneBlock")


def _tiles(tokens: int):
    """Paged attention in groups of up to ``tokens`` tokens (keys decoded ``tokens`` at a time)."""
    groups = paged.block_groups
    stack = contextlib.ExitStack()
    stack.enter_context(_patched(paged, "GROUP_TOKENS", tokens))
    stack.enter_context(_patched(paged, "block_groups", lambda blocks, budget=0: groups(blocks, budget=tokens << 12)))
    return stack


class LongTiles(_Adapter):
    """Paged attention in tiles of 3072 tokens: bounded, but longer than the suite's figures assume."""

    def during(self):
        return _tiles(3072)


class WholeCacheTile(_Adapter):
    """Paged attention over one tile holding every token: a whole-cache dequantization (forbidden)."""

    def during(self):
        return _tiles(1 << 30)


@pytest.mark.clause("KV-BOUNDED")
def test_a_bounded_kernel_with_long_tiles_passes_and_a_whole_cache_tile_fails():
    _passes(LongTiles(), REQUIRED_KV)
    assert "attention_peak_workspace_bytes" in _fails(LongTiles(),
                                                      "Recommended.KV.PagedBounded.Int4WorkspaceIndependentOfContext")
    for case_id in ("Required.KV.PagedBounded.DenseWorkspaceHoldsNoWholeCache",
                    "Required.KV.PagedBounded.Int4WorkspaceHoldsNoWholeCache"):
        assert "attention_peak_workspace_bytes" in _fails(WholeCacheTile(), case_id)


# ---------------------------------------------------------------------------------------- cancellation
class CompletesCancelledRuns(ReferenceAdapter):
    """A cancellation requested before the run does not stop it: the run completes and says so."""

    def open_state(self, model_bytes, initial, base_dir=None):
        handle = super().open_state(model_bytes, initial, base_dir)
        handle.run_cancelled = handle.run
        return handle


class CancelledButPublished(ReferenceAdapter):
    """Reports STATE_CANCELLED after publishing the run's new values (forbidden)."""

    def open_state(self, model_bytes, initial, base_dir=None):
        handle = super().open_state(model_bytes, initial, base_dir)

        def run_cancelled(feeds):
            handle.run(feeds)
            raise Rejected("STATE_CANCELLED", "cancelled")

        handle.run_cancelled = run_cancelled
        return handle


@pytest.mark.clause("ZC-FAILURE", "STATE-ATOMIC")
def test_a_cancelled_run_may_complete_but_not_half_cancel():
    cancelled = ["Required.KV.Contiguous.CancelledAppendLeavesCache",
                 "Required.KV.PagedOwnership.CancelledAppendLeavesCache"]
    _passes(ReferenceAdapter(), *cancelled)  # honours the cancellation
    _passes(CompletesCancelledRuns(), REQUIRED_KV)
    for case_id in cancelled:
        _fails(CancelledButPublished(), case_id)


# -------------------------------------------------------------------------------- caller-provided blocks
def _converting(transform):
    """A paged kernel that adopts every block a caller provided through ``transform`` of its payloads."""
    from_struct = paged.PagedKVCache.from_struct.__func__

    def adopt(cls, value, *args, **kwargs):
        blocks = [item if type(item) is not StructValue else
                  StructValue({**item, "key": transform(item["key"]), "value": transform(item["value"])},
                              item.type_id)
                  for item in value["blocks"]]
        return from_struct(cls, StructValue({**value, "blocks": blocks}, value.type_id), *args, **kwargs)

    def kernel(args, attrs, ctx):
        original = paged.PagedKVCache.from_struct
        paged.PagedKVCache.from_struct = classmethod(adopt)
        try:
            return kernels.paged_attention_kernel(args, attrs, ctx)
        finally:
            paged.PagedKVCache.from_struct = original

    return {(kernels.KV_DOMAIN, "PagedAttention"): kernel}


def _copy(item):
    """A lossless conversion: the same codes and floats in the runtime's own buffers."""
    if isinstance(item, EncodedValue):
        return EncodedValue(item.header, np.array(item.payload))
    return np.array(item)


def _lossy(item):
    """A conversion that changes codes (every code's lowest bit cleared)."""
    if isinstance(item, EncodedValue):
        return EncodedValue(item.header, np.asarray(item.payload) & np.uint8(0xFE))
    return np.array(item)


class ConvertsCallerBlocks(_Adapter):
    swapped = _converting(_copy)


class ConvertsLossily(_Adapter):
    swapped = _converting(_lossy)


@pytest.mark.clause("KV-PAGED-FORMATS", "KV-BOUNDED")
def test_a_runtime_may_convert_a_callers_blocks_without_changing_their_values():
    """"Blockwise append/conversion": a runtime may adopt a caller's blocks into its own buffers (or
    layouts); what the blocks decode to must not change."""
    _passes(ConvertsCallerBlocks(), REQUIRED_KV)
    assert "share one buffer" in _fails(ConvertsCallerBlocks(),
                                        "Recommended.KV.PagedFormats.UnchangedBlocksKeepCallerPayloads")
    _fails(ConvertsLossily(), "Required.KV.PagedFormats.Int4KeysUint4Values")


# ---------------------------------------------------------------------- the role's own signature only
def _plain_role(args, attrs, ctx):
    """onnx-light's PagedAttention signature: (Q, K, V, past) and four attributes, nothing more."""
    own = {"block_size", "is_causal", "left_window_size", "max_tokens"}
    if len(args) != 4 or set(attrs) - own:
        raise violation(E.ATTENTION_INPUT_INVALID, "PagedAttention", f"unsupported: {sorted(set(attrs) - own)}")
    return kernels.paged_attention_kernel(args, attrs, ctx)


class RoleWithoutExtensions(_Adapter):
    swapped = {(kernels.KV_DOMAIN, "PagedAttention"): _plain_role}


@pytest.mark.clause("KV-ATTENTION", "KV-PAGED-FORMATS")
def test_a_paged_operator_without_the_suites_extensions_passes_the_required_cases():
    _passes(RoleWithoutExtensions(), "Required.KV")
    for case_id in ("Recommended.KV.PagedAttention.Softcap", "Recommended.KV.PagedAttention.BoolMask",
                    "Recommended.KV.PagedConversion.Int8KeysUint8Values"):
        _fails(RoleWithoutExtensions(), case_id)


# ------------------------------------------------------------------------------ other orders of checks
RAISED: list[str] = []  # the codes the toys below reported, so their passes are shown not to be vacuous


def _raise(code: E, path: str, message: str):
    RAISED.append(code.value)
    return violation(code, path, message)


def _other_order(args, attrs, ctx):
    """Checks the token budget before max_tokens itself, and the queries against the first block before the
    block table, so a cache or attribute breaking two rules is reported under the other one."""
    q, _, _, past = args[:4]
    if int(attrs.get("max_tokens", 4096)) <= 0:
        raise _raise(E.KV_CAPACITY_EXCEEDED, "PagedAttention.max_tokens", "the new tokens exceed max_tokens")
    if past["blocks"]:
        key = past["blocks"][0]["key"]
        dims = key.shape if isinstance(key, np.ndarray) else \
            [d.dim_value for d in key.header.logical_type.tensor_type.shape.dim]
        if q.shape[1] % dims[1]:
            raise _raise(E.ATTENTION_INPUT_INVALID, "PagedAttention.Q", "the queries do not fit the cache's heads")
    return kernels.paged_attention_kernel(args, attrs, ctx)


class OtherCheckOrder(_Adapter):
    swapped = {(kernels.KV_DOMAIN, "PagedAttention"): _other_order}


class ValidatesCachesAtOpen(_Adapter):
    """Checks every block of an initial cache against the declared KV_BLOCK field types when the state
    opens: a FLOAT16 block, or key and value blocks of different head counts, are incompatible values."""

    def open_state(self, model_bytes, initial, base_dir=None):
        for value in initial.values():
            for block in value.get("blocks", []) if isinstance(value, Struct) else []:
                parts = [block["key"], block["value"]]
                dense = [p for p in parts if isinstance(p, np.ndarray)]
                shapes = [p.shape if isinstance(p, np.ndarray) else
                          tuple(d.dim_value for d in p.header.logical_type.tensor_type.shape.dim) for p in parts]
                if any(p.dtype != np.float32 for p in dense) or shapes[0][1] != shapes[1][1]:
                    RAISED.append("STATE_VALUE_INCOMPATIBLE")
                    raise Rejected("STATE_VALUE_INCOMPATIBLE", "a block does not match the KV_BLOCK field types")
        return super().open_state(model_bytes, initial, base_dir)


def _renames(code_from: E, code_to: E):
    """A paged kernel that reports ``code_from`` errors under ``code_to`` (a code the cache does not break)."""
    def kernel(args, attrs, ctx):
        try:
            return kernels.paged_attention_kernel(args, attrs, ctx)
        except Exception as error:
            if getattr(error, "code", None) == code_from:
                raise violation(code_to, error.path, error.message) from error
            raise

    return {(kernels.KV_DOMAIN, "PagedAttention"): kernel}


class MisnamesBlockErrors(_Adapter):
    swapped = _renames(E.KV_BLOCK_INVALID, E.KV_CAPACITY_INVALID)


@pytest.mark.clause("KV-PAGED-RANGE", "KV-CAPACITY-INVALID", "STATE-VALIDATE-METADATA")
def test_any_order_of_checks_passes_and_a_code_the_cache_does_not_break_fails():
    invalid = ["Required.KV.PagedBlockTable", "Required.KV.PagedCapacity"]
    RAISED.clear()
    _passes(OtherCheckOrder(), *invalid)
    assert {"KV_CAPACITY_EXCEEDED", "ATTENTION_INPUT_INVALID"} <= set(RAISED)  # not the reference's codes
    RAISED.clear()
    _passes(ValidatesCachesAtOpen(), *invalid, "Required.KV.PagedFormats")
    assert RAISED.count("STATE_VALUE_INCOMPATIBLE") == 2  # WrongHeadCount and DenseBlockNotFloat, at open
    _fails(MisnamesBlockErrors(), "Required.KV.PagedBlockTable.ValidBeyondSlots")

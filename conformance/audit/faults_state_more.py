"""More faults in persistent state and KV caches: binding compatibility (rank, nested and sequence
types, symbolic dimensions, duplicate outputs), publication of several bindings, validation of later
steps, partial resets, and Attention over a cache (head grouping, softcap order, causal alignment,
short masks, fully masked rows, per-block parameters, capacity boundary)."""

from __future__ import annotations

import dataclasses
import importlib
import threading
from types import MappingProxyType

import numpy as np

from conformance.adapters.reference import to_runtime
from conformance.audit.fault import Fault, FaultState, Patch, wrap
from reference_impl import state as state_module
from reference_impl import values as values_module
from reference_impl.errors import ContractError, violation
from reference_impl.errors import ErrorCode as E
from reference_impl.kv import formats, kernels, paged, storage
from reference_impl.values import AnySpec, MapSpec, SequenceSpec, StructSpec, TensorSpec

attention_module = importlib.import_module("reference_impl.kv.attention")
paged_attention_module = importlib.import_module("reference_impl.kv.paged_attention")
bindings_module = importlib.import_module("reference_impl.bindings")


# ------------------------------------------------------------------------------------ bindings
def _rank_unchecked(original):
    def incompatibility(a, b):
        if isinstance(a, TensorSpec) and isinstance(b, TensorSpec) and a.elem_type == b.elem_type \
                and a.dims is not None and b.dims is not None and len(a.dims) != len(b.dims):
            n = min(len(a.dims), len(b.dims))  # zip() stops at the shorter shape
            return original(TensorSpec(a.elem_type, a.dims[:n]), TensorSpec(b.elem_type, b.dims[:n]))
        return original(a, b)
    return incompatibility


class RankNotCompared(Fault):
    """Compares bound shapes dimension by dimension with ``zip`` and never compares their ranks: an input
    of rank 3 bound to an output of rank 4 whose leading dimensions agree is accepted."""

    fault_id = "BIND-COMPATIBLE.rank-unchecked"
    clauses = ("BIND-COMPATIBLE",)
    boundary = True

    def patches(self):
        return [wrap(values_module, "incompatibility", _rank_unchecked)]


def _nested_unchecked(original):
    def incompatibility(a, b):
        if isinstance(a, StructSpec) and isinstance(b, StructSpec) and a.type_id is None and b.type_id is None:
            if [n for n, _ in a.fields] != [n for n, _ in b.fields] or a.constants != b.constants:
                return "inline structs declare different fields"
            return None  # same field names: taken as the same struct
        if isinstance(a, SequenceSpec) and isinstance(b, SequenceSpec):
            return None  # a sequence is a sequence
        return original(a, b)
    return incompatibility


class NestedTypesNotCompared(Fault):
    """Compares the top level of bound types only: two inline structs with the same field names are
    compatible whatever their fields' types, and any sequence is compatible with any other."""

    fault_id = "BIND-COMPATIBLE.nested-types-unchecked"
    clauses = ("BIND-COMPATIBLE",)
    boundary = True

    def patches(self):
        return [wrap(values_module, "incompatibility", _nested_unchecked)]


def _symbolic_by_name(model):
    """The names of the symbolic dimensions of every root input and output, by value name."""
    names = {}
    for info in list(model.graph.input) + list(model.graph.output):
        if info.type.WhichOneof("value") == "tensor_type" and info.type.tensor_type.HasField("shape"):
            names[info.name] = [d.dim_param if d.WhichOneof("value") == "dim_param" else
                                (d.dim_value if d.WhichOneof("value") == "dim_value" else None)
                                for d in info.type.tensor_type.shape.dim]
    return names


class SymbolicDimsByName(Fault):
    """Treats symbolic dimensions as names that must agree: ``past_key[1, 2, past, 8] <- present_key[1,
    2, total, 8]`` is refused, as is a symbolic dimension bound to a concrete one."""

    fault_id = "BIND-COMPATIBLE.symbolic-dims-by-name"
    clauses = ("BIND-COMPATIBLE",)

    def precheck(self, model, base_dir):
        dims = _symbolic_by_name(model)
        for index, binding in enumerate(model.graph.persistent_bindings):
            a, b = dims.get(binding.input_name), dims.get(binding.output_name)
            if a is None or b is None or len(a) != len(b):
                continue
            for x, y in zip(a, b):
                if (isinstance(x, str) or isinstance(y, str)) and x != y and x not in ("", None) \
                        and y not in ("", None):
                    raise violation(E.BINDING_INCOMPATIBLE, f"model.graph.persistent_bindings[{index}]",
                                    f"dimension {x!r} versus {y!r}")


class DuplicateOutputsAccepted(Fault):
    """Checks that no input is selected twice but not outputs: one output feeding two inputs is
    accepted, and both inputs receive it."""

    fault_id = "BIND-DUPLICATES.output-duplicates-accepted"
    clauses = ("BIND-DUPLICATES",)

    def patches(self):
        def make(original):
            def validate_bindings(model, catalogue=None):
                try:
                    return original(model, catalogue)
                except ContractError as error:
                    if error.code is not E.BINDING_OUTPUT_DUPLICATE:
                        raise
                pairs = [(b.input_name, b.output_name) for b in model.graph.persistent_bindings]
                # every repeated output checked as its own binding, against the same output
                resolved = []
                for i, o in pairs:
                    single = type(model)()
                    single.CopyFrom(model)
                    del single.graph.persistent_bindings[:]
                    single.graph.persistent_bindings.add(input_name=i, output_name=o)
                    resolved += list(original(single, catalogue))
                if len({b.input_name for b in resolved}) != len(resolved):
                    return original(model, catalogue)
                return tuple(resolved)
            return validate_bindings
        return [wrap(bindings_module, "validate_bindings", make)]


# --------------------------------------------------------------------------------------- state
_ACTIVE = threading.local()


class _TrackedState(FaultState):
    """Makes the handle's state visible to the fault's patches while one of its calls runs."""

    def run(self, feeds):
        _ACTIVE.state = self.state
        try:
            return super().run(feeds)
        finally:
            _ACTIVE.state = None

    def run_cancelled(self, feeds):
        _ACTIVE.state = self.state
        try:
            return super().run_cancelled(feeds)
        finally:
            _ACTIVE.state = None

    def run_held(self, feeds, hold):
        _ACTIVE.state = self.state
        try:
            return super().run_held(feeds, hold)
        finally:
            _ACTIVE.state = None


def _publishing_each_binding(original):
    def check_value(value, spec, path, *args, **kwargs):
        result = original(value, spec, path, *args, **kwargs)
        state = getattr(_ACTIVE, "state", None)
        if state is not None and path.startswith("outputs["):
            for binding in state.bindings:
                if path == f"outputs[{binding.output_name!r}]":
                    # published as soon as this binding's value is checked, before the next one is
                    state._values = MappingProxyType({**state._values, binding.input_name: value})
        return result
    return check_value


class PublishesBindingByBinding(Fault):
    """Publishes each retained value as soon as its own output passed validation: when a later binding's
    output fails validation (or the call is cancelled before publication), the earlier bindings already
    hold the new values while the later ones keep the old."""

    fault_id = "STATE-ATOMIC.published-binding-by-binding"
    clauses = ("STATE-ATOMIC", "ZC-FAILURE")
    boundary = True

    def patches(self):
        return [wrap(state_module, "check_value", _publishing_each_binding, aliases=False)]

    def make_state(self, handle):
        return _TrackedState(handle.state, self)


def _first_step_only(original):
    def check_value(value, spec, path, *args, **kwargs):
        state = getattr(_ACTIVE, "state", None)
        if state is not None and path.startswith("outputs[") and state.steps >= 1:
            return None  # the shapes were checked on the first step and are taken as stable
        return original(value, spec, path, *args, **kwargs)
    return check_value


class LaterStepsNotValidated(Fault):
    """Validates the selected outputs against the bound inputs' declared types on the first call only;
    later calls publish whatever the graph produced (the shapes are taken as stable)."""

    fault_id = "STATE-VALIDATE-METADATA.later-steps-unchecked"
    clauses = ("STATE-VALIDATE-METADATA", "STATE-ATOMIC")

    def patches(self):
        return [wrap(state_module, "check_value", _first_step_only, aliases=False)]

    def make_state(self, handle):
        return _TrackedState(handle.state, self)


class _MergingResetState(FaultState):
    def reset(self, initial):
        state = self.state
        if state.closed or not initial:
            return super().reset(initial)
        kept = {name: value for name, value in state._values.items() if name not in initial}
        # the values the caller left out keep their current contents
        merged = {**kept, **{k: to_runtime(v) for k, v in initial.items()}}
        with self.fault.injected():
            values = state._initial_values(merged)
        state._values = values
        state.steps = 0


class PartialResetMerged(Fault):
    """``reset(initial)`` merges the given values into the current state: a binding the caller left out
    keeps its current (stale) value instead of the reset failing for a missing initial value."""

    fault_id = "STATE-RESET.partial-reset-merged"
    clauses = ("STATE-RESET", "STATE-INITIAL")

    def make_state(self, handle):
        return _MergingResetState(handle.state, self)


# ------------------------------------------------------------------------------------ attention
def _interleaved_index(hq: int, hkv: int) -> np.ndarray:
    return np.arange(hq) % hkv


def _interleaved_scores(q, k):
    batch, hq, sq, d = q.shape
    kk = k[:, _interleaved_index(hq, k.shape[1])]
    return np.matmul(q, np.swapaxes(kk, -1, -2)).astype(q.dtype, copy=False)


def _interleaved_values(p, v):
    batch, hq, sq, t = p.shape
    vv = v[:, _interleaved_index(hq, v.shape[1])]
    return np.matmul(p, vv).astype(p.dtype, copy=False)


def _interleaved_scaled(x, scale):
    if scale is None:
        return x
    hq = x.shape[1]
    per_head = scale[:, _interleaved_index(hq, scale.shape[1])]  # [t, Hq]
    return x * per_head.T[None, :, None, :]


class GroupedHeadsInterleaved(Fault):
    """Maps query head h to key/value head ``h % kv_heads`` (interleaved) instead of ``h // (q_heads /
    kv_heads)`` (consecutive groups) in grouped- and multi-query Attention."""

    fault_id = "KV-ATTENTION.gqa-heads-interleaved"
    clauses = ("KV-ATTENTION",)

    def patches(self):
        return [Patch(attention_module, "grouped_scores", _interleaved_scores),
                Patch(attention_module, "grouped_values", _interleaved_values),
                Patch(paged_attention_module, "_scaled", _interleaved_scaled)]


def _softcap_after_bias(raw, bias, softcap):
    capped = attention_module.apply_softcap(raw, softcap)
    if bias is None:
        return capped, capped
    return capped, attention_module.apply_softcap(raw + bias, softcap)


class SoftcapAfterMask(Fault):
    """Adds the mask and causal bias to the scores before the softcap: ``c * tanh((s + bias) / c)`` maps a
    masked key's -inf to -c, so masked keys get weight."""

    fault_id = "KV-ATTENTION.softcap-after-mask"
    clauses = ("KV-ATTENTION",)

    def patches(self):
        return [Patch(attention_module, "biased_logits", _softcap_after_bias)]


def _top_left(original):
    def position_bias(q_len, start, stop, offset, attrs, dtype):
        return original(q_len, start, stop, 0 if np.ndim(offset) == 0 else np.zeros_like(offset), attrs, dtype)
    return position_bias


class CausalAlignedTopLeft(Fault):
    """Aligns the causal frontier to the start of the keys: query i sees keys 0..i even when a past
    precedes this call's tokens (instead of past_length + i, bottom-right)."""

    fault_id = "KV-ATTENTION.causal-top-left"
    clauses = ("KV-ATTENTION",)

    def patches(self):
        return [wrap(attention_module, "position_bias", _top_left)]


def _short_mask_attends(original):
    def mask_bias(mask, dtype, start, stop):
        bias = original(mask, dtype, start, stop)
        if bias is None or stop <= mask.shape[-1]:
            return bias
        padded = max(start, mask.shape[-1]) - start  # the first key beyond the mask, within [start, stop)
        bias = bias.copy()
        bias[..., padded:] = 0  # padded with "attend"
        return bias
    return mask_bias


class ShortMaskPaddedToAttend(Fault):
    """Pads an attention mask shorter than the total sequence with zeros (attend) instead of -inf, so the
    keys beyond the mask's end are attended."""

    fault_id = "KV-ATTENTION.short-mask-padded-attend"
    clauses = ("KV-ATTENTION",)
    boundary = True

    def patches(self):
        return [wrap(attention_module, "mask_bias", _short_mask_attends)]


def _finite_minimum(original):
    def combine_bias(parts, shape, dtype):
        bias = original(parts, shape, dtype)
        if bias is None:
            return None
        return np.where(np.isneginf(bias), np.finfo(dtype).min, bias).astype(dtype, copy=False)
    return combine_bias


class MaskedWithFiniteMinimum(Fault):
    """Masks with the type's most negative finite value instead of -inf: a query row whose every key is
    masked averages all the values (uniform softmax) instead of giving zeros."""

    fault_id = "KV-ATTENTION.finite-mask-minimum"
    clauses = ("KV-ATTENTION",)
    boundary = True

    def patches(self):
        return [wrap(attention_module, "combine_bias", _finite_minimum)]


def _first_block_zero_point(original):
    def decode_many(codecs, values):
        if len(codecs) > 1 and codecs[0].kind == "affine" and codecs[0].zero_point is not None:
            first = codecs[0]
            tokens = first.shape[0] * len(codecs)
            payload = np.concatenate([value.payload for value in values])
            scale = np.concatenate([codec.scale for codec in codecs], axis=0)
            zero_point = np.concatenate([first.zero_point] * len(codecs), axis=0)  # the group's first block's
            return formats._dequantize_heads(payload, first.storage_type, scale, zero_point,
                                             (tokens,) + first.shape[1:], first.block_size)
        return original(codecs, values)
    return decode_many


class GroupZeroPointFromFirstBlock(Fault):
    """Decodes a run of blocks of one affine format together with each block's scale but the first
    block's zero point for all of them (the zero point is taken as a format constant, not block data)."""

    fault_id = "KV-PAGED-FORMATS.group-zero-point-from-first-block"
    clauses = ("KV-PAGED-FORMATS",)
    boundary = True

    def patches(self):
        return [wrap(formats, "decode_many", _first_block_zero_point)]


def _reserve_below_capacity(self, length, needed):
    """KVStorage.reserve with ``>=``: a reservation ending exactly at the capacity is refused."""
    with self.lock:
        if needed >= self.capacity or self._claimed() != length:
            return False
        self._reservations.append(needed)
        return True


class CopyAtExactCapacity(Fault):
    """Reserves room in an allocation only while the append ends strictly below its capacity: the append
    that fills an allocation exactly (a contiguous cache at its capacity, a paged block's last slot)
    relocates the tokens into a fresh allocation, a copy of every token already there."""

    fault_id = "KV-CAPACITY-REUSE.copy-at-exact-capacity"
    clauses = ("KV-CAPACITY-REUSE",)
    boundary = True

    def patches(self):
        return [Patch(storage.KVStorage, "reserve", _reserve_below_capacity)]


# ------------------------------------------------------------------------------ paged block groups
def _extends_after_partial(group, in_place, block, budget):
    """paged._extends without its first check: a partial block may be followed in its group."""
    previous = group[-1]
    if in_place:
        return paged._adjacent(previous, block) and (len(group) + 1) * block.tokens <= paged.SLAB_TOKENS
    signature = block.signature
    return (signature is not None and block.valid == block.tokens and signature == previous.signature
            and (len(group) + 1) * block.key_codec.decode_cost <= budget
            and (len(group) + 1) * block.tokens <= paged.GROUP_TOKENS)


class PartialBlockGrouped(Fault):
    """Decodes a partial block together with the next blocks of the same format: its unused slots are
    read as tokens, so every later token of the group sits at the wrong position (a partial block is only
    safe at the end of a group)."""

    fault_id = "KV-PAGED-RANGE.partial-block-grouped"
    clauses = ("KV-PAGED-RANGE",)
    boundary = True

    def patches(self):
        return [Patch(paged, "_extends", _extends_after_partial)]


def _signature_without_type(self):
    if self.kind == "affine" and self.axis == 2 and self.block_size:
        # the layout's geometry, not its element type: INT8, INT4 and INT2 blocks look alike
        return ("affine", self.shape, self.block_size, self.scale.shape, self.zero_point is None)
    return _original_signature(self)


_original_signature = formats.BlockCodec._make_signature


class GroupSignatureWithoutElementType(Fault):
    """Groups consecutive affine blocks by their geometry and parameter shapes but not their storage type:
    an INT4 block following an INT8 one (both symmetric) is decoded with the INT8 block's code width."""

    fault_id = "KV-PAGED-FORMATS.group-signature-without-type"
    clauses = ("KV-PAGED-FORMATS",)

    def patches(self):
        return [Patch(formats.BlockCodec, "_make_signature", _signature_without_type)]


def _key_signature(self):
    found = self.__dict__.get("_signature", False)
    if found is False:
        key = self.key_codec.signature
        found = None if key is None or self.value_codec.signature is None else (key, key)
        object.__setattr__(self, "_signature", found)
    return found


class GroupedByKeyFormatOnly(Fault):
    """Groups consecutive blocks when their key formats agree, without comparing the value formats: a
    block whose values use another layout is decoded with the first block's value codec."""

    fault_id = "KV-PAGED-FORMATS.grouped-by-key-format"
    clauses = ("KV-PAGED-FORMATS",)

    def patches(self):
        return [Patch(paged.KVBlock, "signature", property(_key_signature))]


# ---------------------------------------------------------------------------- more compatibility
def _map_keys_unchecked(original):
    def incompatibility(a, b):
        if isinstance(a, MapSpec) and isinstance(b, MapSpec):
            return original(a.value, b.value)
        return original(a, b)
    return incompatibility


class MapKeyTypesNotCompared(Fault):
    """Compares bound maps by their value types only: map<int64, T> is accepted for map<int32, T>."""

    fault_id = "BIND-COMPATIBLE.map-key-types-unchecked"
    clauses = ("BIND-COMPATIBLE",)

    def patches(self):
        return [wrap(values_module, "incompatibility", _map_keys_unchecked)]


def _category_takes_anything(original):
    def incompatibility(a, b):
        if isinstance(a, AnySpec) or isinstance(b, AnySpec):
            return None
        return original(a, b)
    return incompatibility


class StructCategoryTakesTensors(Fault):
    """Treats an unconstrained struct category (a StructTypeProto with no kind) as a wildcard on either
    side of a binding: a tensor output is accepted for a struct-category input."""

    fault_id = "BIND-COMPATIBLE.struct-category-takes-tensors"
    clauses = ("BIND-COMPATIBLE",)

    def patches(self):
        return [wrap(values_module, "incompatibility", _category_takes_anything)]


# ------------------------------------------------------------------------------ external caches
def _external_top_left(original):
    def position_bias(q_len, start, stop, offset, attrs, dtype):
        if np.ndim(offset) > 0:  # the per-batch frontier of an external cache (nonpad_kv_seqlen)
            offset = np.zeros_like(offset)
        return original(q_len, start, stop, offset, attrs, dtype)
    return position_bias


class ExternalCacheCausalTopLeft(Fault):
    """With ``nonpad_kv_seqlen`` (an external cache), aligns the causal frontier to the start of the keys
    (query i sees keys 0..i) instead of bottom-right at nonpad_kv_seqlen - q_sequence_length + i, the bug
    onnx's own reference had before 1.23; the past/present path stays right."""

    fault_id = "KV-ATTENTION.external-cache-causal-top-left"
    clauses = ("KV-ATTENTION",)
    boundary = True

    def patches(self):
        return [wrap(attention_module, "position_bias", _external_top_left)]


class ExternalCachePaddingAttended(Fault):
    """Reads ``nonpad_kv_seqlen`` only for the causal frontier and never masks the padding slots behind
    it: without is_causal, every query also attends the cache's unused (zero) slots."""

    fault_id = "KV-ATTENTION.external-cache-padding-attended"
    clauses = ("KV-ATTENTION",)
    boundary = True

    def patches(self):
        return [Patch(attention_module, "padding_bias", lambda nonpad, start, stop, dtype: None)]


# ------------------------------------------------------------------------------ state after failure
class _PoisonedState(FaultState):
    """After a failed run, refuses every later run (the state is marked broken)."""

    broken = False

    def run(self, feeds):
        if self.broken:
            raise violation(E.STATE_RUN_FAILED, "state.run", "an earlier run failed; the state is unusable")
        try:
            return super().run(feeds)
        except ContractError as error:
            if error.code is E.STATE_RUN_FAILED:
                self.broken = True
            raise

    def reset(self, initial):
        super().reset(initial)
        self.broken = False


class FailedRunPoisonsState(Fault):
    """Marks the state broken when a run fails: the previous values stay readable, but every later run is
    refused until a reset, instead of the state staying valid for the next call."""

    fault_id = "ZC-FAILURE.failed-run-poisons-state"
    clauses = ("ZC-FAILURE", "STATE-ATOMIC")

    def make_state(self, handle):
        return _PoisonedState(handle.state, self)


# ------------------------------------------------------------------------------ strings, one side
_SIDES = threading.local()


def _counting_validation(original):
    def validate_bindings(model, catalogue=None):
        _SIDES.calls = 0
        return original(model, catalogue)
    return validate_bindings


def _input_side_only(original):
    def string_path(spec, path, *args, **kwargs):
        # validate_bindings checks each binding's input, then its output: every second call is an output
        calls = getattr(_SIDES, "calls", 0)
        _SIDES.calls = calls + 1
        return original(spec, path, *args, **kwargs) if calls % 2 == 0 else None
    return string_path


class StringsCheckedOnInputSideOnly(Fault):
    """Checks bound types for string tensors on the input side only: an output whose (nested) type holds a
    string tensor is accepted when the input's type is one that admits it (an unconstrained struct
    category)."""

    fault_id = "BIND-NO-STRINGS.output-side-unchecked"
    clauses = ("BIND-NO-STRINGS",)
    boundary = True

    def patches(self):
        return [wrap(bindings_module, "validate_bindings", _counting_validation),
                wrap(bindings_module, "string_path", _input_side_only, aliases=False)]


# ------------------------------------------------------------------------- qk_matmul_output modes
def _modes_one_and_two_swapped(original):
    def attention(*args, **kwargs):
        attrs = kwargs.get("attrs")
        if attrs is not None and attrs.qk_matmul_output_mode in (1, 2):
            kwargs["attrs"] = dataclasses.replace(attrs, qk_matmul_output_mode=3 - attrs.qk_matmul_output_mode)
        return original(*args, **kwargs)
    return attention


class QkOutputModesSwapped(Fault):
    """Numbers qk_matmul_output's intermediate modes in the order of an older operator draft (1: scores
    plus mask, 2: after the softcap) instead of ONNX's (1: after the softcap, before the mask; 2: mask and
    softcap both applied)."""

    fault_id = "KV-ATTENTION.qk-output-modes-swapped"
    clauses = ("KV-ATTENTION",)

    def patches(self):
        return [wrap(attention_module, "attention", _modes_one_and_two_swapped)]


def _mode_ignored(original):
    def attention(*args, **kwargs):
        attrs = kwargs.get("attrs")
        if attrs is not None and attrs.qk_matmul_output_mode:
            kwargs["attrs"] = dataclasses.replace(attrs, qk_matmul_output_mode=0)
        return original(*args, **kwargs)
    return attention


class QkOutputModeIgnored(Fault):
    """Always returns the raw scaled Q K^T as qk_matmul_output, whatever qk_matmul_output_mode asks."""

    fault_id = "KV-ATTENTION.qk-output-mode-ignored"
    clauses = ("KV-ATTENTION",)

    def patches(self):
        return [wrap(attention_module, "attention", _mode_ignored)]


# --------------------------------------------------------------------------- feeds and names
class _EqualFeedsTolerated(FaultState):
    def run(self, feeds):
        retained = self.state.values if not self.state.closed else {}
        kept = {}
        for name, value in feeds.items():
            current = retained.get(name)
            if isinstance(current, np.ndarray) and isinstance(value, np.ndarray) and value.dtype == current.dtype \
                    and value.shape == current.shape and np.array_equal(value, current):
                continue  # the same value as the retained one: not taken as an override, dropped
            kept[name] = value
        return super().run(kept)


class EqualFeedNotAnOverride(Fault):
    """Rejects a feed for a retained input only when it conflicts with the retained value: a feed equal
    to it (the caller passing the state's own value back) is silently dropped instead of refused."""

    fault_id = "STATE-FEED-OVERRIDE.equal-feed-tolerated"
    clauses = ("STATE-FEED-OVERRIDE",)
    boundary = True

    def make_state(self, handle):
        return _EqualFeedsTolerated(handle.state, self)


def _normalized(name: str) -> str:
    return name.strip().casefold()


class NamesMatchedLoosely(Fault):
    """Looks binding names up after trimming spaces and folding case: ``PAST`` or ``past `` selects the
    input ``past`` instead of naming no whole input."""

    fault_id = "BIND-EXACT-NAMES.names-matched-loosely"
    clauses = ("BIND-EXACT-NAMES",)

    def transform(self, model, base_dir):
        inputs = {_normalized(vi.name): vi.name for vi in model.graph.input}
        outputs = {_normalized(vi.name): vi.name for vi in model.graph.output}
        declared_in = {vi.name for vi in model.graph.input}
        declared_out = {vi.name for vi in model.graph.output}
        for binding in model.graph.persistent_bindings:
            if binding.input_name not in declared_in:
                binding.input_name = inputs.get(_normalized(binding.input_name), binding.input_name)
            if binding.output_name not in declared_out:
                binding.output_name = outputs.get(_normalized(binding.output_name), binding.output_name)


# ---------------------------------------------------------------------------------- max_tokens
def _max_tokens_exclusive(original):
    def kernel(args, attrs, ctx):
        limit = attrs.get("max_tokens", 4096)
        if isinstance(limit, int) and not isinstance(limit, bool) and limit > 1:
            attrs = {**attrs, "max_tokens": limit - 1}  # ``>=`` where the bound is ``>``
        return original(args, attrs, ctx)
    return kernel


class MaxTokensExclusive(Fault):
    """Refuses an append that brings the cache to exactly max_tokens (``count + new >= max_tokens``)
    instead of only one that goes beyond it: a cache can never be filled to its declared limit."""

    fault_id = "KV-MUTATION-FAILED.max-tokens-exclusive"
    clauses = ("KV-MUTATION-FAILED",)
    boundary = True

    def patches(self):
        return [wrap(kernels, "paged_attention_kernel", _max_tokens_exclusive)]

"""The interaction cases (corpus/cases/kv/attention_combinations.toml): they are the covering array of
corpus/builders/kv_combinations.py, their NumPy expectations agree with onnx's reference evaluator on plain
Attention models over K/V dequantized from the cases' own payloads (and with onnxruntime where it runs the
model), the reference passes them, and a runtime wrong only where two or three features meet fails them.

Each fault below is such a runtime: right about every feature alone, so it passes every KV case that existed
before these (``python -m conformance run --adapter tests.test_kv_interaction_cases:NAME --profile kv-paged
--profile kv-contiguous`` fails only the combination cases), and wrong in one combination:

* ``SoftcapBeforeScaleOnQuantizedBlocks``: softcap on the unscaled product, then the scale, on quantized caches;
* ``DecodeGroupedQueryPositions``: one-token calls with grouped heads place query head h at offset + h % group;
* ``PagedQuantizedFloatMaskValuesDropped``: the paged kernel keeps only the -inf of a float mask on quantized
  blocks;
* ``WindowExclusiveOnInt2Blocks``: sliding windows read as exclusive bounds on INT2 blocks;
* ``PrefillMixedFormatValueZeroPoint``: the multi-query kernel decodes a value block with its key block's
  zero point when the two formats differ.
"""

from __future__ import annotations

import copy
import dataclasses
import importlib
import math
import threading

import numpy as np
import pytest

from conformance.audit.fault import Fault, wrap

pytestmark = pytest.mark.clause("KV-ATTENTION")

attention_module = importlib.import_module("reference_impl.kv.attention")
paged_attention_module = importlib.import_module("reference_impl.kv.paged_attention")
kernels_module = importlib.import_module("reference_impl.kv.kernels")
#: TensorProto INT2
_INT2 = 26


def _quantized(block) -> bool:
    return block.key_codec.kind != "dense" or block.value_codec.kind != "dense"


def _storage_types(block) -> set:
    return {getattr(codec, "storage_type", None) for codec in (block.key_codec, block.value_codec)}


def _covers(blocks, lo: int, hi: int, test) -> bool:
    """Whether a block holding positions within [lo, hi) passes ``test``."""
    return any(test(block) for block in blocks if block.start < hi and block.end > lo)


# ------------------------------------------------------------------------------------------------ faults
def _softcap_before_scale(original):
    def attend_row(q, cache, mask, attrs, offset):
        if attrs.softcap > 0 and any(_quantized(block) for block in cache.blocks):
            # c * tanh(s / c) * scale on the unscaled product s equals a softcap of c * scale on the scaled one
            scale = attrs.scale if attrs.scale is not None else 1.0 / math.sqrt(q.shape[-1])
            attrs = dataclasses.replace(attrs, softcap=attrs.softcap * scale)
        return original(q, cache, mask, attrs, offset)
    return attend_row


class SoftcapBeforeScaleOnQuantizedBlocks(Fault):
    """On a paged cache holding quantized blocks, the kernel applies the softcap to the raw product Q K^T and
    multiplies by the scale afterwards (c * tanh(QK / c) * scale instead of c * tanh(QK * scale / c)): right on
    dense caches and without a softcap, wrong where softcap and quantized blocks meet."""

    fault_id = "KV-ATTENTION.softcap-before-scale-on-quantized-blocks"
    clauses = ("KV-ATTENTION", "KV-PAGED-FORMATS")

    def patches(self):
        return [wrap(paged_attention_module, "_attend_row", _softcap_before_scale)]


_DECODE_GROUP = threading.local()


def _packed_positions(original):
    def position_bias(q_len, start, stop, offset, attrs, dtype):
        heads = getattr(_DECODE_GROUP, "heads", None)
        if heads is None or q_len != 1:
            return original(q_len, start, stop, offset, attrs, dtype)
        q_heads, group = heads
        parts = [original(q_len, start, stop, offset + head % group, attrs, dtype) for head in range(q_heads)]
        if all(part is None for part in parts):
            return None
        parts = [np.zeros((q_len, stop - start), dtype) if part is None else part for part in parts]
        if np.ndim(offset):  # (B, 1, 1, T) per batch row
            return np.concatenate(parts, axis=1)
        return np.stack(parts)[None]  # (1, Hq, 1, T)
    return position_bias


def _decode_group_marked(heads_of):
    def make(original):
        def call(*args, **kwargs):
            heads = heads_of(*args)
            _DECODE_GROUP.heads = heads
            try:
                return original(*args, **kwargs)
            finally:
                _DECODE_GROUP.heads = None
        return call
    return make


def _dense_heads(q, k, *rest):
    q, k = np.asarray(q), np.asarray(k)
    if q.ndim == 4 and q.shape[2] == 1 and q.shape[1] > k.shape[1]:
        return q.shape[1], q.shape[1] // k.shape[1]
    return None


def _paged_heads(q, cache, *rest):
    if q.shape[2] == 1 and q.shape[1] > cache.kv_heads:
        return q.shape[1], q.shape[1] // cache.kv_heads
    return None


class DecodeGroupedQueryPositions(Fault):
    """The one-token (decode) kernel for grouped query heads packs the heads of a group as rows and numbers the
    rows as query positions: head h sits at offset + h % (q_heads / kv_heads) instead of offset. Harmless to the
    causal mask in decode (no key lies beyond the last position), so every causal decode passes; a sliding
    window, which counts back from the query's position, loses its oldest keys."""

    fault_id = "KV-ATTENTION.decode-grouped-query-positions"
    clauses = ("KV-ATTENTION",)

    def patches(self):
        return [wrap(attention_module, "position_bias", _packed_positions),
                wrap(kernels_module, "attention", _decode_group_marked(_dense_heads)),
                wrap(paged_attention_module, "_attend_row", _decode_group_marked(_paged_heads))]


_BLOCKS = threading.local()


def _blocks_marked(original):
    def attend_row(q, cache, mask, attrs, offset):
        _BLOCKS.blocks = cache.blocks
        try:
            return original(q, cache, mask, attrs, offset)
        finally:
            _BLOCKS.blocks = ()
    return attend_row


def _float_mask_values_dropped(original):
    def group_bias(mask, sq, lo, hi, first, offset, attrs):
        if mask is not None and mask.dtype != np.bool_ and _covers(getattr(_BLOCKS, "blocks", ()), lo, hi, _quantized):
            mask = np.where(np.isneginf(mask), mask, mask.dtype.type(0))
        return original(mask, sq, lo, hi, first, offset, attrs)
    return group_bias


class PagedQuantizedFloatMaskValuesDropped(Fault):
    """The paged kernel's quantized-block path reads a float attn_mask as a boolean one: it keeps the -inf
    entries and drops the finite additive values. Dense blocks and the contiguous path add the mask right."""

    fault_id = "KV-ATTENTION.paged-quantized-float-mask-values-dropped"
    clauses = ("KV-ATTENTION", "KV-PAGED-FORMATS")

    def patches(self):
        return [wrap(paged_attention_module, "_attend_row", _blocks_marked),
                wrap(paged_attention_module, "_group_bias", _float_mask_values_dropped)]


def _window_exclusive_on_int2(original):
    def group_bias(mask, sq, lo, hi, first, offset, attrs):
        if _covers(getattr(_BLOCKS, "blocks", ()), lo, hi, lambda block: _INT2 in _storage_types(block)):
            attrs = dataclasses.replace(
                attrs, left_window_size=attrs.left_window_size - (attrs.left_window_size > 0),
                right_window_size=attrs.right_window_size - (attrs.right_window_size > 0))
        return original(mask, sq, lo, hi, first, offset, attrs)
    return group_bias


class WindowExclusiveOnInt2Blocks(Fault):
    """The paged kernel's INT2 block path reads the sliding window's bounds as exclusive (distance < size): a
    query loses the key exactly left_window_size back when that key sits in an INT2 block."""

    fault_id = "KV-ATTENTION.window-exclusive-on-int2-blocks"
    clauses = ("KV-ATTENTION", "KV-PAGED-FORMATS")

    def patches(self):
        return [wrap(paged_attention_module, "_attend_row", _blocks_marked),
                wrap(paged_attention_module, "_group_bias", _window_exclusive_on_int2)]


def _mixed(block) -> bool:
    key, value = block.key_codec, block.value_codec
    return key.kind == value.kind == "affine" and key.storage_type != value.storage_type


def _value_zero_point_of_key(block):
    codec = copy.copy(block.value_codec)
    codec.zero_point = None if block.key_codec.zero_point is None else block.key_codec.zero_point.copy()
    codec.__dict__.pop("_signature", None)
    return dataclasses.replace(block, value_codec=codec)


def _prefill_mixed_zero_point(original):
    def attend_row(q, cache, mask, attrs, offset):
        if q.shape[2] > 1 and any(_mixed(block) for block in cache.blocks):
            blocks = tuple(_value_zero_point_of_key(block) if _mixed(block) else block for block in cache.blocks)
            cache = type(cache)(cache.kv_heads, cache.head_size, cache.v_head_size, cache.block_size, blocks,
                                _checked=True)
        return original(q, cache, mask, attrs, offset)
    return attend_row


class PrefillMixedFormatValueZeroPoint(Fault):
    """The multi-query (prefill) kernel dequantizes a block whose key and value formats differ with one set of
    affine parameters for its zero points, the key block's: the value block loses its own zero point (or gains
    the key's). Decode calls and blocks whose K and V share a format decode right."""

    fault_id = "KV-PAGED-FORMATS.prefill-mixed-format-value-zero-point"
    clauses = ("KV-PAGED-FORMATS", "AFF-DQ")

    def patches(self):
        return [wrap(paged_attention_module, "_attend_row", _prefill_mixed_zero_point)]


#: fault -> the options every combination case it fails must hold (what makes it an interaction fault)
FAULTS = {
    SoftcapBeforeScaleOnQuantizedBlocks:
        lambda row: row["softcap"] == "on" and row["storage"] not in ("contiguous", "dense"),
    DecodeGroupedQueryPositions:
        lambda row: row["phase"] != "prefill" and row["heads"] != "mha" and row["window"] != "none",
    PagedQuantizedFloatMaskValuesDropped:
        lambda row: row["mask"] == "float" and row["storage"] not in ("contiguous", "dense"),
    WindowExclusiveOnInt2Blocks: lambda row: row["window"] != "none" and row["storage"] == "int2",
    PrefillMixedFormatValueZeroPoint: lambda row: row["phase"] != "decode" and ":" in row["storage"],
}


# ------------------------------------------------------------------------------------------------- cases
_SOURCE = "cases/kv/attention_combinations.toml"


def _cases() -> dict:
    from conformance.cases import load_cases

    return {case.id: case for case in load_cases() if case.source == _SOURCE}


CASES = _cases()


def _row(case) -> dict:
    from corpus.builders.kv_combinations import FACTORS

    return {name: case.args[name] for name in FACTORS}


def test_the_case_file_is_the_covering_array():
    """Every row of the covering array is a case (named and levelled as the builder says) and nothing else is;
    the rows hold every pair of options and the three-way GROUPS, and the Required rows alone hold every pair
    of the options a Required row may use."""
    from corpus.builders import covering
    from corpus.builders import kv_combinations as K

    rows = K.rows()
    assert 40 <= len(rows) <= 80
    want = {f"{'Required' if K.required(row) else 'Recommended'}.KV."
            f"{'Paged' if K.paged(row) else 'Attention'}Combinations.{K.row_name(row)}": row for row in rows}
    assert {case_id: _row(case) for case_id, case in CASES.items()} == want
    assert not covering.missing(rows, K.FACTORS, groups=K.GROUPS, allowed=K.allowed)
    required = [row for row in rows if K.required(row)]
    assert not covering.missing(required, K.FACTORS, allowed=lambda row: K.allowed(row) and K.required(row))
    assert all(case.quote for case in CASES.values())


def test_every_option_and_path_appears_at_both_levels_where_the_spec_allows():
    """Each option of each factor is used by some row; each paged format and the contiguous path have
    Required rows in every phase, and the options a Required paged row may not use appear in Recommended ones."""
    from corpus.builders import kv_combinations as K

    rows = K.rows()
    for name, options in K.FACTORS.items():
        assert {row[name] for row in rows} == set(options), name
    for storage in K.FACTORS["storage"]:
        if storage != "codebook2":
            assert {row["phase"] for row in rows if row["storage"] == storage and K.required(row)} \
                == set(K.FACTORS["phase"]), storage
    paged_extensions = [row for row in rows if K.paged(row) and not K.required(row)]
    for name, plain in (("scale", "default"), ("softcap", "off"), ("mask", "none"), ("window", "none")):
        assert any(row[name] != plain for row in paged_extensions), name


# ------------------------------------------------------------------------------------------ peers
_CODEBOOK = np.array([-1.0, -0.25, 0.25, 1.0], np.float32)  # the spec's type 1101 constant


def _array(literal):
    from conformance import values as V

    return V.build(literal)


def _dequantized(literal) -> np.ndarray:
    """A block's K or V as float32 [slots, heads, size], decoded from the case's own payload by the spec's
    formulas: (code - zero_point) * scale for affine blocks, codebook[index] * scale per 32-value record."""
    from google.protobuf import text_format

    from corpus.builders.kv_formats import dequantize_affine
    from reference_impl import schema

    if "encoded" not in literal:
        return _array(literal)
    value = text_format.Parse(literal["encoded"], schema.EncodedValueProto())
    if value.WhichOneof("layout") == "affine":
        return dequantize_affine(value)
    assert value.struct_type.type_ref == 1102
    records = np.frombuffer(value.raw_data, np.uint8).reshape(-1, 12)
    index = ((records[:, :8, None] >> np.arange(0, 8, 2)) & 3).reshape(-1, 32)
    scale = records[:, 8:].copy().view("<f4")
    dims = tuple(d.dim_value for d in value.logical_type.tensor_type.shape.dim)
    return (_CODEBOOK[index] * scale).astype(np.float32).reshape(dims)


def _paged_as_attention(case):
    """A plain Attention model with the paged model's attributes, and the initial past: the valid tokens of
    every block of the case's initial cache, dequantized (1, kv_heads, T, D)."""
    import onnx
    from onnx import TensorProto, helper

    from reference_impl import schema

    (node,) = schema.parse_model(case.model_bytes()).graph.node
    attrs = {a.name: (a.f if a.type == 1 else a.i) for a in node.attribute
             if a.name in ("is_causal", "scale", "softcap", "left_window_size")}
    masked = len(node.input) == 5
    row = _row(case)
    mask_type = TensorProto.BOOL if row["mask"] == "bool" else TensorProto.FLOAT
    dims = [None] * 4
    inputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, dims)
              for name in ("q", "k", "v", "past_key", "past_value")]
    if masked:
        inputs.append(helper.make_tensor_value_info("attn_mask", mask_type, dims))
    outputs = [helper.make_tensor_value_info(name, TensorProto.FLOAT, dims)
               for name in ("y", "present_key", "present_value")]
    attention = helper.make_node("Attention", ["q", "k", "v", "attn_mask" if masked else "", "past_key",
                                               "past_value"], ["y", "present_key", "present_value"], **attrs)
    opset = 25 if "left_window_size" in attrs else 23
    model = helper.make_model(helper.make_graph([attention], "paged_as_attention", inputs, outputs),
                              opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    onnx.checker.check_model(model)
    blocks = case.extras()["steps"][0]["initial"]["cache"]["struct"]["blocks"]["sequence"]
    keys, values = [], []
    for block in blocks:
        valid = int(_array(block["struct"]["valid_length"]))
        keys.append(_dequantized(block["struct"]["key"])[:valid])
        values.append(_dequantized(block["struct"]["value"])[:valid])
    past = {"past_key": np.concatenate(keys).transpose(1, 0, 2)[None],
            "past_value": np.concatenate(values).transpose(1, 0, 2)[None]}
    return model, past, {"past_key": "present_key", "past_value": "present_value"}


def _plain(case):
    """(standard ONNX model, initial state, feedback input -> output) of a case."""
    from plain_models import plain_onnx

    from corpus.builders.kv_combinations import paged

    if paged(_row(case)):
        return _paged_as_attention(case)
    model = plain_onnx(case)
    from reference_impl import schema

    bindings = {b.input_name: b.output_name for b in schema.parse_model(case.model_bytes()).graph.persistent_bindings}
    initial = {name: _array(value) for name, value in case.extras()["steps"][0]["initial"].items()}
    return model, initial, bindings


def _session(model, peer: str):
    names = [output.name for output in model.graph.output]
    if peer == "onnxruntime":
        ort = pytest.importorskip("onnxruntime")
        session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        return lambda feeds: dict(zip(names, session.run(names, feeds), strict=True))
    from onnx.reference import ReferenceEvaluator

    evaluator = ReferenceEvaluator(model)
    return lambda feeds: dict(zip(names, evaluator.run(None, feeds), strict=True))


def _peer_check(case, peer: str) -> None:
    model, state, bindings = _plain(case)
    run = _session(model, peer)
    for step in case.extras()["steps"][1:]:
        got = run({**{name: _array(value) for name, value in step["feeds"].items()}, **state})
        np.testing.assert_allclose(got["y"], _array(step["outputs"]["y"]), rtol=step["rtol"], atol=step["atol"],
                                   err_msg=f"{case.id} {step['as']}")
        state = {name: got[output] for name, output in bindings.items()}


@pytest.mark.parametrize("case_id", sorted(CASES))
def test_expectations_agree_with_onnx_reference_evaluator(case_id):
    """onnx's reference Attention (and TensorScatter), fed back by hand, gives every expected Y: over the
    case's own model for the contiguous path, over K/V dequantized from the case's payloads for the paged one."""
    _peer_check(CASES[case_id], "onnx-reference")


@pytest.mark.parametrize("case_id", sorted(CASES))
def test_expectations_agree_with_onnxruntime(case_id):
    _peer_check(CASES[case_id], "onnxruntime")


# ------------------------------------------------------------------------------------------ faults
def _verdicts(adapter, case_ids) -> dict:
    from conformance.cases import load_cases
    from conformance.execute import run_case

    cases = {case.id: case for case in load_cases()}
    return {case_id: run_case(cases[case_id], adapter, timeout=120).verdict for case_id in case_ids}


def test_the_reference_passes_every_combination_case():
    from conformance.adapters.reference import ReferenceAdapter
    from conformance.execute import PASSED

    assert set(_verdicts(ReferenceAdapter(), CASES).values()) == {PASSED}


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("fault", list(FAULTS), ids=lambda fault: fault.__name__)
def test_an_interaction_fault_fails_combination_cases_holding_its_combination_only(fault):
    """The fault fails some combination case, and every case it fails holds the combination it is wrong in."""
    from conformance.execute import FAILED, PASSED

    verdicts = _verdicts(fault(), CASES)
    failed = {case_id for case_id, verdict in verdicts.items() if verdict == FAILED}
    assert failed, f"{fault.__name__} passes every combination case"
    assert set(verdicts.values()) <= {PASSED, FAILED}
    outside = sorted(case_id for case_id in failed if not FAULTS[fault](_row(CASES[case_id])))
    assert not outside, f"{fault.__name__} fails cases without its combination: {outside}"


#: the case files holding the KV cases written before the combination cases
_EARLIER = ("cases/kv/decode.toml", "cases/kv/contiguous.toml", "cases/kv/paged.toml",
            "cases/kv/attention_semantics.toml",
            "cases/kv/batches_and_masks.toml", "cases/kv/padding.toml", "cases/kv/masks_and_bindings.toml",
            "cases/state/state_rules.toml",
            "cases/kv/state_paths.toml")


def _earlier_kv_cases() -> list[str]:
    from conformance.cases import load_cases

    return sorted(case.id for case in load_cases()
                  if case.profile in ("kv-paged", "kv-contiguous") and case.source in _EARLIER)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("fault", list(FAULTS), ids=lambda fault: fault.__name__)
def test_an_interaction_fault_passes_every_kv_case_written_before_these(fault):
    """Right about each feature alone: the fault passes every other case of the kv-paged and kv-contiguous
    profiles, which test the features one or two at a time; only the combination cases catch it."""
    from conformance.execute import PASSED

    verdicts = _verdicts(fault(), _earlier_kv_cases())
    assert len(verdicts) > 100
    assert {case_id: verdict for case_id, verdict in verdicts.items() if verdict != PASSED} == {}

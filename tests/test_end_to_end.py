"""End-to-end stateful decode of a tiny Qwen-style model through ``make_state``: equal to the manual
output-to-input loop, to onnx's own operators, and to onnxruntime on the lowered standard model;
independent states in threads; reset; and the per-token byte accounting."""

from __future__ import annotations

import itertools
import threading

import numpy as np
import pytest

from reference_impl.executor import Executor
from reference_impl.graph_utils import feedback_loop
from reference_impl.kv import measure, qwen
from reference_impl.kv.kernels import kv_kernels
from reference_impl.state import make_state

CONFIG = qwen.QwenConfig()
DECODE_STEPS = 64
PROMPT = 8


def _feeds(seed: int, steps: int = DECODE_STEPS) -> list[dict]:
    """A prompt, then one token per call (teacher-forced, so every runtime sees the same tokens)."""
    rng = np.random.default_rng(seed)
    return [{"input_ids": rng.integers(0, CONFIG.vocab, (1, PROMPT))}] + \
        [{"input_ids": rng.integers(0, CONFIG.vocab, (1, 1))} for _ in range(steps)]


_EXECUTORS: dict = {}


def _executor(variant: str, kernels: bool = True) -> Executor:
    key = (variant, kernels)
    if key not in _EXECUTORS:
        _EXECUTORS[key] = Executor(qwen.build(CONFIG, variant), kernels=kv_kernels() if kernels else None)
    return _EXECUTORS[key]


def _state_logits(variant: str, feeds: list[dict]) -> list[np.ndarray]:
    state = make_state(_executor(variant), qwen.initial_values(CONFIG, variant))
    return [state.run(feed)["logits"] for feed in feeds]


def _bindings(executor: Executor) -> list[tuple[str, str]]:
    return [(b.input_name, b.output_name) for b in executor.bindings]


# ----------------------------------------------------------------------------- equivalences
@pytest.mark.clause("STATE-EQUIV-LOOP", "KV-APPEND-EQUIV", "STATE-WHOLE-STRUCT")
@pytest.mark.parametrize("variant", qwen.VARIANTS)
def test_state_equals_the_manual_feedback_loop(variant):
    feeds = _feeds(1)
    executor = _executor(variant)
    manual = feedback_loop(executor.run, _bindings(executor), qwen.initial_values(CONFIG, variant), feeds)
    for step, (ours, theirs) in enumerate(zip(_state_logits(variant, feeds), manual)):
        np.testing.assert_array_equal(ours, theirs["logits"], err_msg=f"step {step}")


@pytest.mark.clause("KV-ATTENTION", "STATE-EQUIV-LOOP")
def test_cache_kernels_equal_onnx_operators():
    """The same model on onnx's own Attention (functional concat) through the manual loop."""
    feeds = _feeds(2)
    executor = _executor("tensors", kernels=False)
    empty = {name: np.zeros((1, 0, CONFIG.kv_heads, CONFIG.head_dim), np.float32)
             for name, _ in _bindings(executor)}
    reference = feedback_loop(executor.run, _bindings(executor), empty, feeds)
    for ours, theirs in zip(_state_logits("tensors", feeds), reference):
        np.testing.assert_allclose(ours, theirs["logits"], rtol=1e-5, atol=1e-5)


@pytest.mark.clause("EXP-STANDARD", "STATE-EQUIV-LOOP")
def test_state_equals_onnxruntime_on_the_lowered_model():
    """onnxruntime runs the standard lowering (DequantizeLinear INT4 weights, no bindings) with
    caller-managed feedback. Its QDQ transformer would rewrite DequantizeLinear+MatMul into MatMulNBits,
    which changes the arithmetic (logits move by ~0.1); with that rewrite disabled it computes the
    model as written."""
    ort = pytest.importorskip("onnxruntime")
    lowered = qwen.lower(qwen.build(CONFIG, "tensors"))
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(lowered.model.SerializeToString(), options,
                                   disabled_optimizers=["QDQSelectorActionTransformer"])
    names = [o.name for o in session.get_outputs()]
    empty = {name: np.zeros((1, 0, CONFIG.kv_heads, CONFIG.head_dim), np.float32) for name, _ in lowered.feedback}
    feeds = _feeds(3)
    runtime = feedback_loop(lambda f: dict(zip(names, session.run(None, f))), lowered.feedback, empty, feeds)
    for step, (ours, theirs) in enumerate(zip(_state_logits("tensors", feeds), runtime)):
        np.testing.assert_allclose(ours, theirs["logits"], rtol=1e-4, atol=2e-5, err_msg=f"step {step}")


@pytest.mark.clause("STATE-WHOLE-STRUCT", "KV-PAGED-FORMATS")
def test_cache_variants_agree():
    """Whole-struct cache == tensor cache exactly; the paged cache with int8 keys / int4 values stays
    within quantization error, and with dense blocks matches to float rounding."""
    feeds = _feeds(4, steps=40)
    tensors = _state_logits("tensors", feeds)
    for ours, theirs in zip(_state_logits("struct", feeds), tensors):
        np.testing.assert_array_equal(ours, theirs)
    # Logits span about +-4 here; INT4 values with head_size 8 (one scale per 8 values) are coarse.
    for key_format, value_format, bound in (("int8", "int4", 0.5), ("int8", "int8", 0.06)):
        config = qwen.QwenConfig(key_format=key_format, value_format=value_format)
        quantized = _paged_logits(config, feeds)
        error = max(np.max(np.abs(a - b)) for a, b in zip(quantized, tensors))
        assert 0 < error < bound, (key_format, value_format, error)
    for ours, theirs in zip(_paged_logits(qwen.QwenConfig(key_format="dense", value_format="dense", block_size=8),
                                          feeds), tensors):
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5)


def _paged_logits(config: qwen.QwenConfig, feeds: list[dict]) -> list[np.ndarray]:
    state = make_state(Executor(qwen.build(config, "paged"), kernels=kv_kernels()),
                       qwen.initial_values(config, "paged"))
    return [state.run(feed)["logits"] for feed in feeds]


@pytest.mark.clause("ZC-RETAIN", "KV-APPEND-INPLACE", "STATE-EQUIV-LOOP")
def test_standard_head_major_multi_head_cache_appends_in_place_through_the_state():
    """The standard (B, H, S, D) layout with 2 KV heads (GQA, 4 query heads): the state retains the
    kernel's strided prefix views, every step after the prompt writes only its K and V in place, and
    the outputs equal onnx's own Attention fed back by the manual loop."""
    from test_kv_kernels import attention_model

    from reference_impl.kv import contiguous
    from reference_impl.kv.storage import counting

    heads, size, steps = 2, 8, 24
    model = attention_model(heads, size, q_heads=4, causal=True)
    rng = np.random.default_rng(9)
    feeds = [{"Q": rng.standard_normal((1, 4, n, size)).astype(np.float32),
              **{name: rng.standard_normal((1, heads, n, size)).astype(np.float32) for name in ("K", "V")}}
             for n in [5] + [1] * steps]
    initial = {name: contiguous.empty_cache(1, heads, size, 64) for name in ("past_key", "past_value")}
    state = make_state(Executor(model, kernels=kv_kernels()), initial)
    addresses, ours = set(), []
    for feed in feeds:
        with counting() as counters:
            out = state.run(feed)
        ours.append(out)
        assert (counters.in_place_appends, counters.relocated_bytes, counters.allocations) == (2, 0, 0)
        assert counters.appended_bytes == 2 * feed["K"].nbytes
        retained = state.values["past_key"]
        assert retained is out["present_key"] and not retained.flags.c_contiguous
        addresses.add(retained.__array_interface__["data"][0])
    assert len(addresses) == 1 and state.counters.payload_bytes_copied == 0
    assert state.counters.payload_allocations == 0
    plain = Executor(model)  # onnx's Attention: present = Concat(past, new)
    empty = {name: np.zeros((1, heads, 0, size), np.float32) for name in initial}
    manual = feedback_loop(plain.run, _bindings(plain), empty, feeds)
    for step, (a, b) in enumerate(zip(ours, manual)):
        np.testing.assert_array_equal(a["present_key"], b["present_key"], err_msg=f"step {step}")
        np.testing.assert_array_equal(a["present_value"], b["present_value"], err_msg=f"step {step}")
        np.testing.assert_allclose(a["Y"], b["Y"], rtol=1e-5, atol=1e-6, err_msg=f"step {step}")  # float order


# ----------------------------------------------------------------------------- isolation and reset
@pytest.mark.clause("STATE-ISOLATION", "STATE-NO-CONCURRENCY")
@pytest.mark.parametrize("variant", ["tensors", "paged"])
def test_independent_states_decode_concurrently(variant):
    executor = _executor(variant)
    seeds = [10, 11, 12, 13]
    expected = {seed: _state_logits(variant, _feeds(seed, steps=24)) for seed in seeds}
    results, errors = {}, []
    barrier = threading.Barrier(len(seeds))
    # Every state starts from the same initial buffers: the first append into each shared allocation
    # claims its spare room, the others move to their own storage (nobody writes where another reads).
    shared = qwen.initial_values(CONFIG, variant)

    def worker(seed):
        try:
            state = make_state(executor, shared)
            barrier.wait()
            results[seed] = [state.run(feed)["logits"] for feed in _feeds(seed, steps=24)]
        except Exception as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in seeds]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for seed in seeds:
        for ours, theirs in zip(results[seed], expected[seed]):
            np.testing.assert_array_equal(ours, theirs)


@pytest.mark.clause("STATE-RESET", "ZC-OUTSTANDING")
@pytest.mark.parametrize("variant", qwen.VARIANTS)
def test_reset_restores_the_initial_values(variant):
    feeds = _feeds(5, steps=12)
    initial = qwen.initial_values(CONFIG, variant)
    state = make_state(_executor(variant), initial)
    first = [state.run(feed)["logits"] for feed in feeds]
    held = dict(state.values)
    held_bytes = measure.state_bytes(held)
    state.reset(qwen.initial_values(CONFIG, variant))
    again = [state.run(feed)["logits"] for feed in feeds]
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a, b)
    assert measure.state_bytes(held) == held_bytes  # values held from before the reset are intact


# ----------------------------------------------------------------------------- per-token accounting
@pytest.mark.clause("ZC-RETAIN", "KV-APPEND-INPLACE", "KV-CAPACITY-REUSE")
@pytest.mark.parametrize("variant", qwen.VARIANTS)
def test_per_token_report(variant):
    state = make_state(_executor(variant), qwen.initial_values(CONFIG, variant, capacity=128))
    _, reports = measure.decode(state, _feeds(6), trace_memory=False)
    per_token = CONFIG.layers * 2 * CONFIG.kv_heads * CONFIG.head_dim * 4  # K and V of every layer, float32
    assert len(reports) == DECODE_STEPS + 1
    for report in reports:
        assert report.copied_bytes == 0
        assert report.appended_bytes == per_token * report.new_tokens
        assert report.relocated_bytes == 0
    growth = [b.state_bytes - a.state_bytes for a, b in itertools.pairwise(reports[1:])]
    if variant == "paged":
        # Tokens land in the dense open block; each sealed block is re-encoded once (int8 K, int4 V).
        sealed = [r for r in reports if r.encoded_bytes]
        assert [r.context for r in sealed] == [c for c in range(16, 73, 16)]
        assert reports[-1].state_bytes < reports[-1].context * per_token
    else:
        assert set(growth) == {per_token}
        assert len({r.allocated_bytes for r in reports}) == 1  # one fixed allocation, never reallocated


@pytest.mark.clause("KV-CAPACITY-REUSE", "ZC-NO-INPLACE")
def test_small_capacity_grows_by_relocation_only_at_the_boundary():
    state = make_state(_executor("tensors"), qwen.initial_values(CONFIG, "tensors", capacity=16))
    _, reports = measure.decode(state, _feeds(7, steps=30), trace_memory=False)
    moved = [r.context for r in reports if r.relocated_bytes]
    assert moved == [17, 33]  # the capacity doubles 16 -> 32 -> 64; every other append is in place
    assert all(r.copied_bytes == 0 for r in reports)


def test_report_table_formats():
    state = make_state(_executor("paged"), qwen.initial_values(CONFIG, "paged"))
    _, reports = measure.decode(state, _feeds(8, steps=3))
    table = measure.format_reports(reports, every=1)
    assert len(table.splitlines()) == 5 and all(r.scratch_bytes > 0 for r in reports)

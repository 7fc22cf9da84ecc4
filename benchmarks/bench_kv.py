"""Decode-step latency against context length: contiguous, paged and paged-INT4 caches next to
onnxruntime's Attention with past/present on the same shapes, plus the bytes each append writes.

One decode step = append one token's K/V to the cache, then attend one query over the whole context.
Every runtime continues the same decode from the same context (the caller feeds onnxruntime's present
back as the next past). Ratios are oracle time / onnxruntime time, measured in the same run.

    python benchmarks/bench_kv.py [--contexts 128,256,...,8192] [--steps 16]
"""

from __future__ import annotations

import argparse
import os
import pathlib
import platform
import statistics
import sys
import time
from functools import partial

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from reference_impl.kv import contiguous, paged
from reference_impl.kv.attention import attention
from reference_impl.kv.measure import peak_traced_bytes
from reference_impl.kv.paged_attention import paged_attention
from reference_impl.kv.storage import counting


def _ort_session(threads: int):
    import onnxruntime as ort
    from onnx import TensorProto, helper

    node = helper.make_node("Attention", ["Q", "K", "V", "", "past_key", "past_value"],
                            ["Y", "present_key", "present_value"], is_causal=1)
    names = ["Q", "K", "V", "past_key", "past_value"]
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in names]
    graph = helper.make_graph([node], "decode", inputs,
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, None)
                               for n in ("Y", "present_key", "present_value")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 24)])
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def _median_ms(times: list[float]) -> float:
    return statistics.median(times) * 1e3


def bench_context(context: int, steps: int, args, session, rng) -> dict:
    hq, hkv, d = args.q_heads, args.kv_heads, args.head_size
    past_k = rng.standard_normal((1, hkv, context, d)).astype(np.float32)
    past_v = rng.standard_normal((1, hkv, context, d)).astype(np.float32)
    tokens = [tuple(rng.standard_normal(s).astype(np.float32) for s in ((1, hq, 1, d), (1, hkv, 1, d), (1, hkv, 1, d)))
              for _ in range(steps)]
    row = {"context": context}

    # onnxruntime: functional past/present, the caller feeds present back.
    k_ort, v_ort, times = past_k, past_v, []
    for q, k, v in tokens:
        start = time.perf_counter()
        _, k_ort, v_ort = session.run(None, {"Q": q, "K": k, "V": v, "past_key": k_ort, "past_value": v_ort})
        times.append(time.perf_counter() - start)
    row["ort"] = _median_ms(times)

    # Contiguous cache: fixed-capacity storage, each step writes one token.
    cache_k = contiguous.append(contiguous.empty_cache(1, hkv, d, context + steps), past_k)
    cache_v = contiguous.append(contiguous.empty_cache(1, hkv, d, context + steps), past_v)
    times = []
    with counting() as counters:
        for q, k, v in tokens:
            start = time.perf_counter()
            out = attention(q, k, v, None, cache_k, cache_v, is_causal=1, append=contiguous.append)
            times.append(time.perf_counter() - start)
            cache_k, cache_v = out.present_key, out.present_value
    row["contiguous"] = _median_ms(times)
    row["contiguous_append_B"] = counters.appended_bytes / steps
    row["contiguous_moved_B"] = counters.relocated_bytes / steps

    for name, fmt in (("paged", "dense"), ("paged_int4", "int4")):
        cache = paged.empty(hkv, d, args.block_size).append(past_k[0], past_v[0], fmt, fmt)
        times = []
        with counting() as counters:
            for q, k, v in tokens:
                start = time.perf_counter()
                cache = cache.append(k[0], v[0], fmt, fmt)
                paged_attention(q, cache, is_causal=1)
                times.append(time.perf_counter() - start)
        row[name] = _median_ms(times)
        row[f"{name}_append_B"] = counters.appended_bytes / steps
        row[f"{name}_encoded_B"] = counters.encoded_bytes / steps
        row[f"{name}_cache_B"] = cache.stored_bytes()
        row[f"{name}_peak_B"] = peak_traced_bytes(partial(paged_attention, tokens[0][0], cache, is_causal=1))
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contexts", default="128,256,512,1024,2048,4096,8192")
    parser.add_argument("--steps", type=int, default=64,
                        help="decode steps timed per context (median); 64 seals one paged block")
    parser.add_argument("--q-heads", type=int, default=8)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--head-size", type=int, default=64)
    parser.add_argument("--block-size", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1, help="onnxruntime intra-op threads")
    parser.add_argument("--e2e-steps", type=int, default=64, help="decode steps of the end-to-end report (0: skip)")
    args = parser.parse_args()
    import onnxruntime as ort

    session = _ort_session(args.threads)
    rng = np.random.default_rng(0)
    contexts = [int(c) for c in args.contexts.split(",")]
    print(f"# KV decode step: batch 1, {args.q_heads} query heads, {args.kv_heads} KV heads, head size "
          f"{args.head_size}, paged block {args.block_size} tokens, median of {args.steps} steps")
    print(f"# numpy {np.__version__}, onnxruntime {ort.__version__} ({args.threads} intra-op thread(s)), "
          f"python {platform.python_version()}, {os.cpu_count()} CPUs")
    print(f"{'context':>7} | {'ORT ms':>7} | {'contig ms':>9} {'x ORT':>6} | {'paged ms':>8} {'x ORT':>6} | "
          f"{'pINT4 ms':>8} {'x ORT':>6} || {'append B/tok':>12} {'paged B/tok':>11} {'INT4 enc B/tok':>14} | "
          f"{'paged peak KiB':>14} {'INT4 peak KiB':>13} {'INT4/dense bytes':>16}")
    for context in contexts:
        row = bench_context(context, args.steps, args, session, rng)
        ort_ms = row["ort"]
        print(f"{context:>7} | {ort_ms:>7.3f} | {row['contiguous']:>9.3f} {row['contiguous'] / ort_ms:>6.2f} | "
              f"{row['paged']:>8.3f} {row['paged'] / ort_ms:>6.2f} | {row['paged_int4']:>8.3f} "
              f"{row['paged_int4'] / ort_ms:>6.2f} || {row['contiguous_append_B']:>12.0f} "
              f"{row['paged_append_B']:>11.0f} {row['paged_int4_encoded_B']:>14.0f} | "
              f"{row['paged_peak_B'] / 1024:>14.1f} {row['paged_int4_peak_B'] / 1024:>13.1f} "
              f"{row['paged_int4_cache_B'] / row['paged_cache_B']:>16.3f}")
        assert row["contiguous_moved_B"] == 0, "the contiguous cache relocated during the timed steps"
    print("# append B/tok: bytes the cache writes per new token (K+V); constant in context, never the context.")
    print("# INT4 enc B/tok: quantized block bytes produced by sealing, amortized per token (one block per "
          f"{args.block_size} tokens).")
    print("# peak KiB: tracemalloc peak of one paged attention call (its workspace): bounded by a block.")
    if args.e2e_steps:
        end_to_end(args.e2e_steps)


def end_to_end(steps: int) -> None:
    """Per-token accounting of the Qwen-style fixture decoding through make_state, for each cache variant."""
    from reference_impl.executor import Executor
    from reference_impl.kv import measure, qwen
    from reference_impl.kv.kernels import kv_kernels
    from reference_impl.state import make_state

    config = qwen.QwenConfig()
    rng = np.random.default_rng(1)
    feeds = [{"input_ids": rng.integers(0, config.vocab, (1, 8))}] + \
        [{"input_ids": rng.integers(0, config.vocab, (1, 1))} for _ in range(steps)]
    print(f"\n# End-to-end decode, {config.layers} layers, {config.q_heads}/{config.kv_heads} heads of "
          f"{config.head_dim}, INT4 weights; prompt 8 tokens then {steps} single-token calls through make_state")
    for variant in qwen.VARIANTS:
        state = make_state(Executor(qwen.build(config, variant), kernels=kv_kernels()),
                           qwen.initial_values(config, variant, capacity=128))
        _, reports = measure.decode(state, feeds)
        label = variant if variant != "paged" else \
            f"paged (block {config.block_size}, K {config.key_format}, V {config.value_format})"
        print(f"## {label}")
        print(measure.format_reports(reports, every=16))
        decode_steps = reports[1:]
        print(f"# copied by state management: {sum(r.copied_bytes for r in reports)} B in total; append bytes per "
              f"decode token: {sorted({r.appended_bytes for r in decode_steps})}")


if __name__ == "__main__":
    main()

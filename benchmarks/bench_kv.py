"""Decode-step time against context length: contiguous, paged and paged-INT4 caches next to onnxruntime's
Attention with past/present on the same shapes, the bytes each append writes, the paged workspace, and
the end-to-end decode of the Qwen-style fixture through ``make_state``.

One decode step = append one token's K/V to the cache, then attend one query over the whole context,
each runtime through its real entry point: onnxruntime's session (the caller feeds present back as the
next past), the reference Attention kernel with its in-place cache update (``contiguous.append_kv``), and
``PagedKVCache.append`` + ``paged_attention``. The four runtimes take turns step by step (interleaved, so
a busy machine slows all of them alike) and each step is timed in CPU time of this process
(``time.process_time``; onnxruntime runs one intra-op thread), so other processes on a shared machine do
not count. Ratios are the medians' ratio, oracle / onnxruntime, measured in the same run.

    python benchmarks/bench_kv.py [--contexts 128,1024,4096,8192] [--steps 64] [--e2e-steps 64]
"""

from __future__ import annotations

import os

# One thread everywhere: onnxruntime runs one intra-op thread, so BLAS does too (its worker threads would
# otherwise spin on a shared machine and be charged to this process's CPU time).
for _name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_name, "1")

import argparse  # noqa: E402
import pathlib  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from functools import partial  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from reference_impl.kv import contiguous, paged  # noqa: E402
from reference_impl.kv.attention import attention  # noqa: E402
from reference_impl.kv.measure import peak_traced_bytes  # noqa: E402
from reference_impl.kv.paged_attention import paged_attention  # noqa: E402
from reference_impl.kv.storage import KVCounters, counting  # noqa: E402

#: Targets of the KV performance issue, as ratios against onnxruntime (printed next to the figures).
TARGETS = {"contiguous": {128: 2.0}, "paged": {1024: 2.0, 4096: 2.0, 8192: 2.0},
           "paged_int4": {1024: 3.0, 4096: 3.0, 8192: 3.0}}


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
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


class Runner:
    """One runtime's decode: ``step(q, k, v)`` appends one token and attends; the cache is its state.
    Steps are timed without the KV counters (they cost a little per call); ``count`` runs untimed steps
    with them."""

    def __init__(self, name: str, step):
        self.name, self.step_fn, self.times, self.counters = name, step, [], KVCounters()

    def step(self, q, k, v) -> None:
        start = time.process_time()
        self.step_fn(q, k, v)
        self.times.append(time.process_time() - start)

    def count(self, q, k, v) -> None:
        with counting() as counters:
            self.step_fn(q, k, v)
        self.counters.add(counters)

    @property
    def median_ms(self) -> float:
        return statistics.median(self.times) * 1e3


def bench_context(context: int, steps: int, args, session, rng) -> dict:
    hq, hkv, d = args.q_heads, args.kv_heads, args.head_size
    past_k = rng.standard_normal((1, hkv, context, d)).astype(np.float32)
    past_v = rng.standard_normal((1, hkv, context, d)).astype(np.float32)
    tokens = [tuple(rng.standard_normal(s).astype(np.float32) for s in ((1, hq, 1, d), (1, hkv, 1, d), (1, hkv, 1, d)))
              for _ in range(steps + args.block_size)]  # then a block's worth of counted steps (seals one)

    ort_cache = {"past_key": past_k, "past_value": past_v}

    def ort_step(q, k, v):
        _, ort_cache["past_key"], ort_cache["past_value"] = session.run(None, {"Q": q, "K": k, "V": v, **ort_cache})

    capacity = context + len(tokens)
    contiguous_cache = {"k": contiguous.append(contiguous.empty_cache(1, hkv, d, capacity), past_k),
                        "v": contiguous.append(contiguous.empty_cache(1, hkv, d, capacity), past_v)}

    def contiguous_step(q, k, v):
        out = attention(q, k, v, None, contiguous_cache["k"], contiguous_cache["v"], is_causal=1,
                        append_kv=contiguous.append_kv)
        contiguous_cache["k"], contiguous_cache["v"] = out.present_key, out.present_value

    paged_caches = {fmt: paged.empty(hkv, d, args.block_size).append(past_k[0], past_v[0], fmt, fmt)
                    for fmt in ("dense", "int4")}

    def paged_step(fmt, q, k, v):
        cache = paged_caches[fmt].append(k[0], v[0], fmt, fmt)
        paged_attention(q, cache, is_causal=1)
        paged_caches[fmt] = cache

    runners = [Runner("ort", ort_step), Runner("contiguous", contiguous_step),
               Runner("paged", partial(paged_step, "dense")), Runner("paged_int4", partial(paged_step, "int4"))]
    timed, counted = tokens[:steps], tokens[steps:]
    for index, (q, k, v) in enumerate(timed):
        for offset in range(len(runners)):  # interleaved, in a rotating order
            runners[(index + offset) % len(runners)].step(q, k, v)
    for q, k, v in counted:
        for runner in runners[1:]:
            runner.count(q, k, v)
    row = {"context": context, **{runner.name: runner.median_ms for runner in runners}}
    byname = {runner.name: runner for runner in runners}
    row["contiguous_append_B"] = byname["contiguous"].counters.appended_bytes / len(counted)
    row["contiguous_moved_B"] = byname["contiguous"].counters.relocated_bytes / len(counted)
    for name, fmt in (("paged", "dense"), ("paged_int4", "int4")):
        counters = byname[name].counters
        row[f"{name}_append_B"] = counters.appended_bytes / len(counted)
        row[f"{name}_encoded_B"] = counters.encoded_bytes / len(counted)
        row[f"{name}_workspace_B"] = counters.workspace_peak
        row[f"{name}_cache_B"] = paged_caches[fmt].stored_bytes()
        row[f"{name}_peak_B"] = peak_traced_bytes(partial(paged_attention, tokens[0][0], paged_caches[fmt],
                                                          is_causal=1))
    return row


def _ratio(row: dict, name: str) -> str:
    ratio = row[name] / row["ort"]
    target = TARGETS.get(name, {}).get(row["context"])
    mark = "" if target is None else (" ok" if ratio <= target else " >" + format(target, "g"))
    return f"{ratio:>6.2f}{mark:<4}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--contexts", default="128,1024,4096,8192")
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
          f"{args.head_size}, paged block {args.block_size} tokens, median CPU time of {args.steps} interleaved "
          "steps")
    print(f"# numpy {np.__version__}, onnxruntime {ort.__version__} ({args.threads} intra-op thread(s)), "
          f"python {platform.python_version()}, {os.cpu_count()} CPUs, load average "
          f"{', '.join(f'{x:.1f}' for x in os.getloadavg())}")
    print(f"{'context':>7} | {'ORT ms':>7} | {'contig ms':>9} {'x ORT':>10} | {'paged ms':>8} {'x ORT':>10} | "
          f"{'pINT4 ms':>8} {'x ORT':>10} || {'append B/tok':>12} {'paged B/tok':>11} {'INT4 enc B/tok':>14} | "
          f"{'workspace KiB':>13} {'INT4 wksp KiB':>13} {'peak KiB':>8} {'INT4 peak KiB':>13}")
    for context in contexts:
        row = bench_context(context, args.steps, args, session, rng)
        print(f"{context:>7} | {row['ort']:>7.3f} | {row['contiguous']:>9.3f} {_ratio(row, 'contiguous')} | "
              f"{row['paged']:>8.3f} {_ratio(row, 'paged')} | {row['paged_int4']:>8.3f} {_ratio(row, 'paged_int4')} "
              f"|| {row['contiguous_append_B']:>12.0f} {row['paged_append_B']:>11.0f} "
              f"{row['paged_int4_encoded_B']:>14.0f} | {row['paged_workspace_B'] / 1024:>13.1f} "
              f"{row['paged_int4_workspace_B'] / 1024:>13.1f} {row['paged_peak_B'] / 1024:>8.1f} "
              f"{row['paged_int4_peak_B'] / 1024:>13.1f}")
        assert row["contiguous_moved_B"] == 0, "the contiguous cache relocated during the timed steps"
    print("# x ORT: oracle / onnxruntime; 'ok' or '>N' against the target where there is one.")
    print("# append B/tok: bytes the cache writes per new token (K+V); constant in context, never the context.")
    print("# INT4 enc B/tok: quantized block bytes produced by sealing, amortized per token (one block per "
          f"{args.block_size} tokens); bytes are counted over {args.block_size} further, untimed steps.")
    print("# workspace KiB: the largest scratch one paged attention call reported (KV counters); peak KiB: its "
          "tracemalloc peak. Both bounded by a group of blocks, not the context.")
    if args.e2e_steps:
        end_to_end(args.e2e_steps)


def end_to_end(steps: int) -> None:
    """Tokens per second of the Qwen-style fixture decoding through make_state, for each cache variant, and
    the split of a step between the kernels (the executor's graph run) and state management (the rest of
    ``state.run``: feed checks, binding resolution, retention and publication)."""
    from reference_impl.executor import Executor
    from reference_impl.kv import measure, qwen
    from reference_impl.kv.kernels import kv_kernels
    from reference_impl.state import make_state

    config = qwen.QwenConfig()
    rng = np.random.default_rng(1)
    feeds = [{"input_ids": rng.integers(0, config.vocab, (1, 8))}] + \
        [{"input_ids": rng.integers(0, config.vocab, (1, 1))} for _ in range(steps)]
    print(f"\n# End-to-end decode, {config.layers} layers, {config.q_heads}/{config.kv_heads} heads of "
          f"{config.head_dim}, INT4 weights; prompt 8 tokens then {steps} single-token calls through make_state "
          "(CPU time)")
    print(f"{'variant':<40} {'tokens/s':>9} {'step ms':>8} {'kernel ms':>9} {'state ms':>8} {'state %':>7} "
          f"{'copied B':>8}")
    for variant in qwen.VARIANTS:
        executor = Executor(qwen.build(config, variant), kernels=kv_kernels())
        state = make_state(executor, qwen.initial_values(config, variant, capacity=128))
        kernel = _time_graph(executor)
        totals, kernels = [], []
        copied = state.counters.payload_bytes_copied
        for feed in feeds:
            kernel.clear()
            start = time.process_time()
            state.run(feed)
            totals.append(time.process_time() - start)
            kernels.append(sum(kernel))
        decode_total, decode_kernel = totals[1:], kernels[1:]
        step = statistics.median(decode_total)
        graph = statistics.median(decode_kernel)
        share = statistics.median([(t - g) / t for t, g in zip(decode_total, decode_kernel)])
        label = variant if variant != "paged" else \
            f"paged (block {config.block_size}, K {config.key_format}, V {config.value_format})"
        print(f"{label:<40} {1 / step:>9.1f} {step * 1e3:>8.2f} {graph * 1e3:>9.2f} {(step - graph) * 1e3:>8.3f} "
              f"{share * 100:>6.2f}% {state.counters.payload_bytes_copied - copied:>8}")
    print("# state %: median share of a decode step outside the graph run (target: under 5%); copied B: payload "
          "bytes state management copied (must be 0).")
    config_state = make_state(Executor(qwen.build(config, "tensors"), kernels=kv_kernels()),
                              qwen.initial_values(config, "tensors", capacity=128))
    _, reports = measure.decode(config_state, feeds[:17])
    print("\n## per-token accounting (tensors variant)")
    print(measure.format_reports(reports, every=8))


def _time_graph(executor) -> list[float]:
    """Wrap the executor's graph run so each call adds its CPU time to the returned list."""
    spent: list[float] = []
    run = executor._root.run

    def timed(*args, **kwargs):
        start = time.process_time()
        try:
            return run(*args, **kwargs)
        finally:
            spent.append(time.process_time() - start)

    executor._root.run = timed
    return spent


if __name__ == "__main__":
    main()

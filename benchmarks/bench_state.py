"""Overhead of ``State.run`` over a bare executor call on the same decode-sized model, in one run.

Both sides do the same work per step: one new token against a KV cache of ``--past`` tokens that grows
by Concat. The bare side is the spec's manual loop (feeds + previous outputs -> ``Executor.run``); the
state side is ``State.run``. Rounds are interleaved and each starts from the same initial cache, so
the ratio isolates state management; process CPU time with single-threaded kernels keeps other load on
the machine out of the figures. Target: ratio <= 1.05. Prints the state's copy counters too.

    python benchmarks/bench_state.py [--past 1024] [--hidden 512] [--vocab 8192] [--steps 64] [--rounds 15]
"""

from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import sys
import time

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")  # single-threaded kernels: CPU time then measures one thread's work

import numpy as np  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from onnx import TensorProto as T  # noqa: E402
from onnx import helper, numpy_helper  # noqa: E402

from reference_impl import schema  # noqa: E402
from reference_impl.executor import Executor  # noqa: E402
from reference_impl.state import make_state  # noqa: E402


def decode_model(hidden: int, vocab: int):
    """tokens + past_key/past_value -> logits, present_key/present_value (both bound)."""
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("Gather", ["E", "tokens"], ["emb"]),
        helper.make_node("MatMul", ["emb", "Wk"], ["k"]),
        helper.make_node("MatMul", ["emb", "Wv"], ["v"]),
        helper.make_node("Concat", ["past_key", "k"], ["present_key"], axis=1),
        helper.make_node("Concat", ["past_value", "v"], ["present_value"], axis=1),
        helper.make_node("Transpose", ["present_key"], ["present_key_t"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["emb", "present_key_t"], ["scores"]),
        helper.make_node("Softmax", ["scores"], ["weights"], axis=-1),
        helper.make_node("MatMul", ["weights", "present_value"], ["context"]),
        helper.make_node("MatMul", ["context", "Wo"], ["logits"]),
    ]
    weights = {"E": (vocab, hidden), "Wk": (hidden, hidden), "Wv": (hidden, hidden), "Wo": (hidden, vocab)}
    graph = helper.make_graph(
        nodes, "decode",
        [helper.make_tensor_value_info("tokens", T.INT64, [1, 1]),
         helper.make_tensor_value_info("past_key", T.FLOAT, [1, "past", hidden]),
         helper.make_tensor_value_info("past_value", T.FLOAT, [1, "past", hidden])],
        [helper.make_tensor_value_info("logits", T.FLOAT, [1, 1, vocab]),
         helper.make_tensor_value_info("present_key", T.FLOAT, [1, "total", hidden]),
         helper.make_tensor_value_info("present_value", T.FLOAT, [1, "total", hidden])],
        [numpy_helper.from_array((rng.standard_normal(s) * 0.05).astype(np.float32), n)
         for n, s in weights.items()])
    model = schema.from_onnx(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]))
    for name in ("key", "value"):
        model.graph.persistent_bindings.add(input_name=f"past_{name}", output_name=f"present_{name}")
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--past", type=int, default=1024)
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()

    executor = Executor(decode_model(args.hidden, args.vocab))
    rng = np.random.default_rng(1)
    initial = {f"past_{n}": rng.standard_normal((1, args.past, args.hidden)).astype(np.float32)
               for n in ("key", "value")}
    token_ids = [np.array([[int(t)]], np.int64) for t in rng.integers(0, args.vocab, args.steps)]
    state = make_state(executor, initial)

    def bare_round() -> float:
        values = dict(initial)
        start = time.process_time()
        for tokens in token_ids:
            outputs = executor.run({"tokens": tokens, **values})
            values = {"past_key": outputs["present_key"], "past_value": outputs["present_value"]}
        return time.process_time() - start

    def state_round() -> float:
        state.reset(initial)
        start = time.process_time()
        for tokens in token_ids:
            state.run({"tokens": tokens})
        return time.process_time() - start

    bare_round(), state_round()  # warm-up
    bare, stateful = [], []
    for index in range(args.rounds):  # interleaved, alternating which side goes first
        pair = (bare_round, state_round) if index % 2 == 0 else (state_round, bare_round)
        for run in pair:
            (bare if run is bare_round else stateful).append(run())
    counters = state.counters.snapshot()
    print(f"model: hidden={args.hidden} vocab={args.vocab} past={args.past} steps/round={args.steps} "
          f"rounds={args.rounds}")
    for label, pick in (("best round", min), ("median round", statistics.median)):
        bare_step, state_step = pick(bare) / args.steps, pick(stateful) / args.steps
        print(f"[{label}] bare Executor.run {bare_step * 1e6:8.1f} us/step | "
              f"State.run {state_step * 1e6:8.1f} us/step | "
              f"overhead {(state_step - bare_step) * 1e6:6.1f} us | "
              f"ratio {state_step / bare_step:.3f} (target <= 1.05)")
    print("copy counters     : " + ", ".join(f"{k}={v}" for k, v in counters.items()))


if __name__ == "__main__":
    main()

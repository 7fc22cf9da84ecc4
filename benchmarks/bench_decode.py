"""Decode throughput of a blocked INT4 value vs onnxruntime's DequantizeLinear, in one run.

Prints our throughput as a ratio of onnxruntime's on the same codes and parameters (target >= 0.5x) and
the peak extra memory of our decode as a multiple of the output size (target <= 1.5x), measured with
tracemalloc (NumPy reports its buffers to it).

    python benchmarks/bench_decode.py [--elements 67108864] [--block 32] [--repeat 3]
"""

from __future__ import annotations

import argparse
import time
import tracemalloc

import numpy as np
from onnx import helper

from reference_impl import affine, dtypes, schema
from reference_impl.decode import decode_value
from reference_impl.structs import Catalogue


def build_value(rows: int, cols: int, block: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    codes = rng.integers(0, 256, size=rows * cols // 2, dtype=np.uint8).tobytes()
    scale = (rng.random((rows, -(-cols // block))) + 0.01).astype(np.float32)
    zero_point = rng.integers(-8, 8, size=scale.shape)
    value = affine.make_affine_value(np.zeros((1, 1), np.float32), dtypes.INT4, np.float32(1), name="w")
    value.raw_data = codes
    layout = value.affine
    layout.axis = 1
    layout.block_size = block
    layout.scale.CopyFrom(schema.TensorProto(data_type=dtypes.FLOAT, dims=list(scale.shape), raw_data=scale.tobytes()))
    layout.zero_point.CopyFrom(schema.TensorProto(data_type=dtypes.INT4, dims=list(scale.shape),
                                                  raw_data=affine.pack_sub_byte(zero_point, 4)))
    dims = value.logical_type.tensor_type.shape.dim
    dims[0].dim_value, dims[1].dim_value = rows, cols
    return value, codes, scale, zero_point


def ort_session(rows, cols, block, codes, scale, zero_point):
    import onnxruntime as ort

    x = helper.make_tensor("x", dtypes.INT4, [rows, cols], codes, raw=True)
    s = helper.make_tensor("s", dtypes.FLOAT, list(scale.shape), scale.tobytes(), raw=True)
    z = helper.make_tensor("z", dtypes.INT4, list(scale.shape), affine.pack_sub_byte(zero_point, 4), raw=True)
    node = helper.make_node("DequantizeLinear", ["x", "s", "z"], ["y"], axis=1, block_size=block)
    graph = helper.make_graph([node], "dq", [], [helper.make_tensor_value_info("y", dtypes.FLOAT, [rows, cols])],
                              initializer=[x, s, z])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def best_of(repeat: int, fn) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--elements", type=int, default=64 * 2**20)
    parser.add_argument("--block", type=int, default=32)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    cols = 8192
    rows = args.elements // cols
    value, codes, scale, zero_point = build_value(rows, cols, args.block)
    catalogue = Catalogue([])
    session = ort_session(rows, cols, args.block, codes, scale, zero_point)

    ours = decode_value(value, catalogue)
    theirs = session.run(None, {})[0]
    assert np.array_equal(ours, theirs), "decoded values differ from onnxruntime"
    del ours, theirs

    t_ours = best_of(args.repeat, lambda: decode_value(value, catalogue))
    t_ort = best_of(args.repeat, lambda: session.run(None, {}))
    output_bytes = rows * cols * 4
    tracemalloc.start()
    result = decode_value(value, catalogue)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    del result
    gelems = rows * cols / 1e9
    print(f"blocked INT4 [{rows} x {cols}] block {args.block}: {rows * cols:,} elements, "
          f"output {output_bytes / 2**20:.0f} MiB (values identical to onnxruntime)")
    print(f"  reference_impl decode : {t_ours * 1e3:8.1f} ms  {gelems / t_ours:6.2f} Gelem/s")
    print(f"  onnxruntime DQ        : {t_ort * 1e3:8.1f} ms  {gelems / t_ort:6.2f} Gelem/s "
          f"(intra-op threads: default)")
    print(f"  throughput ratio (ours / onnxruntime): {t_ort / t_ours:.2f}x   (target >= 0.5x)")
    print(f"  peak traced memory during decode: {peak / 2**20:.0f} MiB = {peak / output_bytes:.2f}x output "
          f"(target <= 1.5x)")


if __name__ == "__main__":
    main()

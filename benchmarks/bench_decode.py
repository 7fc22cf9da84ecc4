"""Decode throughput of a blocked INT4 value vs onnxruntime's DequantizeLinear, in one run.

Prints, as medians of interleaved rounds (with the spread of the per-round ratios):

* our throughput as a ratio of onnxruntime's (default intra-op threads) on the same codes and
  parameters (target >= 1.0x), values checked bit-identical first;
* the peak extra memory of our decode as a multiple of the output size (target <= 1.3x), measured with
  tracemalloc (NumPy reports its buffers to it);
* decoding into a caller's buffer reused across calls (``decode_value(..., out=buffer)``) as a multiple
  of the time a warm copy of the same number of output bytes takes (target <= 2.0x): first-touching a
  fresh output costs page faults that a reused buffer does not, so the warm copy is the limit. Measured
  for the payload in an external file (mapped, so no payload bytes are copied: the decode alone) and
  inline in the message, where every call also pays protobuf's copy of ``raw_data`` out of the message
  (the Python runtime has no zero-copy access to a bytes field), printed on its own line.

    python benchmarks/bench_decode.py [--elements 67108864] [--block 32] [--rounds 7]
"""

from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import sys
import tempfile
import time
import tracemalloc

import numpy as np
from onnx import helper

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from reference_impl import affine, dtypes, schema  # noqa: E402
from reference_impl.decode import decode_value  # noqa: E402
from reference_impl.structs import Catalogue  # noqa: E402

TARGETS = {"throughput": 1.0, "memory": 1.3, "reused": 2.0}


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


def external_copy(value, codes: bytes, directory: str):
    """The same value with its payload in ``directory``/w.bin (mapped when decoded)."""
    pathlib.Path(directory, "w.bin").write_bytes(codes)
    external = type(value)()
    external.CopyFrom(value)
    external.ClearField("raw_data")
    external.data_location = schema.TensorProto.EXTERNAL
    for key, text in (("location", "w.bin"), ("length", str(len(codes)))):
        external.external_data.add(key=key, value=text)
    return external


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


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def peak_traced(fn) -> int:
    tracemalloc.start()
    try:
        result = fn()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    del result
    return peak


def spread(values: list[float]) -> str:
    return f"median {statistics.median(values):.2f}x, range {min(values):.2f}-{max(values):.2f}x"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--elements", type=int, default=64 * 2**20)
    parser.add_argument("--block", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    cols = 8192
    rows = args.elements // cols
    value, codes, scale, zero_point = build_value(rows, cols, args.block)
    catalogue = Catalogue([])
    session = ort_session(rows, cols, args.block, codes, scale, zero_point)

    ours = decode_value(value, catalogue)
    theirs = session.run(None, {})[0]
    assert ours.tobytes() == theirs.tobytes(), "decoded values differ from onnxruntime"
    buffer = np.empty_like(ours)
    assert decode_value(value, catalogue, out=buffer) is buffer and buffer.tobytes() == theirs.tobytes()
    directory = tempfile.mkdtemp(prefix="bench-decode-")
    external = external_copy(value, codes, directory)
    assert decode_value(external, catalogue, directory, out=buffer) is buffer
    assert buffer.tobytes() == theirs.tobytes()
    source = theirs
    del ours

    samples: dict[str, list[float]] = {name: [] for name in ("fresh", "ort", "reused", "external", "raw", "copy")}
    for index in range(args.rounds):  # interleaved, rotating which side goes first
        sides = [("fresh", lambda: decode_value(value, catalogue)), ("ort", lambda: session.run(None, {})),
                 ("reused", lambda: decode_value(value, catalogue, out=buffer)),
                 ("external", lambda: decode_value(external, catalogue, directory, out=buffer)),
                 ("raw", lambda: value.raw_data), ("copy", lambda: np.copyto(buffer, source))]
        sides = sides[index % len(sides):] + sides[:index % len(sides)]
        for name, fn in sides:
            samples[name].append(timed(fn))
    fresh, ort, reused, copy = samples["fresh"], samples["ort"], samples["reused"], samples["copy"]
    external_times, raw = samples["external"], samples["raw"]
    output_bytes = rows * cols * 4
    peak_fresh = peak_traced(lambda: decode_value(value, catalogue))
    peak_reused = peak_traced(lambda: decode_value(value, catalogue, out=buffer))
    gelems = rows * cols / 1e9
    med = statistics.median
    print(f"blocked INT4 [{rows} x {cols}] block {args.block}: {rows * cols:,} elements, output "
          f"{output_bytes / 2**20:.0f} MiB (values identical to onnxruntime); medians of {args.rounds} interleaved "
          f"rounds; load average {', '.join(f'{x:.1f}' for x in os.getloadavg())}, {os.cpu_count()} CPUs, "
          f"{affine._workers()} decode threads")
    print(f"  reference_impl decode         : {med(fresh) * 1e3:8.1f} ms  {gelems / med(fresh):6.2f} Gelem/s")
    print(f"  onnxruntime DQ (default thr.) : {med(ort) * 1e3:8.1f} ms  {gelems / med(ort):6.2f} Gelem/s")
    print(f"  into a reused buffer, external: {med(external_times) * 1e3:8.1f} ms  "
          f"{gelems / med(external_times):6.2f} Gelem/s")
    print(f"  into a reused buffer, inline  : {med(reused) * 1e3:8.1f} ms  {gelems / med(reused):6.2f} Gelem/s")
    print(f"    of which raw_data read out of the message: {med(raw) * 1e3:.1f} ms")
    print(f"  warm copy of the output bytes : {med(copy) * 1e3:8.1f} ms")
    print(f"  throughput ratio (ours / onnxruntime): {med(ort) / med(fresh):.2f}x   (target >= "
          f"{TARGETS['throughput']}x; per round {spread([o / f for o, f in zip(ort, fresh)])})")
    print(f"  reused-buffer decode / warm copy:      {med(external_times) / med(copy):.2f}x   (target <= "
          f"{TARGETS['reused']}x; external payload; per round "
          f"{spread([r / c for r, c in zip(external_times, copy)])})")
    print(f"  the same, inline payload:              {med(reused) / med(copy):.2f}x   (protobuf's copy of "
          f"raw_data included; per round {spread([r / c for r, c in zip(reused, copy)])})")
    print(f"  peak traced memory during decode: {peak_fresh / 2**20:.0f} MiB = {peak_fresh / output_bytes:.2f}x output "
          f"(target <= {TARGETS['memory']}x); into a reused buffer: {peak_reused / 2**20:.0f} MiB = "
          f"{peak_reused / output_bytes:.2f}x")


if __name__ == "__main__":
    main()

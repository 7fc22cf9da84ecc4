"""Wall time of the full conformance run on the reference adapter: in process (1 and 2 workers) and
through the reference testee, with the onnx reference evaluator's run as the peer in the same process.

    python benchmarks/bench_conformance.py

The acceptance target is a full reference run under 60 s on a 2-core machine; figures are printed,
never asserted.
"""

from __future__ import annotations

import pathlib
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from conformance.cases import load_cases
from conformance.runner import RunConfig, run, summary_line


def timed(label: str, config: RunConfig, cases) -> float:
    start = time.perf_counter()
    results, _ = run(cases, config)
    elapsed = time.perf_counter() - start
    print(f"{label:42s} {elapsed:7.2f} s   {summary_line(results)}")
    return elapsed


def main() -> int:
    start = time.perf_counter()
    cases = list(load_cases())
    for case in cases:
        case.build()
    print(f"{len(cases)} cases loaded and built in {time.perf_counter() - start:.2f} s")
    base = timed("reference, in process, 1 worker", RunConfig(progress=False), cases)
    timed("reference, in process, 2 workers", RunConfig(progress=False, jobs=2), cases)
    testee = timed("reference through the testee", RunConfig(progress=False,
                                                              testee=f"{sys.executable} -m conformance.testee"), cases)
    peer = timed("onnx-reference adapter (peer)", RunConfig(progress=False, adapter="onnx-reference"), cases)
    ort = timed("onnxruntime adapter (peer)", RunConfig(progress=False, adapter="onnxruntime"), cases)
    print(f"testee / in-process: {testee / base:.2f}x; onnx-reference / reference: {peer / base:.2f}x; "
          f"onnxruntime / reference: {ort / base:.2f}x; budget 60 s, reference uses {base / 60:.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Per-call cost observed from outside the runtime: bytes allocated around a call (conformance/measured.py,
in process only) and the addresses of the buffers a state hands out. A state whose calls serialize or
scan the model, or copy a retained payload, allocates in proportion to the model or the payload, however
its own counters and buffer ids read.

Models: a 4 MiB FLOAT ``ballast`` initializer no node reads beside s <- s (the bound output is the graph
input itself, so no kernel touches the retained value); or a 4 MiB retained FLOAT[n] state s <- s. A
sound call allocates a few kilobytes; the bound is an eighth of the 4 MiB.
"""

from __future__ import annotations

import numpy as np

from reference_impl import schema

from . import builder

#: elements of the large value (FLOAT: 4 MiB)
LARGE = 1 << 20
#: a call may allocate at most this much: an eighth of the large value
BOUND = LARGE * 4 // 8


def _model(ballast: int):
    text = ('ir_version: 13\nopset_import { domain: "" version: 23 }\ngraph {\n  name: "cost"\n'
            '  node { op_type: "Add" input: "x" input: "one" output: "y" }\n'
            '  initializer { name: "one" data_type: 1 dims: 2 float_data: [1, 1] }\n'
            + (f'  initializer {{ name: "ballast" data_type: 1 dims: {ballast} }}\n' if ballast else "")
            + '  input { name: "s" type { tensor_type { elem_type: 1 shape { dim { dim_param: "n" } } } } }\n'
              '  input { name: "x" type { tensor_type { elem_type: 1 shape { dim { dim_value: 2 } } } } }\n'
              '  output { name: "s" type { tensor_type { elem_type: 1 shape { dim { dim_param: "n" } } } } }\n'
              '  output { name: "y" type { tensor_type { elem_type: 1 shape { dim { dim_value: 2 } } } } }\n'
              '  persistent_bindings { input_name: "s" output_name: "s" }\n}\n')
    model = schema.parse_text(text, "ModelProto")
    for tensor in model.graph.initializer:
        if tensor.name == "ballast":
            tensor.raw_data = np.full(ballast, 0.5, np.float32).tobytes()
    return model


def _large(start: float) -> dict:
    return {"dtype": "float32", "shape": [LARGE], "range": [start, 1.0]}


@builder
def run_cost_large_model():
    """s <- s over a small s = [1, 2], beside a 4 MiB initializer no node reads; y = x + 1. Three runs
    (y = [2, 3]) each allocate at most 512 KiB: a call that serializes, clones or hashes the model
    allocates its 4 MiB."""
    small = {"dtype": "float32", "shape": [2], "data": [1.0, 2.0]}
    x = {"dtype": "float32", "shape": [2], "data": [1.0, 2.0]}
    steps = [{"op": "open", "initial": {"s": small}},
             {"op": "allocations", "at_most": BOUND, "count": 3,
              "call": {"op": "run", "feeds": {"x": x}, "outputs": {"y": {"dtype": "float32", "shape": [2],
                                                                          "data": [2.0, 3.0]}, "s": small}}}]
    return {"model": _model(LARGE), "steps": steps}


@builder
def retained_payload_cost(entry: str):
    """s <- s retains a 4 MiB FLOAT[n] caller buffer (0, 1, 2, ...). ``Run``: three runs; ``Reset``: a
    reset to another 4 MiB buffer (5, 6, 7, ...); ``Values``: three values() calls. Each call allocates at
    most 512 KiB: retaining, forwarding or handing out the buffer copies none of it."""
    x = {"dtype": "float32", "shape": [2], "data": [1.0, 2.0]}
    steps = [{"op": "open", "as": "init", "initial": {"s": _large(0.0)}}]
    if entry == "Run":
        steps.append({"op": "allocations", "at_most": BOUND, "count": 3,
                      "call": {"op": "run", "feeds": {"x": x}, "outputs": {"s": _large(0.0)}}})
    elif entry == "Reset":
        steps += [{"op": "run", "feeds": {"x": x}},
                  {"op": "allocations", "at_most": BOUND, "call": {"op": "reset", "initial": {"s": _large(5.0)}}},
                  {"op": "run", "feeds": {"x": x}, "outputs": {"s": _large(5.0)}}]
    else:
        steps.append({"op": "allocations", "at_most": BOUND, "count": 3,
                      "call": {"op": "values", "values": {"s": _large(0.0)}}})
    return {"model": _model(0), "steps": steps}


@builder
def retained_addresses():
    """s <- s retains a 4 MiB caller buffer: the initial value, both runs' outputs s and values() all lie at
    the caller buffer's data address (observed on the arrays handed out, not asked of the runtime)."""
    x = {"dtype": "float32", "shape": [2], "data": [1.0, 2.0]}
    steps = [{"op": "open", "as": "init", "initial": {"s": _large(0.0)}},
             {"op": "run", "as": "r1", "feeds": {"x": x}},
             {"op": "run", "as": "r2", "feeds": {"x": x}},
             {"op": "values", "as": "v"},
             {"op": "addresses", "same": [["init|s", "r1|s", "r2|s", "v|s"]]}]
    return {"model": _model(0), "steps": steps}

"""One offending item at the first, a middle or the last position among three: bindings of a graph, the
initial or reset values they ask for, the outputs a call publishes, and blocks of a paged KV cache. A
runtime that checks only the first (or only the last) item passes two positions and fails the third.

Models: three bound inputs s0, s1, s2 (FLOAT[2]) with s<i>_next = s<i> + x; the offending binding,
value, output or block is at ``where`` (0, 1 or 2). Expected values are hand arithmetic.
"""

from __future__ import annotations

import numpy as np

from reference_impl import schema

from . import builder
from .kv import _literal
from .kv_formats import encode
from .kv_paged import block_literal, cache_literal, paged_model

NAMES = ("s0", "s1", "s2")
#: a case name's position word -> the index of the offending item
POSITIONS = {"First": 0, "Middle": 1, "Last": 2}
_FLOAT2 = 'type { tensor_type { elem_type: 1 shape { dim { dim_value: 2 } } } }'


def _tensor(values, dtype: str = "float32") -> dict:
    return {"dtype": dtype, "shape": [len(values)], "data": list(values)}


def _model(position: int, fault: str):
    """The three-binding model with ``fault`` at ``where`` (``none``: every binding is sound)."""
    nodes, inputs, outputs, bindings = [], [f'input {{ name: "x" {_FLOAT2} }}'], [], []
    for index, name in enumerate(NAMES):
        here = index == position
        out = f"{name}_next"
        if here and fault == "element_type":  # the bound output is INT64[2]
            nodes.append(f'node {{ op_type: "Add" input: "{name}" input: "x" output: "{name}_sum" }}')
            nodes.append(f'node {{ op_type: "Cast" input: "{name}_sum" output: "{out}" '
                         'attribute { name: "to" type: INT i: 7 } }')
            out_type = 'type { tensor_type { elem_type: 7 shape { dim { dim_value: 2 } } } }'
        elif here and fault == "dimension":  # the bound output is FLOAT[4]
            nodes.append(f'node {{ op_type: "Concat" input: "{name}" input: "x" output: "{out}" '
                         'attribute { name: "axis" type: INT i: 0 } }')
            out_type = 'type { tensor_type { elem_type: 1 shape { dim { dim_value: 4 } } } }'
        elif here and fault == "grows":  # declared FLOAT[2], but extra (FLOAT[m]) is appended to it
            nodes.append(f'node {{ op_type: "Add" input: "{name}" input: "x" output: "{name}_sum" }}')
            nodes.append(f'node {{ op_type: "Concat" input: "{name}_sum" input: "extra" output: "{out}" '
                         'attribute { name: "axis" type: INT i: 0 } }')
            inputs.append('input { name: "extra" type { tensor_type { elem_type: 1 shape { dim { dim_param: "m" } } '
                          '} } }')
            out_type = _FLOAT2
        else:
            nodes.append(f'node {{ op_type: "Add" input: "{name}" input: "x" output: "{out}" }}')
            out_type = _FLOAT2
        if here and fault == "string":  # the binding selects a string input and output
            inputs.append(f'input {{ name: "{name}" type {{ tensor_type {{ elem_type: 8 '
                          'shape { dim { dim_value: 2 } } } } }')
            nodes[-1] = f'node {{ op_type: "Identity" input: "{name}" output: "{out}" }}'
            out_type = 'type { tensor_type { elem_type: 8 shape { dim { dim_value: 2 } } } }'
        else:
            inputs.append(f'input {{ name: "{name}" {_FLOAT2} }}')
        outputs.append(f'output {{ name: "{out}" {out_type} }}')
        target = "nope" if here and fault == "unknown_output" else out
        bindings.append(f'persistent_bindings {{ input_name: "{name}" output_name: "{target}" }}')
        if here and fault == "duplicate_output":  # this binding's output is selected by the one before
            bindings[-1] = f'persistent_bindings {{ input_name: "{name}" output_name: "{NAMES[index - 1]}_next" }}'
    text = ('ir_version: 13\nopset_import { domain: "" version: 23 }\ngraph {\n  name: "positions"\n  '
            + "\n  ".join(nodes + inputs + outputs + bindings) + "\n}\n")
    return schema.parse_text(text, "ModelProto")


def _initial(position: int | None = None, fault: str = "none") -> dict:
    initial = {}
    for index, name in enumerate(NAMES):
        if index == position and fault == "string":
            initial[name] = {"dtype": "str", "shape": [2], "data": ["a", "b"]}
        elif index == position and fault == "missing":
            continue
        elif index == position and fault == "shape":
            initial[name] = _tensor([0.0, 0.0, 0.0])
        elif index == position and fault == "dtype":
            initial[name] = _tensor([0, 0], "int64")
        elif index == position and fault == "ownerless":
            initial[name] = {**_tensor([0.0, 0.0]), "ownerless": True}
        else:
            initial[name] = _tensor([float(index), float(index)])
    return initial


#: declaration fault -> (code, codes equally justified)
DECLARATION = {"unknown_output": ("BINDING_NAME_UNKNOWN", []), "element_type": ("BINDING_INCOMPATIBLE", []),
               "dimension": ("BINDING_INCOMPATIBLE", []), "string": ("BINDING_STRING", []),
               "duplicate_output": ("BINDING_OUTPUT_DUPLICATE", [])}
#: value fault -> (code, codes equally justified)
VALUES = {"missing": ("STATE_INITIAL_MISSING", []), "shape": ("STATE_VALUE_INCOMPATIBLE", []),
          "dtype": ("STATE_VALUE_INCOMPATIBLE", []), "ownerless": ("OWNERLESS_BORROW", ["STATE_UNRETAINABLE"])}


@builder
def binding_position(fault: str, where: str):
    """A graph whose binding at ``where`` breaks one rule (the others are sound): opening fails."""
    position = POSITIONS[where]
    code, also = DECLARATION[fault]
    if fault == "duplicate_output" and position == 0:
        raise ValueError("a duplicate needs an earlier binding")
    initial = _initial(position, "string" if fault == "string" else "none")
    return {"model": _model(position, fault), "steps": [{"op": "open", "initial": initial, "error": code,
                                                          "also": also}]}


@builder
def state_value_position(fault: str, where: str, entry: str):
    """The initial values of ``open`` (``entry`` Initial) or of a ``reset`` (Reset) are sound but for the
    one at ``where``: the call fails, and a failed reset leaves every retained value as it was."""
    position = POSITIONS[where]
    code, also = VALUES[fault]
    bad = _initial(position, fault)
    if entry == "Initial":
        return {"model": _model(-1, "none"), "steps": [{"op": "open", "initial": bad, "error": code, "also": also}]}
    kept = {name: _tensor([index + 1.0, index + 1.0]) for index, name in enumerate(NAMES)}
    steps = [{"op": "open", "initial": _initial()},
             {"op": "run", "as": "r1", "feeds": {"x": _tensor([1.0, 1.0])},
              "outputs": {f"{name}_next": kept[name] for name in NAMES}},
             {"op": "reset", "initial": bad, "error": code, "also": also},
             {"op": "values", "as": "v", "values": kept},
             {"op": "identity", "same": [[f"r1|{name}_next", f"v|{name}"] for name in NAMES]}]
    return {"model": _model(-1, "none"), "steps": steps}


@builder
def output_position(where: str):
    """A call whose bound output at ``where`` grows past its declared FLOAT[2] (execution succeeds):
    nothing is published, the three retained values stay the previous call's, and decoding goes on."""
    position = POSITIONS[where]
    first = {name: _tensor([index + 1.0, index + 1.0]) for index, name in enumerate(NAMES)}
    second = {name: _tensor([index + 3.0, index + 3.0]) for index, name in enumerate(NAMES)}
    empty = {"dtype": "float32", "shape": [0], "data": []}
    steps = [{"op": "open", "initial": _initial()},
             {"op": "run", "as": "r1", "feeds": {"x": _tensor([1.0, 1.0]), "extra": empty},
              "outputs": {f"{name}_next": first[name] for name in NAMES}},
             {"op": "run", "feeds": {"x": _tensor([1.0, 1.0]), "extra": _tensor([9.0])},
              "error": "STATE_VALUE_INCOMPATIBLE", "also": ["STATE_RUN_FAILED"]},
             {"op": "values", "as": "v", "values": first},
             {"op": "identity", "same": [[f"r1|{name}_next", f"v|{name}"] for name in NAMES]},
             {"op": "run", "feeds": {"x": _tensor([2.0, 2.0]), "extra": empty},
              "outputs": {f"{name}_next": second[name] for name in NAMES}}]
    return {"model": _model(position, "grows"), "steps": steps}


@builder
def paged_block_position(fault: str, where: str, code: str, also: list | None = None, heads: int = 2,
                         head_size: int = 4, block_size: int = 4, seed: int = 211):
    """A caller's paged cache of three full 4-token blocks whose block at ``where`` no consumer can
    attend over (``wrong_heads``: a key block of 3 heads beside 2-head values and queries;
    ``dense_not_float``: a FLOAT16 dense key block; ``affine_payload_short``: an INT8 key block one code
    short; ``valid_beyond_slots``: valid_length 5 in 4 slots). The state is refused when it opens or at the
    first run, and the caller's blocks stay retained (every block's key buffer)."""
    position = POSITIONS[where]
    rng = np.random.default_rng(seed)
    blocks, start = [], 0
    for index in range(3):
        here = index == position
        key_heads = 3 if here and fault == "wrong_heads" else heads
        key_format = "int8" if here and fault == "affine_payload_short" else "dense"
        key, _ = encode(rng.standard_normal((block_size, key_heads, head_size)).astype(np.float32), key_format)
        value, _ = encode(rng.standard_normal((block_size, heads, head_size)).astype(np.float32), "dense")
        if here and fault == "affine_payload_short":
            key.raw_data = key.raw_data[:-1]
        if here and fault == "dense_not_float":
            key = key.astype(np.float16)
        valid = 5 if here and fault == "valid_beyond_slots" else block_size
        blocks.append(block_literal(start, valid, key, value))
        start += valid
    q, k, v = (rng.standard_normal((1, heads, 1, head_size)).astype(np.float32) for _ in range(3))
    causes = [code, *(also or [])]
    steps = [{"op": "open", "as": "init", "initial": {"cache": cache_literal(blocks, start)}, "error": code,
              "also": causes[1:], "optional": True},
             {"op": "run", "feeds": {"q": _literal(q), "k": _literal(k), "v": _literal(v)},
              "error": "STATE_RUN_FAILED", "also": ["EXECUTION_FAILED"], "cause": causes},
             {"op": "values", "as": "after", "names": ["cache"]},
             {"op": "identity", "same": [[f"init|cache|blocks|{i}|key", f"after|cache|blocks|{i}|key"]
                                         for i in range(3)]}]
    return {"model": paged_model(heads, head_size, block_size), "steps": steps}

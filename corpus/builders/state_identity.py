"""A call that differs from an accepted one in exactly one part — one dimension, one element type, one
element, one per-value parameter, one binding — must be judged afresh: across the calls of one state,
across ``reset``, and across two states of one model. A runtime that keys what it caches (validated
metadata, a lowered or compiled model, decoded values, folded initial contents) on less than everything
the result depends on answers the second call from the first.

Expected values are hand arithmetic, written in the docstrings.
"""

from __future__ import annotations

from reference_impl import schema

from . import builder

_HEAD = 'ir_version: 13\nopset_import { domain: "" version: 23 }\n'


def _float(*dims: int | str) -> str:
    shape = " ".join(f'dim {{ dim_param: "{d}" }}' if isinstance(d, str) else f"dim {{ dim_value: {d} }}"
                     for d in dims)
    return f"type {{ tensor_type {{ elem_type: 1 shape {{ {shape} }} }} }}"


def _tensor(values, dtype: str = "float32", shape: list[int] | None = None) -> dict:
    return {"dtype": dtype, "shape": shape if shape is not None else [len(values)], "data": list(values)}


def _parse(body: str, head: str = _HEAD):
    return schema.parse_text(head + "graph {\n  name: \"identity\"\n  " + body + "\n}\n", "ModelProto")


#: s <- s_next, where the bound output s_next is the fed graph input s_next itself: a fed value is the very
#: value the state retains, so only a check of the feed or of the value to retain keeps a wrong one out.
THROUGH = (f'input {{ name: "s" {_float(2)} }}\n  input {{ name: "s_next" {_float(2)} }}\n  '
           f'output {{ name: "s_next" {_float(2)} }}\n  '
           'persistent_bindings { input_name: "s" output_name: "s_next" }')
#: past <- present = past + x (FLOAT[2] each).
ACC = ('node { op_type: "Add" input: "past" input: "x" output: "present" }\n  '
       f'input {{ name: "past" {_float(2)} }}\n  input {{ name: "x" {_float(2)} }}\n  '
       f'output {{ name: "present" {_float(2)} }}\n  '
       'persistent_bindings { input_name: "past" output_name: "present" }')
#: s <- s_next = 2 * s over FLOAT[n]; y = 2 * x over a fresh FLOAT[m] feed, not retained.
SYMBOLIC = ('node { op_type: "Mul" input: "s" input: "two" output: "s_next" }\n  '
            'node { op_type: "Mul" input: "x" input: "two" output: "y" }\n  '
            'initializer { name: "two" data_type: 1 float_data: 2 }\n  '
            f'input {{ name: "s" {_float("n")} }}\n  input {{ name: "x" {_float("m")} }}\n  '
            f'output {{ name: "s_next" {_float("n")} }}\n  output {{ name: "y" {_float("m")} }}\n  '
            'persistent_bindings { input_name: "s" output_name: "s_next" }')
#: The spec's scaled codebook (type 1102, catalogue as in _templates.toml) retained whole and decoded.
_CODEBOOK = '''opset_import { domain: "onnx_light" version: 1 }
struct_types { type_id: 1101 name: "CODEBOOK2_BLOCK_32" structure {
  field { name: "codes" type { struct_type { bit_packing { component { name: "index" bit_width: 2 }
    dimension: 32 } } } }
  field { name: "codebook" constant { dims: 4 data_type: 1 float_data: [-1.0, -0.25, 0.25, 1.0] } } } }
struct_types { type_id: 1102 name: "SCALED_CODEBOOK2_BLOCK_32" structure {
  field { name: "quantized" type { struct_type { type_ref: 1101 } } }
  field { name: "scale" type { tensor_type { elem_type: 1 shape { } } } } }
  decoder { name: "DecodeScaledCodebookBlocks" } }
'''
ENCODED = ('node { op_type: "Identity" input: "w" output: "w_next" }\n  '
           'node { op_type: "Decode" domain: "onnx_light" input: "w" output: "decoded" }\n  '
           'input { name: "w" type { struct_type { type_ref: 1102 } } }\n  '
           'output { name: "w_next" type { struct_type { type_ref: 1102 } } }\n  '
           f'output {{ name: "decoded" {_float(32)} }}\n  '
           'persistent_bindings { input_name: "w" output_name: "w_next" }')
#: s0 <- s0_next = s0 + x and s1 <- s1_next = s1 + x (FLOAT[2] each).
TWO_BINDINGS = ('node { op_type: "Add" input: "s0" input: "x" output: "s0_next" }\n  '
                'node { op_type: "Add" input: "s1" input: "x" output: "s1_next" }\n  '
                f'input {{ name: "s0" {_float(2)} }}\n  input {{ name: "s1" {_float(2)} }}\n  '
                f'input {{ name: "x" {_float(2)} }}\n  output {{ name: "s0_next" {_float(2)} }}\n  '
                f'output {{ name: "s1_next" {_float(2)} }}\n  '
                'persistent_bindings { input_name: "s0" output_name: "s0_next" }\n  '
                'persistent_bindings { input_name: "s1" output_name: "s1_next" }')

#: a part changed -> (the changed FLOAT[2] value)
CHANGED = {"Dim": _tensor([5.0, 6.0, 7.0]), "Rank": _tensor([5.0, 6.0], shape=[2, 1]),
           "ElementType": _tensor([5.0, 6.0], "float64")}
_FAILED = ["STATE_RUN_FAILED", "EXECUTION_FAILED"]


@builder
def feed_changed_after_accepted(part: str):
    """s <- s_next, s_next fed. Fed [3, 4] is accepted and retained; the next feed differs from it in one
    part (``part``) and is refused however the runtime finds out; the state stays [3, 4] (the accepted
    call's buffer) and a third feed [5, 6] is retained."""
    steps = [{"op": "open", "initial": {"s": _tensor([1.0, 1.0])}},
             {"op": "run", "as": "r1", "feeds": {"s_next": _tensor([3.0, 4.0])},
              "outputs": {"s_next": _tensor([3.0, 4.0])}},
             {"op": "run", "feeds": {"s_next": CHANGED[part]}, "error": "STATE_VALUE_INCOMPATIBLE", "also": _FAILED},
             {"op": "values", "as": "v", "values": {"s": _tensor([3.0, 4.0])}},
             {"op": "identity", "same": [["r1|s_next", "v|s"]]},
             {"op": "run", "feeds": {"s_next": _tensor([5.0, 6.0])}, "outputs": {"s_next": _tensor([5.0, 6.0])}},
             {"op": "values", "values": {"s": _tensor([5.0, 6.0])}}]
    return {"model": _parse(THROUGH), "steps": steps}


@builder
def reset_changed_after_accepted(part: str):
    """past <- past + x. The state opens at [1, 1], a run gives [2, 2], a reset to [5, 5] is accepted;
    a second reset differing from it in one part (``part``) is refused and changes nothing: the state stays
    [5, 5] (the accepted reset's buffer) and the next run gives [6, 6]."""
    steps = [{"op": "open", "initial": {"past": _tensor([1.0, 1.0])}},
             {"op": "run", "feeds": {"x": _tensor([1.0, 1.0])}, "outputs": {"present": _tensor([2.0, 2.0])}},
             {"op": "reset", "as": "init2", "initial": {"past": _tensor([5.0, 5.0])}},
             {"op": "reset", "initial": {"past": CHANGED[part]}, "error": "STATE_VALUE_INCOMPATIBLE"},
             {"op": "values", "as": "v", "values": {"past": _tensor([5.0, 5.0])}},
             {"op": "identity", "same": [["init2|past", "v|past"]]},
             {"op": "run", "feeds": {"x": _tensor([1.0, 1.0])}, "outputs": {"present": _tensor([6.0, 6.0])}}]
    return {"model": _parse(ACC), "steps": steps}


@builder
def fresh_shape_after_accepted(entry: str):
    """s <- 2 * s over FLOAT[n], y = 2 * x over FLOAT[m]. ``Feed``: x is [1, 2] then [1, 2, 3] then [4]:
    y is [2, 4], [2, 4, 6], [8]. ``Reset``: s opens at [1, 2] (s_next [2, 4]), resets to [1, 2, 3]
    (s_next [2, 4, 6], then [4, 8, 12]) and to [5] (s_next [10]). Each shape is the declared one's, so each
    call is computed for its own shape, not for the first call's."""
    x = _tensor([1.0])
    if entry == "Feed":
        steps = [{"op": "open", "initial": {"s": _tensor([1.0, 2.0])}},
                 {"op": "run", "feeds": {"x": _tensor([1.0, 2.0])}, "outputs": {"y": _tensor([2.0, 4.0])}},
                 {"op": "run", "feeds": {"x": _tensor([1.0, 2.0, 3.0])}, "outputs": {"y": _tensor([2.0, 4.0, 6.0])}},
                 {"op": "run", "feeds": {"x": _tensor([4.0])}, "outputs": {"y": _tensor([8.0])}},
                 {"op": "values", "values": {"s": _tensor([8.0, 16.0])}}]
    else:
        steps = [{"op": "open", "initial": {"s": _tensor([1.0, 2.0])}},
                 {"op": "run", "feeds": {"x": x}, "outputs": {"s_next": _tensor([2.0, 4.0])}},
                 {"op": "reset", "initial": {"s": _tensor([1.0, 2.0, 3.0])}},
                 {"op": "values", "values": {"s": _tensor([1.0, 2.0, 3.0])}},
                 {"op": "run", "feeds": {"x": x}, "outputs": {"s_next": _tensor([2.0, 4.0, 6.0])}},
                 {"op": "run", "feeds": {"x": x}, "outputs": {"s_next": _tensor([4.0, 8.0, 12.0])}},
                 {"op": "reset", "initial": {"s": _tensor([5.0])}},
                 {"op": "run", "feeds": {"x": x}, "outputs": {"s_next": _tensor([10.0])}}]
    return {"model": _parse(SYMBOLIC), "steps": steps}


def _codebook(scale: str) -> dict:
    """A type-1102 value: codes E4 x 8 (indices 0, 1, 2, 3 repeated) and the FLOAT scale bytes ``scale``."""
    return {"encoded": 'struct_type { type_ref: 1102 } logical_type { tensor_type { elem_type: 1 shape { '
                       'dim { dim_value: 32 } } } } raw_data: "' + "\\xe4" * 8 + scale + '"'}


#: part -> (model, bound input, output to compare, A's initial, B's initial, A's two outputs, B's two)
_PAIRS = {
    "OneElement": (SYMBOLIC, "s", "s_next", _tensor([1.0, 2.0]), _tensor([1.0, 3.0]),
                   (_tensor([2.0, 4.0]), _tensor([4.0, 8.0])), (_tensor([2.0, 6.0]), _tensor([4.0, 12.0]))),
    "OneDim": (SYMBOLIC, "s", "s_next", _tensor([1.0, 2.0]), _tensor([1.0, 2.0, 3.0]),
               (_tensor([2.0, 4.0]), _tensor([4.0, 8.0])),
               (_tensor([2.0, 4.0, 6.0]), _tensor([4.0, 8.0, 12.0]))),
    # same code bytes; scale 2.0 (00 00 00 40) against 1.0 (00 00 80 3F): codebook [-1, -0.25, 0.25, 1] times it
    "ScaleOnly": (ENCODED, "w", "decoded", _codebook("\\x00\\x00\\x00\\x40"), _codebook("\\x00\\x00\\x80\\x3f"),
                  (_tensor([-2.0, -0.5, 0.5, 2.0] * 8),) * 2, (_tensor([-1.0, -0.25, 0.25, 1.0] * 8),) * 2),
}


@builder
def two_states_one_part(part: str, order: str):
    """Two states of one model whose initial values differ in one part (``part``): each state's outputs
    follow its own values. ``Interleaved``: A and B open, then A, B, A, B run. ``OneAfterAnother``: A opens,
    runs twice and closes; then B opens and runs twice. ``OneElement``: s = [1, 2] and [1, 3] under
    s <- 2 * s: A gives [2, 4], [4, 8]; B [2, 6], [4, 12]. ``OneDim``: [1, 2] and [1, 2, 3]: B gives
    [2, 4, 6], [4, 8, 12]. ``ScaleOnly``: the same codebook codes with scale 2.0 and 1.0 (type 1102): A
    decodes to [-2, -0.5, 0.5, 2] repeated, B to [-1, -0.25, 0.25, 1] repeated."""
    model, name, output, first, second, out_a, out_b = _PAIRS[part]
    feeds = {"x": _tensor([1.0])} if model is SYMBOLIC else {}

    def run(state: str, expected: dict) -> dict:
        return {"op": "run", "state": state, "feeds": feeds, "outputs": {output: expected}}

    open_a = {"op": "open", "initial": {name: first}}
    open_b = {"op": "open", "state": "b", "initial": {name: second}}
    if order == "Interleaved":
        steps = [open_a, open_b, run("main", out_a[0]), run("b", out_b[0]), run("main", out_a[1]),
                 run("b", out_b[1])]
    else:
        steps = [open_a, run("main", out_a[0]), run("main", out_a[1]), {"op": "close"}, open_b,
                 run("b", out_b[0]), run("b", out_b[1])]
    head = _HEAD + _CODEBOOK if model is ENCODED else _HEAD
    return {"model": _parse(model, head), "steps": steps}


@builder
def second_state_element_type():
    """past <- past + x. State A opens at FLOAT [1, 1] and runs ([2, 2]); state B of the same model opens
    with DOUBLE [1, 1], one element type away from A's accepted value, and is refused; A goes on ([3, 3])."""
    steps = [{"op": "open", "initial": {"past": _tensor([1.0, 1.0])}},
             {"op": "run", "feeds": {"x": _tensor([1.0, 1.0])}, "outputs": {"present": _tensor([2.0, 2.0])}},
             {"op": "open", "state": "b", "initial": {"past": _tensor([1.0, 1.0], "float64")},
              "error": "STATE_VALUE_INCOMPATIBLE", "continue": True},
             {"op": "run", "feeds": {"x": _tensor([1.0, 1.0])}, "outputs": {"present": _tensor([3.0, 3.0])}}]
    return {"model": _parse(ACC), "steps": steps}


@builder
def second_state_unbound():
    """s0 <- s0 + x and s1 <- s1 + x. State A opens over the model (s0 = [1, 1], s1 = [2, 2]) and runs
    (x = [1, 1]: [2, 2] and [3, 3]). State B opens over the model with the binding of s1 removed (one
    binding target fewer, the same graph inputs): it takes s0 only, s1 is a feed on every call
    (x = [1, 1], s1 = [5, 5]: s0_next [2, 2], s1_next [6, 6]; again: [3, 3], [6, 6]). A goes on from its
    own values ([3, 3], [4, 4])."""
    x = _tensor([1.0, 1.0])
    steps = [{"op": "open", "initial": {"s0": _tensor([1.0, 1.0]), "s1": _tensor([2.0, 2.0])}},
             {"op": "run", "feeds": {"x": x}, "outputs": {"s0_next": _tensor([2.0, 2.0]),
                                                          "s1_next": _tensor([3.0, 3.0])}},
             {"op": "open", "state": "b", "rewrite": {"kind": "remove_binding", "input": "s1"},
              "initial": {"s0": _tensor([1.0, 1.0])}},
             {"op": "run", "state": "b", "feeds": {"x": x, "s1": _tensor([5.0, 5.0])},
              "outputs": {"s0_next": _tensor([2.0, 2.0]), "s1_next": _tensor([6.0, 6.0])}},
             {"op": "run", "state": "b", "feeds": {"x": x, "s1": _tensor([5.0, 5.0])},
              "outputs": {"s0_next": _tensor([3.0, 3.0]), "s1_next": _tensor([6.0, 6.0])}},
             {"op": "values", "state": "b", "names": ["s0"]},
             {"op": "run", "feeds": {"x": x}, "outputs": {"s0_next": _tensor([3.0, 3.0]),
                                                          "s1_next": _tensor([4.0, 4.0])}}]
    return {"model": _parse(TWO_BINDINGS), "steps": steps}

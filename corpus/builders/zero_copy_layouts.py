"""Caller buffer layouts at every entry point a caller hands a buffer to a state: the initial values of
``open``, ``reset``, a per-call feed the graph forwards into retained state, and an ordinary feed.

Each layout (conformance/layouts.py: non-native byte order, negative strides, every other element of a
larger buffer, a misaligned start, a contiguous view of a view, read-only memory, zero elements) holds the
same values as a plain array. Where the buffer would become retained state the spec lets the runtime keep
it as it is or refuse it ("report unsupported layouts/ownership explicitly"): a kept buffer must be the
caller's own (its address) and be read with the right values by the next call; a refusal must leave the
state as it was. Only a silent copy or conversion fails. Expected values are hand arithmetic (x + 1).
"""

from __future__ import annotations

from reference_impl import schema

from . import builder


def text_model(text: str):
    return schema.parse_text(text, "ModelProto")

#: layout name -> the literal keys that make it (conformance/layouts.py)
LAYOUTS = {
    "ByteSwapped": {"byteswapped": True},
    "Reversed": {"reversed": True},
    "Strided": {"strided": 2},
    "Misaligned": {"offset": 1},
    "ViewOfView": {"window": True},
    "ReadOnly": {"readonly": True},
    "ReadOnlyViewOfView": {"window": True, "readonly": True},
}
#: Layouts a NumPy runtime can hold without a copy: the suite recommends retaining them.
CONTIGUOUS = ("Misaligned", "ViewOfView", "ReadOnly", "ReadOnlyViewOfView")

_MODEL = '''
ir_version: 13
opset_import {{ domain: "" version: 23 }}
graph {{
  name: "{name}"
  {nodes}
  initializer {{ name: "one" data_type: 1 dims: 1 float_data: 1 }}
  input {{ name: "past" type {{ tensor_type {{ elem_type: 1 shape {{ dim {{ {dim} }} }} }} }} }}
  input {{ name: "x" type {{ tensor_type {{ elem_type: 1 shape {{ dim {{ {dim} }} }} }} }} }}
  {outputs}
  persistent_bindings {{ input_name: "past" output_name: "{bound}" }}
}}
'''


def _out(name: str, dim: str) -> str:
    return f'output {{ name: "{name}" type {{ tensor_type {{ elem_type: 1 shape {{ dim {{ {dim} }} }} }} }} }}'


def _model(kind: str, dim: str):
    """``plus_one``: present = past + 1, with past also returned (the buffer the call received) and y = past
    + x. ``forward``: the bound output is the feed x itself, and y = past + 1."""
    if kind == "plus_one":
        nodes = ('node { op_type: "Add" input: "past" input: "one" output: "present" } '
                 'node { op_type: "Add" input: "past" input: "x" output: "y" }')
        outputs = " ".join(_out(name, dim) for name in ("present", "y", "past"))
        bound = "present"
    else:
        nodes = 'node { op_type: "Add" input: "past" input: "one" output: "y" }'
        outputs = " ".join(_out(name, dim) for name in ("x", "y"))
        bound = "x"
    return text_model(_MODEL.format(name=f"layouts_{kind}", nodes=nodes, dim=dim, outputs=outputs, bound=bound))


def _tensor(values: list[float], **layout) -> dict:
    return {"dtype": "float32", "shape": [len(values)], "data": list(values), **layout}


def _plain(values: list[float]) -> dict:
    return _tensor(values)


def _then(step: dict, kept: list, unchanged: list | None, must_retain: bool) -> list:
    """``step`` followed by the checks of a kept buffer: unconditionally when the buffer must be retained,
    else only if the runtime accepted it (and the checks of an unchanged state if it refused)."""
    if must_retain:
        return [step, *kept]
    branches = {"if_accepted": kept, **({"if_rejected": unchanged} if unchanged is not None else {})}
    return [{**step, **branches}]


@builder
def caller_layout(entry: str, layout: str, must_retain: bool = False):
    """The caller's buffer in ``layout`` at ``entry`` (``Initial``, ``Reset``, ``ForwardedFeed`` or ``FreshFeed``).
    With ``must_retain`` (the suite's choice for layouts NumPy can hold as they are) a refusal fails too."""
    keys = LAYOUTS[layout]
    data = [1.0, 2.0, 5.0]
    given = _tensor(data, **keys)
    plus = [v + 1 for v in data]
    zeros = [0.0, 0.0, 0.0]
    # A byte-swapped buffer kept as it is comes back in its own byte order: the values are checked through
    # what the next call computes from them, which any correct reading gives.
    check_values = layout != "ByteSwapped"
    # An explicit refusal: STATE_UNRETAINABLE, or the value refused as not of its declared type (a NumPy
    # dtype in the other byte order is not the declared one's).
    refused = {} if must_retain else {"error": "STATE_UNRETAINABLE", "also": ["STATE_VALUE_INCOMPATIBLE"],
                                      "optional": True}
    forwarded_refusal = {} if must_retain else {"also": ["STATE_VALUE_INCOMPATIBLE", "STATE_RUN_FAILED"]}
    if entry == "FreshFeed":
        # Never retained, so a copy would be allowed; a refusal is explicit too. Only a misreading fails.
        either = {"error": "STATE_UNRETAINABLE", "also": ["STATE_VALUE_INCOMPATIBLE", "STATE_RUN_FAILED"],
                  "optional": True}
        steps = [{"op": "open", "initial": {"past": _plain(zeros)}},
                 {"op": "run", "feeds": {"x": given}, **either,
                  "outputs": {"y": _plain(data), "present": _plain([1.0] * 3)}},
                 {"op": "reset", "initial": {"past": _plain([1.0] * 3)}},
                 {"op": "run", "feeds": {"x": _tensor(data, **keys)}, **either, "outputs": {"y": _plain(plus)}}]
        return {"model": _model("plus_one", "dim_value: 3"), "steps": steps}
    if entry == "ForwardedFeed":
        kept = [{"op": "values", "as": "v1", **({"values": {"past": _plain(data)}} if check_values else {})},
                {"op": "identity", "same": [["f1|x", "v1|past"]]},
                {"op": "run", "feeds": {"x": _plain(zeros)}, "outputs": {"y": _plain(plus)}}]
        unchanged = [{"op": "values", "as": "v0", "values": {"past": _plain(zeros)}},
                     {"op": "identity", "same": [["init|past", "v0|past"]]}]
        steps = [{"op": "open", "as": "init", "initial": {"past": _plain(zeros)}},
                 *_then({"op": "run", "feeds_as": "f1", "feeds": {"x": given}, **refused, **forwarded_refusal},
                        kept, unchanged, must_retain)]
        return {"model": _model("forward", "dim_value: 3"), "steps": steps}
    kept = [{"op": "values", "as": "v1", **({"values": {"past": _plain(data)}} if check_values else {})},
            {"op": "identity", "same": [["given|past", "v1|past"]]},
            {"op": "run", "as": "r1", "feeds": {"x": _plain(zeros)},
             "outputs": {"present": _plain(plus), "y": _plain(data)}},
            {"op": "identity", "same": [["given|past", "r1|past"]]}]
    if entry == "Initial":
        steps = _then({"op": "open", "as": "given", "initial": {"past": given}, **refused}, kept, None, must_retain)
    elif entry == "Reset":
        unchanged = [{"op": "values", "as": "v0", "values": {"past": _plain([1.0] * 3)}},
                     {"op": "identity", "same": [["r0|present", "v0|past"]]}]
        steps = [{"op": "open", "initial": {"past": _plain(zeros)}},
                 {"op": "run", "as": "r0", "feeds": {"x": _plain(zeros)}, "outputs": {"present": _plain([1.0] * 3)}},
                 *_then({"op": "reset", "as": "given", "initial": {"past": given}, **refused}, kept, unchanged,
                        must_retain)]
    else:
        raise ValueError(f"unknown entry point {entry!r}")
    return {"model": _model("plus_one", "dim_value: 3"), "steps": steps}


@builder
def caller_zero_size(entry: str):
    """A state over ``present = Concat(past, x)`` (a growing cache, past FLOAT[n]) given a zero-element
    buffer at ``entry`` (``Initial``, ``Reset`` or ``Feed``): the empty initial value (as the spec's empty
    KV cache), an empty reset, or an empty feed. An empty buffer has no address to compare; what it holds is checked
    through the next call."""
    model = text_model('''
ir_version: 13
opset_import { domain: "" version: 23 }
graph {
  name: "layouts_grow"
  node { op_type: "Concat" input: "past" input: "x" output: "present" attribute { name: "axis" type: INT i: 0 } }
  input { name: "past" type { tensor_type { elem_type: 1 shape { dim { dim_param: "n" } } } } }
  input { name: "x" type { tensor_type { elem_type: 1 shape { dim { dim_param: "m" } } } } }
  output { name: "present" type { tensor_type { elem_type: 1 shape { dim { dim_param: "t" } } } } }
  persistent_bindings { input_name: "past" output_name: "present" }
}
''')
    empty = _tensor([])
    if entry == "Initial":
        steps = [{"op": "open", "initial": {"past": empty}},
                 {"op": "values", "values": {"past": _tensor([])}},
                 {"op": "run", "feeds": {"x": _plain([4.0])}, "outputs": {"present": _plain([4.0])}},
                 {"op": "run", "feeds": {"x": _plain([5.0, 6.0])}, "outputs": {"present": _plain([4.0, 5.0, 6.0])}}]
    elif entry == "Reset":
        steps = [{"op": "open", "initial": {"past": _plain([1.0])}},
                 {"op": "run", "feeds": {"x": _plain([2.0])}, "outputs": {"present": _plain([1.0, 2.0])}},
                 {"op": "reset", "initial": {"past": empty}},
                 {"op": "values", "values": {"past": _tensor([])}},
                 {"op": "run", "feeds": {"x": _plain([7.0])}, "outputs": {"present": _plain([7.0])}}]
    elif entry == "Feed":
        steps = [{"op": "open", "initial": {"past": _plain([1.0, 2.0])}},
                 {"op": "run", "feeds": {"x": empty}, "outputs": {"present": _plain([1.0, 2.0])}},
                 {"op": "run", "feeds": {"x": _plain([3.0])}, "outputs": {"present": _plain([1.0, 2.0, 3.0])}}]
    else:
        raise ValueError(f"unknown entry point {entry!r}")
    return {"model": model, "steps": steps}

"""Binding declaration scripts: persistent inputs whose declared types nest tensors in sequences,
optionals and structs (inline, and catalogue references), with the bound output's type equal or changed
in one place, or with a string tensor somewhere inside, and a state run over them.

A twist (``TWISTS``) states the rule it exercises: a concrete dimension changed at the same rank, a rank
changed, an element type changed, a tensor wrapped in a sequence on one side (BIND-COMPATIBLE, at any
depth outside catalogue references, whose declaration both sides share), or a string tensor or string
constant at any depth, references included (BIND-NO-STRINGS). Each bound output is its input passed
through ``Identity``, so a run retains the same buffers. Resets bring values of the declared type, or
values with one leaf of the wrong element type (STATE-VALIDATE-METADATA).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import numpy as np

from fuzz import dimensions
from fuzz import layouts as L
from fuzz.source import Source
from fuzz.statescript import Op
from reference_impl import dtypes, schema

ELEMS = (dtypes.FLOAT, dtypes.FLOAT, dtypes.INT64, dtypes.FLOAT16)
DIMS = (1, 2, 3, "n")
KINDS = ("tensor", "tensor", "sequence", "optional", "struct", "ref")
FIELDS = ("keys", "values", "length", "scale", "a.b", "c\\d")
TWISTS = ("none", "none", "dims", "rank", "elem", "container", "string", "string")
OPS = ("run", "run", "values", "reset", "reset_broken", "close")
FIRST_ID = 4000
MAX_DEPTH = 3


@dataclass
class BindingModel:
    model: object
    bound: dict[str, str]
    types: dict[str, object]  # bound input name -> its declared TypeProto
    declarations: dict[int, object] = field(default_factory=dict)
    twist: str = "none"
    tags: tuple[str, ...] = ()  # deliberate generator choices (fuzz.dimensions)


def gen_type(src: Source, declarations: dict, depth: int = 0) -> object:
    kind = src.choice(KINDS) if depth < MAX_DEPTH else "tensor"
    tp = schema.TypeProto()
    if kind == "tensor":
        dims = tuple(src.choice(DIMS) for _ in range(src.integer(0, 2)))
        tp.CopyFrom(L.tensor_type(src.choice(ELEMS), dims))
    elif kind == "sequence":
        tp.sequence_type.elem_type.CopyFrom(gen_type(src, declarations, depth + 1))
    elif kind == "optional":
        tp.optional_type.elem_type.CopyFrom(gen_type(src, declarations, depth + 1))
    else:
        target = tp.struct_type
        if kind == "ref":  # the ID is taken before the fields, which may declare types of their own
            target = schema.StructTypeProto(type_id=FIRST_ID + len(declarations))
            declarations[target.type_id] = target
        for name in FIELDS[:src.integer(1, 3)]:
            target.structure.field.add(name=name).type.CopyFrom(gen_type(src, declarations, depth + 1))
        if src.chance(1, 4):
            constant = schema.TensorProto(data_type=dtypes.FLOAT, dims=[1], float_data=[0.5])
            target.structure.field.add(name="unit", constant=constant)
        if kind == "ref":
            tp.struct_type.type_ref = target.type_id
    return tp


def leaves(tp, declarations: dict, through_refs: bool = True, _seen: set | None = None):
    """``("tensor", TypeProto)`` for every tensor type inside ``tp`` and ``("struct", StructureProto)`` for
    every structure, in a fixed order; with ``through_refs`` also those of referenced declarations (once)."""
    seen = set() if _seen is None else _seen
    which = tp.WhichOneof("value")
    if which == "tensor_type":
        yield "tensor", tp
    elif which in ("sequence_type", "optional_type"):
        yield from leaves(getattr(tp, which).elem_type, declarations, through_refs, seen)
    elif which == "struct_type":
        st = tp.struct_type
        if st.WhichOneof("kind") == "type_ref":
            if not through_refs or st.type_ref in seen:
                return
            seen.add(st.type_ref)
            st = declarations[st.type_ref]
        yield "struct", st.structure
        for item in st.structure.field:
            if item.WhichOneof("content") == "type":
                yield from leaves(item.type, declarations, through_refs, seen)


def _twist(src: Source, tp, declarations: dict, twist: str, tags: list | None = None) -> object:
    """A copy of ``tp`` changed in one place by ``twist``, the first, middle or last candidate in the type's
    order (``dimensions.place``). A string may land in a referenced declaration, which both sides of the
    binding share; the other twists change only what the copy owns."""
    tags = [] if tags is None else tags
    changed = copy.deepcopy(tp)
    found = list(leaves(changed, declarations, through_refs=twist == "string"))
    if twist == "string":
        index, where = dimensions.place(src, len(found))
        kind, target = found[index]
        if len(found) > 1:
            tags.append(f"position:{where}")
        if kind == "struct":
            string = schema.TensorProto(data_type=dtypes.STRING, dims=[1], string_data=[b"tag"])
            target.field.add(name="label", constant=string)
        else:
            target.tensor_type.elem_type = dtypes.STRING
        return changed
    tensors = [target for kind, target in found if kind == "tensor"]
    if not tensors:
        return changed
    if twist == "dims":  # a concrete dimension changed at the same rank, where there is one
        tensors = [t for t in tensors if any(d.WhichOneof("value") == "dim_value" for d in t.tensor_type.shape.dim)] \
            or tensors
    index, where = dimensions.place(src, len(tensors))
    target = tensors[index]
    if len(tensors) > 1:
        tags.append(f"position:{where}")
    tensor = target.tensor_type
    if twist == "elem":
        tensor.elem_type = dtypes.DOUBLE
    elif twist == "rank" or not any(d.WhichOneof("value") == "dim_value" for d in tensor.shape.dim):
        tensor.shape.dim.add(dim_value=2)
    elif twist == "dims":
        dim = src.choice([d for d in tensor.shape.dim if d.WhichOneof("value") == "dim_value"])
        dim.dim_value += src.integer(1, 3)
    elif twist == "container":
        inner = copy.deepcopy(target)
        target.sequence_type.elem_type.CopyFrom(inner)
    return changed


def gen_binding_model(src: Source) -> BindingModel:
    model = schema.ModelProto(ir_version=10, producer_name="fuzz-bindings")
    model.opset_import.add(domain="", version=23)
    graph = model.graph
    graph.name = "bindings"
    declarations: dict = {}
    twist = src.choice(TWISTS)
    bound, types = {}, {}
    count = src.integer(1, 3)
    chosen, where = dimensions.place(src, count)  # the binding the twist lands in
    tags = [f"position:{where}"] if count > 1 and twist != "none" else []
    for index in range(count):
        tp = gen_type(src, declarations)
        twisted = _twist(src, tp, declarations, twist, tags) if index == chosen and twist != "none" else tp
        in_type, out_type = (tp, twisted) if src.boolean() else (twisted, tp)
        if twist == "string":
            in_type = out_type = twisted
        in_name, out_name = f"s{index}", f"n{index}"
        for name, declared, group in ((in_name, in_type, graph.input), (out_name, out_type, graph.output)):
            info = group.add(name=name)
            info.type.CopyFrom(declared)
        graph.node.add(op_type="Identity", input=[in_name], output=[out_name])
        graph.persistent_bindings.add(input_name=in_name, output_name=out_name)
        bound[in_name], types[in_name] = out_name, in_type
    model.struct_types.extend(declarations.values())
    return BindingModel(model, bound, types, declarations, twist, tuple(tags))


# -------------------------------------------------------------------------------------------- values
def value_of(src: Source, tp, declarations: dict, broken: list | None = None):
    """A value of type ``tp``: tensors of the declared element type (free dimensions 1 or 2), sequences of
    up to two elements, absent or present optionals, structs field by field. ``broken`` is a one-item list
    counting down the tensor leaves: the leaf it reaches zero at gets a wrong element type."""
    from conformance.values import Struct
    from reference_impl.values import numpy_dtype

    which = tp.WhichOneof("value")
    if which == "tensor_type":
        tensor = tp.tensor_type
        shape = tuple(d.dim_value if d.WhichOneof("value") == "dim_value" else src.integer(1, 2)
                      for d in tensor.shape.dim)
        count = int(np.prod(shape, dtype=np.int64))
        if tensor.elem_type == dtypes.STRING:
            array = np.empty(count, dtype=object)
            array[:] = [b"s%d" % i for i in range(count)]
            return array.reshape(shape)
        dtype = numpy_dtype(tensor.elem_type)
        if broken is not None:
            broken[0] -= 1
            if broken[0] == 0:
                dtype = np.dtype(np.float64 if dtype != np.float64 else np.float32)
        return (src.byte_array(count).astype(np.float64) - 128).astype(dtype).reshape(shape)
    if which == "sequence_type":
        return [value_of(src, tp.sequence_type.elem_type, declarations, broken) for _ in range(src.integer(0, 2))]
    if which == "optional_type":
        return value_of(src, tp.optional_type.elem_type, declarations, broken) if src.boolean() else None
    st = tp.struct_type
    type_id = None
    if st.WhichOneof("kind") == "type_ref":
        type_id, st = st.type_ref, declarations[st.type_ref]
    fields = {item.name: value_of(src, item.type, declarations, broken)
              for item in st.structure.field if item.WhichOneof("content") == "type"}
    return Struct(fields, type_id)


def initial_values(src: Source, bm: BindingModel, broken: bool = False) -> dict:
    return {name: value_of(src, tp, bm.declarations, [src.integer(1, 3)] if broken else None)
            for name, tp in bm.types.items()}


def gen_binding_ops(src: Source, bm: BindingModel, max_ops: int = 6) -> list[Op]:
    ops = []
    for _ in range(src.integer(1, max_ops)):
        kind = src.choice(OPS)
        if kind.startswith("reset"):
            ops.append(Op("reset", initial=initial_values(src, bm, broken=kind == "reset_broken")))
        else:
            ops.append(Op(kind))
    return ops

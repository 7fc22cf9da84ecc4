"""Persistent binding rules (validated against the final graph before any state exists)."""

from __future__ import annotations

from fuzz import gen
from fuzz import layouts as L
from fuzz.cases import FuzzCase
from fuzz.mutators.base import (
    MUTATORS,
    Work,
    move_last_to,
    mutator,
)
from reference_impl import dtypes, schema
from reference_impl.errors import ErrorCode as E


# ------------------------------------------------------------------------------------- binding rules
def _add_pair(work, tp_in, tp_out=None, bind: bool = True) -> tuple[str, str]:
    index = len(work.graph.input)
    in_name, out_name = f"extra_in{index}", f"extra_out{index}"
    work.graph.input.append(gen.value_info(in_name, tp_in))
    work.graph.output.append(gen.value_info(out_name, tp_out if tp_out is not None else tp_in))
    work.graph.node.add(op_type="Identity", input=[in_name], output=[out_name])
    if bind:
        work.graph.persistent_bindings.add(input_name=in_name, output_name=out_name)
    return in_name, out_name


def _ensure_binding(src, work):
    if not len(work.graph.persistent_bindings):
        _add_pair(work, L.tensor_type(dtypes.FLOAT, (2,)))
    return src.choice(list(work.graph.persistent_bindings))


@mutator(E.BINDING_NAME_UNKNOWN)
def _binding_unknown(src, generated) -> FuzzCase:
    work = Work(generated, E.BINDING_NAME_UNKNOWN)
    binding = _ensure_binding(src, work)
    side = src.choice(("input_name", "output_name"))
    current = getattr(binding, side)
    setattr(binding, side, src.choice((current + ".keys", current.upper() + "_", "", current + "\\0", "logits"
                                       if side == "input_name" else "tokens")))
    return work.case(f"binding {side} {getattr(binding, side)!r} is no whole graph {side[:-5]}", op="bindings")


def _binding_dup_for(src, generated, code):
    """Appended last: an earlier position would meet the type-compatibility rule first."""
    work = Work(generated, code)
    binding = _ensure_binding(src, work)
    if code == E.BINDING_INPUT_DUPLICATE:
        work.graph.persistent_bindings.add(input_name=binding.input_name, output_name="logits")
    else:
        work.graph.persistent_bindings.add(input_name="tokens", output_name=binding.output_name)
    return work.case("the same name selected by two bindings", op="bindings")


MUTATORS[E.BINDING_INPUT_DUPLICATE] = lambda src, g: _binding_dup_for(src, g, E.BINDING_INPUT_DUPLICATE)
MUTATORS[E.BINDING_OUTPUT_DUPLICATE] = lambda src, g: _binding_dup_for(src, g, E.BINDING_OUTPUT_DUPLICATE)


@mutator(E.BINDING_INCOMPATIBLE)
def _binding_incompatible(src, generated) -> FuzzCase:
    work = Work(generated, E.BINDING_INCOMPATIBLE)
    how = src.integer(0, 4)
    if how == 0:
        _add_pair(work, L.tensor_type(dtypes.FLOAT, (2, 3)), L.tensor_type(dtypes.FLOAT, (2, 4)))
        rule = "bound dimensions differ"
    elif how == 1:
        _add_pair(work, L.tensor_type(dtypes.FLOAT, ("n",)), L.tensor_type(dtypes.FLOAT16, ("n",)))
        rule = "bound element types differ"
    elif how == 2:
        seq = schema.TypeProto()
        seq.sequence_type.elem_type.CopyFrom(L.tensor_type(dtypes.FLOAT, ()))
        _add_pair(work, L.tensor_type(dtypes.FLOAT, ()), seq)
        rule = "tensor bound to a sequence"
    elif how == 3:
        _add_pair(work, L.tensor_type(dtypes.FLOAT, (2,)), L.tensor_type(dtypes.FLOAT, (2, 1)))
        rule = "bound ranks differ"
    else:
        in_name, _ = _add_pair(work, L.tensor_type(dtypes.FLOAT, (2,)))
        next(i for i in work.graph.input if i.name == in_name).ClearField("type")
        rule = "bound input has no declared type"
    move_last_to(work.graph.persistent_bindings, src.integer(0, len(work.graph.persistent_bindings) - 1))
    return work.case(rule, op="bindings")


@mutator(E.BINDING_STRING)
def _binding_string(src, generated) -> FuzzCase:
    work = Work(generated, E.BINDING_STRING)
    if src.boolean():
        _add_pair(work, L.tensor_type(dtypes.STRING, ("n",)))
        rule = "persistent string tensor"
    else:
        decl = work.add_declaration(schema.StructTypeProto(type_id=work.fresh_id(src)))
        decl.structure.field.add(name="x").type.CopyFrom(L.tensor_type(dtypes.FLOAT, (2,)))
        label = decl.structure.field.add(name="label")
        if src.boolean():
            label.type.CopyFrom(L.tensor_type(dtypes.STRING, ()))
        else:
            label.constant.CopyFrom(schema.TensorProto(data_type=dtypes.STRING, string_data=[b"tag"]))
        tp = schema.TypeProto()
        tp.struct_type.type_ref = decl.type_id
        _add_pair(work, tp)
        rule = "persistent struct with a string field"
    move_last_to(work.graph.persistent_bindings, src.integer(0, len(work.graph.persistent_bindings) - 1))
    return work.case(rule, op="bindings")


@mutator(E.BINDING_IN_SUBGRAPH)
def _binding_subgraph(src, generated) -> FuzzCase:
    work = Work(generated, E.BINDING_IN_SUBGRAPH)
    cond = gen.value_info("cond", L.tensor_type(dtypes.BOOL, ()))
    work.graph.input.append(cond)
    node = work.graph.node.add(op_type="If", input=["cond"], output=["branch_out"], name="if")
    for branch in ("then_branch", "else_branch"):
        attr = node.attribute.add(name=branch, type=5)
        sub = attr.g
        sub.name = branch
        sub.node.add(op_type="Identity", input=["tokens"], output=["sub_out"])
        sub.output.append(gen.value_info("sub_out", L.tensor_type(dtypes.INT64, ("batch", "seq"))))
        if branch == "then_branch" or src.boolean():
            sub.input.append(gen.value_info("sub_in", L.tensor_type(dtypes.INT64, ())))
            sub.persistent_bindings.add(input_name="sub_in", output_name="sub_out")
    work.graph.output.append(gen.value_info("branch_out", L.tensor_type(dtypes.INT64, ("batch", "seq"))))
    return work.case("persistent bindings in a control-flow subgraph", op="bindings")

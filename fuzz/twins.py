"""Near-duplicate encoded values and caller buffers for the generated models (``fuzz.models.gen_model``).

A runtime that shares work between values it takes for the same one (a decoded tensor reused for an
initializer with the same payload, a decoder bound once per layout) is right on every model whose values
all differ a lot, and wrong on the model where a second value differs from an earlier one in one part of
its identity only. ``gen_twin`` appends such a twin: an affine value with one scale constant, its axis or
one dimension changed; a value of a registered type whose declaration is copied under another type_id; a
record value whose inline layout renames one field. ``gen_out_layouts`` picks, for decodable values, the
caller buffer (``dimensions.LAYOUTS``) the differential target decodes them into. Both tag the model
(``Generated.tags``: ``twin:<part>``, ``layout:<layout>``).
"""

from __future__ import annotations

import copy
import dataclasses

import numpy as np

from fuzz import dimensions, gen
from fuzz.source import Source
from reference_impl import dtypes

#: the parts a twin may differ in
TWIN_PARTS = ("constant", "axis", "dim", "type_id", "field")


def _parts(expected: gen.Expected, value) -> list[str]:
    """The parts a twin of ``value`` can differ in alone (the rest of its identity kept)."""
    if expected.affine is not None:
        parts = ["constant"] if np.size(expected.affine["scale"]) else []
        shape, axis, granularity = expected.affine["shape"], expected.affine["axis"], expected.affine["granularity"]
        if granularity == "axis" and any(d == shape[axis] for i, d in enumerate(shape) if i != axis):
            parts.append("axis")
        if granularity == "tensor" and shape or granularity == "axis" and len(shape) > 1:
            parts.append("dim")
        return parts
    layout = value.WhichOneof("layout")
    if layout == "struct_type" and value.struct_type.WhichOneof("kind") == "type_ref" and expected.kind == "decoded":
        return ["type_id"]
    if layout == "struct_type" and value.struct_type.WhichOneof("kind") in ("structure", "bit_packing"):
        return ["field"]
    return []


def gen_twin(src: Source, generated: gen.Generated) -> None:
    """One time in three, append a twin of an earlier value that differs from it in one part."""
    if not src.chance(1, 3):
        return
    graph = generated.model.graph
    protos = {value.name: value for value in graph.encoded_initializer}
    candidates = [(name, part) for name, expected in generated.values.items() if name in protos
                  for part in _parts(expected, protos[name])]
    if not candidates:
        return
    part = src.choice([part for part in TWIN_PARTS if any(part == each for _, each in candidates)])
    name = src.choice([name for name, each in candidates if each == part])
    expected, original = generated.values[name], protos[name]
    twin = copy.deepcopy(original)
    twin.name = _fresh(f"{name}_twin", set(protos))
    make = {"constant": _constant, "axis": _axis, "dim": _dim, "type_id": _type_id, "field": _field}[part]
    generated.values[twin.name] = make(src, generated, twin, expected)
    graph.encoded_initializer.append(twin)
    generated.tags.append(f"twin:{part}")


def _fresh(stem: str, taken: set[str]) -> str:
    name, index = stem, 0
    while name in taken:
        index += 1
        name = f"{stem}{index}"
    return name


def _affine_expected(twin, parts: dict) -> gen.Expected:
    decoded = gen.expected_dequantize(parts["codes"], parts["zero_point"], parts["scale"], parts["axis"],
                                      parts["block"], parts["shape"], dtypes.NUMPY_DTYPE[parts["elem_type"]])
    return gen.Expected(twin.name, "affine", decoded=decoded, logical_count=int(np.prod(parts["shape"])),
                        affine=parts, large=parts["large"])


def _constant(src: Source, generated: gen.Generated, twin, expected: gen.Expected) -> gen.Expected:
    """One scale value changed (the element first, middle or last), encoded as the scale's type allows."""
    parts = dict(expected.affine)
    scale = np.array(parts["scale"])
    flat = scale.reshape(-1)
    index, _ = dimensions.place(src, flat.size)
    table = gen.SCALE_TABLE.astype(scale.dtype)
    flat[index] = src.choice([v for v in table if v != flat[index] and not np.isnan(v)])
    parts["scale"] = scale
    twin.affine.scale.CopyFrom(gen._scale_tensor(src, scale, parts["elem_type"]))
    return _affine_expected(twin, parts)


def _axis(src: Source, generated: gen.Generated, twin, expected: gen.Expected) -> gen.Expected:
    """Another axis of the same length, so the scale and zero point stay as they are."""
    parts = dict(expected.affine)
    shape, axis = parts["shape"], parts["axis"]
    parts["axis"] = src.choice([i for i, d in enumerate(shape) if i != axis and d == shape[axis]])
    twin.affine.axis = parts["axis"]
    return _affine_expected(twin, parts)


def _dim(src: Source, generated: gen.Generated, twin, expected: gen.Expected) -> gen.Expected:
    """One dimension (not the axis) one longer or one shorter; the codes along it cut or repeated, inline."""
    parts = dict(expected.affine)
    shape, axis = list(parts["shape"]), parts["axis"]
    where = src.choice([i for i in range(len(shape)) if i != axis])
    grow = shape[where] <= 1 or src.boolean()
    codes = np.asarray(parts["codes"]).reshape(parts["shape"])
    if grow:
        if shape[where]:
            edge = codes.take([-1], axis=where)
        else:  # grown from zero length: one row of zero codes
            edge = np.zeros([1 if i == where else d for i, d in enumerate(shape)], codes.dtype)
        codes = np.concatenate([codes, edge], axis=where)
        shape[where] += 1
    else:
        shape[where] -= 1
        codes = codes.take(range(shape[where]), axis=where)
    parts["shape"], parts["codes"] = tuple(shape), codes.reshape(-1)
    twin.logical_type.tensor_type.shape.dim[where].dim_value = shape[where]
    twin.ClearField("external_data")
    twin.ClearField("data_location")
    twin.raw_data = gen.pack_codes(parts["codes"], parts["storage"])
    return _affine_expected(twin, parts)


def _type_id(src: Source, generated: gen.Generated, twin, expected: gen.Expected) -> gen.Expected:
    """The registered type's declaration copied under an unused type_id: the same layout, no decoder
    registered for it (decoding it is CONSUMER_MISSING; its records are the original's)."""
    model = generated.model
    used = {decl.type_id for decl in model.struct_types}
    declaration = next(decl for decl in model.struct_types if decl.type_id == twin.struct_type.type_ref)
    copied = model.struct_types.add()
    copied.CopyFrom(declaration)
    copied.type_id = src.choice([i for i in gen.ID_POOL if i not in used])
    twin.struct_type.type_ref = copied.type_id
    return gen.Expected(twin.name, "no-decoder", record_bytes=expected.record_bytes, records=expected.records)


def _field(src: Source, generated: gen.Generated, twin, expected: gen.Expected) -> gen.Expected:
    """One field of the inline layout (first, middle or last) renamed; its leaves and constants with it."""
    st = twin.struct_type
    items = st.structure.field if st.WhichOneof("kind") == "structure" else st.bit_packing.component
    index, _ = dimensions.place(src, len(items))
    old = items[index].name
    new = _fresh(f"{old}_", {item.name for item in items})
    items[index].name = new

    def renamed(path: str) -> str:
        return new + path[len(old):] if path == old or path.startswith(old + ".") else path
    leaves = [(dataclasses.replace(leaf, path=renamed(leaf.path)), patterns) for leaf, patterns in expected.leaves]
    constants = {renamed(path): value for path, value in expected.constants.items()}
    return dataclasses.replace(expected, name=twin.name, leaves=leaves, constants=constants)


def gen_out_layouts(src: Source, generated: gen.Generated) -> None:
    """For each decodable value, one time in three, the caller buffer it is decoded into (``out=``)."""
    for name, expected in generated.values.items():
        if expected.kind in ("affine", "decoded") and src.chance(1, 3):
            layout = src.choice(dimensions.LAYOUTS)
            generated.out_layouts[name] = layout
            generated.tags.append(f"layout:{layout}")

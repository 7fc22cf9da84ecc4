"""Runtime values the contract adds to tensors, and the compiled type specs they are checked against.

A ``StructValue`` is a whole structure whose fields keep their own owners (arrays, nested structs,
encoded values, sequences); an ``EncodedValue`` is a layout header plus a read-only payload buffer.
Type specs are compiled once from ``TypeProto`` + catalogue so that checking a value at run time never
touches the model again (clause STATE-RESOLVE-ONCE).
"""

from __future__ import annotations

import functools
from collections.abc import Container, Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import numpy as np
from google.protobuf.message import Message
from onnx import helper as onnx_helper

from reference_impl import dtypes
from reference_impl.errors import ErrorCode as E
from reference_impl.errors import violation
from reference_impl.structs import MAX_DEPTH, Catalogue, struct_kind


# ---------------------------------------------------------------------------------------------- values
class StructValue(Mapping):
    """An immutable whole structure: field name -> value. ``type_id`` names its catalogue type, if any.

    Building one stores references to the field values; no payload is copied.
    """

    __slots__ = ("type_id", "_fields")

    def __init__(self, fields: Mapping[str, Any], type_id: int | None = None):
        self.type_id = type_id
        self._fields = MappingProxyType(dict(fields))

    def __getitem__(self, name: str) -> Any:
        return self._fields[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._fields)

    def __len__(self) -> int:
        return len(self._fields)

    # The fields mapping answers these itself: the Mapping mixins would step through them in Python, and
    # the state's checks walk every field of every retained struct on every call.
    def __contains__(self, name: object) -> bool:
        return name in self._fields

    def keys(self):
        return self._fields.keys()

    def items(self):
        return self._fields.items()

    def values(self):
        return self._fields.values()

    def get(self, name: str, default: Any = None) -> Any:
        return self._fields.get(name, default)

    def replace(self, **updates: Any) -> StructValue:
        """A new struct sharing every unchanged field's owner."""
        fields = dict(self._fields)
        fields.update(updates)
        return StructValue(fields, self.type_id)

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={_short(v)}" for k, v in self._fields.items())
        return f"StructValue(type_id={self.type_id}, {inner})"


_STRUCT_CLASSES: dict[type, bool] = {}


def is_struct(value: Any) -> bool:
    """``isinstance(value, StructValue)``, answered per class from a table: StructValue is a Mapping, and
    isinstance against an abstract base class runs a Python-level check each time (the state's checks ask
    for every node of every retained value on every call)."""
    kind = type(value)
    found = _STRUCT_CLASSES.get(kind)
    if found is None:
        found = _STRUCT_CLASSES[kind] = issubclass(kind, StructValue)
    return found


def _short(value: Any) -> str:
    if isinstance(value, np.ndarray):
        return f"array({value.dtype}, {value.shape})"
    return type(value).__name__


class EncodedValue:
    """An encoded value at run time: the layout header (an EncodedValueProto without payload) and a
    read-only uint8 payload whose owner the array keeps alive.

    ``source`` is the EncodedValueProto it came from, when there is one, so decoding an initializer
    needs no re-serialization.
    """

    __slots__ = ("header", "payload", "source", "base_dir")

    def __init__(self, header, payload: np.ndarray, source=None, base_dir: str | None = None):
        self.header = header
        self.payload = payload
        self.source = source
        self.base_dir = base_dir

    @classmethod
    def from_proto(cls, proto, catalogue: Catalogue, base_dir: str | None = None,
                   path: str = "value") -> EncodedValue:
        """Adopt a validated EncodedValueProto (explicit load): inline bytes are taken out of the
        message once; external bytes are mapped read-only and the array keeps the mapping alive."""
        from reference_impl.decode import payload_array

        payload = payload_array(proto, catalogue, base_dir, path)
        header = type(proto)()
        header.CopyFrom(proto)
        header.ClearField("raw_data")
        return cls(header, payload, source=proto, base_dir=base_dir)

    @property
    def layout(self) -> str | None:
        return self.header.WhichOneof("layout")

    @property
    def type_ref(self) -> int | None:
        if self.layout == "struct_type" and struct_kind(self.header.struct_type) == "type_ref":
            return self.header.struct_type.type_ref
        return None

    @property
    def nbytes(self) -> int:
        return int(self.payload.nbytes)

    def to_proto(self):
        """The value as an EncodedValueProto for a decoder. An inline source message is handed over as
        it is; otherwise the payload this value holds is materialized into the message (decoding, i.e.
        kernel, cost, never state management). An external value is decoded from the bytes it mapped,
        never from its file again: the mapping is its owner, and the file may since have been replaced or
        removed (clause PAY-EXTERNAL-OWNER)."""
        if self.source is not None and not len(self.source.external_data):
            return self.source
        proto = type(self.header)()
        proto.CopyFrom(self.header)
        proto.ClearField("external_data")
        proto.ClearField("data_location")
        proto.raw_data = self.payload.tobytes()
        return proto

    def __repr__(self) -> str:
        return f"EncodedValue(layout={self.layout}, type_ref={self.type_ref}, bytes={self.nbytes})"


def check_encoded_parts(value: EncodedValue, path: str, code: E) -> None:
    """``code`` unless the value's header is an EncodedValueProto and its payload a NumPy array: both are
    plain attributes a caller can set to anything, and every check after this one reads them."""
    header = value.header
    if not isinstance(header, Message) or header.DESCRIPTOR.full_name != "onnx.EncodedValueProto":
        raise violation(code, f"{path}.header", f"an encoded value's header must be an EncodedValueProto, "
                        f"not {type(header).__name__}")
    if not isinstance(value.payload, np.ndarray):
        raise violation(code, f"{path}.payload", f"an encoded value's payload must be a NumPy array, "
                        f"not {type(value.payload).__name__}")


class InvocationBorrow:
    """A buffer valid only for the current invocation (arena scratch, a callee's stack view).

    Kernels may use it internally; it can never become a returned output or retained state
    (clause PAY-OWNERLESS). The executor and the state reject it instead of copying it.
    """

    __slots__ = ("array",)

    def __init__(self, array: np.ndarray):
        self.array = array


# ------------------------------------------------------------------------------------------ type specs
@dataclass(frozen=True)
class AnySpec:
    """No declared type (or an unconstrained category): any value is accepted."""

    structural_only: bool = False  # kind-less struct: only StructValue or EncodedValue


@dataclass(frozen=True)
class TensorSpec:
    elem_type: int
    dims: tuple | None  # None = unknown rank; entries are ints, symbol strings or None

    def __post_init__(self) -> None:
        # Precomputed for the per-call check: the NumPy scalar type, the fixed dimensions, and the whole
        # shape when every dimension is fixed (then one tuple comparison checks it).
        np_type = None if self.elem_type == dtypes.STRING else numpy_dtype(self.elem_type).type
        fixed = None if self.dims is None else tuple(
            (i, d) for i, d in enumerate(self.dims) if isinstance(d, int))
        exact = self.dims if fixed is not None and len(fixed) == len(self.dims) else None
        object.__setattr__(self, "_np_type", np_type)
        object.__setattr__(self, "_fixed", fixed)
        object.__setattr__(self, "_exact", exact)
        # Serialized logical types of encoded values already found to stand for this tensor type: the
        # blocks of a paged KV cache all carry one, and the state checks new blocks on every call.
        object.__setattr__(self, "_logical_ok", set())


@dataclass(frozen=True, repr=False)
class StructSpec:
    type_id: int | None
    fields: tuple  # ((name, spec), ...) of non-constant fields in declaration order
    constants: tuple  # ((name, TensorProto), ...)
    inline: Any = None  # the inline declaration, for identity of ref-less structs

    def __post_init__(self) -> None:
        # Precomputed for the per-call check: the set of field names a value must have.
        object.__setattr__(self, "_names", frozenset(name for name, _ in self.fields))

    def __repr__(self) -> str:
        """A referenced type shows its ID and field names only: its fields' specs are shared with every
        other reference, and printing them in full would expand a diamond path by path."""
        if self.type_id is not None:
            names = ", ".join(name for name, _ in self.fields)
            return f"StructSpec(type_id={self.type_id}, fields=[{names}])"
        fields = ", ".join(f"{name}={spec!r}" for name, spec in self.fields)
        return f"StructSpec(inline, fields=[{fields}])"


@dataclass(frozen=True)
class SequenceSpec:
    elem: Any


@dataclass(frozen=True)
class OptionalSpec:
    elem: Any


@dataclass(frozen=True)
class MapSpec:
    key_type: int
    value: Any


Spec = AnySpec | TensorSpec | StructSpec | SequenceSpec | OptionalSpec | MapSpec


def compile_type(tp, catalogue: Catalogue, path: str = "type", depth: int = 0) -> Spec:
    """Compile a TypeProto (extended) into a spec, following catalogue references.

    Each referenced declaration is compiled once per catalogue and shared (``Catalogue.memo``), so a
    diamond-shaped catalogue compiles in time linear in its size. ``depth`` counts enclosing levels
    as the verifier does (every TypeProto and type_ref expansion is one)."""
    if tp is None:
        return AnySpec()
    level = depth + 1
    if level > MAX_DEPTH:
        raise violation(E.NESTING_TOO_DEEP, path, f"types nest deeper than {MAX_DEPTH}")
    which = tp.WhichOneof("value")
    if which == "tensor_type":
        tensor = tp.tensor_type
        dims = None
        if tensor.HasField("shape"):
            dims = tuple(_dim(d) for d in tensor.shape.dim)
        return _tensor_spec(tensor.elem_type, dims)
    if which == "sequence_type":
        return SequenceSpec(compile_type(tp.sequence_type.elem_type, catalogue, f"{path}.sequence_type", level))
    if which == "optional_type":
        return OptionalSpec(compile_type(tp.optional_type.elem_type, catalogue, f"{path}.optional_type", level))
    if which == "map_type":
        return MapSpec(tp.map_type.key_type,
                       compile_type(tp.map_type.value_type, catalogue, f"{path}.map_type", level))
    if which == "struct_type":
        return compile_struct(tp.struct_type, catalogue, f"{path}.struct_type", level)
    return AnySpec()


@functools.lru_cache(maxsize=4096)
def _tensor_spec(elem_type: int, dims: tuple | None) -> TensorSpec:
    """Tensor specs are immutable values: one object per element type and dimensions serves every model
    (executors compile every input and output, and the fuzz targets load thousands of small models)."""
    return TensorSpec(elem_type, dims)


def _dim(d):
    kind = d.WhichOneof("value")
    if kind == "dim_value":
        return d.dim_value
    if kind == "dim_param":
        return d.dim_param
    return None


def compile_struct(st, catalogue: Catalogue, path: str, depth: int = 0) -> Spec:
    """A struct type as a spec. Arrays and bit packings are byte-layout kinds: values of them are
    carried encoded, so their spec only fixes the identity. A reference compiles its declaration
    once per catalogue; every later reference shares that spec."""
    kind = struct_kind(st)
    if kind is None:
        return AnySpec(structural_only=True)
    if kind != "type_ref":
        return _compile_declaration(st, None, st, catalogue, path, depth)
    specs = catalogue.memo("spec")
    found = specs.get(st.type_ref)
    if found is None:
        if depth + 1 > MAX_DEPTH:
            raise violation(E.NESTING_TOO_DEEP, path, f"types nest deeper than {MAX_DEPTH}")
        declaration, decl_path = catalogue.lookup(st.type_ref, f"{path}.type_ref")
        found = _compile_declaration(declaration, st.type_ref, None, catalogue, decl_path, depth + 1)
        specs[st.type_ref] = found
    return found


def _compile_declaration(st, type_id: int | None, inline, catalogue: Catalogue, path: str, depth: int) -> Spec:
    if struct_kind(st) != "structure":
        return StructSpec(type_id, (), (), inline)
    fields, constants = [], []
    for index, field in enumerate(st.structure.field):
        field_path = f"{path}.structure.field[{index}]"
        if field.WhichOneof("content") == "constant":
            constants.append((field.name, field.constant))
        else:
            fields.append((field.name, compile_type(field.type, catalogue, f"{field_path}.type", depth)))
    return StructSpec(type_id, tuple(fields), tuple(constants), inline)


def string_path(spec: Spec, path: str, _seen: dict | None = None) -> str | None:
    """The path of a string tensor anywhere inside a type (fields, constants, elements), or None.
    A struct spec shared by several references is searched once."""
    seen = {} if _seen is None else _seen
    if isinstance(spec, TensorSpec):
        return path if spec.elem_type == dtypes.STRING else None
    if isinstance(spec, (SequenceSpec, OptionalSpec)):
        return string_path(spec.elem, f"{path}.elem", seen)
    if isinstance(spec, MapSpec):
        if spec.key_type == dtypes.STRING:
            return f"{path}.key"
        return string_path(spec.value, f"{path}.value", seen)
    if isinstance(spec, StructSpec):
        if id(spec) in seen:
            relative = seen[id(spec)]
            return None if relative is None else path + relative
        found = next((f"{path}.{name}" for name, constant in spec.constants
                      if constant.data_type == dtypes.STRING), None)
        if found is None:
            for name, field in spec.fields:
                found = string_path(field, f"{path}.{name}", seen)
                if found:
                    break
        seen[id(spec)] = None if found is None else found[len(path):]
        return found
    return None


def incompatibility(a: Spec, b: Spec) -> str | None:
    """Why two declared types cannot carry the same value across a binding, or None."""
    if isinstance(a, AnySpec) or isinstance(b, AnySpec):
        if isinstance(a, AnySpec) and isinstance(b, AnySpec):
            return None
        other = b if isinstance(a, AnySpec) else a
        structural = (a if isinstance(a, AnySpec) else b).structural_only
        if structural and not isinstance(other, StructSpec):
            return "a struct category cannot carry a non-struct value"
        return None
    if type(a) is not type(b):
        return f"{_kind(a)} versus {_kind(b)}"
    if isinstance(a, TensorSpec):
        if a.elem_type != b.elem_type:
            return f"element type {dtypes.type_name(a.elem_type)} versus {dtypes.type_name(b.elem_type)}"
        if a.dims is None or b.dims is None:
            return None
        if len(a.dims) != len(b.dims):
            return f"rank {len(a.dims)} versus {len(b.dims)}"
        for index, (x, y) in enumerate(zip(a.dims, b.dims)):
            if isinstance(x, int) and isinstance(y, int) and x != y:
                return f"dimension {index}: {x} versus {y}"
        return None
    if isinstance(a, (SequenceSpec, OptionalSpec)):
        return incompatibility(a.elem, b.elem)
    if isinstance(a, MapSpec):
        if a.key_type != b.key_type:
            return "map key types differ"
        return incompatibility(a.value, b.value)
    if a.type_id is not None or b.type_id is not None:
        return None if a.type_id == b.type_id else f"struct type {a.type_id} versus {b.type_id}"
    if [n for n, _ in a.fields] != [n for n, _ in b.fields] or a.constants != b.constants:
        return "inline structs declare different fields"
    for (name, x), (_, y) in zip(a.fields, b.fields):
        reason = incompatibility(x, y)
        if reason:
            return f"field {name}: {reason}"
    return None


def _kind(spec: Spec) -> str:
    return {TensorSpec: "tensor", StructSpec: "struct", SequenceSpec: "sequence",
            OptionalSpec: "optional", MapSpec: "map"}.get(type(spec), "any")


# ------------------------------------------------------------------------------------- value checking
def holds_strings(array: np.ndarray) -> bool:
    """True for a string tensor: NumPy text, or an object array (ONNX's form) of str/bytes only."""
    if array.dtype.kind in "US":
        return True
    if array.dtype.kind != "O":
        return False
    return all(isinstance(item, (str, bytes)) for item in array.flat)


_DTYPE_CACHE: dict[int, np.dtype] = {}


def numpy_dtype(elem_type: int) -> np.dtype:
    found = _DTYPE_CACHE.get(elem_type)
    if found is None:
        found = np.dtype(onnx_helper.tensor_dtype_to_np_dtype(elem_type))
        _DTYPE_CACHE[elem_type] = found
    return found


def check_value(value: Any, spec: Spec, path: str, code: E = E.STATE_VALUE_INCOMPATIBLE,
                checked: set | None = None) -> None:
    """Validate actual value metadata against a compiled spec (no payload is read or copied).

    The walk follows the spec, so it is as deep as the declared type; a container object reached
    again under the same spec (a value sharing sub-structures) is checked once. ``checked`` holds the
    ``(id(container), id(spec))`` pairs already checked (given by a caller that knows some, e.g. a state's
    unchanged retained structs); the walk adds the ones it checks."""
    if _fits_tensor(value, spec):
        return
    if isinstance(spec, AnySpec):
        if spec.structural_only and not isinstance(value, (StructValue, EncodedValue)):
            raise violation(code, path, f"expected a struct value, got {type(value).__name__}")
        return
    if isinstance(spec, TensorSpec):
        if isinstance(value, EncodedValue):  # a tensor in another physical representation (e.g. a KV block)
            _check_logical_tensor(value, spec, path, code)
            return
        if not isinstance(value, np.ndarray):
            raise violation(code, path, f"expected a tensor, got {type(value).__name__}")
        if spec.elem_type == dtypes.STRING:
            if not holds_strings(value):
                raise violation(code, path, f"expected a string tensor, got {value.dtype}")
        elif value.dtype.type is not numpy_dtype(spec.elem_type).type:
            raise violation(code, path, f"element type {value.dtype} is not {dtypes.type_name(spec.elem_type)}")
        if spec.dims is not None:
            if value.ndim != len(spec.dims):
                raise violation(code, path, f"rank {value.ndim} is not the declared {len(spec.dims)}")
            for index, (want, got) in enumerate(zip(spec.dims, value.shape)):
                if isinstance(want, int) and want != got:
                    raise violation(code, path, f"dimension {index} is {got}, declared {want}")
        return
    if isinstance(spec, OptionalSpec):
        if value is not None:
            check_value(value, spec.elem, path, code, checked)
        return
    seen = set() if checked is None else checked
    key = (id(value), id(spec))
    if key in seen:
        return
    if isinstance(spec, SequenceSpec):
        if not isinstance(value, list):
            raise violation(code, path, f"expected a sequence, got {type(value).__name__}")
        elem = spec.elem
        for index, item in enumerate(value):
            if (id(item), id(elem)) not in seen:  # (the path is formatted only for what is checked)
                check_value(item, elem, f"{path}[{index}]", code, seen)
    elif isinstance(spec, MapSpec):
        if not isinstance(value, dict):
            raise violation(code, path, f"expected a map, got {type(value).__name__}")
        for name, item in value.items():
            check_value(item, spec.value, f"{path}[{name!r}]", code, seen)
    else:
        _check_struct_value(value, spec, path, code, seen)
    seen.add(key)


#: At most this many accepted logical types are remembered per tensor spec.
_LOGICAL_MEMO = 64


def _check_logical_tensor(value: EncodedValue, spec: TensorSpec, path: str, code: E) -> None:
    """An encoded value stands for a declared tensor when its logical type is that tensor type: logical
    meaning and physical representation are independent (the block formats of a paged KV cache)."""
    check_encoded_parts(value, path, code)
    logical = value.header.logical_type
    key = logical.SerializeToString()
    accepted = spec._logical_ok
    if key in accepted:
        return
    _check_logical_type(logical, spec, path, code)
    if len(accepted) < _LOGICAL_MEMO:
        accepted.add(key)


def _check_logical_type(logical, spec: TensorSpec, path: str, code: E) -> None:
    if logical.WhichOneof("value") != "tensor_type" or logical.tensor_type.elem_type != spec.elem_type:
        raise violation(code, path, f"encoded value's logical type is not a {dtypes.type_name(spec.elem_type)} tensor")
    dims = [d.dim_value if d.WhichOneof("value") == "dim_value" else None for d in logical.tensor_type.shape.dim]
    if spec.dims is not None:
        if len(dims) != len(spec.dims):
            raise violation(code, path,
                            f"encoded value's logical rank {len(dims)} is not the declared {len(spec.dims)}")
        for index, (want, got) in enumerate(zip(spec.dims, dims)):
            if isinstance(want, int) and want != got:
                raise violation(code, path, f"encoded value's logical dimension {index} is {got}, declared {want}")


def _check_struct_value(value: Any, spec: StructSpec, path: str, code: E, seen: set) -> None:
    if isinstance(value, EncodedValue):
        check_encoded_parts(value, path, code)
        if spec.type_id is not None and value.type_ref != spec.type_id:
            raise violation(code, path, f"encoded layout {value.type_ref} is not struct type {spec.type_id}")
        if spec.type_id is None and value.header.struct_type != spec.inline:
            raise violation(code, path, "encoded layout differs from the inline struct declaration")
        return
    if not is_struct(value):
        raise violation(code, path, f"expected a struct value, got {type(value).__name__}")
    if spec.type_id is not None and value.type_id != spec.type_id:
        raise violation(code, path, f"struct type {value.type_id} is not the declared {spec.type_id}")
    if value.keys() != spec._names:
        raise violation(code, path, f"fields {sorted(value)} are not the declared {sorted(spec._names)}")
    for name, field_spec in spec.fields:
        item = value[name]
        if not _fits_tensor(item, field_spec):  # (the path is formatted only for what is checked further)
            check_value(item, field_spec, f"{path}.{name}", code, seen)


def _fits_tensor(value: Any, spec: Spec) -> bool:
    """``check_value``'s per-call fast path: a plain array that matches a numeric tensor spec. Anything
    unusual answers False and takes the full check."""
    return type(spec) is TensorSpec and type(value) is np.ndarray and spec._np_type is not None \
        and value.dtype.type is spec._np_type and (spec.dims is None or value.shape == spec._exact or (
            value.ndim == len(spec.dims) and all(value.shape[i] == d for i, d in spec._fixed)))


def leaves(value: Any, path: str, skip: Container[int] = frozenset()) -> Iterator[tuple[str, Any]]:
    """Every payload-carrying leaf (arrays, encoded values, borrows) inside a value, with its path.

    A container reached again (a value sharing sub-structures) is visited once, and containers
    nested deeper than MAX_DEPTH fail with NESTING_TOO_DEEP. Containers whose ids are in ``skip`` (known
    to their caller already) are not entered."""
    if type(value) is np.ndarray:  # the common case, without abstract-class checks
        return iter(((path, value),))
    found: list[tuple[str, Any]] = []
    _collect_leaves(value, path, skip, set(), 0, found)
    return iter(found)


def _collect_leaves(value: Any, path: str, skip: Container[int], seen: set[int], depth: int,
                    found: list[tuple[str, Any]]) -> None:
    """``leaves`` below one node: depth first, in field order (the recursion is bounded by MAX_DEPTH)."""
    kind = type(value)
    if kind is np.ndarray or kind is EncodedValue:
        found.append((path, value))
        return
    if kind is list:
        children, suffix = enumerate(value), "[{}]"
    elif kind is dict:
        children, suffix = value.items(), "[{!r}]"
    elif is_struct(value):
        children, suffix = value.items(), ".{}"
    else:
        if value is not None:
            found.append((path, value))
        return
    key = id(value)
    if key in seen or key in skip:
        return
    seen.add(key)
    if depth >= MAX_DEPTH:
        raise violation(E.NESTING_TOO_DEEP, path, f"the value nests containers deeper than {MAX_DEPTH}")
    for name, item in children:
        kind = type(item)
        if kind is np.ndarray or kind is EncodedValue:
            found.append((path + suffix.format(name), item))
        elif item is not None:
            child = id(item)
            if child in seen or child in skip:
                continue  # (as the call below would decide, without formatting its path)
            _collect_leaves(item, path + suffix.format(name), skip, seen, depth + 1, found)

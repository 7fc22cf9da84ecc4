"""Struct type catalogue: identity, reference resolution, well-formedness and checked size arithmetic.

Everything here is arithmetic over declarations; nothing is allocated in proportion to a declared size,
so hostile dimensions (2**64 - 1, 2**62 elements) are rejected before any payload is touched.

Bounds shared by every walker (verifier, executor, state, bindings, records, fuzz generators):

* **Nesting depth** (clause DECL-DEPTH, an implementation limit): every ``TypeProto`` and every
  ``type_ref`` expansion counts one level, wherever the type appears (a declaration, a layout, a graph
  value type); at most ``MAX_DEPTH`` levels. ``Catalogue.check_all`` computes each declaration's depth
  once (``Catalogue.depths``), so a reference chain is measured even when no value uses it.
* **Expansion**: a catalogue is a DAG whose diamonds make path-by-path expansion exponential; walkers
  memoize per ``type_id`` (sizes here, compiled specs in ``Catalogue.memo``) and anything that must
  expand paths (record layouts) caps them with RESOURCE_LIMIT.
* **Size**: verification refuses more than ``MAX_TYPE_NODES`` declarations, fields and components per
  model with RESOURCE_LIMIT, before walking them.
"""

from __future__ import annotations

from dataclasses import dataclass

from reference_impl import dtypes
from reference_impl.dtypes import UINT64_MAX
from reference_impl.errors import ErrorCode as E
from reference_impl.errors import violation

#: Implementation limit on type nesting (clause DECL-DEPTH, as onnx-light's kMaxStructTypeDepth): every
#: TypeProto and every type_ref expansion is one level.
MAX_DEPTH = 64
#: Implementation limit on the declarations, structure fields and bit-packing components one model
#: declares (RESOURCE_LIMIT above it): verification stays well under a second at the limit.
MAX_TYPE_NODES = 1 << 15


def _too_deep(path: str, levels: int | None = None) -> Exception:
    reached = f" ({levels} levels)" if levels is not None else ""
    return violation(E.NESTING_TOO_DEEP, path, f"types nest deeper than {MAX_DEPTH} levels{reached}, counting "
                     "every TypeProto and every type_ref expansion")


_MAP_KEY_TYPES = {dtypes.INT8, dtypes.INT16, dtypes.INT32, dtypes.INT64, dtypes.UINT8, dtypes.UINT16,
                  dtypes.UINT32, dtypes.UINT64, dtypes.STRING}


def checked_mul(a: int, b: int, path: str) -> int:
    result = a * b
    if result > UINT64_MAX:
        raise violation(E.SIZE_OVERFLOW, path, f"{a} * {b} overflows uint64")
    return result


def checked_add(a: int, b: int, path: str) -> int:
    result = a + b
    if result > UINT64_MAX:
        raise violation(E.SIZE_OVERFLOW, path, f"{a} + {b} overflows uint64")
    return result


def struct_kind(st) -> str | None:
    """The set member of the ``kind`` oneof: array, structure, bit_packing, type_ref, or None."""
    return st.WhichOneof("kind")


@dataclass(frozen=True)
class NotFixedSize:
    """Why a type has no fixed physical size (it stays a valid runtime type)."""

    path: str
    reason: str


class Catalogue:
    """The ``ModelProto.struct_types`` index, validated for identity rules on construction."""

    def __init__(self, struct_types, path: str = "model.struct_types", node_budget: int | None = None):
        """``node_budget``: charge the declarations, and every field and component the checks walk until
        ``end_budget``, against this many type nodes (verification passes MAX_TYPE_NODES)."""
        self.path = path
        self.declarations: dict[int, tuple[object, str]] = {}
        #: Nesting depth of every declaration (levels below it), filled by ``check_all``.
        self.depths: dict[int, int] | None = None
        self._memos: dict[str, dict] = {}
        self._budget = node_budget
        self._nodes_left = node_budget
        self.charge(len(struct_types), path)
        for index, decl in enumerate(struct_types):
            decl_path = f"{path}[{index}]"
            if not decl.HasField("type_id"):
                raise violation(E.TYPE_ID_MISSING, decl_path, "catalogue declarations need a type_id")
            if decl.type_id == 0:
                raise violation(E.TYPE_ID_ZERO, f"{decl_path}.type_id", "type_id must be nonzero")
            kind = struct_kind(decl)
            if kind is None:
                raise violation(E.KINDLESS_MISPLACED, decl_path,
                                "a kind-less StructTypeProto is never a catalogue declaration")
            if kind == "type_ref":
                raise violation(E.DECLARATION_NOT_CONCRETE, decl_path,
                                "a declaration selects array, structure or bit_packing, not type_ref")
            if decl.type_id in self.declarations:
                first = self.declarations[decl.type_id][1]
                raise violation(E.TYPE_ID_DUPLICATE, f"{decl_path}.type_id",
                                f"type_id {decl.type_id} is already declared at {first}")
            self.declarations[decl.type_id] = (decl, decl_path)
        self._size_memo: dict[int, int | NotFixedSize] = {}

    # ------------------------------------------------------------------ shared bounds
    def memo(self, kind: str) -> dict:
        """A per-catalogue table keyed by type_id for one kind of derived fact (compiled specs, string
        paths ...): walkers store each declaration's result once instead of expanding every path."""
        return self._memos.setdefault(kind, {})

    def charge(self, count: int, path: str) -> None:
        """Count ``count`` declared type nodes against the node budget (RESOURCE_LIMIT beyond it)."""
        if self._nodes_left is None:
            return
        self._nodes_left -= count
        if self._nodes_left < 0:
            raise violation(E.RESOURCE_LIMIT, path, f"the model declares more than {self._budget} declarations, "
                            "fields and components (implementation limit)")

    def end_budget(self) -> None:
        """Stop charging: the model is verified, later walks over it are bounded by what was checked."""
        self._nodes_left = None

    def check_reference_depth(self, type_id: int, depth: int, path: str) -> None:
        """A ``type_ref`` to ``type_id`` at ``depth`` enclosing levels: its expansion must stay within
        MAX_DEPTH (known once ``check_all`` has measured the catalogue)."""
        if self.depths is None:
            return
        below = self.depths.get(type_id)
        if below is not None and depth + 1 + below > MAX_DEPTH:
            raise _too_deep(path, depth + 1 + below)

    def lookup(self, type_id: int, path: str):
        """The declaration for ``type_id`` and its path, or TYPE_REF_UNRESOLVED."""
        found = self.declarations.get(type_id)
        if found is None:
            raise violation(E.TYPE_REF_UNRESOLVED, path, f"type_ref {type_id} names no declaration")
        return found

    def resolve(self, st, path: str):
        """Follow a ``type_ref`` to its concrete declaration; concrete types resolve to themselves."""
        if struct_kind(st) == "type_ref":
            return self.lookup(st.type_ref, f"{path}.type_ref")
        return st, path

    # ------------------------------------------------------------------ well-formedness
    def check_all(self) -> None:
        """Validate every declaration's structure, reject reference cycles, then measure each
        declaration's nesting depth through its references (rejecting any deeper than MAX_DEPTH, used
        or not)."""
        inline: dict[int, int] = {}
        refs: dict[int, list[tuple[int, int, str]]] = {}
        for type_id, (decl, decl_path) in self.declarations.items():
            refs[type_id] = []
            inline[type_id] = check_struct(decl, decl_path, self, role="declaration", depth=0,
                                           refs=refs[type_id])
        order = self._check_acyclic({tid: sorted({ref for ref, _, _ in found}) for tid, found in refs.items()})
        depths: dict[int, int] = {}
        for type_id in order:  # references before their users, so each depth is computed once
            deepest = inline[type_id]
            for ref, depth, ref_path in refs[type_id]:
                reached = depth + 1 + depths[ref]
                if reached > MAX_DEPTH:
                    raise _too_deep(ref_path, reached)
                deepest = max(deepest, reached)
            depths[type_id] = deepest
        self.depths = depths

    def _check_acyclic(self, edges: dict[int, list[int]]) -> list[int]:
        """Reject reference cycles; return the declarations in post-order (referenced ones first)."""
        order: list[int] = []
        state: dict[int, int] = {}  # 1 = on the stack, 2 = done
        for root in edges:
            if state.get(root):
                continue
            stack = [(root, iter(edges[root]))]
            trail = [root]
            state[root] = 1
            while stack:
                node, children = stack[-1]
                child = next(children, None)
                if child is None:
                    state[node] = 2
                    order.append(node)
                    stack.pop()
                    trail.pop()
                    continue
                if child not in edges:
                    continue  # unresolved references are reported by check_struct
                if state.get(child) == 1:
                    cycle = trail[trail.index(child):] + [child]
                    raise violation(E.TYPE_REF_CYCLE, self.declarations[child][1],
                                    "reference cycle " + " -> ".join(str(c) for c in cycle))
                if not state.get(child):
                    state[child] = 1
                    trail.append(child)
                    stack.append((child, iter(edges[child])))
        return order

    # ------------------------------------------------------------------ sizes
    def bit_size(self, st, path: str, depth: int = 0) -> int | NotFixedSize:
        """Size in bits of one element of a (resolved) struct type, per the spec's size table.
        ``depth`` counts the levels enclosing ``st`` (see the module docstring)."""
        kind = struct_kind(st)
        if kind == "type_ref":
            if depth + 1 > MAX_DEPTH:
                raise _too_deep(path)
            decl, decl_path = self.lookup(st.type_ref, f"{path}.type_ref")
            memo = self._size_memo.get(st.type_ref)
            if memo is None:
                memo = self.bit_size(decl, decl_path, depth + 1)
                self._size_memo[st.type_ref] = memo
            return memo
        if kind is None:
            return NotFixedSize(path, "a kind-less struct has no fixed layout")
        if kind == "array":
            count = st.array.dimension
            element = type_bit_size(st.array.element_type, f"{path}.array.element_type", self, depth)
            if isinstance(element, NotFixedSize):
                return element
            return checked_mul(count, element, f"{path}.array")
        if kind == "bit_packing":
            total = 0
            for component in st.bit_packing.component:
                total = checked_add(total, component.bit_width, f"{path}.bit_packing")
            return checked_mul(st.bit_packing.dimension, total, f"{path}.bit_packing")
        total = 0
        for index, field in enumerate(st.structure.field):
            field_path = f"{path}.structure.field[{index}]"
            if field.WhichOneof("content") == "constant":
                continue
            size = type_bit_size(field.type, f"{field_path}.type", self, depth)
            if isinstance(size, NotFixedSize):
                return size
            total = checked_add(total, size, field_path)
        return total


def type_bit_size(tp, path: str, catalogue: Catalogue, depth: int = 0) -> int | NotFixedSize:
    """Size in bits of a TypeProto used as a field or array element; NotFixedSize when dynamic.
    ``depth`` counts the levels enclosing ``tp``."""
    if depth + 1 > MAX_DEPTH:
        raise _too_deep(path)
    which = tp.WhichOneof("value")
    if which == "tensor_type":
        tensor = tp.tensor_type
        width = dtypes.BIT_WIDTH.get(tensor.elem_type)
        if width is None:
            raise violation(E.UNSUPPORTED_LEAF, f"{path}.tensor_type.elem_type",
                            f"{dtypes.type_name(tensor.elem_type)} is not a fixed-width scalar leaf")
        if not tensor.HasField("shape"):
            return NotFixedSize(path, "tensor has no shape")
        size = width
        for index, dim in enumerate(tensor.shape.dim):
            if dim.WhichOneof("value") != "dim_value":
                return NotFixedSize(f"{path}.tensor_type.shape.dim[{index}]", "dimension is not concrete")
            size = checked_mul(size, dim.dim_value, f"{path}.tensor_type.shape")
        return size
    if which == "struct_type":
        return catalogue.bit_size(tp.struct_type, f"{path}.struct_type", depth + 1)
    return NotFixedSize(path, f"{which or 'an unset type'} has no fixed inline size")


# ---------------------------------------------------------------------- well-formedness checks
def check_type(tp, path: str, catalogue: Catalogue, depth: int = 0, refs: list | None = None) -> int:
    """TypeProto validation: the ONNX rules for each alternative plus struct declarations.

    ``depth`` counts the levels enclosing ``tp`` (``tp`` itself is one more). Returns the deepest level
    reached without following references; ``refs`` collects each ``(type_id, depth, path)`` met."""
    level = depth + 1
    if level > MAX_DEPTH:
        raise _too_deep(path, level)
    which = tp.WhichOneof("value")
    if which in ("tensor_type", "sparse_tensor_type"):
        tensor = getattr(tp, which)
        if tensor.elem_type not in dtypes.KNOWN_TYPES:
            raise violation(E.TYPE_INVALID, f"{path}.{which}.elem_type",
                            f"element type {tensor.elem_type} is not a defined ONNX type")
        for index, dim in enumerate(tensor.shape.dim):
            if dim.WhichOneof("value") == "dim_value" and dim.dim_value < 0:
                raise violation(E.TYPE_INVALID, f"{path}.{which}.shape.dim[{index}]",
                                f"dimension {dim.dim_value} is negative")
        return level
    if which == "sequence_type":
        if not tp.sequence_type.HasField("elem_type"):
            raise violation(E.TYPE_INVALID, f"{path}.sequence_type", "sequence has no elem_type")
        return check_type(tp.sequence_type.elem_type, f"{path}.sequence_type.elem_type", catalogue, level, refs)
    if which == "map_type":
        if tp.map_type.key_type not in _MAP_KEY_TYPES:
            raise violation(E.TYPE_INVALID, f"{path}.map_type.key_type", "map keys are integers or strings")
        if not tp.map_type.HasField("value_type"):
            raise violation(E.TYPE_INVALID, f"{path}.map_type", "map has no value_type")
        return check_type(tp.map_type.value_type, f"{path}.map_type.value_type", catalogue, level, refs)
    if which == "optional_type":
        if not tp.optional_type.HasField("elem_type"):
            raise violation(E.TYPE_INVALID, f"{path}.optional_type", "optional has no elem_type")
        return check_type(tp.optional_type.elem_type, f"{path}.optional_type.elem_type", catalogue, level, refs)
    if which == "struct_type":
        return check_struct(tp.struct_type, f"{path}.struct_type", catalogue, role="type", depth=level,
                            refs=refs)
    if which is None:
        raise violation(E.TYPE_INVALID, path, "TypeProto selects no value")
    return level


def check_struct(st, path: str, catalogue: Catalogue, role: str, depth: int = 0,
                 refs: list | None = None) -> int:
    """Validate one StructTypeProto in a role: 'declaration' (catalogue), 'type' (inside TypeProto)
    or 'layout' (EncodedValueProto.struct_type). ``depth`` counts the levels enclosing it; the result
    and ``refs`` are as for ``check_type``."""
    kind = struct_kind(st)
    if kind == "type_ref":
        extras = [name for name in ("decoder", "encoder", "name", "doc_string", "type_id")
                  if st.HasField(name)]
        if st.metadata_props:
            extras.append("metadata_props")
        if extras:
            raise violation(E.TYPE_REF_EXTRA_FIELDS, path,
                            f"a type_ref carries only the ID; found {', '.join(extras)}")
        catalogue.lookup(st.type_ref, f"{path}.type_ref")
        catalogue.check_reference_depth(st.type_ref, depth, f"{path}.type_ref")
        if refs is not None:
            refs.append((st.type_ref, depth, f"{path}.type_ref"))
        return depth
    if role != "declaration" and st.HasField("type_id"):
        raise violation(E.INLINE_TYPE_ID, f"{path}.type_id",
                        "an inline declaration has no type_id and cannot be referenced")
    if kind is None:
        if role != "type":
            raise violation(E.KINDLESS_MISPLACED, path,
                            "a kind-less StructTypeProto is only an unconstrained category inside TypeProto")
        return depth
    if kind == "array":
        array = st.array
        if not array.HasField("element_type"):
            raise violation(E.ARRAY_ELEMENT_MISSING, f"{path}.array", "array has no element_type")
        if array.dimension == 0:
            raise violation(E.DIMENSION_INVALID, f"{path}.array.dimension",
                            "array length must be an explicit integer > 0")
        return check_type(array.element_type, f"{path}.array.element_type", catalogue, depth, refs)
    if kind == "bit_packing":
        packing = st.bit_packing
        catalogue.charge(len(packing.component), f"{path}.bit_packing")
        if not packing.component:
            raise violation(E.BIT_PACKING_EMPTY, f"{path}.bit_packing", "bit packing has no components")
        if packing.dimension == 0:
            raise violation(E.DIMENSION_INVALID, f"{path}.bit_packing.dimension",
                            "bit-packing count must be an explicit integer > 0")
        _check_names([c.name for c in packing.component], f"{path}.bit_packing.component")
        for index, component in enumerate(packing.component):
            if not 1 <= component.bit_width <= 64:
                raise violation(E.BIT_WIDTH_INVALID, f"{path}.bit_packing.component[{index}].bit_width",
                                f"bit width {component.bit_width} is outside 1..64")
        return depth
    fields = st.structure.field
    catalogue.charge(len(fields), f"{path}.structure")
    if not fields:
        raise violation(E.STRUCTURE_EMPTY, f"{path}.structure", "structure has no fields")
    _check_names([f.name for f in fields], f"{path}.structure.field")
    deepest = depth
    for index, field in enumerate(fields):
        content = field.WhichOneof("content")
        if content is None:
            raise violation(E.FIELD_CONTENT_MISSING, f"{path}.structure.field[{index}]",
                            "field needs a type or a constant")
        if content == "type":
            reached = check_type(field.type, f"{path}.structure.field[{index}].type", catalogue, depth, refs)
            if reached > deepest:
                deepest = reached
        else:
            check_constant(field.constant, f"{path}.structure.field[{index}].constant")
    return deepest


def _check_names(names: list[str], path: str) -> None:
    seen: dict[str, int] = {}
    for index, name in enumerate(names):
        if not name:
            raise violation(E.NAME_EMPTY, f"{path}[{index}].name", "names must be non-empty")
        if name in seen:
            raise violation(E.NAME_DUPLICATE, f"{path}[{index}].name",
                            f"name {name!r} repeats {path}[{seen[name]}]")
        seen[name] = index


def check_constant(tensor, path: str) -> None:
    """A field constant is an actual tensor value: concrete dims and exactly matching inline data."""
    from reference_impl.tensors import check_tensor_data

    for index, dim in enumerate(tensor.dims):
        if dim < 0:
            raise violation(E.CONSTANT_DIMS_INVALID, f"{path}.dims[{index}]",
                            f"constant dimension {dim} is not concrete")
    check_tensor_data(tensor, path)

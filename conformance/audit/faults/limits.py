"""Faults in the implementation limits: the bounds on layout paths and leaves a runtime enforces."""

from __future__ import annotations

from conformance.audit.fault import fault, name_faults, wrap
from reference_impl import records
from reference_impl.errors import ContractError, violation
from reference_impl.errors import ErrorCode as E


def _expands_every_path(original):
    def compile_layout(st, catalogue, path="layout"):
        try:
            return original(st, catalogue, path)
        except ContractError as error:
            if error.code is not E.RESOURCE_LIMIT or "leaves" in error.message:
                raise
            # Bounding leaves only, the runtime goes on expanding every path to the constants (4**15 of
            # them in the suite's diamond) until memory runs out: what it shows, without the wait.
            raise MemoryError(f"{path}: layout expansion exhausted memory") from None
    return compile_layout


LayoutPathsUnbounded = fault("RESOURCE-LIMITS.layout-paths-unbounded", ("RESOURCE-LIMITS",),
    """Bounds a layout's leaves but neither its constants nor the type nodes it visits: a constant-only group reached
    through exponentially many reference paths (a diamond) is expanded path by path until memory runs out, instead of
    being refused with RESOURCE_LIMIT before anything is allocated.""",
    patches=lambda: [wrap(records, "compile_layout", _expands_every_path)])


def _per_structure_leaf_bound(original):
    def add_leaf(layout, leaf, path):
        parent = leaf.path.rpartition(".")[0]
        counts = layout.__dict__.setdefault("_leaves_per_parent", {})
        counts[parent] = counts.get(parent, 0) + 1
        if counts[parent] > records.MAX_LEAVES:
            raise violation(E.RESOURCE_LIMIT, path, f"a structure has more than {records.MAX_LEAVES} fields")
        layout.leaves[leaf.path] = leaf
    return add_leaf


LeafBoundPerStructure = fault("RESOURCE-LIMITS.leaf-bound-per-structure", ("RESOURCE-LIMITS",),
    """Bounds the number of fields of each structure it expands, not the leaves of the whole layout: two references to a
    structure at the bound give a layout of twice as many leaves, expanded in full.""",
    patches=lambda: [wrap(records, "_add_leaf", _per_structure_leaf_bound)])


name_faults(globals())

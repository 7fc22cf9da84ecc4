"""Faults in initializer naming: unique names across dense, sparse and encoded initializers of every graph,
and initializers doubling as graph inputs."""

from __future__ import annotations

from conformance.audit.fault import Fault, fault, graphs, name_faults, wrap
from reference_impl import verifier
from reference_impl.errors import ErrorCode as E
from reference_impl.errors import violation


def _encoded_names_only(original):
    return lambda graph, path: [(where, name) for where, name in original(graph, path)
                                if ".encoded_initializer[" in where]


NamesUniqueOnlyAmongEncoded = fault("INIT-NAMES-UNIQUE.encoded-only", ("INIT-NAMES-UNIQUE",),
    """Checks initializer names for uniqueness among encoded initializers only, not across dense, sparse and encoded
    ones.""", patches=lambda: [wrap(verifier, "_initializer_names", _encoded_names_only)])


class NamesUniqueInRootGraphOnly(Fault):
    """Checks initializer names in the root graph only, not in control-flow subgraphs."""

    fault_id = "INIT-NAMES-UNIQUE.root-graph-only"
    clauses = ("INIT-NAMES-UNIQUE",)
    boundary = True

    def patches(self):
        def make(original):
            return lambda graph, path: original(graph, path) if path == "model.graph" else None
        return [wrap(verifier, "_check_initializer_names", make)]


class InitializerNameClashesWithInput(Fault):
    """Treats an encoded initializer that is also named as a graph input (a default the caller may
    override) as a duplicate name."""

    fault_id = "INIT-AS-INPUT.input-name-rejected"
    clauses = ("INIT-AS-INPUT",)

    def precheck(self, model, base_dir):
        inputs = {vi.name for vi in model.graph.input}
        for value in model.graph.encoded_initializer:
            if value.name in inputs:
                raise violation(E.INITIALIZER_NAME_DUPLICATE, "model.graph", f"{value.name!r} is also a graph input")


def _names_without_sparse(original):
    return lambda graph, path: [(where, name) for where, name in original(graph, path)
                                if ".sparse_initializer[" not in where]


SparseNamesNotCounted = fault("INIT-NAMES-UNIQUE.sparse-not-counted", ("INIT-NAMES-UNIQUE",),
    """Checks initializer names across dense and encoded initializers but forgets sparse ones (whose name lives in
    ``values.name``): an encoded value reusing a sparse initializer's name is accepted.""",
    patches=lambda: [wrap(verifier, "_initializer_names", _names_without_sparse)])


def _sparse_indices_names(original):
    def initializer_names(graph, path):
        indices = iter(sparse.indices.name for sparse in graph.sparse_initializer)
        return [(where, next(indices) if ".sparse_initializer[" in where else name)
                for where, name in original(graph, path)]
    return initializer_names


SparseNameReadFromIndices = fault("INIT-NAMES-UNIQUE.sparse-name-from-indices", ("INIT-NAMES-UNIQUE",),
    """Takes a sparse initializer's name from its ``indices`` tensor instead of its ``values`` tensor: the real name is
    never compared, and unnamed indices make two sparse initializers collide.""",
    patches=lambda: [wrap(verifier, "_initializer_names", _sparse_indices_names)])


def _case_folded(original):
    def check_initializer_names(graph, path):
        original(graph, path)
        seen: set[str] = set()
        groups = [t.name for t in graph.initializer] + [s.values.name for s in graph.sparse_initializer]
        for name in groups + [v.name for v in graph.encoded_initializer]:
            if name.casefold() in seen:
                raise violation(E.INITIALIZER_NAME_DUPLICATE, path, f"name {name!r} is already used")
            seen.add(name.casefold())
    return check_initializer_names


NamesComparedCaseInsensitively = fault("INIT-NAMES-UNIQUE.case-insensitive", ("INIT-NAMES-UNIQUE", "INIT-AS-INPUT"),
    """Keeps initializer names in a case-insensitive table (as a file-system-backed store would): two distinct names
    that differ only in case are refused as duplicates.""",
    patches=lambda: [wrap(verifier, "_check_initializer_names", _case_folded)])


class DenseInitializerInputRejected(Fault):
    """Allows an initializer to double as a graph input only for encoded initializers: a dense or sparse
    initializer also listed among the graph inputs is refused as a duplicate name."""

    fault_id = "INIT-AS-INPUT.dense-input-rejected"
    clauses = ("INIT-AS-INPUT",)

    def precheck(self, model, base_dir):
        for graph in graphs(model):
            inputs = {vi.name for vi in graph.input}
            names = [t.name for t in graph.initializer] + [s.values.name for s in graph.sparse_initializer]
            for name in names:
                if name in inputs:
                    raise violation(E.INITIALIZER_NAME_DUPLICATE, "model.graph", f"{name!r} is also a graph input")


class NamesUncheckedInFunctionBodies(Fault):
    """Checks initializer names in the root graph and the subgraphs of its nodes, but not in the
    control-flow subgraphs of function bodies (walked by a second loop that only validates values)."""

    fault_id = "INIT-NAMES-UNIQUE.function-subgraphs-skipped"
    clauses = ("INIT-NAMES-UNIQUE",)
    boundary = True

    def patches(self):
        def make(original):
            return lambda graph, path: None if path.startswith("model.functions") else original(graph, path)
        return [wrap(verifier, "_check_initializer_names", make)]


name_faults(globals())

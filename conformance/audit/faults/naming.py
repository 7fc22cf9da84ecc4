"""Faults in initializer naming: unique names across dense, sparse and encoded initializers of every graph,
and initializers doubling as graph inputs."""

from __future__ import annotations

from conformance.audit.fault import fault, graphs, name_faults, wrap
from reference_impl import verifier
from reference_impl.errors import ErrorCode as E
from reference_impl.errors import violation


def _names_where(keep):
    """A patch of the initializer-name listing keeping the names whose place ``keep(where)`` accepts."""
    return wrap(verifier, "_initializer_names", lambda original: lambda graph, path: [
        (where, name) for where, name in original(graph, path) if keep(where)])


def _names_checked_where(checked):
    """A patch of the uniqueness check running it only on the graphs whose path ``checked(path)`` accepts."""
    return wrap(verifier, "_check_initializer_names", lambda original: lambda graph, path: original(graph, path)
                if checked(path) else None)


def _doubling_as_input(names, graphs_of):
    """A precheck refusing an initializer named as a graph input: ``names(graph)`` of each of ``graphs_of(model)``."""
    def precheck(model, base_dir):
        for graph in graphs_of(model):
            inputs = {vi.name for vi in graph.input}
            for name in names(graph):
                if name in inputs:
                    raise violation(E.INITIALIZER_NAME_DUPLICATE, "model.graph", f"{name!r} is also a graph input")
    return precheck


NamesUniqueOnlyAmongEncoded = fault("INIT-NAMES-UNIQUE.encoded-only", ("INIT-NAMES-UNIQUE",),
    """Checks initializer names for uniqueness among encoded initializers only, not across dense, sparse and encoded
    ones.""", patches=lambda: [_names_where(lambda where: ".encoded_initializer[" in where)])
NamesUniqueInRootGraphOnly = fault("INIT-NAMES-UNIQUE.root-graph-only", ("INIT-NAMES-UNIQUE",),
    """Checks initializer names in the root graph only, not in control-flow subgraphs.""", boundary=True,
    patches=lambda: [_names_checked_where(lambda path: path == "model.graph")])
InitializerNameClashesWithInput = fault("INIT-AS-INPUT.input-name-rejected", ("INIT-AS-INPUT",),
    """Treats an encoded initializer that is also named as a graph input (a default the caller may override) as a
    duplicate name.""", precheck=_doubling_as_input(lambda graph: [value.name for value in graph.encoded_initializer],
                                                    lambda model: [model.graph]))
SparseNamesNotCounted = fault("INIT-NAMES-UNIQUE.sparse-not-counted", ("INIT-NAMES-UNIQUE",),
    """Checks initializer names across dense and encoded initializers but forgets sparse ones (whose name lives in
    ``values.name``): an encoded value reusing a sparse initializer's name is accepted.""",
    patches=lambda: [_names_where(lambda where: ".sparse_initializer[" not in where)])


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


def _dense_names(graph) -> list[str]:
    return [t.name for t in graph.initializer] + [s.values.name for s in graph.sparse_initializer]


def _case_folded(original):
    def check_initializer_names(graph, path):
        original(graph, path)
        seen: set[str] = set()
        for name in _dense_names(graph) + [v.name for v in graph.encoded_initializer]:
            if name.casefold() in seen:
                raise violation(E.INITIALIZER_NAME_DUPLICATE, path, f"name {name!r} is already used")
            seen.add(name.casefold())
    return check_initializer_names


NamesComparedCaseInsensitively = fault("INIT-NAMES-UNIQUE.case-insensitive", ("INIT-NAMES-UNIQUE", "INIT-AS-INPUT"),
    """Keeps initializer names in a case-insensitive table (as a file-system-backed store would): two distinct names
    that differ only in case are refused as duplicates.""",
    patches=lambda: [wrap(verifier, "_check_initializer_names", _case_folded)])
DenseInitializerInputRejected = fault("INIT-AS-INPUT.dense-input-rejected", ("INIT-AS-INPUT",),
    """Allows an initializer to double as a graph input only for encoded initializers: a dense or sparse initializer
    also listed among the graph inputs is refused as a duplicate name.""",
    precheck=_doubling_as_input(_dense_names, graphs))
NamesUncheckedInFunctionBodies = fault("INIT-NAMES-UNIQUE.function-subgraphs-skipped", ("INIT-NAMES-UNIQUE",),
    """Checks initializer names in the root graph and the subgraphs of its nodes, but not in the control-flow subgraphs
    of function bodies (walked by a second loop that only validates values).""", boundary=True,
    patches=lambda: [_names_checked_where(lambda path: not path.startswith("model.functions"))])


name_faults(globals())

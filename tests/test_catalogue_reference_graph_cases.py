"""Reference-graph cases of corpus/cases/catalogue/identity.toml: a cycle that does not pass through the first
declaration (1 -> 2 -> 3 -> 2), and a catalogue of 30 layers of diamonds (2**29 reference paths through
distinct declarations, no cycle). The
reference passes both; each fails a runtime with one plausible bug in its walk of the references, written
here as a small fault: one visited set for the whole walk (a reference to a visited declaration is a cycle
only when it returns to where the walk began), and a walk that follows every path instead of finishing each
declaration once (bounded here by a step budget, refused with RESOURCE_LIMIT, instead of hanging)."""

from __future__ import annotations

import functools

from fault_catchers import wrong_runtime_tests

from conformance.audit.fault import Fault, wrap
from conformance.cases import load_cases
from corpus.builders import limits
from reference_impl import structs
from reference_impl.errors import ErrorCode as E
from reference_impl.errors import violation

_CYCLE = "Required.Catalogue.Identity.CycleBelowTheFirstDeclaration"
_DIAMONDS = "Recommended.Catalogue.Accepts.ThirtyDiamondsDeep"


@functools.cache
def _cases() -> dict:
    return {case.id: case for case in load_cases() if case.id in (_CYCLE, _DIAMONDS)}


def _references(catalogue) -> dict[int, list[int]]:
    """Each declaration's references, as the reference's own per-declaration check collects them."""
    found = {}
    for type_id, (decl, path) in catalogue.declarations.items():
        refs: list = []
        structs.check_struct(decl, path, catalogue, role="declaration", depth=0, refs=refs)
        found[type_id] = [ref for ref, _, _ in refs]
    return found


class OneVisitedSet(Fault):
    """Walks the references from each declaration with one visited set for the whole catalogue and calls a
    reference a cycle only when it leads back to the declaration the walk started from. Nesting depth is
    left to the walkers (no measured depths)."""

    fault_id = "CAT-REF-ACYCLIC.one-visited-set"

    def patches(self):
        def check_all(self):
            edges, visited = _references(self), set()
            for root in edges:
                if root in visited:
                    continue
                visited.add(root)
                stack = [root]
                while stack:
                    for ref in edges[stack.pop()]:
                        if ref == root:
                            raise violation(E.TYPE_REF_CYCLE, f"type {root}", "reference cycle")
                        if ref not in visited:
                            visited.add(ref)
                            stack.append(ref)
            self.depths = None
        return [wrap(structs.Catalogue, "check_all", lambda original: check_all)]


class EveryPathWalked(Fault):
    """Checks for cycles by following every reference path from each declaration (a trail, no record of
    declarations already finished); it gives up after 100,000 steps with RESOURCE_LIMIT."""

    fault_id = "CAT-REF-ACYCLIC.every-path-walked"

    def patches(self):
        def make(original):
            def check_all(self):
                edges, steps = _references(self), 0
                for root in edges:
                    stack = [(root, (root,))]
                    while stack:
                        node, trail = stack.pop()
                        steps += 1
                        if steps > 100_000:
                            raise violation(E.RESOURCE_LIMIT, f"type {root}", "too many reference paths")
                        stack.extend((ref, trail + (ref,)) for ref in edges[node] if ref not in trail)
                original(self)
            return check_all
        return [wrap(structs.Catalogue, "check_all", make)]


CATCHERS = [(OneVisitedSet(), (_CYCLE,)), (EveryPathWalked(), (_DIAMONDS,))]


def test_the_cycle_avoids_the_first_declaration_and_the_diamonds_have_2_to_the_29_paths():
    cycle = _cases()[_CYCLE]
    assert "type_id: 3 structure { field { name: \"n\" type { struct_type { type_ref: 2 }" in cycle.model_text
    m = limits.reference_diamonds(levels=30)["model"]
    refs = {decl.type_id: [f.type.struct_type.type_ref for f in decl.structure.field if f.type.HasField("struct_type")]
            for decl in m.struct_types}
    paths = {61: 1}
    for type_id in range(60, 0, -1):
        assert len(set(refs[type_id])) == (2 if type_id <= 58 else 1)  # distinct declarations but for the leaf
        paths[type_id] = sum(paths[ref] for ref in set(refs[type_id]))  # through distinct declarations
    assert paths[1] == 2 ** 29 and refs[61] == []


test_the_reference_passes, test_the_bug_fails_its_cases, test_every_case_fails_some_bug = \
    wrong_runtime_tests(_cases, 2, CATCHERS)

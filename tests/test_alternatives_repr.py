"""Soundness of the Required cases of corpus/cases/affine_more.toml, edges.toml and
second_representation.toml: toy runtimes, each the reference taking one choice the spec allows, pass
every one of them (and the forbidden behaviour each case is written against is still caught)."""

from __future__ import annotations

import pytest
from test_conformance_alternatives import ChecksOnnxTyping, _bodies

from conformance.adapters import Rejected
from conformance.cases import load_cases, select
from conformance.execute import FAILED, PASSED, run_case
from reference_impl import schema

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # decoded infinities and NaNs

CASES = load_cases()
SOURCES = ("affine_more.toml", "edges.toml", "second_representation.toml")
#: every Required case of the three files
REQUIRED = sorted(case.id for case in CASES if case.level == "Required" and case.source.endswith(SOURCES))


def _failures(adapter, *case_ids) -> dict[str, str]:
    chosen = select(CASES, list(case_ids))
    assert chosen, case_ids
    results = {case.id: run_case(case, adapter, timeout=120) for case in chosen}
    return {case_id: r.message for case_id, r in results.items() if r.verdict != PASSED}


def _fails(adapter, case_id: str) -> str:
    result = run_case(select(CASES, [case_id])[0], adapter, timeout=120)
    assert result.verdict == FAILED, (case_id, result.message)
    return result.message


# ------------------------------------------------------------------------------ ONNX's Loop typing
class ChecksLoopArity(ChecksOnnxTyping):
    """Also types every Loop node as ONNX does before anything else: its body takes the iteration count,
    the condition and the N carried values, and returns the condition, the N carried values and the K scan
    outputs, of which the node returns the last N + K. onnx.checker refuses a Loop breaking this ("Graph
    attribute inferencing returned type information for 1 outputs. Expected 2"), and so does this
    runtime, with its own code."""

    def _check(self, model_bytes: bytes) -> None:
        for body, _ in _bodies(schema.parse_model(model_bytes)):
            for node in body.node:
                if (node.domain, node.op_type) != ("", "Loop"):
                    continue
                loop = next(a.g for a in node.attribute if a.name == "body")
                carried = len(node.input) - 2
                if len(loop.input) != 2 + carried or len(node.output) != len(loop.output) - 1 \
                        or len(loop.output) < 1 + carried:
                    raise Rejected("TYPE_INVALID", f"Loop {node.name!r}: outputs do not match its body")
        super()._check(model_bytes)


def test_a_runtime_typing_loops_as_onnx_does_passes_every_required_case_of_the_files():
    assert len(REQUIRED) == 78
    assert not _failures(ChecksLoopArity(), *REQUIRED)
    # while a runtime checking initializer names in the root graph only is still caught by the Loop body
    from conformance.audit.faults_representation import NamesUniqueInRootGraphOnly

    assert "accepted" in _fails(NamesUniqueInRootGraphOnly(), "Required.Naming.Initializers.DuplicateInLoopBody")

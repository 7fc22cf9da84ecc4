"""docs/adapters.md, the protocol classes and the shipped adapters agree on the adapter contract."""

from __future__ import annotations

import importlib
import pathlib
import re

import pytest

from conformance import adapters as A
from conformance.adapters import BUILTIN, Adapter, StateHandle, contract, contract_gaps
from conformance.adapters.lowering import LoweredSession
from conformance.cases import load_cases

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOC = (ROOT / "docs" / "adapters.md").read_text()
#: Case operation -> the adapter member that serves it.
OPERATION_MEMBER = {"verify": "verify", "decode": "decode", "fields": "read_fields", "roundtrip": "roundtrip",
                    "state": "open_state", "export": "export", "rewrite": "rewrite"}


def documented(section: str) -> dict[str, tuple[str, tuple[str, ...]]]:
    """member -> (kind, profiles) from the table under ``## section`` in docs/adapters.md."""
    body = DOC.split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in body.splitlines():
        match = re.match(r"\| `(\w+)[^`]*` \| (\w+) \|(.*)", line)
        if match:
            name, kind, rest = match.groups()
            cells = [c.strip() for c in rest.split("|")]
            profiles = tuple(p.strip() for p in cells[0].split(",")) if kind == "profiles" else ()
            rows[name] = (kind, tuple(sorted(profiles)))
    assert rows, f"no member table under ## {section}"
    return rows


def declared(protocol: type) -> dict[str, tuple[str, tuple[str, ...]]]:
    return {name: (kind, tuple(sorted(profiles))) for name, (kind, profiles) in contract(protocol).items()}


@pytest.mark.parametrize("section,protocol", [("Adapter members", Adapter), ("State handle members", StateHandle),
                                              ("Lowered session members", LoweredSession)])
def test_doc_tables_match_the_protocol_classes(section, protocol):
    assert documented(section) == declared(protocol)


def test_profiles_of_each_member_cover_the_corpus():
    profiles = {name: set(p) for name, (kind, p) in declared(Adapter).items() if kind == "profiles"}
    for case in load_cases():
        member = OPERATION_MEMBER[case.op]
        assert case.profile in profiles[member], f"{case.id}: {member}() serves profile {case.profile}"


def test_other_docs_point_to_the_contract_instead_of_restating_it():
    assert "docs/adapters.md" in (A.__doc__ or "")
    assert "verify(" not in (A.__doc__ or "")
    conformance_doc = (ROOT / "docs" / "conformance.md").read_text()
    assert "adapters.md" in conformance_doc and "read_fields" not in conformance_doc


def _load(spec: str):
    module, _, attribute = spec.partition(":")
    try:
        return getattr(importlib.import_module(module), attribute)
    except ImportError as error:  # the runtime is an optional extra
        pytest.skip(f"{spec}: {error}")


def _check(cls: type, protocol: type) -> None:
    from conformance.adapters.lowering import LoweredAdapter
    from conformance.adapters.reference import ReferenceAdapter

    extra = ()
    if protocol is Adapter and issubclass(cls, ReferenceAdapter):
        extra = ("executor_kernels",)  # the oracle's kernel table: a hook for faulty variants, not the contract
    if protocol is Adapter and issubclass(cls, LoweredAdapter):
        assert "`stateless(model_bytes)`" in DOC  # the lowering base's own member, documented there
        extra = ("stateless",)
    assert contract_gaps(cls, protocol, extra) == [], cls.__name__


@pytest.mark.parametrize("name", sorted(BUILTIN))
def test_shipped_adapters_follow_the_contract(name):
    cls = _load(BUILTIN[name])
    _check(cls, Adapter)
    assert isinstance(getattr(cls, "name", ""), str)


@pytest.mark.parametrize("spec", ["conformance.adapters.reference:ReferenceState",
                                  "conformance.adapters.lowering:LoweredState",
                                  "conformance.adapters.testee_client:TesteeState"])
def test_shipped_state_handles_follow_the_contract(spec):
    _check(_load(spec), StateHandle)


@pytest.mark.parametrize("spec", ["conformance.adapters.ort:OrtSession",
                                  "conformance.adapters.onnx_reference:EvaluatorSession",
                                  "conformance.adapters.ov:OpenVinoSession",
                                  "conformance.adapters.tract_rt:TractSession"])
def test_shipped_sessions_follow_the_contract(spec):
    _check(_load(spec), LoweredSession)

"""The catalogue of built-in faults, collected from the ``faults/<area>.py`` modules."""

from __future__ import annotations

import importlib
import inspect

from conformance.adapters import SuiteError
from conformance.audit.fault import Fault
from reference_impl.clauses import CLAUSES

#: clause kinds a runtime can be checked against through an adapter (every one needs a fault)
CHECKABLE_KINDS = ("rule", "permission", "limit")

#: the fault modules, one per area of the specification (``conformance/audit/faults/<area>.py``)
MODULES = tuple(f"faults.{area}" for area in (
    "wire", "catalogue", "naming", "declarations", "encoding", "limits", "structured", "affine", "external",
    "external_ownership", "bindings", "state", "zero_copy", "export", "kv_contiguous", "kv_paged", "kv_attention"))

#: modules that held faults before they were grouped by area; a ``module:Class`` spec naming one still
#: resolves (class names are unique across the catalogue, so the class is looked up by name)
RETIRED_MODULES = frozenset(f"conformance.audit.{name}" for name in (
    "faults_representation", "faults_structured", "faults_affine", "faults_affine_more", "faults_payload",
    "faults_bindings", "faults_state", "faults_zero_copy", "faults_export", "faults_kv", "faults_state_more",
    "faults_struct_more", "faults_wire_more", "faults_zc_more", "faults_kv_more", "faults_repr_more",
    "faults_thin_repr", "faults_thin_state", "faults_thin_decl", "faults_edges", "faults_mut_repr",
    "faults_mut_exec", "faults_mut_kv", "faults.attention", "faults.payload"))


def faults() -> list[type[Fault]]:
    """Every built-in fault class, in catalogue order, checked for stable unique IDs and known clauses."""
    found: list[type[Fault]] = []
    for name in MODULES:
        module = importlib.import_module(f"conformance.audit.{name}")
        found += [obj for _, obj in inspect.getmembers(module, inspect.isclass)
                  if issubclass(obj, Fault) and obj.__module__ == module.__name__ and obj.fault_id]
    found.sort(key=lambda cls: cls.fault_id)
    _check(found)
    return found


def current_spec(spec: str) -> str:
    """``spec`` with a retired fault module, or a fault module a class has moved out of, replaced by the
    module the class now lives in (``spec`` itself when it names no fault of the catalogue)."""
    module, _, name = spec.rpartition(":")
    if module not in RETIRED_MODULES:
        try:
            if hasattr(importlib.import_module(module), name):
                return spec
        except ImportError:
            return spec
    return next((adapter_spec(cls) for cls in faults() if cls.__name__ == name), spec)


def adapter_spec(cls: type[Fault]) -> str:
    """``module:Class``, what ``--adapter`` and the testee's ``--adapter`` accept."""
    return f"{cls.__module__}:{cls.__name__}"


def _check(found: list[type[Fault]]) -> None:
    seen: dict[str, str] = {}
    for cls in found:
        if cls.fault_id in seen:
            raise SuiteError(f"fault ID {cls.fault_id} is used by {seen[cls.fault_id]} and {adapter_spec(cls)}")
        seen[cls.fault_id] = adapter_spec(cls)
        if not cls.clauses or cls.fault_id.split(".", 1)[0] != cls.clauses[0]:
            raise SuiteError(f"fault {cls.fault_id}: its ID starts with the first of its clauses {cls.clauses}")
        for clause in cls.clauses:
            if clause not in CLAUSES:
                raise SuiteError(f"fault {cls.fault_id}: unknown clause {clause}")
            if CLAUSES[clause].kind not in CHECKABLE_KINDS:
                raise SuiteError(f"fault {cls.fault_id}: clause {clause} ({CLAUSES[clause].kind}) is not "
                                 "observable through a runtime")
        if not (cls.__doc__ or "").strip():
            raise SuiteError(f"fault {cls.fault_id}: its docstring says what the runtime author got wrong")


#: a representative subset for the audit through the testee in CI (``audit --testee --sample``): a fault
#: of each area, and the state and zero-copy bugs whose catching depends on values crossing the process
#: boundary (buffer identities, concurrency, counters, read-only views)
SAMPLE = (
    "CAT-ID-UNIQUE.last-declaration-wins", "WIRE-FIELDS.struct-types-at-1001", "ENC-BIT-ORDER.big-endian-scalars",
    "DEC-MISSING.generic-fallback", "AFF-PACKING.high-bits-first", "PAY-EXTERNAL-EXTENT.offset-ignored",
    "BIND-DUPLICATES.last-binding-wins", "STATE-ATOMIC.published-before-validation",
    "STATE-NO-CONCURRENCY.calls-queued", "STATE-NO-MODEL-SCAN.model-hashed-each-run",
    "ZC-RETAIN.initial-values-copied", "ZC-VIEWS.values-snapshots", "ZC-READ-ONLY.decode-scratches-input",
    "ZC-TRANSPORT.field-transport-copies", "EXP-STANDARD.bindings-stripped", "KV-ATTENTION.scale-one-over-d",
    "KV-APPEND-EQUIV.off-by-one-slot", "KV-CAPACITY-REUSE.copy-per-append", "KV-BOUNDED.whole-cache-dequantized",
    "PAY-OWNERLESS.borrowed-feed-retained", "PAY-EXTERNAL-OWNER.mapping-released",
)


def checkable_clauses() -> list[str]:
    return [cid for cid, clause in CLAUSES.items() if clause.kind in CHECKABLE_KINDS]

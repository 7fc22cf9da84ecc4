"""The same input on the oracle and on a subject implementation; any disagreement is a finding.

The subject is ``FUZZ_SUBJECT`` (an adapter spec: ``reference``, ``module:attribute``,
``path/to/file.py:attribute``) or ``FUZZ_TESTEE`` (a subprocess testee command line, so a native
crash is caught in its own process). Input format: the first byte's low bit selects raw model bytes
(the rest of the input) or a structure-aware case (``fuzz.targets.structured.build``).

Structure-aware inputs also decode values into caller buffers of odd layouts (``out=``; strided,
read-only, misaligned, byte-swapped, empty: ``Generated.out_layouts``) on subjects whose ``decode``
takes one. Error codes are compared on structure-aware cases only: those break at most one rule by construction,
while mutated raw bytes often break several at once (an offset past INT64 and a length the layout does
not need), where the spec orders no checks and every broken rule's code is a correct answer. Verdicts
and values are compared on every input.
"""

from __future__ import annotations

import os

from fuzz.cases import FuzzCase, scratch
from fuzz.invariants import Finding, SubjectUnavailable, guarded
from fuzz.subjects import canonical_bytes, compare, end_case, observe, parse_disagreement

INSTRUMENT = ("reference_impl", "conformance.adapters", "fuzz.subjects")
DICTIONARY = "onnx_light.dict"
MAX_LEN = 8192

_ADAPTERS: dict[str, object] = {}


def adapters() -> tuple[object, object]:
    """(oracle adapter, subject adapter), loaded once per process."""
    if not _ADAPTERS:
        from conformance.adapters import load_adapter
        from conformance.adapters.reference import ReferenceAdapter

        try:
            subject = load_adapter(os.environ.get("FUZZ_SUBJECT") or None,
                                   testee=os.environ.get("FUZZ_TESTEE") or None,
                                   timeout=float(os.environ.get("FUZZ_TESTEE_TIMEOUT", "10")))
        except Exception as error:  # noqa: BLE001 - whatever stops the subject loading, no input is judged
            reason = " ".join(str(error).split()) or type(error).__name__
            raise SubjectUnavailable(f"{type(error).__name__}: {reason}") from None
        _ADAPTERS["oracle"] = ReferenceAdapter()
        _ADAPTERS["subject"] = subject
    return _ADAPTERS["oracle"], _ADAPTERS["subject"]


def is_raw(data: bytes) -> bool:
    return bool(data[:1]) and bool(data[0] & 1)


def case_for(data: bytes) -> FuzzCase:
    return prepared(data)[0]


def prepared(data: bytes) -> tuple[FuzzCase, dict[str, str]]:
    """The case (its ``tags`` the generator dimensions it carries) and, for structure-aware inputs, the
    caller buffer layout each value it names is decoded into as well (``Generated.out_layouts``)."""
    if is_raw(data):
        return FuzzCase(data[1:]), {}
    from fuzz.targets.structured import build

    generated, case = build(data[1:])
    if case is None:
        case = FuzzCase(generated.model, "all", files=generated.files, tags=list(generated.tags))
    return case, dict(generated.out_layouts)


def one_input(data: bytes) -> None:
    oracle, subject = adapters()
    try:
        problems = disagreements(oracle, subject, data)[1]
    finally:
        end_case(subject)
    if problems:
        key, kind, _ = problems[0]
        operation = key.split(":", 1)[0]
        raise Finding("disagreement", "; ".join(message for _, _, message in problems[:4]),
                      f"{getattr(subject, 'name', 'subject')}:{operation}:{kind}")


def disagreements(oracle, subject, data: bytes) -> tuple[FuzzCase, list[tuple[str, str, str]]]:
    """The case ``data`` builds and where ``subject`` disagrees with ``oracle`` on it."""
    case, buffers = guarded(lambda: prepared(data), what="generate")
    model_bytes = case.model_bytes()
    base_dir = scratch().populate(case.files)
    return case, _disagreements(oracle, subject, model_bytes, base_dir, not is_raw(data), buffers)


def _disagreements(oracle, subject, model_bytes: bytes, base_dir: str | None,
                   codes: bool, buffers: dict[str, str]) -> list[tuple[str, str, str]]:
    expected = guarded(lambda: observe(oracle, model_bytes, base_dir, buffers), what="oracle")
    actual = guarded(lambda: observe(subject, model_bytes, base_dir, buffers), what="subject")
    problems = compare(expected, actual, codes)
    if parse_disagreement(problems):
        canonical = canonical_bytes(model_bytes)
        if canonical is not None and canonical != model_bytes:  # judge the contract, not the wire parser
            return _disagreements(oracle, subject, canonical, base_dir, codes, buffers)
    return problems


def seeds() -> list[bytes]:
    """Structured streams (even first byte) and raw models (odd first byte): generated ones and the
    models of the conformance cases."""
    from fuzz.seedgen import conformance_models, generated_models, structured_streams

    raw = generated_models(30) + conformance_models()
    return structured_streams(60, prefix=b"\x00") + [b"\x01" + m for m in raw]

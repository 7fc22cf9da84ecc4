"""Raw model bytes -> parse -> verify: every verdict classified, deterministic, bounded."""

from __future__ import annotations

from fuzz.cases import Verdict
from fuzz.invariants import twice
from reference_impl import ContractError, verify_model

INSTRUMENT = ("reference_impl",)
DICTIONARY = "onnx_light.dict"
MAX_LEN = 16384


def verify_bytes(data: bytes) -> tuple[Verdict, dict]:
    try:
        verify_model(data)
    except ContractError as error:
        return Verdict.reject(error), {}
    return Verdict.accept(), {}


def one_input(data: bytes) -> None:
    twice(lambda: verify_bytes(data), what="verify")


def seeds() -> list[bytes]:
    """The conformance cases' models and generated valid and near-valid models."""
    from fuzz.seedgen import conformance_models, generated_models

    return conformance_models() + generated_models()

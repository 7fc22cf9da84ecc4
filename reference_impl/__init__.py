"""The compact reference oracle for onnx-light's custom, quantized and persistent values contract."""

from reference_impl.clauses import CLAUSES, SPEC_REVISION
from reference_impl.decode import decode, decode_value, read_fields
from reference_impl.decoders import DecoderRegistry, default_registry
from reference_impl.errors import ContractError, ErrorCode
from reference_impl.verifier import VerifiedModel, verify_model

__all__ = [
    "CLAUSES", "SPEC_REVISION", "ContractError", "DecoderRegistry", "ErrorCode", "VerifiedModel",
    "decode", "decode_value", "default_registry", "read_fields", "verify_model",
]

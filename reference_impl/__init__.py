"""The compact reference oracle for onnx-light's custom, quantized and persistent values contract."""

from reference_impl.bindings import validate_bindings
from reference_impl.clauses import CLAUSES, SPEC_REVISION
from reference_impl.decode import decode, decode_value, read_fields
from reference_impl.decoders import DecoderRegistry, default_registry
from reference_impl.errors import ContractError, ErrorCode
from reference_impl.executor import LOCAL_DOMAIN, CancelToken, Executor, run_model
from reference_impl.graph_utils import export_standard
from reference_impl.state import State, make_state
from reference_impl.values import EncodedValue, InvocationBorrow, StructValue
from reference_impl.verifier import VerifiedModel, verify_model

__all__ = [
    "CLAUSES", "LOCAL_DOMAIN", "SPEC_REVISION", "CancelToken", "ContractError", "DecoderRegistry",
    "EncodedValue", "ErrorCode", "Executor", "InvocationBorrow", "State", "StructValue", "VerifiedModel",
    "decode", "decode_value", "default_registry", "export_standard", "make_state", "read_fields",
    "run_model", "validate_bindings", "verify_model",
]

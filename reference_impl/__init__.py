"""The compact reference oracle for onnx-light's custom, quantized and persistent values contract.

The public API is what this module exports (``__all__``), plus ``reference_impl.kv`` for the KV caches and
``reference_impl.schema`` for the extended protobuf messages. docs/ and the README use exactly these
names; tests/test_public_api.py checks every name they show imports.
"""

from reference_impl import schema
from reference_impl.bindings import validate_bindings
from reference_impl.clauses import CLAUSES, SPEC_REVISION
from reference_impl.decode import decode, decode_value, read_fields
from reference_impl.decoders import DecoderRegistry, default_registry
from reference_impl.errors import ContractError, ErrorCode
from reference_impl.executor import LOCAL_DOMAIN, CancelToken, Executor, run_model
from reference_impl.graph_utils import (
    apply_rewrite,
    copy_model,
    deduplicate_initializers,
    export_standard,
    feedback_loop,
    load_model,
    rename_value,
    save_model,
    unbind,
)
from reference_impl.state import State, make_state
from reference_impl.values import EncodedValue, InvocationBorrow, StructValue
from reference_impl.verifier import VerifiedModel, verify_model

__all__ = [
    "CLAUSES", "LOCAL_DOMAIN", "SPEC_REVISION", "CancelToken", "ContractError", "DecoderRegistry",
    "EncodedValue", "ErrorCode", "Executor", "InvocationBorrow", "State", "StructValue", "VerifiedModel",
    "apply_rewrite", "copy_model", "decode", "decode_value", "deduplicate_initializers", "default_registry",
    "export_standard", "feedback_loop", "load_model", "make_state", "read_fields", "rename_value", "run_model",
    "save_model", "schema", "unbind", "validate_bindings", "verify_model",
]

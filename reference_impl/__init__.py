"""The compact reference oracle for onnx-light's custom, quantized and persistent values contract.

The public API is what this module exports (``__all__``), plus ``reference_impl.kv`` for the KV caches and
``reference_impl.schema`` for the extended protobuf messages. docs/ and the README use exactly these
names; tests/test_public_api.py checks every name they show imports.

The names are imported on first use (PEP 562): importing a light submodule, such as the command lines'
shared ``broken_pipe`` manners, does not import NumPy, onnx and the whole oracle.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from reference_impl.lazy_package import keep_function_over_submodule, lazy_exports

if TYPE_CHECKING:  # what type checkers see (mypy runs over the public API in CI): the names, eagerly
    from reference_impl import schema  # noqa: F401
    from reference_impl.bindings import validate_bindings  # noqa: F401
    from reference_impl.clauses import CLAUSES, SPEC_REVISION  # noqa: F401
    from reference_impl.decode import decode, decode_value, read_fields  # noqa: F401
    from reference_impl.decoders import DecoderRegistry, default_registry  # noqa: F401
    from reference_impl.errors import ContractError, ErrorCode  # noqa: F401
    from reference_impl.executor import LOCAL_DOMAIN, CancelToken, Executor, run_model  # noqa: F401
    from reference_impl.graph_utils import (  # noqa: F401
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
    from reference_impl.state import State, make_state  # noqa: F401
    from reference_impl.values import EncodedValue, InvocationBorrow, StructValue  # noqa: F401
    from reference_impl.verifier import VerifiedModel, verify_model  # noqa: F401

#: public name -> the submodule that defines it
_EXPORTS = {
    "validate_bindings": "bindings", "CLAUSES": "clauses", "SPEC_REVISION": "clauses", "decode": "decode",
    "decode_value": "decode", "read_fields": "decode", "DecoderRegistry": "decoders",
    "default_registry": "decoders", "ContractError": "errors", "ErrorCode": "errors",
    "LOCAL_DOMAIN": "executor", "CancelToken": "executor", "Executor": "executor", "run_model": "executor",
    "apply_rewrite": "graph_utils", "copy_model": "graph_utils", "deduplicate_initializers": "graph_utils",
    "export_standard": "graph_utils", "feedback_loop": "graph_utils", "load_model": "graph_utils",
    "rename_value": "graph_utils", "save_model": "graph_utils", "unbind": "graph_utils", "State": "state",
    "make_state": "state", "EncodedValue": "values", "InvocationBorrow": "values", "StructValue": "values",
    "VerifiedModel": "verifier", "verify_model": "verifier",
}
#: public submodules
_SUBMODULES = ("schema",)

__all__ = sorted([*_EXPORTS, *_SUBMODULES], key=lambda name: (name[0].islower(), name))


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, _SUBMODULES)
keep_function_over_submodule(__name__, "decode")

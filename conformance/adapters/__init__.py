"""The adapter protocol: how a runtime plugs into the suite in process.

An adapter is any object with these members (see docs/conformance.md for the full contract)::

    name: str                      # identity, recorded in reports and certificates
    version: str
    profiles() -> set[str]         # what the runtime claims to support (see PROFILES)
    verify(model_bytes, base_dir) -> None
    decode(model_bytes, value_name, base_dir) -> numpy.ndarray
    open_state(model_bytes, initial, base_dir) -> StateHandle
    export(model_bytes, target) -> bytes            # target: "onnx-light" (round trip) or "onnx"
    rewrite(model_bytes, rewrite: dict) -> bytes    # rename / remove / replace, see cases

and a StateHandle has ``run(feeds) -> dict``, ``values() -> dict``, ``reset(initial)``, ``close()`` and
optionally ``buffer_id(value) -> int | None`` (default: the NumPy data address).

A rejection raises ``Rejected(code, message)`` (``code`` is one of reference_impl.errors.ErrorCode's
values, or None when the runtime has no mapping). ``NotSupported`` is a verdict distinct from failure.
Any other exception is a case failure, reported with its traceback. An adapter may instead provide
``classify(exc) -> Rejected | NotSupported | None`` to map its native exceptions.
"""

from __future__ import annotations

import importlib
import importlib.util
import pathlib
import sys
from typing import Any, Protocol, runtime_checkable

#: Profiles a runtime can claim; every case belongs to exactly one.
PROFILES = {
    "representation": "wire round trip, catalogue and identity, declarations, size arithmetic, payloads",
    "affine": "the closed affine branch decoded as DequantizeLinear",
    "structured": "structured decoding through registered decoders and generic field access",
    "external-data": "external payloads, extents and path safety",
    "bindings": "persistent binding declarations validated against the graph",
    "state": "state semantics: initial values, feeds, atomicity, reset/close, concurrency",
    "zero-copy": "buffer identity of retained, returned and forwarded values",
    "export": "export and rewrite of bindings and structured values",
    "kv-contiguous": "contiguous KV cache append, capacity and Attention",
    "kv-paged": "paged KV caches with per-block formats",
    "decode-e2e": "end-to-end repeated decode with independent states",
}


class Rejected(Exception):
    """The runtime rejected the input. ``code`` is the suite's error code, or None if unmapped.

    ``causes`` optionally names, as error codes, what made a wrapping failure happen (a run that fails
    with STATE_RUN_FAILED because an append was invalid names KV_SHAPE_MISMATCH, say).
    """

    def __init__(self, code: str | None, message: str = "", causes: tuple[str, ...] | list[str] = ()):
        self.code = code
        self.message = message
        self.causes = tuple(causes)
        super().__init__(f"[{code}] {message}" if code else message)


class NotSupported(Exception):
    """The runtime does not support what the case needs (a verdict, not a failure)."""


class SuiteError(Exception):
    """A problem with the suite itself (bad case, unknown adapter): never blamed on the adapter."""


@runtime_checkable
class StateHandle(Protocol):
    def run(self, feeds: dict[str, Any]) -> dict[str, Any]: ...
    def values(self) -> dict[str, Any]: ...
    def reset(self, initial: dict[str, Any]) -> None: ...
    def close(self) -> None: ...


@runtime_checkable
class Adapter(Protocol):
    name: str
    version: str

    def profiles(self) -> set[str]: ...
    def verify(self, model_bytes: bytes, base_dir: str | None) -> None: ...
    def decode(self, model_bytes: bytes, value_name: str, base_dir: str | None) -> Any: ...


BUILTIN = {
    "reference": "conformance.adapters.reference:ReferenceAdapter",
    "onnxruntime": "conformance.adapters.ort:OnnxRuntimeAdapter",
    "onnx-reference": "conformance.adapters.onnx_reference:OnnxReferenceAdapter",
    "openvino": "conformance.adapters.ov:OpenVinoAdapter",
    "tract": "conformance.adapters.tract_rt:TractAdapter",
}


def load_adapter(spec: str | None = None, testee: str | None = None, timeout: float = 30.0) -> Any:
    """An adapter instance from ``name``, ``module:attribute`` or ``path/to/file.py:attribute``, or a
    subprocess testee from a command line. Classes and factories are called with no arguments."""
    if testee:
        from conformance.adapters.testee import TesteeAdapter

        return TesteeAdapter(testee, timeout=timeout)
    spec = spec or "reference"
    spec = BUILTIN.get(spec, spec)
    if ":" not in spec:
        raise SuiteError(f"adapter {spec!r}: use a builtin name ({', '.join(BUILTIN)}), module:attribute "
                         "or path/to/file.py:attribute")
    target, attribute = spec.rsplit(":", 1)
    if target.endswith(".py") or "/" in target or "\\" in target:
        path = pathlib.Path(target).resolve()
        if not path.is_file():
            raise SuiteError(f"adapter file {target!r} does not exist")
        module_name = f"conformance_adapter_{abs(hash(str(path)))}"
        module_spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[module_name] = module
        module_spec.loader.exec_module(module)
    else:
        module = importlib.import_module(target)
    try:
        obj = getattr(module, attribute)
    except AttributeError:
        raise SuiteError(f"{target!r} has no attribute {attribute!r}") from None
    instance = obj() if callable(obj) and not _is_adapter(obj) else obj
    instance.identity = getattr(instance, "identity", spec)
    return instance


def _is_adapter(obj: Any) -> bool:
    return not isinstance(obj, type) and hasattr(obj, "verify") and hasattr(obj, "profiles")


__all__ = [
    "BUILTIN",
    "PROFILES",
    "Adapter",
    "NotSupported",
    "Rejected",
    "StateHandle",
    "SuiteError",
    "load_adapter",
]

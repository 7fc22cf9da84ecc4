"""The adapter protocol: how a runtime plugs into the suite in process.

``Adapter`` and ``StateHandle`` below list every member the suite calls, each marked ``required``,
``for_profiles(...)`` (required when the adapter claims one of those profiles; a missing one makes
those cases "not supported") or ``optional``. docs/adapters.md describes each member, its return
conventions and the value types; tests/test_adapters_doc.py keeps the two in agreement.

A rejection raises ``Rejected(code, message, causes)``; ``NotSupported`` is a verdict distinct from
failure; any other exception fails the case with its traceback (unless ``classify`` maps it).
"""

from __future__ import annotations

import importlib
import importlib.util
import pathlib
import sys
from typing import Any, Protocol

from conformance.adapters.base import IN_PROCESS_PROFILES, PROFILES, NotSupported, Rejected, SuiteError
from conformance.adapters.testee_client import TesteeAdapter

#: The version of the adapter contract (the members below, the lowering base, the values and buffer
#: identities handed to adapters, the testee protocol), apart from the suite's version, which follows the
#: cases. Semver: a change that can fail a working adapter or testee is major, an addition it may ignore is
#: minor. CHANGELOG.md, "Adapter contract", lists every change.
ADAPTER_CONTRACT_VERSION = "2.3.0"


def required(member):
    """A member every adapter (or state handle) has."""
    member.__contract__ = ("required", ())
    return member


def for_profiles(*profiles: str):
    """A member the cases of these profiles call: required when the adapter claims one of them."""
    def mark(member):
        member.__contract__ = ("profiles", profiles)
        return member
    return mark


def optional(member):
    """A member the suite uses when present and does without otherwise."""
    member.__contract__ = ("optional", ())
    return member


def contract(protocol: type) -> dict[str, tuple[str, tuple[str, ...]]]:
    """Member name -> (kind, profiles) for a protocol class below (attributes are ``required``)."""
    found: dict[str, tuple[str, tuple[str, ...]]] = {name: ("required", ())
                                                     for name in getattr(protocol, "__annotations__", {})}
    for name, member in vars(protocol).items():
        if hasattr(member, "__contract__"):
            found[name] = member.__contract__
    return found


def contract_gaps(cls: type, protocol: type, extra: tuple[str, ...] = ()) -> list[str]:
    """What keeps ``cls`` from following ``protocol``: required members it lacks, and public methods the
    contract (docs/adapters.md) does not describe (``extra`` names members a base class documents)."""
    members = contract(protocol)
    attributes = set(getattr(protocol, "__annotations__", {}))  # may be set per instance, as version often is
    gaps = [f"lacks required {name}" for name, (kind, _) in members.items()
            if kind == "required" and name not in attributes and not hasattr(cls, name)]
    public = {name for name in dir(cls) if not name.startswith("_") and callable(getattr(cls, name, None))}
    gaps += [f"has undocumented member {name}" for name in sorted(public - set(members) - set(extra))]
    return gaps


class StateHandle(Protocol):
    """What ``Adapter.open_state`` returns: one request's retained values."""

    @required
    def run(self, feeds: dict[str, Any]) -> dict[str, Any]:
        """One call with these fresh feeds: every graph output by name."""

    @required
    def values(self) -> dict[str, Any]:
        """The retained values by bound input name, as shared (read-only) views."""

    @required
    def reset(self, initial: dict[str, Any]) -> None:
        """Replace the retained values with these initial values."""

    @required
    def close(self) -> None:
        """Release the retained values; later calls are rejected with STATE_CLOSED."""

    @optional
    def buffer_id(self, value: Any) -> int | None:
        """The identity of the runtime buffer behind a value this state handed out or received, or None
        for a value it does not know (the suite then uses the value's own data address)."""

    @optional
    def run_cancelled(self, feeds: dict[str, Any]) -> dict[str, Any]:
        """``run`` with cancellation requested before it starts: rejected with STATE_CANCELLED."""

    @optional
    def counters(self) -> dict[str, int]:
        """The runtime's own counters for this state since it was opened (docs/testee-protocol.md)."""

    @optional
    def run_held(self, feeds: dict[str, Any], hold: Any) -> dict[str, Any]:
        """``run`` whose model's ``Hold`` nodes park on ``hold`` until the runner releases it
        (conformance/hold.py); needs ``supports_hold = True`` on the adapter."""

    @optional
    def classify(self, exc: BaseException) -> Any:
        """Like ``Adapter.classify``, for this handle's exceptions (tried first)."""


class Adapter(Protocol):
    """A runtime under test, in process."""

    name: str
    version: str

    @required
    def profiles(self) -> set[str]:
        """The profiles the runtime claims (keys of PROFILES); unclaimed profiles are "not supported"."""

    @for_profiles("representation", "affine", "external-data")
    def verify(self, model_bytes: bytes, base_dir: str | None) -> None:
        """Validate a serialized model; ``base_dir`` holds its external files."""

    @for_profiles("affine", "structured", "external-data")
    def decode(self, model_bytes: bytes, value_name: str, base_dir: str | None) -> Any:
        """The logical tensor of the encoded initializer ``value_name`` (a NumPy array)."""

    @for_profiles("representation", "structured")
    def read_fields(self, model_bytes: bytes, value_name: str, base_dir: str | None) -> dict[str, Any]:
        """Generic field access: leaf path -> NumPy array of that leaf's values per record."""

    @for_profiles("representation", "external-data", "export")
    def roundtrip(self, model_bytes: bytes, base_dir: str | None = None) -> bytes:
        """Explicit load then save; ``base_dir`` holds the model's external files."""

    @for_profiles("bindings", "state", "zero-copy", "export", "kv-contiguous", "kv-paged", "decode-e2e", "measured")
    def open_state(self, model_bytes: bytes, initial: dict[str, Any], base_dir: str | None) -> StateHandle:
        """A state over the model's persistent bindings, holding these initial values."""

    @for_profiles("export")
    def export(self, model_bytes: bytes, target: str, base_dir: str | None = None) -> Any:
        """``onnx-light`` or ``onnx``: model bytes; ``onnx-lowered``: (model bytes, [[input, output], ...]);
        ``base_dir`` holds the model's external files."""

    @for_profiles("export")
    def rewrite(self, model_bytes: bytes, rewrite: dict, base_dir: str | None = None) -> bytes:
        """The model after one graph rewrite (rename, remove_output, remove_input, retype_output,
        remove_binding, copy, prune_unused, deduplicate); ``base_dir`` holds the model's external files."""

    @optional
    def classify(self, exc: BaseException) -> Any:
        """Map a native exception to ``Rejected`` or ``NotSupported``; None leaves it a failure."""

    @optional
    def operators(self) -> dict[str, Any]:
        """The operator roles the runtime implements; see docs/testee-protocol.md."""

    @optional
    def shutdown(self) -> None:
        """Called once when a run ends."""


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
        return TesteeAdapter(testee, timeout=timeout)
    spec = spec or "reference"
    spec = BUILTIN.get(spec, spec)
    if spec.startswith("conformance.audit."):  # a fault module retired when faults were regrouped still resolves
        # looked up by name like any adapter module: the audit builds on the adapters, not the reverse
        catalogue = importlib.import_module("conformance.audit.catalogue")
        spec = catalogue.current_spec(spec)
        if spec.rpartition(":")[0] in catalogue.RETIRED_MODULES:
            raise SuiteError(f"adapter {spec!r}: names no fault of the audit catalogue (python -m conformance audit "
                             "--list)")
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
        if module_spec is None or module_spec.loader is None:
            raise SuiteError(f"adapter file {target!r} cannot be loaded as a Python module")
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
    "ADAPTER_CONTRACT_VERSION",
    "BUILTIN",
    "IN_PROCESS_PROFILES",
    "PROFILES",
    "Adapter",
    "NotSupported",
    "Rejected",
    "StateHandle",
    "SuiteError",
    "contract",
    "contract_gaps",
    "for_profiles",
    "optional",
    "required",
    "load_adapter",
]

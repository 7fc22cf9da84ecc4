"""``python -m conformance new-adapter NAME [--lowered]``: a working adapter skeleton and its first
failure list, so a vendor's first full run takes minutes (docs/adapters.md).

The ``--lowered`` skeleton is a standard ONNX runtime on the lowering base whose session runs on onnx's
reference evaluator until the vendor replaces four marked methods; the plain skeleton implements every
adapter member as "not supported" and claims no profile until the vendor fills them in.
"""

from __future__ import annotations

import keyword
import pathlib
import re

from conformance.adapters import SuiteError

LOWERED = '''"""Conformance adapter for {name}: a standard ONNX runtime behind the suite's lowering
(DequantizeLinear for affine values, caller-managed feedback for state). The contract is docs/adapters.md
of onnx-light-conformance.

    python -m conformance run --adapter {module}.py:{cls} --failure-list {name}-failures.txt
    python -m conformance explain CASE_ID --adapter {module}.py:{cls}

As written, the session runs models on onnx's reference evaluator so the first run works: replace the
four methods marked TODO({name}) with {name}'s own calls, then update the failure list
(add --update-failure-list to the run command).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from conformance.adapters import Rejected  # noqa: F401 - raise Rejected("STATE_UNRETAINABLE", ...) in adopt()
from conformance.adapters.lowering import LoweredAdapter
from conformance.values import default_buffer_id


class {cls_base}Session:
    """One stateless ONNX model loaded in {name}. Handles are {name}'s own value objects."""

    def __init__(self, model_bytes: bytes):
        # TODO({name}): load the model bytes in {name} instead of onnx's reference evaluator.
        import onnx
        from onnx.reference import ReferenceEvaluator

        model = onnx.ModelProto()
        model.ParseFromString(model_bytes)
        self.runtime = ReferenceEvaluator(model)
        self.output_names = list(self.runtime.output_names)
        self.ids: dict[int, int | None] = {{}}
        self._keep: list = []  # everything handed out stays alive, so no buffer address is reused

    def adopt(self, value: Any) -> Any:
        # TODO({name}): wrap the caller's array in an input value that shares its memory, and return a
        # value this session returned as it is. If {name} cannot hold the buffer without a copy (a
        # strided or read-only array, say), raise Rejected("STATE_UNRETAINABLE", "why") instead.
        return np.asarray(value)

    def run_handles(self, feeds: dict[str, Any]) -> dict[str, Any]:
        # TODO({name}): one call; return every graph output by name as {name}'s own values.
        return dict(zip(self.output_names, self.runtime.run(None, feeds)))

    def to_numpy(self, handle: Any) -> np.ndarray:
        # TODO({name}): a NumPy array over the output's memory (a copy only if {name} cannot share it;
        # then map the copy to the buffer it came from in self.ids so identity cases see {name}'s buffer).
        array = np.asarray(handle)
        self.ids[id(array)] = default_buffer_id(array)
        self._keep.append((array, handle))
        return array

    def buffer_id(self, value: Any) -> int | None:
        """The {name} buffer behind an array this session returned; None for any other value."""
        return self.ids.get(id(value))


class {cls}(LoweredAdapter):
    name = "{name}"
    version = "0"  # TODO({name}): the runtime's version, e.g. {name}.__version__

    def profiles(self) -> set[str]:
        # Claim only what {name} honestly supports. An operator or a type missing inside a claimed profile
        # is a failure (the report shows it), not "not supported".
        return {{"affine", "state", "zero-copy", "kv-contiguous", "decode-e2e"}}

    def stateless(self, model_bytes: bytes) -> {cls_base}Session:
        return {cls_base}Session(model_bytes)
'''

PLAIN = '''"""Conformance adapter for {name}. The contract is docs/adapters.md of onnx-light-conformance.

    python -m conformance run --adapter {module}.py:{cls} --failure-list {name}-failures.txt
    python -m conformance explain CASE_ID --adapter {module}.py:{cls}

Every member below says "not supported" until it is filled in (TODO({name})). Claim a profile in
profiles() once the members its cases call work: then each missing operator or type in it fails a case
instead. After each step, update the failure list (add --update-failure-list to the run command).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from conformance.adapters import NotSupported, Rejected  # noqa: F401 - raise Rejected(code, message) to reject
from conformance.values import Encoded, Struct  # noqa: F401 - the neutral value types (docs/adapters.md)


class {cls_base}State:
    """One request's retained values (docs/adapters.md, "State handle members")."""

    def run(self, feeds: dict[str, Any]) -> dict[str, Any]:
        # TODO({name}): one call with these fresh feeds; every output by name. Reject a call while another
        # runs with Rejected("STATE_BUSY", ...).
        raise NotSupported("run() is not written yet")

    def values(self) -> dict[str, Any]:
        # TODO({name}): the retained values by bound input name, as read-only shared views.
        raise NotSupported("values() is not written yet")

    def reset(self, initial: dict[str, Any]) -> None:
        # TODO({name}): validate every initial value, then replace the retained values.
        raise NotSupported("reset() is not written yet")

    def close(self) -> None:
        # TODO({name}): release the retained values; later calls are rejected with STATE_CLOSED.
        pass

    def buffer_id(self, value: Any) -> int | None:
        # TODO({name}): the identity of {name}'s buffer behind a value this state handed out or received;
        # None for a value it does not know.
        return None


class {cls}:
    name = "{name}"
    version = "0"  # TODO({name}): the runtime's version

    def profiles(self) -> set[str]:
        # TODO({name}): the profiles {name} claims, e.g. {{"representation", "affine"}} (see PROFILES in
        # conformance/adapters/__init__.py). Unclaimed profiles are "not supported".
        return set()

    def classify(self, exc: BaseException):
        # TODO({name}): map {name}'s exceptions to Rejected(code, message) with the suite's error codes
        # (docs/error-codes.md); a rejection without a code never certifies a profile.
        return None

    def verify(self, model_bytes: bytes, base_dir: str | None) -> None:
        # TODO({name}): validate the serialized model; raise Rejected(code, message) if it is invalid.
        raise NotSupported("verify() is not written yet")

    def decode(self, model_bytes: bytes, value_name: str, base_dir: str | None) -> np.ndarray:
        # TODO({name}): the logical tensor of the encoded initializer value_name.
        raise NotSupported("decode() is not written yet")

    def read_fields(self, model_bytes: bytes, value_name: str, base_dir: str | None) -> dict[str, np.ndarray]:
        # TODO({name}): generic field access: leaf path -> values, one row per record.
        raise NotSupported("read_fields() is not written yet")

    def roundtrip(self, model_bytes: bytes, base_dir: str | None = None) -> bytes:
        # TODO({name}): explicit load then save (base_dir holds the model's external files).
        raise NotSupported("roundtrip() is not written yet")

    def open_state(self, model_bytes: bytes, initial: dict[str, Any], base_dir: str | None = None):
        # TODO({name}): a state over the model's persistent bindings holding these initial values.
        raise NotSupported("open_state() is not written yet")

    def export(self, model_bytes: bytes, target: str, base_dir: str | None = None):
        # TODO({name}): "onnx-light" / "onnx": model bytes; "onnx-lowered": (model bytes, feedback pairs).
        raise NotSupported("export() is not written yet")

    def rewrite(self, model_bytes: bytes, rewrite: dict, base_dir: str | None = None) -> bytes:
        # TODO({name}): the model after one graph rewrite (docs/adapters.md lists the kinds).
        raise NotSupported("rewrite() is not written yet")
'''


def class_base(name: str) -> str:
    return "".join(part[:1].upper() + part[1:] for part in re.split(r"[^A-Za-z0-9]+", name) if part) or "My"


def write(name: str, lowered: bool, directory: str | pathlib.Path = ".") -> tuple[pathlib.Path, str]:
    """Write ``<name>_adapter.py`` and return its path and the adapter spec (``path:Class``)."""
    if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_-]*", name) or keyword.iskeyword(name):
        raise SuiteError(f"adapter name {name!r}: use letters, digits, '_' or '-', starting with a letter")
    module = re.sub(r"\W", "_", name) + "_adapter"
    base = class_base(name)
    path = pathlib.Path(directory) / f"{module}.py"
    if path.exists():
        raise SuiteError(f"{path} already exists; remove it or choose another name")
    text = (LOWERED if lowered else PLAIN).format(name=name, module=module, cls=f"{base}Adapter", cls_base=base)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path, f"{path}:{base}Adapter"


def first_failure_list(spec: str, path: str | pathlib.Path, report_dir: str | pathlib.Path) -> str:
    """Run every case on the new adapter, write its failure list and report; return the summary line."""
    from conformance import SUITE_VERSION, bundle, failure_list, reports
    from conformance.cases import load_cases
    from conformance.runner import RunConfig, run, summary_line

    results, info = run(list(load_cases()), RunConfig(adapter=spec, progress=False))
    failure_list.write(path, results, header=f"Expected failures for {info.adapter['name']} (suite {SUITE_VERSION})")
    entries = failure_list.read(path)
    problems = failure_list.apply(entries, results, [r.id for r in results])
    reports.write_all(report_dir, results, info, problems)
    bundle.write(report_dir, results, info, [{"pattern": e.pattern, "message": e.message} for e in entries])
    return summary_line(results)

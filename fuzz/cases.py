"""A fuzz case (model + operation + payload files + expected verdict) and running it on the oracle.

Operations mirror what an implementation exposes: ``verify`` a model, ``decode`` one encoded value,
read every field of a record layout (``fields``) or one field (``field``), validate persistent
``bindings``, or ``all`` of them. Only ``ContractError`` becomes a verdict; anything else propagates,
because an unclassified exception on any input is itself a finding.
"""

from __future__ import annotations

import base64
import json
import os
import pathlib
import shutil
import tempfile
from dataclasses import dataclass
from dataclasses import field as _field

from reference_impl import ContractError, ErrorCode, verify_model
from reference_impl.bindings import validate_bindings
from reference_impl.decode import decode, decode_value, payload_array, read_fields
from reference_impl.errors import violation
from reference_impl.records import compile_layout

OPS = ("verify", "decode", "fields", "field", "bindings", "all")


@dataclass(frozen=True)
class Verdict:
    """Accepted, or rejected with a stable code (and the path the implementation reported)."""

    ok: bool
    code: str | None = None
    path: str | None = None

    @classmethod
    def accept(cls) -> Verdict:
        return cls(True)

    @classmethod
    def reject(cls, error: ContractError) -> Verdict:
        return cls(False, error.code.value, error.path)

    def __str__(self) -> str:
        return "accept" if self.ok else f"reject {self.code} at {self.path}"


@dataclass
class FuzzCase:
    model: object  # extended ModelProto, or raw bytes
    op: str = "verify"
    name: str = ""  # encoded value for decode/fields/field
    field: str = ""  # record field path for op "field"
    files: dict[str, bytes] = _field(default_factory=dict)
    expected: str | None = None  # the error code a correct implementation reports; None = valid
    rule: str = ""  # which rule a near-valid generator broke, and how
    tags: list[str] = _field(default_factory=list)  # the generator dimensions it carries (fuzz.dimensions)

    def model_bytes(self) -> bytes:
        if isinstance(self.model, (bytes, bytearray)):
            return bytes(self.model)
        return self.model.SerializeToString()

    # ------------------------------------------------------------------ persistence (regressions)
    def to_json(self) -> str:
        return json.dumps({
            "model": base64.b64encode(self.model_bytes()).decode(),
            "op": self.op, "name": self.name, "field": self.field,
            "files": {k: base64.b64encode(v).decode() for k, v in sorted(self.files.items())},
            "expected": self.expected, "rule": self.rule,
        }, indent=1, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> FuzzCase:
        data = json.loads(text)
        return cls(base64.b64decode(data["model"]), data["op"], data.get("name", ""),
                   data.get("field", ""), {k: base64.b64decode(v) for k, v in data.get("files", {}).items()},
                   data.get("expected"), data.get("rule", ""))


class ScratchDir:
    """A directory holding a case's payload files; reused across inputs to keep fuzzing fast.

    It lives in memory (/dev/shm) where the system has it: writing files to disk cost more than running
    the oracle on them. A file already holding the bytes asked for (as this directory wrote them,
    unchanged on disk since: same size, modification time and inode) is not written again: most inputs
    are run twice and many share their files, and writing them dominated a structure-aware input's time."""

    def __init__(self, root: str | None = None):
        memory = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
        self.path = pathlib.Path(root or tempfile.mkdtemp(prefix="fuzz-payloads-", dir=memory))
        self._written: dict[str, tuple[bytes, tuple[int, int, int]]] = {}

    def populate(self, files: dict[str, bytes]) -> str:
        for stale in set(self._written) - set(files):
            target = self.path / stale
            if target.is_file():
                target.unlink()
            del self._written[stale]
        for name, blob in files.items():
            target = self.path / name
            written = self._written.get(name)
            if written is not None and written[0] == blob and written[1] == _stamp(target):
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(blob)
            self._written[name] = (blob, _stamp(target))
        return str(self.path)

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


def _stamp(path: pathlib.Path) -> tuple[int, int, int]:
    """Size, modification time and inode of a file (a file changed or replaced since has another)."""
    try:
        info = path.stat(follow_symlinks=False)
    except OSError:
        return (-1, -1, -1)
    return (info.st_size, info.st_mtime_ns, info.st_ino)


_SCRATCH: ScratchDir | None = None


def scratch() -> ScratchDir:
    global _SCRATCH
    if _SCRATCH is None:
        _SCRATCH = ScratchDir()
    return _SCRATCH


def _model(case: FuzzCase):
    if isinstance(case.model, (bytes, bytearray)):
        return bytes(case.model)
    return case.model


def _value(model, name: str):
    for value in model.graph.encoded_initializer:
        if value.name == name:
            return value
    return None


def execute(case: FuzzCase, base_dir: str | os.PathLike | None) -> dict:
    """Run the case's operation; return what it produced (arrays) or raise ContractError."""
    verified = verify_model(_model(case), base_dir=base_dir)
    model, catalogue = verified.model, verified.catalogue
    out: dict = {}
    if case.op in ("decode",):
        out[case.name] = decode(model, case.name, base_dir=base_dir)
    elif case.op in ("fields", "field"):
        value = _value(model, case.name)
        if value is None:
            raise violation(ErrorCode.VALUE_NOT_FOUND, "model.graph.encoded_initializer",
                            f"no encoded value named {case.name!r}")
        if case.op == "fields":
            out[case.name] = read_fields(value, catalogue, base_dir)
        else:
            payload = payload_array(value, catalogue, base_dir)
            layout = compile_layout(value.struct_type, catalogue)
            out[case.name] = layout.read(payload, case.field)
    elif case.op == "bindings":
        out["bindings"] = validate_bindings(model, catalogue)
    elif case.op == "all":
        for index, value in enumerate(model.graph.encoded_initializer):
            path = f"model.graph.encoded_initializer[{index}]"
            if value.WhichOneof("layout") == "struct_type" and value.struct_type.WhichOneof("kind") != "type_ref":
                out[value.name] = read_fields(value, catalogue, base_dir, path)
            else:
                try:
                    out[value.name] = decode_value(value, catalogue, base_dir, path=path)
                except ContractError as error:
                    if error.code.value != "CONSUMER_MISSING":
                        raise
                    out[value.name] = read_fields(value, catalogue, base_dir, path)
        out["bindings"] = validate_bindings(model, catalogue)
    return out


def run_case(case: FuzzCase, base_dir: str | os.PathLike | None = None) -> tuple[Verdict, dict]:
    """The oracle's verdict on a case (payload files are written to a scratch dir when needed)."""
    if base_dir is None:
        base_dir = scratch().populate(case.files)
    try:
        return Verdict.accept(), execute(case, base_dir)
    except ContractError as error:
        return Verdict.reject(error), {}

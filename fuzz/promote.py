"""``python -m fuzz promote FINDING``: a finding becomes a permanent regression.

Writes ``corpus/regressions/<target>/<id>.bin`` (the input) and ``<id>.json`` (what it hit, and whether
the issue is still open), and appends a conformance case with the stable ID
``Required.<Area>.Fuzz<Target>.F<id>`` to ``corpus/regressions/cases/<area>/fuzz-<target>.toml``, filed
under the spec area of its clause (``conformance.areas``; same manifest format as ``corpus/cases``;
``Recommended`` when the expected code only reflects an implementation limit, see ``LIMIT_CODES``).
``<id>`` is the first 12 hex digits of sha256(target + input), so promoting the same input twice is a no-op.

The case states what a correct implementation must do: near-valid inputs expect their rule's code;
inputs that crashed the oracle need ``--expect CODE`` (the classified error the contract calls for).

A finding is data from elsewhere: it must be a regular file (no link, at most ``MAX_FINDING_BYTES``), the
target and settings recorded next to it are validated (``fuzz.findings_io``, ``fuzz.finding_env``), and
every write lands inside the regressions directory (``fuzz.confined``): new files are created with
``O_EXCL``, nothing is followed through a link, and no recorded name chooses a path.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import json
import os
import pathlib

from conformance.areas import BY_NAME, Area, area_of_clause
from conformance.locations import corpus_dir
from fuzz.confined import Confined, WriteError, check_name
from fuzz.finding_env import finding_context, replay_environment
from fuzz.findings_io import MAX_FINDING_BYTES, MAX_RECORD_BYTES, FindingsError, read_file
from fuzz.replay import ReplayWorker
from reference_impl.cli_paths import default_under_cwd, user_path
from reference_impl.errors import LIMIT_CODES

#: The project's own regressions (what ``promote_case`` and tests/test_fuzz_regressions.py use).
REGRESSIONS = pathlib.Path(os.environ.get("FUZZ_REGRESSIONS_DIR") or corpus_dir() / "regressions")
_PROFILE_BY_PREFIX = (("AFFINE_", "affine"), ("EXTERNAL_", "external-data"), ("PAYLOAD_BOTH", "external-data"),
                      ("PAYLOAD_LOCATION", "external-data"), ("BINDING_", "bindings"),
                      ("DECODER_", "structured"), ("CONSUMER_", "structured"), ("FIELD_NOT", "structured"),
                      ("VALUE_NOT", "structured"), ("LOGICAL_SHAPE", "structured"))


def case_level(code: str | None) -> str:
    """A case expecting a limit code is Recommended: another runtime may accept the input."""
    return "Recommended" if code in LIMIT_CODES else "Required"


def stable_id(target: str, data: bytes) -> str:
    return hashlib.sha256(target.encode() + b"\0" + data).hexdigest()[:12]


def default_regressions() -> pathlib.Path:
    """Where ``python -m fuzz promote`` writes without ``--regressions-dir``: ``$FUZZ_REGRESSIONS_DIR``, or
    ``corpus/regressions`` of the current directory (run it from the project root to add to the project's
    corpus), never the installed package's tree."""
    configured = os.environ.get("FUZZ_REGRESSIONS_DIR")
    return user_path(configured) if configured else default_under_cwd("corpus", "regressions")


def case_for(target: str, data: bytes):
    """The conformance-expressible case behind an input, or None (state/property inputs)."""
    from fuzz.cases import FuzzCase

    if target == "verify":
        return FuzzCase(data)
    if target == "structured":
        from fuzz.targets.structured import build

        generated, case = build(data)
        return case if case is not None else FuzzCase(generated.model, "verify", files=generated.files)
    if target == "differential":
        from fuzz.targets.differential import case_for as differential_case

        return differential_case(data)
    return None


def _profile(code: str | None) -> str:
    for prefix, profile in _PROFILE_BY_PREFIX:
        if code and code.startswith(prefix):
            return profile
    return "representation"


def _toml_string(text: str) -> str:
    if "'''" not in text:
        return "'''\n" + text + "'''"
    return '"""\n' + text.replace("\\", "\\\\").replace('"""', '\\"""') + '"""'


def manifest_entry(case_id: str, case, expected: str | None, note: str, clause: str | None = None,
                   profile: str | None = None) -> str | None:
    """A ``[[case]]`` table, or None when the model cannot be written as text faithfully."""
    from reference_impl import schema
    from reference_impl.errors import ErrorCode

    try:
        model = schema.parse_model(case.model_bytes())
        text = schema.to_text(model)
        if schema.parse_text(text, "ModelProto").SerializeToString() != model.SerializeToString():
            return None
    except Exception:  # noqa: BLE001 - unparseable or not representable in text format
        return None
    op = {"decode": "decode", "fields": "fields"}.get(case.op, "verify")
    clause = clause or (ErrorCode(expected).clause if expected else "WIRE-FIELDS")
    lines = ["[[case]]", f'id = "{case_id}"', f'clause = ["{clause}"]', f'op = "{op}"',
             f'profile = "{profile or _profile(expected)}"', 'expectation_source = "hand"',
             f"description = {json.dumps(note or case.rule or 'fuzz regression')}"]
    if op != "verify":
        lines.append(f"value = {json.dumps(case.name)}")
    lines.append(f'expect = {{ error = "{expected}" }}' if expected else "expect = { accepted = true }")
    for relative, blob in sorted(case.files.items()):
        lines.append(f'files.{json.dumps(relative)} = {{ hex = "{blob.hex()}" }}')
    lines.append("model_text = " + _toml_string(text))
    return "\n".join(lines) + "\n"


def _area(expected: str | None, clause: str | None = None) -> Area:
    """The spec area a regression is filed under: that of the clause its expected code enforces."""
    from reference_impl.errors import ErrorCode

    clause = clause or (ErrorCode(expected).clause if expected else "WIRE-FIELDS")
    return area_of_clause(clause) or BY_NAME["Wire"]


def promote(finding: str | os.PathLike[str], target: str | None = None,
            cases_dir: str | os.PathLike[str] | None = None, note: str = "", expect: str | None = None,
            status: str | None = None, regressions: str | os.PathLike[str] | None = None,
            subject: str | None = None, testee: str | None = None, fault: str | None = None) -> dict:
    """Write the regression of one finding (see the module docstring). Raises FindingsError, WriteError
    or ReplayError with a one-line message."""
    path = user_path(finding)
    data = read_file(path, str(path), MAX_FINDING_BYTES)
    context = finding_context(path)
    target = target or context.target
    if not target:
        raise FindingsError("cannot tell the finding's target: pass --target")
    environment = replay_environment(context.settings, context.testee, subject, testee, fault)
    worker = ReplayWorker(target, environment=environment)
    try:
        result = worker.run(data)
    finally:
        worker.close()
    ident = stable_id(target, data)
    case = case_for(target, data)
    expected = expect or (case.expected if case is not None else None)
    meta = {
        "id": ident, "target": target, "created": dt.date.today().isoformat(),
        "reproduces": not result.get("ok"), "kind": result.get("kind"), "signature": result.get("signature"),
        "detail": result.get("detail"), "known_issue": result.get("known"), "expect": expected, "note": note,
        "status": status or ("open" if not result.get("ok") else "fixed"), "environment": environment,
    }
    area = _area(expected)
    case_id = f"{case_level(expected)}.{area.name}.Fuzz{target.capitalize()}.F{ident}"
    entry = None
    if case is not None and (expected or case.expected is None):
        entry = manifest_entry(case_id, case, expected, note)
    root_path = user_path(regressions) if regressions is not None else default_regressions()
    with Confined.open(root_path) as root, root.subdirectory(check_name(target)) as folder:
        # Everything is checked before anything is written: a link or a stray file refuses the promotion.
        present = folder.read(f"{ident}.bin", MAX_FINDING_BYTES)
        if present is not None and present != data:
            raise WriteError(f"{folder.path / ident}.bin exists with other bytes: nothing was promoted")
        record_present = folder.read(f"{ident}.json", MAX_RECORD_BYTES) is not None
        manifests = None
        if entry is not None:
            cases_root = Confined.open(user_path(cases_dir)) if cases_dir is not None else root.subdirectory("cases")
            with cases_root:
                manifests = cases_root.subdirectory(area.folder)
        with manifests or contextlib.nullcontext():
            manifest = _manifest_text(manifests, target, case_id, entry) if manifests is not None else None
            folder.create(f"{ident}.bin", data)
            if not record_present:
                folder.create(f"{ident}.json", (json.dumps(meta, indent=1) + "\n").encode())
            written = None
            if manifests is not None:
                if manifest is not None:
                    manifests.replace(f"fuzz-{target}.toml", manifest.encode())
                written = str(manifests.path / f"fuzz-{target}.toml")
        shown_folder = folder.path
    print(f"regression {shown_folder / ident}.bin ({meta['signature'] or 'no finding'}, {meta['status']})")
    print(f"conformance case {case_id}: {written or 'not expressible as a text case (see docs/fuzzing.md)'}")
    return {"id": ident, "case_id": case_id, "manifest": written, **meta}


def _manifest_text(manifests: Confined, target: str, case_id: str, entry: str) -> str | None:
    """The manifest ``fuzz-<target>.toml`` with ``entry`` added, or None when a case of that ID is there."""
    return _with_case(manifests, f"fuzz-{target}.toml",
                      f"# Fuzz regressions of the {target} target, written by `python -m fuzz promote`.\n",
                      case_id, entry)


def _with_case(manifests: Confined, name: str, header: str, case_id: str, entry: str) -> str | None:
    """The text of the manifest ``name`` (started with ``header`` when absent) with ``entry`` appended, or
    None when a case of that ID is there already. A link or a file that is not UTF-8 is refused."""
    existing = manifests.read(name, MAX_RECORD_BYTES)
    try:
        text = existing.decode("utf-8") if existing is not None else header
    except UnicodeDecodeError:
        raise WriteError(f"{manifests.path / name} is not UTF-8 text: no case was added") from None
    return None if f'id = "{case_id}"' in text else text + "\n" + entry


def promote_case(case, name: str, note: str, status: str = "open", issue: str | None = None,
                 clause: str | None = None, profile: str | None = None,
                 fields_hex: dict[str, str] | None = None) -> pathlib.Path:
    """An oracle-level regression: a ``FuzzCase`` with the verdict a correct implementation gives
    (``corpus/regressions/oracle/<name>.json``), plus its conformance case when text-expressible.
    ``fields_hex`` pins the exact bytes generic field access must return for some fields."""
    with Confined.open(REGRESSIONS) as root:
        with root.subdirectory("oracle") as folder:
            record = {"name": name, "note": note, "status": status, "known_issue": issue,
                      "created": dt.date.today().isoformat(), "case": json.loads(case.to_json())}
            if fields_hex:
                record["fields_hex"] = fields_hex
            folder.replace(check_name(f"{name}.json"), (json.dumps(record, indent=1) + "\n").encode())
            path = folder.path / f"{name}.json"
        area = _area(case.expected, clause)
        case_id = f"{case_level(case.expected)}.{area.name}.FuzzOracle.{name.replace('-', '_')}"
        entry = None if fields_hex else manifest_entry(case_id, case, case.expected, note, clause, profile)
        if entry is not None:
            with root.subdirectory("cases") as cases_root, cases_root.subdirectory(area.folder) as manifests:
                text = _with_case(manifests, "fuzz-oracle.toml", "# Oracle regressions found by fuzzing, written "
                                                                 "by fuzz.promote.promote_case.\n", case_id, entry)
                if text is not None:
                    manifests.replace("fuzz-oracle.toml", text.encode())
    return path

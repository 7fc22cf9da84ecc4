"""``python -m fuzz promote FINDING``: a finding becomes a permanent regression.

Writes ``corpus/regressions/<target>/<id>.bin`` (the input) and ``<id>.json`` (what it hit, and whether
the issue is still open), and appends a conformance case with the stable ID
``Required.Fuzz.<Target>.F<id>`` to ``corpus/regressions/cases/fuzz-<target>.toml`` (same manifest
format as ``corpus/cases``; ``Recommended`` when the expected code only reflects an implementation
limit, see ``LIMIT_CODES``). ``<id>`` is the first 12 hex digits of sha256(target + input), so
promoting the same input twice is a no-op.

The case states what a correct implementation must do: near-valid inputs expect their rule's code;
inputs that crashed the oracle need ``--expect CODE`` (the classified error the contract calls for).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import pathlib

from fuzz.replay import ReplayWorker
from reference_impl.errors import LIMIT_CODES

ROOT = pathlib.Path(__file__).resolve().parents[1]
REGRESSIONS = pathlib.Path(os.environ.get("FUZZ_REGRESSIONS_DIR") or ROOT / "corpus" / "regressions")
_PROFILE_BY_PREFIX = (("AFFINE_", "affine"), ("EXTERNAL_", "external-data"), ("PAYLOAD_BOTH", "external-data"),
                      ("PAYLOAD_LOCATION", "external-data"), ("BINDING_", "bindings"),
                      ("DECODER_", "structured"), ("CONSUMER_", "structured"), ("FIELD_NOT", "structured"),
                      ("VALUE_NOT", "structured"), ("LOGICAL_SHAPE", "structured"))


def case_level(code: str | None) -> str:
    """A case expecting a limit code is Recommended: another runtime may accept the input."""
    return "Recommended" if code in LIMIT_CODES else "Required"


def stable_id(target: str, data: bytes) -> str:
    return hashlib.sha256(target.encode() + b"\0" + data).hexdigest()[:12]


def _context(path: pathlib.Path) -> dict:
    """The target and campaign environment recorded next to a finding (triage.json or report.json)."""
    for folder in (path.parent, path.parent.parent):
        for name in ("triage.json", "report.json"):
            candidate = folder / name
            if candidate.is_file():
                data = json.loads(candidate.read_text())
                entry = data[0] if isinstance(data, list) and data else data
                if isinstance(entry, dict) and entry.get("target"):
                    return entry
    return {}


def _target_for(path: pathlib.Path, target: str | None) -> str:
    target = target or _context(path).get("target")
    if not target:
        raise SystemExit("cannot tell the finding's target: pass --target")
    return target


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


def promote(finding: str, target: str | None = None, cases_dir: str | None = None, note: str = "",
            expect: str | None = None, status: str | None = None) -> dict:
    path = pathlib.Path(finding)
    data = path.read_bytes()
    target = _target_for(path, target)
    environment = _context(path).get("environment", {})
    worker = ReplayWorker(target, environment=environment)
    try:
        result = worker.run(data)
    finally:
        worker.close()
    ident = stable_id(target, data)
    folder = REGRESSIONS / target
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{ident}.bin").write_bytes(data)
    case = case_for(target, data)
    expected = expect or (case.expected if case is not None else None)
    meta = {
        "id": ident, "target": target, "created": dt.date.today().isoformat(),
        "reproduces": not result.get("ok"), "kind": result.get("kind"), "signature": result.get("signature"),
        "detail": result.get("detail"), "known_issue": result.get("known"), "expect": expected, "note": note,
        "status": status or ("open" if not result.get("ok") else "fixed"), "environment": environment,
    }
    (folder / f"{ident}.json").write_text(json.dumps(meta, indent=1) + "\n")
    case_id = f"{case_level(expected)}.Fuzz.{target.capitalize()}.F{ident}"
    written = None
    if case is not None and (expected or case.expected is None):
        entry = manifest_entry(case_id, case, expected, note)
        if entry is not None:
            manifest_dir = pathlib.Path(cases_dir) if cases_dir else REGRESSIONS / "cases"
            manifest_dir.mkdir(parents=True, exist_ok=True)
            manifest = manifest_dir / f"fuzz-{target}.toml"
            existing = manifest.read_text() if manifest.is_file() else \
                f"# Fuzz regressions of the {target} target, written by `python -m fuzz promote`.\n"
            if f'id = "{case_id}"' not in existing:
                manifest.write_text(existing + "\n" + entry)
            written = str(manifest)
    print(f"regression {folder / ident}.bin ({meta['signature'] or 'no finding'}, {meta['status']})")
    print(f"conformance case {case_id}: {written or 'not expressible as a text case (see docs/fuzzing.md)'}")
    return {"id": ident, "case_id": case_id, "manifest": written, **meta}


def promote_case(case, name: str, note: str, status: str = "open", issue: str | None = None,
                 clause: str | None = None, profile: str | None = None,
                 fields_hex: dict[str, str] | None = None) -> pathlib.Path:
    """An oracle-level regression: a ``FuzzCase`` with the verdict a correct implementation gives
    (``corpus/regressions/oracle/<name>.json``), plus its conformance case when text-expressible.
    ``fields_hex`` pins the exact bytes generic field access must return for some fields."""
    folder = REGRESSIONS / "oracle"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.json"
    record = {"name": name, "note": note, "status": status, "known_issue": issue,
              "created": dt.date.today().isoformat(), "case": json.loads(case.to_json())}
    if fields_hex:
        record["fields_hex"] = fields_hex
    path.write_text(json.dumps(record, indent=1) + "\n")
    case_id = f"{case_level(case.expected)}.Fuzz.Oracle.{name.replace('-', '_')}"
    entry = None if fields_hex else manifest_entry(case_id, case, case.expected, note, clause, profile)
    if entry is not None:
        manifest = REGRESSIONS / "cases" / "fuzz-oracle.toml"
        manifest.parent.mkdir(parents=True, exist_ok=True)
        existing = manifest.read_text() if manifest.is_file() else \
            "# Oracle regressions found by fuzzing, written by fuzz.promote.promote_case.\n"
        if f'id = "{case_id}"' not in existing:
            manifest.write_text(existing + "\n" + entry)
    return path

"""Who ran what: a bundle's claim as an in-toto Statement v1 in a DSSE envelope, signed with Ed25519.

Every digest in a bundle can be recomputed by whoever edits it, so digests alone prove nothing about who
ran the cases. The signature does: ``sign`` wraps an in-toto Statement whose subjects are the bundle's
files (by SHA-256) and whose predicate is the certificate (per-profile verdicts, suite, corpus, runtime),
in a DSSE envelope signed with the vendor's Ed25519 key; ``verify`` accepts it only under a public key
the verifier trusts, and only when every subject still matches the file it names.

Formats: in-toto Statement v1 (``_type`` ``https://in-toto.io/Statement/v1``), DSSE v1 with the
pre-authentication encoding ``DSSEv1 <len> <type> <len> <payload>``, and the predicate type
``PREDICATE_TYPE`` documented in docs/conformance.md. All cryptography is the ``cryptography`` package's.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import pathlib
from typing import Any

from conformance.bundle_files import BundleError, expect, field, parse_json, read_bytes

ENVELOPE = "attestation.dsse.json"
PAYLOAD_TYPE = "application/vnd.in-toto+json"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://onnx-light.dev/conformance/certificate/v1"
#: The manifest's entries the predicate carries (the per-case verdicts stay in the subject files).
PREDICATE_KEYS = ("suite", "spec", "runner", "corpus", "selection", "adapter", "machine", "profiles", "totals",
                  "waivers")
MAX_KEY_BYTES = 64 * 1024


class AttestationError(BundleError):
    """A key or envelope that cannot be used; one line."""


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE's pre-authentication encoding: what is actually signed."""
    kind = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(kind), kind, len(payload), payload)


def statement(manifest: dict, subjects: dict[str, str]) -> dict:
    """The in-toto Statement of a bundle: its files by digest, and the certificate as predicate."""
    return {"_type": STATEMENT_TYPE,
            "subject": [{"name": name, "digest": {"sha256": digest}} for name, digest in sorted(subjects.items())],
            "predicateType": PREDICATE_TYPE,
            "predicate": {key: manifest[key] for key in PREDICATE_KEYS if key in manifest}}


def key_id(public_key: Any) -> str:
    """SHA-256 of the raw 32-byte Ed25519 public key, in hex: names the key in the envelope."""
    from cryptography.hazmat.primitives import serialization

    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()


def generate_key(private_path: str | os.PathLike, public_path: str | os.PathLike) -> str:
    """Write a new Ed25519 key pair (PEM; the private file created 0600, never over an existing file or
    through a link) and return its key ID."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    private = Ed25519PrivateKey.generate()
    _write_new(private_path, private.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                   serialization.NoEncryption()), 0o600)
    _write_new(public_path, private.public_key().public_bytes(serialization.Encoding.PEM,
                                                              serialization.PublicFormat.SubjectPublicKeyInfo), 0o644)
    return key_id(private.public_key())


def _write_new(path: str | os.PathLike, data: bytes, mode: int) -> None:
    try:
        pathlib.Path(path).parent.mkdir(parents=True, exist_ok=True)
        handle = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    except OSError as error:
        raise AttestationError(f"{path}: cannot create a new file ({error.strerror})") from None
    with os.fdopen(handle, "wb") as out:
        out.write(data)


def load_private_key(path: str | os.PathLike) -> Any:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    return _load_key(path, lambda data: serialization.load_pem_private_key(data, password=None),
                     Ed25519PrivateKey, "an unencrypted PEM private key", "an Ed25519 key")


def load_public_key(path: str | os.PathLike) -> Any:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    return _load_key(path, serialization.load_pem_public_key, Ed25519PublicKey, "a PEM public key",
                     "an Ed25519 public key")


def _load_key(path: str | os.PathLike, parse: Any, kind: type, format_name: str, kind_name: str) -> Any:
    """The key at ``path`` parsed by ``parse``; an ``AttestationError`` unless it is a ``kind``."""
    try:
        key = parse(_read_key_file(path))
    except (ValueError, TypeError) as error:
        raise AttestationError(f"{path}: not {format_name} ({error})") from None
    if not isinstance(key, kind):
        raise AttestationError(f"{path}: not {kind_name}")
    return key


def _read_key_file(path: str | os.PathLike) -> bytes:
    target = pathlib.Path(path)
    try:
        return read_bytes(target.parent, target.name, MAX_KEY_BYTES)
    except BundleError as error:
        raise AttestationError(f"key {path}: {error}") from None


def sign(manifest: dict, subjects: dict[str, str], private_key: Any) -> dict:
    """A DSSE envelope over the bundle's Statement, signed by ``private_key``."""
    payload = json.dumps(statement(manifest, subjects), sort_keys=True, separators=(",", ":")).encode()
    signature = private_key.sign(pae(PAYLOAD_TYPE, payload))
    return {"payloadType": PAYLOAD_TYPE, "payload": base64.b64encode(payload).decode(),
            "signatures": [{"keyid": key_id(private_key.public_key()), "sig": base64.b64encode(signature).decode()}]}


def verify(envelope: Any, trusted: list[Any]) -> tuple[dict, str]:
    """The Statement inside ``envelope`` and the ID of the trusted key that signed it; an
    ``AttestationError`` unless a signature by one of ``trusted`` checks out over the exact payload."""
    from cryptography.exceptions import InvalidSignature

    expect(envelope, dict, ENVELOPE)
    if field(envelope, "payloadType", str, ENVELOPE) != PAYLOAD_TYPE:
        raise AttestationError(f"{ENVELOPE}: payloadType is not {PAYLOAD_TYPE}")
    payload = _b64(field(envelope, "payload", str, ENVELOPE), f"{ENVELOPE}.payload")
    signatures = field(envelope, "signatures", list, ENVELOPE)
    for index, entry in enumerate(signatures[:16]):
        where = f"{ENVELOPE}.signatures[{index}]"
        expect(entry, dict, where)
        signature = _b64(field(entry, "sig", str, where), f"{where}.sig")
        for key in trusted:
            try:
                key.verify(signature, pae(PAYLOAD_TYPE, payload))
            except InvalidSignature:
                continue
            return _statement(payload), key_id(key)
    raise AttestationError(f"{ENVELOPE}: no signature by a trusted key ({len(signatures)} signature(s), "
                           f"{len(trusted)} trusted key(s))")


def _statement(payload: bytes) -> dict:
    value = parse_json(payload, f"{ENVELOPE} payload")
    expect(value, dict, "the statement")
    if value.get("_type") != STATEMENT_TYPE:
        raise AttestationError(f"the statement's _type is not {STATEMENT_TYPE}")
    if value.get("predicateType") != PREDICATE_TYPE:
        raise AttestationError(f"the statement's predicateType is not {PREDICATE_TYPE}")
    expect(field(value, "predicate", dict, "the statement"), dict, "the statement's predicate")
    for index, subject in enumerate(field(value, "subject", list, "the statement")):
        where = f"the statement's subject[{index}]"
        expect(subject, dict, where)
        field(subject, "name", str, where)
        field(field(subject, "digest", dict, where), "sha256", str, f"{where}.digest")
    return value


def subjects_of(statement_value: dict) -> dict[str, str]:
    return {s["name"]: s["digest"]["sha256"] for s in statement_value["subject"]}


def _b64(text: str, where: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise AttestationError(f"{where} is not base64") from None

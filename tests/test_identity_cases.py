"""Identity cases (corpus/cases/<area>/cached_identity.toml): a second value or declaration differing from an
accepted one in one part of its identity is judged afresh, within one model and across two models opened
by the same runtime. Each faulty runtime below is the reference with a cache keyed on too little: what it
returns for a hit is what the runtime would compute from the entry it cached, simulated by handing the
reference the cached layout or declaration in place of the new one."""

from __future__ import annotations

import functools

import pytest

from conformance.adapters.reference import ReferenceAdapter
from conformance.cases import load_cases
from conformance.execute import FAILED, PASSED, run_case
from reference_impl import schema

#: the manifests the identity cases were filed in, one per area
_SOURCES = tuple(f"cases/{area}/cached_identity.toml"
                 for area in ("affine", "catalogue", "declarations", "encoding", "structured"))


@functools.cache
def _cases() -> dict:
    return {case.id: case for case in load_cases() if case.source in _SOURCES}


class _Caching(ReferenceAdapter):
    """The reference behind a cache that lives as long as the adapter (every model it opens)."""

    def __init__(self) -> None:
        super().__init__()
        self.memory: dict = {}

    def _seen(self, model_bytes: bytes) -> bytes:
        model = schema.parse_model(bytes(model_bytes))
        self.substitute(model)
        return model.SerializeToString()

    def substitute(self, model) -> None:
        raise NotImplementedError

    def open_state(self, model_bytes, initial, base_dir=None):
        return super().open_state(self._seen(model_bytes), initial, base_dir)

    def verify(self, model_bytes, base_dir=None):
        return super().verify(self._seen(model_bytes), base_dir)


class AffineDecodedCache(_Caching):
    """Decoded affine values cached under a key that leaves out ``ignore`` (``layout``: the key is the
    payload and logical type only; ``name``: the initializer's name alone)."""

    def __init__(self, ignore: str) -> None:
        super().__init__()
        self.ignore = ignore

    def _key(self, value):
        if self.ignore == "name":
            return value.name
        layout = schema.EncodedValueProto()
        layout.CopyFrom(value)
        layout.name = ""
        affine = layout.affine
        if self.ignore == "layout":
            layout.ClearField("affine")
        elif self.ignore == "scale":
            del affine.scale.float_data[:]
        elif self.ignore == "zero_point":
            affine.zero_point.ClearField("int32_data")
        elif self.ignore in ("axis", "storage_type"):
            affine.ClearField(self.ignore)
        elif self.ignore == "logical_type":
            layout.ClearField("logical_type")
        return layout.SerializeToString(deterministic=True)

    def substitute(self, model) -> None:
        for value in model.graph.encoded_initializer:
            if value.WhichOneof("layout") != "affine":
                continue
            key = self._key(value)
            if key in self.memory:  # the decoded entry is the cached value's: its layout, shape and codes
                name = value.name
                value.CopyFrom(self.memory[key])
                value.name = name
            else:
                self.memory[key] = type(value)()
                self.memory[key].CopyFrom(value)


class DeclarationCache(_Caching):
    """Verified declarations (and the layouts and decoder bindings compiled from them) cached by
    ``type_id`` or by ``name`` across models."""

    def __init__(self, key: str) -> None:
        super().__init__()
        self.key = key

    def substitute(self, model) -> None:
        for declaration in model.struct_types:
            key = getattr(declaration, self.key)
            if not key:
                continue
            if key in self.memory:
                type_id = declaration.type_id
                declaration.CopyFrom(self.memory[key])
                declaration.type_id = type_id
            else:
                self.memory[key] = type(declaration)()
                self.memory[key].CopyFrom(declaration)


P = "Required."
PARTS = ("Scale", "ZeroPoint", "Axis", "StorageType", "LogicalShape")
SCOPES = ("ValueIdentity", "ModelScope")
SAME_TYPE_ID = {P + "Catalogue.ModelScope.UnresolvedFieldSameTypeId",
                P + "Declarations.ModelScope.FieldContentMissingSameTypeId",
                P + "Encoding.ModelScope.RecordSizeSameTypeId", P + "Structured.ModelScope.DecoderConstantSameTypeId"}
SAME_NAME = {P + "Catalogue.ModelScope.UnresolvedFieldSameName",
             P + "Catalogue.DeclarationIdentity.UnresolvedFieldSameName",
             P + "Declarations.DeclarationIdentity.FieldContentMissingSameName",
             P + "Encoding.DeclarationIdentity.RecordSizeSameName"}
CATCHERS = {
    "payload": (lambda: AffineDecodedCache("layout"),
                {P + f"Affine.{scope}.{part}" for scope in SCOPES for part in PARTS if part != "LogicalShape"}),
    "name": (lambda: AffineDecodedCache("name"), {P + f"Affine.ModelScope.{part}" for part in PARTS}),
    **{f"no-{ignore}": (functools.partial(AffineDecodedCache, ignore),
                        {P + f"Affine.{scope}.{part}" for scope in SCOPES})
       for ignore, part in (("scale", "Scale"), ("zero_point", "ZeroPoint"), ("axis", "Axis"),
                            ("storage_type", "StorageType"), ("logical_type", "LogicalShape"))},
    "declaration-by-type-id": (lambda: DeclarationCache("type_id"), SAME_TYPE_ID),
    "declaration-by-name": (lambda: DeclarationCache("name"), SAME_TYPE_ID | SAME_NAME),
}


@pytest.mark.parametrize("case_id", sorted(_cases()))
def test_the_reference_passes(case_id):
    result = run_case(_cases()[case_id], ReferenceAdapter(), require_codes=True)
    assert result.verdict == PASSED, result.message


@pytest.mark.parametrize("label", sorted(CATCHERS))
def test_a_cache_keyed_on_too_little_fails_exactly_its_cases(label):
    make, caught = CATCHERS[label]
    failed = {case_id for case_id, case in _cases().items() if run_case(case, make()).verdict == FAILED}
    assert failed == caught


def test_every_case_is_caught():
    assert set(_cases()) == set().union(*(caught for _, caught in CATCHERS.values()))

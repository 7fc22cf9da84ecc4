"""Decoders keyed by ``type_id`` that verify the resolved declaration before binding.

A registration pins the layout signature it was written for (field paths, leaf types and bit positions,
constant types and shapes). A model that reuses the ID for a different declaration is refused with
DECODER_MISMATCH instead of being misread. Only the root type's decoder is consulted; nested
references contribute layout and constants, never their own decoder.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from reference_impl import schema
from reference_impl.errors import ErrorCode as E
from reference_impl.errors import violation
from reference_impl.records import RecordLayout, compile_layout
from reference_impl.structs import Catalogue

DecodeFn = Callable[[RecordLayout, np.ndarray], np.ndarray]


@dataclass(frozen=True)
class Decoder:
    name: str
    signature: tuple
    decode: DecodeFn


class DecoderRegistry:
    """Maps type_id -> decoder; ``bind`` checks the model's declaration against the registration."""

    def __init__(self) -> None:
        self._decoders: dict[int, Decoder] = {}

    def register(self, type_id: int, name: str, declaration_catalogue: list, decode: DecodeFn) -> None:
        """Register ``decode`` for ``type_id`` as declared in ``declaration_catalogue`` (StructTypeProtos)."""
        catalogue = Catalogue(declaration_catalogue)
        catalogue.check_all()
        root = schema.StructTypeProto(type_ref=type_id)
        declaration, _ = catalogue.lookup(type_id, "registration")
        signature = (compile_layout(root, catalogue).signature(), _codec_identity(declaration))
        self._decoders[type_id] = Decoder(name, signature, decode)

    def __contains__(self, type_id: int) -> bool:
        return type_id in self._decoders

    def bind(self, type_id: int, layout: RecordLayout, path: str, declaration=None) -> Decoder:
        """The decoder for ``type_id`` after checking the model's resolved declaration against the
        registration: same layout, same constants, same declared decoder/encoder."""
        decoder = self._decoders.get(type_id)
        if decoder is None:
            raise violation(E.CONSUMER_MISSING, path, f"no decoder or registered consumer for type_id {type_id}")
        identity = _codec_identity(declaration) if declaration is not None else decoder.signature[1]
        if decoder.signature != (layout.signature(), identity):
            raise violation(E.DECODER_MISMATCH, path,
                            f"decoder {decoder.name} was registered for a different declaration of {type_id}")
        return decoder


def _codec_identity(declaration) -> tuple:
    """The declared decoder and encoder functions (domain, name) of a root declaration."""
    return tuple((fn.domain, fn.name) if declaration.HasField(field) else None
                 for field, fn in (("decoder", declaration.decoder), ("encoder", declaration.encoder)))


# ----------------------------------------------------------------------------- the spec's decoders
def decode_int4_block(layout: RecordLayout, payload: np.ndarray) -> np.ndarray:
    """Int4Block (2001): signed codes times the record's scale, blocks flattened in storage order."""
    codes = layout.read(payload, "codes").astype(np.float32)
    scale = layout.read(payload, "scale").astype(np.float32)
    return (codes * scale[:, None]).reshape(-1)


def _field_or_constant(layout: RecordLayout, payload: np.ndarray, path: str) -> np.ndarray:
    """A per-record value from the payload, or the declaration's constant broadcast to every record."""
    if path in layout.leaves:
        return layout.read(payload, path).reshape(-1)
    return np.asarray(layout.constant(path)).reshape(-1)[:1]


def decode_linear_int4(layout: RecordLayout, payload: np.ndarray) -> np.ndarray:
    """DecodeLinearInt4 (1002/1003): (code - zero_point) * scale, parameters per record or constant."""
    codes = layout.read(payload, "values").astype(np.float32)
    scale = _field_or_constant(layout, payload, "scale").astype(np.float32)
    zero_point = _field_or_constant(layout, payload, "zero_point").astype(np.float32)
    return ((codes - zero_point[:, None]) * scale[:, None]).reshape(-1)


def decode_scaled_codebook(layout: RecordLayout, payload: np.ndarray) -> np.ndarray:
    """DecodeScaledCodebookBlocks (1102): record.scale * codebook[record.quantized.codes[i].index]."""
    table = layout.constant("quantized.codebook").astype(np.float32).reshape(-1)
    index = layout.read(payload, "quantized.codes.index").astype(np.intp)
    scale = layout.read(payload, "scale").astype(np.float32)
    return (scale[:, None] * table[index]).reshape(-1)


def spec_catalogue() -> list:
    """The declarations of the spec's worked examples (2001, 1002, 1003, 1101, 1102)."""
    from reference_impl.examples import spec_struct_types

    return spec_struct_types()


def default_registry() -> DecoderRegistry:
    """A registry with the decoders of the spec's worked examples."""
    registry = DecoderRegistry()
    declarations = spec_catalogue()
    registry.register(2001, "Int4Block", declarations, decode_int4_block)
    registry.register(1002, "DecodeLinearInt4", declarations, decode_linear_int4)
    registry.register(1003, "DecodeLinearInt4", declarations, decode_linear_int4)
    registry.register(1102, "DecodeScaledCodebookBlocks", declarations, decode_scaled_codebook)
    return registry

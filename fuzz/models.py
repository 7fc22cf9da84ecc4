"""The generated models the fuzz targets use: a valid model (``fuzz.gen``) finished with a near-duplicate
value and the caller buffer layouts its values are decoded into (``fuzz.twins``), which build on the
generator's records and arithmetic and so come after it."""

from __future__ import annotations

from fuzz import gen, twins
from fuzz.source import Source


def gen_model(src: Source, max_values: int = 6) -> gen.Generated:
    """A valid model with its expectations, a twin of one of its values and its values' ``out=`` layouts."""
    generated = gen.gen_plain_model(src, max_values)
    twins.gen_twin(src, generated)
    twins.gen_out_layouts(src, generated)
    return generated

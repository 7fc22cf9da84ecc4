"""Hypothesis strategies over the shared generators, and the settings profiles the suite uses.

Every strategy drives ``fuzz.gen`` / ``fuzz.mutators`` through a ``HypothesisSource``, so what
Hypothesis shrinks is the sequence of generator choices: a failing model shrinks towards fewer
declarations, fewer records and smaller shapes.

Profiles: ``fuzz-ci`` (few examples, used by default in tests), ``fuzz-dev`` and ``fuzz-nightly``.
Select one with ``FUZZ_PROFILE=fuzz-nightly``; ``profile()`` returns the active settings object so
test modules apply it per test instead of changing Hypothesis' global default.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from fuzz import gen, models, mutators
from fuzz.cases import FuzzCase
from fuzz.source import HypothesisSource
from reference_impl.errors import ErrorCode

_SLOW_OK = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]
# No example database: tests must not leave state behind in the working tree.
settings.register_profile("fuzz-ci", max_examples=15, deadline=None, suppress_health_check=_SLOW_OK,
                          print_blob=True, database=None)
settings.register_profile("fuzz-dev", max_examples=200, deadline=None, suppress_health_check=_SLOW_OK,
                          database=None)
settings.register_profile("fuzz-nightly", max_examples=5000, deadline=None, suppress_health_check=_SLOW_OK,
                          database=None)


def profile(scale: float = 1.0) -> settings:
    """The active profile (``FUZZ_PROFILE``, default ``fuzz-ci``), optionally with scaled examples."""
    active = settings.get_profile(os.environ.get("FUZZ_PROFILE", "fuzz-ci"))
    return settings(active, max_examples=max(1, int(active.max_examples * scale)))


@st.composite
def catalogues(draw, max_declarations: int = 5):
    """Struct catalogues (generator nodes): nesting, shared subtypes by reference, diamonds."""
    return gen.gen_catalogue(HypothesisSource(draw), max_declarations)


@st.composite
def struct_values(draw):
    """(catalogue, EncodedValueProto, Expected, payload): a record layout and whole records."""
    src = HypothesisSource(draw)
    catalogue = gen.gen_catalogue(src)
    value, expected, payload = gen.gen_struct_value(src, catalogue, "value")
    return catalogue, value, expected, payload


@st.composite
def affine_values(draw, storage_type: int | None = None, granularity: str | None = None):
    """(EncodedValueProto, Expected, payload) for any of the six storage types and three granularities."""
    return gen.gen_affine_value(HypothesisSource(draw), "value", storage_type, granularity)


@st.composite
def valid_models(draw, max_values: int = 6) -> gen.Generated:
    """Valid models: catalogue, encoded values of every branch (inline and external), bindings."""
    return models.gen_model(HypothesisSource(draw), max_values)


@st.composite
def near_valid_cases(draw, code: ErrorCode | None = None) -> FuzzCase:
    """A valid model with exactly one rule broken; ``case.expected`` is the code it must produce."""
    src = HypothesisSource(draw)
    return mutators.near_valid(src, models.gen_model(src, max_values=4), code)

"""Near-valid inputs: a valid model with exactly one named rule broken, and the code it must produce.

``MUTATORS[code](src, generated)`` copies a valid ``Generated`` model, breaks the rule behind
``code`` at a place chosen by ``src`` (adding a fresh valid element first when the model has none to
break), and returns a ``FuzzCase`` whose ``expected`` is ``code``. Modules group the rules by family.
"""

from __future__ import annotations

from fuzz import gen
from fuzz.cases import FuzzCase
from fuzz.mutators import affine, bindings, catalogue, declarations, encoding, graph, payload  # noqa: F401
from fuzz.mutators.base import MUTATORS
from fuzz.source import Source
from reference_impl.errors import ErrorCode as E

__all__ = ["MUTATORS", "near_valid"]


def near_valid(src: Source, generated: gen.Generated, code: E | None = None) -> FuzzCase:
    """A near-valid case: ``code``'s rule broken in ``generated`` (a code chosen by ``src`` if None)."""
    if code is None:
        code = src.choice(sorted(MUTATORS, key=lambda c: c.value))
    return MUTATORS[code](src, generated)

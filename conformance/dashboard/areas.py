"""Which spec area a case belongs to: the one place the dashboard groups cases by area."""

from __future__ import annotations

NO_AREA = "(no area)"


def area_of(case_id: str) -> str:
    """The area of ``case_id``: today the second component of its ID (``Required.Affine.Storage.X`` ->
    ``Affine``). Grouping by the spec's outline instead means changing this function only."""
    parts = case_id.split(".")
    return parts[1] if len(parts) > 1 and parts[1] else NO_AREA


def level_of(case_id: str) -> str:
    """The conformance level of ``case_id``: its ID's first component (``Required``, ``Recommended``)."""
    return case_id.split(".", 1)[0] or "(no level)"

"""Generated sections of hand-written documents: the text between a start and an end marker is replaced
whole, so a generator and its ``--check`` agree on what the document should say."""

from __future__ import annotations


def replace_section(text: str, start: str, end: str, body: str) -> str:
    """``text`` with what lies between ``start`` and ``end`` replaced by ``body`` (markers kept);
    ValueError when either marker is missing."""
    if start not in text or end not in text:
        raise ValueError(f"no markers ({start!r} ... {end!r})")
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{start}\n{body}{end}{tail}"

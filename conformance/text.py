"""Message text for people: one line, and cut only at a word boundary where space is short. Reports
keep whole messages in JSON and ``explain``; summaries, JUnit attributes, failure lists and CLI lines
use ``clip``."""

from __future__ import annotations

ELLIPSIS = " …"


def one_line(text: str) -> str:
    """Whitespace (newlines included) collapsed to single spaces."""
    return " ".join(str(text).split())


def clip(text: str, limit: int) -> str:
    """``text`` on one line, at most ``limit`` characters, cut after the last whole word that fits
    (a single word longer than the limit is cut where it must be)."""
    text = one_line(text)
    if len(text) <= limit:
        return text
    room = max(limit - len(ELLIPSIS), 1)
    cut = text.rfind(" ", 0, room + 1)
    head = text[:cut] if cut > 0 else text[:room]
    return head.rstrip(" ,;:") + ELLIPSIS

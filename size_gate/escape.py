"""Text from a measured library (SONAME, ``DT_NEEDED`` entries, symbol names, wheel member names) and
from a budget file is attacker-controlled: it is shown, never interpreted.

``printable`` makes any string one visible line for a terminal or an error message (control, format
and separator characters and lone surrogates become ``\\x..``/``\\u....`` escapes, so nothing can end
the line, move the cursor or reorder the text). ``md_code`` and ``md_text`` additionally keep it inert
in Markdown: a code span no backtick run can close, or text whose Markdown and HTML characters are
backslash-escaped (so ``|`` cannot split a table cell and ``<script>`` or ``[x](javascript:...)`` stay
text).
"""

from __future__ import annotations

import re

#: Unicode categories that never reach output as themselves: controls, format characters (bidi
#: overrides, zero-width characters), line and paragraph separators, surrogates, unassigned.
_HIDDEN = {"Cc", "Cf", "Zl", "Zp", "Cs", "Co", "Cn"}
#: Characters with a Markdown (or GitHub) meaning; '_' between two letters or digits has none, so
#: names such as DT_NEEDED stay as they are.
_MARKDOWN = re.compile(r"[\\`*\[\]<>&|~!#$]|(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])")
_BACKTICKS = re.compile(r"`+")


def _escape(char: str) -> str:
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def printable(text: str) -> str:
    """``text`` as one line of visible characters; a backslash stays a backslash."""
    if text.isprintable() and text.isascii():
        return text
    import unicodedata  # only for text beyond printable ASCII

    return "".join(_escape(c) if c != " " and unicodedata.category(c) in _HIDDEN else c for c in text)


def md_text(text: str) -> str:
    """``text`` as Markdown that renders as exactly this text (after ``printable``)."""
    return _MARKDOWN.sub(lambda m: "\\" + m[0], printable(text))


def md_code(text: str) -> str:
    """``text`` as a Markdown code span: delimited by more backticks than any run inside it."""
    shown = printable(text)
    longest = max((len(run) for run in _BACKTICKS.findall(shown)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if not shown or shown[0] in "` " or shown[-1] in "` " else ""
    return f"{fence}{pad}{shown}{pad}{fence}"

"""The single error type of the size gate.

Every problem with an input (a library, a wheel, a directory, a budget file)
is reported as a :class:`SizeGateError` carrying a stable machine-readable
``code`` and the path of the offending object, so the command line can print
one clear line and exit with status 2 instead of a traceback. The line shows the path and message
escaped (:func:`size_gate.escape.printable`) and clipped, whatever a hostile input put in them.
"""

from __future__ import annotations

import os
import stat

from size_gate.escape import printable

#: The longest message a :class:`SizeGateError` line shows (a path or name inside may be any length).
MESSAGE_LIMIT = 600

#: Stable error codes and what each one means.
ERROR_CODES: dict[str, str] = {
    "not-found": "the path does not exist",
    "unreadable": "the path exists but cannot be read",
    "not-elf": "the file is not an ELF object",
    "truncated": "a table or section extends past the end of the file",
    "corrupt": "the ELF structures are inconsistent",
    "not-shared-library": "the ELF object is not a shared library (ET_DYN)",
    "no-match": "no file in the directory or wheel matches the library name pattern",
    "ambiguous": "several files in the directory or wheel match the library name pattern",
    "bad-wheel": "the wheel is not a readable zip archive",
    "bad-budget": "the budget file is malformed or inconsistent",
    "metric-unavailable": "a gated metric cannot be measured on this file",
    "io-error": "an output file could not be written",
}


class SizeGateError(Exception):
    """A classified failure: ``code`` is one of :data:`ERROR_CODES`, ``path`` names the offending object."""

    def __init__(self, code: str, path: str | os.PathLike[str] | None, message: str) -> None:
        if code not in ERROR_CODES:
            raise ValueError(f"unknown size_gate error code {code!r}")
        self.code = code
        self.path = os.fspath(path) if path is not None else None
        self.message = message
        super().__init__(str(self))

    def __str__(self) -> str:
        where = f"{_clip(printable(self.path))}: " if self.path else ""
        return f"[{self.code}] {where}{_clip(printable(self.message))}"


def _clip(text: str) -> str:
    return text if len(text) <= MESSAGE_LIMIT else f"{text[:MESSAGE_LIMIT]}... ({len(text):,} characters)"


def file_kind(mode: int) -> str:
    """What a file that is not a regular file is (``st_mode``), for a message."""
    for test, kind in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return kind
    return "a special file"

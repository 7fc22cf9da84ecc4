"""The one error class the ``python -m fuzz`` commands report as a single line with exit status 2.

Kept in a module of its own, importing nothing, so the command line can catch every such error without
importing the campaign, replay or findings machinery a command like ``list`` never uses.
"""

from __future__ import annotations


class CommandError(Exception):
    """A command that cannot do what it was asked (unusable input, a refused write, a campaign or replay
    that cannot run); the message is one line, printed as ``fuzz <command>: error: <message>``."""


__all__ = ["CommandError"]

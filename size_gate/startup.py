"""Start-up of the ``python -m size_gate`` command: modules pyelftools imports but measuring never uses.

pyelftools' construct package imports ``pdb``, ``inspect`` and ``traceback`` when it is imported, for a
debugging aid; between them they pull in a large part of the command's start-up (``ast``, ``dis``,
``bdb``, ``cmd``, ``code``, ``linecache``, ``tokenize`` and more). A command-line tool compared against
binutils pays for every import, so the command registers stand-ins that import the real module on first
attribute use: code that does use them gets the real module, only later. Library users of
:mod:`size_gate` are not affected.
"""

from __future__ import annotations

import importlib
import sys
import types

#: Imported by a dependency at import time, used by nothing on the measuring path.
UNUSED_AT_START = ("pdb", "inspect", "traceback")


class _Deferred(types.ModuleType):
    """Stands in for a module not imported yet; the first attribute read imports it and answers from it."""

    def __getattr__(self, name: str) -> object:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)  # the import system probing the stand-in loads nothing
        real = sys.modules.get(self.__name__)
        if real is None or real is self:
            sys.modules.pop(self.__name__, None)
            real = importlib.import_module(self.__name__)
        return getattr(real, name)


def defer_imports(names: tuple[str, ...] = UNUSED_AT_START) -> None:
    """Register a stand-in for each named module that is not imported yet."""
    for name in names:
        if name not in sys.modules:
            stand_in = _Deferred(name)
            stand_in.__spec__ = None
            sys.modules[name] = stand_in

"""Package roots that import their public names on first use (PEP 562).

A command-line tool pays for every import at start-up, so a package root names its exports and the
submodule defining each, and imports that submodule only when the name is first read. Nothing is
cached on the package: a name is always its submodule's current attribute (a test patching the
submodule's function is seen through the package).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from collections.abc import Callable, Mapping


def lazy_exports(package: str, exports: Mapping[str, str], submodules: tuple[str, ...] = ()
                 ) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """The module-level ``__getattr__`` and ``__dir__`` of ``package``: ``exports`` maps each public name
    to the submodule defining it; ``submodules`` are public submodules, imported when first read."""

    def __getattr__(name: str) -> object:
        module = exports.get(name)
        if module is not None:
            loaded = sys.modules.get(f"{package}.{module}")  # function-local imports ask on every call
            return getattr(loaded if loaded is not None else importlib.import_module(f"{package}.{module}"), name)
        if name in submodules or (not name.startswith("__")
                                  and importlib.util.find_spec(f"{package}.{name}") is not None):
            return importlib.import_module(f"{package}.{name}")
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(exports) | set(submodules))

    return __getattr__, __dir__


def keep_function_over_submodule(package: str, name: str) -> None:
    """``package.name`` stays the function ``name`` of the submodule of the same name. Importing that
    submodule binds the module to the name on its parent, which would otherwise hide the function."""

    def read(self: types.ModuleType) -> object:
        return getattr(importlib.import_module(f"{package}.{name}"), name)

    def ignore(self: types.ModuleType, value: object) -> None:
        pass  # the import system binding the submodule (or a patch of the submodule's function)

    module = sys.modules[package]
    module.__class__ = type("_Package", (types.ModuleType,), {name: property(read, ignore)})

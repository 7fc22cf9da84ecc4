"""Where the suite's data files are, whether it runs from an installed wheel or from a source checkout.

An installed distribution carries the repository's ``corpus/`` as ``conformance/_corpus/`` and the
documents the suite reads at run time (the spec's text, ``peer-deviations.md``) as ``conformance/_docs/``
(``setup.py`` maps them there), so no generic top-level ``corpus`` package is installed. A source
checkout (run from its root, or installed editable) has no such copies: there the same files are the
repository's own ``corpus/`` and ``docs/``, beside the package. Every module that reads suite data asks
here, so no other module knows either layout; data inside a package (the budgets of ``size_gate``, the
``.proto`` files, the C++ SDK) is found through that package's own ``__file__`` and needs no help.
"""

from __future__ import annotations

import functools
import importlib.resources
import importlib.util
import pathlib

#: Names of the packaged copies inside this package (see setup.py).
PACKAGED_CORPUS = "_corpus"
PACKAGED_DOCS = "_docs"
#: The import names the suite's own builders package may have, by the corpus folder's name: installed, or
#: in a checkout (``corpus.builders`` from the repository root, ``conformance._corpus.builders`` through an
#: editable install's mapping).
_BUILDER_PACKAGES = {PACKAGED_CORPUS: ("conformance._corpus.builders",),
                     "corpus": ("corpus.builders", "conformance._corpus.builders")}


def _package() -> pathlib.Path:
    """This package's directory (a regular package on the file system, as pip installs it)."""
    return pathlib.Path(str(importlib.resources.files("conformance"))).resolve()


def source_tree() -> pathlib.Path | None:
    """The repository root when the package runs from a source checkout (the directory holding this
    package next to ``pyproject.toml`` and ``corpus/cases``), else None (an installed wheel or sdist)."""
    root = _package().parent
    if (_package() / PACKAGED_CORPUS).is_dir():
        return None
    return root if (root / "pyproject.toml").is_file() and (root / "corpus" / "cases").is_dir() else None


def corpus_dir() -> pathlib.Path:
    """The suite's own corpus: ``conformance/_corpus`` when installed, the checkout's ``corpus/`` else.
    (``conformance.cases.default_corpus`` adds the ``$CONFORMANCE_CORPUS`` override.)"""
    packaged = _package() / PACKAGED_CORPUS
    if packaged.is_dir():
        return packaged
    source = source_tree()
    return source / "corpus" if source else packaged  # a missing corpus is reported by its users


def docs_file(*parts: str) -> pathlib.Path:
    """A file of the documentation the suite reads at run time, e.g. ``docs_file("spec", name)``."""
    packaged = _package() / PACKAGED_DOCS
    if packaged.is_dir():
        return packaged.joinpath(*parts)
    source = source_tree()
    return (source / "docs" if source else packaged).joinpath(*parts)


@functools.lru_cache(maxsize=1)
def builders_package() -> str | None:
    """The import name under which the corpus's ``builders`` package reaches its own files
    (``conformance._corpus.builders`` installed, ``corpus.builders`` from a checkout's root), or None when
    no name does: the caller then imports it from its path."""
    init = (corpus_dir() / "builders" / "__init__.py").resolve()
    if not init.is_file():
        return None
    for name in _BUILDER_PACKAGES.get(corpus_dir().name, ()):
        try:
            spec = importlib.util.find_spec(name)
        except ImportError:  # its parent package is not importable from here
            continue
        if spec is not None and spec.origin is not None and pathlib.Path(spec.origin).resolve() == init:
            return name
    return None


__all__ = ["PACKAGED_CORPUS", "PACKAGED_DOCS", "builders_package", "corpus_dir", "docs_file", "source_tree"]

"""Case IDs the suite renamed: vendors' failure lists, scripts and bundles name cases by ID, so an old ID
keeps resolving to its new one through the corpus's committed table ``renames.toml`` (``[ids]``,
``"old" = "new"``).

``--cases`` patterns, failure-list entries, ``show`` and ``explain`` accept an old ID (each with a one-line
note); ``verify-bundle`` and ``merge`` say when a bundle names cases by their old IDs (such a bundle was
made by an older suite, whose corpus digest is not this one's, so it cannot certify against this corpus).
A corpus without the file renamed nothing.
"""

from __future__ import annotations

import fnmatch
import functools
import os
import pathlib
import re
from collections.abc import Iterable

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from conformance import locations
from conformance.adapters import SuiteError

FILE = "renames.toml"
_ID = re.compile(r"^(Required|Recommended)(\.[A-Za-z0-9_\-]+){3,}$")


def table(corpus: str | pathlib.Path | None = None) -> dict[str, str]:
    """The corpus's renames, old ID -> new ID (empty when it has no table). The default corpus is
    ``conformance.cases.default_corpus``'s: ``$CONFORMANCE_CORPUS``, else the suite's own."""
    root = corpus or os.environ.get("CONFORMANCE_CORPUS") or locations.corpus_dir()
    return dict(_load(str(pathlib.Path(root) / FILE)))


@functools.lru_cache(maxsize=4)
def _load(path: str) -> tuple[tuple[str, str], ...]:
    try:
        with open(path, "rb") as handle:
            data = tomllib.load(handle)
    except FileNotFoundError:
        return ()
    except (OSError, tomllib.TOMLDecodeError) as error:
        raise SuiteError(f"rename table {path} cannot be read: {error}") from None
    ids = data.get("ids", {})
    if not isinstance(ids, dict):
        raise SuiteError(f"rename table {path}: [ids] must be a table of old ID = new ID")
    for old, new in ids.items():
        if not (isinstance(new, str) and _ID.match(old) and _ID.match(new)) or old == new:
            raise SuiteError(f"rename table {path}: {old!r} = {new!r} is not a rename of one case ID to another")
    return tuple(sorted(ids.items()))


def table_of(cases: Iterable) -> dict[str, str]:
    """The renames of the corpus ``cases`` were loaded from."""
    for case in cases:
        return table(case.corpus) if getattr(case, "corpus", None) else {}
    return {}


def aliases(renames: dict[str, str]) -> dict[str, list[str]]:
    """New ID -> the old IDs that name it."""
    found: dict[str, list[str]] = {}
    for old, new in renames.items():
        found.setdefault(new, []).append(old)
    return found


def pattern_matches(pattern: str, case_id: str) -> bool:
    """A ``--cases`` pattern: a glob, a prefix of whole components, or the ID itself."""
    return fnmatch.fnmatchcase(case_id, pattern) or case_id.startswith(pattern + ".") or case_id == pattern


def renamed_targets(pattern: str, renames: dict[str, str], current: Iterable[str],
                    matches=pattern_matches) -> list[str]:
    """The current IDs ``pattern`` names only through old IDs (empty when it names a current case)."""
    current = list(current)
    if any(matches(pattern, case_id) for case_id in current):
        return []
    return sorted({new for old, new in renames.items() if matches(pattern, old)})


def note(what: str, pattern: str, targets: list[str]) -> str:
    """One line: ``pattern`` is an ID from before the rename, and what it names now."""
    shown = targets[0] if len(targets) == 1 else f"{len(targets)} cases ({targets[0]}, ...)"
    return f"note: {what} {pattern} names {shown} since the suite renamed its case IDs ({FILE})"


def resolve(case_id: str, renames: dict[str, str]) -> str:
    """The current ID of ``case_id`` (itself when it was not renamed)."""
    return renames.get(case_id, case_id)


__all__ = ["FILE", "aliases", "note", "pattern_matches", "renamed_targets", "resolve", "table", "table_of"]

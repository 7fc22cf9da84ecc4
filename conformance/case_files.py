"""The external files of a case: each key of a case's ``files`` names a file inside the case's working
directory, and only there.

A corpus may be data only (no builders) and come from anyone, so its keys are input: a key is a
relative path of ``/``-separated components, none empty, ``.`` or ``..``, without backslashes, control
characters or a drive prefix, and no key is a directory of another. ``write`` creates every component
relative to the directory opened before it, never following a symbolic link and never replacing a file,
so even a working directory changed under it cannot redirect a write outside.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from conformance.adapters import SuiteError

#: Longest key, and longest component, in UTF-8 bytes (Linux's NAME_MAX for a component).
MAX_KEY_BYTES, MAX_COMPONENT_BYTES = 1024, 255
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def key_problem(key: object) -> str | None:
    """Why ``key`` cannot name a file inside the case directory, or None when it can."""
    if not isinstance(key, str) or not key:
        return "is not a non-empty string"
    shown = repr(key) if len(key) <= 80 else repr(key[:80]) + "..."
    if len(key.encode("utf-8", "surrogatepass")) > MAX_KEY_BYTES:
        return f"{shown} is longer than {MAX_KEY_BYTES} bytes"
    if _CONTROL.search(key):
        return f"{shown} contains a control character"
    if "\\" in key:
        return f"{shown} contains a backslash (components are separated by '/')"
    if key.startswith("/") or re.match(r"[A-Za-z]:", key):
        return f"{shown} is absolute; keys are relative to the case directory"
    parts = key.split("/")
    if any(part in ("", ".", "..") for part in parts):
        return f"{shown} has an empty, '.' or '..' component; keys stay inside the case directory"
    if any(len(part.encode("utf-8", "surrogatepass")) > MAX_COMPONENT_BYTES for part in parts):
        return f"{shown} has a component longer than {MAX_COMPONENT_BYTES} bytes"
    return None


def check(files: object, where: str) -> dict:
    """``files`` when every key names a distinct file inside the case directory; else a SuiteError
    naming ``where`` (the case)."""
    if not isinstance(files, Mapping):
        raise SuiteError(f"{where}: files must be a table of file name -> contents")
    for key in files:
        problem = key_problem(key)
        if problem:
            raise SuiteError(f"{where}: files key {problem}")
    directories = {"/".join(key.split("/")[:i]) for key in files for i in range(1, key.count("/") + 1)}
    clash = sorted(directories.intersection(files))
    if clash:
        raise SuiteError(f"{where}: files key {clash[0]!r} is both a file and a directory of another key")
    return dict(files)


def write(directory: str | os.PathLike, files: Mapping[str, bytes], where: str) -> None:
    """Create each file under ``directory`` (keys checked again): directories are made and opened one
    component at a time with O_NOFOLLOW, files created with O_EXCL|O_NOFOLLOW."""
    check(files, where)
    root = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for key, data in files.items():
            try:
                _write_inside(root, key.split("/"), data)
            except OSError as error:
                raise SuiteError(f"{where}: cannot write files key {key!r} inside the case directory: "
                                 f"{error.strerror or error}") from None
    finally:
        os.close(root)


def _write_inside(root: int, parts: list[str], data: bytes) -> None:
    opened: list[int] = []
    current = root
    try:
        for part in parts[:-1]:
            try:
                os.mkdir(part, 0o755, dir_fd=current)
            except FileExistsError:
                pass  # made for an earlier key; opening it below refuses anything but a real directory
            current = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=current)
            opened.append(current)
        fd = os.open(parts[-1], os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644,
                     dir_fd=current)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
    finally:
        for fd in reversed(opened):
            os.close(fd)

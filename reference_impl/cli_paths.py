"""Paths on a command line, as the user meant them: relative to the directory the command was started in.

Every ``python -m`` entry point of the project (``fuzz``, ``size_gate``, ``reference_impl``) resolves the
paths it is given here, once, while parsing its arguments, so nothing later (a child process started in
another directory, a library that changes directory) can reinterpret them. Defaults for what a command
writes go under the current directory too, never into the installed package's own tree.

Nothing here touches the file system beyond asking for the current directory: symbolic links are not
resolved and ``..`` is not folded, so ``link/../x`` keeps the meaning the operating system gives it.
"""

from __future__ import annotations

import argparse
import os
import pathlib


def current_directory() -> pathlib.Path:
    """The directory the command runs in. Raises ``argparse.ArgumentTypeError`` when it no longer exists
    (it was deleted under the shell), since then no relative path means anything."""
    try:
        return pathlib.Path(os.getcwd())
    except OSError as error:
        raise argparse.ArgumentTypeError(f"the current directory is not available ({error.strerror})") from None


def user_path(text: str | os.PathLike[str]) -> pathlib.Path:
    """``text`` made absolute against the current directory; usable as an argparse ``type=``.

    An empty path or one holding a NUL character names no file and is refused (argparse reports it as a
    usage error, exit status 2)."""
    text = os.fspath(text)
    if not text:
        raise argparse.ArgumentTypeError("an empty path names no file")
    if "\0" in text:
        raise argparse.ArgumentTypeError("a path cannot contain a NUL character")
    path = pathlib.Path(text)
    return path if path.is_absolute() else current_directory() / path


def default_under_cwd(*parts: str) -> pathlib.Path:
    """Where a command writes when the user names no place: ``./<parts>`` of the current directory."""
    return current_directory().joinpath(*parts)


__all__ = ["current_directory", "default_under_cwd", "user_path"]

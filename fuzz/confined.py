"""Writing inside one directory and nowhere else: the regressions directory for ``promote``, the findings
directory for ``triage``.

Names that come from data (a target recorded in a findings directory, a finding's file name) never
choose where a write lands: every name is one plain path component (no separator, no ``..``, not
absolute), every subdirectory is opened without following a symbolic link, and files are created or
replaced through the directory's descriptor with ``O_NOFOLLOW`` (new files also with ``O_EXCL``), so a
link planted in the directory, or swapped in between two steps, is refused rather than followed. The
directory the user names (``--regressions-dir``, the findings directory) is taken as given.
"""

from __future__ import annotations

import os
import pathlib
import secrets

from fuzz.errors import CommandError
from fuzz.findings_io import FindingsError, open_directory, read_file, shown

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


class WriteError(CommandError):
    """A write that was refused or failed; the message is one line."""


def check_name(name: object) -> str:
    """``name`` if it is a single, plain path component; raises WriteError otherwise."""
    if not isinstance(name, str) or name in ("", ".", "..") or len(name) > 255 or not name.isprintable() \
            or any(sep in name for sep in ("/", "\\", "\0")):
        raise WriteError(f"{shown(name)} is not a plain file name: nothing is written under it")
    return name


class Confined:
    """A directory, held by descriptor, that writes go into."""

    def __init__(self, path: pathlib.Path, fd: int):
        self.path, self.fd = path, fd

    @classmethod
    def open(cls, path: pathlib.Path, create: bool = True) -> Confined:
        """The directory the user named (created with its parents when ``create``)."""
        if create:
            try:
                path.mkdir(parents=True, exist_ok=True)
            except OSError as error:
                raise WriteError(f"cannot create the directory {path}: {error.strerror or error}") from None
        try:
            return cls(path, open_directory(path, str(path)))
        except FindingsError as error:
            raise WriteError(str(error)) from None

    def close(self) -> None:
        os.close(self.fd)

    def __enter__(self) -> Confined:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def subdirectory(self, name: str) -> Confined:
        """``name`` inside this directory, created when missing; a link there is refused."""
        check_name(name)
        try:
            os.mkdir(name, 0o755, dir_fd=self.fd)
        except FileExistsError:
            pass
        except OSError as error:
            raise WriteError(f"cannot create the directory {self.path / name}: {error.strerror or error}") from None
        try:
            return Confined(self.path / name, open_directory(name, str(self.path / name), self.fd, follow=False))
        except FindingsError as error:
            raise WriteError(str(error)) from None

    def create(self, name: str, data: bytes) -> bool:
        """Write a new file; False (and nothing written) when ``name`` already exists, link or not."""
        check_name(name)
        try:
            fd = os.open(name, _CREATE_FLAGS, 0o644, dir_fd=self.fd)
        except FileExistsError:
            return False
        except OSError as error:
            raise WriteError(f"cannot create {self.path / name}: {error.strerror or error}") from None
        self._fill(fd, name, data)
        return True

    def read(self, name: str, limit: int) -> bytes | None:
        """The bytes of a regular file here (no link, at most ``limit``), or None when there is none."""
        check_name(name)
        try:
            os.lstat(name, dir_fd=self.fd)
        except FileNotFoundError:
            return None
        except OSError as error:
            raise WriteError(f"cannot read {self.path / name}: {error.strerror or error}") from None
        try:
            return read_file(name, str(self.path / name), limit, self.fd)
        except FindingsError as error:
            raise WriteError(str(error)) from None

    def replace(self, name: str, data: bytes) -> None:
        """Write ``name`` whole, replacing what was there: a new file is filled under a temporary name,
        then renamed over it (a link at ``name`` is replaced, never written through)."""
        check_name(name)
        temporary = f".{name[:200]}.{secrets.token_hex(6)}.tmp"
        try:
            fd = os.open(temporary, _CREATE_FLAGS, 0o644, dir_fd=self.fd)
        except OSError as error:
            raise WriteError(f"cannot write in {self.path}: {error.strerror or error}") from None
        try:
            self._fill(fd, temporary, data)
            os.replace(temporary, name, src_dir_fd=self.fd, dst_dir_fd=self.fd)
        except BaseException as error:
            try:
                os.unlink(temporary, dir_fd=self.fd)
            except OSError:
                pass
            if isinstance(error, OSError):
                raise WriteError(f"cannot write {self.path / name}: {error.strerror or error}") from None
            raise

    def _fill(self, fd: int, name: str, data: bytes) -> None:
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
        except OSError as error:
            raise WriteError(f"cannot write {self.path / name}: {error.strerror or error}") from None


__all__ = ["Confined", "WriteError", "check_name"]

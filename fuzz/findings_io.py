"""Reading a findings directory (a campaign's output, often a CI artifact from elsewhere) as untrusted data.

Every file is opened without following a symbolic link and without blocking, checked through its
descriptor to be a regular file of bounded size, and only then read; JSON records must have the shape
the harness writes. Anything else is a ``FindingsError``: one line naming the file and the problem,
which the commands print and exit with status 2. Directories inside the artifact (``findings/``) are
opened the same way, and their entries are read through the directory's descriptor, so a link swapped
in between two steps is not followed either. The directory the user names is taken as given.
"""

from __future__ import annotations

import errno
import json
import os
import pathlib
import stat

from fuzz.errors import CommandError

#: Names libFuzzer gives the inputs it writes for a finding.
FINDING_PREFIXES = ("crash-", "timeout-", "oom-", "leak-", "slow-unit-")
#: The largest JSON record read (a day-long campaign's report.json is under 10 MB).
MAX_RECORD_BYTES = 32 << 20
#: The largest finding input read (every target's MAX_LEN is a few KiB).
MAX_FINDING_BYTES = 1 << 20

_READ_FLAGS = (os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
               | getattr(os, "O_CLOEXEC", 0))
_DIRECTORY_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_CLOEXEC", 0)


class FindingsError(CommandError):
    """A findings directory, or a file in it, that cannot be used; the message is one line."""


def shown(value: object, limit: int = 80) -> str:
    """``value`` quoted for a one-line message: control characters escaped, length bounded."""
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 4] + "...'"


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISREG, "a regular file"), (stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISLNK, "a symbolic link"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "a special file"


def _refusal(error: OSError, what: str, name: str, dir_fd: int | None) -> FindingsError:
    """The one-line message of a failed open: a link or a non-directory said as such."""
    if error.errno in (errno.ELOOP, errno.ENOTDIR):
        try:
            mode = os.lstat(name, dir_fd=dir_fd).st_mode
        except OSError:
            mode = 0
        if stat.S_ISLNK(mode):
            return FindingsError(f"{what} is a symbolic link, which is not followed")
        if mode and error.errno == errno.ENOTDIR:
            return FindingsError(f"{what} is {_kind(mode)}, not a directory")
    return FindingsError(f"cannot read {what}: {error.strerror or error}")


def open_directory(path: str | os.PathLike[str], what: str, dir_fd: int | None = None,
                   follow: bool = True) -> int:
    """A descriptor of a directory. ``follow=False`` for directories inside an artifact: a symbolic
    link there is refused."""
    flags = _DIRECTORY_FLAGS | (0 if follow else getattr(os, "O_NOFOLLOW", 0))
    try:
        return os.open(path, flags, dir_fd=dir_fd)
    except OSError as error:
        raise _refusal(error, what, os.fspath(path), dir_fd) from None


def read_file(name: str | os.PathLike[str], what: str, limit: int, dir_fd: int | None = None) -> bytes:
    """The bytes of a regular file of at most ``limit`` bytes, never following a link at its name."""
    try:
        fd = os.open(name, _READ_FLAGS, dir_fd=dir_fd)
    except OSError as error:
        raise _refusal(error, what, os.fspath(name), dir_fd) from None
    try:
        info = os.fstat(fd)
    except OSError as error:
        os.close(fd)
        raise FindingsError(f"cannot read {what}: {error.strerror or error}") from None
    if not stat.S_ISREG(info.st_mode) or info.st_size > limit:
        os.close(fd)
        if not stat.S_ISREG(info.st_mode):
            raise FindingsError(f"{what} is {_kind(info.st_mode)}, not a regular file")
        raise FindingsError(f"{what} is {info.st_size} bytes, more than the {limit} it may have")
    with os.fdopen(fd, "rb") as handle:
        try:
            data = handle.read(limit + 1)
        except OSError as error:
            raise FindingsError(f"cannot read {what}: {error.strerror or error}") from None
    if len(data) > limit:
        raise FindingsError(f"{what} grew beyond the {limit} bytes it may have")
    return data


def exists(name: str, dir_fd: int) -> bool:
    """Whether ``name`` is an entry of the directory (a link counts, and is then refused when read)."""
    try:
        os.lstat(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return False
    except OSError as error:
        raise FindingsError(f"cannot look up {name}: {error.strerror or error}") from None
    return True


def load_record(name: str, what: str, dir_fd: int | None = None) -> object:
    """A JSON record (bounded, regular file, no link), parsed. Raises FindingsError on any problem."""
    data = read_file(name, what, MAX_RECORD_BYTES, dir_fd)
    try:
        return json.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise FindingsError(f"{what} is not UTF-8 text") from None
    except RecursionError:
        raise FindingsError(f"{what} nests too deeply to be a record the harness wrote") from None
    except ValueError as error:
        raise FindingsError(f"{what} is not valid JSON ({str(error).splitlines()[0][:120]})") from None


def _display(folder: pathlib.Path, name: str) -> str:
    return str(folder / name) if name.isprintable() else f"{folder}/{shown(name)}"


class FindingsDirectory:
    """A campaign output directory (``report.json`` and ``findings/``), or a ``findings/`` directory
    itself, or any directory of libFuzzer artifacts."""

    def __init__(self, path: pathlib.Path):
        self.path = path
        self.fd = open_directory(path, f"the findings directory {path}")
        try:
            inner = exists("findings", self.fd)
            self.findings_path = path / "findings" if inner else path
            self.findings_fd = (open_directory("findings", f"{path / 'findings'}", self.fd, follow=False)
                                if inner else os.dup(self.fd))
        except BaseException:
            os.close(self.fd)
            raise

    def close(self) -> None:
        for fd in (self.fd, self.findings_fd):
            os.close(fd)

    def __enter__(self) -> FindingsDirectory:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def report(self) -> tuple[object, str] | None:
        """(the parsed ``report.json`` here, or one level up for a ``findings/`` path; its path), or None."""
        if exists("report.json", self.fd):
            what = str(self.path / "report.json")
            return load_record("report.json", what, self.fd), what
        parent = self.path.parent
        if parent != self.path:
            parent_fd = open_directory(parent, str(parent))
            try:
                if exists("report.json", parent_fd):
                    what = str(parent / "report.json")
                    return load_record("report.json", what, parent_fd), what
            finally:
                os.close(parent_fd)
        return None

    def inputs(self) -> list[tuple[str, bytes]]:
        """(name, bytes) of every finding, by name. An entry named like a finding that is not a regular
        file of at most MAX_FINDING_BYTES (a link, a FIFO, a directory, a huge file) is refused."""
        found = []
        with os.scandir(self.findings_fd) as entries:
            names = sorted(entry.name for entry in entries if entry.name.startswith(FINDING_PREFIXES))
        for name in names:
            found.append((name, read_file(name, _display(self.findings_path, name), MAX_FINDING_BYTES,
                                          self.findings_fd)))
        return found


def records_near(path: pathlib.Path) -> list[tuple[object, str]]:
    """(parsed record, its path) of each ``triage.json`` and ``report.json`` next to a single finding or
    one folder up (``<run>/minimized/<id>.bin``, ``<run>/findings/crash-...``), nearest first."""
    found = []
    for folder in (path.parent, path.parent.parent):
        fd = open_directory(folder, str(folder))
        try:
            for name in ("triage.json", "report.json"):
                if exists(name, fd):
                    found.append((load_record(name, str(folder / name), fd), str(folder / name)))
        finally:
            os.close(fd)
    return found


__all__ = ["FINDING_PREFIXES", "MAX_FINDING_BYTES", "MAX_RECORD_BYTES", "FindingsDirectory", "FindingsError",
           "load_record", "open_directory", "read_file", "records_near", "shown"]

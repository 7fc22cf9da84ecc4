"""Turn a command-line PATH into one measured library.

PATH may be the library file itself, a directory searched recursively for the
library by a file-name pattern, or a wheel whose members are searched the same
way (the wheel's size and the member's compressed size are recorded too).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import os
import shutil
import stat
import tempfile
import zipfile
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from size_gate.errors import SizeGateError, file_kind
from size_gate.metrics import LibraryMetrics, measure_elf

#: Wheel members larger than this are refused rather than unpacked.
MAX_WHEEL_MEMBER = 1 << 30
#: A wheel member is streamed to a temporary file in chunks of this size (peak memory stays one chunk).
_CHUNK = 1 << 20
_ZIP_MAGIC = b"PK\x03\x04"


def measure_path(path: str | os.PathLike[str], pattern: str | Callable[[], str]) -> LibraryMetrics:
    """Measure the library at ``path`` (file, directory or wheel); ``pattern`` selects it by file name
    (or is a function giving it, called only when a directory or wheel needs one).

    The path is opened once, without blocking (a FIFO would otherwise wait for a writer), and what it
    is comes from the opened descriptor, so it cannot be swapped for a FIFO or a device after a check."""
    p = Path(path)
    fd = _open(p)
    try:
        is_directory = stat.S_ISDIR(os.fstat(fd).st_mode)
    except OSError as exc:
        os.close(fd)
        raise SizeGateError("unreadable", p, exc.strerror or str(exc)) from None
    if is_directory:
        os.close(fd)
        found = _find_in_directory(p, pattern() if callable(pattern) else pattern)
        return _measure_descriptor(_open(found), found, None)
    return _measure_descriptor(fd, p, pattern)


def _open(path: Path) -> int:
    try:
        return os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise SizeGateError("not-found", path, "no such file or directory") from None
    except (OSError, ValueError) as exc:
        raise SizeGateError("unreadable", path, getattr(exc, "strerror", None) or str(exc)) from None


def _measure_descriptor(fd: int, path: Path, pattern: str | Callable[[], str] | None) -> LibraryMetrics:
    """Measure the opened regular file: a wheel (when ``pattern`` may select a member) or an ELF library."""
    try:
        mode = os.fstat(fd).st_mode
    except OSError as exc:
        os.close(fd)
        raise SizeGateError("unreadable", path, exc.strerror or str(exc)) from None
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise SizeGateError("unreadable", path, f"not a regular file, directory or wheel ({file_kind(mode)})")
    try:
        with os.fdopen(fd, "rb") as handle:
            if pattern is not None and (path.suffix == ".whl" or handle.read(len(_ZIP_MAGIC)) == _ZIP_MAGIC):
                size = os.fstat(handle.fileno()).st_size
                return _measure_wheel(handle, path, pattern() if callable(pattern) else pattern, size)
            handle.seek(0)
            return measure_elf(handle, str(path))
    except OSError as exc:
        raise SizeGateError("unreadable", path, exc.strerror or str(exc)) from None


def _one_match(where: Path, pattern: str, matches: list[str], searched: int) -> str:
    if not matches:
        raise SizeGateError("no-match", where,
                            f"no file name matches {pattern!r} ({searched:,} files searched); "
                            f"pass the library itself or a different --pattern")
    if len(matches) > 1:
        shown = ", ".join(matches[:10]) + (", ..." if len(matches) > 10 else "")
        raise SizeGateError("ambiguous", where,
                            f"{len(matches)} files match {pattern!r}: {shown}; "
                            f"pass one of them or a narrower --pattern")
    return matches[0]


def _find_in_directory(root: Path, pattern: str) -> Path:
    """The single regular file under ``root`` whose name matches ``pattern`` (symlinks to it count once)."""
    found: dict[str, str] = {}
    searched = 0
    for dirpath, dirnames, filenames in os.walk(root, onerror=None):
        dirnames.sort()
        for name in sorted(filenames):
            searched += 1
            full = os.path.join(dirpath, name)
            if fnmatch.fnmatchcase(name, pattern) and os.path.isfile(full):
                found.setdefault(os.path.realpath(full), full)
    return Path(_one_match(root, pattern, sorted(found.values()), searched))


def _measure_wheel(wheel: BinaryIO, path: Path, pattern: str, wheel_bytes: int) -> LibraryMetrics:
    try:
        unpacked = tempfile.TemporaryFile(prefix="size-gate-")
    except OSError as exc:
        raise SizeGateError("io-error", None, f"no temporary file to unpack the wheel into: {exc}") from None
    with unpacked:
        name, info = _unpack_member(wheel, path, pattern, unpacked)
        metrics = measure_elf(unpacked, f"{path}!{name}")
    return dataclasses.replace(metrics, wheel_bytes=wheel_bytes, compressed_bytes=info.compress_size,
                               wheel_member=name)


def _unpack_member(wheel_file: BinaryIO, path: Path, pattern: str, out) -> tuple[str, zipfile.ZipInfo]:
    """Stream the one member matching ``pattern`` into the file ``out``; returns its name and entry."""
    try:
        with zipfile.ZipFile(wheel_file) as wheel:
            members = [i for i in wheel.infolist() if not i.is_dir()]
            name = _one_match(path, pattern, sorted(i.filename for i in members
                                                    if fnmatch.fnmatchcase(i.filename.rsplit("/", 1)[-1],
                                                                           pattern)), len(members))
            info = wheel.getinfo(name)
            if info.file_size > MAX_WHEEL_MEMBER:
                raise SizeGateError("bad-wheel", path, f"member {name} claims {info.file_size:,} bytes, "
                                    f"more than the {MAX_WHEEL_MEMBER:,} this tool will unpack")
            with wheel.open(info) as member:
                shutil.copyfileobj(member, out, _CHUNK)
    except SizeGateError:
        raise
    except (zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError, ValueError) as exc:
        raise SizeGateError("bad-wheel", path, f"not a readable wheel (zip) archive: {exc}") from None
    except OSError as exc:
        raise SizeGateError("unreadable", path, exc.strerror or str(exc)) from None
    out.flush()
    return name, info

"""Reading the files of a bundle or shard someone else made, without trusting it.

A bundle is untrusted input: a name in it may point at ``/dev/zero``, a FIFO, a symbolic link or a path
outside the bundle. Every file is reached from the bundle directory one component at a time with
``O_NOFOLLOW`` (a link anywhere is refused), opened with ``O_NONBLOCK`` (a FIFO cannot block), checked on
its descriptor (a regular file within a size bound) and read from that descriptor only. JSON is parsed
with its failures classified, so any malformed content is one line for the caller, never a traceback.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import stat
from typing import Any

#: The largest bundle file read (results.json of a full run with long messages is a few MiB).
MAX_FILE_BYTES = 64 * 1024 * 1024
#: A relative name inside a bundle: components of letters, digits, ``.``, ``_`` and ``-``, no ``..``.
_COMPONENT = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,199}$")
_MAX_DEPTH = 4


class BundleError(Exception):
    """A bundle or shard that cannot be read as one: the message is one line naming the file."""


def check_name(name: Any) -> str:
    """``name`` when it is a plain relative path inside a bundle (``results.json``, ``cases/X.json``)."""
    if not isinstance(name, str):
        raise BundleError(f"a file name in the bundle is not a string: {_short(name)}")
    parts = name.split("/")
    if len(parts) > _MAX_DEPTH or not all(_COMPONENT.match(part) and part not in (".", "..") for part in parts):
        raise BundleError(f"file name {_short(name)} is not a plain relative name inside the bundle")
    return name


def read_bytes(root: str | os.PathLike, name: str, limit: int = MAX_FILE_BYTES) -> bytes:
    """The bytes of ``root/name``: a regular file reached without following links, at most ``limit``."""
    check_name(name)
    parts = name.split("/")
    try:
        directory = os.open(os.fspath(root), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as error:
        raise BundleError(f"{root}: not a readable directory ({error.strerror})") from None
    try:
        for part in parts[:-1]:
            try:
                inner = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=directory)
            except OSError as error:
                raise BundleError(f"{name}: {part} is not a directory of the bundle ({error.strerror})") from None
            os.close(directory)
            directory = inner
        try:
            handle = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=directory)
        except FileNotFoundError:
            raise BundleError(f"{name} is missing") from None
        except OSError as error:
            raise BundleError(f"{name} cannot be opened without following links ({error.strerror})") from None
    finally:
        os.close(directory)
    try:
        info = os.fstat(handle)
        if not stat.S_ISREG(info.st_mode):
            raise BundleError(f"{name} is not a regular file")
        if info.st_size > limit:
            raise BundleError(f"{name} is {info.st_size} bytes, more than the {limit} a bundle file may have")
        chunks, total = [], 0
        while True:
            chunk = os.read(handle, min(1 << 20, limit + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if total > limit:
                raise BundleError(f"{name} grew past {limit} bytes while being read")
        return b"".join(chunks)
    finally:
        os.close(handle)


def exists(root: str | os.PathLike, name: str) -> bool:
    """Whether ``root/name`` is there as an entry (of any kind; reading it checks the kind)."""
    check_name(name)
    return os.path.lexists(pathlib.Path(root, name))


def read_json(root: str | os.PathLike, name: str, limit: int = MAX_FILE_BYTES) -> Any:
    """The JSON value of ``root/name``; malformed bytes of any shape are a ``BundleError``."""
    return parse_json(read_bytes(root, name, limit), name)


def parse_json(data: bytes, name: str) -> Any:
    try:
        return json.loads(data.decode("utf-8"), parse_constant=_no_constant)
    except UnicodeDecodeError:
        raise BundleError(f"{name} is not UTF-8 text") from None
    except RecursionError:
        raise BundleError(f"{name} nests JSON too deeply") from None
    except ValueError as error:  # JSONDecodeError, and integers longer than Python converts
        raise BundleError(f"{name} is not valid JSON ({_short(str(error), 120)})") from None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _short(value: Any, width: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= width else text[: width - 3] + "..."


# ------------------------------------------------------------------------------------- shape checks
def expect(value: Any, kind: type | tuple[type, ...], where: str) -> Any:
    """``value`` when it is of ``kind`` (``bool`` is never taken for ``int``); else a ``BundleError``."""
    kinds = kind if isinstance(kind, tuple) else (kind,)
    if isinstance(value, bool) and bool not in kinds:
        raise BundleError(f"{where} should be {_kind_names(kinds)}, not a boolean")
    if not isinstance(value, kinds):
        raise BundleError(f"{where} should be {_kind_names(kinds)}, not {type(value).__name__}")
    return value


def field(mapping: dict, key: str, kind: type | tuple[type, ...], where: str) -> Any:
    """``mapping[key]`` of ``kind``; a missing key or another kind is a ``BundleError``."""
    if key not in mapping:
        raise BundleError(f"{where} has no {key!r}")
    return expect(mapping[key], kind, f"{where}.{key}")


def _kind_names(kinds: tuple[type, ...]) -> str:
    names = {dict: "an object", list: "a list", str: "a string", int: "an integer", float: "a number",
             bool: "a boolean", type(None): "null"}
    return " or ".join(names.get(k, k.__name__) for k in kinds)

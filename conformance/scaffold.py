"""``python -m conformance new-adapter NAME [--lowered]``: a working adapter skeleton and its first
failure list, so a vendor's first full run takes minutes (docs/adapters.md).

The ``--lowered`` skeleton is a standard ONNX runtime on the lowering base whose session runs on onnx's
reference evaluator until the vendor replaces four marked methods; the plain skeleton implements every
adapter member as "not supported" and claims no profile until the vendor fills them in.

The output directory may be shared: an existing name is never replaced and a symbolic link planted at
one is never followed (files are created with O_EXCL|O_NOFOLLOW relative to the opened directory).
"""

from __future__ import annotations

import keyword
import os
import pathlib
import re
import stat
import tempfile
from typing import NoReturn

from conformance.adapters import SuiteError

#: Adapter names are identifier-like and at most this long (they name a module, a class and two files).
NAME_LIMIT = 64

LOWERED = '''"""Conformance adapter for {name}: a standard ONNX runtime behind the suite's lowering
(DequantizeLinear for affine values, caller-managed feedback for state). The contract is docs/adapters.md
of onnx-light-conformance.

    python -m conformance run --adapter {module}.py:{cls} --failure-list {name}-failures.txt
    python -m conformance explain CASE_ID --adapter {module}.py:{cls}

As written, the session runs models on onnx's reference evaluator so the first run works: replace the
four methods marked TODO({name}) with {name}'s own calls, then update the failure list
(add --update-failure-list to the run command).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from conformance.adapters import Rejected  # noqa: F401 - raise Rejected("STATE_UNRETAINABLE", ...) in adopt()
from conformance.adapters.lowering import LoweredAdapter
from conformance.values import default_buffer_id


class {cls_base}Session:
    """One stateless ONNX model loaded in {name}. Handles are {name}'s own value objects."""

    def __init__(self, model_bytes: bytes):
        # TODO({name}): load the model bytes in {name} instead of onnx's reference evaluator.
        import onnx
        from onnx.reference import ReferenceEvaluator

        model = onnx.ModelProto()
        model.ParseFromString(model_bytes)
        self.runtime = ReferenceEvaluator(model)
        self.output_names = list(self.runtime.output_names)
        self.ids: dict[int, int | None] = {{}}
        self._keep: list = []  # everything handed out stays alive, so no buffer address is reused

    def adopt(self, value: Any) -> Any:
        # TODO({name}): wrap the caller's array in an input value that shares its memory, and return a
        # value this session returned as it is. If {name} cannot hold the buffer without a copy (a
        # strided or read-only array, say), raise Rejected("STATE_UNRETAINABLE", "why") instead.
        return np.asarray(value)

    def run_handles(self, feeds: dict[str, Any]) -> dict[str, Any]:
        # TODO({name}): one call; return every graph output by name as {name}'s own values.
        return dict(zip(self.output_names, self.runtime.run(None, feeds)))

    def to_numpy(self, handle: Any) -> np.ndarray:
        # TODO({name}): a NumPy array over the output's memory (a copy only if {name} cannot share it;
        # then map the copy to the buffer it came from in self.ids so identity cases see {name}'s buffer).
        array = np.asarray(handle)
        self.ids[id(array)] = default_buffer_id(array)
        self._keep.append((array, handle))
        return array

    def buffer_id(self, value: Any) -> int | None:
        """The {name} buffer behind an array this session returned; None for any other value."""
        return self.ids.get(id(value))


class {cls}(LoweredAdapter):
    name = "{name}"
    version = "0"  # TODO({name}): the runtime's version, e.g. {name}.__version__

    def profiles(self) -> set[str]:
        # Claim only what {name} honestly supports. An operator or a type missing inside a claimed profile
        # is a failure (the report shows it), not "not supported".
        return {{"affine", "state", "zero-copy", "kv-contiguous", "decode-e2e"}}

    def stateless(self, model_bytes: bytes) -> {cls_base}Session:
        return {cls_base}Session(model_bytes)
'''

PLAIN = '''"""Conformance adapter for {name}. The contract is docs/adapters.md of onnx-light-conformance.

    python -m conformance run --adapter {module}.py:{cls} --failure-list {name}-failures.txt
    python -m conformance explain CASE_ID --adapter {module}.py:{cls}

Every member below says "not supported" until it is filled in (TODO({name})). Claim a profile in
profiles() once the members its cases call work: then each missing operator or type in it fails a case
instead. After each step, update the failure list (add --update-failure-list to the run command).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from conformance.adapters import NotSupported, Rejected  # noqa: F401 - raise Rejected(code, message) to reject
from conformance.values import Encoded, Struct  # noqa: F401 - the neutral value types (docs/adapters.md)


class {cls_base}State:
    """One request's retained values (docs/adapters.md, "State handle members")."""

    def run(self, feeds: dict[str, Any]) -> dict[str, Any]:
        # TODO({name}): one call with these fresh feeds; every output by name. Reject a call while another
        # runs with Rejected("STATE_BUSY", ...).
        raise NotSupported("run() is not written yet")

    def values(self) -> dict[str, Any]:
        # TODO({name}): the retained values by bound input name, as read-only shared views.
        raise NotSupported("values() is not written yet")

    def reset(self, initial: dict[str, Any]) -> None:
        # TODO({name}): validate every initial value, then replace the retained values.
        raise NotSupported("reset() is not written yet")

    def close(self) -> None:
        # TODO({name}): release the retained values; later calls are rejected with STATE_CLOSED.
        pass

    def buffer_id(self, value: Any) -> int | None:
        # TODO({name}): the identity of {name}'s buffer behind a value this state handed out or received;
        # None for a value it does not know.
        return None


class {cls}:
    name = "{name}"
    version = "0"  # TODO({name}): the runtime's version

    def profiles(self) -> set[str]:
        # TODO({name}): the profiles {name} claims, e.g. {{"representation", "affine"}} (see PROFILES in
        # conformance/adapters/__init__.py). Unclaimed profiles are "not supported".
        return set()

    def classify(self, exc: BaseException):
        # TODO({name}): map {name}'s exceptions to Rejected(code, message) with the suite's error codes
        # (docs/error-codes.md); a rejection without a code never certifies a profile.
        return None

    def verify(self, model_bytes: bytes, base_dir: str | None) -> None:
        # TODO({name}): validate the serialized model; raise Rejected(code, message) if it is invalid.
        raise NotSupported("verify() is not written yet")

    def decode(self, model_bytes: bytes, value_name: str, base_dir: str | None) -> np.ndarray:
        # TODO({name}): the logical tensor of the encoded initializer value_name.
        raise NotSupported("decode() is not written yet")

    def read_fields(self, model_bytes: bytes, value_name: str, base_dir: str | None) -> dict[str, np.ndarray]:
        # TODO({name}): generic field access: leaf path -> values, one row per record.
        raise NotSupported("read_fields() is not written yet")

    def roundtrip(self, model_bytes: bytes, base_dir: str | None = None) -> bytes:
        # TODO({name}): explicit load then save (base_dir holds the model's external files).
        raise NotSupported("roundtrip() is not written yet")

    def open_state(self, model_bytes: bytes, initial: dict[str, Any], base_dir: str | None = None):
        # TODO({name}): a state over the model's persistent bindings holding these initial values.
        raise NotSupported("open_state() is not written yet")

    def export(self, model_bytes: bytes, target: str, base_dir: str | None = None):
        # TODO({name}): "onnx-light" / "onnx": model bytes; "onnx-lowered": (model bytes, feedback pairs).
        raise NotSupported("export() is not written yet")

    def rewrite(self, model_bytes: bytes, rewrite: dict, base_dir: str | None = None) -> bytes:
        # TODO({name}): the model after one graph rewrite (docs/adapters.md lists the kinds).
        raise NotSupported("rewrite() is not written yet")
'''


def class_base(name: str) -> str:
    return "".join(part[:1].upper() + part[1:] for part in re.split(r"[^A-Za-z0-9]+", name) if part) or "My"


def check_name(name: str) -> None:
    """An identifier-like name of at most NAME_LIMIT characters: it names a module, a class and files."""
    if len(name) > NAME_LIMIT:
        raise SuiteError(f"adapter name of {len(name):,} characters: at most {NAME_LIMIT}")
    if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_-]*", name) or keyword.iskeyword(name):
        raise SuiteError(f"adapter name {name!r}: use letters, digits, '_' or '-', starting with a letter")


def output_names(name: str) -> tuple[str, str, str]:
    """The adapter module file, the failure list and the report directory new-adapter writes for ``name``."""
    return f"{re.sub(r'[^A-Za-z0-9_]', '_', name)}_adapter.py", f"{name}-failures.txt", f"{name}-report"


def write(name: str, lowered: bool, directory: str | pathlib.Path = ".", run: bool = False) -> tuple[pathlib.Path, str]:
    """Write ``<name>_adapter.py`` and return its path and the adapter spec (``path:Class``).

    Nothing existing is replaced and no symbolic link is followed at the written names: each file is
    created with O_EXCL|O_NOFOLLOW relative to the opened directory. With ``run`` the first run's
    failure list and report must be free too, so a name taken is refused before the suite runs."""
    check_name(name)
    module_file, listing, report = output_names(name)
    base = class_base(name)
    directory_fd = _open_directory(directory, create=True)
    try:
        for taken in (module_file, listing, report) if run else (module_file,):
            _refuse_taken(directory_fd, taken, pathlib.Path(directory) / taken)
        text = (LOWERED if lowered else PLAIN).format(name=name, module=module_file[:-3], cls=f"{base}Adapter",
                                                     cls_base=base)
        path = pathlib.Path(directory) / module_file
        _create_file(directory_fd, module_file, text.encode(), path)
    finally:
        os.close(directory_fd)
    return path, f"{path}:{base}Adapter"


def first_failure_list(spec: str, path: str | pathlib.Path, report_dir: str | pathlib.Path) -> str:
    """Run every case on the new adapter, write its failure list and report; return the summary line.

    Both are written in a private staging directory first, then placed with O_EXCL|O_NOFOLLOW: a name
    taken (or a symbolic link planted) while the suite ran is refused, and nothing is written through it."""
    from conformance import SUITE_VERSION, bundle, failure_list, reports
    from conformance.cases import load_cases
    from conformance.runner import RunConfig, run, summary_line

    path, report_dir = pathlib.Path(path), pathlib.Path(report_dir)
    results, info = run(list(load_cases()), RunConfig(adapter=spec, progress=False))
    with tempfile.TemporaryDirectory(prefix="conformance-new-adapter-") as staging:
        staged_list, staged_report = pathlib.Path(staging) / "failures.txt", pathlib.Path(staging) / "report"
        failure_list.write(staged_list, results,
                           header=f"Expected failures for {info.adapter['name']} (suite {SUITE_VERSION})")
        entries = failure_list.read(staged_list)
        problems = failure_list.apply(entries, results, [r.id for r in results])
        reports.write_all(staged_report, results, info, problems)
        bundle.write(staged_report, results, info, [{"pattern": e.pattern, "message": e.message} for e in entries])
        _place(staged_list, path)
        _place(staged_report, report_dir)
    return summary_line(results)


def _open_directory(directory: str | pathlib.Path, create: bool = False) -> int:
    """A descriptor of the output directory (created when missing); a file or bad path is one line."""
    try:
        if create:
            os.makedirs(directory, exist_ok=True)
        return os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except FileExistsError:
        raise SuiteError(f"--dir {_shown(directory)}: not a directory") from None
    except (OSError, ValueError) as error:
        raise SuiteError(f"--dir {_shown(directory)}: {getattr(error, 'strerror', None) or error}") from None


def _refuse_taken(directory_fd: int, name: str, shown: pathlib.Path) -> None:
    try:
        info = os.stat(name, dir_fd=directory_fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    except OSError as error:
        raise SuiteError(f"{_shown(shown)}: {error.strerror}") from None
    _taken(info, shown)


def _taken(info: os.stat_result | None, shown: pathlib.Path) -> NoReturn:
    if info is not None and stat.S_ISLNK(info.st_mode):
        raise SuiteError(f"{_shown(shown)} is a symbolic link; remove it (nothing is written through links)")
    raise SuiteError(f"{_shown(shown)} already exists; remove it or choose another name or --dir")


def _create_file(directory_fd: int, name: str, data: bytes, shown: pathlib.Path) -> None:
    """Create ``name`` in the directory: never an existing file, never through a symbolic link."""
    try:
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644,
                     dir_fd=directory_fd)
    except FileExistsError:
        _taken(_lstat(directory_fd, name), shown)
    except OSError as error:
        raise SuiteError(f"{_shown(shown)}: {error.strerror}") from None
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)


def _make_directory(directory_fd: int, name: str, shown: pathlib.Path) -> int:
    """Create the directory ``name`` and return its descriptor (never an existing one, never a link)."""
    try:
        os.mkdir(name, 0o755, dir_fd=directory_fd)
        return os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=directory_fd)
    except FileExistsError:
        _taken(_lstat(directory_fd, name), shown)
    except OSError as error:
        raise SuiteError(f"{_shown(shown)}: {error.strerror}") from None


def _place(staged: pathlib.Path, target: pathlib.Path) -> None:
    """Copy the staged file or tree to ``target``, creating every name fresh relative to opened directories."""
    directory_fd = _open_directory(target.parent)
    try:
        _copy(staged, directory_fd, target.name, target)
    finally:
        os.close(directory_fd)


def _copy(staged: pathlib.Path, directory_fd: int, name: str, shown: pathlib.Path) -> None:
    if not staged.is_dir():
        _create_file(directory_fd, name, staged.read_bytes(), shown)
        return
    child_fd = _make_directory(directory_fd, name, shown)
    try:
        for entry in sorted(staged.iterdir()):
            _copy(entry, child_fd, entry.name, shown / entry.name)
    finally:
        os.close(child_fd)


def _lstat(directory_fd: int, name: str) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=directory_fd, follow_symlinks=False)
    except OSError:
        return None


def _shown(path: str | os.PathLike) -> str:
    """A path for a one-line message: long ones are clipped."""
    text = os.fspath(path)
    return text if len(text) <= 200 else f"{text[:200]}... ({len(text):,} characters)"

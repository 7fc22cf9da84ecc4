"""``python -m reference_impl demo``: verify and decode the spec's worked examples and print the figures.

``python -m reference_impl verify MODEL [--base-dir DIR]`` verifies a model file (exit 1 when rejected, 2 when
the file cannot be read: missing, not a regular file, or larger than MAX_MODEL_BYTES). Relative paths are
read from the current directory (``reference_impl.cli_paths``).
"""

from __future__ import annotations

import argparse
import os
import pathlib
import stat
import sys

import numpy as np

from reference_impl import examples, payload
from reference_impl.broken_pipe import quiet_broken_pipe
from reference_impl.cli_paths import user_path
from reference_impl.decode import decode
from reference_impl.errors import ContractError
from reference_impl.verifier import verify_model

#: Largest model file ``verify`` reads: protobuf cannot parse a message of 2 GiB or more anyway.
MAX_MODEL_BYTES = (1 << 31) - 1


def demo() -> int:
    model = examples.spec_example_model()
    verified = verify_model(model)
    print(f"verified spec example model: {len(model.struct_types)} struct types, "
          f"{len(model.graph.encoded_initializer)} encoded values")
    for name, info in verified.encoded.items():
        values = decode(model, name)
        print(f"  {name:18s} {info.extent.length:5d} bytes = {info.record_count:3d} records x "
              f"{info.element_bytes:2d} bytes -> {values.dtype}{list(values.shape)} "
              f"first {np.array2string(values.ravel()[:4], precision=4)}")
    return 0


def read_model_file(path: str | os.PathLike[str]) -> bytes:
    """The bytes of a regular model file. The file is opened without blocking (a FIFO must not hang
    the command) and checked through its descriptor: devices, FIFOs and directories are refused, and so
    is a size beyond MAX_MODEL_BYTES, before anything is read. Raises OSError."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise OSError(f"not a regular file ({_file_kind(info.st_mode)})")
        if info.st_size > MAX_MODEL_BYTES:
            raise OSError(f"{info.st_size} bytes is more than the {MAX_MODEL_BYTES} a model can have")
        data = handle.read(MAX_MODEL_BYTES + 1)
    if len(data) > MAX_MODEL_BYTES:  # it grew after the check
        raise OSError(f"more than the {MAX_MODEL_BYTES} bytes a model can have")
    return data


def _file_kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "a special file"


def verify(path: str | os.PathLike[str], base_dir: str | os.PathLike[str] | None) -> int:
    try:
        data = read_model_file(path)
    except OSError as error:
        print(f"cannot read {path}: {error.strerror or error}", file=sys.stderr)
        return 2
    try:
        verified = verify_model(data, base_dir=str(base_dir or pathlib.Path(path).parent))
    except ContractError as error:
        print(f"rejected: {error.code.value} at {error.path}: {error.message} (clause {error.clause})")
        return 1
    print(f"accepted: {len(verified.model.struct_types)} struct types, {len(verified.encoded)} encoded values")
    return 0


@quiet_broken_pipe
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reference_impl", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("demo", help="verify and decode the spec's worked examples")
    verify_parser = commands.add_parser("verify", help="verify a model file")
    verify_parser.add_argument("model", type=user_path)
    verify_parser.add_argument("--base-dir", type=user_path,
                               help="directory external data is read from (default: the model's directory)")
    args = parser.parse_args(argv)
    payload.set_external_access("read")  # a file changing under the command must not kill it
    if args.command == "demo":
        return demo()
    return verify(args.model, args.base_dir)


if __name__ == "__main__":
    sys.exit(main())

"""``python -m reference_impl demo``: verify and decode the spec's worked examples and print the figures.

``python -m reference_impl verify MODEL [--base-dir DIR]`` verifies a model file (exit 1 when rejected, 2 when
the file cannot be read).
"""

from __future__ import annotations

import argparse
import pathlib
import sys

import numpy as np

from reference_impl import ContractError, decode, examples, verify_model
from reference_impl.broken_pipe import quiet_broken_pipe


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


def verify(path: str, base_dir: str | None) -> int:
    try:
        data = pathlib.Path(path).read_bytes()
    except OSError as error:
        print(f"cannot read {path}: {error.strerror or error}", file=sys.stderr)
        return 2
    try:
        verified = verify_model(data, base_dir=base_dir or str(pathlib.Path(path).parent))
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
    verify_parser.add_argument("model")
    verify_parser.add_argument("--base-dir")
    args = parser.parse_args(argv)
    if args.command == "demo":
        return demo()
    return verify(args.model, args.base_dir)


if __name__ == "__main__":
    sys.exit(main())

"""Build a proto library with protoc's lite runtime and g++ -O2, exporting a deliberate symbol list.

``python -m size_gate.protoc_lib PROTO --out DIR [--name NAME] [--exports deliberate|default]`` writes
``DIR/lib<NAME>.so`` stripped like an install step (the file the gate measures), the version script
``DIR/lib<NAME>.map`` and the exported names ``DIR/lib<NAME>.exports``. ci/native.sh builds one from
onnx's onnx-ml.proto and one from reference_impl/proto/onnx-light.proto and compares them with
``python -m size_gate compare`` against size_gate/budgets/protoc_lite.toml.

The export list is what users of a proto library need, derived from the generated code itself:

- every library symbol the generated header's inline functions reference (found by compiling the
  header alone with ``-fkeep-inline-functions``), so every accessor the header defines links;
- for every top-level message, a complete value type and the operations users call on one: the
  complete-object constructors (default, copy), the complete and deleting destructors, ``CopyFrom``,
  ``InternalSwap`` (move and ``Swap``), ``MergeFrom``, ``Clear`` and ``ByteSizeLong``. Parsing and
  serializing go through ``google::protobuf::MessageLite``'s non-virtual entry points, compiled into
  libprotobuf-lite, which reach the generated code through the vtable.

Hidden: nested messages' own constructors, assignment and swap (``StructTypeProto.Structure.Field`` is
a part, reached through its parent's accessors such as ``mutable_structure()->add_field()``), the
accessors protoc defines out of line (``set_allocated_*`` of a oneof member: use ``mutable_*``), the other
virtual overrides (``IsInitialized`` is always true without required fields, ``GetTypeName`` is a
debugging aid; the generated classes are final, so a call on the concrete type binds to the hidden
symbol and does not link), base-object constructor and destructor variants, vtables and type_info, and
protobuf and libstdc++ template instantiations.
"""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from elftools.elf.elffile import ELFFile

LITE_OPTION = "option optimize_for = LITE_RUNTIME;"
#: Members of a nested message hidden even when the header references them (its inline default
#: constructor and assignment operators): Itanium C1/C2 are the constructors.
NESTED_HIDDEN = {"C1", "C2", "CopyFrom", "InternalSwap"}
#: Members every top-level message exports: C1 constructors, D0/D1 destructors and the operations users
#: call on a message object.
TOP_LEVEL_MEMBERS = {"C1", "D0", "D1", "CopyFrom", "InternalSwap", "MergeFrom", "Clear", "ByteSizeLong"}


class BuildError(Exception):
    """A tool failed or is missing; the message says which and shows its output."""


@dataclass(frozen=True)
class Classes:
    """The C++ classes protoc generates for one .proto file."""

    prefix: str  # mangled namespace prefix, e.g. "4onnx"
    top_level: frozenset[str]
    nested: frozenset[str]

    def member(self, symbol: str) -> tuple[str, str] | None:
        """(class, member) for a member symbol of a generated class, else None. Constructors and
        destructors are named by their Itanium variant: C1, C2, D0, D1, D2."""
        match = re.match(r"_ZNK?" + re.escape(self.prefix) + r"(\d+)", symbol)
        if not match:
            return None
        start = match.end()
        cls = symbol[start:start + int(match[1])]
        if cls not in self.top_level and cls not in self.nested:
            return None
        rest = symbol[start + int(match[1]):]
        if re.match(r"[CD]\d", rest):
            return cls, rest[:2]
        name = re.match(r"(\d+)", rest)
        return (cls, rest[name.end():name.end() + int(name[1])]) if name else (cls, rest)


def select_exports(defined: set[str], header_needs: set[str], classes: Classes) -> set[str]:
    """The deliberate export list (see the module docstring) among the library's ``defined`` symbols."""
    exports = set()
    for symbol in header_needs & defined:
        member = classes.member(symbol)
        if member is None or member[0] not in classes.nested or member[1] not in NESTED_HIDDEN:
            exports.add(symbol)
    for symbol in defined:
        member = classes.member(symbol)
        if member and member[0] in classes.top_level and member[1] in TOP_LEVEL_MEMBERS:
            exports.add(symbol)
    return exports


def version_script(exports: set[str]) -> str:
    listed = ["  global:"] + [f"    {name};" for name in sorted(exports)] if exports else []
    return "\n".join(["{", *listed, "  local: *;", "};"]) + "\n"


# ------------------------------------------------------------------------------------------ building
def _run(command: list[str], what: str) -> None:
    try:
        done = subprocess.run(command, capture_output=True, text=True)
    except FileNotFoundError:
        raise BuildError(f"{what}: {command[0]} is not installed") from None
    if done.returncode:
        raise BuildError(f"{what} failed ({' '.join(command)}):\n{done.stderr or done.stdout}")


def _classes(descriptor_set: Path) -> Classes:
    from google.protobuf import descriptor_pb2

    files = descriptor_pb2.FileDescriptorSet.FromString(descriptor_set.read_bytes())
    proto = files.file[-1]
    prefix = "".join(f"{len(part)}{part}" for part in proto.package.split(".") if part)
    nested: set[str] = set()

    def walk(message, outer: str) -> None:
        for inner in message.nested_type:
            if inner.options.map_entry:
                continue
            name = f"{outer}_{inner.name}"
            nested.add(name)
            walk(inner, name)

    for message in proto.message_type:
        walk(message, message.name)
    return Classes(prefix, frozenset(m.name for m in proto.message_type), frozenset(nested))


def _symbols(object_file: Path) -> tuple[set[str], set[str]]:
    """(defined, undefined) global and weak symbol names of a relocatable object."""
    defined, undefined = set(), set()
    with open(object_file, "rb") as handle:
        table = ELFFile(handle).get_section_by_name(".symtab")
        for symbol in table.iter_symbols():
            if not symbol.name or symbol["st_info"]["bind"] not in ("STB_GLOBAL", "STB_WEAK"):
                continue
            if symbol["st_shndx"] == "SHN_UNDEF":
                undefined.add(symbol.name)
            elif symbol["st_other"]["visibility"] == "STV_DEFAULT":
                defined.add(symbol.name)
    return defined, undefined


def build(proto: Path, out: Path, name: str, exports: str = "deliberate", cxx: str = "g++",
          protoc: str = "protoc") -> Path:
    """Build ``out/lib<name>.so`` from ``proto``; returns its path."""
    work = out / f"{name}.build"
    work.mkdir(parents=True, exist_ok=True)
    text = proto.read_text()
    if "optimize_for" not in text:
        text += f"\n{LITE_OPTION}\n"
    source = work / proto.name
    source.write_text(text)
    descriptor = work / f"{proto.stem}.descriptor"
    _run([protoc, f"--proto_path={work}", f"--cpp_out={work}", f"--descriptor_set_out={descriptor}", str(source)],
         "protoc")
    obj = work / f"{proto.stem}.pb.o"
    _run([cxx, "-O2", "-fPIC", "-c", f"-I{work}", str(work / f"{proto.stem}.pb.cc"), "-o", str(obj)], "compile")
    link = [cxx, "-shared", "-O2", "-o", str(work / f"lib{name}.so"), str(obj)]
    if exports == "deliberate":
        probe = work / "header_probe.cc"
        probe.write_text(f'#include "{proto.stem}.pb.h"\n')
        _run([cxx, "-O0", "-fkeep-inline-functions", "-c", f"-I{work}", str(probe), "-o", str(work / "probe.o")],
             "compile the header probe")
        defined, _ = _symbols(obj)
        _, needed = _symbols(work / "probe.o")
        chosen = select_exports(defined, needed, _classes(descriptor))
        (out / f"lib{name}.map").write_text(version_script(chosen))
        (out / f"lib{name}.exports").write_text("".join(f"{s}\n" for s in sorted(chosen)))
        link.append(f"-Wl,--version-script={out / f'lib{name}.map'}")
    elif exports != "default":
        raise BuildError(f"exports must be 'deliberate' or 'default', not {exports!r}")
    _run(link + ["-lprotobuf-lite"], "link")
    installed = out / f"lib{name}.so"
    _run(["strip", "-o", str(installed), str(work / f"lib{name}.so")], "strip")
    return installed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m size_gate.protoc_lib", description=__doc__.splitlines()[0])
    parser.add_argument("proto", type=Path)
    parser.add_argument("--out", type=Path, required=True, help="output directory")
    parser.add_argument("--name", help="library name (default: the .proto's name with '-' as '_' plus '_proto')")
    parser.add_argument("--exports", choices=("deliberate", "default"), default="deliberate",
                        help="deliberate export list (default) or default visibility")
    parser.add_argument("--cxx", default=shutil.which("g++") or "g++")
    args = parser.parse_args(argv)
    name = args.name or args.proto.stem.replace("-", "_") + "_proto"
    try:
        print(build(args.proto, args.out, name, args.exports, args.cxx))
    except (BuildError, OSError) as error:
        print(f"size_gate.protoc_lib: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

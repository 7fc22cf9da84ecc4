"""The size gate on protoc-built proto libraries: the budget of its own (size_gate/budgets/protoc_lite.toml),
delta-only stages, the deliberate export list (size_gate/protoc_lib.py) and a user program that builds,
copies and reads messages through that list."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest
from native_toolchain import ROOT, require_toolchain

from size_gate import SizeGateError, load_budget
from size_gate.cli import main as size_gate_main
from size_gate.metrics import measure_elf
from size_gate.protoc_lib import BuildError, Classes, build, select_exports, version_script

BUDGET = ROOT / "size_gate" / "budgets" / "protoc_lite.toml"
SPEC = Path("/work/shared/spec/custom-quantized-persistent-values.txt")

DEMO_PROTO = """
syntax = "proto2";
package demo.v1;
message Leaf { optional int32 x = 1; }
message Tree {
  message Branch { optional string name = 1; repeated Leaf leaves = 2; }
  repeated Branch branches = 1;
  oneof kind { Leaf leaf = 2; int64 count = 3; }
  optional Leaf plain = 4;
}
"""

# What a user of the library does: read and build through accessors (nested messages through their
# parent), copy, move, clear, measure and destroy top-level messages, parse and serialize.
USER_PROGRAM = r"""
#include <cstdio>
#include <string>
#include <utility>
#include "demo.pb.h"

int main() {
  demo::v1::Tree tree;
  auto* branch = tree.add_branches();
  branch->set_name("left");
  branch->add_leaves()->set_x(7);
  tree.mutable_leaf()->set_x(3);
  tree.mutable_plain()->set_x(5);
  std::string bytes;
  if (!tree.SerializeToString(&bytes)) return 1;
  demo::v1::Tree parsed;
  if (!parsed.ParseFromString(bytes)) return 2;
  demo::v1::Tree copy(parsed);
  demo::v1::Tree moved(std::move(copy));
  demo::v1::Tree assigned;
  assigned = moved;
  demo::v1::Leaf leaf = assigned.leaf();
  auto* heap = new demo::v1::Tree(assigned);
  std::printf("%s %d %d %d %d %zu\n", heap->branches(0).name().c_str(), heap->branches(0).leaves(0).x(),
              leaf.x(), heap->plain().x(), static_cast<int>(heap->kind_case()), heap->ByteSizeLong());
  heap->MergeFrom(tree);
  heap->Clear();
  std::printf("%d\n", heap->branches_size());
  delete heap;
  return 0;
}
"""


# -------------------------------------------------------------------------------------------- budget
def test_budget_gates_the_spec_pr02_allowances_as_deltas_only():
    budget = load_budget(BUDGET)
    stage = budget.stage()
    assert stage.name == "PR02" and stage.gate_deltas and stage.base is None
    assert stage.limits == {} and budget.baseline == {} and budget.ceiling == {}
    assert stage.allowance == {"installed_bytes": 128 * 1024, "text_bytes": 96 * 1024, "defined_symbols": 64}
    assert stage.allowance == load_budget().stage("PR02").allowance  # the same figures as onnx_proto.toml


def test_budget_allowances_are_the_sentence_in_the_spec():
    if not SPEC.exists():
        pytest.skip("the spec text is not available here")
    flat = re.sub(r"\s+", " ", SPEC.read_text(encoding="utf-8"))
    found = re.search(r"PR02 may add at most (\d+) KiB of stripped size, (\d+) KiB of \.text and (\d+) dynamic",
                      flat).groups()
    allowance = load_budget(BUDGET).stage().allowance
    assert (allowance["installed_bytes"], allowance["text_bytes"], allowance["defined_symbols"]) == (
        int(found[0]) * 1024, int(found[1]) * 1024, int(found[2]))


def test_an_allowance_without_a_base_must_gate_deltas(tmp_path):
    text = BUDGET.read_text().replace("gate_deltas = true", "")
    (tmp_path / "budget.toml").write_text(text)
    with pytest.raises(SizeGateError) as error:
        load_budget(tmp_path / "budget.toml")
    assert error.value.code == "bad-budget" and "gate_deltas" in str(error.value)


def test_check_refuses_a_stage_that_only_gates_deltas(capsys):
    library = next(Path(p) for p in (ROOT / "tests" / "fixtures" / "elf").glob("*.so"))
    assert size_gate_main(["check", str(library), "--budget", str(BUDGET)]) == 2
    assert "use compare" in capsys.readouterr().err


# ------------------------------------------------------------------------------------- export list
CLASSES = Classes("4demo2v1", frozenset({"Tree", "Leaf"}), frozenset({"Tree_Branch"}))


def test_export_list_keeps_header_needs_and_top_level_values_but_not_nested_values():
    tree, branch, leaf = "_ZN4demo2v14Tree", "_ZN4demo2v111Tree_Branch", "_ZNK4demo2v14Leaf"
    defined = {
        f"{tree}D0Ev", f"{tree}D1Ev", f"{tree}D2Ev", f"{tree}C1ERKS1_", f"{tree}C2ERKS1_", f"{tree}5ClearEv",
        f"{tree}9MergeFromERKS1_", f"{tree}10clear_kindEv", f"{tree}14_InternalParseEPKcPN6google8protobuf8internal12"
        "ParseContextE", f"{leaf}12ByteSizeLongEv", f"{leaf}13IsInitializedEv", f"{leaf}11GetTypeNameB5cxx11Ev",
        f"{branch}D1Ev", f"{branch}C1ERKS1_", f"{branch}C1EPN6google8protobuf5ArenaEb", f"{branch}8CopyFromERKS1_",
        f"{branch}12InternalSwapEPS1_", f"{branch}5ClearEv", "_ZN4demo2v124_Tree_default_instance_E",
    }
    header_needs = {
        f"{branch}C1EPN6google8protobuf5ArenaEb", f"{branch}8CopyFromERKS1_", f"{branch}12InternalSwapEPS1_",
        f"{branch}5ClearEv", f"{tree}10clear_kindEv", "_ZN4demo2v124_Tree_default_instance_E",
        "_ZN6google8protobuf8internal14ArenaStringPtr3SetEv",  # not the library's: never exported
    }
    assert select_exports(defined, header_needs, CLASSES) == {
        f"{branch}5ClearEv",  # the header's clear_branches() calls it on every element
        f"{tree}10clear_kindEv", "_ZN4demo2v124_Tree_default_instance_E",
        f"{tree}D0Ev", f"{tree}D1Ev", f"{tree}C1ERKS1_", f"{tree}5ClearEv", f"{tree}9MergeFromERKS1_",
        f"{leaf}12ByteSizeLongEv",
    }


def test_members_are_read_from_mangled_names():
    assert CLASSES.member("_ZNK4demo2v14Tree12ByteSizeLongEv") == ("Tree", "ByteSizeLong")
    assert CLASSES.member("_ZN4demo2v111Tree_BranchC2ERKS1_") == ("Tree_Branch", "C2")
    assert CLASSES.member("_ZN4demo2v14LeafD0Ev") == ("Leaf", "D0")
    assert CLASSES.member("_ZN4demo2v14Twig5ClearEv") is None  # not a generated class
    assert CLASSES.member("_ZN6google8protobuf5Arena18CreateMaybeMessageIN4demo2v14LeafEJEEEPT_PS1_DpOT0_") is None
    assert version_script({"b", "a"}) == "{\n  global:\n    a;\n    b;\n  local: *;\n};\n"


@pytest.fixture(scope="module")
def demo_libraries(tmp_path_factory):
    require_toolchain("g++", "protoc", "strip")
    out = tmp_path_factory.mktemp("protoc_lib")
    proto = out / "demo.proto"
    proto.write_text(DEMO_PROTO)
    deliberate = build(proto, out / "deliberate", "demo_proto")
    everything = build(proto, out / "default", "demo_proto", exports="default")
    return out, deliberate, everything


def _measure(path: Path):
    with open(path, "rb") as handle:
        return measure_elf(handle, str(path))


def test_the_deliberate_library_exports_exactly_its_list(demo_libraries):
    out, deliberate, everything = demo_libraries
    listed = set((out / "deliberate" / "libdemo_proto.exports").read_text().split())
    assert set(_measure(deliberate).symbols) == listed
    assert "_ZN4demo2v14TreeD1Ev" in listed and "_ZN4demo2v111Tree_BranchC1ERKS1_" not in listed
    assert not any(name.startswith(("_ZTV", "_ZTI", "_ZTS")) for name in listed)  # vtables and type_info hidden
    assert len(_measure(everything).symbols) > 2 * len(listed)
    assert _measure(deliberate).needed == _measure(everything).needed


def test_a_user_program_builds_copies_and_reads_through_the_deliberate_list(demo_libraries, tmp_path):
    out, deliberate, _ = demo_libraries
    (tmp_path / "user.cc").write_text(USER_PROGRAM)
    work = out / "deliberate" / "demo_proto.build"
    subprocess.run(["g++", "-std=c++17", "-O2", str(tmp_path / "user.cc"), f"-I{work}", str(deliberate),
                    "-lprotobuf-lite", "-o", str(tmp_path / "user")], check=True)
    done = subprocess.run([str(tmp_path / "user")], capture_output=True, text=True, check=True,
                          env=dict(os.environ, LD_LIBRARY_PATH=str(deliberate.parent)))
    # 20 bytes: branches 2 + (name 2 + 4, leaves 2 + 2), leaf 2 + 2, plain 2 + 2; kind_case 2 is the leaf field
    assert done.stdout.split("\n")[:2] == ["left 7 3 5 2 20", "0"]


def test_the_gate_fails_without_the_deliberate_list(demo_libraries, tmp_path, capsys):
    """Against a baseline holding only Leaf, the deliberate list fits an allowance of exactly what it adds;
    the same library with default visibility does not."""
    out, deliberate, everything = demo_libraries
    base = tmp_path / "base.proto"
    base.write_text('syntax = "proto2";\npackage demo.v1;\nmessage Leaf { optional int32 x = 1; }\n')
    baseline = build(base, tmp_path / "base", "base_proto")
    added = len(_measure(deliberate).symbols) - len(_measure(baseline).symbols)
    budget = tmp_path / "budget.toml"
    budget.write_text(BUDGET.read_text().replace("defined_symbols = 64", f"defined_symbols = {added}"))
    assert size_gate_main(["compare", str(baseline), str(deliberate), "--budget", str(budget)]) == 0
    assert size_gate_main(["compare", str(baseline), str(everything), "--budget", str(budget)]) == 1
    capsys.readouterr()


def test_the_builder_names_a_missing_tool(tmp_path):
    require_toolchain("protoc")
    (tmp_path / "x.proto").write_text(DEMO_PROTO)
    with pytest.raises(BuildError, match="no-such-compiler is not installed"):
        build(tmp_path / "x.proto", tmp_path, "x_proto", cxx="no-such-compiler")

"""The vendor guide in docs/testee-protocol.md works as written: its CMakeLists.txt and main.cc, in a
fresh directory next to a checkout of the suite, build a testee that speaks the protocol."""

from __future__ import annotations

import re
import subprocess

import pytest
from native_toolchain import ROOT, require_toolchain

from conformance import protocol
from conformance.adapters import Rejected, load_adapter

GUIDE = ROOT / "docs" / "testee-protocol.md"


def _blocks(language: str) -> list[str]:
    section = GUIDE.read_text().split("## From an empty directory to a certified runtime", 1)[1].split("\n## ", 1)[0]
    return re.findall(rf"```{language}\n(.*?)```", section, re.S)


def test_the_guide_has_one_cmake_file_and_one_main():
    assert len(_blocks("cmake")) == 1 and len(_blocks("cpp")) == 1
    assert "add_subdirectory(suite/conformance/sdk/cpp" in _blocks("cmake")[0]


@pytest.fixture(scope="module")
def guide_testee(tmp_path_factory):
    require_toolchain()
    work = tmp_path_factory.mktemp("my-runtime")
    (work / "suite").symlink_to(ROOT)  # the guide's `git clone ... suite`
    (work / "CMakeLists.txt").write_text(_blocks("cmake")[0])
    (work / "main.cc").write_text(_blocks("cpp")[0])
    for command in (["cmake", "-S", str(work), "-B", str(work / "build")],
                    ["cmake", "--build", str(work / "build"), "-j2"]):
        done = subprocess.run(command, capture_output=True, text=True)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return work / "build" / "my-testee"


def test_the_guide_runtime_speaks_the_protocol(guide_testee):
    adapter = load_adapter(testee=str(guide_testee))
    try:
        assert (adapter.name, adapter.profiles()) == ("my-runtime", {"affine"})
        assert adapter.protocol_version == protocol.PROTOCOL_VERSION and not adapter.supports_hold
        adapter.verify(b"", None)  # an empty message parses
        with pytest.raises(Rejected) as rejected:
            adapter.verify(b"\xff\xff", None)
    finally:
        adapter.shutdown()
    assert rejected.value.code == "MODEL_PARSE_ERROR"

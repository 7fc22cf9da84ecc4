"""size_gate on crafted input (docs/security.md): note sizes claiming gigabytes are bounded by the file
(``corrupt``, exit 2, no traceback, no bogus build ID) and a wheel member is streamed, not read whole;
hostile budget files (huge numbers, deep nesting, devices, FIFOs, directories, every wrong value type)
are one-line errors with exit 2, never "over budget"; a library swapped for a FIFO never blocks the
gate; and names from a candidate library cannot break or inject into the Markdown report."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import re
import resource
import struct
import subprocess
import sys
import tracemalloc
import zipfile
from pathlib import Path

import pytest
from elftools.elf.elffile import ELFFile

from size_gate import SizeGateError, compare, delta_findings, evaluate, load_budget, measure_elf, measure_path
from size_gate.cli import main
from size_gate.render import check_text, compare_markdown, measure_text

REPO = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).parent / "fixtures" / "elf"
DEFAULT = FIXTURES / "default.so"


def _note_offset(path: Path) -> int:
    with open(path, "rb") as handle:
        return next(seg["p_offset"] for seg in ELFFile(handle).iter_segments() if seg["p_type"] == "PT_NOTE")


@pytest.mark.parametrize("word,value", [(0, 0xFFFFFFF0), (4, 0xFFFFFFF0), (4, 0x7FFFFFFF), (0, 0x1000)],
                         ids=["name-4GiB", "descriptor-4GiB", "descriptor-2GiB", "name-past-segment"])
def test_note_sizes_are_bounded_by_the_note_region(tmp_path, word, value):
    data = bytearray(DEFAULT.read_bytes())
    struct.pack_into("<I", data, _note_offset(DEFAULT) + word, value)
    crafted = tmp_path / "libsg_proto.so"
    crafted.write_bytes(bytes(data))
    with pytest.raises(SizeGateError) as info:
        measure_elf(io.BytesIO(bytes(data)), "crafted")
    assert info.value.code == "corrupt" and "note" in info.value.message
    done = subprocess.run([sys.executable, "-m", "size_gate", "measure", str(crafted)], capture_output=True,
                          text=True, timeout=120, cwd=REPO)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert "corrupt" in done.stderr and done.stderr.count("\n") == 1


def test_the_untouched_fixture_keeps_its_build_id():
    assert measure_elf(io.BytesIO(DEFAULT.read_bytes()), "fixture").build_id


def test_a_wheel_member_is_streamed(tmp_path):
    """A 64 MiB member (the library padded with zeros, compressing to almost nothing) is measured with
    a peak far below its size; reading it whole then copying it to a buffer took about twice."""
    size = 64 << 20
    library = DEFAULT.read_bytes()
    wheel = tmp_path / "pkg-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("pkg/libsg_proto.so", library + bytes(size - len(library)))
    tracemalloc.start()
    try:
        metrics = measure_path(wheel, "libsg_proto.so")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert metrics.installed_bytes == size and metrics.build_id
    assert peak < size // 8, peak


# -- hostile budget files ------------------------------------------------------------------------------
VALID_BUDGET = """format = 1
[library]
pattern = "*.so"
[baseline]
name = "base"
installed_bytes = 100000
text_bytes = 1000
[ceiling]
installed_bytes = "1.2 MiB"
[stages.A]
description = "first"
base = "baseline"
allowance = { installed_bytes = "1 KiB" }
[stages.B]
limits = { text_bytes = 5000 }
within_ceiling = true
gate_deltas = false
[gate]
stage = "A"
[dt_needed]
allowed = ["libc"]
"""
#: (line of VALID_BUDGET, replacement) pairs: every value position given values of every wrong shape.
WRONG_VALUES = ["[1, 2]", "{ a = 1 }", "true", "1.5", "-1", "1979-05-27T07:32:00Z", '"x"', "[[[[]]]]", "9" * 30,
                '"' + "9" * 5000 + ' KiB"', '"' + " " * 5000 + '1 KiB"']
POSITIONS = ["format = 1", 'pattern = "*.so"', 'name = "base"', "installed_bytes = 100000",
             'installed_bytes = "1.2 MiB"', 'description = "first"', 'base = "baseline"',
             'allowance = { installed_bytes = "1 KiB" }', "limits = { text_bytes = 5000 }", "within_ceiling = true",
             "gate_deltas = false", 'stage = "A"', 'allowed = ["libc"]']


def _limited():
    """The child may not take more than 2 GiB (so a parser blowing up cannot take the machine)."""
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))


def _gate(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "size_gate", *argv], capture_output=True, text=True, cwd=REPO,
                          timeout=120, preexec_fn=_limited, env={**os.environ, "OPENBLAS_NUM_THREADS": "1"})


def _one_line(err: str) -> str:
    assert err.count("\n") == 1 and err.startswith("size_gate: error [") and "Traceback" not in err, err[-3000:]
    return err


def test_the_valid_budget_used_below_loads(tmp_path):
    budget = tmp_path / "b.toml"
    budget.write_text(VALID_BUDGET)
    loaded = load_budget(budget)
    assert loaded.stage("A").limits == {"installed_bytes": 101024} and loaded.stage("B").within_ceiling


@pytest.mark.parametrize("position", POSITIONS)
def test_a_value_of_the_wrong_shape_is_a_bad_budget_never_a_traceback(tmp_path, capsys, position):
    budget = tmp_path / "b.toml"
    key = position.split(" = ")[0]
    for wrong in WRONG_VALUES:
        text = VALID_BUDGET.replace(position, f"{key} = {wrong}", 1)
        budget.write_text(text)
        try:
            load_budget(budget)
        except SizeGateError as error:
            assert error.code == "bad-budget" and "\n" not in str(error) and len(str(error)) < 1500, str(error)
            assert main(["check", str(DEFAULT), "--budget", str(budget)]) == 2
            _one_line(capsys.readouterr().err)
        else:  # any string is a pattern, a name or a description; true is a flag's other value
            assert (key in ("pattern", "name", "description") and wrong.startswith('"')) or \
                (key in ("within_ceiling", "gate_deltas") and wrong == "true"), (key, wrong)
            assert main(["check", str(DEFAULT), "--budget", str(budget)]) in (0, 1)
            capsys.readouterr()


@pytest.mark.parametrize("text", [
    "format = " + "9" * 5000,
    VALID_BUDGET.replace("text_bytes = 1000", "text_bytes = " + "9" * 5000),
    VALID_BUDGET.replace("text_bytes = 1000", "text_bytes = " + "9" * 4000),
    VALID_BUDGET.replace('"1.2 MiB"', '"' + "9" * 5000 + ' GiB"'),
    "a = " + "[" * 100_000 + "]" * 100_000,
    "a = " + "[" * 20_000 + "]" * 20_000,
    "a = " + "{ b = " * 5_000 + "1" + " }" * 5_000,
    "a." * 30_000 + "b = 1",
    "[" + "a." * 30_000 + "b]",
    "'x'." * 15_000 + "b = 1",
    '"\\u0000' + "\\" * 60_000 + '" = 1',
    "\xff\xfe not utf-8",
], ids=["format-5000-digits", "figure-5000-digits", "figure-4000-digits", "size-5000-digits", "arrays-1e5-deep",
        "arrays-2e4-deep", "inline-tables-5e3-deep", "dotted-key-3e4-deep", "table-header-3e4-deep",
        "quoted-dotted-key", "long-escapes", "not-utf8"])
def test_huge_numbers_and_deep_nesting_are_one_line_errors(tmp_path, text):
    budget = tmp_path / "b.toml"
    budget.write_bytes(text.encode("latin-1") if text.startswith("\xff") else text.encode())
    done = _gate("check", str(DEFAULT), "--budget", str(budget))
    assert done.returncode == 2 and done.stdout == "", done.stdout[-2000:]
    _one_line(done.stderr)


def test_devices_fifos_directories_and_links_to_them_are_refused_without_blocking(tmp_path):
    fifo = tmp_path / "budget.fifo"
    os.mkfifo(fifo)
    for name, target in (("zero", "/dev/zero"), ("fifo", fifo), ("dir", tmp_path)):
        (tmp_path / f"link-to-{name}.toml").symlink_to(target)
    for budget in ("/dev/zero", fifo, tmp_path, *sorted(tmp_path.glob("link-to-*"))):
        done = _gate("check", str(DEFAULT), "--budget", str(budget))
        assert done.returncode == 2, (budget, done.stderr[-2000:])
        assert "[unreadable]" in _one_line(done.stderr) and "regular file" in done.stderr


def test_an_oversized_budget_is_refused_unread(tmp_path, capsys):
    budget = tmp_path / "big.toml"
    budget.write_text(VALID_BUDGET + "# " + "x" * (1 << 20) + "\n")
    assert main(["check", str(DEFAULT), "--budget", str(budget)]) == 2
    assert "at most" in _one_line(capsys.readouterr().err)


def test_shipped_budgets_are_addressable_by_name(capsys):
    assert load_budget("onnx_proto").path == str(REPO / "size_gate" / "budgets" / "onnx_proto.toml")
    assert load_budget("protoc_lite").default_stage == "PR02"
    assert main(["check", str(DEFAULT), "--budget", "onnx_proto", "--pattern", "*.so"]) in (0, 1)
    assert "budget " + str(REPO / "size_gate" / "budgets" / "onnx_proto.toml") in capsys.readouterr().out
    assert main(["check", str(DEFAULT), "--budget", "no_such_budget"]) == 2
    err = _one_line(capsys.readouterr().err)
    assert "[not-found]" in err and "onnx_proto, protoc_lite" in err


# -- a library swapped for a FIFO ------------------------------------------------------------------------
SWAPPER = """
import os, sys
target, library, fifo = sys.argv[1:]
while True:
    os.link(library, target + ".lib")
    os.rename(target + ".lib", target)
    os.mkfifo(target + ".fifo")
    os.rename(target + ".fifo", target)
"""
MEASURER = """
import json, sys
from size_gate import SizeGateError, measure_path
outcomes = {"measured": 0, "refused": 0}
for _ in range(int(sys.argv[2])):
    try:
        measure_path(sys.argv[1], "*.so")
        outcomes["measured"] += 1
    except SizeGateError as error:
        assert error.code in ("unreadable", "not-found"), error
        outcomes["refused"] += 1
print(json.dumps(outcomes))
"""


def test_a_library_swapped_for_a_fifo_never_blocks_the_gate(tmp_path):
    """One process flips a path between the library and a FIFO while another measures it 3,000 times:
    each measurement finishes (measured or refused as not a regular file). Checking the path before
    opening it by name let an open land on the FIFO and wait for a writer that never comes."""
    target = tmp_path / "libswap.so"
    swapper = subprocess.Popen([sys.executable, "-c", SWAPPER, str(target), str(DEFAULT), "unused"])
    try:
        done = subprocess.run([sys.executable, "-c", MEASURER, str(target), "3000"], capture_output=True,
                              text=True, cwd=REPO, timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail("a measurement blocked on the FIFO")
    finally:
        swapper.kill()
        swapper.wait()
    assert done.returncode == 0, done.stderr[-3000:]
    outcomes = json.loads(done.stdout)
    assert outcomes["measured"] + outcomes["refused"] == 3000 and outcomes["measured"] and outcomes["refused"]


# -- names from the candidate library in reports ----------------------------------------------------------
HOSTILE = "libevil|x`y``<script>alert(1)</script>\n| Metric | injected |\n[x](javascript:alert(1))\x1b[2J_*~$.so"


def _strip_inert(line: str) -> str:
    """The line without its code spans (CommonMark: a backtick run closed by the next run of equal
    length) and without backslash-escaped characters: what is left is interpreted as Markdown."""
    out, i = [], 0
    while i < len(line):
        if line[i] == "\\" and i + 1 < len(line):
            i += 2
            continue
        if line[i] == "`":
            run = len(line[i:]) - len(line[i:].lstrip("`"))
            closing = re.compile(rf"(?<!`)`{{{run}}}(?!`)").search(line, i + run)
            if closing:
                i = closing.end()
                continue
            out.append(line[i:i + run])
            i += run
            continue
        out.append(line[i])
        i += 1
    return "".join(out)


def _reports(soname: str):
    base = measure_path(DEFAULT, "*.so")
    candidate = dataclasses.replace(base, soname=soname, path=f"/wheels/{soname}", needed=(*base.needed, soname),
                                    symbols=(*base.symbols, soname, "`" * 7 + soname))
    budget = load_budget("onnx_proto")
    stage = budget.stage()
    findings = evaluate(candidate, budget, stage) + delta_findings(base, candidate, stage)
    return (compare_markdown(compare(base, candidate), stage, findings), check_text(candidate, budget, stage, findings),
            measure_text(candidate, with_symbols=True))


def test_candidate_names_cannot_break_the_markdown_table_or_inject_markup():
    benign_md, benign_check, benign_measure = _reports("libbenign.so")
    markdown, checked, measured = _reports(HOSTILE)
    lines = markdown.splitlines()
    assert len(lines) == len(benign_md.splitlines())
    assert [line for line in lines if line.startswith("|")] == [line for line in benign_md.splitlines()
                                                                if line.startswith("|")]
    fence = None
    for line, benign in zip(lines, benign_md.splitlines()):
        if fence is not None:  # inside a fenced symbol list: only the same fence closes it
            assert line == fence or not line.startswith(fence), line
            fence = None if line == fence else fence
        elif line.startswith("```"):
            fence = line
        elif line != benign:  # a line carrying the names: nothing in it is live Markdown
            assert not re.search(r"[<>\[\]`|$~]", _strip_inert(line)) and "\x1b" not in line, line
    assert fence is None
    for text, benign in ((checked, benign_check), (measured, benign_measure)):
        assert len(text.splitlines()) == len(benign.splitlines())
        assert not any(ord(c) < 32 and c != "\n" for c in text)


def test_error_lines_stay_one_line_whatever_a_name_holds():
    error = SizeGateError("ambiguous", "/w/x\n.whl", "2 files match: a\nb, " + "c" * 10_000)
    assert "\n" not in str(error) and len(str(error)) < 2000

"""Verification speed on huge declarations, and the time and peak memory of every hostile-input class's
worst case (docs/security.md).

Part 1 verifies one declaration of N UINT8 fields and prints the ratio to the peer measured in the same
run: protobuf parsing the same bytes (the floor any verifier pays). Up to the MAX_TYPE_NODES limit the
time grows linearly; 10**6 fields are refused with RESOURCE_LIMIT before they are walked.

Part 2 runs each worst case in fresh child processes and prints its wall time, its peak traced heap
(tracemalloc, in a second run since tracing slows it) and the peak resident memory it added over the
child's baseline (after imports).

    python benchmarks/bench_verify.py [--repeat 5] [--skip-hostile]
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from conformance.wire import field, field_varint  # noqa: E402
from reference_impl import ContractError, schema, verify_model  # noqa: E402
from reference_impl.structs import MAX_TYPE_NODES  # noqa: E402


def wide_struct(fields: int) -> bytes:
    """ModelProto bytes: one declaration of ``fields`` UINT8 fields and one record using it."""
    leaf = field(2, field(1, field_varint(1, 2) + field(2, b"")))
    body = b"".join(field(1, field(1, f"f{i}".encode()) + leaf) for i in range(fields))
    value = field(2, field_varint(4, 1)) + field(4, bytes(fields)) + field(7, b"v")
    return field_varint(1, 10) + field(7, field(1000, value)) + field(1000, field_varint(10, 1) + field(2, body))


def _best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def _verify(data: bytes) -> str:
    try:
        verify_model(data)
        return "accepted"
    except ContractError as error:
        return error.code.value


def scaling(repeat: int) -> None:
    print("Part 1: verify_model on one declaration of N fields, against protobuf parsing the same bytes")
    print(f"{'fields':>9} {'verdict':>15} {'verify s':>9} {'parse s':>9} {'ratio':>7} {'us/field':>9}")
    for fields in (1 << 10, 1 << 12, 1 << 14, MAX_TYPE_NODES - 1, 1_000_000):
        data = wide_struct(fields)
        verdict = _verify(data)
        verify_s = _best(lambda data=data: _verify(data), repeat)
        parse_s = _best(lambda data=data: schema.parse_model(data), repeat)
        print(f"{fields:>9} {verdict:>15} {verify_s:>9.4f} {parse_s:>9.4f} {verify_s / parse_s:>7.1f} "
              f"{verify_s / fields * 1e6:>9.2f}")


# ------------------------------------------------------------------------------- hostile worst cases
_PRELUDE = """
import json, os, resource, sys, time, tracemalloc
sys.path.insert(0, {root!r})
import numpy as np
from reference_impl import ContractError
def _rss(): return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
def _begin():
    if {trace}:
        tracemalloc.start()
    return _rss(), time.perf_counter()
"""

_CASES = {
    "1 diamond of 31 levels (2**31 paths): Executor, make_state, run": """
sys.path.insert(0, os.path.join({root!r}, "tests"))
from test_hostile_input import diamond_model, diamond_value
from reference_impl import Executor, make_state
model, value = diamond_model(31), diamond_value(31)
base, start = _begin()
state = make_state(Executor(model), {{"x": value}}); state.run({{}})
outcome = "ran"
""",
    "2 symlink swapped in during 2000 decodes (per decode)": """
import pathlib, tempfile, threading
from reference_impl import decode, schema
tmp = pathlib.Path(tempfile.mkdtemp()); base_dir = tmp / "m"; base_dir.mkdir()
(tmp / "secret").write_bytes(bytes([0x7F] * 4)); (base_dir / "w.bin").write_bytes(bytes([2, 4, 0xFC, 0]))
model = schema.parse_text('''ir_version: 10 graph {{ name: "g" encoded_initializer {{ name: "w"
  affine {{ storage_type: 3 scale {{ data_type: 1 float_data: 0.5 }} }}
  logical_type {{ tensor_type {{ elem_type: 1 shape {{ dim {{ dim_value: 4 }} }} }} }} data_location: EXTERNAL
  external_data {{ key: "location" value: "w.bin" }} external_data {{ key: "length" value: "4" }} }} }}''')
stop = threading.Event()
def swap():
    while not stop.is_set():
        (base_dir / "r").write_bytes(bytes([2, 4, 0xFC, 0])); os.replace(base_dir / "r", base_dir / "w.bin")
        (base_dir / "l").unlink(missing_ok=True); (base_dir / "l").symlink_to(tmp / "secret")
        os.replace(base_dir / "l", base_dir / "w.bin")
threading.Thread(target=swap, daemon=True).start()
leaks = 0; base, start = _begin()
for _ in range(2000):
    try:
        leaks += decode(model, "w", base_dir=base_dir)[0] == 63.5
    except ContractError:
        pass
stop.set(); elapsed_scale = 1 / 2000
outcome = f"{{leaks}} leaks"
""",
    "3 payload file truncated after load, read mode (1 MiB extent)": """
import tempfile
from reference_impl import Executor, payload, schema
payload.set_external_access("read")
d = tempfile.mkdtemp(); path = os.path.join(d, "w.bin")
open(path, "wb").write(bytes(1 << 20))
model = schema.parse_text('''ir_version: 10 opset_import {{ domain: "" version: 23 }}
  struct_types {{ type_id: 7 structure {{
    field {{ name: "b" type {{ tensor_type {{ elem_type: 2 shape {{ }} }} }} }} }} }}
  graph {{ name: "g" node {{ op_type: "Identity" input: "w" output: "y" }}
    encoded_initializer {{ name: "w" struct_type {{ type_ref: 7 }} data_location: EXTERNAL
      external_data {{ key: "location" value: "w.bin" }} external_data {{ key: "length" value: "1048576" }} }}
    output {{ name: "y" type {{ struct_type {{ type_ref: 7 }} }} }} }}''')
base, start = _begin()
executor = Executor(model, base_dir=d); os.truncate(path, 0)
outcome = f"survived, {{len(executor.run({{}})['y'].payload.tobytes())}} bytes intact"
""",
    "4 decode of 2**31 - 4 UINT2 codes to float32 (8 GiB)": """
import tempfile
from reference_impl import decode, schema
d = tempfile.mkdtemp()
with open(os.path.join(d, "w.bin"), "wb") as handle: handle.truncate(536870911)
model = schema.parse_text('''ir_version: 10 graph {{ name: "g" encoded_initializer {{ name: "w"
  affine {{ storage_type: 25 scale {{ data_type: 1 float_data: 0.5 }} }}
  logical_type {{ tensor_type {{ elem_type: 1 shape {{ dim {{ dim_value: 2147483644 }} }} }} }}
  data_location: EXTERNAL external_data {{ key: "location" value: "w.bin" }}
  external_data {{ key: "length" value: "536870911" }} }} }}''')
base, start = _begin()
try:
    decode(model, "w", base_dir=d); outcome = "decoded"
except ContractError as error:
    outcome = error.code.value
""",
    "4 initial value nested 100,000 lists deep": """
from reference_impl import make_state, schema
model = schema.parse_text('''ir_version: 10 opset_import {{ domain: "" version: 23 }}
  graph {{ name: "g" node {{ op_type: "Identity" input: "s" output: "t" }}
    input {{ name: "s" type {{ sequence_type {{ elem_type {{ tensor_type {{ elem_type: 1 }} }} }} }} }}
    output {{ name: "t" type {{ sequence_type {{ elem_type {{ tensor_type {{ elem_type: 1 }} }} }} }} }}
    persistent_bindings {{ input_name: "s" output_name: "t" }} }}''')
nested = []
for _ in range(100_000): nested = [nested]
base, start = _begin()
try:
    make_state(model, {{"s": nested}}); outcome = "accepted"
except ContractError as error:
    outcome = error.code.value
""",
    "5 testee frame claiming 2**31 - 1 bytes": """
import struct, threading
from conformance import protocol as P
r, w = os.pipe()
threading.Thread(target=lambda: (os.write(w, struct.pack("<I", 2**31 - 1) + bytes(16)), os.close(w))).start()
stream = os.fdopen(r, "rb", buffering=0)
base, start = _begin()
try:
    P.read_frame(stream, P.Response); outcome = "read"
except P.FramingError as error:
    outcome = "FramingError"
""",
    "5 testee command that does not exist (whole run setup)": """
from conformance.adapters.testee_client import TesteeAdapter, TesteeUnavailable
base, start = _begin()
try:
    TesteeAdapter("/nonexistent/testee"); outcome = "started"
except TesteeUnavailable:
    outcome = "TesteeUnavailable"
""",
    "6 PT_NOTE claiming a 4 GiB descriptor": """
import struct
from elftools.elf.elffile import ELFFile
from size_gate import SizeGateError, measure_path
fixture = os.path.join({root!r}, "tests", "fixtures", "elf", "default.so")
with open(fixture, "rb") as handle:
    note = next(s["p_offset"] for s in ELFFile(handle).iter_segments() if s["p_type"] == "PT_NOTE")
data = bytearray(open(fixture, "rb").read()); struct.pack_into("<I", data, note + 4, 0xFFFFFFF0)
import tempfile; path = os.path.join(tempfile.mkdtemp(), "libsg_proto.so"); open(path, "wb").write(data)
base, start = _begin()
try:
    measure_path(path, "libsg_proto.so"); outcome = "measured"
except SizeGateError as error:
    outcome = error.code
""",
    "6 wheel with a 256 MiB library member": """
import tempfile, zipfile
from size_gate import measure_path
fixture = open(os.path.join({root!r}, "tests", "fixtures", "elf", "default.so"), "rb").read()
wheel = os.path.join(tempfile.mkdtemp(), "p-1.0-py3-none-any.whl")
with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as archive:
    with archive.open("p/libsg_proto.so", "w", force_zip64=True) as member:
        member.write(fixture)
        for _ in range(256): member.write(bytes(1 << 20))
base, start = _begin()
outcome = f"{{measure_path(wheel, 'libsg_proto.so').installed_bytes}} bytes measured"
""",
    "7 reference CLI verify /dev/zero": """
from reference_impl.__main__ import read_model_file
base, start = _begin()
try:
    read_model_file("/dev/zero"); outcome = "read"
except OSError as error:
    outcome = str(error)
""",
    "8 verify 10**6 fields": """
sys.path.insert(0, os.path.join({root!r}, "benchmarks"))
from bench_verify import _verify, wide_struct
data = wide_struct(1_000_000)
base, start = _begin()
outcome = _verify(data)
""",
    "8 verify MAX_TYPE_NODES - 1 fields (accepted at the limit)": """
sys.path.insert(0, os.path.join({root!r}, "benchmarks"))
from bench_verify import _verify, wide_struct
from reference_impl.structs import MAX_TYPE_NODES
data = wide_struct(MAX_TYPE_NODES - 1)
base, start = _begin()
outcome = _verify(data)
""",
}

_REPORT = """
elapsed = time.perf_counter() - start
heap = tracemalloc.get_traced_memory()[1]
scale = globals().get("elapsed_scale", 1)
print(json.dumps({{"seconds": elapsed * scale, "heap_mb": heap / 2**20, "rss_mb": (_rss() - base) / 2**20,
                  "outcome": outcome}}))
"""


def hostile() -> None:
    print("\nPart 2: worst case of each hostile-input class, each in a fresh child: wall time, peak traced heap")
    print("(Python and NumPy allocations, tracemalloc) and peak resident memory added over the child's baseline")
    print(f"{'case':<72} {'seconds':>8} {'heap MiB':>9} {'RSS MiB':>8}  outcome")
    for name, body in _CASES.items():
        timed, traced = (_child(body, trace) for trace in (False, True))  # tracing slows the timed run
        if timed is None or traced is None:
            print(f"{name:<72} child failed")
            continue
        print(f"{name:<72} {timed['seconds']:>8.4f} {traced['heap_mb']:>9.1f} {timed['rss_mb']:>8.1f}  "
              f"{timed['outcome']}")


def _child(body: str, trace: bool) -> dict | None:
    code = (_PRELUDE + body + _REPORT).format(root=str(ROOT), trace=trace)
    with tempfile.TemporaryDirectory() as cwd:
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, cwd=cwd,
                              env=dict(os.environ, PYTHONPATH=str(ROOT)))
    if done.returncode:
        print(done.stderr.strip().splitlines()[-1:], file=sys.stderr)
        return None
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--skip-hostile", action="store_true")
    args = parser.parse_args()
    scaling(args.repeat)
    if not args.skip_hostile:
        hostile()


if __name__ == "__main__":
    main()

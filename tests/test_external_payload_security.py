"""External payloads under a hostile model directory (docs/security.md): the location is resolved and
opened in one race-free step, the opened descriptor is what gets checked and read, and tools that must
not die read payloads into memory instead of mapping files that may shrink under them."""

from __future__ import annotations

import os
import signal
import threading

import numpy as np
import pytest
from test_hostile_input import run_child

from reference_impl import ContractError, decode, payload, schema, verify_model
from reference_impl.errors import ErrorCode

INSIDE = bytes([2, 4, 0xFC, 0])  # INT8 codes 2, 4, -4, 0 at scale 0.5
SECRET = bytes([0x7F] * 4)  # what a leak would decode: 63.5 four times


def _model(location: str = "w.bin"):
    return schema.parse_text(f'''
      ir_version: 10
      graph {{ name: "g" encoded_initializer {{ name: "w"
        affine {{ storage_type: 3 scale {{ data_type: 1 float_data: 0.5 }} }}
        logical_type {{ tensor_type {{ elem_type: 1 shape {{ dim {{ dim_value: 4 }} }} }} }}
        data_location: EXTERNAL
        external_data {{ key: "location" value: "{location}" }}
        external_data {{ key: "length" value: "4" }} }} }}''')


@pytest.fixture
def access_mode():
    """Restore the process-wide access mode a test changes."""
    previous = payload.external_access()
    yield payload.set_external_access
    payload.set_external_access(previous)


# ------------------------------------------------------------------------------ 2. containment race
@pytest.mark.clause("PAY-EXTERNAL-EXTENT")
@pytest.mark.parametrize("mode", ["map", "read"])
def test_symlink_swapped_in_while_decoding_never_leaks(tmp_path, access_mode, mode):
    """Another thread keeps replacing the payload file by a symlink to a file outside the model
    directory (and back) while decodes run: every decode returns the inside bytes or refuses the
    link; none ever reads the outside file. Checking the path and then reopening it by name leaked."""
    access_mode(mode)
    base = tmp_path / "model"
    base.mkdir()
    secret = tmp_path / "secret.bin"
    secret.write_bytes(SECRET)
    regular, link, target = base / "regular.tmp", base / "link.tmp", base / "w.bin"
    target.write_bytes(INSIDE)
    model = _model()
    stop = threading.Event()

    def swap() -> None:
        while not stop.is_set():
            regular.write_bytes(INSIDE)
            os.replace(regular, target)
            link.unlink(missing_ok=True)
            link.symlink_to(secret)
            os.replace(link, target)

    swapper = threading.Thread(target=swap, daemon=True)
    swapper.start()
    outcomes = {"inside": 0, "leaked": 0}
    codes = set()
    try:
        for _ in range(3000):
            try:
                values = decode(model, "w", base_dir=base)
            except ContractError as error:
                codes.add(error.code)
                continue
            outcomes["leaked" if values[0] == 63.5 else "inside"] += 1
    finally:
        stop.set()
        swapper.join()
    assert outcomes["leaked"] == 0, outcomes
    assert outcomes["inside"] and ErrorCode.EXTERNAL_PATH_INVALID in codes  # both states were seen
    assert codes <= {ErrorCode.EXTERNAL_PATH_INVALID, ErrorCode.EXTERNAL_FILE_INVALID}


@pytest.mark.clause("PAY-EXTERNAL-EXTENT")
def test_links_anywhere_in_the_location_are_refused(tmp_path):
    base = tmp_path / "model"
    (base / "real").mkdir(parents=True)
    (base / "real" / "w.bin").write_bytes(INSIDE)
    (base / "alias").symlink_to(base / "real")
    (base / "w.bin").symlink_to(base / "real" / "w.bin")
    np.testing.assert_array_equal(decode(_model("real/w.bin"), "w", base_dir=base), [1, 2, -2, 0])
    for location in ("alias/w.bin", "w.bin"):  # even when the link stays inside the directory
        with pytest.raises(ContractError) as info:
            verify_model(_model(location), base_dir=base)
        assert info.value.code is ErrorCode.EXTERNAL_PATH_INVALID


@pytest.mark.clause("PAY-EXTERNAL-EXTENT")
def test_special_files_are_checked_through_the_descriptor(tmp_path):
    os.mkfifo(tmp_path / "w.bin")  # opening must not wait for a writer
    with pytest.raises(ContractError) as info:
        verify_model(_model(), base_dir=tmp_path)
    assert info.value.code is ErrorCode.EXTERNAL_FILE_INVALID and "regular" in info.value.message
    (tmp_path / "d").mkdir()
    with pytest.raises(ContractError) as info:
        verify_model(_model("d"), base_dir=tmp_path)
    assert info.value.code is ErrorCode.EXTERNAL_FILE_INVALID


# -------------------------------------------------------------------- 3. files shrinking under us
_TRUNCATED = """
import os, sys
import numpy as np
from reference_impl import Executor, payload, schema
directory, mode = sys.argv[1], sys.argv[2]
payload.set_external_access(mode)
path = os.path.join(directory, "w.bin")
with open(path, "wb") as handle:
    handle.write(np.arange(1 << 20, dtype=np.uint32).astype(np.uint8).tobytes())
model = schema.parse_text('''
  ir_version: 10 opset_import { domain: "" version: 23 }
  struct_types { type_id: 7 structure { field { name: "b" type { tensor_type { elem_type: 2 shape { } } } } } }
  graph { name: "g" node { op_type: "Identity" input: "w" output: "y" }
    encoded_initializer { name: "w" struct_type { type_ref: 7 } data_location: EXTERNAL
      external_data { key: "location" value: "w.bin" } external_data { key: "length" value: "1048576" } }
    output { name: "y" type { struct_type { type_ref: 7 } } } }''')
executor = Executor(model, base_dir=directory)  # verified and loaded: the extent is in the file
os.truncate(path, 0)  # the file shrinks after verification
payload_bytes = executor.run({})["y"].payload.tobytes()  # touches every page of the extent
print(sum(payload_bytes))
"""


@pytest.mark.clause("PAY-EXTERNAL-OWNER", "PAY-EXTERNAL-EXTENT")
def test_a_file_truncated_after_verification_cannot_kill_a_reading_process(tmp_path):
    """In "read" mode (the runner, the fuzz harness, the reference CLI) the extent was read at load, so
    truncating the file later changes nothing. In "map" mode (the zero-copy runtime) the same program
    dies with SIGBUS: the documented price of mapping (docs/security.md)."""
    expected = str(int(np.arange(1 << 20, dtype=np.uint32).astype(np.uint8).sum()))
    safe = run_child(_TRUNCATED, str(tmp_path), "read")
    assert safe.returncode == 0 and safe.stdout.strip() == expected, safe.stderr[-2000:]
    mapped = run_child(_TRUNCATED, str(tmp_path), "map")
    assert mapped.returncode == -signal.SIGBUS, (mapped.returncode, mapped.stderr[-2000:])


@pytest.mark.clause("PAY-EXTERNAL-EXTENT")
def test_a_file_shrinking_between_check_and_read_is_refused(tmp_path, access_mode, monkeypatch):
    access_mode("read")
    (tmp_path / "w.bin").write_bytes(INSIDE)
    real_preadv = os.preadv

    def shrink_then_read(fd, buffers, offset):
        os.truncate(tmp_path / "w.bin", 2)  # after the descriptor was checked, as the read starts
        return real_preadv(fd, buffers, offset)

    monkeypatch.setattr(os, "preadv", shrink_then_read)
    with pytest.raises(ContractError) as info:
        decode(_model(), "w", base_dir=tmp_path)
    assert info.value.code is ErrorCode.EXTERNAL_FILE_INVALID and "shrank" in info.value.message


def test_runner_fuzz_harness_and_cli_select_safe_reads(access_mode, tmp_path):
    from conformance.cases import load_cases, select
    from conformance.runner import RunConfig, run
    from fuzz.targets import load
    from reference_impl.__main__ import main

    for enable in (lambda: run(select(load_cases(), ["Required.External.Affine.DecodesFromFile"]),
                               RunConfig(progress=False)),
                   lambda: load("verify"),
                   lambda: main(["demo"])):
        access_mode("map")
        enable()
        assert payload.external_access() == "read"
    with pytest.raises(ValueError):
        payload.set_external_access("copy")

"""The cases of corpus/cases/external/measured.toml count, from outside the runtime, how often it opens an
external payload file (conformance/measured.py, ``file_opens``). The reference passes them; a state that
re-verifies its model against the directory on every run, or a runtime that reads the payload in chunks
reopening the file for each, fails them, while the values they produce are right."""

from __future__ import annotations

import functools
import os
import threading

import numpy as np
import pytest

import reference_impl
from conformance import measured
from conformance.adapters.reference import ReferenceAdapter, ReferenceState
from conformance.cases import load_cases
from conformance.execute import FAILED, NOT_SUPPORTED, PASSED, run_case
from reference_impl import schema

_SOURCE = "cases/external/measured.toml"
STATE = "Recommended.External.Measured.StateRunsOpenPayloadOnce"
#: bytes a chunked reader takes per open
CHUNK = 64


@functools.cache
def _cases() -> dict:
    return {case.id: case for case in load_cases() if case.source == _SOURCE}


def _verdict(case_id: str, adapter) -> str:
    return run_case(_cases()[case_id], adapter).verdict


def test_the_family_has_state_verify_and_decode_cases_of_both_layouts():
    names = {case_id.rsplit(".", 1)[1] for case_id in _cases()}
    assert names == {f"{call}{layout}" for layout in ("Affine", "Struct") for call in
                     ("StateRunsOpenPayloadOnce", "VerifyOpensPayloadBoundedTimes", "DecodeOpensPayloadBoundedTimes")}
    assert all(case.level == "Recommended" and case.profile == "measured" for case in _cases().values())


def test_every_case_passes_on_the_reference():
    assert {case_id: _verdict(case_id, ReferenceAdapter()) for case_id in _cases()} == dict.fromkeys(_cases(), PASSED)


class _Reverifying(ReferenceState):
    def __init__(self, handle: ReferenceState, model_bytes: bytes, base_dir):
        super().__init__(handle.state, handle.slot)
        self.model_bytes, self.base_dir = model_bytes, base_dir

    def run(self, feeds):
        reference_impl.verify_model(self.model_bytes, base_dir=self.base_dir)  # "is the payload still valid?"
        return super().run(feeds)


class ReverifiesEachRun(ReferenceAdapter):
    """Validates the model, external files included, again before every run; its outputs are right."""

    def open_state(self, model_bytes, initial, base_dir=None):
        return _Reverifying(super().open_state(model_bytes, initial, base_dir), model_bytes, base_dir)


def _read_in_chunks(model_bytes: bytes, base_dir) -> None:
    """Read every external payload a chunk at a time, opening its file again for each chunk."""
    for value in schema.parse_model(model_bytes).graph.encoded_initializer:
        entries = {entry.key: entry.value for entry in value.external_data}
        if "location" not in entries:
            continue
        path = os.path.join(base_dir, entries["location"])
        start, length = int(entries.get("offset", "0")), int(entries["length"])
        for at in range(start, start + length, CHUNK):
            with open(path, "rb") as handle:
                handle.seek(at)
                handle.read(min(CHUNK, start + length - at))


class OpensPerChunk(ReferenceAdapter):
    """Reads each external payload 64 bytes per open before loading, verifying or decoding it."""

    def verify(self, model_bytes, base_dir):
        _read_in_chunks(model_bytes, base_dir)
        return super().verify(model_bytes, base_dir)

    def decode(self, model_bytes, value_name, base_dir, out=None):
        _read_in_chunks(model_bytes, base_dir)
        return super().decode(model_bytes, value_name, base_dir, out)

    def open_state(self, model_bytes, initial, base_dir=None):
        _read_in_chunks(model_bytes, base_dir)
        return super().open_state(model_bytes, initial, base_dir)


def test_reverifying_each_run_fails_the_state_cases_and_no_other():
    verdicts = {case_id: _verdict(case_id, ReverifiesEachRun()) for case_id in _cases()}
    assert verdicts == {case_id: FAILED if case_id.startswith(STATE) else PASSED for case_id in _cases()}


def test_the_reverifying_state_fails_on_the_count_of_opens_not_on_its_values():
    result = run_case(_cases()[f"{STATE}Struct"], ReverifiesEachRun())
    assert "3 run calls opened counted.bin 3 times, more than 1" in result.message


def test_opening_the_file_per_chunk_fails_every_case():
    verdicts = {case_id: _verdict(case_id, OpensPerChunk()) for case_id in _cases()}
    assert verdicts == dict.fromkeys(_cases(), FAILED)


def test_the_measured_file_cases_are_not_supported_out_of_process():
    class OutOfProcess(ReferenceAdapter):
        out_of_process = True

    verdicts = {case_id: _verdict(case_id, OutOfProcess()) for case_id in _cases()}
    assert verdicts == dict.fromkeys(_cases(), NOT_SUPPORTED)


# ---------------------------------------------------------------------------------- the hook itself
@pytest.fixture()
def payload(tmp_path):
    (tmp_path / "sub").mkdir()
    target = tmp_path / "sub" / "counted.bin"
    target.write_bytes(bytes(range(64)))
    (tmp_path / "other.bin").write_bytes(b"x")
    return tmp_path


def test_the_hook_sees_python_open_os_open_relative_to_a_directory_and_numpy(payload):
    target = payload / "sub" / "counted.bin"
    with measured.counting_opens(str(payload), "sub/counted.bin") as window:
        with open(target, "rb"):
            pass
        directory = os.open(payload / "sub", os.O_RDONLY)
        try:
            os.close(os.open("counted.bin", os.O_RDONLY, dir_fd=directory))
        finally:
            os.close(directory)
        np.fromfile(target, dtype=np.uint8)
        target.read_bytes()
        with open(payload / "other.bin", "rb"):
            pass
    assert window.count == 4


def test_the_hook_counts_only_inside_the_window_and_across_threads(payload):
    target = payload / "sub" / "counted.bin"
    with open(target, "rb"):
        pass
    with measured.counting_opens(str(payload), "sub/counted.bin") as window:
        threads = [threading.Thread(target=target.read_bytes) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    target.read_bytes()
    assert window.count == 4


def test_a_file_of_the_same_name_in_another_directory_is_not_counted(payload, tmp_path_factory):
    elsewhere = tmp_path_factory.mktemp("elsewhere") / "counted.bin"
    elsewhere.write_bytes(b"y")
    with measured.counting_opens(str(payload), "sub/counted.bin") as window:
        elsewhere.read_bytes()
    assert window.count == 0


def test_a_testee_gets_not_supported_for_the_file_cases():
    from conformance.adapters import load_adapter

    client = load_adapter(testee="python -m conformance.testee", timeout=60.0)
    try:
        assert "measured" not in client.profiles()
        assert _verdict(f"{STATE}Affine", client) == NOT_SUPPORTED
    finally:
        client.shutdown()

"""The C++ testee SDK (conformance/sdk/cpp) seen from the wire: framing, hello, dispatch, defaults,
value conversion and robustness against malformed input, driven through the example runtime."""

from __future__ import annotations

import struct
import subprocess

import pytest
from native_toolchain import EXAMPLE, ROOT, SDK, build

from conformance import protocol as P
from reference_impl import schema

AFFINE_INT4 = '''
ir_version: 10
graph {
  name: "affine"
  encoded_initializer {
    name: "w"
    affine { storage_type: INT4 scale { data_type: 1 float_data: 0.5 } }
    logical_type { tensor_type { elem_type: 1 shape { dim { dim_value: 4 } } } }
    raw_data: "\\x21\\x8f"
  }
}
'''


@pytest.fixture(scope="module")
def testee():
    return str(build("release") / EXAMPLE)


class Session:
    """One testee process spoken to frame by frame."""

    def __init__(self, binary: str):
        self.process = subprocess.Popen([binary], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE)

    def send_raw(self, data: bytes) -> None:
        self.process.stdin.write(data)
        self.process.stdin.flush()

    def send(self, request) -> None:
        body = request.SerializeToString()
        self.send_raw(struct.pack("<I", len(body)) + body)

    def receive(self):
        return P.read_frame(self.process.stdout, P.Response)

    def call(self, op: str, request_id: int = 1, **fields):
        request = P.Request(id=request_id)
        getattr(request, op).SetInParent()
        for name, value in fields.items():
            setattr(getattr(request, op), name, value)
        self.send(request)
        return self.receive()

    def finish(self, timeout: float = 20) -> tuple[int, bytes]:
        """Close the input and wait: (exit status, everything left on stdout)."""
        self.process.stdin.close()
        rest = self.process.stdout.read()
        return self.process.wait(timeout), rest


def test_hello_claims_the_example_profiles_at_the_runners_protocol(testee):
    session = Session(testee)
    hello = session.call("hello", request_id=7)
    assert hello.id == 7 and hello.WhichOneof("result") == "hello"
    assert hello.hello.protocol_version == P.PROTOCOL_VERSION
    assert list(hello.hello.profiles) == ["affine", "external-data", "state", "bindings", "zero-copy"]
    assert hello.hello.name == "onnx-light-example-testee"
    assert session.finish() == (0, b"")


def test_decode_returns_the_logical_tensor(testee):
    """0x21 0x8F hold INT4 codes 1, 2, -1, -8 (low nibble first), times 0.5."""
    session = Session(testee)
    model = schema.parse_text(AFFINE_INT4).SerializeToString()
    response = session.call("decode", model=model, value_name=b"w")
    tensor = response.value.value.tensor
    assert (tensor.dtype, list(tensor.shape)) == ("float32", [4])
    assert struct.unpack("<4f", tensor.data) == (0.5, 1.0, -0.5, -4.0)
    session.finish()


def test_pipelined_requests_are_all_answered(testee):
    session = Session(testee)
    model = schema.parse_text(AFFINE_INT4).SerializeToString()
    for request_id in range(1, 41):
        request = P.Request(id=request_id)
        request.verify.model = model
        session.send(request)
    answered = [session.receive() for _ in range(40)]
    assert sorted(r.id for r in answered) == list(range(1, 41))
    assert {r.WhichOneof("result") for r in answered} == {"ok"}
    assert session.finish()[0] == 0


def test_shutdown_answers_ok_and_exits_0(testee):
    session = Session(testee)
    response = session.call("shutdown", request_id=3)
    assert (response.id, response.WhichOneof("result")) == (3, "ok")
    assert session.process.wait(20) == 0


@pytest.mark.parametrize("op", ["read_fields", "open_state", "run", "values", "reset", "close", "counters"])
def test_methods_a_runtime_does_not_override_answer_not_supported(old_style, op):
    session = Session(old_style)
    response = session.call(op, request_id=11)
    assert (response.id, response.WhichOneof("result")) == (11, "not_supported")
    assert response.not_supported.reason
    session.finish()


@pytest.mark.parametrize("op", ["run", "values", "reset", "close", "counters"])
def test_state_requests_on_a_state_the_example_never_opened_are_rejected_as_closed(testee, op):
    session = Session(testee)
    response = session.call(op, request_id=12, state=41)
    assert (response.id, response.rejected.code) == (12, "STATE_CLOSED")
    session.finish()


def test_a_request_without_an_operation_is_not_supported(testee):
    session = Session(testee)
    session.send(P.Request(id=5))
    response = session.receive()
    assert (response.id, response.WhichOneof("result")) == (5, "not_supported")
    assert session.call("hello").WhichOneof("result") == "hello"
    session.finish()


def test_an_unparseable_frame_is_answered_and_the_session_goes_on(testee):
    session = Session(testee)
    session.send_raw(struct.pack("<I", 3) + b"\xff\xff\xff")  # a truncated varint tag
    response = session.receive()
    assert (response.id, response.WhichOneof("result")) == (0, "error")
    assert "not a parseable Request" in response.error.message
    assert session.call("hello").WhichOneof("result") == "hello"
    assert session.finish()[0] == 0


def test_an_oversized_frame_is_answered_and_ends_the_session(testee):
    session = Session(testee)
    session.send_raw(struct.pack("<I", 0xFFFFFFF0))
    response = session.receive()
    assert (response.id, response.WhichOneof("result")) == (0, "error")
    assert "exceeds the limit" in response.error.message
    assert session.finish() == (2, b"")


def test_a_frame_cut_by_the_end_of_input_exits_2_without_a_reply(testee):
    session = Session(testee)
    session.send_raw(struct.pack("<I", 100) + b"\x08\x01" * 5)
    assert session.finish() == (2, b"")


def test_end_of_input_at_a_frame_boundary_exits_0(testee):
    assert Session(testee).finish() == (0, b"")


def test_a_value_whose_bytes_do_not_match_its_shape_is_an_internal_error(testee):
    """The SDK checks incoming tensors before the runtime sees them: float32 [2] needs 8 bytes."""
    session = Session(testee)
    request = P.Request(id=9)
    item = request.open_state.initial.add(name=b"past")
    item.value.tensor.dtype = "float32"
    item.value.tensor.shape.append(2)
    item.value.tensor.data = b"\x00" * 4
    session.send(request)
    response = session.receive()
    assert (response.id, response.WhichOneof("result")) == (9, "error")
    assert "does not match its shape" in response.error.message
    request.open_state.initial[0].value.tensor.data = b"\x00" * 8  # well formed: the runtime's own verdict
    session.send(request)
    assert session.receive().rejected.code == "STATE_INITIAL_UNKNOWN"  # the empty model binds no input
    session.finish()


def test_a_message_that_is_not_utf8_is_escaped_so_the_reply_parses(testee):
    """Rejection.message is a proto3 string: the SDK escapes the invalid byte the runtime quoted."""
    model = schema.parse_text('''
ir_version: 10
graph {
  encoded_initializer {
    name: "w"
    affine { storage_type: INT8 scale { data_type: 1 float_data: 1.0 } }
    logical_type { tensor_type { elem_type: 1 shape { dim { dim_value: 1 } } } }
    data_location: EXTERNAL
    external_data { key: "location" value: "w.bin" }
    external_data { key: "length" value: "Z" }
  }
}
''').SerializeToString()
    model = model.replace(b"\x12\x01Z", b"\x12\x01\xff")  # a length that is not UTF-8 (proto2 does not check)
    session = Session(testee)
    response = session.call("verify", model=model)
    assert response.WhichOneof("result") == "rejected"
    assert response.rejected.code == "EXTERNAL_NUMBER_INVALID"
    assert "\\xff" in response.rejected.message
    assert session.finish()[0] == 0


EXTERNAL_INT4 = '''
ir_version: 10
graph {
  name: "external"
  encoded_initializer {
    name: "w"
    affine { storage_type: INT4 scale { data_type: 1 float_data: 0.5 } }
    logical_type { tensor_type { elem_type: 1 shape { dim { dim_value: 4 } } } }
    data_location: EXTERNAL
    external_data { key: "location" value: "w.bin" }
    external_data { key: "length" value: "2" }
  }
}
'''


def test_roundtrip_receives_the_base_dir(testee, tmp_path):
    """The example's explicit load checks the backing file inside base_dir: found in the directory that
    holds it, refused in an empty one, so the request's base_dir is what reached the runtime."""
    model = schema.parse_text(EXTERNAL_INT4).SerializeToString()
    (tmp_path / "holds").mkdir()
    (tmp_path / "holds" / "w.bin").write_bytes(b"\x21\x8f")
    (tmp_path / "empty").mkdir()
    session = Session(testee)
    saved = session.call("roundtrip", model=model, base_dir=str(tmp_path / "holds"))
    assert saved.WhichOneof("result") == "model"
    assert schema.parse_model(saved.model.model).SerializeToString() == schema.parse_model(model).SerializeToString()
    refused = session.call("roundtrip", model=model, base_dir=str(tmp_path / "empty"))
    assert (refused.WhichOneof("result"), refused.rejected.code) == ("rejected", "EXTERNAL_FILE_INVALID")
    assert session.finish()[0] == 0


OLD_STYLE_SOURCE = ROOT / "tests" / "fixtures" / "native" / "old_style_testee.cc"


@pytest.fixture(scope="module")
def old_style(tmp_path_factory):
    tree = build("release")
    binary = tmp_path_factory.mktemp("old-style") / "old-style-testee"
    subprocess.run(["g++", "-std=c++17", "-Wall", "-Wextra", str(OLD_STYLE_SOURCE), f"-I{SDK / 'include'}",
                    f"-L{tree}", "-lonnx_light_testee_sdk", "-lonnx_light_testee_protocol", "-lprotobuf-lite",
                    "-pthread", "-o", str(binary)], check=True)
    return str(binary)


def test_a_runtime_overriding_the_forms_without_base_dir_still_serves_them(old_style):
    session = Session(old_style)
    answers = [session.call("roundtrip", model=b"m", base_dir="/d"),
               session.call("export", model=b"m", target="onnx", base_dir="/d"),
               session.call("rewrite", model=b"m", rewrite_json="{}", base_dir="/d")]
    assert [a.model.model for a in answers] == [b"roundtrip m", b"export onnx m", b"rewrite {} m"]
    assert session.finish()[0] == 0

"""The C++ SDK (conformance/sdk/cpp) stays at the runner's protocol: its table of handled messages and
fields (PROTOCOL.md) is the protocol's (conformance/protocol_schema.py), its version and feature constants
are the runner's, and a runtime on it can hold runs, report and take back buffer identities and see
ownerless loans, as the reference testee does."""

from __future__ import annotations

import re
import struct
import subprocess
import threading

import numpy as np
import pytest
from native_toolchain import EXAMPLE, ROOT, SDK, build
from test_native_sdk import OLD_STYLE_SOURCE, Session

from conformance import protocol as P
from conformance import protocol_schema
from conformance.adapters import Rejected, load_adapter
from conformance.hold import Hold

TABLE = SDK / "PROTOCOL.md"
HEADER = SDK / "include" / "onnx_light_testee" / "sdk.h"
SOURCES = sorted((SDK / "src").glob("*.cc"))
CPP_KEYWORDS = {"struct", "export", "delete", "new", "default", "class", "union", "register"}


def _table() -> set[str]:
    return set(re.findall(r"^\| `(\w+(?:\.\w+)?)` \|", TABLE.read_text(), re.M))


def _schema() -> set[str]:
    found = set()
    for message in protocol_schema.SCHEMA:
        found.add(message.name) if not message.fields else found.update(
            f"{message.name}.{field.name}" for field in message.fields)
    return found


def test_the_sdk_table_lists_every_message_and_field_of_the_protocol():
    table, schema = _table(), _schema()
    assert not schema - table, (f"the protocol has {sorted(schema - table)}, which {TABLE} does not list: handle "
                                "them in the C++ SDK and say how in the table")
    assert not table - schema, f"{TABLE} lists {sorted(table - schema)}, which the protocol no longer has"


def test_every_field_of_the_table_is_read_or_written_by_the_sdk_sources():
    """A generated accessor of each field appears in src/*.cc (protoc adds "_" to C++ keywords); oneof
    members may be handled by their case constant instead."""
    sources = "\n".join(path.read_text() for path in SOURCES)
    oneofs = {f"{m.name}.{f.name}" for m in protocol_schema.SCHEMA for f in m.fields if f.oneof}
    unread = []
    for entry in sorted(_table()):
        if "." not in entry:
            continue
        name = entry.split(".")[1]
        accessor = name + "_" if name in CPP_KEYWORDS else name
        used = re.search(rf"(?:\.|->)(?:set_|mutable_|add_)?{accessor}\(", sources)
        case = "k" + "".join(part.capitalize() for part in name.split("_"))
        if not used and not (entry in oneofs and re.search(rf"::{case}\b", sources)):
            unread.append(entry)
    assert not unread, f"no SDK source reads or writes {unread}"


def test_the_sdk_speaks_the_runners_protocol_version_and_features():
    header = HEADER.read_text()
    version = re.search(r"kProtocolVersion = (\d+);", header)
    assert version and int(version.group(1)) == P.PROTOCOL_VERSION
    features = {getattr(protocol_schema, name) for name in dir(protocol_schema) if name.endswith("_FEATURE")}
    assert set(re.findall(r'k\w+Feature\[\] = "(\w+)";', header)) == features
    assert f"protocol version {P.PROTOCOL_VERSION}" in TABLE.read_text()


# ------------------------------------------------------------------------------------- built SDK
FIXTURE = ROOT / "tests" / "fixtures" / "native" / "pass_through_state_testee.cc"


@pytest.fixture(scope="module")
def pass_through(tmp_path_factory):
    tree = build("release")
    binary = tmp_path_factory.mktemp("pass-through") / "pass-through-testee"
    subprocess.run(["g++", "-std=c++17", "-Wall", "-Wextra", "-Werror", str(FIXTURE), f"-I{SDK / 'include'}",
                    f"-L{tree}", "-lonnx_light_testee_sdk", "-lonnx_light_testee_protocol", "-lprotobuf-lite",
                    "-pthread", "-o", str(binary)], check=True)
    return str(binary)


@pytest.fixture(scope="module")
def example():
    return str(build("release") / EXAMPLE)


@pytest.fixture(scope="module")
def without_holds(tmp_path_factory):
    """A runtime on the SDK that does not override SupportsHeldRuns (the example does)."""
    tree = build("release")
    binary = tmp_path_factory.mktemp("without-holds") / "without-holds-testee"
    subprocess.run(["g++", "-std=c++17", "-Wall", "-Wextra", str(OLD_STYLE_SOURCE), f"-I{SDK / 'include'}",
                    f"-L{tree}", "-lonnx_light_testee_sdk", "-lonnx_light_testee_protocol", "-lprotobuf-lite",
                    "-pthread", "-o", str(binary)], check=True)
    return str(binary)


def _tensor(named, array: np.ndarray, **fields) -> None:
    message = named.value
    message.tensor.dtype = array.dtype.name
    message.tensor.shape.extend(array.shape)
    message.tensor.data = array.tobytes()
    for name, value in fields.items():
        setattr(message.tensor, name, value)


def _request(op: str, request_id: int, **fields):
    request = P.Request(id=request_id)
    getattr(request, op).SetInParent()
    for name, value in fields.items():
        setattr(getattr(request, op), name, value)
    return request


def _open(session: Session) -> int:
    request = _request("open_state", 1)
    _tensor(request.open_state.initial.add(name=b"x"), np.zeros(2, np.float32))
    session.send(request)
    return session.receive().state.state


def _seen(response, name: bytes) -> list[int]:
    """What the runtime saw of feed ``name``: [ownerless, has owner, reported_id or -1, read_only]."""
    found = {item.name: item.value.tensor for item in response.values.values}
    return list(struct.unpack("<4q", found[name + b"#seen"].data))


def test_hello_speaks_protocol_5_and_lists_only_the_features_the_runtime_has(without_holds, pass_through, example):
    plain = Session(without_holds).call("hello").hello
    holding = Session(pass_through).call("hello").hello
    assert plain.protocol_version == holding.protocol_version == P.PROTOCOL_VERSION
    assert plain.has_features and list(plain.features) == []
    assert holding.has_features and list(holding.features) == [protocol_schema.HOLD_FEATURE]
    assert list(Session(example).call("hello").hello.features) == [protocol_schema.HOLD_FEATURE]


def test_a_held_run_on_a_runtime_without_held_runs_is_not_supported(without_holds):
    session = Session(without_holds)
    session.send(_request("run", 4, state=1, hold=True))
    session.send(_request("hold", 5, state=1))
    answers = {r.id: r for r in (session.receive(), session.receive())}
    assert answers[4].WhichOneof("result") == "not_supported" and "hold" in answers[4].not_supported.reason
    assert answers[5].WhichOneof("result") == "rejected"  # the run ended without parking
    assert session.finish()[0] == 0


def test_a_parked_run_keeps_its_state_busy_and_a_cancellation_leaves_the_state_unchanged(pass_through):
    session = Session(pass_through)
    state = _open(session)
    held = _request("run", 2, state=state, hold=True)
    _tensor(held.run.feeds.add(name=b"x"), np.ones(2, np.float32))
    session.send(held)
    session.send(_request("hold", 3, state=state))
    parked = session.receive()  # the Hold request is answered once the run parked; the run is not
    assert (parked.id, parked.WhichOneof("result")) == (3, "ok")
    second = _request("run", 4, state=state)
    _tensor(second.run.feeds.add(name=b"x"), np.ones(2, np.float32))
    session.send(second)
    busy = session.receive()
    assert (busy.id, busy.rejected.code) == (4, "STATE_BUSY")
    session.send(_request("hold", 5, state=state, release=True, cancel=True))
    answers = {r.id: r for r in (session.receive(), session.receive())}
    assert answers[5].WhichOneof("result") == "ok"
    assert answers[2].rejected.code == "STATE_CANCELLED"
    retained = session.call("values", request_id=6, state=state).values.values
    assert np.frombuffer(retained[0].value.tensor.data, np.float32).tolist() == [0.0, 0.0]
    assert session.finish()[0] == 0


def test_the_runner_holds_a_native_run_and_releases_it(pass_through):
    """The runner's own client (run_held with a Hold) against the SDK: parked, then released to finish."""
    adapter = load_adapter(testee=pass_through)
    try:
        assert adapter.supports_hold
        state = adapter.open_state(b"", {"x": np.zeros(2, np.float32)}, None)
        hold, outputs = Hold(), {}
        runner = threading.Thread(target=lambda: outputs.update(state.run_held({"x": np.full(2, 3, np.float32)},
                                                                               hold)))
        runner.start()
        assert hold.wait_parked(60)
        with pytest.raises(Rejected) as busy:
            state.run({"x": np.zeros(2, np.float32)})
        hold.release()
        runner.join(60)
        assert busy.value.code == "STATE_BUSY"
        assert outputs["x"].tolist() == [3.0, 3.0] and state.values()["x"].tolist() == [3.0, 3.0]
        state.close()
    finally:
        adapter.shutdown()


def test_a_hold_request_for_a_run_that_never_parks_is_rejected(pass_through):
    session = Session(pass_through)
    session.send(_request("run", 2, state=99, hold=True))  # no such state: the run ends before its Hold node
    session.send(_request("hold", 3, state=99))
    answers = {r.id: r for r in (session.receive(), session.receive())}
    assert answers[2].rejected.code == "STATE_CLOSED"
    assert answers[3].WhichOneof("result") == "rejected"
    assert session.call("hold", request_id=4, state=7).WhichOneof("result") == "rejected"  # never held
    assert session.finish()[0] == 0


def _run(session: Session, state: int, request_id: int, array: np.ndarray, **fields):
    request = _request("run", request_id, state=state)
    _tensor(request.run.feeds.add(name=b"x"), array, **fields)
    session.send(request)
    return session.receive()


def test_returned_buffers_carry_has_buffer_id_and_a_buffer_handed_back_is_the_runtimes_own(pass_through):
    session = Session(pass_through)
    state = _open(session)
    first = _run(session, state, 2, np.arange(4, dtype=np.float32))
    output = first.values.values[0].value.tensor
    received = first.values.received[0].value.tensor
    assert output.has_buffer_id and output.buffer_id == received.buffer_id != 0  # a pass-through: one buffer
    assert _seen(first, b"x") == [0, 1, -1, 0]  # the runner's own value: an owner, no reported id

    back = _run(session, state, 3, np.arange(4, dtype=np.float32), buffer_id=output.buffer_id, has_buffer_id=True)
    assert _seen(back, b"x")[2] == output.buffer_id
    assert back.values.values[0].value.tensor.buffer_id == output.buffer_id  # the same buffer, not the copy

    changed = _run(session, state, 4, np.arange(1, 5, dtype=np.float32), buffer_id=output.buffer_id,
                   has_buffer_id=True)
    assert _seen(changed, b"x")[2] == output.buffer_id  # named, but other bytes: the request's copy
    assert changed.values.values[0].value.tensor.buffer_id != output.buffer_id
    assert np.frombuffer(changed.values.values[0].value.tensor.data, np.float32).tolist() == [1, 2, 3, 4]
    assert session.finish()[0] == 0


def test_an_ownerless_loan_reaches_the_runtime_without_an_owner_and_is_never_replaced(pass_through):
    session = Session(pass_through)
    state = _open(session)
    first = _run(session, state, 2, np.arange(4, dtype=np.float32))
    reported = first.values.values[0].value.tensor.buffer_id
    loan = _run(session, state, 3, np.arange(4, dtype=np.float32), ownerless=True, buffer_id=reported,
                has_buffer_id=True)
    assert _seen(loan, b"x")[:2] == [1, 0]
    assert loan.values.received[0].value.tensor.buffer_id != reported
    assert session.finish()[0] == 0


def test_encoded_values_keep_read_only_both_ways(pass_through):
    session = Session(pass_through)
    state = _open(session)
    request = _request("run", 2, state=state)
    encoded = request.run.feeds.add(name=b"x").value.encoded
    encoded.header, encoded.payload, encoded.read_only = b"", b"\x01\x02", True
    session.send(request)
    response = session.receive()
    returned = response.values.values[0].value.encoded
    assert returned.read_only and returned.has_buffer_id and returned.payload == b"\x01\x02"
    assert _seen(response, b"x")[3] == 1
    assert session.finish()[0] == 0

"""Protocol version 3: names that are not UTF-8 cross unchanged, buffer ids stay unique while a state is
open (so a testee returning copies cannot pass an identity case by address reuse), failure causes and
the runtime's counters travel in structured fields."""

from __future__ import annotations

import gc
import sys
import weakref

import numpy as np
import pytest
from onnx import TensorProto, helper

from conformance import protocol
from conformance.adapters import Rejected, load_adapter
from conformance.adapters.reference import ReferenceAdapter
from conformance.cases import load_cases, select
from conformance.execute import FAILED, PASSED, run_case
from reference_impl import schema

COPYING_TESTEE = '''
import numpy as np
from conformance.adapters.reference import ReferenceAdapter, ReferenceState


class CopyingState(ReferenceState):
    """Hands out fresh copies of everything: outputs and retained values alike."""

    def run(self, feeds):
        return {k: np.array(v, copy=True) for k, v in super().run(feeds).items()}

    def values(self):
        return {k: np.array(v, copy=True) for k, v in super().values().items()}


class Copies(ReferenceAdapter):
    def open_state(self, model_bytes, initial, base_dir=None):
        return CopyingState(super().open_state(model_bytes, initial, base_dir).state)
'''


@pytest.fixture
def testee():
    adapters = []

    def start(extra: str = ""):
        adapter = load_adapter(testee=f"{sys.executable} -m conformance.testee {extra}".strip())
        adapters.append(adapter)
        return adapter

    yield start
    for adapter in adapters:
        adapter.shutdown()


def _bound_identity_model() -> bytes:
    """in -> Identity -> out with in <- out bound; the names are made invalid UTF-8 on the wire."""
    graph = helper.make_graph([helper.make_node("Identity", ["in\x01"], ["out\x01"])], "g",
                              [helper.make_tensor_value_info("in\x01", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("out\x01", TensorProto.FLOAT, [2])])
    model = schema.parse_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
                               .SerializeToString())
    model.graph.persistent_bindings.add(input_name="in\x01", output_name="out\x01")
    return model.SerializeToString().replace(b"in\x01", b"in\xff").replace(b"out\x01", b"out\xfe")


def test_names_that_are_not_utf8_cross_the_protocol_unchanged(testee):
    data = _bound_identity_model()
    initial = {b"in\xff": np.array([1, 2], np.float32)}
    seen = []
    for adapter in (ReferenceAdapter(), testee()):
        handle = adapter.open_state(data, initial, None)
        outputs, values = handle.run({}), handle.values()
        handle.close()
        seen.append((sorted(outputs), sorted(values), outputs[b"out\xfe"].tolist()))
    assert seen[0] == seen[1] == ([b"out\xfe"], [b"in\xff"], [1.0, 2.0])


def test_struct_field_names_round_trip_as_bytes_or_text():
    from conformance.values import Struct

    value = Struct({b"k\xff": np.zeros(2, np.float32), "v\u00e9": np.ones(1, np.int64)}, 7)
    message = protocol.MESSAGES["Value"]()
    protocol.to_proto(value, message)
    assert [f.name for f in message.struct.fields] == [b"k\xff", "v\u00e9".encode()]
    back = protocol.from_proto(message)
    assert sorted(back, key=repr) == sorted(value, key=repr) and back.type_id == 7


def test_a_testee_returning_copies_fails_the_identity_cases(testee, tmp_path):
    (tmp_path / "copies.py").write_text(COPYING_TESTEE)
    copying = testee(f"--adapter {tmp_path / 'copies.py'}:Copies")
    honest = testee()
    for case_id in ("Required.ZeroCopy.Views.ValuesAreSharedViews",
                    "Required.ZeroCopy.Retain.SelectedOutputBecomesState"):
        (case,) = select(load_cases(), [case_id])
        assert run_case(case, honest).verdict == PASSED, case_id
        # Repeated so an address freed by one copy and reused by the next would have its chance.
        assert all(run_case(case, copying).verdict == FAILED for _ in range(5)), case_id


def test_the_server_keeps_every_reported_buffer_until_close(testee):
    from conformance.testee import Server

    server = Server(ReferenceAdapter(), out_stream=None)
    values = [np.zeros(4, np.float32) for _ in range(3)]
    identify = server.buffer_id(1, None)  # a handle without buffer_id: data addresses
    assert [identify(value) for value in values] == [value.ctypes.data for value in values]
    alive = [weakref.ref(value) for value in values]
    del values
    gc.collect()
    assert all(ref() is not None for ref in alive)  # reported: held, so no address is reused
    server.states[1] = type("Handle", (), {"close": lambda self: None})()
    server.op_close(protocol.MESSAGES["Close"](state=1), protocol.Response())
    gc.collect()
    assert all(ref() is None for ref in alive)


class NamedCause(ReferenceAdapter):
    def verify(self, model_bytes, base_dir):
        raise Rejected("STATE_RUN_FAILED", "wrapped", ["KV_SHAPE_MISMATCH", "ATTENTION_INPUT_INVALID"])


def test_rejection_causes_cross_the_protocol(testee, tmp_path):
    (tmp_path / "cause.py").write_text("from tests.test_testee_protocol import NamedCause\n")
    adapter = testee(f"--adapter {tmp_path / 'cause.py'}:NamedCause")
    with pytest.raises(Rejected) as caught:
        adapter.verify(b"", None)
    assert caught.value.code == "STATE_RUN_FAILED"
    assert caught.value.causes == ("KV_SHAPE_MISMATCH", "ATTENTION_INPUT_INVALID")


def test_counters_cross_the_protocol(testee):
    data = _bound_identity_model()
    adapter = testee()
    handle = adapter.open_state(data, {b"in\xff": np.array([1, 2], np.float32)}, None)
    handle.run({})
    counters = handle.counters()
    handle.close()
    assert counters["payload_bytes_copied"] == 0 and counters["binding_resolutions"] == 1
    assert counters["model_serializations"] == 0 and counters["adopted_leaves"] >= 2


def test_the_shipped_proto_is_rendered_from_the_schema():
    """One definition: conformance/testee.proto is what conformance/protocol_schema.py renders."""
    from conformance import protocol_schema

    assert protocol_schema.PROTO.read_text() == protocol_schema.render(), \
        "conformance/testee.proto is stale: python -m conformance.protocol_schema --write"

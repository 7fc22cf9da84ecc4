"""The testee client: the adapter that drives a runtime in another process (any language) over the
framed protocol; the reference runtime's server side is ``conformance.testee``.

A per-request timeout guards every call. A crashed or hung testee fails the case in progress; the
process is killed and started again on the next call, and the run goes on. The testee is untrusted:
its frames are capped (``max_frame``, default ``CONFORMANCE_MAX_FRAME`` or ``protocol.MAX_FRAME``) and
read incrementally, and a testee that cannot be started or does not answer ``hello`` is a
``TesteeUnavailable`` (a one-line suite error) rather than a traceback.
"""

from __future__ import annotations

import json
import os
import shlex
import struct
import subprocess
import threading
import weakref
from typing import Any

from google.protobuf.message import DecodeError

from conformance import protocol as P
from conformance.adapters.base import NotSupported, Rejected, SuiteError
from conformance.hold import Hold
from conformance.protocol_schema import HOLD_FEATURE


class TesteeFailure(Exception):
    """The testee crashed, hung, broke the framing or reported an internal error. ``reason`` is what
    happened; the message adds that the testee will be restarted when it will."""

    def __init__(self, reason: str, restarts: bool = True):
        self.reason = reason
        super().__init__(f"{reason}; it will be restarted" if restarts else reason)


class TesteeUnavailable(SuiteError):
    """The testee command cannot be started or does not complete the ``hello`` exchange: no case can run."""


def default_max_frame() -> int:
    """The frame cap: ``CONFORMANCE_MAX_FRAME`` (bytes) when set, else ``protocol.MAX_FRAME``."""
    text = os.environ.get("CONFORMANCE_MAX_FRAME", "")
    if not text:
        return P.MAX_FRAME
    if not text.isdigit() or int(text) < 1:
        raise SuiteError(f"CONFORMANCE_MAX_FRAME must be a positive number of bytes, not {text!r}")
    return int(text)


def _is_text(data: bytes) -> bool:
    """Printable ASCII (tabs and line ends included): what a print or a log line starts with."""
    return all(32 <= byte < 127 or byte in b"\t\n\r" for byte in data)


def read_response(stream, max_frame: int):
    """One Response frame (``protocol.read_frame``), except that a length prefix over the cap made of
    printable text is named for what it is: a testee writing text on stdout, where only frames may go,
    rather than a frame of a billion bytes."""
    header = P.read_exact(stream, 4)
    (length,) = struct.unpack("<I", header)
    if length > max_frame:
        if _is_text(header):
            raise P.FramingError(f"testee wrote text on stdout (first bytes: {header.decode('ascii')!r}); "
                                 "only frames may go there, logs belong on stderr")
        raise P.FramingError(f"frame of {length} bytes exceeds the limit of {max_frame} bytes")
    response = P.Response()
    try:
        response.ParseFromString(P.read_exact(stream, length))
    except DecodeError as error:
        raise P.FramingError(f"a {length}-byte frame is not a Response: {error}") from None
    return response


class TesteeAdapter:
    handles_timeouts = True  # every request has its own timeout and a hung process is killed

    def __init__(self, command: str, timeout: float = 30.0, max_frame: int | None = None):
        self.command = command
        self.timeout = timeout
        self.max_frame = max_frame or default_max_frame()
        self.identity = f"testee:{command}"
        self._process: subprocess.Popen | None = None
        self._lock = threading.Lock()
        self._pending: dict[int, list] = {}
        self._next_id = 1
        self._generation = 0
        self._broken = ""  # why the reader last stopped
        self._states: weakref.WeakSet = weakref.WeakSet()  # every state, to name the buffers values came from
        try:
            response = self._call("hello", None)
            if response.WhichOneof("result") != "hello":
                raise TesteeFailure(f"it answered hello with {response.WhichOneof('result') or 'nothing'}",
                                    restarts=False)
        except (TesteeFailure, Rejected, NotSupported) as error:
            self._kill()
            reason = " ".join(getattr(error, "reason", str(error)).split()) or type(error).__name__
            raise TesteeUnavailable(f"testee {command!r} is unusable: {reason}") from None
        hello = response.hello
        self.name = hello.name or command
        self.version = hello.version
        self.protocol_version = hello.protocol_version
        self.features = set(hello.features) if hello.has_features else None  # None: all of protocol_version
        self._profiles = set(hello.profiles)
        self._operators = {r.role: (r.domain, r.op_type) for r in hello.operators}

    # ------------------------------------------------------------------------------- process
    def _start(self) -> None:
        try:
            words = shlex.split(self.command)
            self._process = subprocess.Popen(words, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=None,
                                             bufsize=0)
        except (OSError, ValueError) as error:  # no such command, not executable, bad quoting
            self._process = None
            raise TesteeFailure(f"cannot start {self.command!r}: {getattr(error, 'strerror', None) or error}",
                                restarts=False) from None
        self._generation += 1
        self._broken = ""
        reader = threading.Thread(target=self._read_loop, args=(self._process, self._generation), daemon=True)
        reader.start()

    def _read_loop(self, process: subprocess.Popen, generation: int) -> None:
        stream = process.stdout
        assert stream is not None  # started with stdout=PIPE
        while True:
            try:
                response = read_response(stream, self.max_frame)
            except Exception as error:  # noqa: BLE001 - end of stream or garbage: fail whoever waits
                if generation == self._generation:
                    self._broken = str(error)
                break
            with self._lock:
                slot = self._pending.pop(response.id, None)
            if slot is not None:
                slot[1] = response
                slot[0].set()
        with self._lock:
            if generation == self._generation:
                for slot in self._pending.values():
                    slot[0].set()
                self._pending.clear()

    def _kill(self) -> None:
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.kill()
            process.wait(timeout=10)

    def shutdown(self) -> None:
        if self._process is not None and self._process.poll() is None:
            try:
                self._send(P.Request(shutdown=P.MESSAGES["Shutdown"]()), wait=2.0)
            except Exception:  # noqa: BLE001 - best effort before the kill
                pass
        self._kill()

    # --------------------------------------------------------------------------------- calls
    def _send(self, request, wait: float) -> Any:
        request_id, slot, process = self._post(request)
        return self._await(request_id, slot, process, wait)

    def _post(self, request) -> tuple[int, list, subprocess.Popen]:
        """Write ``request``; returns what ``_await`` needs to collect its response."""
        with self._lock:
            if self._process is None or self._process.poll() is not None:
                self._start()
            request.id = self._next_id
            self._next_id += 1
            slot = [threading.Event(), None]
            self._pending[request.id] = slot
            process = self._process
            assert process is not None and process.stdin is not None  # _start() made it
            try:
                P.write_frame(process.stdin, request)
            except (BrokenPipeError, OSError):
                self._pending.pop(request.id, None)
                self._kill()
                raise TesteeFailure("the testee closed its input (crashed)") from None
        return request.id, slot, process

    def _await(self, request_id: int, slot: list, process, wait: float) -> Any:
        if not slot[0].wait(wait):
            with self._lock:
                self._pending.pop(request_id, None)
                if self._process is process:
                    self._kill()
            raise TesteeFailure(f"the testee did not answer within {wait:.0f} s; killed")
        if slot[1] is None:
            with self._lock:
                if self._process is process:
                    self._kill()
            detail = f" ({self._broken})" if self._broken else ""
            raise TesteeFailure(f"the testee exited or broke the framing{detail}")
        return slot[1]

    def _call(self, op: str, body) -> Any:
        return self._result(self._send(self._request(op, body), self.timeout))

    @staticmethod
    def _request(op: str, body):
        request = P.Request()
        if body is None:
            getattr(request, op).SetInParent()
        else:
            getattr(request, op).CopyFrom(body)
        return request

    @staticmethod
    def _result(response) -> Any:
        kind = response.WhichOneof("result")
        if kind == "rejected":
            raise Rejected(response.rejected.code or None, response.rejected.message, list(response.rejected.causes))
        if kind == "not_supported":
            raise NotSupported(response.not_supported.reason)
        if kind == "error":
            raise TesteeFailure(f"{response.error.message}\n{response.error.traceback}", restarts=False)
        return response

    # ------------------------------------------------------------------------------ protocol
    def profiles(self) -> set[str]:
        return set(self._profiles)

    @property
    def supports_hold(self) -> bool:
        """Held runs (Run.hold and the Hold request): a listed feature, else from protocol version 4."""
        if self.features is not None:
            return HOLD_FEATURE in self.features
        return self.protocol_version >= 4

    def operators(self) -> dict[str, tuple[str, str]]:
        """The operator roles the testee bound in its hello (docs/testee-protocol.md)."""
        return dict(self._operators)

    def reported_id(self, value: Any) -> int | None:
        """The buffer id the testee reported for this very object (an output, a retained value, or a value
        it received) in a state of the running process; sent with the value when the runner hands it back,
        so the testee can give its runtime the buffer itself, as an in-process caller does."""
        for state in list(self._states):
            found = state.ids.get(id(value)) if state.generation == self._generation else None
            if found is not None:
                return found
        return None

    def verify(self, model_bytes: bytes, base_dir: str | None) -> None:
        self._call("verify", P.MESSAGES["Verify"](model=model_bytes, base_dir=base_dir or ""))

    def decode(self, model_bytes: bytes, value_name: str, base_dir: str | None):
        body = P.MESSAGES["Decode"](model=model_bytes, value_name=P.encode_name(value_name or ""),
                                    base_dir=base_dir or "")
        return P.from_proto(self._call("decode", body).value.value)

    def read_fields(self, model_bytes: bytes, value_name: str, base_dir: str | None):
        body = P.MESSAGES["ReadFields"](model=model_bytes, value_name=P.encode_name(value_name or ""),
                                        base_dir=base_dir or "")
        return P.named_from_proto(self._call("read_fields", body).values.values)

    # base_dir is sent whatever protocol version the testee speaks: an older one ignores the field.
    def roundtrip(self, model_bytes: bytes, base_dir: str | None = None) -> bytes:
        body = P.MESSAGES["RoundTrip"](model=model_bytes, base_dir=base_dir or "")
        return self._call("roundtrip", body).model.model

    def export(self, model_bytes: bytes, target: str, base_dir: str | None = None):
        body = P.MESSAGES["Export"](model=model_bytes, target=target, base_dir=base_dir or "")
        result = self._call("export", body).model
        if result.has_feedback:
            return result.model, [[P.decode_name(f.input_name), P.decode_name(f.output_name)] for f in result.feedback]
        return result.model

    def rewrite(self, model_bytes: bytes, rewrite: dict, base_dir: str | None = None) -> bytes:
        body = P.MESSAGES["Rewrite"](model=model_bytes, rewrite_json=json.dumps(rewrite), base_dir=base_dir or "")
        return self._call("rewrite", body).model.model

    def open_state(self, model_bytes: bytes, initial: dict, base_dir: str | None = None):
        body = P.MESSAGES["OpenState"](model=model_bytes, base_dir=base_dir or "")
        P.named_to_proto(initial, body.initial, self.reported_id)
        response = self._call("open_state", body)
        handle = TesteeState(self, response.state.state, self._generation)
        P.adopt_ids(initial, response.state.received, handle.ids)
        handle._keep.append(initial)  # python ids stay unique while they are mapped
        self._states.add(handle)
        return handle


class TesteeState:
    """A state living in the testee; buffer identities are the ids the testee reports."""

    def __init__(self, adapter: TesteeAdapter, state_id: int, generation: int):
        self.adapter = adapter
        self.state_id = state_id
        self.generation = generation
        self.ids: dict[int, int] = {}
        self._keep: list = []  # keeps values alive so python ids stay unique while they are mapped

    def _check(self) -> None:
        if self.adapter._generation != self.generation:
            raise TesteeFailure("the testee was restarted; this state no longer exists", restarts=False)

    def run(self, feeds: dict, cancelled: bool = False) -> dict:
        self._check()
        body = P.MESSAGES["Run"](state=self.state_id, cancelled=cancelled)
        P.named_to_proto(feeds, body.feeds, self.adapter.reported_id)
        response = self.adapter._call("run", body)
        P.adopt_ids(feeds, response.values.received, self.ids)
        outputs = P.named_from_proto(response.values.values, self.ids)
        self._keep.append((feeds, outputs))
        return outputs

    def run_held(self, feeds: dict, hold: Hold) -> dict:
        """A Run with ``hold``; a helper thread reports the remote park to ``hold`` and, once the runner
        releases ``hold``, releases the remote run (requesting its cancellation first if asked)."""
        self._check()
        if not self.adapter.supports_hold:
            raise NotSupported("the testee does not hold runs (no \"hold\" feature, or protocol version < 4)")
        body = P.MESSAGES["Run"](state=self.state_id, hold=True)
        P.named_to_proto(feeds, body.feeds, self.adapter.reported_id)
        posted = self.adapter._post(self.adapter._request("run", body))  # before any Hold request
        bridge = threading.Thread(target=self._bridge, args=(hold,), daemon=True)
        bridge.start()
        try:
            response = self.adapter._result(self.adapter._await(*posted, self.adapter.timeout))
        finally:
            hold.finish()
            bridge.join(self.adapter.timeout)
        P.adopt_ids(feeds, response.values.received, self.ids)
        outputs = P.named_from_proto(response.values.values, self.ids)
        self._keep.append((feeds, outputs))
        return outputs

    def _bridge(self, hold: Hold) -> None:
        hold_request = P.MESSAGES["Hold"]
        try:
            self.adapter._call("hold", hold_request(state=self.state_id))
        except Exception:  # noqa: BLE001 - the run ended without parking: the Run's own answer says why
            return
        hold.mark_parked()
        hold.wait_released()
        try:
            self.adapter._call("hold", hold_request(state=self.state_id, release=True, cancel=hold.cancel_requested))
        except Exception:  # noqa: BLE001 - a lost testee fails the Run itself
            pass

    def run_cancelled(self, feeds: dict) -> dict:
        if self.adapter.protocol_version < 2:
            raise NotSupported("the testee speaks protocol version 1, which cannot request cancellation")
        return self.run(feeds, cancelled=True)

    def values(self) -> dict:
        self._check()
        response = self.adapter._call("values", P.MESSAGES["Values"](state=self.state_id))
        values = P.named_from_proto(response.values.values, self.ids)
        self._keep.append(values)
        return values

    def reset(self, initial: dict) -> None:
        self._check()
        body = P.MESSAGES["Reset"](state=self.state_id)
        P.named_to_proto(initial, body.initial, self.adapter.reported_id)
        response = self.adapter._call("reset", body)
        P.adopt_ids(initial, response.state.received, self.ids)
        self._keep.append(initial)

    def close(self) -> None:
        if self.adapter._generation != self.generation:
            return
        self.adapter._call("close", P.MESSAGES["Close"](state=self.state_id))

    def buffer_id(self, value: Any) -> int | None:
        return self.ids.get(id(value))

    def counters(self) -> dict[str, int]:
        """The runtime's own counters for this state (protocol 3); NotSupported when it keeps none."""
        self._check()
        if self.adapter.protocol_version < 3:
            raise NotSupported("the testee speaks a protocol version without counters")
        response = self.adapter._call("counters", P.MESSAGES["Counters"](state=self.state_id))
        return {c.name: c.value for c in response.counters.counters}

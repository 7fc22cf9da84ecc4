"""The testee client: the adapter that drives a runtime in another process (any language) over the
framed protocol; the reference runtime's server side is ``conformance.testee``.

A per-request timeout guards every call. A crashed or hung testee fails the case in progress with
what happened (its exit status or signal, the timeout, the broken frame); the process is killed and
started again on the next call, and the run goes on. The testee is untrusted: its frames are capped in
bytes (``max_frame``, default ``CONFORMANCE_MAX_FRAME`` or ``protocol.MAX_FRAME``) and in objects
(``max_objects``, ``CONFORMANCE_MAX_OBJECTS`` or ``protocol.MAX_OBJECTS``), read incrementally, and every
value is checked against the bytes that came with it (``protocol.ProtocolError``). A testee that cannot
be started or does not answer ``hello`` is a ``TesteeUnavailable`` (a one-line suite error).

The testee runs in its own process group, killed whole, and on Linux dies with the thread that started
it (the runner's main thread), so a killed or hung testee and its children are never left behind.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any

from conformance import protocol as P
from conformance.adapters.base import IN_PROCESS_PROFILES, NotSupported, Rejected, SuiteError
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
    return _positive_env("CONFORMANCE_MAX_FRAME", "bytes", P.MAX_FRAME)


def default_max_objects() -> int:
    """The per-frame object cap: ``CONFORMANCE_MAX_OBJECTS`` when set, else ``protocol.MAX_OBJECTS``."""
    return _positive_env("CONFORMANCE_MAX_OBJECTS", "objects", P.MAX_OBJECTS)


def _positive_env(name: str, unit: str, default: int) -> int:
    text = os.environ.get(name, "")
    if not text:
        return default
    if not text.isdigit() or int(text) < 1:
        raise SuiteError(f"{name} must be a positive number of {unit}, not {text!r}")
    return int(text)


_ADAPTERS: weakref.WeakSet[TesteeAdapter] = weakref.WeakSet()


class TesteeAdapter:
    handles_timeouts = True  # every request has its own timeout and a hung process is killed
    out_of_process = True  # allocations and buffer addresses cannot be observed from the runner

    def __init__(self, command: str, timeout: float = 30.0, max_frame: int | None = None,
                 max_objects: int | None = None):
        self.command = command
        self.timeout = timeout
        self.max_frame = max_frame or default_max_frame()
        self.max_objects = max_objects or default_max_objects()
        self.identity = f"testee:{command}"
        self._cwd = os.getcwd()  # a relative testee path is the user's, resolved against where they stood
        self._process: subprocess.Popen | None = None
        self._lock = threading.Lock()
        self._pending: dict[int, list] = {}
        self._next_id = 1
        self._generation = 0
        self._broken = ""  # why the reader last stopped
        self._states: weakref.WeakSet = weakref.WeakSet()  # every state, to name the buffers values came from
        self._lending = P.Lending(self.max_frame)  # ownerless values received during the current case
        _ADAPTERS.add(self)
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
        self._profiles = set(hello.profiles) - IN_PROCESS_PROFILES  # unobservable across the protocol
        self._operators = {r.role: (r.domain, r.op_type) for r in hello.operators}

    # ------------------------------------------------------------------------------- process
    def _start(self) -> None:
        try:
            words = shlex.split(self.command)
            if words and os.sep in words[0] and not os.path.isabs(words[0]):
                words[0] = os.path.join(self._cwd, words[0])  # as the user named it, wherever we are now
            self._process = subprocess.Popen(words, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=None,
                                             bufsize=0, start_new_session=True, preexec_fn=_die_with_parent())
        except (OSError, ValueError, subprocess.SubprocessError) as error:  # no such command, bad quoting
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
                response = P.read_frame(stream, P.Response, self.max_frame, self.max_objects)
            except Exception as error:  # noqa: BLE001 - end of stream or garbage: fail whoever waits
                if generation == self._generation and not getattr(error, "closed", False):
                    self._broken = _framing_reason(error)
                break
            with self._lock:
                slot = self._pending.pop(response.id, None)
            if slot is not None:
                slot[1] = response
                slot[0].set()
            del response, slot  # a large answer must not stay alive here until the next one arrives
        with self._lock:
            if generation == self._generation:
                for slot in self._pending.values():
                    slot[0].set()
                self._pending.clear()

    def _kill(self) -> None:
        """Kill the testee's whole process group (a wrapper's children too) and reap it."""
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)  # its own group: started with start_new_session
            process.kill()
            process.wait(timeout=10)
        if process is not None:
            for stream in (process.stdin, process.stdout):
                with contextlib.suppress(OSError):
                    stream and stream.close()

    def shutdown(self) -> None:
        if self._process is not None and self._process.poll() is None:
            try:
                self._send(P.Request(shutdown=P.MESSAGES["Shutdown"]()), wait=2.0)
            except Exception:  # noqa: BLE001 - best effort before the kill
                pass
        self._kill()

    def end_case(self) -> None:
        """Called when a case ends: the ownerless values received during it are released (nothing of a
        case outlives it), so a testee answering with ownerless data cannot make the runner hoard it."""
        self._lending.release()

    def _forget_after_fork(self) -> None:
        """In a forked child: the testee belongs to the parent (its reader thread did not come along), so
        the child drops it without killing it and starts its own on the next call."""
        process, self._process = self._process, None
        self._lock = threading.Lock()
        self._pending = {}
        self._generation += 1
        if process is not None:
            for stream in (process.stdin, process.stdout):
                with contextlib.suppress(OSError):
                    stream and stream.close()  # the child's copy of the descriptor only

    # --------------------------------------------------------------------------------- calls
    def _send(self, request, wait: float, start: bool = True) -> Any:
        request_id, slot, process = self._post(request, start)
        return self._await(request_id, slot, process, wait)

    def _post(self, request, start: bool = True) -> tuple[int, list, subprocess.Popen]:
        """Write ``request`` (starting the testee first when ``start`` and it is not running); returns
        what ``_await`` needs to collect its response."""
        with self._lock:
            if self._process is None or self._process.poll() is not None:
                if not start:
                    raise TesteeFailure("the testee is not running", restarts=False)
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
                reason = _exit_reason(process, 1.0) or "closed its input"
                self._kill()
                raise TesteeFailure(f"the testee {reason} before {_op(request)} was sent") from None
        return request.id, slot, process

    def _await(self, request_id: int, slot: list, process, wait: float, op: str = "the request") -> Any:
        if not slot[0].wait(wait):
            with self._lock:
                self._pending.pop(request_id, None)
                if self._process is process:
                    self._kill()
            raise TesteeFailure(f"the testee did not answer {op} within {wait:g} s; killed")
        if slot[1] is None:
            broken = self._broken
            reason = _exit_reason(process, 2.0)
            with self._lock:
                if self._process is process:
                    self._kill()
            if reason is None:
                raise TesteeFailure(f"{broken or 'the testee closed its output'} (answering {op}); killed")
            if broken:
                raise TesteeFailure(f"{broken}, and {reason} (answering {op})")
            raise TesteeFailure(f"the testee {reason} while answering {op}")
        return slot[1]

    def _call(self, op: str, body, start: bool = True) -> Any:
        request = self._request(op, body)
        request_id, slot, process = self._post(request, start)
        return self._result(self._await(request_id, slot, process, self.timeout, op))

    @contextlib.contextmanager
    def _answer(self, op: str) -> Iterator[None]:
        """Values decoded from an answer: a value that cannot be (strides past its data ...) fails the case."""
        try:
            yield
        except P.ProtocolError as error:
            raise TesteeFailure(f"the testee's answer to {op} is malformed: {error}", restarts=False) from None

    def _values(self, op: str, repeated, ids: dict[int, int] | None = None) -> dict[str, Any]:
        with self._answer(op):
            return P.named_from_proto(repeated, ids, self._lending, P.Budget(self.max_frame))

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
        answer = self._call("decode", body).value.value
        with self._answer("decode"):
            return P.from_proto(answer, None, self._lending, P.Budget(self.max_frame))

    def read_fields(self, model_bytes: bytes, value_name: str, base_dir: str | None):
        body = P.MESSAGES["ReadFields"](model=model_bytes, value_name=P.encode_name(value_name or ""),
                                        base_dir=base_dir or "")
        return self._values("read_fields", self._call("read_fields", body).values.values)

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
        outputs = self.adapter._values("run", response.values.values, self.ids)
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
            response = self.adapter._result(self.adapter._await(*posted, self.adapter.timeout, "run"))
        finally:
            hold.finish()
            bridge.join(self.adapter.timeout)
        P.adopt_ids(feeds, response.values.received, self.ids)
        outputs = self.adapter._values("run", response.values.values, self.ids)
        self._keep.append((feeds, outputs))
        return outputs

    def _bridge(self, hold: Hold) -> None:
        hold_request = P.MESSAGES["Hold"]
        try:
            self.adapter._call("hold", hold_request(state=self.state_id), start=False)
        except Exception:  # noqa: BLE001 - the run ended without parking: the Run's own answer says why
            return
        hold.mark_parked()
        hold.wait_released()
        try:
            self.adapter._call("hold", hold_request(state=self.state_id, release=True, cancel=hold.cancel_requested),
                               start=False)
        except Exception:  # noqa: BLE001 - a lost testee fails the Run itself
            pass

    def run_cancelled(self, feeds: dict) -> dict:
        if self.adapter.protocol_version < 2:
            raise NotSupported("the testee speaks protocol version 1, which cannot request cancellation")
        return self.run(feeds, cancelled=True)

    def values(self) -> dict:
        self._check()
        response = self.adapter._call("values", P.MESSAGES["Values"](state=self.state_id))
        values = self.adapter._values("values", response.values.values, self.ids)
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


# ------------------------------------------------------------------------------------ process helpers
def _op(request) -> str:
    return request.WhichOneof("op") or "a request"


def _exit_reason(process: subprocess.Popen, wait: float) -> str | None:
    """How the testee ended ("exited with status 3", "was killed by SIGSEGV"), waiting up to ``wait``
    seconds for it to finish closing; None while it is still running."""
    try:
        code = process.wait(timeout=wait)
    except subprocess.TimeoutExpired:
        return None
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = f"signal {-code}"
        return f"was killed by {name}"
    return f"exited with status {code}" if code else "exited"


def _framing_reason(error: Exception) -> str:
    """Why the reader stopped, in words: text where a length prefix belongs is named as such."""
    prefix = getattr(error, "prefix", b"")
    if prefix and all(0x20 <= byte < 0x7F or byte in b"\t\r\n" for byte in prefix):
        return f"the testee wrote text on stdout (first bytes: {prefix.decode('ascii')!r})"
    return f"the testee broke the framing: {error}"


def _die_with_parent() -> Callable[[], None] | None:
    """On Linux, a ``preexec_fn`` making the testee die when the thread that starts it ends (the runner
    crashed or was killed); only the main thread lives as long as the runner, so only it asks."""
    if not sys.platform.startswith("linux") or threading.current_thread() is not threading.main_thread():
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the runner died before the line above
            os._exit(1)

    return preexec


def _forget_inherited() -> None:
    for adapter in list(_ADAPTERS):
        adapter._forget_after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_inherited)

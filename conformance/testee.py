"""``python -m conformance.testee [--adapter SPEC]``: the testee server, serving an in-process adapter over
the testee protocol (the runner's side is ``conformance.adapters.testee_client``).

The reference implementation's testee is this module serving the reference adapter; the suite runs
through it with ``--testee "python -m conformance.testee"``. Requests are handled on worker threads so
a second call on a busy state reaches the runtime (which must reject it) instead of waiting in line.

The server answers as the adapter would in process, so a run through it gives the in-process verdicts:
its hello lists only the features the adapter has (``supports_hold``), a method the adapter lacks is
"not supported" as the runner's own call finds it, a state's exceptions go through the handle's classifier
before the adapter's, every buffer gets the identity the runner would give it in process (the handle's
``buffer_id``, else the value's data address: the runner cannot take the address itself, it only sees
copies), and a value the runner hands back reaches the adapter as the object it handed out
(conformance/testee_buffers.py).

Buffer identities are data addresses, so every value whose identity was reported stays referenced until
its state closes: an address freed and reused by a later copy would otherwise make two different buffers
look like one (protocol rule: a buffer_id names one buffer for the whole life of its state).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from conformance import operators
from conformance import protocol as P
from conformance.adapters import NotSupported, Rejected, load_adapter
from conformance.adapters.base import accepted_keywords
from conformance.hold import Hold
from conformance.judging import classify
from conformance.protocol_schema import HOLD_FEATURE
from conformance.testee_buffers import HandedOut
from conformance.values import default_buffer_id


class Server:
    def __init__(self, adapter: Any, out_stream):
        self.adapter = adapter
        self.out = out_stream
        self.write_lock = threading.Lock()
        self.states: dict[int, Any] = {}
        self.handed_out = HandedOut()  # every value whose buffer_id was reported, until its state closes
        self.next_state = 1
        self.state_lock = threading.Lock()
        self.holds: dict[int, Hold] = {}  # state -> its latest held run, registered as its Run is read
        self.hold_timeout = 120.0

    # ------------------------------------------------------------------------------------ plumbing
    def send(self, response) -> None:
        with self.write_lock:
            P.write_frame(self.out, response)

    def handle(self, request) -> None:
        response = P.Response(id=request.id)
        op = request.WhichOneof("op")
        try:
            getattr(self, f"op_{op}")(getattr(request, op), response)
        except Rejected as rejected:
            self._reject(response, rejected)
        except NotSupported as exc:
            response.not_supported.reason = str(exc) or "not supported"
        except Exception as exc:  # noqa: BLE001 - everything is answered, nothing kills the server
            found = self._classify(getattr(request, op), exc)
            if isinstance(found, Rejected):
                self._reject(response, found)
            elif isinstance(found, NotSupported):
                response.not_supported.reason = str(found)
            else:
                response.error.message = f"{type(exc).__name__}: {exc}"
                response.error.traceback = traceback.format_exc()
        self.send(response)

    def _classify(self, body, exc: Exception) -> Any:
        """As the runner classifies in process: a state's own classifier first, then the adapter's."""
        if "state" in body.DESCRIPTOR.fields_by_name:
            found = classify(self.states.get(body.state), exc)
            if found is not None:
                return found
        return classify(self.adapter, exc)

    @staticmethod
    def _reject(response, rejected: Rejected) -> None:
        response.rejected.code = rejected.code or ""
        response.rejected.message = rejected.message
        response.rejected.causes.extend(getattr(rejected, "causes", ()))

    def buffer_id(self, state_id: int, handle: Any) -> Callable[[Any], int | None]:
        """The identity the runner gives a value in process (conformance/trace.py, ``identify``): the
        handle's ``buffer_id``, else the value's data address. Taken here, where the value itself lives;
        None (no identity) is reported as absent, unlike an id of 0. Each value reported is recorded
        (held until its state closes, and found again when the runner hands it back)."""
        probe = getattr(handle, "buffer_id", None)

        def identify(value: Any) -> int | None:
            found = probe(value) if probe is not None else None
            found = found if found is not None else default_buffer_id(value)
            if found is not None:
                self.handed_out.record(state_id, found, value)
            return found

        return identify

    @staticmethod
    def method(target: Any, name: str) -> Callable[..., Any]:
        """``target``'s method ``name``; one it lacks is "not supported", as the runner's own call says
        in process (conformance/judging.py, ``call``)."""
        found = getattr(target, name, None)
        if found is None:
            raise NotSupported(f"the adapter has no {name}()")
        return found

    def state(self, state_id: int):
        handle = self.states.get(state_id)
        if handle is None:
            raise Rejected("STATE_CLOSED", f"no open state {state_id}")
        return handle

    @staticmethod
    def _base_dir(text: str) -> str | None:
        return text or None

    def _writer_call(self, method: str, *args: Any, base_dir: str) -> Any:
        """roundtrip, export or rewrite, given ``base_dir`` when the adapter's method accepts it."""
        found = self.method(self.adapter, method)
        return found(*args, **accepted_keywords(found, base_dir=self._base_dir(base_dir)))

    # ---------------------------------------------------------------------------------- operations
    def op_hello(self, body, response) -> None:
        response.hello.name = str(getattr(self.adapter, "name", "adapter"))
        response.hello.version = str(getattr(self.adapter, "version", ""))
        response.hello.profiles.extend(sorted(self.adapter.profiles()))
        response.hello.protocol_version = P.PROTOCOL_VERSION
        response.hello.has_features = True
        if getattr(self.adapter, "supports_hold", False):
            response.hello.features.append(HOLD_FEATURE)
        for role, (domain, op_type) in sorted(operators.declared(self.adapter).items()):
            response.hello.operators.add(role=role, domain=domain, op_type=op_type)

    def op_verify(self, body, response) -> None:
        self.method(self.adapter, "verify")(body.model, self._base_dir(body.base_dir))
        response.ok.SetInParent()

    def op_decode(self, body, response) -> None:
        value = self.method(self.adapter, "decode")(body.model, P.decode_name(body.value_name),
                                                    self._base_dir(body.base_dir))
        P.to_proto(value, response.value.value)

    def op_read_fields(self, body, response) -> None:
        fields = self.method(self.adapter, "read_fields")(body.model, P.decode_name(body.value_name),
                                                          self._base_dir(body.base_dir))
        response.values.SetInParent()
        P.named_to_proto(fields, response.values.values)

    def op_roundtrip(self, body, response) -> None:
        response.model.model = self._writer_call("roundtrip", body.model, base_dir=body.base_dir)

    def op_open_state(self, body, response) -> None:
        initial = self.handed_out.values(body.initial)
        handle = self.method(self.adapter, "open_state")(body.model, initial, self._base_dir(body.base_dir))
        with self.state_lock:
            state_id = self.next_state
            self.next_state += 1
            self.states[state_id] = handle
        response.state.state = state_id
        P.named_to_proto(initial, response.state.received, self.buffer_id(state_id, handle), with_data=False)

    def op_run(self, body, response) -> None:
        hold = (self.holds.get(body.state) or self.begin_hold(body.state)) if body.hold else None
        try:
            self._run(body, response, hold)
        finally:
            if hold is not None:
                hold.finish()  # an await on a run that never parked is answered, not left waiting

    def _run(self, body, response, hold: Hold | None) -> None:
        handle = self.state(body.state)
        feeds = self.handed_out.values(body.feeds)
        if body.cancelled:
            if not hasattr(handle, "run_cancelled"):
                raise NotSupported("the adapter cannot request cancellation (its state handle has no run_cancelled())")
            outputs = handle.run_cancelled(feeds)
        elif hold is not None:
            if not hasattr(handle, "run_held"):
                raise NotSupported("the adapter cannot hold a run (its state handle has no run_held())")
            outputs = handle.run_held(feeds, hold)
        else:
            outputs = self.method(handle, "run")(feeds)
        response.values.SetInParent()
        P.named_to_proto(outputs, response.values.values, self.buffer_id(body.state, handle))
        P.named_to_proto(feeds, response.values.received, self.buffer_id(body.state, handle), with_data=False)

    def op_values(self, body, response) -> None:
        handle = self.state(body.state)
        current = dict(self.method(handle, "values")())
        response.values.SetInParent()
        P.named_to_proto(current, response.values.values, self.buffer_id(body.state, handle))

    def op_reset(self, body, response) -> None:
        handle = self.state(body.state)
        initial = self.handed_out.values(body.initial)
        self.method(handle, "reset")(initial)
        response.state.state = body.state
        P.named_to_proto(initial, response.state.received, self.buffer_id(body.state, handle), with_data=False)

    def op_close(self, body, response) -> None:
        handle = self.state(body.state)
        self.method(handle, "close")()
        self.handed_out.forget(body.state)
        response.ok.SetInParent()

    def begin_hold(self, state_id: int) -> Hold:
        """Register a held run when its Run request is read, so a Hold request read after it (the
        runner sends it only after the Run) finds this run, not an earlier one."""
        with self.state_lock:
            hold = self.holds[state_id] = Hold()
            return hold

    def op_hold(self, body, response) -> None:
        hold = self.holds.get(body.state)
        if hold is None:
            raise Rejected("", f"no held run on state {body.state}")
        if body.release:
            if body.cancel:
                hold.request_cancel()
            hold.release()
        elif not hold.wait_parked_or_finished(self.hold_timeout):
            raise Rejected("", "the held run ended (or did not start) without parking at a Hold node")
        response.ok.SetInParent()

    def op_counters(self, body, response) -> None:
        handle = self.state(body.state)
        response.counters.SetInParent()
        for name, value in sorted(self.method(handle, "counters")().items()):
            response.counters.counters.add(name=name, value=int(value))

    def op_export(self, body, response) -> None:
        result = self._writer_call("export", body.model, body.target, base_dir=body.base_dir)
        if isinstance(result, tuple):
            result, feedback = result
            response.model.has_feedback = True
            for input_name, output_name in feedback:
                response.model.feedback.add(input_name=P.encode_name(input_name),
                                            output_name=P.encode_name(output_name))
        response.model.model = result

    def op_rewrite(self, body, response) -> None:
        response.model.model = self._writer_call("rewrite", body.model, json.loads(body.rewrite_json),
                                                 base_dir=body.base_dir)

    def op_shutdown(self, body, response) -> None:
        response.ok.SetInParent()


def serve(adapter: Any, in_stream, out_stream, workers: int = 8) -> None:
    server = Server(adapter, out_stream)
    with ThreadPoolExecutor(workers) as pool:
        while True:
            try:
                request = P.read_frame(in_stream, P.Request)
            except P.FramingError:
                return
            if request.WhichOneof("op") == "shutdown":
                server.handle(request)
                return
            if request.WhichOneof("op") == "run" and request.run.hold:
                server.begin_hold(request.run.state)
            pool.submit(server.handle, request)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m conformance.testee",
                                     description="serve an adapter over the testee protocol on stdin/stdout")
    parser.add_argument("--adapter", default="reference")
    args = parser.parse_args(argv)
    out_stream = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    sys.stdout = sys.stderr  # nothing but frames may reach the protocol stream
    in_stream = os.fdopen(os.dup(sys.stdin.fileno()), "rb")
    adapter = load_adapter(args.adapter)
    serve(adapter, in_stream, out_stream)
    return 0


if __name__ == "__main__":
    sys.exit(main())
